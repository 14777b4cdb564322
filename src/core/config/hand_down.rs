//! What a capped program's child inherits of its cap. A child started with an
//! environment of its parent's making (`env -i`, `subprocess.run(env={...})`, a launcher
//! that passes `LD_PRELOAD` and nothing else, `LD_PRELOAD` replaced by an allocator's
//! library) would run without the library or without the variables that cap it. The
//! shim's `exec` and `posix_spawn` hooks therefore start it with the environment planned
//! here: every entry the caller gave, each configuration variable of the parent's that
//! the caller's environment does not set, and `LD_PRELOAD` naming the library. What the
//! child's environment sets itself holds (under any ceiling a file or a driver's
//! hand-over keeps, which the child reads as the parent did).
//!
//! Planned without allocating (the shim runs it between `fork` and `exec`): the plan is
//! a sequence of [`Part`]s handed to a callback.

use super::env::looked_at;
use super::hami::HAMI_LIMIT;
use super::ordinals::{ORDINALS_VAR, bound_digest, keyed_by_ordinal, keys_digest};

/// The variable that names the libraries the loader preloads.
pub const LD_PRELOAD: &[u8] = b"LD_PRELOAD";

/// Whether a parent's variable of this name is handed down to a child whose environment
/// does not set it: every variable the configuration reads, except the one that picks
/// the GPUs CUDA shows (`CUDA_VISIBLE_DEVICES`: which GPUs a child uses is its own
/// launcher's choice, as it is without gpucap).
pub fn handed_down(name: &[u8]) -> bool {
    looked_at(name) && name != b"CUDA_VISIBLE_DEVICES"
}

/// Whether a variable of this name gives the cap itself, as the environment's own figure:
/// `GPUCAP_LIMIT`, or HAMi-core's `CUDA_DEVICE_MEMORY_LIMIT` and `_<n>` (which must agree
/// with it). A child whose environment sets one of them inherits none of the others: its
/// own figure is its cap (a driver's hand-over, a ceiling, is inherited still).
fn cap_figure(name: &[u8]) -> bool {
    name == b"GPUCAP_LIMIT"
        || name
            .strip_prefix(HAMI_LIMIT.as_bytes())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(b"_"))
}

/// An environment entry `NAME=value` as its name and value (the whole entry and an
/// empty value where it has no `=`).
fn split_entry(entry: &[u8]) -> (&[u8], &[u8]) {
    match entry.iter().position(|&b| b == b'=') {
        Some(eq) => (&entry[..eq], &entry[eq + 1..]),
        None => (entry, &[]),
    }
}

/// The name of an environment entry `NAME=value` (the whole entry where it has no `=`).
pub fn name_of(entry: &[u8]) -> &[u8] {
    split_entry(entry).0
}

/// The value of an environment entry `NAME=value` (empty where it has no `=`).
fn value_of(entry: &[u8]) -> &[u8] {
    split_entry(entry).1
}

/// Whether the loader splits an `LD_PRELOAD` value at this byte (spaces and colons; it
/// has no escape for them).
fn separates(b: &u8) -> bool {
    matches!(b, b' ' | b':' | b'\t' | b'\n')
}

/// The entries of an `LD_PRELOAD` value, empties dropped (the shim's and `gpucap run`'s).
pub fn preload_entries(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value.split(separates).filter(|e| !e.is_empty())
}

/// Whether `lib` can be named in `LD_PRELOAD` at all (no separator in it).
pub fn preloadable(lib: &[u8]) -> bool {
    !lib.is_empty() && !lib.iter().any(separates)
}

