//! The fake GPU held to a real driver's answers: tests/c/driver_probe.c prints as JSON what
//! the driver answers for what the fake models (return codes of misuse, memory figures,
//! granularity, pool and pointer attributes, NVML, and the `cuGetProcAddress` /
//! `cuGetExportTable` requests real clients made). A real GPU's output is committed as
//! `tests/driver-answers/<gpu>-<driver>.json` (scripts/gpu/probe-driver.sh writes it);
//! here the same probe runs on the fake, asked the same requests, and every answer must
//! match, or be listed in that file's `accepted` with why.
//!
//! Also: the shim's `GPUCAP_LOG=debug` lines that name the requests (what
//! probe-driver.sh collects from PyTorch, JAX, CuPy and cuda-bindings).

use super::common;

use common::*;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The probe's groups: each ends with `GROUP.done`, or `GROUP.crashed` (a crash is an
/// answer, compared like the others: the fake must not crash where the driver answers).
const GROUPS: [&str; 17] = [
    "init",
    "context",
    "alloc",
    "pointer",
    "pool",
    "pool_freed",
    "vmm",
    "vmm_bad",
    "module",
    "request",
    "null.0",
    "null.1",
    "null.2",
    "null.3",
    "null.4",
    "null.5",
    "null.6",
];

fn probe() -> PathBuf {
    compile_c("driver_probe", "", &["-lcuda"])
}

/// The probe's JSON on the fake GPU, asked `requests` (a file of request lines).
fn fake_answers(requests: Option<&Path>, env: &[(&str, &str)]) -> (Value, String) {
    let dir = scratch("driver-answers");
    let mut c = fake_cmd(probe(), &dir.join("stats.json"));
    c.args(requests);
    for (k, v) in env {
        c.env(k, v);
    }
    let o = run(&mut c);
    assert!(o.status.success(), "{}", dump(&o));
    let v = serde_json::from_str(&stdout(&o))
        .unwrap_or_else(|e| panic!("the probe's output is not JSON: {e}\n{}", dump(&o)));
    (v, stderr(&o))
}

/// Why `v` is not a probe document the comparison can use, if it is not.
fn shape_errors(v: &Value) -> Vec<String> {
    let mut e = Vec::new();
    if v["schema"] != 1 {
        e.push(format!("schema is {}, expected 1", v["schema"]));
    }
    let m = &v["machine"];
    for k in [
        "driver_version",
        "total_mem",
        "device_count",
        "compute_capability",
    ] {
        if !m[k].is_u64() {
            e.push(format!("machine.{k} is {}, expected a number", m[k]));
        }
    }
    if !m["gpu"].is_string() {
        e.push("machine.gpu is not a string".into());
    }
    match v["answers"].as_object() {
        None => e.push("answers is not an object".into()),
        Some(a) => {
            for g in GROUPS {
                let done = a.get(&format!("{g}.done")) == Some(&Value::Bool(true));
                if done == a.contains_key(&format!("{g}.crashed")) {
                    e.push(format!(
                        "group {g}: expected either {g}.done or {g}.crashed"
                    ));
                }
            }
        }
    }
    match v["requests"].as_object() {
        None => e.push("requests is not an object".into()),
        Some(r) => {
            for (k, a) in r {
                if !a["rc"].is_i64() || !a["asked_by"].is_array() {
                    e.push(format!("requests.{k}: expected rc and asked_by, got {a}"));
                }
            }
        }
    }
    match v["accepted"].as_array() {
        None => e.push("accepted is not a list".into()),
        Some(list) => {
            for a in list {
                let why = a["why"].as_str().unwrap_or("").trim();
                if !a["key"].is_string() || why.is_empty() {
                    e.push(format!("accepted entry {a}: needs a key and a why"));
                }
            }
        }
    }
    e
}

