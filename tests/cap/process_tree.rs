//! A program's process tree: a child started with an environment of its parent's making
//! (`env -i`, `subprocess.run(env={...})`, `os.posix_spawn`, the environment cleared
//! before an `execv`, a `system` or a `popen`, `LD_PRELOAD` replaced by another library,
//! `env -u`) keeps the parent's cap: the shim's `exec`, `posix_spawn`, `system` and
//! `popen` hooks hand down the library and the parent's configuration where the child's
//! environment drops them (`src/shim/hand_down.rs`, `src/shim/shell.rs`). The parent runs with a 256 MiB cap on the fake GPU (4 GiB);
//! its child, `script`, asks 400 MiB: refused (`CUDA_ERROR_OUT_OF_MEMORY`, 2) with the
//! shim's line. Without the hand-down each launcher here served it.

use super::ceilings::library_in;
use super::common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const ASK: &str = "alloc:400Mi";
const REFUSED: &str = "alloc 419430400 2";

fn script() -> PathBuf {
    compile_c("script", "", &["-lcuda"])
}

/// A launcher of the child: how the parent starts `script ASK` with an environment of its
/// own making (`fake` is the fake driver's directory, the only variable it passes on).
fn launchers(script: &Path, fake: &Path) -> Vec<(&'static str, Vec<String>)> {
    let (s, f) = (script.display(), fake.display());
    let py = |code: String| vec!["python3".into(), "-c".into(), code];
    vec![
        (
            "env -i (execvp, environ emptied)",
            vec![
                "env".into(),
                "-i".into(),
                format!("LD_LIBRARY_PATH={f}"),
                s.to_string(),
                ASK.into(),
            ],
        ),
        (
            "env -u LD_PRELOAD -u GPUCAP_LIMIT (unsetenv, then execvp)",
            vec![
                "env".into(),
                "-u".into(),
                "LD_PRELOAD".into(),
                "-u".into(),
                "GPUCAP_LIMIT".into(),
                s.to_string(),
                ASK.into(),
            ],
        ),
        (
            "subprocess.run(env={...}) (fork and execve)",
            py(format!(
                "import subprocess, sys; sys.exit(subprocess.run(['{s}', '{ASK}'], \
                 env={{'LD_LIBRARY_PATH': '{f}'}}).returncode)"
            )),
        ),
        (
            "os.posix_spawn with an environment of its own",
            py(format!(
                "import os, sys; pid = os.posix_spawn('{s}', ['script', '{ASK}'], \
                 {{'LD_LIBRARY_PATH': '{f}'}}); sys.exit(os.waitstatus_to_exitcode(\
                 os.waitpid(pid, 0)[1]))"
            )),
        ),
        (
            "os.environ.clear(), then os.execv (execv of the emptied environ)",
            py(format!(
                "import os; os.environ.clear(); os.environ['LD_LIBRARY_PATH'] = '{f}'; \
                 os.execv('{s}', ['script', '{ASK}'])"
            )),
        ),
        (
            "os.environ.clear(), then os.system (the C library's system, its own spawn)",
            py(format!(
                "import os, sys; os.environ.clear(); os.environ['LD_LIBRARY_PATH'] = '{f}'; \
                 sys.exit(os.waitstatus_to_exitcode(os.system('{s} {ASK}')))"
            )),
        ),
        (
            "clearenv, then popen (the C library's popen, its own spawn)",
            py(format!(
                "import ctypes, os, sys; c = ctypes.CDLL(None); c.popen.restype = ctypes.c_void_p; \
                 c.pclose.argtypes = [ctypes.c_void_p]; c.clearenv(); \
                 c.setenv(b'LD_LIBRARY_PATH', b'{f}', 1); p = c.popen(b'{s} {ASK}', b'w'); \
                 sys.exit(os.waitstatus_to_exitcode(c.pclose(p)))"
            )),
        ),
        (
            "LD_PRELOAD naming the library by a bare name its loader does not find",
            py(format!(
                "import subprocess, sys; sys.exit(subprocess.run(['{s}', '{ASK}'], \
                 env={{'LD_LIBRARY_PATH': '{f}', 'LD_PRELOAD': 'libgpucap.so'}}).returncode)"
            )),
        ),
        (
            "LD_PRELOAD replaced by another library",
            vec![
                "env".into(),
                "LD_PRELOAD=libm.so.6".into(),
                s.to_string(),
                ASK.into(),
            ],
        ),
        (
            "an environment larger than the hooks' buffer on the stack (3,000 variables)",
            py(format!(
                "import subprocess, sys; env = {{'V%d' % i: 'x' * 20 for i in range(3000)}}; \
                 env['LD_LIBRARY_PATH'] = '{f}'; \
                 sys.exit(subprocess.run(['{s}', '{ASK}'], env=env).returncode)"
            )),
        ),
    ]
}

