//! `gpucap pool resize NAME SIZE [--gpu N|UUID] [--dir DIR]`: changes the cap of a pool
//! while its members run (`Pool::resize`). NAME is a pool's name, its file's absolute
//! path; `--claim DIR` names a claim's pool instead (as `GPUCAP_CLAIM_DIR`); `--dir` is
//! the pool directory (as `GPUCAP_POOL_DIR`).
//! Without `--gpu`, every GPU of the pool gets the new cap.

use std::path::{Path, PathBuf};

use gpucap_core::budget::{GpuView, PoolView};
use gpucap_core::config::PoolSpec;
use gpucap_core::size::format_bytes;

use crate::exit::EXIT_USAGE;
use crate::pool::{EXIT_NO_POOL_FILE, Located, NO_SUCH_FILE, locate};

/// A parsed `pool resize`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub pool: PoolSpec,
    /// The pool as typed (for the lines printed).
    pub name: String,
    pub size: u64,
    /// `--gpu`: the GPU's number in `gpucap status --pool` or its UUID (None: every GPU).
    pub gpu: Option<String>,
    /// `--dir`: the pool directory.
    pub dir: Option<PathBuf>,
}

/// Parses the words after `pool resize`.
pub fn parse(words: &[String]) -> Result<Request, String> {
    let read = crate::pool_operands::read(words, "pool resize", &[], |_, _| Ok(false))?;
    let (name, size, pool) = crate::pool_operands::pool_and_value(
        &read.plain,
        read.claim,
        "pool resize takes a pool and a size (gpucap pool resize NAME SIZE, or \
         gpucap pool resize --claim DIR SIZE)",
    )?;
    let size = match gpucap_core::config::parse_cap_size(size) {
        Ok(0) => return Err("the size of pool resize must be more than 0".to_string()),
        Ok(s) => s,
        Err(e) => return Err(format!("invalid size {size:?} of pool resize: {e}")),
    };
    Ok(Request {
        pool,
        name,
        size,
        gpu: read.gpu,
        dir: read.dir,
    })
}

/// The GPUs of the pool `gpu` picks: by number (from 0, as `gpucap status --pool`
/// lists them) or by UUID; every one without it.
pub fn pick<'v>(gpus: &'v [GpuView], gpu: Option<&str>) -> Result<Vec<&'v GpuView>, String> {
    let Some(want) = gpu else {
        return Ok(gpus.iter().collect());
    };
    let found = match want.parse::<usize>() {
        Ok(n) => gpus.get(n),
        Err(_) => gpus.iter().find(|g| {
            let (a, b) = (g.uuid.to_ascii_lowercase(), want.to_ascii_lowercase());
            a == b || a.strip_prefix("gpu-") == Some(b.as_str())
        }),
    };
    found.map(|g| vec![g]).ok_or_else(|| {
        let have: Vec<String> = gpus
            .iter()
            .enumerate()
            .map(|(i, g)| format!("{i} ({})", g.uuid))
            .collect();
        format!(
            "--gpu {want}: the pool has no such GPU; it has {}",
            if have.is_empty() {
                "none yet".to_string()
            } else {
                have.join(", ")
            }
        )
    })
}

/// Opens pool `pool` (typed as `name`) in `dir` to change it, and reads it (`pool
/// resize`, `pool set`): Err(exit status), its line said: 1 where no process joined it
/// yet, 2 where it cannot be used.
pub fn open_pool(
    pool: &PoolSpec,
    name: &str,
    dir: Option<&Path>,
    dir_typed: bool,
) -> Result<(gpucap_pool_file::PoolFile, PoolView), i32> {
    let said = |e: String, code: i32| {
        eprintln!("gpucap: {e}");
        code
    };
    // A directory given by `--dir` is named so, not as the variable it stands for.
    let path = match locate(pool, dir).map_err(|e| match dir_typed {
        true => e.replacen("GPUCAP_POOL_DIR=", "--dir ", 1),
        false => e,
    }) {
        Ok(Located::File(p) | Located::NotYet(p)) => p,
        Err(e) => return Err(said(e, EXIT_USAGE)),
    };
    // A file removed while its members run is opened through them (an announcement, a
    // claim's socket): only where that fails too, no process has joined the pool.
    let file = match gpucap_pool_file::open_writer(&path, gpucap_pool_file::Sharing::of(pool)) {
        Ok(f) => f,
        Err(e) if std::fs::symlink_metadata(&path).is_ok() || !e.ends_with(NO_SUCH_FILE) => {
            return Err(said(e, EXIT_USAGE));
        }
        Err(_) => {
            return Err(said(
                format!(
                    "no pool file at {} (no process has joined {name} yet){}",
                    path.display(),
                    // A claim's directory holds its one pool: no other name to suggest.
                    match pool {
                        PoolSpec::Claim(_) => String::new(),
                        _ => crate::pool_names::suggestion(&path),
                    }
                ),
                EXIT_NO_POOL_FILE,
            ));
        }
    };
    let view = file.view().map_err(|e| said(e, EXIT_USAGE))?;
    Ok((file, view))
}

