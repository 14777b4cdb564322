//! Finding libgpucap.so and adding it to LD_PRELOAD.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// The shim's file name.
pub const LIB_NAME: &str = "libgpucap.so";

/// Where libgpucap.so is: `GPUCAP_LIB` if given (it must be an existing file), else the
/// directory of the gpucap executable `exe`, else where `pip install gpucap` put it (see
/// [`wheel_candidates`]). The result is absolute (a relative path in LD_PRELOAD without a
/// slash would be searched for in the library path instead). The error names where it looked.
pub fn locate_library(gpucap_lib: Option<&OsStr>, exe: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(lib) = gpucap_lib {
        let path = Path::new(lib);
        if lib.is_empty() {
            return Err("GPUCAP_LIB is set but empty".to_string());
        }
        if !path.is_file() {
            let what = if path.exists() {
                "is not a file"
            } else {
                "does not exist"
            };
            return Err(format!("GPUCAP_LIB={} {what}", path.display()));
        }
        crate::library_file::check(path, "GPUCAP_LIB=")?;
        return path
            .canonicalize()
            .map_err(|e| format!("GPUCAP_LIB={}: {e}", path.display()));
    }
    let Some(exe) = exe else {
        return Err(format!(
            "cannot find {LIB_NAME}: the gpucap executable's location is unknown; \
             set GPUCAP_LIB to the library's path"
        ));
    };
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let candidate = dir.join(LIB_NAME);
    if candidate.is_file() {
        crate::library_file::check(&candidate, "")?;
        return Ok(candidate.canonicalize().unwrap_or(candidate));
    }
    if let Some(found) = wheel_candidates(dir).into_iter().next() {
        crate::library_file::check(&found, "")?;
        return Ok(found.canonicalize().unwrap_or(found));
    }
    Err(format!(
        "cannot find {LIB_NAME}: looked for {} (beside the gpucap executable) and in the \
         gpucap Python package of {} (where pip installs it); set GPUCAP_LIB to the \
         library's path",
        candidate.display(),
        dir.parent().unwrap_or(Path::new("/")).display()
    ))
}

/// The copies of libgpucap.so that `pip install gpucap` put beside the `gpucap` it
/// installed in `bin_dir`, best first. pip puts the command in the environment's bin/
/// and the package in its site-packages: `../lib/pythonX.Y/site-packages/gpucap/`
/// (a venv, `--user`, conda; `dist-packages` for Debian's system pip, `lib64` on some
/// distributions), or `../gpucap/` for `pip install --target`. Where several Python
/// versions hold one, those whose `gpucap-VERSION.dist-info` is this executable's
/// version come first, then the newest Python.
pub fn wheel_candidates(bin_dir: &Path) -> Vec<PathBuf> {
    let Some(prefix) = bin_dir.parent() else {
        return Vec::new();
    };
    let mut found: Vec<(bool, Vec<u32>, PathBuf)> = Vec::new();
    let mut consider = |packages: &Path, python: Vec<u32>| {
        let lib = packages.join("gpucap").join(LIB_NAME);
        if lib.is_file() {
            let dist_info = format!("gpucap-{}.dist-info", env!("CARGO_PKG_VERSION"));
            let ours = packages.join(dist_info).is_dir();
            found.push((ours, python, lib));
        }
    };
    for lib_dir in ["lib", "lib64"] {
        let Ok(entries) = std::fs::read_dir(prefix.join(lib_dir)) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(version) = name.to_str().and_then(|n| n.strip_prefix("python")) else {
                continue;
            };
            let python: Vec<u32> = version.split('.').filter_map(|p| p.parse().ok()).collect();
            for packages in ["site-packages", "dist-packages"] {
                consider(&entry.path().join(packages), python.clone());
            }
        }
    }
    consider(prefix, Vec::new());
    // Ours first, then the newest Python; the order of read_dir is not.
    found.sort_by(|a, b| (b.0, &b.1).cmp(&(a.0, &a.1)).then(a.2.cmp(&b.2)));
    found.into_iter().map(|(_, _, lib)| lib).collect()
}

/// Can `path` be written in LD_PRELOAD? The loader splits the list on spaces and colons
/// and has no escape for them.
pub fn check_preloadable(path: &Path) -> Result<(), String> {
    if !gpucap_core::config::preloadable(path.as_os_str().as_bytes()) {
        Err(format!(
            "the path of {LIB_NAME} ({}) contains a space or a colon, which LD_PRELOAD cannot \
             express; move it, or set GPUCAP_LIB to a path without them",
            path.display()
        ))
    } else {
        Ok(())
    }
}

/// The entries of an LD_PRELOAD value (separated by spaces or colons), empties dropped.
pub fn preload_entries(value: &OsStr) -> impl Iterator<Item = &OsStr> {
    gpucap_core::config::preload_entries(value.as_bytes()).map(OsStr::from_bytes)
}