/// `argv` run on the fake GPU with the shim `lib` preloaded and `vars`.
fn parent(lib: &Path, vars: &[(&str, &str)], argv: &[String], tag: &str) -> Output {
    let stats = scratch(tag).join("stats");
    let mut cmd = fake_cmd(&argv[0], &stats);
    cmd.args(&argv[1..]).env("LD_PRELOAD", lib);
    cmd.env("FAKECUDA_TOTAL_MEM", "4Gi");
    for (k, v) in vars {
        cmd.env(k, v);
    }
    run(&mut cmd)
}

fn assert_refused(o: &Output, what: &str) {
    assert!(
        stdout(o).contains(REFUSED) && stderr(o).contains("refused cuMemAlloc of 400 MiB"),
        "{what}: the child's 400 MiB must be refused under the parent's 256 MiB\n{}",
        dump(o)
    );
}

#[test]
fn a_child_started_with_an_environment_of_its_parents_making_keeps_the_cap() {
    let script = script();
    for (what, argv) in launchers(&script, &fake_lib_dir()) {
        let o = parent(&shim(), &[("GPUCAP_LIMIT", "256Mi")], &argv, "tree-env");
        assert_refused(&o, what);
    }
}

#[test]
fn a_file_beside_the_library_reaches_a_child_that_drops_the_library() {
    let dir = scratch("tree-file");
    let lib = library_in(&dir.join("lib"), Some("GPUCAP_LIMIT=256Mi\n"));
    let script = script();
    for (what, argv) in launchers(&script, &fake_lib_dir()) {
        // The file alone caps the parent: the child gets the library, and reads the file.
        let o = parent(&lib, &[], &argv, "tree-file");
        assert_refused(&o, what);
    }
}

/// The environment a child of `env -i` sees, under a parent with `vars`.
fn childs_environment(lib: &Path, vars: &[(&str, &str)]) -> Vec<String> {
    let argv = ["env", "-i", "A=1", "env"].map(String::from);
    let o = parent(lib, vars, &argv, "tree-seen");
    assert_ok(&o);
    stdout(&o).lines().map(String::from).collect()
}

#[test]
fn a_child_inherits_the_configuration_and_the_library_and_nothing_else() {
    let lib = shim();
    let shim = lib.display().to_string();
    let seen = childs_environment(
        &lib,
        &[
            ("GPUCAP_LIMIT", "256Mi"),
            ("GPUCAP_LOG", "warn"),
            ("CUDA_VISIBLE_DEVICES", "0"),
            ("OTHER", "x"),
        ],
    );
    let mut seen_sorted = seen.clone();
    seen_sorted.sort();
    assert_eq!(
        seen_sorted,
        [
            "A=1".to_string(),
            "GPUCAP_LIMIT=256Mi".into(),
            "GPUCAP_LOG=warn".into(),
            format!("LD_PRELOAD={shim}"),
        ],
        "the variables the configuration reads, bar the GPUs' choice, and the library"
    );
    // A process with no configuration (no variable, no file) hands nothing down; nor one
    // whose only variable read is a runtime's choice of GPUs.
    assert_eq!(childs_environment(&lib, &[]), ["A=1"]);
    assert_eq!(
        childs_environment(&lib, &[("NVIDIA_VISIBLE_DEVICES", "all")]),
        ["A=1"]
    );
}

#[test]
fn what_a_childs_environment_sets_holds_under_the_files_ceiling() {
    let script = script();
    let fake = fake_lib_dir();
    let child = |limit: &str| {
        vec![
            "env".into(),
            "-i".into(),
            format!("LD_LIBRARY_PATH={}", fake.display()),
            format!("GPUCAP_LIMIT={limit}"),
            script.display().to_string(),
            ASK.into(),
        ]
    };
    // A cap from the environment alone is the user's: the child's own figure holds, and
    // holds it (400 MiB served, 1.5 GiB more refused).
    let mut own = child("1Gi");
    own.push("alloc:1536Mi".into());
    // The same under a parent capped by HAMi-core's variable: its own GPUCAP_LIMIT is the
    // child's cap, not a disagreement with an inherited CUDA_DEVICE_MEMORY_LIMIT.
    for parents_cap in [
        ("GPUCAP_LIMIT", "256Mi"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "256m"),
    ] {
        let o = parent(&shim(), &[parents_cap], &own, "tree-own");
        assert!(
            stdout(&o).contains("alloc 419430400 0") && stdout(&o).contains("alloc 1610612736 2"),
            "{parents_cap:?}\n{}",
            dump(&o)
        );
    }
    let o = parent(
        &shim(),
        &[("GPUCAP_LIMIT", "256Mi")],
        &child("128Mi"),
        "tree-own",
    );
    assert_refused(&o, "the child's lower cap");
    // A file's cap is a ceiling the child's environment does not raise.
    let dir = scratch("tree-ceiling");
    let lib = library_in(&dir.join("lib"), Some("GPUCAP_LIMIT=256Mi\n"));
    let o = parent(&lib, &[], &child("1Gi"), "tree-ceiling");
    assert_refused(&o, "a child asking 1 GiB under the file's 256 MiB");
}