/// The differences between a real driver's document and the fake's, less those the real
/// one accepts; an accepted difference that no longer differs is reported too (stale).
fn differences(real: &Value, fake: &Value) -> Vec<String> {
    let accepted: BTreeSet<&str> = real["accepted"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["key"].as_str())
        .collect();
    let mut found = BTreeSet::new();
    let empty = serde_json::Map::new();
    let (ra, fa) = (
        real["answers"].as_object().unwrap_or(&empty),
        fake["answers"].as_object().unwrap_or(&empty),
    );
    let keys: BTreeSet<&String> = ra.keys().chain(fa.keys()).collect();
    for k in keys {
        let (r, f) = (ra.get(k), fa.get(k));
        if r != f {
            found.insert((format!("answers.{k}"), format!("real {r:?}, fake {f:?}")));
        }
    }
    let fr = fake["requests"].as_object().unwrap_or(&empty);
    for (k, r) in real["requests"].as_object().unwrap_or(&empty) {
        let f = fr.get(k).unwrap_or(&Value::Null);
        let mut fields = vec!["rc", "status", "table"];
        // Whether the pointer is an export of that name (the real driver may hand out
        // internal functions: then there is nothing to compare).
        if !r["export"].is_null() {
            fields.push("export");
        }
        for field in fields {
            if r[field] != f[field] {
                found.insert((
                    format!("requests.{k}"),
                    format!("{field}: real {}, fake {}", r[field], f[field]),
                ));
            }
        }
    }
    let differing: BTreeSet<&str> = found.iter().map(|(k, _)| k.as_str()).collect();
    let mut out: Vec<String> = found
        .iter()
        .filter(|(k, _)| !accepted.contains(k.as_str()))
        .map(|(k, d)| format!("{k}: {d}"))
        .collect();
    for a in &accepted {
        if !differing.contains(a) {
            out.push(format!(
                "{a}: listed as an accepted difference but the fake now answers as the real driver: remove it"
            ));
        }
    }
    out
}

/// The request lines of a document (what the probe is asked on the fake).
fn request_lines(v: &Value) -> String {
    let mut s = String::new();
    for (k, a) in v["requests"].as_object().into_iter().flatten() {
        let by: Vec<&str> = a["asked_by"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c.as_str())
            .collect();
        s.push_str(&format!("{k} {}\n", by.join(" ")));
    }
    s
}

/// The comparison for one real driver's file: its shape, then the fake asked the same.
fn compare_file(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let real: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()));
    let mut errors: Vec<String> = shape_errors(&real)
        .into_iter()
        .map(|e| format!("shape: {e}"))
        .collect();
    let req = scratch("driver-answers-req").join("requests.txt");
    std::fs::write(&req, request_lines(&real)).unwrap();
    let env = machine_env(&real);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (fake, _) = fake_answers(Some(&req), &env);
    errors.extend(differences(&real, &fake));
    errors
}

/// The fake configured as the recorded machine: its memory, its driver version, and what
/// a context takes there (the answers about contexts depend on it).
fn machine_env(real: &Value) -> Vec<(&'static str, String)> {
    let m = &real["machine"];
    let mut env = Vec::new();
    if let Some(t) = m["total_mem"].as_u64() {
        env.push(("FAKECUDA_TOTAL_MEM", t.to_string()));
    }
    if let Some(v) = m["driver_version"].as_u64() {
        env.push(("FAKECUDA_DRIVER_VERSION", v.to_string()));
    }
    if let Some(c) = m["context.second_context_takes"]
        .as_i64()
        .filter(|c| *c > 0)
    {
        env.push(("FAKECUDA_CONTEXT_MEM", c.to_string()));
    }
    env
}

/// Request lines most clients make, for the tests that have no real file to take them from.
const SOME_REQUESTS: &str = "procaddr \"\" 0 0 cudart\n\
    procaddr cuMemAlloc 12000 0 torch jax\n\
    procaddr cuMemAllocAsync 12000 2 jax\n\
    procaddr cuGetProcAddress 12000 0 cudart\n\
    procaddr cuNoSuchEntryPoint 12000 0 probe\n\
    export 6bd5fb6c-5bf4-e74a-8987-d93912fd9df9 cudart\n";