/// LD_PRELOAD with `lib` appended: the user's preloads are kept as written and come
/// first. If an entry already is `lib` (as `is_lib` judges), the value is returned
/// unchanged, so the shim is never loaded twice.
pub fn merge_ld_preload_with(
    existing: Option<&OsStr>,
    lib: &Path,
    is_lib: impl Fn(&OsStr) -> bool,
) -> OsString {
    let Some(existing) = existing else {
        return lib.as_os_str().to_owned();
    };
    if preload_entries(existing).any(is_lib) {
        return existing.to_owned();
    }
    let bytes = existing.as_bytes();
    if preload_entries(existing).next().is_none() {
        return lib.as_os_str().to_owned();
    }
    let mut out = bytes.to_vec();
    if !matches!(out.last(), Some(b' ' | b':')) {
        out.push(b':');
    }
    out.extend_from_slice(lib.as_os_str().as_bytes());
    OsString::from_vec(out)
}

/// [`merge_ld_preload_with`], where an entry is `lib` if it is the same path or, both
/// existing, the same file (through symlinks, `..`, and so on).
pub fn merge_ld_preload(existing: Option<&OsStr>, lib: &Path) -> OsString {
    let lib_canon = lib.canonicalize().ok();
    merge_ld_preload_with(existing, lib, |entry| {
        let entry = Path::new(entry);
        entry == lib || (lib_canon.is_some() && entry.canonicalize().ok() == lib_canon)
    })
}