/// The hand-down costs a capped program no `exec` it makes: a child of a parent under a
/// cap runs as it would (`sh -c`, a program found on `PATH`, exit status kept).
#[test]
fn children_run_as_they_would() {
    let argv = ["sh", "-c", "exit 7"].map(String::from);
    let o = parent(&shim(), &[("GPUCAP_LIMIT", "256Mi")], &argv, "tree-run");
    assert_eq!(o.status.code(), Some(7), "{}", dump(&o));
    let argv = ["env", "-i", "PATH=/usr/bin:/bin", "sh", "-c", "echo $PATH"].map(String::from);
    let o = parent(&shim(), &[("GPUCAP_LIMIT", "256Mi")], &argv, "tree-run");
    assert_eq!(stdout(&o).trim(), "/usr/bin:/bin", "{}", dump(&o));
    // A shell started by `system` after the environment was cleared (its command built
    // anew): its words and its exit status as the caller gave them.
    let py = "import os, sys\nos.environ.clear()\nos.system(\"echo 'a  b' \\\"c'd\\\" $0\")\n\
              sys.exit(os.waitstatus_to_exitcode(os.system('exit 7')))";
    let argv = ["python3", "-c", py].map(String::from);
    let o = parent(&shim(), &[("GPUCAP_LIMIT", "256Mi")], &argv, "tree-run");
    assert_eq!(
        (stdout(&o).as_str(), o.status.code()),
        ("a  b c'd sh\n", Some(7)),
        "{}",
        dump(&o)
    );
    // A program that is not there: the exec fails as the C library's does.
    let py = "import os\ntry:\n    os.execv('/nonexistent/x', ['x'])\nexcept OSError as e:\n    print(e.errno)";
    let argv = ["python3", "-c", py].map(String::from);
    let o = parent(&shim(), &[("GPUCAP_LIMIT", "256Mi")], &argv, "tree-run");
    assert_eq!(stdout(&o).trim(), "2", "{}", dump(&o));
}

/// A library preloaded by a path relative to the parent's directory
/// (`LD_PRELOAD=./libgpucap.so`, as from a build folder) is handed down by its whole
/// path: a child started elsewhere with an environment of its own, or with the relative
/// `LD_PRELOAD` it inherited, keeps the cap (before, the relative path was handed down
/// and such a child, which cannot find it, took 400 MiB under the parent's 256 MiB).
#[test]
fn a_library_preloaded_by_a_relative_path_reaches_a_child_started_elsewhere() {
    let script = script();
    let lib = shim();
    let dir = lib.parent().unwrap();
    let name = format!("./{}", lib.file_name().unwrap().to_string_lossy());
    let f = fake_lib_dir();
    for (what, env) in [
        (
            "an environment of its own",
            format!("{{'LD_LIBRARY_PATH': '{}'}}", f.display()),
        ),
        (
            "the relative LD_PRELOAD kept",
            format!(
                "{{'LD_LIBRARY_PATH': '{}', 'LD_PRELOAD': '{name}'}}",
                f.display()
            ),
        ),
    ] {
        let code = format!(
            "import subprocess, sys; sys.exit(subprocess.run(['{}', '{ASK}'], cwd='/', \
             env={env}).returncode)",
            script.display()
        );
        let stats = scratch("tree-relative").join("stats");
        let mut cmd = fake_cmd("python3", &stats);
        cmd.args(["-c", &code])
            .current_dir(dir)
            .env("LD_PRELOAD", &name)
            .env("FAKECUDA_TOTAL_MEM", "4Gi")
            .env("GPUCAP_LIMIT", "256Mi");
        assert_refused(&run(&mut cmd), what);
    }
}

