//! Proof of coverage (the book's page docs/src/counting.md, section "What gpucap counts"):
//!
//! * every entry point the table marks as hooked (counted, credits or figures) is reached
//!   on every resolution path — linked, `dlsym` on `libcuda.so.1` and `libcuda.so`,
//!   `dlsym(RTLD_DEFAULT)`, and `cuGetProcAddress`/`cuGetProcAddress_v2` (and the
//!   `cuGetProcAddress` that `cuGetProcAddress_v2` hands out) at every version the header
//!   gives it (each variant's, one below each, 12090 and 13000) and with each flag — for
//!   every variant in cuda-stubs/src/procaddr_table.txt: the pointer a program gets is the
//!   shim's export of exactly the variant the driver would have given;
//! * every entry point the table marks "no" is left to the driver;
//! * the test each row names exists;
//! * and the behaviour: arrays, pools, contexts, the 32-bit variants are capped; pinned
//!   host memory and imports are not counted (tests/c/coverage.c, each scenario run with
//!   the shim, without it as a control, and without it but expecting the cap, which must
//!   fail).

use super::common;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use common::*;

const CAP: &str = "256Mi";
const PHYS: &str = "8Gi";

fn coverage_prog() -> PathBuf {
    compile_c("coverage", "", &["-lcuda"])
}

/// Runs `coverage <mode>` with the shim (must pass), without (uncapped: must pass) and
/// without but expecting the cap (must fail). `env` goes to every run. Returns the run
/// with the shim and its stats file.
fn three_ways(mode: &str, env: &[(&str, &str)]) -> (Output, PathBuf) {
    let prog = coverage_prog();
    let make = |shim: bool| {
        let stats = scratch(&format!("coverage-{mode}")).join("stats.json");
        let mut c = fake_cmd(&prog, &stats);
        c.env("FAKECUDA_TOTAL_MEM", PHYS);
        for (k, v) in env {
            c.env(k, v);
        }
        if shim {
            preload(&mut c).env("GPUCAP_LIMIT", CAP);
        }
        (c, stats)
    };
    let (mut c, stats) = make(true);
    let with = run(c.args([mode, "capped", CAP, PHYS]));
    assert_passed(&with, &format!("{mode} with the shim"));
    let (mut c, _) = make(false);
    let without = run(c.args([mode, "uncapped", CAP, PHYS]));
    assert_passed(&without, &format!("{mode} without the shim (control)"));
    let (mut c, _) = make(false);
    let control = run(c.args([mode, "capped", CAP, PHYS]));
    assert_failed(
        &control,
        &format!("{mode} without the shim, expecting the cap"),
    );
    (with, stats)
}

// ---- behaviour ----------------------------------------------------------------------

#[test]
fn arrays_are_charged_the_drivers_size() {
    let (with, stats) = three_ways("arrays", &[]);
    let s = &read_stats(&stats)[0];
    assert_eq!(
        s.final_used, 0,
        "an array refused after the fact was destroyed"
    );
    // The array refused after the fact existed until destroyed: the driver held at most
    // its padding (< 512 bytes on the fake) beyond the cap, for that moment.
    assert!(
        s.peak_used < 256 * MIB + 512,
        "the fake held more than the cap plus padding: {s:?}"
    );
    let refusals = refusals(&stderr(&with));
    for api in ["cuArrayCreate", "cuArray3DCreate", "cuMipmappedArrayCreate"] {
        assert!(
            refusals
                .iter()
                .any(|l| l.contains(&format!("refused {api} "))),
            "{api}: {refusals:?}"
        );
    }
}

#[test]
fn pools_are_charged_what_they_reserve() {
    let (with, stats) = three_ways("pools", &[]);
    let s = &read_stats(&stats)[0];
    assert!(
        s.peak_used <= 256 * MIB,
        "pool reservations never went past the cap: {s:?}"
    );
    assert_eq!(s.final_used, 0);
    let refusals = refusals(&stderr(&with));
    for api in ["cuMemAllocAsync", "cuMemAllocFromPoolAsync"] {
        assert!(
            refusals
                .iter()
                .any(|l| l.contains(&format!("refused {api} "))),
            "{api}: {refusals:?}"
        );
    }
    assert!(
        !refusals.iter().any(|l| l.contains("cuMemAlloc of")),
        "the plain allocation was served after trimming the pool, not refused: {refusals:?}"
    );
}