/// Does an LD_PRELOAD value already load some libgpucap.so (by file name)?
pub fn preloads_gpucap(value: Option<&OsStr>) -> bool {
    value.is_some_and(|v| {
        preload_entries(v).any(|e| Path::new(e).file_name() == Some(OsStr::new(LIB_NAME)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn merge(existing: Option<&str>, lib: &str) -> String {
        merge_ld_preload(existing.map(OsStr::new), Path::new(lib))
            .into_string()
            .unwrap()
    }

    const LIB: &str = "/opt/gpucap/libgpucap.so";

    #[test]
    fn merging() {
        assert_eq!(merge(None, LIB), LIB);
        assert_eq!(merge(Some(""), LIB), LIB);
        assert_eq!(merge(Some("  "), LIB), LIB);
        assert_eq!(merge(Some("/a.so"), LIB), format!("/a.so:{LIB}"));
        assert_eq!(
            merge(Some("/a.so /b.so"), LIB),
            format!("/a.so /b.so:{LIB}")
        );
        assert_eq!(
            merge(Some("/a.so:/b.so"), LIB),
            format!("/a.so:/b.so:{LIB}")
        );
        assert_eq!(merge(Some("/a.so:"), LIB), format!("/a.so:{LIB}"));
        assert_eq!(merge(Some("/a.so "), LIB), format!("/a.so {LIB}"));
        // Already there: unchanged, wherever it is.
        assert_eq!(merge(Some(LIB), LIB), LIB);
        assert_eq!(
            merge(Some(&format!("{LIB}:/a.so")), LIB),
            format!("{LIB}:/a.so")
        );
        assert_eq!(
            merge(Some(&format!("/a.so {LIB} /b.so")), LIB),
            format!("/a.so {LIB} /b.so")
        );
        // A different libgpucap.so path that is not the same file is a different entry.
        assert_eq!(
            merge(Some("/elsewhere/libgpucap.so"), LIB),
            format!("/elsewhere/libgpucap.so:{LIB}")
        );
    }

    #[test]
    fn merging_keeps_non_utf8_preloads() {
        let existing = OsString::from_vec(b"/x\xff.so".to_vec());
        let merged = merge_ld_preload(Some(&existing), Path::new(LIB));
        let mut expected = b"/x\xff.so:".to_vec();
        expected.extend_from_slice(LIB.as_bytes());
        assert_eq!(merged.as_bytes(), expected.as_slice());
    }

    #[test]
    fn same_file_through_a_symlink() {
        let dir = std::env::temp_dir().join(format!("gpucap-preload-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("real")).unwrap();
        let lib = dir.join("real").join(LIB_NAME);
        fs::write(&lib, b"").unwrap();
        std::os::unix::fs::symlink(dir.join("real"), dir.join("link")).unwrap();
        let via_link = dir.join("link").join(LIB_NAME);
        let existing = OsString::from(format!("/a.so:{}", via_link.display()));
        assert_eq!(merge_ld_preload(Some(&existing), &lib), existing);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn entries_and_detection() {
        let v = OsStr::new(" /a.so::/b.so  c.so ");
        let e: Vec<&OsStr> = preload_entries(v).collect();
        assert_eq!(e, ["/a.so", "/b.so", "c.so"]);
        assert!(preloads_gpucap(Some(OsStr::new("/x/libgpucap.so /a.so"))));
        assert!(preloads_gpucap(Some(OsStr::new("libgpucap.so"))));
        assert!(!preloads_gpucap(Some(OsStr::new("/x/libgpucap.so.1"))));
        assert!(!preloads_gpucap(None));
    }

    #[test]
    fn preloadable_paths() {
        assert!(check_preloadable(Path::new(LIB)).is_ok());
        assert!(check_preloadable(Path::new("/my dir/libgpucap.so")).is_err());
        assert!(check_preloadable(Path::new("/a:b/libgpucap.so")).is_err());
    }

    #[test]
    fn locating() {
        let dir = std::env::temp_dir().join(format!("gpucap-locate-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("gpucap");
        // Missing beside the executable: the error says where it looked.
        let e = locate_library(None, Some(&exe)).unwrap_err();
        assert!(e.contains(&dir.join(LIB_NAME).display().to_string()), "{e}");
        assert!(e.contains("GPUCAP_LIB"));
        // Present beside the executable.
        fs::write(dir.join(LIB_NAME), crate::library_file::fake_library()).unwrap();
        let found = locate_library(None, Some(&exe)).unwrap();
        assert_eq!(found, dir.join(LIB_NAME).canonicalize().unwrap());
        // GPUCAP_LIB wins, and must exist and be a file.
        let other = dir.join("other.so");
        let e = locate_library(Some(other.as_os_str()), Some(&exe)).unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
        let e = locate_library(Some(dir.as_os_str()), Some(&exe)).unwrap_err();
        assert!(e.contains("is not a file"), "{e}");
        fs::write(&other, b"").unwrap();
        let e = locate_library(Some(other.as_os_str()), Some(&exe)).unwrap_err();
        assert!(e.contains("is not libgpucap.so: not an ELF file"), "{e}");
        fs::write(&other, crate::library_file::fake_library()).unwrap();
        assert_eq!(
            locate_library(Some(other.as_os_str()), Some(&exe)).unwrap(),
            other.canonicalize().unwrap()
        );
        assert!(locate_library(Some(OsStr::new("")), Some(&exe)).is_err());
        assert!(
            locate_library(None, None)
                .unwrap_err()
                .contains("GPUCAP_LIB")
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn locating_a_wheel_install() {
        let root = std::env::temp_dir().join(format!("gpucap-wheel-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let bin = root.join("venv").join("bin");
        fs::create_dir_all(&bin).unwrap();
        let exe = bin.join("gpucap");
        let e = locate_library(None, Some(&exe)).unwrap_err();
        assert!(e.contains("Python package"), "{e}");
        // pip in a venv: bin/gpucap and lib/python3.X/site-packages/gpucap/libgpucap.so.
        let package = |python: &str, packages: &str| {
            let dir = root.join("venv").join("lib").join(python).join(packages);
            fs::create_dir_all(dir.join("gpucap")).unwrap();
            fs::write(
                dir.join("gpucap").join(LIB_NAME),
                crate::library_file::fake_library(),
            )
            .unwrap();
            dir
        };
        let p311 = package("python3.11", "site-packages");
        let lib311 = p311.join("gpucap").join(LIB_NAME).canonicalize().unwrap();
        assert_eq!(locate_library(None, Some(&exe)).unwrap(), lib311);
        // A newer Python's copy wins, unless only the older one is this version's.
        let p312 = package("python3.12", "dist-packages");
        let lib312 = p312.join("gpucap").join(LIB_NAME).canonicalize().unwrap();
        assert_eq!(locate_library(None, Some(&exe)).unwrap(), lib312);
        let dist_info = format!("gpucap-{}.dist-info", env!("CARGO_PKG_VERSION"));
        fs::create_dir_all(p311.join(dist_info)).unwrap();
        assert_eq!(locate_library(None, Some(&exe)).unwrap(), lib311);
        // Beside the executable still comes first.
        fs::write(bin.join(LIB_NAME), crate::library_file::fake_library()).unwrap();
        assert_eq!(
            locate_library(None, Some(&exe)).unwrap(),
            bin.join(LIB_NAME).canonicalize().unwrap()
        );
        // pip install --target DIR: DIR/bin/gpucap and DIR/gpucap/libgpucap.so.
        let target = root.join("target");
        fs::create_dir_all(target.join("bin")).unwrap();
        fs::create_dir_all(target.join("gpucap")).unwrap();
        fs::write(
            target.join("gpucap").join(LIB_NAME),
            crate::library_file::fake_library(),
        )
        .unwrap();
        assert_eq!(
            locate_library(None, Some(&target.join("bin").join("gpucap"))).unwrap(),
            target.join("gpucap").join(LIB_NAME).canonicalize().unwrap()
        );
        fs::remove_dir_all(&root).unwrap();
    }
}
