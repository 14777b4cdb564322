//! Links the unwinder statically into libgpucap.so, and binds the library's own
//! references to its hooks at link time (see `main`).
//!
//! Rust's std asks the linker for `-lgcc_s`, so a Rust cdylib pulls
//! libgcc_s.so.1 into every process it is preloaded into. Loading that second
//! library lengthens every process start, and the shim is preloaded into every
//! process of a container. This puts a directory first on the library search path in
//! which `libgcc_s.a` is gcc's static unwinder, `libgcc_eh.a` (what
//! `gcc -static-libgcc` uses), so `-lgcc_s` resolves to it. catch_unwind keeps
//! working. If the compiler does not know libgcc_eh.a, nothing changes.
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // The hook table's references to our own exported hooks bound at link time: 64
    // fewer symbol lookups when the loader maps the library (every process start of a
    // container). What interposition would have given a non-PIE program (its canonical
    // PLT entry of a hooked name) is told apart at run time: `table::never_the_driver`.
    //
    // Linked by zig (`scripts/build-portable.sh`: cargo-zigbuild, for an older glibc),
    // whose linker takes `-Bsymbolic` only (the library defines no data another object
    // interposes) and which brings its own static unwinder: nothing more to do.
    // The library stays loaded where a program opened it and closed it again (`-z
    // nodelete`): it leaves functions of its own with the C library that outlive any
    // `dlclose`: a thread key's destructor (`exec_buffer.rs`), and in the zig build the
    // fork handlers its old `pthread_atfork` registers without the library's handle.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    if linked_by_zig() {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
        return;
    }
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
    if std::env::var("CARGO_CFG_TARGET_ENV").as_deref() != Ok("gnu") {
        return;
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let Ok(out) = Command::new(&cc)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
    else {
        return;
    };
    let eh = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !eh.is_absolute() || !eh.exists() {
        println!("cargo:warning=libgcc_eh.a not found: libgpucap.so will depend on libgcc_s.so.1");
        return;
    }
    let dir = Path::new(&std::env::var("OUT_DIR").unwrap()).join("static-unwinder");
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("libgcc_s.a");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&eh, &link).unwrap();
    println!("cargo:rustc-link-search=native={}", dir.display());
}

/// Whether the linker is cargo-zigbuild's wrapper of `zig cc` (`zigcc-<target>….sh`),
/// which it names in the target's linker setting (cargo passes it on as `RUSTC_LINKER`).
fn linked_by_zig() -> bool {
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    std::env::var_os("RUSTC_LINKER").is_some_and(|l| {
        Path::new(&l)
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("zigcc"))
    })
}