#[test]
fn contexts_are_charged_what_they_take() {
    let (with, stats) = three_ways("contexts", &[("FAKECUDA_CONTEXT_MEM", "64Mi")]);
    let s = &read_stats(&stats)[0];
    // A context can only be measured once the driver made it: the fifth existed until
    // the shim destroyed it (and the first had a temporary context beside it).
    assert!(
        s.peak_used <= 256 * MIB + 64 * MIB,
        "at most one context beyond the cap, briefly: {s:?}"
    );
    let refusals = refusals(&stderr(&with));
    assert!(
        refusals
            .iter()
            .any(|l| l.contains("refused cuCtxCreate of 64 MiB")),
        "{refusals:?}"
    );
}

#[test]
fn legacy_32_bit_entry_points_are_capped() {
    three_ways("legacy", &[]);
}

#[test]
fn host_memory_and_imports_are_not_counted() {
    three_ways("host", &[]);
    three_ways("share", &[]);
}

/// An exporter (capped) holds memory; an importer (capped) opens it past its own cap.
#[test]
fn ipc_and_shareable_imports_are_the_exporters() {
    let prog = coverage_prog();
    let stats = scratch("coverage-ipc").join("stats.json");
    let mut exporter = fake_cmd(&prog, &stats);
    exporter.env("FAKECUDA_TOTAL_MEM", PHYS);
    preload(&mut exporter).env("GPUCAP_LIMIT", CAP);
    let mut child = exporter
        .args(["ipc-export", "capped", CAP, PHYS])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("exporter");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = String::new();
    let ipc = loop {
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("exporter ended early:\n{seen}"))
            .unwrap();
        seen.push_str(&line);
        seen.push('\n');
        if let Some(rest) = line.strip_prefix("ipc ") {
            break rest.to_string();
        }
    };
    let words: Vec<&str> = ipc.split_whitespace().collect();
    let (hex, pid, fd) = (
        words[0],
        &words[1]["pid=".len()..],
        &words[2]["fd=".len()..],
    );

    for (shim, expect_cap) in [(true, true), (false, false), (false, true)] {
        let stats = scratch("coverage-ipc-import").join("stats.json");
        let mut c = fake_cmd(&prog, &stats);
        c.env("FAKECUDA_TOTAL_MEM", PHYS);
        if shim {
            preload(&mut c).env("GPUCAP_LIMIT", CAP);
        }
        let mode = if expect_cap { "capped" } else { "uncapped" };
        let o = run(c.args(["ipc-import", mode, CAP, PHYS, hex, pid, fd]));
        match (shim, expect_cap) {
            (true, _) => assert_passed(&o, "importer with the shim"),
            (false, false) => assert_passed(&o, "importer without the shim (control)"),
            (false, true) => assert_failed(&o, "importer without the shim, expecting the cap"),
        }
    }
    writeln!(child.stdin.take().unwrap(), "done").unwrap();
    for line in lines {
        seen.push_str(&line.unwrap());
        seen.push('\n');
    }
    let status = child.wait().unwrap();
    assert!(
        status.success() && !seen.contains("FAIL"),
        "exporter: {status:?}\n{seen}"
    );
}

// ---- resolution paths -----------------------------------------------------------------

/// The page of the book that holds the coverage table.
const COVERAGE_PAGE: &str = "docs/src/counting.md";

/// One row of the coverage table (`COVERAGE_PAGE`).
#[derive(Debug)]
struct Row {
    bases: Vec<String>,
    hooked: bool,
    tests: Vec<String>,
}

