//! `gpucap pool list|clean|resize|set`, in the pool directory `status` would use (the
//! lines are `pool_files`'s and `resize`'s; `set`'s are here).

use std::path::Path;

use gpucap_core::budget::{
    GpuView, Member, MemberGpuView, MemberInfo, MemberView, PoolView, ShareChange, ShareSet,
};
use gpucap_core::size::format_bytes;

use crate::args::PoolAction;
use crate::args::pool_set::Request;
use crate::exit::EXIT_USAGE;
use crate::pool::own_pid_namespace;
use crate::pool_files::{EXIT_NOT_REMOVED, clean, entries, list_text};
use crate::resize;
use crate::shown_pool::pool_config;
use crate::term::print_out;

/// `gpucap pool list`, `gpucap pool clean [NAME]` and `gpucap pool resize`.
pub fn command(action: PoolAction) -> i32 {
    let config = match pool_config(None) {
        Ok(c) => c,
        Err(code) => return code,
    };
    match &action {
        PoolAction::Resize(r) => return resize::run(r, config.pool_dir.as_deref()),
        PoolAction::Set(r) => return set(r, config.pool_dir.as_deref()),
        _ => {}
    }
    let shared = shared_entry(&config);
    let dir = match gpucap_pool_file::user_dir(config.pool_dir.as_deref(), false) {
        Ok(Some(dir)) => dir,
        // No directory: none made yet, or removed (a logout's cleanup) under live members,
        // whose pools are still listed (read through a member's descriptor).
        Ok(None) => match removed_only(config.pool_dir.as_deref()) {
            Some(dir) => dir,
            None if shared.is_some() && matches!(action, PoolAction::List) => {
                let dir = user_dir_path(config.pool_dir.as_deref()).unwrap_or_default();
                print_out(&list_text(&dir, &shared.into_iter().collect::<Vec<_>>()));
                return 0;
            }
            None => {
                print_out("no pools (no pool directory yet: the first member makes it)\n");
                return match action {
                    PoolAction::Clean(Some(_)) => EXIT_NOT_REMOVED,
                    _ => 0,
                };
            }
        },
        Err(e) => {
            eprintln!("gpucap: {e}");
            return EXIT_USAGE;
        }
    };
    match action {
        PoolAction::List => {
            let mut all = entries(&dir);
            all.extend(shared);
            print_out(&list_text(&dir, &all));
            0
        }
        PoolAction::Clean(name) => {
            let (out, err, code) = clean(&dir, name.as_deref());
            for line in out {
                print_out(&format!("{line}\n"));
            }
            for line in err {
                eprintln!("{line}");
            }
            code
        }
        PoolAction::Resize(r) => resize::run(&r, config.pool_dir.as_deref()),
        PoolAction::Set(r) => set(&r, config.pool_dir.as_deref()),
    }
}