/// `system` runs the caller's command as given where the environment keeps the cap,
/// however `LD_PRELOAD` names the library (its whole path, the bare name the loader
/// searched for, a path relative to the directory: before, the last two were taken for
/// a library missing, and every command was rewritten, a review found); where the cap is
/// gone from it and the rewritten command would be longer than the kernel takes (60,000
/// quotes in it), as given with one line (before, the shell's start failed: 127).
#[test]
fn system_changes_no_command_whose_environment_keeps_the_cap() {
    let lib = shim();
    let dir = lib.parent().unwrap();
    let file = lib.file_name().unwrap().to_string_lossy().into_owned();
    // How the shell `system` started was started: its command line.
    let edges = exec_edges();
    let show = "tr '\\0' ' ' < /proc/$$/cmdline";
    for preload in [lib.display().to_string(), file.clone(), format!("./{file}")] {
        let stats = scratch("tree-system").join("stats");
        let mut cmd = fake_cmd(&edges, &stats);
        cmd.args(["system", show])
            .current_dir(dir)
            .env(
                "LD_LIBRARY_PATH",
                format!("{}:{}", fake_lib_dir().display(), dir.display()),
            )
            .env("LD_PRELOAD", &preload)
            .env("GPUCAP_LIMIT", "256Mi");
        let o = run(&mut cmd);
        assert!(
            stdout(&o).starts_with("sh -c tr "),
            "LD_PRELOAD={preload}: the shell runs the command as given\n{}",
            dump(&o)
        );
    }
    let long = format!("true {}", "'x'".repeat(20_000));
    let argv = [edges.display().to_string(), "system-cleared".into(), long];
    let o = parent(&lib, &[("GPUCAP_LIMIT", "256Mi")], &argv, "tree-system");
    assert!(
        o.status.success() && stderr(&o).contains("runs without it"),
        "a command too long to hand the cap to runs as given, with a line\n{}",
        dump(&o)
    );
}

/// The shell `system` starts with the cap handed to it parses its command as the C
/// library's own would: glibc before 2.38 gives no `--` after `-c`, so a command starting
/// with `-` is the shell's options there (exit 2), a command from 2.38 on (before, the
/// handed shell always got `--`: exit 127 where the C library's exits 2).
#[test]
fn a_shell_handed_the_cap_parses_a_command_as_the_c_librarys() {
    let edges = exec_edges().display().to_string();
    let argv = [edges.clone(), "system-cleared".into(), "-x true".into()];
    let stats = scratch("tree-dash").join("stats");
    let mut cmd = fake_cmd(&edges, &stats);
    cmd.args(&argv[1..]);
    let plain = run(&mut cmd);
    let capped = parent(&shim(), &[("GPUCAP_LIMIT", "256Mi")], &argv, "tree-dash");
    assert_eq!(
        capped.status.code(),
        plain.status.code(),
        "uncapped:\n{}\ncapped:\n{}",
        dump(&plain),
        dump(&capped)
    );
}

/// A parent that set its cap in its own environment before its first CUDA call (as a
/// notebook does) hands down that cap: the configuration it read, not the environment it
/// started with (none here).
#[test]
fn the_cap_a_parent_read_is_the_one_handed_down() {
    let script = script();
    let f = fake_lib_dir();
    let code = format!(
        "import ctypes, os, subprocess, sys\n\
         os.environ['GPUCAP_LIMIT'] = '128Mi'\n\
         assert ctypes.CDLL('libcuda.so.1').cuInit(0) == 0\n\
         sys.exit(subprocess.run(['{}', 'alloc:200Mi'], env={{'LD_LIBRARY_PATH': '{}'}}).returncode)",
        script.display(),
        f.display()
    );
    let argv = ["python3".to_string(), "-c".into(), code];
    let o = parent(&shim(), &[], &argv, "tree-read");
    assert!(
        stdout(&o).contains("alloc 209715200 2"),
        "the child's 200 MiB must be refused under the 128 MiB its parent read\n{}",
        dump(&o)
    );
}