fn backticked(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

fn coverage_table() -> Vec<Row> {
    let readme = std::fs::read_to_string(root().join(COVERAGE_PAGE)).expect(COVERAGE_PAGE);
    // The section "## What gpucap counts", up to the next section of that level.
    let start = readme
        .find("\n## What gpucap counts")
        .unwrap_or_else(|| panic!("{COVERAGE_PAGE}: section 'What gpucap counts' not found"));
    let section = &readme[start + 1..];
    let text = &section[..section.find("\n## ").unwrap_or(section.len())];
    let rows: Vec<Row> = text
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let counted = cells[2];
            let hooked =
                ["**yes**", "**credits**", "**figures**", "**tracked**"].contains(&counted);
            assert!(
                hooked || counted == "no",
                "{COVERAGE_PAGE}: unknown 'Counted' value {counted:?} in {l}"
            );
            Row {
                bases: backticked(cells[1]),
                hooked,
                tests: backticked(cells[4]),
            }
        })
        .collect();
    assert!(rows.len() > 30, "{COVERAGE_PAGE}: table not found");
    rows
}

/// cuda-stubs/src/procaddr_table.txt: base -> [(variant, since, per_thread)].
fn procaddr_table() -> BTreeMap<String, Vec<(String, i32, bool)>> {
    let text = std::fs::read_to_string(root().join("cuda-stubs/src/procaddr_table.txt")).unwrap();
    let mut m: BTreeMap<String, Vec<(String, i32, bool)>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let w: Vec<&str> = line.split_whitespace().collect();
        m.entry(w[0].to_string()).or_default().push((
            w[1].to_string(),
            w[2].parse().unwrap(),
            w[3] == "1",
        ));
    }
    m
}

/// The variant the driver returns for `cuGetProcAddress(base, version, flags)`, per the
/// header's rules (the fake implements them): the newest non-per-thread variant by
/// `version`, or with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM its per-thread twin.
fn expected(variants: &[(String, i32, bool)], version: i32, flags: u64) -> Option<&str> {
    let pick = |ptsz: bool| {
        variants
            .iter()
            .filter(|(_, since, p)| *since <= version && *p == ptsz)
            .max_by_key(|(_, since, _)| *since)
            .map(|(v, _, _)| v.as_str())
    };
    if flags & 2 != 0 {
        pick(true).or_else(|| pick(false))
    } else {
        pick(false)
    }
}

#[test]
fn every_test_the_table_names_exists() {
    for row in coverage_table() {
        for t in &row.tests {
            let (module, func) = t
                .rsplit_once("::")
                .unwrap_or_else(|| panic!("{t}: not module::function"));
            // `module` is a module of one of the test binaries: tests/<area>/<module>.rs,
            // or a folder's (tests/<area>/pool/shares.rs for `pool::shares`).
            let file = module.replace("::", "/");
            let src = std::fs::read_dir(root().join("tests"))
                .unwrap()
                .flatten()
                .map(|area| area.path().join(format!("{file}.rs")))
                .find(|p| p.is_file())
                .and_then(|p| std::fs::read_to_string(p).ok())
                .unwrap_or_else(|| panic!("{t}: no tests/<area>/{file}.rs"));
            assert!(
                src.contains(&format!("fn {func}(")),
                "{COVERAGE_PAGE} names {t}, which does not exist"
            );
        }
    }
}

