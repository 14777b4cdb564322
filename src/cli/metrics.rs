//! Pools in Prometheus's text exposition format (version 0.0.4): `gpucap status
//! --prometheus` prints it once, `gpucap metrics --listen ADDR:PORT` serves it over HTTP.
//!
//! - [`exposition`] (pure): the series of a list of pool readings, with HELP and TYPE
//!   lines, label values escaped. A GPU without a cap has no `gpucap_pool_cap_bytes`
//!   sample (rather than `+Inf`: "no cap" is not a size, and `used / cap` then gives
//!   nothing instead of a misleading 0). The families are families.rs's; the text
//!   format (escaping, samples grouped by family) text_format.rs's.
//! - [`Reader`] (reader.rs): which pools (named ones, or every file of the user's pool
//!   directory) and reading them read-only, each file opened once and kept while it
//!   stays the same file.
//! - [`serve`] (server.rs): the HTTP server, a thread per connection, their number
//!   and time bounded; http.rs: one exchange, `http::route` (pure) decides the answer.
//!
//! Reading never changes a pool and never waits for its members: the file is opened
//! with `open_reader` (read-only descriptor, read with `pread`, never mapped),
//! `Pool::view` only loads words and asks the kernel which members' locks are held.

mod families;
mod hami;
mod http;
mod pod_namespace;
mod reader;
mod server;
mod text_format;
mod workload;

use std::path::PathBuf;

use gpucap_core::budget::PoolView;

use crate::procs::LoneReading;

use families::{
    CAP, DRIFT, GUARANTEED, HANDED_DOWN, HELD_BY_DEAD, INFO, MEMBER_ALIVE, MEMBER_BORROWED,
    MEMBER_CEILING, MEMBER_GUARANTEE, MEMBER_PEAK, MEMBER_USED, MEMBERS, PROCESS_CAP,
    UNREADABLE_FILES, UP, WAIT_SECONDS, WAITERS, WAITS,
};
pub use reader::{Reader, Which};
pub use server::serve;
use text_format::{Samples, command_label, labels};
pub use workload::Identify;

/// The Content-Type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The longest `command` label value, in characters (a member stores the first 63
/// bytes of its command line; this only bounds what a damaged file could show).
pub const COMMAND_LABEL_CHARS: usize = 64;

/// One pool as read for an exposition.
pub struct Reading {
    /// The `pool` label: the name, or the file's path when the pool was named by path.
    pub label: String,
    /// The `user` label: the pool file's owner, named as `status` names it (empty where
    /// unknown: a pool named by path whose file is not there).
    pub user: String,
    /// The file and its view, or why it could not be read: the exit status `status`
    /// would give (1: no file yet; 2: unusable) and the line to print.
    pub result: Result<(PathBuf, PoolView), (i32, String)>,
}

/// With `--all`: the files of a user's pool directory named like pool files that are
/// not pools (`procs::Unread::pool_like` false), counted: one series per user, where a
/// `gpucap_pool_up 0` each, labelled with its name, had no bound.
pub struct UnreadableFiles {
    /// The `user` label: the directory's user.
    pub user: String,
    pub files: u64,
}