#[test]
fn the_fakes_answers_have_the_shape_the_comparison_needs() {
    let req = scratch("driver-answers-shape").join("requests.txt");
    std::fs::write(&req, SOME_REQUESTS).unwrap();
    let (v, err) = fake_answers(Some(&req), &[]);
    assert_eq!(shape_errors(&v), Vec::<String>::new(), "{err}");
    let crashed: Vec<_> = v["answers"]
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| k.ends_with(".crashed"))
        .collect();
    assert!(crashed.is_empty(), "the fake crashed: {crashed:?}\n{err}");
    let r = &v["requests"];
    assert_eq!(r["procaddr cuMemAlloc 12000 0"]["rc"], 0, "{r}");
    assert_eq!(r["procaddr cuMemAlloc 12000 0"]["export"], "cuMemAlloc_v2");
    assert_eq!(
        r["procaddr cuMemAlloc 12000 0"]["asked_by"],
        json!(["torch", "jax"])
    );
    assert_eq!(
        r["procaddr cuMemAllocAsync 12000 2"]["export"],
        "cuMemAllocAsync_ptsz"
    );
    // An unknown name: success, a NULL pointer and SYMBOL_NOT_FOUND (as CUDA 13.0 answers).
    let unknown = &r["procaddr cuNoSuchEntryPoint 12000 0"];
    assert_eq!((&unknown["rc"], &unknown["status"]), (&json!(0), &json!(1)));
    assert_eq!(unknown["export"], Value::Null);
    // cudart's first request, the empty name (the key keeps it as "").
    assert_eq!(r["procaddr \"\" 0 0"]["status"], 1, "{r}");
    assert_eq!(r["export 6bd5fb6c-5bf4-e74a-8987-d93912fd9df9"]["rc"], 0);
    // Per-machine figures are apart from the answers (never compared).
    let a = v["answers"].as_object().unwrap();
    assert!(a.len() > 150, "{} answers", a.len());
    assert!(!a.contains_key("total_mem") && v["machine"]["total_mem"].is_u64());
    // A misuse answer, as the driver documents it.
    assert_eq!(a["alloc.cuMemFree_v2(double)"], 1);
}

#[test]
fn the_fake_answers_as_every_recorded_real_driver() {
    let dir = root().join("tests/driver-answers");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "json"));
    files.sort();
    if files.is_empty() {
        eprintln!(
            "no real driver's answers recorded in {} yet (scripts/gpu/probe-driver.sh on a GPU)",
            dir.display()
        );
    }
    for f in files {
        let errors = compare_file(&f);
        assert!(
            errors.is_empty(),
            "the fake differs from {} ({} differences; fix the fake or list each in the file's \
             \"accepted\" with why):\n{}",
            f.display(),
            errors.len(),
            errors.join("\n")
        );
    }
}

