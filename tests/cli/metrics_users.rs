//! Root's metrics show every user's pools, as root's `gpucap status` does: `status
//! --prometheus` and `gpucap metrics --all` run as root read every `gpucap-UID`
//! directory of the pool directory (`procs::Sources`, the same checks), each pool and
//! process capped alone labelled with its owner (`user`), so that two users' pools of
//! one name are two series (docs/src/metrics.md). A notebook hub runs one uid per user
//! and its metrics sidecar as root: before, it exported root's own pools alone.

use super::common;
use super::metrics::{Server, assert_promtool_accepts, find, kill, parse, value};

use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Stdio};

use common::pool_scratch::*;
use common::*;

const MIB: u64 = 1 << 20;
const NOBODY: u32 = 65534;

/// The script capped at 1 GiB as uid 65534, in `pool` or alone, holding `mib` MiB until
/// killed; returns once it holds them (at most 60 s: a harness limit).
fn as_nobody(s: &Scratch, pool: Option<&str>, tag: &str, mib: u64) -> Child {
    let ready = s.dir.join(format!("{tag}.ready"));
    let mut args = vec!["run", "--limit", "1Gi"];
    args.extend(pool.map(|p| ["--pool", p]).into_iter().flatten());
    let script = script();
    let steps = [
        format!("alloc:{mib}Mi"),
        format!("touch:{}", ready.display()),
        format!("wait:{}", s.dir.join("never").display()),
    ];
    args.push("--");
    args.push(script.to_str().unwrap());
    args.extend(steps.iter().map(String::as_str));
    let mut c = s.gpucap(&args);
    c.env("FAKECUDA_STATS", s.dir.join(format!("{tag}.json")));
    let mut child = as_user(NOBODY, &c)
        .current_dir(&s.dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_ready(&mut child, &ready, &format!("uid {NOBODY}'s {tag}"));
    child
}

/// Root's `status --prometheus` (no pool named, and `--all`) and a `metrics --all`
/// scrape show root's pool `train`, uid 65534's pool `train` and uid 65534's process
/// capped alone, the two pools as two series told apart by `user`; promtool accepts
/// them. uid 65534's own `status --prometheus --all` still shows its own alone.
#[test]
fn root_exports_every_users_pools_and_processes_capped_alone() {
    if !as_root("running processes as another user") {
        return;
    }
    let s = Scratch::new("metrics-users");
    for d in [&s.dir, &s.pools] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let mine = s.member("train", "root", &["alloc:64Mi"]);
    let theirs = as_nobody(&s, Some("train"), "nobody-train", 32);
    let alone = as_nobody(&s, None, "nobody-alone", 16);
    let (root, nobody) = (user_name(0), user_name(NOBODY));
    let pid = alone.id().to_string();
    let texts = [
        stdout(&run(&mut s.gpucap(&["status", "--prometheus"]))),
        stdout(&run(&mut s.gpucap(&["status", "--prometheus", "--all"]))),
        Server::start(&s, &["--all"]).scrape(),
    ];
    for text in &texts {
        let m = parse(text);
        fn train(user: &str) -> [(&str, &str); 2] {
            [("pool", "train"), ("user", user)]
        }
        assert_eq!(
            find(&m, "gpucap_pool_up", &[("pool", "train")]).len(),
            2,
            "{text}"
        );
        assert_eq!(value(&m, "gpucap_pool_up", &train(&nobody)), 1.0, "{text}");
        assert_eq!(
            value(&m, "gpucap_pool_used_bytes", &train(&root)),
            (64 * MIB) as f64,
            "{text}"
        );
        assert_eq!(
            value(&m, "gpucap_pool_used_bytes", &train(&nobody)),
            (32 * MIB) as f64,
            "{text}"
        );
        assert_eq!(
            value(&m, "gpucap_member_used_bytes", &train(&nobody)),
            (32 * MIB) as f64,
            "{text}"
        );
        let info = find(&m, "gpucap_pool_info", &train(&nobody));
        assert!(
            info.len() == 1 && info[0].labels["path"].contains(&format!("/gpucap-{NOBODY}/")),
            "{text}"
        );
        let who = [("pid", pid.as_str()), ("user", nobody.as_str())];
        assert_eq!(
            value(&m, "gpucap_process_used_bytes", &who),
            (16 * MIB) as f64,
            "{text}"
        );
        assert_promtool_accepts(text);
    }
    // uid 65534's own: its pool and process, not root's.
    let mut c = s.gpucap(&["status", "--prometheus", "--all"]);
    c.env("FAKECUDA_STATS", s.dir.join("nobody-status.json"));
    let o = run(&mut as_user(NOBODY, &c));
    assert_ok(&o);
    let text = stdout(&o);
    let m = parse(&text);
    assert_eq!(find(&m, "gpucap_pool_up", &[]).len(), 1, "{text}");
    assert_eq!(
        value(
            &m,
            "gpucap_pool_up",
            &[("pool", "train"), ("user", &nobody)]
        ),
        1.0,
        "{text}"
    );
    assert_eq!(
        find(&m, "gpucap_process_used_bytes", &[("pid", &pid)]).len(),
        1
    );
    assert_promtool_accepts(&text);
    for c in [mine, theirs, alone] {
        kill(c);
    }
}