/// Writes the walk program: every variant of every listed base referenced directly (so
/// the linker resolves it), and the cuGetProcAddress queries with their expected variant.
fn walk_source(
    table: &BTreeMap<String, Vec<(String, i32, bool)>>,
    hooked: &[String],
    untouched: &[String],
) -> String {
    let mut s = String::from(
        "#define _GNU_SOURCE\n#include <dlfcn.h>\n#include <stdio.h>\n#include <string.h>\n\
         typedef int CUresult;\n\
         typedef CUresult (*gpa1_t)(const char *, void **, int, unsigned long long);\n\
         typedef CUresult (*gpa2_t)(const char *, void **, int, unsigned long long, int *);\n\
         CUresult cuGetProcAddress(const char *, void **, int, unsigned long long);\n\
         CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);\n",
    );
    let mut variants = Vec::new();
    for base in hooked.iter().chain(untouched) {
        for (v, since, ptsz) in &table[base] {
            if v != "cuGetProcAddress" && v != "cuGetProcAddress_v2" {
                writeln!(s, "extern void {v}(void);").unwrap();
            }
            variants.push((
                base.clone(),
                v.clone(),
                *since,
                *ptsz,
                hooked.contains(base),
            ));
        }
    }
    s.push_str("struct variant { const char *base, *name; int hooked; void *direct; };\nstatic struct variant V[] = {\n");
    for (base, v, _, _, hooked) in &variants {
        writeln!(
            s,
            "  {{\"{base}\", \"{v}\", {}, (void *)&{v}}},",
            *hooked as i32
        )
        .unwrap();
    }
    s.push_str("};\nstruct query { const char *base; int version; unsigned long long flags; const char *expect; };\nstatic struct query Q[] = {\n");
    for base in hooked {
        let vs = &table[base];
        let mut versions: BTreeSet<i32> = [12090, 13000].into();
        for (_, since, _) in vs {
            versions.insert(*since);
            versions.insert(since - 10);
        }
        for version in versions {
            for flags in [0u64, 1, 2] {
                let e =
                    expected(vs, version, flags).map_or("NULL".to_string(), |v| format!("\"{v}\""));
                writeln!(s, "  {{\"{base}\", {version}, {flags}, {e}}},").unwrap();
            }
        }
    }
    s.push_str(
        r#"};
#define N(a) (sizeof(a) / sizeof((a)[0]))
static int fails, checks;
#define CHECK(c, ...) do { checks++; if (!(c)) { fails++; printf("FAIL "); printf(__VA_ARGS__); printf("\n"); } } while (0)

int main(int argc, char **argv) {
    void *shim = dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD);
    void *so1 = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    void *so = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    if (!shim || !so1 || !so) { printf("FATAL dlopen: shim %p so1 %p so %p: %s\n", shim, so1, so, dlerror()); return 3; }
    for (size_t i = 0; i < N(V); i++) {
        void *h = dlsym(shim, V[i].name);
        void *direct = V[i].direct;
        if (strcmp(V[i].name, "cuGetProcAddress") == 0) direct = (void *)&cuGetProcAddress;
        if (strcmp(V[i].name, "cuGetProcAddress_v2") == 0) direct = (void *)&cuGetProcAddress_v2;
        void *a = dlsym(so1, V[i].name), *b = dlsym(so, V[i].name), *c = dlsym(RTLD_DEFAULT, V[i].name);
        if (V[i].hooked) {
            CHECK(h != NULL, "%s: the shim does not export %s", V[i].base, V[i].name);
            CHECK(direct == h, "%s: linked %s is %p, not the shim's %p", V[i].base, V[i].name, direct, h);
            CHECK(a == h, "%s: dlsym(libcuda.so.1, %s) = %p, not the shim's %p", V[i].base, V[i].name, a, h);
            CHECK(b == h, "%s: dlsym(libcuda.so, %s) = %p, not the shim's %p", V[i].base, V[i].name, b, h);
            CHECK(c == h, "%s: dlsym(RTLD_DEFAULT, %s) = %p, not the shim's %p", V[i].base, V[i].name, c, h);
        } else {
            CHECK(h == NULL, "%s: the shim exports %s, which the table says is not counted", V[i].base, V[i].name);
            CHECK(a != NULL && a == b && a == direct, "%s: %s is not the driver's own everywhere", V[i].base, V[i].name);
        }
        printf("variant %s %s\n", V[i].name, V[i].hooked ? "hooked" : "driver");
    }
    /* cuGetProcAddress as linked, and as cuGetProcAddress_v2 hands it out (cudart's way). */
    void *gpa_from_v2 = NULL;
    CHECK(cuGetProcAddress_v2("cuGetProcAddress", &gpa_from_v2, 11030, 0, NULL) == 0 && gpa_from_v2, "cuGetProcAddress_v2(cuGetProcAddress, 11030)");
    gpa1_t v1s[2] = {cuGetProcAddress, (gpa1_t)gpa_from_v2};
    for (size_t i = 0; i < N(Q); i++) {
        void *want = Q[i].expect ? dlsym(shim, Q[i].expect) : NULL;
        for (int k = 0; k < 3; k++) {
            void *p = (void *)1;
            int status = -1;
            CUresult rc = k < 2 && v1s[k] ? v1s[k](Q[i].base, &p, Q[i].version, Q[i].flags)
                                          : cuGetProcAddress_v2(Q[i].base, &p, Q[i].version, Q[i].flags, &status);
            const char *how = k == 0 ? "cuGetProcAddress" : k == 1 ? "cuGetProcAddress (from _v2)" : "cuGetProcAddress_v2";
            if (Q[i].expect) {
                CHECK(rc == 0 && want && p == want, "%s(%s, %d, %llu) -> rc %d %p, expected the shim's %s %p", how, Q[i].base, Q[i].version, Q[i].flags, rc, p, Q[i].expect, want);
            } else if (k == 2) {
                /* _v2 succeeds with no pointer and the status VERSION_NOT_SUFFICIENT (2), as CUDA 13.0 answers. */
                CHECK(rc == 0 && p == NULL && status == 2, "%s(%s, %d, %llu) -> rc %d %p status %d, expected none (version too old)", how, Q[i].base, Q[i].version, Q[i].flags, rc, p, status);
            } else {
                CHECK(rc != 0 && p == NULL, "%s(%s, %d, %llu) -> rc %d %p, expected none (version too old)", how, Q[i].base, Q[i].version, Q[i].flags, rc, p);
            }
        }
    }
    printf("summary: %d checks, %d failed\n", checks, fails);
    return fails ? 1 : 0;
}
"#,
    );
    s
}