/// A parent capped per GPU by ordinal (`GPUCAP_LIMIT=0=256Mi,1=1Gi` on two fake GPUs)
/// whose launcher picks each child's GPUs (`CUDA_VISIBLE_DEVICES`): each key stays on the
/// GPU the parent meant (`GPUCAP_ORDINALS`, handed down with the keys). Reordered
/// (`1,0`): the child's GPU 0 is the parent's GPU 1, at 1 GiB, and its GPU 1 the
/// parent's 256 MiB one; narrowed (`1`): its one GPU at 1 GiB. Before, the keys counted
/// the child's own ordinals: 600 MiB refused on the 1 GiB GPU, 400 MiB served on the 256
/// MiB one, and a narrowed child failed `cuInit` (its key 1 named no GPU). A child whose
/// environment gives keys of its own keeps them on its own ordinals.
#[test]
fn a_parents_ordinal_keys_stay_on_its_gpus_when_a_launcher_picks_a_childs() {
    let script = script();
    let (s, f) = (script.display(), fake_lib_dir().display().to_string());
    let vars = [("GPUCAP_LIMIT", "0=256Mi,1=1Gi"), ("FAKECUDA_DEVICES", "2")];
    let child = |visible: &str, device: &str, steps: &[&str]| {
        // `env -i`: the child inherits the keys (the fake's variables given again).
        let mut argv: Vec<String> = ["env", "-i", "FAKECUDA_DEVICES=2", "FAKECUDA_TOTAL_MEM=4Gi"]
            .map(String::from)
            .to_vec();
        argv.push(format!("LD_LIBRARY_PATH={f}"));
        argv.push(format!("CUDA_VISIBLE_DEVICES={visible}"));
        argv.push(format!("SCRIPT_DEVICE={device}"));
        argv.push(s.to_string());
        argv.extend(steps.iter().map(|x| x.to_string()));
        argv
    };
    let expect = |o: &Output, lines: &[&str], what: &str| {
        for l in lines {
            assert!(stdout(o).contains(l), "{what}: no {l:?}\n{}", dump(o));
        }
    };
    let big = ["alloc:600Mi", "alloc:600Mi"];
    let o = parent(&shim(), &vars, &child("1,0", "0", &big), "tree-ordinals");
    expect(
        &o,
        &["alloc 629145600 0", "alloc 629145600 2"],
        "reordered, GPU 0",
    );
    let o = parent(&shim(), &vars, &child("1,0", "1", &[ASK]), "tree-ordinals");
    assert_refused(&o, "reordered, GPU 1 (the parent's 256 MiB GPU 0)");
    let o = parent(&shim(), &vars, &child("1", "0", &big), "tree-ordinals");
    expect(
        &o,
        &["cuInit 0", "alloc 629145600 0", "alloc 629145600 2"],
        "narrowed",
    );
    // `env`: the child's environment copies the keys.
    let mut argv: Vec<String> = vec!["env".into(), "CUDA_VISIBLE_DEVICES=1".into(), s.to_string()];
    argv.extend(big.iter().map(|x| x.to_string()));
    let o = parent(&shim(), &vars, &argv, "tree-ordinals");
    expect(
        &o,
        &["alloc 629145600 0", "alloc 629145600 2"],
        "env, narrowed",
    );
    // The launcher copies its environment and picks the GPUs (`os.environ`).
    let code = format!(
        "import os, subprocess, sys\n\
         env = dict(os.environ, CUDA_VISIBLE_DEVICES='1', LD_LIBRARY_PATH='{f}')\n\
         sys.exit(subprocess.run(['{s}', 'alloc:600Mi', 'alloc:600Mi'], env=env).returncode)"
    );
    let argv = ["python3".to_string(), "-c".into(), code];
    let o = parent(&shim(), &vars, &argv, "tree-ordinals");
    expect(
        &o,
        &["alloc 629145600 0", "alloc 629145600 2"],
        "os.environ copied",
    );
    // Keys a child sets in its own environment after the frame was handed down count
    // its own GPUs (the frame is bound to the keys it came with): before, its key 0 was
    // moved off its one GPU and the GPU ran uncapped.
    let code = String::from(
        "import ctypes, os, sys\n\
         os.environ['GPUCAP_LIMIT'] = '0=256Mi'\n\
         cu = ctypes.CDLL('libcuda.so.1')\n\
         assert cu.cuInit(0) == 0\n\
         dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()\n\
         assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0\n\
         assert cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0\n\
         print('alloc', cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(400 << 20)))",
    );
    let launcher = format!(
        "import os, subprocess, sys\n\
         env = dict(os.environ, CUDA_VISIBLE_DEVICES='1', LD_LIBRARY_PATH='{f}')\n\
         sys.exit(subprocess.run([sys.executable, '-c', {code:?}], env=env).returncode)"
    );
    let argv = ["python3".to_string(), "-c".into(), launcher];
    let o = parent(&shim(), &vars, &argv, "tree-ordinals");
    expect(&o, &["alloc 2"], "keys set in the child's own environment");
    // A child that sets keys of its own and reads them (its first CUDA call) hands its
    // own frame on with them, not the one it was handed: its child on the GPU it capped
    // at 256 MiB is refused 400 MiB (before, the stale frame was handed on and ignored,
    // and the grandchild read the keys as its own ordinals: 1 GiB there).
    let grandchild = format!(
        "import ctypes, os, subprocess, sys\n\
         os.environ['GPUCAP_LIMIT'] = '0=1Gi,1=256Mi'\n\
         assert ctypes.CDLL('libcuda.so.1').cuInit(0) == 0\n\
         env = dict(os.environ, CUDA_VISIBLE_DEVICES='1', LD_LIBRARY_PATH='{f}')\n\
         sys.exit(subprocess.run(['{s}', '{ASK}'], env=env).returncode)"
    );
    let launcher = format!(
        "import os, subprocess, sys\n\
         env = dict(os.environ, LD_LIBRARY_PATH='{f}')\n\
         sys.exit(subprocess.run([sys.executable, '-c', {grandchild:?}], env=env).returncode)"
    );
    let argv = ["python3".to_string(), "-c".into(), launcher];
    let o = parent(&shim(), &vars, &argv, "tree-ordinals");
    assert_refused(&o, "a grandchild under its parent's own keys");
    // Keys of the child's own count its own GPUs.
    let mut own = child("1", "0", &[ASK]);
    own.insert(4, "GPUCAP_LIMIT=0=256Mi".into());
    let o = parent(&shim(), &vars, &own, "tree-ordinals");
    assert_refused(&o, "the child's own key 0");
}