/// A hand-made "real" file in a scratch directory (never committed): the fake's own
/// answers with one answer and one request changed. The comparison must name exactly
/// those, accept them once listed, and call an accepted entry that matches stale.
#[test]
fn a_planted_difference_fails_the_comparison() {
    let dir = scratch("driver-answers-planted");
    let req = dir.join("requests.txt");
    std::fs::write(&req, SOME_REQUESTS).unwrap();
    let (mut planted, _) = fake_answers(Some(&req), &[]);
    let file = dir.join("planted-gpu-000.00.json");
    let write =
        |v: &Value| std::fs::write(&file, serde_json::to_string_pretty(v).unwrap()).unwrap();
    write(&planted);
    assert_eq!(
        compare_file(&file),
        Vec::<String>::new(),
        "control: the fake against itself"
    );

    // The fake runs as the recorded machine: where a context takes 64 MiB, the answers
    // about contexts are those of a fake whose contexts take 64 MiB.
    planted["machine"]["context.second_context_takes"] = json!(64 << 20);
    planted["answers"]["context.free_below_total"] = json!(true);
    for k in [
        "context.second_context_lowers_free",
        "context.nvml.used_rises_with_context",
        "context.nvml.after.own_pid_listed",
        "context.nvml.alloc_256MiB.own_used_rises_by_at_least_256MiB",
    ] {
        planted["answers"][k] = json!(true);
    }
    write(&planted);
    assert_eq!(
        compare_file(&file),
        Vec::<String>::new(),
        "configured as the machine"
    );

    planted["answers"]["alloc.cuMemFree_v2(double)"] = json!(700);
    planted["requests"]["procaddr cuMemAllocAsync 12000 2"]["rc"] = json!(500);
    planted["answers"]["vmm.granularity.only_on_the_real_gpu"] = json!(1);
    write(&planted);
    let errors = compare_file(&file);
    assert_eq!(errors.len(), 3, "{errors:#?}");
    assert!(
        errors[0].starts_with(
            "answers.alloc.cuMemFree_v2(double): real Some(Number(700)), fake Some(Number(1))"
        ),
        "{errors:#?}"
    );
    assert!(
        errors[1].starts_with("answers.vmm.granularity.only_on_the_real_gpu: real Some"),
        "{errors:#?}"
    );
    assert!(
        errors[2].starts_with("requests.procaddr cuMemAllocAsync 12000 2: rc: real 500, fake 0"),
        "{errors:#?}"
    );

    // Listed with why: accepted. Listed without why: a shape error.
    planted["accepted"] = json!([
        {"key": "answers.alloc.cuMemFree_v2(double)", "why": "planted"},
        {"key": "answers.vmm.granularity.only_on_the_real_gpu", "why": "planted"},
        {"key": "requests.procaddr cuMemAllocAsync 12000 2", "why": "planted"},
    ]);
    write(&planted);
    assert_eq!(compare_file(&file), Vec::<String>::new());
    planted["accepted"][0]["why"] = json!("");
    write(&planted);
    assert!(compare_file(&file)[0].starts_with("shape: accepted entry"));

    // An accepted entry for an answer that matches is stale.
    planted["accepted"][0]["why"] = json!("planted");
    planted["accepted"]
        .as_array_mut()
        .unwrap()
        .push(json!({"key": "answers.alloc.cuMemAlloc_v2(0)", "why": "not different"}));
    write(&planted);
    let errors = compare_file(&file);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].contains("no longer") || errors[0].contains("now answers"),
        "{errors:#?}"
    );

    // A group that crashed on the real driver (where the fake answers) is a difference.
    planted["accepted"].as_array_mut().unwrap().pop();
    let answers = planted["answers"].as_object_mut().unwrap();
    answers.remove("null.6.done");
    answers.insert("null.6.crashed".into(), json!("signal 11"));
    write(&planted);
    let errors = compare_file(&file);
    assert_eq!(
        errors,
        [
            "answers.null.6.crashed: real Some(String(\"signal 11\")), fake None",
            "answers.null.6.done: real None, fake Some(Bool(true))"
        ],
        "{errors:#?}"
    );
    // Neither finished nor crashed: a shape error.
    planted["answers"]
        .as_object_mut()
        .unwrap()
        .remove("null.6.crashed");
    write(&planted);
    let want = "shape: group null.6: expected either null.6.done or null.6.crashed";
    assert!(compare_file(&file).iter().any(|e| e == want));
}