#[test]
fn every_counted_entry_point_is_reached_on_every_path() {
    let rows = coverage_table();
    let table = procaddr_table();
    let mut hooked = Vec::new();
    let mut untouched = Vec::new();
    for row in &rows {
        for base in &row.bases {
            assert!(
                table.contains_key(base),
                "{COVERAGE_PAGE} names {base}, which cuda.h does not have"
            );
            if row.hooked {
                hooked.push(base.clone())
            } else {
                untouched.push(base.clone())
            }
        }
    }
    // Every allocation entry point of the header is in the table (counted or not).
    for base in table.keys() {
        let allocates = base.starts_with("cuMemAlloc")
            || [
                "cuMemCreate",
                "cuMemHostAlloc",
                "cuMemHostRegister",
                "cuArrayCreate",
                "cuArray3DCreate",
                "cuMipmappedArrayCreate",
                "cuMemPoolCreate",
                "cuCtxCreate",
                "cuDevicePrimaryCtxRetain",
                "cuIpcOpenMemHandle",
                "cuMemImportFromShareableHandle",
                "cuMemPoolImportFromShareableHandle",
                "cuMemPoolImportPointer",
                "cuGraphAddMemAllocNode",
                "cuGreenCtxCreate",
                "cuMulticastCreate",
                "cuImportExternalMemory",
                "cuModuleLoad",
                "cuLibraryLoadData",
                "cuCtxSetLimit",
            ]
            .contains(&base.as_str());
        assert!(
            !allocates || hooked.contains(base) || untouched.contains(base),
            "{base} takes device memory but {COVERAGE_PAGE} does not say whether it is counted"
        );
    }
    let dir = scratch("coverage-walk");
    let src = dir.join("walk.c");
    std::fs::write(&src, walk_source(&table, &hooked, &untouched)).unwrap();
    let exe = dir.join("walk");
    let st = Command::new("cc")
        .args(["-O0", "-Wall", "-Werror", "-Wno-unused-variable", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-L")
        .arg(fake_lib_dir())
        .args(["-lcuda", "-ldl"])
        .status()
        .unwrap();
    assert!(st.success(), "compiling {}", src.display());

    let stats = dir.join("stats.json");
    let mut c = fake_cmd(&exe, &stats);
    preload(&mut c).env("GPUCAP_LIMIT", CAP).arg(shim());
    let o = run(&mut c);
    let out = stdout(&o);
    assert!(
        o.status.success() && out.contains("summary:") && !out.contains("FAIL"),
        "{:?}\n{}\n{}",
        o.status,
        out.lines()
            .filter(|l| l.starts_with("FAIL") || l.starts_with("FATAL"))
            .take(40)
            .collect::<Vec<_>>()
            .join("\n"),
        tail(&stderr(&o), 10)
    );
    let n = out
        .lines()
        .filter(|l| l.starts_with("variant ") && l.ends_with(" hooked"))
        .count();
    let checks = out.lines().find(|l| l.starts_with("summary:")).unwrap();
    eprintln!(
        "{n} hooked variants of {} entry points walked; {checks}",
        hooked.len()
    );
    let want: usize = hooked.iter().map(|b| table[b].len()).sum();
    assert_eq!(
        n, want,
        "every variant of every hooked entry point was walked"
    );

    // Control: without the shim the same walk fails (the pointers are the driver's).
    let mut c = fake_cmd(&exe, &stats);
    let o = run(c.arg(shim()));
    assert!(
        !o.status.success(),
        "the walk passed without the shim preloaded"
    );
}

/// NVML has no cuGetProcAddress: linked and dlsym on libnvidia-ml.so.1 / libnvidia-ml.so.
#[test]
fn nvml_entry_points_are_reached_linked_and_by_dlsym() {
    let _ = fake_nvml();
    let dir = scratch("coverage-nvml");
    let src = dir.join("nvml_walk.c");
    std::fs::write(
        &src,
        r#"#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
extern void nvmlDeviceGetMemoryInfo(void);
extern void nvmlDeviceGetMemoryInfo_v2(void);
extern void nvmlDeviceGetComputeRunningProcesses(void);
extern void nvmlDeviceGetComputeRunningProcesses_v2(void);
extern void nvmlDeviceGetComputeRunningProcesses_v3(void);
#define N 5
int main(int argc, char **argv) {
    void *shim = dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD);
    const char *names[N] = {"nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2",
                            "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2",
                            "nvmlDeviceGetComputeRunningProcesses_v3"};
    void *direct[N] = {(void *)&nvmlDeviceGetMemoryInfo, (void *)&nvmlDeviceGetMemoryInfo_v2,
                       (void *)&nvmlDeviceGetComputeRunningProcesses,
                       (void *)&nvmlDeviceGetComputeRunningProcesses_v2,
                       (void *)&nvmlDeviceGetComputeRunningProcesses_v3};
    int fails = 0;
    for (int i = 0; i < N; i++) {
        void *h = shim ? dlsym(shim, names[i]) : NULL;
        void *paths[4] = {direct[i], dlsym(dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL), names[i]),
                          dlsym(dlopen("libnvidia-ml.so", RTLD_NOW | RTLD_LOCAL), names[i]), dlsym(RTLD_DEFAULT, names[i])};
        for (int k = 0; k < 4; k++) {
            if (!h || paths[k] != h) { fails++; printf("FAIL %s path %d: %p, shim %p\n", names[i], k, paths[k], h); }
            else printf("ok %s path %d\n", names[i], k);
        }
    }
    printf("summary: %d failed\n", fails);
    return fails != 0;
}
"#,
    )
    .unwrap();
    let exe = dir.join("nvml_walk");
    let st = Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg("-L")
        .arg(fake_lib_dir())
        .args(["-lnvidia-ml", "-ldl"])
        .status()
        .unwrap();
    assert!(st.success());
    let stats = dir.join("stats.json");
    let mut c = fake_cmd(&exe, &stats);
    let o = run(preload(&mut c).env("GPUCAP_LIMIT", CAP).arg(shim()));
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
    assert_eq!(
        stdout(&o).lines().filter(|l| l.starts_with("ok ")).count(),
        5 * 4
    );
    let o = run(fake_cmd(&exe, &stats).arg(shim()));
    assert!(
        !o.status.success(),
        "passed without the shim: {}",
        stdout(&o)
    );
}
