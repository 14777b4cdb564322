//! A scratch directory with a pool directory in it, and the pool members the pool
//! tests start there (`tests/pool/pool_cli.rs`, `tests/cli/metrics.rs`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use super::*;

pub struct Scratch {
    pub dir: PathBuf,
    pub pools: PathBuf,
}

/// The C test program that runs a list of steps (`tests/c/script.c`).
pub fn script() -> PathBuf {
    compile_c("script", "", &["-lcuda"])
}

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let dir = scratch(tag);
        let pools = dir.join("pools");
        std::fs::create_dir_all(&pools).unwrap();
        Scratch { dir, pools }
    }

    /// The file of pool `name`.
    pub fn pool_file(&self, name: &str) -> PathBuf {
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        self.pools
            .join(format!("gpucap-{uid}"))
            .join(format!("{name}.pool"))
    }

    /// A FIFO where pool `name`'s file would be (its directory made as gpucap makes it,
    /// 0700): its path.
    pub fn fifo_pool(&self, name: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = self.pool_file(name);
        let dir = path.parent().unwrap();
        std::fs::create_dir_all(dir).unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        path
    }

    /// `gpucap ARGS` on the fake GPU with GPUCAP_POOL_DIR set to this scratch's.
    pub fn gpucap(&self, args: &[&str]) -> Command {
        let mut c = fake_cmd(cli(), &self.dir.join("stats.json"));
        c.args(args)
            .env("FAKECUDA_TOTAL_MEM", "4Gi")
            .env("GPUCAP_POOL_DIR", &self.pools);
        c
    }

    /// A member of `pool` (capped at 1 GiB) running `program` (the script, or a link to
    /// it) with `steps`, that then holds its memory until killed; returns once it has
    /// done its steps (waiting at most 60 s: a harness limit, not a timing assertion).
    pub fn member_as(&self, program: &Path, pool: &str, tag: &str, steps: &[&str]) -> Child {
        self.started(program, Some(pool), tag, steps)
    }

    /// A process capped at 1 GiB on its own (no pool) running the script with `steps`,
    /// then holding its memory until killed (see [`member_as`](Self::member_as)).
    pub fn lone(&self, tag: &str, steps: &[&str]) -> Child {
        self.started(&script(), None, tag, steps)
    }

    fn started(&self, program: &Path, pool: Option<&str>, tag: &str, steps: &[&str]) -> Child {
        let ready = self.dir.join(format!("{tag}.ready"));
        let never = self.dir.join("never");
        let mut args: Vec<String> = ["run", "--limit", "1Gi"].map(String::from).to_vec();
        if let Some(pool) = pool {
            args.extend(["--pool".to_string(), pool.to_string()]);
        }
        args.push("--".into());
        args.push(program.to_str().unwrap().into());
        args.extend(steps.iter().map(|s| s.to_string()));
        args.push(format!("touch:{}", ready.display()));
        args.push(format!("wait:{}", never.display()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut child = self
            .gpucap(&args)
            .current_dir(&self.dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_ready(&mut child, &ready, &format!("the member {tag}"));
        child
    }

    /// A member of `pool` running the script (see [`member_as`](Self::member_as)).
    pub fn member(&self, pool: &str, tag: &str, steps: &[&str]) -> Child {
        self.member_as(&script(), pool, tag, steps)
    }

    /// A copy of the library in this scratch's `home` folder with `gpucap.env` beside
    /// it holding `file`: a process preloading it is held at the file's ceiling.
    pub fn library_with_env_file(&self, home: &str, file: &str) -> PathBuf {
        let home = self.dir.join(home);
        std::fs::create_dir_all(&home).unwrap();
        let lib = home.join("libgpucap.so");
        std::fs::copy(shim(), &lib).unwrap();
        std::fs::write(home.join("gpucap.env"), file).unwrap();
        lib
    }

    /// The script with `steps` preloading `lib` directly (no `gpucap run`), with `vars`
    /// and this scratch's GPUCAP_POOL_DIR, then holding its memory until killed (see
    /// [`member_as`](Self::member_as)).
    pub fn preloaded(&self, lib: &Path, tag: &str, vars: &[(&str, &str)], steps: &[&str]) -> Child {
        let ready = self.dir.join(format!("{tag}.ready"));
        let never = self.dir.join("never");
        let mut c = fake_cmd(script(), &self.dir.join("stats.json"));
        c.env("LD_PRELOAD", lib)
            .env("FAKECUDA_TOTAL_MEM", "4Gi")
            .env("GPUCAP_POOL_DIR", &self.pools)
            .envs(vars.iter().copied())
            .args(steps)
            .arg(format!("touch:{}", ready.display()))
            .arg(format!("wait:{}", never.display()))
            .current_dir(&self.dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        wait_ready(&mut child, &ready, &format!("the process {tag}"));
        child
    }

    /// A process of `pool` that runs `steps` and exits.
    pub fn once(&self, pool: &str, steps: &[&str]) -> Output {
        let script = script();
        let mut args = vec!["run", "--limit", "1Gi", "--pool", pool, "--"];
        args.push(script.to_str().unwrap());
        args.extend(steps);
        run(&mut self.gpucap(&args))
    }

    /// A copy of pool `pool`'s file as `name` in the directory `dir` of the pool
    /// directory (a `gpucap-UID` name, made mode 0700), both owned by uid 65534 (needs
    /// root): another user's pool, or a squatter's. Returns the directory and the file.
    pub fn copy_as_nobody(&self, pool: &str, dir: &str, name: &str) -> (PathBuf, PathBuf) {
        use std::os::unix::fs::PermissionsExt;
        let dir = self.pools.join(dir);
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let file = dir.join(name);
        std::fs::copy(self.pool_file(pool), &file).unwrap();
        for p in [&dir, &file] {
            std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
        }
        (dir, file)
    }
}