fn exec_edges() -> PathBuf {
    compile_c("exec_edges", "", &[])
}

/// Children forked by a thread another library's constructor started, while gpucap's
/// own constructor copies the environment the process started with (100,000 variables:
/// a long copy), each `exec`ing with an empty environment, get the cap: where the copy is
/// not finished (or never will be, in a child forked during it) the variables are read
/// from the environment itself (before, they were read as none, and 6 of 60 children in
/// half the runs started uncapped; a review found it).
#[test]
fn children_forked_while_the_library_loads_get_the_cap() {
    let dir = scratch("tree-ctor-forks");
    let so = dir.join("libctor_forks.so");
    let cc = |args: &[&std::ffi::OsStr]| {
        let status = std::process::Command::new("cc")
            .args(args)
            .status()
            .unwrap();
        assert!(status.success(), "cc {args:?}");
    };
    let src = root().join("tests/c/libctor_forks.c");
    cc(&[
        "-shared".as_ref(),
        "-fPIC".as_ref(),
        "-O1".as_ref(),
        "-o".as_ref(),
        so.as_ref(),
        src.as_ref(),
        "-lpthread".as_ref(),
    ]);
    let main = dir.join("main.c");
    std::fs::write(
        &main,
        "void ctor_forks_wait(void);\nint main(void) { ctor_forks_wait(); return 0; }\n",
    )
    .unwrap();
    let program = dir.join("ctor_main");
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    cc(&[
        "-o".as_ref(),
        program.as_ref(),
        main.as_ref(),
        "-L".as_ref(),
        dir.as_ref(),
        rpath.as_ref(),
        "-Wl,--no-as-needed".as_ref(),
        "-lctor_forks".as_ref(),
    ]);
    for round in 0..4 {
        let mut cmd = std::process::Command::new(&program);
        cmd.env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("LD_PRELOAD", shim())
            .env("GPUCAP_LIMIT", "256Mi")
            .env("CTOR_FORKS", "60");
        for i in 0..100_000 {
            cmd.env(format!("G{i}"), "x");
        }
        let o = run(&mut cmd);
        assert_eq!(
            stdout(&o).trim(),
            "uncapped 0 of 60",
            "round {round}\n{}",
            dump(&o)
        );
    }
}

/// The variadic calls (`execl`, `execlp`, `execle`) after the environment was cleared,
/// or with one of `execle`'s own, hand the cap down as the rest of the family does, and
/// pass their arguments on whole: past the six argument registers, past the 64 the
/// shim's vector holds on its stack (before, each child ran with `GPUCAP_LIMIT` unset:
/// the trampolines wrote the report and called the C library's function).
#[test]
fn the_variadic_execs_hand_down_the_cap_and_every_argument() {
    let argv = [exec_edges().display().to_string(), "lists".into()];
    let o = parent(&shim(), &[("GPUCAP_LIMIT", "256Mi")], &argv, "tree-lists");
    assert_eq!(
        stdout(&o),
        "4:a:d:256Mi\n70:a0:g9:256Mi\n1:x:x:256Mi execle\n2\n",
        "execl, execlp with 70 arguments, execle, an execl that fails (ENOENT)\n{}",
        dump(&o)
    );
    // Their vector is the caller's arguments where they lie: a `vfork` child's `execl`
    // of 70 leaves nothing in its parent (a build that copied past 64 into pages of its
    // own left 4 KiB there per child, a review found).
    let argv = [
        exec_edges().display().to_string(),
        "vfork-list".into(),
        "500".into(),
    ];
    assert_grew_less(&argv, "tree-lists", 256 << 10, "500 children");
}