/// One entry of a child's planned environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part<'a> {
    /// An entry of the caller's environment, as it was.
    Kept(&'a [u8]),
    /// A variable of the parent's the caller's environment does not set (`NAME=value`).
    Inherited(&'a [u8]),
    /// `LD_PRELOAD` naming the library: `LD_PRELOAD=<lib>` where `existing` is None,
    /// else `LD_PRELOAD=<existing>:<lib>` (the caller's preloads first, as `gpucap run`
    /// adds the library).
    Preload { existing: Option<&'a [u8]> },
}

impl Part<'_> {
    /// The bytes of this entry, without its terminating NUL, for the library `lib`.
    pub fn bytes(&self, lib: &[u8]) -> usize {
        match self {
            Part::Kept(e) | Part::Inherited(e) => e.len(),
            Part::Preload { existing: None } => LD_PRELOAD.len() + 1 + lib.len(),
            Part::Preload { existing: Some(v) } => LD_PRELOAD.len() + 1 + v.len() + 1 + lib.len(),
        }
    }
}

/// Plans the environment of a child: `caller`, the environment the caller gives it;
/// `parent`, the parent's configuration variables (`NAME=value`, [`handed_down`]
/// names); `lib`, the library's whole path; `names_lib`, whether an `LD_PRELOAD` entry
/// other than `lib` names the library too (the name the loader was given, the same file
/// by another path). Calls `out` with each entry in order: the caller's entries (only
/// the last of several `LD_PRELOAD`s, the one the loader reads, kept; it gains `lib`
/// where none of its entries names the library), then
/// each parent variable the caller does not set (the first of a name; none of the cap's
/// own figures where the caller sets one: [`cap_figure`]), then `LD_PRELOAD` where the
/// caller sets none. A `lib` that `LD_PRELOAD` cannot name
/// (a space or a colon in it) is not added: the variables still are.
///
/// The parent's `GPUCAP_ORDINALS` (the shim gives every parent one: its own, else its
/// `CUDA_VISIBLE_DEVICES` or `all`) goes only with ordinal keys of the parent's: it is
/// handed down where the child's per-GPU figures with ordinal keys are all the parent's
/// (inherited, or the caller's copies of them), so that a child whose launcher picks its
/// GPUs keeps each key on the GPU the parent meant; never where the caller gives keys of
/// its own, which count the child's GPUs. A `GPUCAP_ORDINALS` the caller sets holds, as
/// any variable it sets, unless it is bound to other keys than the child gets (a copy of
/// one this process was handed for keys it has set again since): that one is dropped.
pub fn plan<'a, C, P>(
    caller: C,
    parent: P,
    lib: &'a [u8],
    names_lib: impl Fn(&[u8]) -> bool,
    mut out: impl FnMut(Part<'a>),
) where
    C: Iterator<Item = &'a [u8]> + Clone,
    P: Iterator<Item = &'a [u8]> + Clone,
{
    let is_preload = |e: &[u8]| name_of(e) == LD_PRELOAD;
    let preloads = caller.clone().filter(|e| is_preload(e)).count();
    // What the caller's environment sets: entries with a `=` (`getenv` passes over the
    // others).
    let sets_any = |name: &[u8]| {
        caller
            .clone()
            .any(|e| e.contains(&b'=') && name_of(e) == name)
    };
    let own_cap = caller
        .clone()
        .any(|e| e.contains(&b'=') && cap_figure(name_of(e)));
    let add_lib = preloadable(lib);
    let first_of_name =
        |i: usize, p: &[u8]| !parent.clone().take(i).any(|q| name_of(q) == name_of(p));
    let is_frame = |e: &[u8]| name_of(e) == ORDINALS_VAR.as_bytes();
    // Whether the parent's entry `i` reaches the child as it is (inherited), leaving
    // the frames aside (below).
    let inherited_var = |i: usize, p: &[u8]| {
        let name = name_of(p);
        let callers_figure = own_cap && cap_figure(name);
        handed_down(name)
            && !is_frame(p)
            && !sets_any(name)
            && !callers_figure
            && first_of_name(i, p)
    };
    // The digest of the ordinal keys the child gets: the caller's, then the parent's
    // it inherits.
    let child_keys = keys_digest(
        caller.clone().filter(|e| !is_preload(e)).chain(
            parent
                .clone()
                .enumerate()
                .filter(|&(i, p)| inherited_var(i, p))
                .map(|(_, p)| p),
        ),
    );
    // A frame the caller's environment gives bound to other keys than the child gets
    // (a copy of one this process was handed for keys it has set again since) is
    // dropped: it is no frame of those keys.
    let stale =
        |e: &[u8]| is_frame(e) && bound_digest(value_of(e)).is_some_and(|d| d != child_keys);
    let sets = |name: &[u8]| {
        caller
            .clone()
            .any(|e| e.contains(&b'=') && name_of(e) == name && !stale(e))
    };
    let inherited = |i: usize, p: &[u8]| {
        if is_frame(p) {
            handed_down(name_of(p)) && !sets(name_of(p)) && first_of_name(i, p)
        } else {
            inherited_var(i, p)
        }
    };
    let parents = |e: &[u8]| parent.clone().any(|p| p == e);
    // Ordinal keys of the caller's own, and of the parent's that reach the child.
    let own_keys = caller.clone().any(|e| keyed_by_ordinal(e) && !parents(e));
    let parents_keys = parent
        .clone()
        .enumerate()
        .any(|(i, p)| keyed_by_ordinal(p) && (inherited(i, p) || caller.clone().any(|e| e == p)));
    let frame = parents_keys && !own_keys;
    let mut seen = 0;
    for e in caller.clone() {
        if stale(e) {
            continue;
        }
        if !is_preload(e) {
            out(Part::Kept(e));
            continue;
        }
        seen += 1;
        if seen < preloads {
            continue; // the loader reads the last one only
        }
        let value = value_of(e);
        if !add_lib || preload_entries(value).any(|p| p == lib || names_lib(p)) {
            out(Part::Kept(e));
        } else if preload_entries(value).next().is_none() {
            out(Part::Preload { existing: None });
        } else {
            out(Part::Preload {
                existing: Some(value),
            });
        }
    }
    for (i, p) in parent.clone().enumerate() {
        if inherited(i, p) && (frame || !is_frame(p)) {
            out(Part::Inherited(p));
        }
    }
    if preloads == 0 && add_lib {
        out(Part::Preload { existing: None });
    }
}

/// Writes `part` for the library `lib` into `buf` (at least [`Part::bytes`] + 1 bytes),
/// NUL-terminated; returns the bytes written, the NUL included.
pub fn write(part: Part<'_>, lib: &[u8], buf: &mut [u8]) -> usize {
    let mut at = 0;
    let mut put = |bytes: &[u8]| {
        buf[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
    };
    match part {
        Part::Kept(e) | Part::Inherited(e) => put(e),
        Part::Preload { existing } => {
            put(LD_PRELOAD);
            put(b"=");
            if let Some(v) = existing {
                put(v);
                put(b":");
            }
            put(lib);
        }
    }
    put(b"\0");
    at
}

/// The command a shell started with the process's environment (`system`, `popen`: the C
/// library starts `sh -c CMD`, from glibc 2.38 `sh -c -- CMD`, with `environ`, out of
/// reach of the `exec` hooks) runs in place of `cmd`, so that `entries` (`NAME=value`:
/// what a child is handed down and the environment lacks) reach the shell that runs `cmd`
/// and its children: `exec /usr/bin/env 'NAME=value' ... /bin/sh -c 'CMD' sh` (`env`, not
/// `export`: a driver's variable may have a name the shell does not take), with `--`
/// after `-c` where `dashes` (the C library's own shell gets one: a command starting with
/// `-` or `+` is then a command, else the shell's options, as the C library has it).
/// Each word single-quoted (a `'` in it written `'\''`).
pub fn shell_command<'a>(
    entries: impl Iterator<Item = &'a [u8]>,
    cmd: &[u8],
    dashes: bool,
) -> Vec<u8> {
    let mut out = b"exec /usr/bin/env".to_vec();
    let quoted = |out: &mut Vec<u8>, word: &[u8]| {
        out.extend_from_slice(b" '");
        for &b in word {
            if b == b'\'' {
                out.extend_from_slice(b"'\\''");
            } else {
                out.push(b);
            }
        }
        out.push(b'\'');
    };
    for e in entries {
        quoted(&mut out, e);
    }
    out.extend_from_slice(if dashes {
        b" /bin/sh -c --".as_slice()
    } else {
        b" /bin/sh -c"
    });
    quoted(&mut out, cmd);
    out.extend_from_slice(b" sh");
    out
}

/// Whether the C library of version `version` (`gnu_get_libc_version`'s text: `2.36`)
/// starts the shell of `system` and `popen` with `--` after `-c` (glibc 2.38 and later).
pub fn shell_gets_dashes(version: &[u8]) -> bool {
    let mut parts = version.split(|&b| b == b'.').map(|p| {
        let digits = p.iter().take_while(|b| b.is_ascii_digit()).count();
        std::str::from_utf8(&p[..digits]).ok()?.parse::<u32>().ok()
    });
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor) >= (2, 38),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shells_command_gets_the_entries_and_keeps_its_own_words() {
        let entries: [&[u8]; 2] = [b"GPUCAP_LIMIT=256Mi", b"LD_PRELOAD=/opt/it's/libgpucap.so"];
        let c = shell_command(entries.into_iter(), b"echo 'a b' \"$HOME\"", true);
        assert_eq!(
            String::from_utf8(c).unwrap(),
            "exec /usr/bin/env 'GPUCAP_LIMIT=256Mi' 'LD_PRELOAD=/opt/it'\\''s/libgpucap.so' \
             /bin/sh -c -- 'echo '\\''a b'\\'' \"$HOME\"' sh"
        );
        let c = shell_command(entries.into_iter(), b"-x", false);
        assert_eq!(
            String::from_utf8(c).unwrap(),
            "exec /usr/bin/env 'GPUCAP_LIMIT=256Mi' 'LD_PRELOAD=/opt/it'\\''s/libgpucap.so' \
             /bin/sh -c '-x' sh"
        );
    }

    #[test]
    fn the_shell_gets_dashes_from_glibc_2_38() {
        for (version, dashes) in [
            ("2.36", false),
            ("2.37", false),
            ("2.38", true),
            ("2.41", true),
            ("2.38.9000", true),
            ("3.0", true),
            ("1.99", false),
            ("2", false),
            ("", false),
            ("x.y", false),
        ] {
            assert_eq!(shell_gets_dashes(version.as_bytes()), dashes, "{version}");
        }
    }

    const LIB: &[u8] = b"/opt/gpucap/libgpucap.so";

    /// The planned environment, as strings.
    fn planned(caller: &[&str], parent: &[&str]) -> Vec<String> {
        let caller: Vec<&[u8]> = caller.iter().map(|s| s.as_bytes()).collect();
        let parent: Vec<&[u8]> = parent.iter().map(|s| s.as_bytes()).collect();
        let mut entries = Vec::new();
        let other_name = |e: &[u8]| e == b"libgpucap.so";
        plan(
            caller.iter().copied(),
            parent.iter().copied(),
            LIB,
            other_name,
            |p| {
                let mut buf = vec![0u8; p.bytes(LIB) + 1];
                let n = write(p, LIB, &mut buf);
                assert_eq!(n, p.bytes(LIB) + 1, "{p:?}");
                assert_eq!(buf[n - 1], 0);
                entries.push(String::from_utf8(buf[..n - 1].to_vec()).unwrap());
            },
        );
        entries
    }

    #[test]
    fn an_emptied_environment_gets_the_parents_variables_and_the_library() {
        assert_eq!(
            planned(&[], &["GPUCAP_LIMIT=256Mi", "GPUCAP_POOL=team"]),
            [
                "GPUCAP_LIMIT=256Mi",
                "GPUCAP_POOL=team",
                "LD_PRELOAD=/opt/gpucap/libgpucap.so"
            ]
        );
    }

    #[test]
    fn what_the_caller_sets_holds_and_the_rest_is_kept_in_order() {
        assert_eq!(
            planned(
                &["PATH=/bin", "GPUCAP_LIMIT=1Gi", "HOME=/root"],
                &["GPUCAP_LIMIT=256Mi", "GPUCAP_LOG=debug"]
            ),
            [
                "PATH=/bin",
                "GPUCAP_LIMIT=1Gi",
                "HOME=/root",
                "GPUCAP_LOG=debug",
                "LD_PRELOAD=/opt/gpucap/libgpucap.so"
            ]
        );
    }

    #[test]
    fn the_parents_frame_goes_with_its_ordinal_keys_only() {
        const LIB_ENTRY: &str = "LD_PRELOAD=/opt/gpucap/libgpucap.so";
        let parent = ["GPUCAP_LIMIT=0=256Mi,1=1Gi", "GPUCAP_ORDINALS=all"];
        // Inherited keys, and the caller's copy of them (`os.environ` with the GPUs
        // picked): the frame goes with them.
        assert_eq!(
            planned(&["CUDA_VISIBLE_DEVICES=1"], &parent),
            [
                "CUDA_VISIBLE_DEVICES=1",
                "GPUCAP_LIMIT=0=256Mi,1=1Gi",
                "GPUCAP_ORDINALS=all",
                LIB_ENTRY
            ]
        );
        assert_eq!(
            planned(
                &["GPUCAP_LIMIT=0=256Mi,1=1Gi", "CUDA_VISIBLE_DEVICES=1"],
                &parent
            ),
            [
                "GPUCAP_LIMIT=0=256Mi,1=1Gi",
                "CUDA_VISIBLE_DEVICES=1",
                "GPUCAP_ORDINALS=all",
                LIB_ENTRY
            ]
        );
        // The caller's own keys count the child's GPUs: no frame of the parent's; one the
        // caller gives (a launcher that knows what its keys count) holds.
        assert_eq!(
            planned(&["GPUCAP_LIMIT=0=2Gi"], &parent),
            ["GPUCAP_LIMIT=0=2Gi", LIB_ENTRY]
        );
        assert_eq!(
            planned(&["GPUCAP_LIMIT=0=2Gi", "GPUCAP_ORDINALS=all"], &parent),
            ["GPUCAP_LIMIT=0=2Gi", "GPUCAP_ORDINALS=all", LIB_ENTRY]
        );
        assert_eq!(
            planned(&["GPUCAP_LIMIT=0=2Gi", "GPUCAP_ORDINALS=3"], &parent),
            ["GPUCAP_LIMIT=0=2Gi", "GPUCAP_ORDINALS=3", LIB_ENTRY]
        );
        // Keys of its own in another variable beside the parent's: none either.
        assert_eq!(
            planned(&["GPUCAP_GUARANTEE=0=1Gi"], &parent),
            [
                "GPUCAP_GUARANTEE=0=1Gi",
                "GPUCAP_LIMIT=0=256Mi,1=1Gi",
                LIB_ENTRY
            ]
        );
        // No ordinal key: nothing to frame.
        assert_eq!(
            planned(&[], &["GPUCAP_LIMIT=256Mi", "GPUCAP_ORDINALS=1"]),
            ["GPUCAP_LIMIT=256Mi", LIB_ENTRY]
        );
        // A copy of a frame bound to other keys than the child gets is dropped, and the
        // parent's frame for those keys goes instead.
        let keys = |e: &str| keys_digest([e.as_bytes()].into_iter());
        let mine = format!(
            "GPUCAP_ORDINALS=all@{:016x}",
            keys("GPUCAP_LIMIT=0=256Mi,1=1Gi")
        );
        let handed = format!("GPUCAP_ORDINALS=all@{:016x}", keys("GPUCAP_LIMIT=0=9Gi"));
        let parent = ["GPUCAP_LIMIT=0=256Mi,1=1Gi", mine.as_str()];
        assert_eq!(
            planned(&[handed.as_str(), "GPUCAP_LIMIT=0=256Mi,1=1Gi"], &parent),
            ["GPUCAP_LIMIT=0=256Mi,1=1Gi", mine.as_str(), LIB_ENTRY]
        );
        assert_eq!(
            planned(&[mine.as_str()], &parent),
            [mine.as_str(), "GPUCAP_LIMIT=0=256Mi,1=1Gi", LIB_ENTRY]
        );
        // HAMi-core's per-GPU variable is keyed by ordinal too.
        assert_eq!(
            planned(
                &[],
                &["CUDA_DEVICE_MEMORY_LIMIT_1=1024m", "GPUCAP_ORDINALS=2,3"]
            ),
            [
                "CUDA_DEVICE_MEMORY_LIMIT_1=1024m",
                "GPUCAP_ORDINALS=2,3",
                LIB_ENTRY
            ]
        );
    }

    #[test]
    fn another_preload_keeps_its_libraries_first_and_gains_this_one() {
        assert_eq!(
            planned(&["LD_PRELOAD=/usr/lib/libjemalloc.so"], &[]),
            ["LD_PRELOAD=/usr/lib/libjemalloc.so:/opt/gpucap/libgpucap.so"]
        );
        assert_eq!(
            planned(&["LD_PRELOAD=/a.so "], &[]),
            ["LD_PRELOAD=/a.so :/opt/gpucap/libgpucap.so"]
        );
        assert_eq!(
            planned(&["LD_PRELOAD="], &[]),
            ["LD_PRELOAD=/opt/gpucap/libgpucap.so"]
        );
        assert_eq!(
            planned(&["LD_PRELOAD=::"], &[]),
            ["LD_PRELOAD=/opt/gpucap/libgpucap.so"]
        );
    }

    #[test]
    fn a_preload_that_names_the_library_is_left_as_it_is() {
        for v in [
            "LD_PRELOAD=/opt/gpucap/libgpucap.so",
            "LD_PRELOAD=/a.so:/opt/gpucap/libgpucap.so",
            "LD_PRELOAD=/opt/gpucap/libgpucap.so /b.so",
            // Named otherwise (here: the bare name the loader searched for).
            "LD_PRELOAD=/a.so:libgpucap.so",
        ] {
            assert_eq!(planned(&[v], &[]), [v]);
        }
    }

    #[test]
    fn of_several_preloads_the_loaders_last_one_is_the_one_kept() {
        assert_eq!(
            planned(&["LD_PRELOAD=/a.so", "X=1", "LD_PRELOAD=/b.so"], &[]),
            ["X=1", "LD_PRELOAD=/b.so:/opt/gpucap/libgpucap.so"]
        );
    }

    #[test]
    fn only_configuration_variables_are_handed_down_and_each_name_once() {
        assert_eq!(
            planned(
                &[],
                &[
                    "GPUCAP_LIMIT=256Mi",
                    "CUDA_VISIBLE_DEVICES=1",
                    "PATH=/bin",
                    "CUDA_DEVICE_MEMORY_LIMIT=256m",
                    "NVIDIA_VISIBLE_DEVICES=all",
                    "GPUCAP_LIMIT=9Gi",
                ]
            ),
            [
                "GPUCAP_LIMIT=256Mi",
                "CUDA_DEVICE_MEMORY_LIMIT=256m",
                "NVIDIA_VISIBLE_DEVICES=all",
                "LD_PRELOAD=/opt/gpucap/libgpucap.so"
            ]
        );
    }

    #[test]
    fn a_library_path_the_loader_cannot_take_is_not_added() {
        let lib = b"/opt/my gpucap/libgpucap.so";
        assert!(!preloadable(lib));
        assert!(!preloadable(b"/a.so:/b.so"));
        assert!(!preloadable(b""));
        assert!(preloadable(LIB));
        let mut parts = Vec::new();
        plan(
            [&b"LD_PRELOAD=/a.so"[..]].into_iter(),
            [&b"GPUCAP_LIMIT=1Gi"[..]].into_iter(),
            lib,
            |_| false,
            |p| parts.push(p),
        );
        assert_eq!(
            parts,
            [
                Part::Kept(b"LD_PRELOAD=/a.so"),
                Part::Inherited(b"GPUCAP_LIMIT=1Gi")
            ]
        );
    }

    #[test]
    fn every_name_looked_at_begins_with_a_byte_the_filter_lets_through() {
        use crate::config::may_be_looked_at;
        let mut names: Vec<String> = crate::config::vars::KNOWN_VARS
            .iter()
            .map(|n| n.to_string())
            .collect();
        names.extend(
            crate::config::hami::HAMI_IGNORED
                .iter()
                .map(|(n, _)| n.to_string()),
        );
        names.extend(
            [
                "gpucap_limit",
                "Gpucap_Pool",
                "CUDA_DEVICE_MEMORY_LIMIT",
                "CUDA_DEVICE_MEMORY_LIMIT_1",
                "CUDA_DEVICE_SM_LIMIT_0",
                "GPU_DEVICE_0_MEMORY",
                "NVIDIA_GPU_MEMORY_REQUEST",
                "CUDA_MEM_LIMIT",
                "CUDA_MEM_LIMIT_1",
                "MANAGER_VISIBLE_DEVICE_0",
                "NVIDIA_VISIBLE_DEVICES",
                "CUDA_VISIBLE_DEVICES",
            ]
            .map(String::from),
        );
        for name in &names {
            assert!(looked_at(name.as_bytes()), "{name} is not looked at");
            assert!(
                may_be_looked_at(name.as_bytes()[0]),
                "{name} is filtered out"
            );
        }
        for name in ["PATH", "HOME", "LD_PRELOAD", "PYTHONPATH", "TERM"] {
            assert!(!may_be_looked_at(name.as_bytes()[0]), "{name}");
        }
    }

    #[test]
    fn a_child_that_sets_its_own_cap_inherits_no_other_figure_of_it() {
        let parent = [
            "CUDA_DEVICE_MEMORY_LIMIT=256m",
            "CUDA_DEVICE_MEMORY_LIMIT_1=128m",
            "GPUCAP_LOG=warn",
            "GPU_DEVICE_0_MEMORY=1Gi",
        ];
        assert_eq!(
            planned(&["GPUCAP_LIMIT=1Gi"], &parent),
            [
                "GPUCAP_LIMIT=1Gi",
                "GPUCAP_LOG=warn",
                "GPU_DEVICE_0_MEMORY=1Gi",
                "LD_PRELOAD=/opt/gpucap/libgpucap.so"
            ]
        );
        assert_eq!(
            planned(&["CUDA_DEVICE_MEMORY_LIMIT_0=1g"], &["GPUCAP_LIMIT=256Mi"]),
            [
                "CUDA_DEVICE_MEMORY_LIMIT_0=1g",
                "LD_PRELOAD=/opt/gpucap/libgpucap.so"
            ]
        );
        // The shared cache is a pool, not a figure of the cap.
        assert_eq!(
            planned(
                &["GPUCAP_LIMIT=1Gi"],
                &["CUDA_DEVICE_MEMORY_SHARED_CACHE=/x"]
            ),
            [
                "GPUCAP_LIMIT=1Gi",
                "CUDA_DEVICE_MEMORY_SHARED_CACHE=/x",
                "LD_PRELOAD=/opt/gpucap/libgpucap.so"
            ]
        );
    }

    #[test]
    fn an_entry_without_a_value_sets_nothing() {
        assert_eq!(
            planned(&["GPUCAP_LIMIT"], &["GPUCAP_LIMIT=256Mi"]),
            [
                "GPUCAP_LIMIT",
                "GPUCAP_LIMIT=256Mi",
                "LD_PRELOAD=/opt/gpucap/libgpucap.so"
            ]
        );
    }

    #[test]
    fn names_and_values_of_entries() {
        assert_eq!(name_of(b"A=b=c"), b"A");
        assert_eq!(value_of(b"A=b=c"), b"b=c");
        assert_eq!(name_of(b"NOEQ"), b"NOEQ");
        assert_eq!(value_of(b"NOEQ"), b"");
    }
}