/// Runs a `pool set` (`pool_dir`: the environment's pool directory, if `--dir` was not
/// given): joins the pool for the change (a member's slot, so that it may take the
/// GPU's word lock: `budget::share_set`), changes the member's share on each GPU, and
/// leaves. Exit status: 0 changed, 1 refused or no such pool or member, 2 unusable.
fn set(r: &Request, pool_dir: Option<&Path>) -> i32 {
    let (file, view) = match resize::open_pool(
        &r.pool,
        &r.name,
        r.dir.as_deref().or(pool_dir),
        r.dir.is_some(),
    ) {
        Ok(opened) => opened,
        Err(code) => return code,
    };
    let member = match find_member(&view, r) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("gpucap: {e}");
            return 1;
        }
    };
    let theirs: Vec<GpuView> = view
        .gpus
        .iter()
        .filter(|g| member.gpus.iter().any(|m| m.raw_uuid == g.raw_uuid))
        .cloned()
        .collect();
    let gpus = match resize::pick(&theirs, r.gpu.as_deref()) {
        Ok(g) if !g.is_empty() => g,
        Ok(_) => {
            eprintln!(
                "gpucap: pool {}: pid {} has used no GPU yet: nothing to change",
                r.name, r.pid
            );
            return 1;
        }
        Err(e) => {
            eprintln!("gpucap: {e} (of those pid {} uses)", r.pid);
            return 1;
        }
    };
    let info = MemberInfo {
        pid: std::process::id(),
        uid: gpucap_pool_file::own_uid(),
        pid_namespace: own_pid_namespace(),
        start_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        command: "gpucap pool set".to_string(),
    };
    let pool = match file.mapped() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("gpucap: {e}");
            return 1;
        }
    };
    let changer = match Member::join(pool, &file.locks, &info) {
        Ok(m) => m,
        Err(e) => {
            match file.locks.refused() {
                Some(why) => eprintln!("gpucap: pool {}: {why}", r.name),
                None => eprintln!("gpucap: pool {}: {e}", r.name),
            }
            return 1;
        }
    };
    let change = ShareChange {
        guarantee: r.guarantee,
        ceiling: r.ceiling,
    };
    let mut code = 0;
    for g in gpus {
        let theirs = member.gpus.iter().find(|m| m.raw_uuid == g.raw_uuid);
        if let Some(why) = theirs.and_then(|m| raises_handed_down(m, g.cap, change)) {
            eprintln!(
                "gpucap: pool {} {}: pid {} not changed: {why}",
                r.name, g.uuid, r.pid
            );
            code = 1;
            continue;
        }
        match changer.set_share(member.slot, &g.raw_uuid, change) {
            Ok(done) => print_out(&format!("{}\n", set_line(&r.name, &g.uuid, &done))),
            Err(e) => {
                eprintln!(
                    "gpucap: pool {} {}: pid {} not changed: {e}",
                    r.name, g.uuid, r.pid
                );
                code = 1;
            }
        }
    }
    changer.leave();
    code
}

/// Why `change` is refused for a member held at a ceiling handed down to it on a GPU
/// (`m`; the pool's cap there `pool_cap`): it would raise that ceiling, which the member
/// keeps enforcing with its own cap whatever the pool file says, so the file would only
/// show a figure that does not hold. Lowering it, or a guarantee, is a change like any.
fn raises_handed_down(
    m: &MemberGpuView,
    pool_cap: Option<u64>,
    change: ShareChange,
) -> Option<String> {
    let from = m.ceiling_from.as_deref()?;
    let new = change.ceiling?.or(pool_cap);
    let held = m.ceiling.or(pool_cap)?;
    if new.is_some_and(|n| n <= held) {
        return None;
    }
    Some(format!(
        "its ceiling, {}, was handed down to it by {from}, which nothing raises (the process \
         holds itself to it); lower it, or change the ceiling where it was set",
        format_bytes(held)
    ))
}

/// The live member `r.pid` names (its pid as it sees itself; in this process's PID
/// namespace first where two namespaces have it).
fn find_member<'v>(view: &'v PoolView, r: &Request) -> Result<&'v MemberView, String> {
    let found: Vec<&MemberView> = view
        .members
        .iter()
        .filter(|m| m.alive && m.pid == r.pid)
        .collect();
    let ours: Vec<&MemberView> = found
        .iter()
        .copied()
        .filter(|m| m.pid_namespace == own_pid_namespace())
        .collect();
    match (found.as_slice(), ours.as_slice()) {
        ([one], _) | (_, [one]) => Ok(one),
        ([], _) => {
            let live: Vec<String> = view
                .members
                .iter()
                .filter(|m| m.alive)
                .map(|m| format!("{} ({})", m.pid, m.command))
                .collect();
            Err(format!(
                "pool {} has no live member with pid {}; its members: {}",
                r.name,
                r.pid,
                if live.is_empty() {
                    "none".to_string()
                } else {
                    live.join(", ")
                }
            ))
        }
        _ => Err(format!(
            "pool {}: pid {} names members in {} PID namespaces, none of them this one's: \
             run gpucap pool set from the member's own namespace",
            r.name,
            r.pid,
            found.len()
        )),
    }
}

/// What a change done prints.
pub fn set_line(name: &str, uuid: &str, s: &ShareSet) -> String {
    let ceiling = |c: Option<u64>| c.map_or("none (the cap)".to_string(), format_bytes);
    let mut line = format!(
        "pool {name} {uuid}: pid {} ({}): guarantee {} -> {}, ceiling {} -> {}, {} held",
        s.pid,
        s.command,
        format_bytes(s.old.0),
        format_bytes(s.new.0),
        ceiling(s.old.1),
        ceiling(s.new.1),
        format_bytes(s.held)
    );
    if s.new.1.is_some_and(|c| s.held > c) {
        line.push_str(
            "; above the new ceiling: its new allocations are refused (or wait) until it \
             holds less, nothing is taken back",
        );
    }
    line
}