/// Runs `argv` (which prints `grew BYTES`, what its children grew it by) capped, and
/// asserts it grew by less than `most`.
fn assert_grew_less(argv: &[String], tag: &str, most: i64, children: &str) {
    let o = parent(&shim(), &[("GPUCAP_LIMIT", "256Mi")], argv, tag);
    let grew: i64 = stdout(&o)
        .trim()
        .strip_prefix("grew ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{}", dump(&o)));
    assert!(
        grew < most,
        "{children} grew the parent by {grew} bytes\n{}",
        dump(&o)
    );
}

/// A child forked while another thread of its parent walks the loader's list of objects
/// does not hang in its `exec`: the functions the hooks call are found before the `fork`
/// (before, each of 10 such children hung until its alarm: the list's lock, held by the
/// walking thread at the fork, is copied held). So also for a program linked without a
/// `DT_DEBUG` entry (the tag rewritten in a copy: the shim asked the loader there, and
/// 9 to 17 of 20 children hung), for one started by naming the loader, and for one
/// both (where `AT_BASE` is 0 too: 6 of 10 hung before the list was found at load), and
/// for such a program built with AddressSanitizer, whose runtime, preloaded first,
/// defines `__tls_get_addr` too (the loader taken for the object defining that: 5 to 9 of
/// 10 hung, a review found; now the object defining `_dl_debug_state` and `_r_debug`).
#[test]
fn a_child_forked_beside_a_busy_thread_execs() {
    let edges = exec_edges();
    let bare = without_dt_debug(&edges, &scratch("tree-fork-bare"));
    let asan = compile_c("exec_edges", "-asan", &["-fsanitize=address"]);
    let asan_bare = without_dt_debug(&asan, &scratch("tree-fork-asan"));
    let runtime = String::from_utf8(
        Command::new("cc")
            .arg("-print-file-name=libasan.so")
            .output()
            .expect("cc")
            .stdout,
    )
    .unwrap();
    let loader = "/lib64/ld-linux-x86-64.so.2".to_string();
    let show = |p: &Path| p.display().to_string();
    let lib = shim();
    let with_asan = format!("{} {}", runtime.trim(), lib.display());
    for (argv, preload) in [
        (vec![show(&edges)], show(&lib)),
        (vec![show(&bare)], show(&lib)),
        (vec![loader.clone(), show(&edges)], show(&lib)),
        (vec![loader.clone(), show(&bare)], show(&lib)),
        (vec![loader, show(&asan_bare)], with_asan),
    ] {
        let mut argv = argv;
        argv.extend(["threaded-fork".into(), "10".into()]);
        let vars = [
            ("GPUCAP_LIMIT", "256Mi"),
            ("ASAN_OPTIONS", "detect_leaks=0"),
        ];
        let o = parent(Path::new(&preload), &vars, &argv, "tree-fork");
        assert_eq!(stdout(&o).trim(), "hung 0", "{argv:?}\n{}", dump(&o));
    }
}

/// A copy of the program `exe` in `dir` whose dynamic section has no `DT_DEBUG` entry
/// (rewritten as `DT_CHECKSUM`, which the loader ignores): as a program linked without
/// one (the loader then fills no pointer to its list in the program).
fn without_dt_debug(exe: &Path, dir: &Path) -> PathBuf {
    let mut b = std::fs::read(exe).expect("read the program");
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes(b[at..at + 2].try_into().unwrap());
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let (phoff, size, count) = (
        u64_at(&b, 0x20) as usize,
        u16_at(&b, 0x36),
        u16_at(&b, 0x38),
    );
    let mut rewritten = 0;
    for h in (0..count as usize).map(|i| phoff + i * size as usize) {
        if u32::from_le_bytes(b[h..h + 4].try_into().unwrap()) != 2 {
            continue; // not PT_DYNAMIC
        }
        let (offset, bytes) = (u64_at(&b, h + 8) as usize, u64_at(&b, h + 32) as usize);
        for e in (offset..offset + bytes).step_by(16) {
            if u64_at(&b, e) == 21 {
                b[e..e + 8].copy_from_slice(&0x6fff_fdf8_u64.to_le_bytes());
                rewritten += 1;
            }
        }
    }
    assert_eq!(rewritten, 1, "{}: one DT_DEBUG entry", exe.display());
    std::fs::create_dir_all(dir).unwrap();
    let copy = dir.join("exec_edges_without_dt_debug");
    std::fs::write(&copy, b).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    copy
}