/// Runs a `pool resize` (`pool_dir`: the environment's pool directory, if `--dir` was
/// not given). Exit status: 0 resized, 1 refused or no such pool, 2 unusable.
pub fn run(r: &Request, pool_dir: Option<&Path>) -> i32 {
    let (file, view) = match open_pool(
        &r.pool,
        &r.name,
        r.dir.as_deref().or(pool_dir),
        r.dir.is_some(),
    ) {
        Ok(opened) => opened,
        Err(code) => return code,
    };
    let gpus = match pick(&view.gpus, r.gpu.as_deref()) {
        Ok(g) if !g.is_empty() => g,
        Ok(_) => {
            eprintln!(
                "gpucap: pool {}: no member has used a GPU yet: nothing to resize",
                r.name
            );
            return 1;
        }
        Err(e) => {
            eprintln!("gpucap: {e}");
            return 1;
        }
    };
    // With no member alive, the pool's next first member sets the cap from its own
    // GPUCAP_LIMIT: a resize then would print a new cap that no process is held to.
    if !view.members.iter().any(|m| m.alive) {
        eprintln!(
            "gpucap: pool {}: not resized: no member of the pool is alive, and the next \
             process to join sets the cap from its own GPUCAP_LIMIT (set that instead; a \
             resize holds while members live)",
            r.name
        );
        return 1;
    }
    let pool = match file.mapped() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("gpucap: {e}");
            return 1;
        }
    };
    // The GPUs' memory, read only to say that a cap above it never binds (as `check`
    // says of a `--limit` above it): a typo of a unit (`100Ti`) uncaps a pool. Not where
    // the library is loaded into this process (a capped container's `gpucap`): the
    // driver's figures are then the cap's.
    let devices = match crate::driver::probe() {
        crate::driver::Probe::Devices(d) if !shim_in_process() => d,
        _ => Vec::new(),
    };
    let mut code = 0;
    for g in gpus {
        match pool.resize(&g.raw_uuid, Some(r.size), &file.locks) {
            Ok(done) => {
                println!("{}", resized_line(&r.name, &g.uuid, &done));
                if let Some(d) = devices
                    .iter()
                    .find(|d| d.uuid == Some(g.raw_uuid) && r.size > d.total)
                {
                    let note = gpucap_core::config::CapNote::AboveTotal {
                        cap: r.size,
                        total: d.total,
                    };
                    eprintln!("gpucap: pool {}: {}", r.name, note.text(d.ordinal as usize));
                }
            }
            Err(e) => {
                eprintln!("gpucap: pool {} {}: not resized: {e}", r.name, g.uuid);
                code = 1;
            }
        }
    }
    code
}

/// Whether a copy of libgpucap.so is loaded into this process (`LD_PRELOAD`,
/// `/etc/ld.so.preload`, under any file name): it exports `gpucap_shim_version`.
fn shim_in_process() -> bool {
    // SAFETY: dlsym with the default handle and a NUL-terminated name.
    !unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"gpucap_shim_version".as_ptr()) }.is_null()
}

/// What a resize done prints.
pub fn resized_line(name: &str, uuid: &str, r: &gpucap_core::budget::Resized) -> String {
    let cap = |c: Option<u64>| c.map_or("no cap".to_string(), format_bytes);
    let mut line = format!(
        "pool {name} {uuid}: cap {} -> {}, {} in use",
        cap(r.old),
        cap(r.new),
        format_bytes(r.used)
    );
    if r.new.is_some_and(|c| r.used > c) {
        line.push_str(
            "; above the new cap: new allocations are refused (or wait) until use falls \
             under it, nothing is taken back",
        );
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(words: &[&str]) -> Result<Request, String> {
        parse(&words.iter().map(|w| w.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn a_resize_names_a_pool_and_a_size() {
        let r = p(&["train", "8Gi", "--gpu", "1", "--dir=/tmp/pools"]).unwrap();
        assert_eq!(r.size, 8 << 30);
        assert_eq!(r.gpu.as_deref(), Some("1"));
        assert_eq!(r.dir, Some(PathBuf::from("/tmp/pools")));
        assert_eq!(r.pool, PoolSpec::Name("train".into()));
        let r = p(&["--claim", "/claims/5f0c", "2Gi"]).unwrap();
        assert_eq!(r.pool, PoolSpec::Claim("/claims/5f0c".into()));
        for (words, says) in [
            (&["train"][..], "a pool and a size"),
            (&["train", "0"], "more than 0"),
            (&["train", "8X"], "invalid size \"8X\""),
            (&["train", "1Gi", "--gpu"], "--gpu N|UUID needs a value"),
            (
                &["train", "1Gi", "--force"],
                "unknown option '--force' of pool resize (the options are --gpu, --dir and --claim)",
            ),
            (
                &["train", "1Gi", "--dri", "/p"],
                "'--dri' of pool resize (did you mean --dir?)",
            ),
            (&["a b", "1Gi"], "invalid pool"),
            (&["--claim", "rel", "1Gi"], "--claim rel: the absolute path"),
            (&["train", "--claim", "/c", "1Gi"], "a pool and a size"),
        ] {
            let e = p(words).unwrap_err();
            assert!(e.contains(says), "{words:?}: {e}");
        }
    }
}