/// This user's pool directory where it does not exist but pools removed from it while
/// their members run are announced (gpucap_pool_file's `beacon`).
fn removed_only(pool_dir: Option<&std::path::Path>) -> Option<std::path::PathBuf> {
    let dir = user_dir_path(pool_dir)?;
    (!crate::pool_names::pool_names(&dir).is_empty()).then_some(dir)
}

/// This user's pool directory's path, made or not.
fn user_dir_path(pool_dir: Option<&std::path::Path>) -> Option<std::path::PathBuf> {
    let any = gpucap_core::config::PoolSpec::Name("any".into());
    Some(
        gpucap_pool_file::path_of(&any, pool_dir)
            .ok()?
            .parent()?
            .to_path_buf(),
    )
}

/// The pool the environment names where every user of it shares it (a claim's, the
/// container's: `container-mntns`, the entrypoint's default), read: its file is in no
/// user's directory, so `pool list` shows it beside this user's pools, named by its
/// directory as `status` and `top` name it. None where the environment names no such
/// pool or its file is not made yet.
fn shared_entry(
    config: &gpucap_core::config::Config,
) -> Option<Result<crate::pool_files::Entry, (String, String)>> {
    let spec = config.pool.as_ref()?;
    let sharing = gpucap_pool_file::Sharing::of(spec);
    if sharing != gpucap_pool_file::Sharing::Claim {
        return None;
    }
    let Ok(crate::pool::Located::File(path)) =
        crate::pool::locate(spec, config.pool_dir.as_deref())
    else {
        return None;
    };
    // A file removed while its members run (their directory says they live) is read
    // through them, as status reads it.
    if !path.exists() && !gpucap_pool_file::claim_members_live(&path) {
        return None;
    }
    let name = crate::procs::pool_name(&path, sharing).unwrap_or_else(|| spec.to_string());
    Some(crate::pool_files::entry_as(&name, &path, sharing).map_err(|e| (name, e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn gpu(ceiling: Option<u64>, from: Option<&str>) -> MemberGpuView {
        MemberGpuView {
            uuid: "GPU-1".into(),
            used: 100 * MIB,
            peak: 100 * MIB,
            raw_uuid: [1; 16],
            guarantee: 0,
            ceiling,
            borrowed: 100 * MIB,
            ceiling_from: from.map(String::from),
        }
    }

    fn ceiling(c: Option<u64>) -> ShareChange {
        ShareChange {
            guarantee: None,
            ceiling: Some(c),
        }
    }

    #[test]
    fn a_ceiling_handed_down_may_be_lowered_never_raised() {
        let cap = Some(1024 * MIB);
        let held = gpu(Some(256 * MIB), Some("/etc/gpucap/gpucap.env"));
        for raise in [Some(512 * MIB), None] {
            let why = raises_handed_down(&held, cap, ceiling(raise)).unwrap();
            assert!(
                why.starts_with(
                    "its ceiling, 256 MiB, was handed down to it by /etc/gpucap/gpucap.env"
                ),
                "{why}"
            );
        }
        for fine in [
            ceiling(Some(128 * MIB)),
            ceiling(Some(256 * MIB)),
            ShareChange {
                guarantee: Some(64 * MIB),
                ceiling: None,
            },
        ] {
            assert_eq!(raises_handed_down(&held, cap, fine), None);
        }
        // Held at the pool's cap (no ceiling word): none raises it past the cap.
        let at_cap = gpu(None, Some("gpucap.env beside the library"));
        assert_eq!(raises_handed_down(&at_cap, cap, ceiling(None)), None);
        assert!(raises_handed_down(&at_cap, cap, ceiling(Some(2048 * MIB))).is_some());
        // A ceiling of the member's own (GPUCAP_CEILING) is raised as always.
        let own = gpu(Some(256 * MIB), None);
        assert_eq!(raises_handed_down(&own, cap, ceiling(None)), None);
    }
}