/// The exposition of `readings`: `gpucap_pool_up` for every pool, the other series for
/// the pools that were read, each labelled by pool and user; then the processes capped on
/// their own (`lone`, each labelled by pid, PID namespace, user and command); the files
/// named like pool files that are not pools, counted per user (`unreadable`); with `hami`,
/// HAMi's monitor series of both (`hami.rs`), its processes named by it. Families without
/// a sample are left out.
pub fn exposition(
    readings: &[Reading],
    lone: &[LoneReading],
    unreadable: &[UnreadableFiles],
    hami: Option<&dyn Identify>,
) -> String {
    let mut s = Samples::default();
    if let Some(who) = hami {
        hami::add(&mut s, readings, lone, who);
    }
    for LoneReading { user, view: p, .. } in lone {
        let pid = p.pid.to_string();
        let ns = p.pid_namespace.to_string();
        let command = command_label(&p.command);
        for g in &p.gpus {
            let l = labels(&[
                ("pid", &pid),
                ("pid_namespace", &ns),
                ("user", user),
                ("command", &command),
                ("gpu_uuid", &g.uuid),
            ]);
            let figures = [g.used, g.peak, g.refusals, g.largest_refused];
            s.add_figures(PROCESS_CAP, &l, g.cap, figures);
            if let (Some(from), Some(cap)) = (&g.ceiling_from, g.cap) {
                let l = labels(&[
                    ("pid", &pid),
                    ("pid_namespace", &ns),
                    ("user", user),
                    ("command", &command),
                    ("gpu_uuid", &g.uuid),
                    ("from", from),
                ]);
                s.add(HANDED_DOWN, &l, cap);
            }
        }
    }
    for u in unreadable {
        s.add(UNREADABLE_FILES, &labels(&[("user", &u.user)]), u.files);
    }
    for r in readings {
        let pool = [("pool", r.label.as_str()), ("user", r.user.as_str())];
        let with = |more: &[(&str, &str)]| {
            let mut l = pool.to_vec();
            l.extend_from_slice(more);
            labels(&l)
        };
        let Ok((path, view)) = &r.result else {
            s.add(UP, &with(&[]), 0);
            continue;
        };
        s.add(UP, &with(&[]), 1);
        let path = path.to_string_lossy();
        let version = view.version.to_string();
        s.add(INFO, &with(&[("path", &path), ("version", &version)]), 1);
        let alive = view.members.iter().filter(|m| m.alive).count() as u64;
        let dead = view.members.len() as u64 - alive;
        s.add(MEMBERS, &with(&[("state", "alive")]), alive);
        s.add(MEMBERS, &with(&[("state", "dead")]), dead);
        for g in &view.gpus {
            let l = with(&[("gpu_uuid", &g.uuid)]);
            s.add_figures(
                CAP,
                &l,
                g.cap,
                [g.used, g.peak, g.refusals, g.largest_refused],
            );
            s.add(HELD_BY_DEAD, &l, g.held_by_dead);
            s.add(WAITERS, &l, g.waiters);
            s.add(WAITS, &l, g.waits);
            s.add_ms_as_seconds(WAIT_SECONDS, &l, g.wait_ms);
            s.add(DRIFT, &l, g.drift);
            s.add(GUARANTEED, &l, g.guaranteed);
        }
        let pool_cap = |uuid: &str| view.gpus.iter().find(|g| g.uuid == uuid)?.cap;
        for m in &view.members {
            // The slot tells apart two members with one pid (pid 1 of two containers).
            let slot = m.slot.to_string();
            let pid = m.pid.to_string();
            let command = command_label(&m.command);
            let member = [
                pool[0],
                pool[1],
                ("slot", slot.as_str()),
                ("pid", pid.as_str()),
                ("command", command.as_str()),
            ];
            s.add(MEMBER_ALIVE, &labels(&member), u64::from(m.alive));
            for g in &m.gpus {
                let mut l = member.to_vec();
                l.push(("gpu_uuid", &g.uuid));
                let l = labels(&l);
                s.add(MEMBER_USED, &l, g.used);
                s.add(MEMBER_PEAK, &l, g.peak);
                s.add(MEMBER_GUARANTEE, &l, g.guarantee);
                if let Some(c) = g.ceiling {
                    s.add(MEMBER_CEILING, &l, c);
                }
                s.add(MEMBER_BORROWED, &l, g.borrowed);
                let held = g.ceiling.or_else(|| pool_cap(&g.uuid));
                if let (Some(from), Some(c)) = (&g.ceiling_from, held) {
                    let mut l = member.to_vec();
                    l.extend([("gpu_uuid", g.uuid.as_str()), ("from", from.as_str())]);
                    s.add(HANDED_DOWN, &labels(&l), c);
                }
            }
        }
    }
    s.render()
}