/// `GPUCAP_LOG=debug` names each `cuGetProcAddress` and `cuGetExportTable` request and
/// the driver's answer (probe-driver.sh collects them); other levels do not.
#[test]
fn the_shim_names_the_drivers_requests_at_debug() {
    let req = scratch("driver-answers-log").join("requests.txt");
    std::fs::write(&req, SOME_REQUESTS).unwrap();
    let shim = shim();
    let shim = shim.to_str().unwrap();
    let debug = [("LD_PRELOAD", shim), ("GPUCAP_LOG", "debug")];
    let (v, err) = fake_answers(Some(&req), &debug);
    assert_eq!(shape_errors(&v), Vec::<String>::new());
    for want in [
        "gpucap: driver request: procaddr \"\" 0 0 -> 0",
        "gpucap: driver request: procaddr cuMemAlloc 12000 0 -> 0",
        "gpucap: driver request: procaddr cuMemAllocAsync 12000 2 -> 0",
        "gpucap: driver request: procaddr cuNoSuchEntryPoint 12000 0 -> 0",
        "gpucap: driver request: export 6bd5fb6c-5bf4-e74a-8987-d93912fd9df9 -> 0",
    ] {
        assert!(err.lines().any(|l| l == want), "no line {want:?} in\n{err}");
    }
    // The shim forwards them untouched: the same answers as without it.
    assert_eq!(v["requests"], fake_answers(Some(&req), &[]).0["requests"]);
    let (_, err) = fake_answers(Some(&req), &[("LD_PRELOAD", shim), ("GPUCAP_LOG", "info")]);
    assert!(!err.contains("driver request:"), "{err}");
}

/// scripts/gpu/probe-driver.sh on the fake: the JSON it writes has the comparison's
/// shape, and with cuda-bindings 13 (GPUCAP_TEST_PYTHON_CB13) the requests it collected
/// through the shim's log are those of the client, asked of the driver.
#[test]
fn probe_driver_sh_writes_the_file_a_gpu_session_commits() {
    let out = scratch("probe-driver-sh");
    let mut c = fake_cmd(
        root().join("scripts/gpu/probe-driver.sh"),
        &out.join("stats.json"),
    );
    c.arg(&out).env("PROBE_SHIM", shim());
    let python = client_python("GPUCAP_TEST_PYTHON_CB13", "cuda-bindings 13");
    match &python {
        Some(p) => c
            .env("PROBE_PYTHON", p)
            .env("PROBE_CLIENTS", "torch cuda.bindings"),
        None => c.env("PROBE_CLIENTS", ""),
    };
    let o = run(&mut c);
    assert!(o.status.success(), "{}", dump(&o));
    let path = out.join("driver-answers.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(shape_errors(&v), Vec::<String>::new());
    let log = std::fs::read_to_string(out.join("driver-probe.log")).unwrap();
    if python.is_some() {
        assert!(log.contains("torch: SKIP"), "{log}");
        let r = v["requests"].as_object().unwrap();
        // cuda-bindings 13 asks for every entry point it wraps (ground truth:
        // shared/reference/procaddr/bindings13.procaddr.txt has 526).
        assert!(r.len() > 400, "{} requests\n{log}", r.len());
        // Exactly the requests recorded from cuda-bindings 13 independently (the left
        // side of ../shared/reference/procaddr/bindings13.procaddr.txt), where present.
        let reference = root().join("../shared/reference/procaddr/bindings13.procaddr.txt");
        if let Ok(text) = std::fs::read_to_string(&reference) {
            let want: BTreeSet<String> = text
                .lines()
                .filter_map(|l| l.strip_prefix("cuGetProcAddress_v2(\""))
                .filter_map(|l| {
                    let (name, rest) = l.split_once("\", ver=")?;
                    let (ver, rest) = rest.split_once(", flags=")?;
                    let flags = rest.split_once(')')?.0;
                    let name = if name.is_empty() { "\"\"" } else { name };
                    Some(format!("procaddr {name} {ver} {flags}"))
                })
                .collect();
            let got: BTreeSet<String> = r.keys().cloned().collect();
            assert_eq!(got, want, "requests logged vs {}", reference.display());
        }
        let m = &r["procaddr cuMemAlloc 3020 0"];
        assert_eq!(m["asked_by"], json!(["cuda.bindings"]), "{m}");
        assert_eq!(m["export"], "cuMemAlloc_v2", "{m}");
    }
    // The file compares clean against the fake that wrote it.
    assert_eq!(compare_file(&path), Vec::<String>::new());
}
