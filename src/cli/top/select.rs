//! Which rows `gpucap top` shows and in which order: `--pool`, `--user`, `--sort`.

use crate::procs::Row;

/// What `--sort` accepts.
pub const SORT_ACCEPTED: &str =
    "used, peak, cap, free, use (used/cap), refused, pid, gpu, pool, user or command";

/// `--sort KEY`: the largest first for figures, A to Z (0 up) for the others.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortKey {
    #[default]
    Used,
    Peak,
    Cap,
    Free,
    Use,
    Refused,
    Pid,
    Gpu,
    Pool,
    User,
    Command,
}

impl SortKey {
    pub fn parse(value: &str) -> Result<SortKey, String> {
        Ok(match value.trim().to_ascii_lowercase().as_str() {
            "used" => SortKey::Used,
            "peak" => SortKey::Peak,
            "cap" => SortKey::Cap,
            "free" => SortKey::Free,
            "use" | "use%" => SortKey::Use,
            "refused" | "refusals" => SortKey::Refused,
            "pid" => SortKey::Pid,
            "gpu" => SortKey::Gpu,
            "pool" => SortKey::Pool,
            "user" => SortKey::User,
            "command" => SortKey::Command,
            _ => return Err(format!("invalid --sort {value:?}: {SORT_ACCEPTED}")),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            SortKey::Used => "used",
            SortKey::Peak => "peak",
            SortKey::Cap => "cap",
            SortKey::Free => "free",
            SortKey::Use => "use",
            SortKey::Refused => "refused",
            SortKey::Pid => "pid",
            SortKey::Gpu => "gpu",
            SortKey::Pool => "pool",
            SortKey::User => "user",
            SortKey::Command => "command",
        }
    }
}

/// Which rows: a pool's members only (`pool`), a user's processes only (`user`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    pub pool: Option<String>,
    pub user: Option<String>,
}

impl Filter {
    /// Whether the pool's summary line is shown: the pool named (`--pool`), the pools
    /// of the user named (`--user`, a name or a uid: owned by them, or with a member of
    /// theirs: a claim's or the container's pool has members of several users), as the
    /// rows are chosen.
    pub fn keeps_pool(&self, p: &crate::procs::PoolReading) -> bool {
        let names = |uid: u32, u: &str| uid.to_string() == u || crate::procs::user_name(uid) == u;
        self.pool.as_ref().is_none_or(|n| &p.name == n)
            && self.user.as_ref().is_none_or(|u| {
                names(p.uid, u)
                    || p.view
                        .members
                        .iter()
                        .any(|m| names(crate::procs::member_uid(p, m), u))
            })
    }
}

/// The rows `filter` keeps, ordered by `key` (then by pid and GPU, which is stable).
pub fn select<'a>(rows: &'a [Row], filter: &Filter, key: SortKey) -> Vec<&'a Row> {
    let mut v: Vec<&Row> = rows
        .iter()
        .filter(|r| {
            filter
                .pool
                .as_ref()
                .is_none_or(|p| r.pool.as_ref() == Some(p))
        })
        .filter(|r| {
            filter
                .user
                .as_ref()
                .is_none_or(|u| &r.user == u || r.uid.to_string() == *u)
        })
        .collect();
    let big = |f: fn(&Row) -> u64| move |a: &&Row, b: &&Row| f(b).cmp(&f(a));
    v.sort_by(|a, b| {
        let first = match key {
            SortKey::Used => big(|r| r.used)(a, b),
            SortKey::Peak => big(|r| r.peak)(a, b),
            SortKey::Cap => big(|r| r.cap.unwrap_or(u64::MAX))(a, b),
            SortKey::Free => big(|r| r.free.unwrap_or(u64::MAX))(a, b),
            SortKey::Use => b
                .use_percent
                .unwrap_or(-1.0)
                .total_cmp(&a.use_percent.unwrap_or(-1.0)),
            SortKey::Refused => big(|r| r.refusals.unwrap_or(0))(a, b),
            SortKey::Pid => a.pid.cmp(&b.pid),
            SortKey::Gpu => a.gpu.cmp(&b.gpu),
            SortKey::Pool => (a.pool.is_none(), &a.pool).cmp(&(b.pool.is_none(), &b.pool)),
            SortKey::User => a.user.cmp(&b.user),
            SortKey::Command => a.command.cmp(&b.command),
        };
        first.then(a.pid.cmp(&b.pid)).then(a.gpu.cmp(&b.gpu))
    });
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procs::tests::{lone, pool};
    use crate::procs::{Gpus, rows};

    fn all() -> Vec<Row> {
        rows(
            &[pool()],
            &[lone(99, 5 << 20, Some(1 << 30))],
            7,
            &Gpus::default(),
        )
    }

    #[test]
    fn sorted_and_filtered() {
        let r = all();
        let pids = |v: Vec<&Row>| v.iter().map(|r| r.pid).collect::<Vec<_>>();
        assert_eq!(
            pids(select(&r, &Filter::default(), SortKey::Used)),
            [12, 11, 10, 99]
        );
        assert_eq!(
            pids(select(&r, &Filter::default(), SortKey::Pid)),
            [10, 11, 12, 99]
        );
        assert_eq!(
            pids(select(&r, &Filter::default(), SortKey::Refused))[0],
            99
        );
        let train = Filter {
            pool: Some("train".into()),
            user: None,
        };
        assert_eq!(pids(select(&r, &train, SortKey::Pid)), [10, 11, 12]);
        let bob = Filter {
            pool: None,
            user: Some("bob".into()),
        };
        assert!(select(&r, &bob, SortKey::Used).is_empty());
        let alice = Filter {
            pool: None,
            user: Some("1000".into()),
        };
        assert_eq!(select(&r, &alice, SortKey::Used).len(), 4);
    }

    /// A pool's line is kept for its owner and for a user of one of its members (a
    /// claim's or the container's pool, owned by its first member's user).
    #[test]
    fn a_pools_line_is_kept_for_the_user_of_any_of_its_members() {
        let mut p = crate::procs::tests::pool();
        p.shared = true;
        let user = |u: &str| Filter {
            pool: None,
            user: Some(u.into()),
        };
        assert!(user("1000").keeps_pool(&p) && !user("65534").keeps_pool(&p));
        p.view.members[0].uid = Some(65534);
        assert!(user("65534").keeps_pool(&p), "a member's user");
        assert!(!user("4242").keeps_pool(&p));
    }

    #[test]
    fn keys_parse_or_say_what_is_accepted() {
        assert_eq!(SortKey::parse("PEAK"), Ok(SortKey::Peak));
        assert_eq!(SortKey::parse("use%"), Ok(SortKey::Use));
        let e = SortKey::parse("size").unwrap_err();
        assert!(e.contains("\"size\"") && e.contains(SORT_ACCEPTED), "{e}");
    }
}