#[cfg(test)]
mod tests {
    use super::families::FAMILIES;
    use super::text_format::escape_label;
    use super::*;
    use crate::pool::tests::view;
    use gpucap_core::budget::POOL_VERSION;

    pub(super) fn reading(label: &str, view: PoolView) -> Reading {
        Reading {
            label: label.into(),
            user: "alice".into(),
            result: Ok((PathBuf::from(format!("/p/{label}.pool")), view)),
        }
    }

    /// The sample lines of `text` for metric `name` (exact name).
    fn samples<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
        text.lines()
            .filter(|l| {
                !l.starts_with('#')
                    && l.strip_prefix(name)
                        .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
            })
            .collect()
    }

    const UUID: &str = "GPU-11111111-1111-1111-1111-111111111111";
    const MIB: u64 = 1 << 20;

    #[test]
    fn waits_in_base_units() {
        let mut v = view();
        v.gpus[0].waiters = 1;
        v.gpus[0].waits = 2;
        v.gpus[0].wait_ms = 1_500;
        let text = exposition(&[reading("t", v)], &[], &[], None);
        let gpu = format!("{{pool=\"t\",user=\"alice\",gpu_uuid=\"{UUID}\"}}");
        assert_eq!(
            samples(&text, "gpucap_pool_waiters"),
            [format!("gpucap_pool_waiters{gpu} 1")]
        );
        assert_eq!(
            samples(&text, "gpucap_pool_waits_total"),
            [format!("gpucap_pool_waits_total{gpu} 2")]
        );
        assert_eq!(
            samples(&text, "gpucap_pool_wait_seconds_total"),
            [format!("gpucap_pool_wait_seconds_total{gpu} 1.500")]
        );
        assert!(
            text.contains("# TYPE gpucap_pool_wait_seconds_total counter"),
            "{text}"
        );
    }

    #[test]
    fn guarantees_and_ceilings_as_series() {
        let text = exposition(&[reading("t", view())], &[], &[], None);
        let gpu = format!("{{pool=\"t\",user=\"alice\",gpu_uuid=\"{UUID}\"}}");
        assert_eq!(
            samples(&text, "gpucap_pool_guaranteed_bytes"),
            [format!("gpucap_pool_guaranteed_bytes{gpu} {}", 64 << 20)]
        );
        let m10 = format!(
            "{{pool=\"t\",user=\"alice\",slot=\"0\",pid=\"10\",command=\"prog-10 --x\",gpu_uuid=\"{UUID}\"}}"
        );
        for (name, value) in [
            ("gpucap_member_guarantee_bytes", 64u64 << 20),
            ("gpucap_member_ceiling_bytes", 512 << 20),
            ("gpucap_member_borrowed_bytes", 36 << 20),
        ] {
            let line = format!("{name}{m10} {value}");
            assert!(
                samples(&text, name).contains(&line.as_str()),
                "{line}\n{text}"
            );
        }
        // A member without a ceiling has no ceiling sample (the pool's cap applies).
        assert_eq!(samples(&text, "gpucap_member_ceiling_bytes").len(), 1);
        assert_eq!(samples(&text, "gpucap_member_guarantee_bytes").len(), 3);
        assert!(samples(&text, "gpucap_ceiling_handed_down_bytes").is_empty());
    }

    #[test]
    fn a_ceiling_handed_down_is_a_series_with_where_it_came_from() {
        let mut v = view();
        // Member 10 held at its 512 MiB ceiling, member 12 at the pool's 1 GiB cap.
        for m in v.members.iter_mut().filter(|m| m.pid != 11) {
            m.gpus[0].ceiling_from = Some("gpucap.env beside the library".into());
        }
        let mut lone = crate::procs::tests::lone(99, 5 << 20, Some(256 << 20));
        lone.view.gpus[0].ceiling_from = Some("/etc/gpucap/gpucap.env".into());
        let text = exposition(&[reading("t", v)], &[lone], &[], None);
        let got = samples(&text, "gpucap_ceiling_handed_down_bytes");
        assert_eq!(got.len(), 3, "{text}");
        for want in [
            format!(
                "gpucap_ceiling_handed_down_bytes{{pool=\"t\",user=\"alice\",slot=\"0\",pid=\"10\",command=\"prog-10 --x\",gpu_uuid=\"{UUID}\",from=\"gpucap.env beside the library\"}} {}",
                512 << 20
            ),
            format!(
                "gpucap_ceiling_handed_down_bytes{{pid=\"99\",pid_namespace=\"7\",user=\"alice\",command=\"prog-99 --lone\",gpu_uuid=\"{UUID}\",from=\"/etc/gpucap/gpucap.env\"}} {}",
                256 << 20
            ),
        ] {
            assert!(got.contains(&want.as_str()), "{want}\n{text}");
        }
        assert!(
            got.iter()
                .any(|l| l.contains("pid=\"12\"") && l.ends_with(&format!(" {}", 1u64 << 30))),
            "{text}"
        );
    }

    #[test]
    fn every_series_of_a_pool() {
        let text = exposition(&[reading("t", view())], &[], &[], None);
        let one = |name: &str| {
            let s = samples(&text, name);
            assert_eq!(s.len(), 1, "{name}\n{text}");
            s[0].to_string()
        };
        let gpu = format!("{{pool=\"t\",user=\"alice\",gpu_uuid=\"{UUID}\"}}");
        assert_eq!(
            one("gpucap_pool_up"),
            "gpucap_pool_up{pool=\"t\",user=\"alice\"} 1"
        );
        assert_eq!(
            one("gpucap_pool_info"),
            format!(
                "gpucap_pool_info{{pool=\"t\",user=\"alice\",path=\"/p/t.pool\",version=\"{POOL_VERSION}\"}} 1"
            )
        );
        assert_eq!(
            one("gpucap_pool_cap_bytes"),
            format!("gpucap_pool_cap_bytes{gpu} {}", 1u64 << 30)
        );
        assert_eq!(
            one("gpucap_pool_used_bytes"),
            format!("gpucap_pool_used_bytes{gpu} {}", 700 * MIB)
        );
        assert_eq!(
            one("gpucap_pool_peak_bytes"),
            format!("gpucap_pool_peak_bytes{gpu} {}", 701 * MIB)
        );
        assert_eq!(
            one("gpucap_pool_refusals_total"),
            format!("gpucap_pool_refusals_total{gpu} 1")
        );
        assert_eq!(
            one("gpucap_pool_largest_refused_bytes"),
            format!("gpucap_pool_largest_refused_bytes{gpu} {}", 600 * MIB)
        );
        assert_eq!(
            one("gpucap_pool_held_by_dead_bytes"),
            format!("gpucap_pool_held_by_dead_bytes{gpu} {}", 200 * MIB)
        );
        assert_eq!(
            samples(&text, "gpucap_pool_members"),
            [
                "gpucap_pool_members{pool=\"t\",user=\"alice\",state=\"alive\"} 2",
                "gpucap_pool_members{pool=\"t\",user=\"alice\",state=\"dead\"} 1"
            ]
        );
        assert_eq!(
            samples(&text, "gpucap_member_alive"),
            [
                "gpucap_member_alive{pool=\"t\",user=\"alice\",slot=\"0\",pid=\"10\",command=\"prog-10 --x\"} 1",
                "gpucap_member_alive{pool=\"t\",user=\"alice\",slot=\"1\",pid=\"11\",command=\"prog-11 --x\"} 0",
                "gpucap_member_alive{pool=\"t\",user=\"alice\",slot=\"2\",pid=\"12\",command=\"prog-12 --x\"} 1",
            ]
        );
        assert_eq!(
            samples(&text, "gpucap_member_used_bytes")[1],
            format!(
                "gpucap_member_used_bytes{{pool=\"t\",user=\"alice\",slot=\"1\",pid=\"11\",\
                 command=\"prog-11 --x\",gpu_uuid=\"{UUID}\"}} {}",
                200 * MIB
            )
        );
        assert_eq!(
            samples(&text, "gpucap_member_peak_bytes")[2],
            format!(
                "gpucap_member_peak_bytes{{pool=\"t\",user=\"alice\",slot=\"2\",pid=\"12\",\
                 command=\"prog-12 --x\",gpu_uuid=\"{UUID}\"}} {}",
                401 * MIB
            )
        );
    }

    #[test]
    fn each_family_once_with_help_and_type_before_its_samples() {
        let mut second = view();
        second.gpus[0].cap = None;
        let mut lone = crate::procs::tests::lone(99, 5 << 20, Some(1 << 30));
        lone.view.gpus[0].ceiling_from = Some("/etc/gpucap/gpucap.env".into());
        let text = exposition(
            &[
                reading("a", view()),
                Reading {
                    label: "gone".into(),
                    user: "alice".into(),
                    result: Err((1, "gpucap: no pool file".into())),
                },
                reading("b", second),
            ],
            &[lone],
            &[UnreadableFiles {
                user: "alice".into(),
                files: 3,
            }],
            Some(&TwoContainers),
        );
        let mut names_seen = Vec::new();
        let mut current = "";
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap();
                assert!(!names_seen.contains(&name), "{name} twice\n{text}");
                names_seen.push(name);
                current = name;
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert_eq!(name, current, "{text}");
                let want = if name.ends_with("_total") {
                    "counter"
                } else {
                    "gauge"
                };
                assert_eq!(kind, want, "{text}");
            } else {
                assert!(line.starts_with(current), "{line} under {current}\n{text}");
            }
        }
        assert_eq!(names_seen.len(), FAMILIES.len(), "{text}");
        // The pools follow each other within each family.
        assert_eq!(
            samples(&text, "gpucap_pool_up"),
            [
                "gpucap_pool_up{pool=\"a\",user=\"alice\"} 1",
                "gpucap_pool_up{pool=\"gone\",user=\"alice\"} 0",
                "gpucap_pool_up{pool=\"b\",user=\"alice\"} 1"
            ]
        );
        // No cap, no sample; the unreadable pool has nothing but its up.
        let caps = samples(&text, "gpucap_pool_cap_bytes");
        assert_eq!(caps.len(), 1, "{text}");
        assert!(caps[0].contains("pool=\"a\",user=\"alice\""));
        assert!(!text.contains("pool=\"gone\",user=\"alice\",") && !text.contains("+Inf"));
        assert_eq!(samples(&text, "gpucap_pool_used_bytes").len(), 2);
        assert_eq!(
            samples(&text, "gpucap_process_used_bytes"),
            [format!(
                "gpucap_process_used_bytes{{pid=\"99\",pid_namespace=\"7\",user=\"alice\",command=\"prog-99 --lone\",gpu_uuid=\"{UUID}\"}} {}",
                5 << 20
            )]
        );
        assert_eq!(samples(&text, "gpucap_process_refusals_total").len(), 1);
        assert_eq!(
            samples(&text, "gpucap_pool_files_unreadable"),
            ["gpucap_pool_files_unreadable{user=\"alice\"} 3"]
        );
    }

    #[test]
    fn nothing_read_nothing_printed() {
        assert_eq!(exposition(&[], &[], &[], None), "");
        let text = exposition(
            &[Reading {
                label: "x".into(),
                user: String::new(),
                result: Err((1, String::new())),
            }],
            &[],
            &[],
            None,
        );
        assert_eq!(
            text,
            format!(
                "# HELP gpucap_pool_up {}\n# TYPE gpucap_pool_up gauge\n\
                 gpucap_pool_up{{pool=\"x\",user=\"\"}} 0\n",
                FAMILIES[UP].help
            )
        );
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label(r#"a\b"c"#), r#"a\\b\"c"#);
        assert_eq!(escape_label("l1\nl2"), "l1\\nl2");
        assert_eq!(escape_label("x\x1b[2J\ty\r"), "x?[2J?y?");
        assert_eq!(escape_label("café ✓"), "café ✓");
        let mut v = view();
        v.members[0].command = "evil\"} 1\ngpucap_x 2 \\".into();
        let text = exposition(&[reading("t\"q", v)], &[], &[], None);
        let alive = samples(&text, "gpucap_member_alive");
        assert_eq!(
            alive[0],
            "gpucap_member_alive{pool=\"t\\\"q\",user=\"alice\",slot=\"0\",pid=\"10\",\
             command=\"evil\\\"} 1\\ngpucap_x 2 \\\\\"} 1"
        );
        assert!(!text.lines().any(|l| l.starts_with("gpucap_x")), "{text}");
        // A command longer than a member stores (a damaged file) is cut.
        let mut v = view();
        v.members[0].command = "é".repeat(100);
        let text = exposition(&[reading("t", v)], &[], &[], None);
        let line = samples(&text, "gpucap_member_alive")[0];
        assert!(
            line.contains(&format!("command=\"{}\"", "é".repeat(64))),
            "{line}"
        );
        assert!(!line.contains(&"é".repeat(65)), "{line}");
    }

    /// Names pid 11 and 12 as two containers of one pod, everything else as unknown.
    struct TwoContainers;
    impl Identify for TwoContainers {
        fn workload(&self, pid: u32, _: u64) -> workload::Workload {
            let container = match pid {
                11 => "aaaaaaaaaaaa",
                12 => "bbbbbbbbbbbb",
                _ => return workload::Workload::default(),
            };
            workload::Workload {
                namespace: "team-a".into(),
                pod: "trainer-0".into(),
                container: container.into(),
            }
        }
    }

    #[test]
    fn hamis_series_show_each_containers_use_of_a_pool_and_the_pools_cap() {
        let mut v = view();
        v.members.truncate(1);
        let mut second = v.members[0].clone();
        v.members[0].pid = 11;
        v.members[0].gpus[0].used = 3 << 20;
        second.slot += 1;
        second.pid = 12;
        second.gpus[0].used = 5 << 20;
        v.members.push(second.clone());
        second.slot += 1;
        second.pid = 12;
        second.gpus[0].used = 7 << 20;
        v.members.push(second);
        let uuid = v.gpus[0].uuid.clone();
        let cap = v.gpus[0].cap.unwrap();
        let lone = crate::procs::tests::lone(99, 5 << 20, Some(1 << 30));
        let text = exposition(&[reading("t", v)], &[lone], &[], Some(&TwoContainers));
        let line = |name: &str, labels: &str| -> String {
            text.lines()
                .find(|l| l.starts_with(&format!("{name}{{{labels}")))
                .unwrap_or_else(|| panic!("no {name}{{{labels}...}} in\n{text}"))
                .to_string()
        };
        let a = format!(
            "namespace=\"team-a\",pod=\"trainer-0\",container=\"aaaaaaaaaaaa\",vdevice_index=\"0\",device_uuid=\"{uuid}\",pool=\"t\",user=\"alice\""
        );
        let b = a.replace("aaaaaaaaaaaa", "bbbbbbbbbbbb");
        assert!(line("hami_vgpu_memory_used_bytes", &a).ends_with(&format!(" {}", 3 << 20)));
        // Two processes of one container: one series, their sum.
        assert!(line("hami_vgpu_memory_used_bytes", &b).ends_with(&format!(" {}", 12 << 20)));
        assert!(line("hami_vgpu_memory_limit_bytes", &b).ends_with(&format!(" {cap}")));
        // A process capped alone, outside Kubernetes: empty names, its own cap.
        let alone = "namespace=\"\",pod=\"\",container=\"\",vdevice_index=\"0\"";
        assert!(line("hami_vgpu_memory_limit_bytes", alone).ends_with(&format!(" {}", 1u64 << 30)));
        assert!(line("hami_vgpu_memory_used_bytes", alone).contains("pid=\"99\""));
        // Without --hami, none of it.
        let mut plain = view();
        plain.members.truncate(1);
        assert!(!exposition(&[reading("t", plain)], &[], &[], None).contains("hami_"));
    }
}