/// No `fork` waits for the loader: a program whose own fork handler takes a lock one of
/// its threads holds while it walks the loader's list forks (a fork handler of gpucap's
/// that walked the list hung it: 10 of 10 in a review), and so does one that forks while
/// holding such a lock itself (an exported `fork` that walked the list first hung it: 10
/// of 10 in the next review); a program that opened the library, called its `cuInit`
/// (which registers gpucap's fork handlers) and closed it again forks (the portable
/// build's handlers outlived the library, and the next `fork` crashed).
#[test]
fn forks_around_gpucap_never_hang_or_crash() {
    let edges = exec_edges().display().to_string();
    for mode in ["atfork-lock", "lock-fork"] {
        let argv = [edges.clone(), mode.into()];
        let o = parent(&shim(), &[("GPUCAP_LIMIT", "256Mi")], &argv, "tree-atfork");
        assert_eq!(stdout(&o).trim(), "forked", "{mode}\n{}", dump(&o));
    }
    let portable = std::env::var_os("GPUCAP_TEST_PORTABLE").filter(|v| !v.is_empty());
    if portable.is_none() {
        skip(
            "GPUCAP_TEST_PORTABLE is not set (the portable build's folder: scripts/test.sh \
             runs scripts/build-portable.sh): only the native library is opened and closed",
        );
    }
    let portable = portable.map(|d| PathBuf::from(d).join("libgpucap.so"));
    let stats = scratch("tree-unloaded").join("stats");
    for lib in std::iter::once(shim()).chain(portable) {
        // Then: the library closed while a thread's pages are registered for its end: the
        // thread ends (before, its key's destructor was in the unloaded library: rc 139).
        for (mode, says) in [
            ("unloaded-fork", "forked"),
            ("unloaded-thread", "thread ended"),
        ] {
            let o = run(fake_cmd(&edges, &stats)
                .args([mode.as_ref(), lib.as_os_str()])
                .env("GPUCAP_LIMIT", "256Mi"));
            assert_eq!(
                stdout(&o).trim(),
                says,
                "{mode} {}\n{}",
                lib.display(),
                dump(&o)
            );
        }
    }
}

/// An `exec` from a signal handler on a small alternate stack (a crash handler's) runs
/// (before, the hooks' buffers took 14 KiB of stack and such an `exec` crashed).
#[test]
fn an_exec_from_a_signal_handler_on_a_small_stack_runs() {
    let argv = [
        exec_edges().display().to_string(),
        "altstack".into(),
        "8192".into(),
    ];
    let o = parent(
        &shim(),
        &[("GPUCAP_LIMIT", "256Mi")],
        &argv,
        "tree-altstack",
    );
    assert_eq!(o.status.code(), Some(0), "{}", dump(&o));
}

/// Children started one after another with an environment larger than the hooks' buffer
/// on the stack, by a parent that `vfork`s (Python's subprocess), from one thread and
/// then each from a thread of its own: its memory does not grow with their number
/// (before, 24 KiB more for each child, the pages each `vfork` child mapped in its
/// parent's memory; then as much for each thread, whose pages outlived it).
#[test]
fn many_children_with_a_large_environment_cost_the_parent_no_memory() {
    let code = "import subprocess, threading\n\
                env = {'V%d' % i: 'x' * 20 for i in range(3000)}\n\
                def rss():\n    return int(open('/proc/self/statm').read().split()[1]) * 4096\n\
                for _ in range(20): subprocess.run(['/bin/true'], env=env)\n\
                before = rss()\n\
                for _ in range(400): subprocess.run(['/bin/true'], env=env)\n\
                def once():\n    subprocess.run(['/bin/true'], env=env)\n\
                for _ in range(300):\n    t = threading.Thread(target=once); t.start(); t.join()\n\
                print('grew', rss() - before)";
    let argv = ["python3".to_string(), "-c".into(), code.into()];
    assert_grew_less(&argv, "tree-vfork", 2 << 20, "700 children");
}

/// A wrapper of `execve` preloaded before the library (its `dlsym(RTLD_NEXT)` reaches the
/// shim's) execs: the shim calls the C library's `execve`, the first definition after
/// itself, not the wrapper's before it (a lookup that took the first one it met recursed
/// until the wrapper's guard aborted).
#[test]
fn a_wrapper_preloaded_before_the_library_execs() {
    let dir = scratch("tree-wrap");
    let wrapper = dir.join("libwrap_exec.so");
    let status = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&wrapper)
        .arg(root().join("tests/c/libwrap_exec.c"))
        .arg("-ldl")
        .status()
        .unwrap();
    assert!(status.success(), "cc libwrap_exec.so");
    let preload = format!("{}:{}", wrapper.display(), shim().display());
    let argv = [
        "python3".to_string(),
        "-c".into(),
        "import os; os.execve('/bin/sh', ['sh', '-c', 'echo $GPUCAP_LIMIT'], {})".into(),
    ];
    let o = parent(
        &PathBuf::from(preload),
        &[("GPUCAP_LIMIT", "256Mi")],
        &argv,
        "tree-wrap",
    );
    assert_eq!(stdout(&o).trim(), "256Mi", "{}", dump(&o));
}
