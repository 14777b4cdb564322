//! The Kubernetes examples, `scripts/k8s/*.yaml` (docs/src/kubernetes.md):
//!
//! - every document is a valid object of the Kubernetes API, version [`KUBERNETES_VERSION`],
//!   checked strictly and offline by `scripts/k8s/validate.py` (the `kubernetes-validate`
//!   package, which bundles the API's schemas: an unknown field, a wrong type, an unknown
//!   kind are errors), and the same validator rejects manifests broken on purpose;
//! - the NVIDIA device plugin's configuration inside the time-slicing ConfigMap has the
//!   plugin's v1 structure (checked key by key: the plugin itself ignores unknown keys, so a
//!   typo there would silently mean no sharing) and replicates `nvidia.com/gpu` 3 times, as
//!   many as the Deployment has pods;
//! - every `GPUCAP_*` / `CUDA_DEVICE_MEMORY_*` variable the manifests set, with the value
//!   Kubernetes would give it (downward API and `$(VAR)` references resolved), is accepted
//!   by `gpucap check` on the fake GPU, and gives every GPU container a cap; a pod that lacks
//!   the annotation its cap comes from is refused; the caps of the time-sliced pods fit the
//!   GPU they are pinned to;
//! - the containers of the shared-pool pod name one pool, in one memory-backed `emptyDir`
//!   mounted where `GPUCAP_POOL_DIR` says, and run as one uid;
//! - the metrics sidecar reads the trainer's pool (the same checks), listens on every
//!   interface on the port the `prometheus.io/*` annotations and its liveness probe name,
//!   and, run on the fake GPU with the environment the pod gives it, serves the pool of a
//!   member started with the trainer's environment.
//!
//! The validator runs in the Python of `GPUCAP_TEST_PYTHON_K8S` (scripts/test.sh creates
//! target/venv-k8s with pinned versions). When that is unset the tests print `SKIP: ...` and
//! pass, as the other tests of real clients do, unless `GPUCAP_TEST_REQUIRE_CLIENTS=1` or
//! `CI` is set: then a missing validator fails them.

use super::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;
use serde_json::{Value, json};

/// The Kubernetes version whose API schema the examples are validated against.
const KUBERNETES_VERSION: &str = "1.32.0";

/// The examples docs/src/kubernetes.md describes; a missing one fails the tests.
const EXAMPLES: &[&str] = &[
    "pod-annotation.yaml",
    "pod-env.yaml",
    "pod-guarantees.yaml",
    "pod-metrics-sidecar.yaml",
    "pod-shared-pool.yaml",
    "three-pods-8gi.yaml",
    "time-slicing-configmap.yaml",
];

/// Variables the manifests set that `gpucap check` cannot validate yet on this branch.
/// Variables whose value is a path inside the pod (a volume's mount point): `gpucap
/// check` gets a scratch directory instead, the same for every container of a pod, so
/// their pool is checked as it will be resolved there (name, permissions, no file yet).
const POD_PATHS: &[&str] = &["GPUCAP_POOL_DIR"];

/// A lower bound of the memory of the GPUs the examples pin pods to (by the `nvidia.com/gpu.product`
/// label of NVIDIA's GPU Feature Discovery): the size they are sold with, in decimal GB.
const GPU_MEMORY: &[(&str, u64)] = &[("NVIDIA-A100-SXM4-40GB", 40_000_000_000)];

/// The Python of the validator's virtual environment, or `None` (after SKIP) outside CI.
fn k8s_python() -> Option<PathBuf> {
    client_python("GPUCAP_TEST_PYTHON_K8S", "kubernetes-validate")
}

/// `scripts/k8s/*.yaml`, sorted.
fn example_files() -> Vec<PathBuf> {
    let dir = root().join("scripts/k8s");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    let names: BTreeSet<String> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for want in EXAMPLES {
        assert!(names.contains(*want), "scripts/k8s/{want} is missing");
    }
    files
}

/// `validate.py --json` over `files`: its output and the JSON it printed.
fn validate(python: &Path, files: &[PathBuf]) -> (Output, Value) {
    let o = run(Command::new(python)
        .arg(root().join("scripts/k8s/validate.py"))
        .args(["--kubernetes-version", KUBERNETES_VERSION, "--json"])
        .args(files));
    let report: Value = serde_json::from_str(&stdout(&o))
        .unwrap_or_else(|e| panic!("validate.py printed no JSON ({e})\n{}", dump(&o)));
    (o, report)
}

/// The examples, validated (the test fails unless every one is valid).
fn examples(python: &Path) -> Vec<Value> {
    let (o, report) = validate(python, &example_files());
    assert_eq!(o.status.code(), Some(0), "{}", dump(&o));
    assert_eq!(report["kubernetes_version"], KUBERNETES_VERSION);
    report["documents"].as_array().unwrap().clone()
}

fn file_name(doc: &Value) -> String {
    Path::new(doc["file"].as_str().unwrap())
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// The documents of the example `name`.
fn docs_of<'a>(docs: &'a [Value], name: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| file_name(d) == name).collect()
}

#[test]
fn examples_are_valid_kubernetes_objects() {
    let Some(python) = k8s_python() else { return };
    let docs = examples(&python);
    let kinds: BTreeMap<String, Vec<String>> = EXAMPLES
        .iter()
        .map(|f| {
            let kinds = docs_of(&docs, f)
                .iter()
                .map(|d| d["kind"].as_str().unwrap().to_string())
                .collect();
            (f.to_string(), kinds)
        })
        .collect();
    let expect = |f: &str, k: &[&str]| {
        assert_eq!(kinds[f], k, "scripts/k8s/{f}: kinds");
    };
    expect("pod-env.yaml", &["Pod"]);
    expect("pod-annotation.yaml", &["Pod"]);
    expect("pod-shared-pool.yaml", &["Pod"]);
    expect("pod-guarantees.yaml", &["Pod"]);
    expect("pod-metrics-sidecar.yaml", &["Pod"]);
    expect("time-slicing-configmap.yaml", &["ConfigMap"]);
    expect("three-pods-8gi.yaml", &["Deployment"]);
}

/// The negative control: manifests broken in the ways a hand edit breaks them are refused
/// by the same validator, each with a line naming the file and what is wrong, while an
/// intact copy of an example passes in the same run.
#[test]
fn the_validator_rejects_invalid_manifests() {
    let Some(python) = k8s_python() else { return };
    let dir = scratch("k8s-invalid");
    let original = std::fs::read_to_string(root().join("scripts/k8s/pod-env.yaml")).unwrap();
    let mutate = |from: &str, to: &str| {
        assert!(original.contains(from), "pod-env.yaml has no {from:?}");
        original.replacen(from, to, 1)
    };
    // (file, content, what the error line must contain)
    let cases: Vec<(&str, String, &str)> = vec![
        // a typo'd field name: strict validation knows no `resource` in a container
        (
            "typo.yaml",
            mutate("      resources:\n", "      resource:\n"),
            "'resource' was unexpected",
        ),
        // a wrong type: environment values are strings, `8` is a number
        (
            "type.yaml",
            mutate("value: \"8Gi\"", "value: 8"),
            "is not of type 'string'",
        ),
        // a list where an object is expected
        (
            "shape.yaml",
            mutate("      emptyDir: {}", "      emptyDir: []"),
            "volumes[0].emptyDir",
        ),
        // an unknown kind
        (
            "kind.yaml",
            mutate("kind: Pod", "kind: Pood"),
            "unknown kind",
        ),
        // a key given twice: YAML parsers keep the last one silently
        (
            "twice.yaml",
            mutate(
                "  restartPolicy: Never\n",
                "  restartPolicy: Never\n  restartPolicy: Always\n",
            ),
            "twice",
        ),
        // no name
        (
            "noname.yaml",
            mutate("  name: train-env\n", ""),
            "metadata.name",
        ),
    ];
    let mut files = Vec::new();
    for (name, content, _) in &cases {
        let p = dir.join(name);
        std::fs::write(&p, content).unwrap();
        files.push(p);
    }
    let intact = dir.join("intact.yaml");
    std::fs::write(&intact, &original).unwrap();
    files.push(intact);

    let (o, report) = validate(&python, &files);
    assert_eq!(o.status.code(), Some(1), "{}", dump(&o));
    let errors: Vec<&str> = report["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    for (name, _, why) in &cases {
        let path = dir.join(name);
        let path = path.to_str().unwrap();
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with(&format!("{path}:")) && e.contains(why)),
            "{name} should be refused with {why:?}; errors: {errors:#?}"
        );
        assert!(
            stderr(&o)
                .lines()
                .any(|l| l.starts_with(&format!("error {path}:"))),
            "no error line for {name}\n{}",
            dump(&o)
        );
    }
    assert_eq!(errors.len(), cases.len(), "{errors:#?}");
    let valid: Vec<&str> = report["documents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["file"].as_str().unwrap())
        .collect();
    assert_eq!(valid, [dir.join("intact.yaml").to_str().unwrap()]);
}

// ---------------------------------------------------------------------------
// The device plugin's configuration.

/// Keys of a mapping, or an error naming `what`.
fn keys<'a>(v: &'a Value, what: &str) -> Result<Vec<&'a str>, String> {
    v.as_object()
        .map(|m| m.keys().map(String::as_str).collect())
        .ok_or_else(|| format!("{what} is not a mapping: {v}"))
}

/// Every key of `v` is one the device plugin knows at `what`.
fn known_keys(v: &Value, what: &str, known: &[&str]) -> Result<(), String> {
    for k in keys(v, what)? {
        if !known.contains(&k) {
            return Err(format!(
                "{what}: unknown key {k:?} (the device plugin would ignore it); known: {known:?}"
            ));
        }
    }
    Ok(())
}

/// Checks the device plugin's configuration (config v1, k8s-device-plugin api/config/v1:
/// Config, Sharing, ReplicatedResources, ReplicatedResource) for time-slicing of
/// `nvidia.com/gpu` under its own name, and returns its number of replicas.
fn time_slicing_replicas(config: &Value) -> Result<u64, String> {
    known_keys(
        config,
        "config",
        &["version", "flags", "resources", "sharing", "imex"],
    )?;
    if config["version"] != "v1" {
        return Err(format!("version is {}, not v1", config["version"]));
    }
    if let Some(mig) = config["flags"].get("migStrategy")
        && !["none", "single", "mixed"].contains(&mig.as_str().unwrap_or(""))
    {
        return Err(format!(
            "flags.migStrategy {mig} is not none, single or mixed"
        ));
    }
    let sharing = &config["sharing"];
    known_keys(sharing, "sharing", &["timeSlicing", "mps"])?;
    if sharing.get("mps").is_some() {
        return Err("sharing.mps is set: MPS and time-slicing are exclusive".into());
    }
    let ts = &sharing["timeSlicing"];
    known_keys(
        ts,
        "sharing.timeSlicing",
        &[
            "strategy",
            "renameByDefault",
            "failRequestsGreaterThanOne",
            "resources",
        ],
    )?;
    for flag in ["renameByDefault", "failRequestsGreaterThanOne"] {
        if let Some(v) = ts.get(flag)
            && !v.is_boolean()
        {
            return Err(format!("sharing.timeSlicing.{flag} is {v}, not a boolean"));
        }
    }
    if ts.get("renameByDefault") == Some(&Value::Bool(true)) {
        return Err(
            "renameByDefault: true advertises nvidia.com/gpu.shared, which the pods do not request"
                .into(),
        );
    }
    let resources = ts["resources"]
        .as_array()
        .filter(|r| !r.is_empty())
        .ok_or("sharing.timeSlicing.resources is not a non-empty list")?;
    let mut gpu = None;
    for (i, r) in resources.iter().enumerate() {
        let what = format!("sharing.timeSlicing.resources[{i}]");
        known_keys(r, &what, &["name", "rename", "devices", "replicas"])?;
        let replicas = r["replicas"].as_u64().filter(|&n| n >= 1).ok_or(format!(
            "{what}.replicas is {}, not a whole number >= 1",
            r["replicas"]
        ))?;
        if r["name"] == "nvidia.com/gpu" && r.get("rename").is_none() {
            gpu = Some(replicas);
        }
    }
    gpu.ok_or("no resource nvidia.com/gpu (under its own name) is time-sliced".into())
}

/// The device plugin's configuration: the one value of the ConfigMap's data, parsed with
/// the validator's strict YAML loader.
fn device_plugin_config(python: &Path, configmap: &Value) -> Value {
    let data = configmap["data"]
        .as_object()
        .expect("the ConfigMap has data");
    assert_eq!(data.len(), 1, "one configuration, under one key: {data:?}");
    let (key, text) = data.iter().next().unwrap();
    assert_eq!(
        key, "any",
        "the key docs/src/kubernetes.md and the helm command name"
    );
    let script = "import json, sys; sys.path.insert(0, sys.argv[1]); import yaml; \
                  from validate import StrictLoader; \
                  print(json.dumps(yaml.load(sys.argv[2], Loader=StrictLoader)))";
    let o = run(Command::new(python)
        .args(["-c", script])
        .arg(root().join("scripts/k8s"))
        .arg(text.as_str().expect("a text value")));
    assert_ok(&o);
    serde_json::from_str(&stdout(&o)).unwrap()
}

#[test]
fn the_device_plugin_time_slices_each_gpu_for_the_three_pods() {
    let Some(python) = k8s_python() else { return };
    let docs = examples(&python);
    let cm = docs_of(&docs, "time-slicing-configmap.yaml");
    let config = device_plugin_config(&python, &cm[0]["doc"]);
    let replicas = time_slicing_replicas(&config).unwrap_or_else(|e| panic!("{e}\n{config:#}"));
    assert_eq!(replicas, 3, "one GPU, three pods");

    // The Deployment has as many pods as a GPU has replicas, each asking for one replica.
    let deploy = &docs_of(&docs, "three-pods-8gi.yaml")[0]["doc"];
    assert_eq!(deploy["spec"]["replicas"].as_u64(), Some(replicas));
    for c in deploy["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
    {
        assert_eq!(gpus(c), 1, "container {}", c["name"]);
    }

    // The checker is not a rubber stamp: the mistakes the plugin would take silently.
    let broken = |edit: &dyn Fn(&mut Value)| {
        let mut c = config.clone();
        edit(&mut c);
        time_slicing_replicas(&c)
    };
    fn ts(c: &mut Value) -> &mut Value {
        &mut c["sharing"]["timeSlicing"]
    }
    for (what, result) in [
        (
            "timeslicing (a typo)",
            broken(&|c| {
                let v = c["sharing"]
                    .as_object_mut()
                    .unwrap()
                    .remove("timeSlicing")
                    .unwrap();
                c["sharing"]["timeslicing"] = v;
            }),
        ),
        (
            "replicas as a string",
            broken(&|c| ts(c)["resources"][0]["replicas"] = json!("3")),
        ),
        (
            "replicas 0",
            broken(&|c| ts(c)["resources"][0]["replicas"] = json!(0)),
        ),
        (
            "renameByDefault",
            broken(&|c| ts(c)["renameByDefault"] = json!(true)),
        ),
        (
            "another resource",
            broken(&|c| ts(c)["resources"][0]["name"] = json!("nvidia.com/mig-1g.5gb")),
        ),
        (
            "replica typo",
            broken(&|c| {
                let r = ts(c)["resources"][0].as_object_mut().unwrap();
                let n = r.remove("replicas").unwrap();
                r.insert("replica".into(), n);
            }),
        ),
        ("version", broken(&|c| c["version"] = json!("v2"))),
        (
            "mps too",
            broken(&|c| c["sharing"]["mps"] = json!({"resources": []})),
        ),
    ] {
        assert!(result.is_err(), "{what}: accepted");
    }
}

// ---------------------------------------------------------------------------
// What each container gets.

/// A container's `nvidia.com/gpu` (limits, or requests).
fn gpus(container: &Value) -> u64 {
    let r = &container["resources"];
    let q = r["limits"]
        .get("nvidia.com/gpu")
        .or_else(|| r["requests"].get("nvidia.com/gpu"));
    match q {
        None => 0,
        Some(Value::Number(n)) => n.as_u64().expect("a whole number of GPUs"),
        Some(Value::String(s)) => s.parse().expect("a whole number of GPUs"),
        Some(v) => panic!("nvidia.com/gpu: {v}"),
    }
}

/// One pod as Kubernetes would make it from a document: its metadata and spec.
struct PodShape<'a> {
    /// `file: kind/name`, for messages.
    label: String,
    name: String,
    /// How many such pods there are (a Deployment's replicas).
    replicas: u64,
    meta: &'a Value,
    spec: &'a Value,
}

fn pods(docs: &[Value]) -> Vec<PodShape<'_>> {
    let mut out = Vec::new();
    for d in docs {
        let doc = &d["doc"];
        let label = format!(
            "{}: {}/{}",
            file_name(d),
            d["kind"].as_str().unwrap(),
            d["name"].as_str().unwrap()
        );
        let name = d["name"].as_str().unwrap().to_string();
        match d["kind"].as_str().unwrap() {
            "Pod" => out.push(PodShape {
                label,
                name,
                replicas: 1,
                meta: &doc["metadata"],
                spec: &doc["spec"],
            }),
            "ConfigMap" => {}
            _ => {
                let t = &doc["spec"]["template"];
                assert!(t.is_object(), "{label}: which pods does it make?");
                // The pods of a workload are named after it, with a suffix.
                let name = format!("{name}-7d4b9c8f6-x2x9q");
                let replicas = doc["spec"]["replicas"].as_u64().unwrap_or(1);
                out.push(PodShape {
                    label,
                    name,
                    replicas,
                    meta: &t["metadata"],
                    spec: &t["spec"],
                })
            }
        }
    }
    out
}

/// Kubernetes' `$(VAR)` expansion in an env value: a reference to a variable defined
/// earlier in the list is replaced, `$$` is one `$`, anything else stays as written.
fn expand(value: &str, earlier: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        if let Some(r) = rest.strip_prefix("$$") {
            out.push('$');
            rest = r;
        } else if let Some(r) = rest.strip_prefix("$(")
            && let Some(end) = r.find(')')
            && let Some((_, v)) = earlier.iter().rev().find(|(k, _)| k == &r[..end])
        {
            out.push_str(v);
            rest = &r[end + 1..];
        } else {
            out.push('$');
            rest = &rest[1..];
        }
    }
    out.push_str(rest);
    out
}

/// A container's environment as Kubernetes would set it, in order.
fn container_env(pod: &PodShape, c: &Value) -> Vec<(String, String)> {
    assert!(
        c.get("envFrom").is_none(),
        "{}: envFrom is not resolved by this test",
        pod.label
    );
    let mut env: Vec<(String, String)> = Vec::new();
    for e in c["env"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let name = e["name"].as_str().unwrap().to_string();
        let value = if let Some(v) = e.get("value") {
            expand(v.as_str().unwrap_or(""), &env)
        } else if let Some(path) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            let subscript = |field: &str| {
                path.strip_prefix(&format!("metadata.{field}['"))
                    .and_then(|r| r.strip_suffix("']"))
            };
            if path == "metadata.name" {
                pod.name.clone()
            } else if let Some(key) = subscript("annotations") {
                // The downward API gives "" for a key the pod does not have.
                pod.meta["annotations"][key]
                    .as_str()
                    .unwrap_or("")
                    .to_string()
            } else if let Some(key) = subscript("labels") {
                pod.meta["labels"][key].as_str().unwrap_or("").to_string()
            } else {
                panic!(
                    "{}: {name}: fieldPath {path} is not resolved by this test",
                    pod.label
                )
            }
        } else {
            panic!("{}: {name}: {e} is not resolved by this test", pod.label)
        };
        env.push((name, value));
    }
    env
}

fn is_gpucap_var(name: &str) -> bool {
    name.starts_with("GPUCAP_") || name.starts_with("CUDA_DEVICE_MEMORY_")
}

/// `gpucap check` with `vars`, on a fake GPU of `gpus` devices of `memory` bytes each.
fn gpucap_check(vars: &[(String, String)], gpus: u64, memory: u64, tag: &str) -> Output {
    let dir = scratch(tag);
    let mut cmd = fake_cmd(cli(), &dir.join("stats.json"));
    cmd.arg("check")
        .env("FAKECUDA_DEVICES", gpus.max(1).to_string())
        .env("FAKECUDA_TOTAL_MEM", memory.to_string());
    for (k, v) in vars {
        cmd.env(k, v);
    }
    run(&mut cmd)
}

/// The `GPU <n>: cap <bytes> bytes` figures of `gpucap check`.
fn caps(o: &Output) -> Vec<u64> {
    stdout(o)
        .lines()
        .filter_map(|l| l.strip_prefix("GPU "))
        .filter_map(|l| l.split_once(": cap ").map(|(_, r)| r))
        .map(|r| r.split_whitespace().next().unwrap().parse().unwrap())
        .collect()
}

/// Every GPUCAP_* / CUDA_DEVICE_MEMORY_* variable of every container, with the value
/// Kubernetes would give it, is accepted by `gpucap check`; every container that gets a
/// GPU gets a cap; no container replaces the image's entrypoint; every such variable named
/// anywhere in the files (comments included) is one a container sets.
#[test]
fn gpucap_accepts_what_the_manifests_set() {
    let Some(python) = k8s_python() else { return };
    let docs = examples(&python);
    let mut checked: BTreeSet<String> = BTreeSet::new();
    let mut containers = 0;
    for pod in pods(&docs) {
        let product = pod.spec["nodeSelector"]["nvidia.com/gpu.product"].as_str();
        let pinned = product.is_some();
        let memory = product.map_or(80 << 30, |p| {
            GPU_MEMORY
                .iter()
                .find(|(name, _)| *name == p)
                .unwrap_or_else(|| panic!("{}: how much memory has a {p}?", pod.label))
                .1
        });
        let pod_dir = scratch("k8s-pod");
        for c in pod.spec["containers"].as_array().unwrap() {
            let what = format!("{} container {}", pod.label, c["name"]);
            assert!(
                c.get("command").is_none(),
                "{what}: `command` replaces the image's ENTRYPOINT (gpucap's entrypoint): use args"
            );
            let vars: Vec<(String, String)> = container_env(&pod, c)
                .into_iter()
                .filter(|(k, _)| is_gpucap_var(k))
                .collect();
            let vars: Vec<(String, String)> = vars
                .into_iter()
                .map(|(k, v)| {
                    if POD_PATHS.contains(&k.as_str()) {
                        assert!(v.starts_with('/'), "{what}: {k}={v} must be absolute");
                        let d = pod_dir.join(v.trim_start_matches('/'));
                        std::fs::create_dir_all(&d).unwrap();
                        (k, d.display().to_string())
                    } else {
                        (k, v)
                    }
                })
                .collect();
            let gpus = gpus(c);
            let o = gpucap_check(&vars, gpus, memory, "k8s-check");
            if vars.iter().any(|(k, _)| k == "GPUCAP_POOL") {
                assert!(
                    stdout(&o).contains("pool:") && !stdout(&o).contains("pool: none"),
                    "{what}: check shows the pool\n{}",
                    dump(&o)
                );
            }
            assert_eq!(o.status.code(), Some(0), "{what}: {vars:?}\n{}", dump(&o));
            if gpus > 0 {
                let caps = caps(&o);
                assert_eq!(
                    caps.len() as u64,
                    gpus,
                    "{what}: a cap for every GPU\n{}",
                    dump(&o)
                );
                // Pinned to a GPU model: all the pods may land on one GPU (time-slicing
                // gives each GPU as many replicas), so their caps together must fit it.
                if pinned {
                    for cap in &caps {
                        assert!(
                            cap * pod.replicas <= memory,
                            "{what}: {} pods of {cap} bytes do not fit a GPU of {memory} bytes",
                            pod.replicas
                        );
                    }
                }
            }
            checked.extend(vars.into_iter().map(|(k, _)| k));
            containers += 1;
        }
    }
    assert!(
        containers >= 7,
        "{containers} containers: 1 + 1 + 2 + 2 + 1 expected"
    );

    // Names in the text (comments too) are names a container sets, so checked above.
    for f in example_files() {
        let text = std::fs::read_to_string(&f).unwrap();
        let words = text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
        // (`GPUCAP_*` is the family, not a name.)
        let names = words.filter(|w| is_gpucap_var(w) && !w.ends_with('_'));
        for word in names {
            assert!(
                checked.contains(word),
                "{}: names {word}, which no container sets (a typo?); set: {checked:?}",
                f.display()
            );
        }
    }
}

/// The annotation pod takes its cap from the annotation, and without it does not start.
#[test]
fn the_cap_comes_from_the_annotation_or_the_pod_does_not_start() {
    let Some(python) = k8s_python() else { return };
    let docs = examples(&python);
    let all = pods(&docs);
    let pod = all
        .iter()
        .find(|p| p.label.starts_with("pod-annotation.yaml"))
        .unwrap();
    let c = &pod.spec["containers"][0];
    let annotation = pod.meta["annotations"]["gpucap.io/limit"].as_str().unwrap();
    let env = container_env(pod, c);
    let limit = env.iter().find(|(k, _)| k == "GPUCAP_LIMIT").unwrap();
    assert_eq!(
        limit.1, annotation,
        "GPUCAP_LIMIT comes from the annotation"
    );
    assert_eq!(
        c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.annotations['gpucap.io/limit']"
    );

    // The value it resolves to is accepted, and caps the pod's GPU.
    let from_annotation = gpucap_check(&env, 1, 80 << 30, "k8s-annotation");
    assert_ok(&from_annotation);
    assert_eq!(caps(&from_annotation).len(), 1);

    // Without the annotation the downward API gives "": refused, exit status 2, the
    // message names the variable (the entrypoint stops the container with it).
    let bare_meta = json!({"name": pod.name});
    let bare = PodShape {
        label: pod.label.clone(),
        name: pod.name.clone(),
        replicas: 1,
        meta: &bare_meta,
        spec: pod.spec,
    };
    let env = container_env(&bare, c);
    assert_eq!(env, [("GPUCAP_LIMIT".to_string(), String::new())]);
    let o = gpucap_check(&env, 1, 80 << 30, "k8s-no-annotation");
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(stderr(&o).contains("GPUCAP_LIMIT"), "{}", dump(&o));
}

// ---------------------------------------------------------------------------
// Guarantees and ceilings.

/// `NGi` in bytes (the guarantees pod writes its figures so).
fn gib(v: &str) -> u64 {
    let n: u64 = v
        .strip_suffix("Gi")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{v:?} is not a whole number of Gi"));
    n << 30
}

/// The guarantees pod: one shared pool; each container's guarantee and ceiling come
/// from its annotations, are accepted by `gpucap check` and fit the cap together; a pod
/// without them does not start; and on the fake GPU, with the environment the pod gives
/// them, the trainer bursts to all but the notebook's unused guarantee, which the
/// notebook then gets.
#[test]
fn the_guarantees_pod_takes_its_figures_from_annotations_and_they_hold() {
    let Some(python) = k8s_python() else { return };
    let docs = examples(&python);
    let all = pods(&docs);
    let pod = all
        .iter()
        .find(|p| p.label.starts_with("pod-guarantees.yaml"))
        .unwrap();
    let n = check_shared_pool(&pod.label, pod.spec).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(n, 2);
    let pool_dir = scratch("k8s-guarantees");
    let mut given = 0;
    let mut envs = BTreeMap::new();
    for c in pod.spec["containers"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let env: Vec<(String, String)> = container_env(pod, c)
            .into_iter()
            .filter(|(k, _)| is_gpucap_var(k))
            .map(|(k, v)| match k.as_str() {
                "GPUCAP_POOL_DIR" => (k, pool_dir.display().to_string()),
                _ => (k, v),
            })
            .collect();
        let get = |var: &str| env.iter().find(|(k, _)| k == var).map(|(_, v)| v.clone());
        for (var, key) in [
            ("GPUCAP_GUARANTEE", "guarantee"),
            ("GPUCAP_CEILING", "ceiling"),
        ] {
            let annotation = pod.meta["annotations"][format!("gpucap.io/{key}.{name}")]
                .as_str()
                .unwrap_or_else(|| panic!("{name}: no {key} annotation"));
            assert_eq!(get(var).as_deref(), Some(annotation), "{name}: {var}");
        }
        let guarantee = gib(&get("GPUCAP_GUARANTEE").unwrap());
        assert!(guarantee <= gib(&get("GPUCAP_CEILING").unwrap()));
        assert!(gib(&get("GPUCAP_CEILING").unwrap()) <= gib(&get("GPUCAP_LIMIT").unwrap()));
        given += guarantee;
        let o = gpucap_check(&env, 1, 80 << 30, "k8s-guarantees-check");
        assert_ok(&o);
        assert!(
            stdout(&o).contains(&format!("guarantee: {} GiB", guarantee >> 30)),
            "{}",
            dump(&o)
        );
        envs.insert(name.to_string(), env);
    }
    let cap = gib(&envs["notebook"]
        .iter()
        .find(|(k, _)| k == "GPUCAP_LIMIT")
        .unwrap()
        .1);
    assert!(
        given <= cap,
        "the guarantees ({given}) fit the pool's cap ({cap})"
    );

    // Without its annotations a container does not start.
    let bare_meta = json!({"name": pod.name});
    let bare = PodShape {
        label: pod.label.clone(),
        name: pod.name.clone(),
        replicas: 1,
        meta: &bare_meta,
        spec: pod.spec,
    };
    let env = container_env(&bare, &pod.spec["containers"][0]);
    let o = gpucap_check(&env, 1, 80 << 30, "k8s-guarantees-bare");
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    let err = stderr(&o);
    assert!(
        err.contains("invalid GPUCAP_GUARANTEE=\"\"")
            || err.contains("invalid GPUCAP_CEILING=\"\""),
        "{}",
        dump(&o)
    );

    // On the fake GPU: the trainer first fills what it can, then the notebook takes its
    // guarantee. The fake GPU has more than the cap: the pool is what limits them.
    let script = compile_c("script", "", &["-lcuda"]);
    let member = |name: &str, steps: &[&str]| {
        let mut c = fake_cmd(&script, &pool_dir.join(format!("{name}.json")));
        preload(&mut c)
            .env("FAKECUDA_TOTAL_MEM", "24Gi")
            .env("FAKECUDA_SHARED", pool_dir.join("fake-gpu"))
            .envs(envs[name].iter().map(|(k, v)| (k, v)))
            .args(steps);
        c
    };
    let ready = pool_dir.join("notebook-in");
    let full = pool_dir.join("trainer-full");
    let notebook = member(
        "notebook",
        &[
            &format!("touch:{}", ready.display()),
            &format!("wait:{}", full.display()),
            "alloc:4Gi",
            "alloc:3Gi",
        ],
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let start = std::time::Instant::now();
    while !ready.exists() {
        assert!(start.elapsed().as_secs() < 60, "the notebook never joined");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let trainer = run(member(
        "trainer",
        &["fill:1Gi", &format!("touch:{}", full.display())],
    )
    .env("GPUCAP_WAIT", "0"));
    let notebook = notebook.wait_with_output().unwrap();
    assert!(
        stdout(&trainer).lines().any(|l| l == "filled 12"),
        "the trainer bursts to 16Gi less the notebook's unused 4Gi\n{}",
        dump(&trainer)
    );
    let out = stdout(&notebook);
    assert!(
        out.lines().any(|l| l == format!("alloc {} 0", 4u64 << 30)),
        "{}",
        dump(&notebook)
    );
    assert!(
        out.lines().any(|l| l == format!("alloc {} 2", 3u64 << 30)),
        "past the notebook's guarantee, nothing is free (and its ceiling is 6Gi)\n{}",
        dump(&notebook)
    );
}

// ---------------------------------------------------------------------------
// The shared pool.

/// The containers of `spec` that set GPUCAP_POOL_DIR share one pool: at least two of
/// them, the same pool name, directory and cap; the directory is the mount path of one
/// memory-backed emptyDir with a size limit, mounted there in each; one uid for all.
fn check_shared_pool(label: &str, spec: &Value) -> Result<usize, String> {
    let pod = PodShape {
        label: label.into(),
        name: "p".into(),
        replicas: 1,
        meta: &Value::Null,
        spec,
    };
    let mut members = Vec::new();
    for c in spec["containers"].as_array().unwrap() {
        let env: BTreeMap<String, String> = container_env(&pod, c).into_iter().collect();
        if env.contains_key("GPUCAP_POOL_DIR") {
            members.push((c, env));
        }
    }
    if members.len() < 2 {
        return Err(format!(
            "{} container(s) set GPUCAP_POOL_DIR, not 2 or more",
            members.len()
        ));
    }
    let first = &members[0].1;
    let dir = &first["GPUCAP_POOL_DIR"];
    if !dir.starts_with('/') {
        return Err(format!("GPUCAP_POOL_DIR {dir} is not an absolute path"));
    }
    let mut volume = None;
    let mut uid = None;
    for (c, env) in &members {
        let name = &c["name"];
        for var in ["GPUCAP_POOL", "GPUCAP_POOL_DIR", "GPUCAP_LIMIT"] {
            if env.get(var).is_none() || env.get(var) != first.get(var) {
                return Err(format!(
                    "container {name}: {var} is {:?}, not {:?}",
                    env.get(var),
                    first.get(var)
                ));
            }
        }
        let mounts = c["volumeMounts"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        let m = mounts
            .iter()
            .find(|m| {
                m["mountPath"].as_str().map(|p| p.trim_end_matches('/'))
                    == Some(dir.trim_end_matches('/'))
            })
            .ok_or(format!("container {name} mounts nothing at {dir}"))?;
        if m.get("subPath").is_some() || m["readOnly"] == true {
            return Err(format!(
                "container {name}: the pool directory must be the volume itself, writable"
            ));
        }
        if *volume.get_or_insert(&m["name"]) != &m["name"] {
            return Err(format!("container {name} mounts another volume at {dir}"));
        }
        let u = c["securityContext"]["runAsUser"]
            .as_u64()
            .or(spec["securityContext"]["runAsUser"].as_u64())
            .ok_or(format!(
                "container {name}: no runAsUser: the members' uid is the image's, unchecked"
            ))?;
        if *uid.get_or_insert(u) != u {
            return Err(format!(
                "container {name} runs as uid {u}, another member as {}",
                uid.unwrap()
            ));
        }
    }
    let volume = volume.unwrap();
    let v = spec["volumes"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| &v["name"] == volume))
        .ok_or(format!("no volume {volume}"))?;
    if v["emptyDir"]["medium"] != "Memory" {
        return Err(format!(
            "volume {volume} is not an emptyDir with medium: Memory: {v}"
        ));
    }
    if v["emptyDir"].get("sizeLimit").is_none() {
        return Err(format!(
            "volume {volume} has no sizeLimit (it counts in the pod's memory)"
        ));
    }
    Ok(members.len())
}

#[test]
fn the_shared_pool_pod_has_one_directory_and_one_uid() {
    let Some(python) = k8s_python() else { return };
    let docs = examples(&python);
    let all = pods(&docs);
    let pod = all
        .iter()
        .find(|p| p.label.starts_with("pod-shared-pool.yaml"))
        .unwrap();
    let n =
        check_shared_pool(&pod.label, pod.spec).unwrap_or_else(|e| panic!("{}: {e}", pod.label));
    assert_eq!(
        n,
        pod.spec["containers"].as_array().unwrap().len(),
        "every container is a member"
    );
    for c in pod.spec["containers"].as_array().unwrap() {
        assert_eq!(gpus(c), 1, "container {} uses the GPU", c["name"]);
    }

    // The check can fail: each of these breaks the sharing.
    let broken = |edit: &dyn Fn(&mut Value)| {
        let mut spec = pod.spec.clone();
        edit(&mut spec);
        check_shared_pool("broken", &spec)
    };
    let env_of = |s: &mut Value, c: usize, var: &str, v: &str| {
        for e in s["containers"][c]["env"].as_array_mut().unwrap() {
            if e["name"] == var {
                e["value"] = json!(v);
            }
        }
    };
    for (what, result) in [
        (
            "another uid",
            broken(&|s| s["containers"][1]["securityContext"]["runAsUser"] = json!(2000)),
        ),
        (
            "no uid",
            broken(&|s| {
                s.as_object_mut().unwrap().remove("securityContext");
            }),
        ),
        (
            "another directory",
            broken(&|s| env_of(s, 1, "GPUCAP_POOL_DIR", "/dev/shm/gpucap")),
        ),
        (
            "another pool",
            broken(&|s| env_of(s, 1, "GPUCAP_POOL", "evaluator")),
        ),
        (
            "another cap",
            broken(&|s| env_of(s, 1, "GPUCAP_LIMIT", "4Gi")),
        ),
        (
            "disk-backed",
            broken(&|s| {
                for v in s["volumes"].as_array_mut().unwrap() {
                    if let Some(e) = v["emptyDir"].as_object_mut() {
                        e.remove("medium");
                    }
                }
            }),
        ),
        (
            "not mounted",
            broken(&|s| s["containers"][1]["volumeMounts"] = json!([])),
        ),
    ] {
        assert!(result.is_err(), "{what}: accepted");
    }
}

// ---------------------------------------------------------------------------
// The metrics sidecar.

/// The `gpucap metrics` container of a pod: the one whose args are `gpucap metrics ...`
/// (run by gpucap's entrypoint, as every container). Checks that it shares the pool
/// directory and uid of the pool's members ([`check_shared_pool`]), asks for no GPU,
/// listens on every interface (Prometheus scrapes the pod's IP) on the port that its
/// `metrics` containerPort, its liveness probe and the pod's `prometheus.io/*`
/// annotations name. Returns the container's index and its `--listen` address.
fn check_metrics_sidecar(
    label: &str,
    meta: &Value,
    spec: &Value,
) -> Result<(usize, std::net::SocketAddr), String> {
    check_shared_pool(label, spec)?;
    let containers = spec["containers"].as_array().unwrap();
    let sidecars: Vec<usize> = (0..containers.len())
        .filter(|&i| {
            let args = &containers[i]["args"];
            args[0] == "gpucap" && args[1] == "metrics"
        })
        .collect();
    let [i] = sidecars[..] else {
        return Err(format!(
            "{} containers run `gpucap metrics`, not 1",
            sidecars.len()
        ));
    };
    let c = &containers[i];
    let name = &c["name"];
    if gpus(c) != 0 {
        return Err(format!(
            "container {name} asks for a GPU: it only reads the pool"
        ));
    }
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap_or(""))
        .collect();
    let listen = args
        .iter()
        .position(|a| *a == "--listen")
        .and_then(|k| args.get(k + 1))
        .copied()
        .or_else(|| args.iter().find_map(|a| a.strip_prefix("--listen=")))
        .ok_or(format!("container {name}: no --listen"))?;
    let addr: std::net::SocketAddr = listen
        .parse()
        .map_err(|_| format!("container {name}: --listen {listen} is not ADDR:PORT"))?;
    if !addr.ip().is_unspecified() {
        return Err(format!(
            "container {name} listens on {addr}: Prometheus scrapes the pod's IP, listen on \
             0.0.0.0 or [::]"
        ));
    }
    let port = addr.port();
    let ports = c["ports"].as_array().map(Vec::as_slice).unwrap_or_default();
    let named = ports
        .iter()
        .find(|p| p["name"] == "metrics")
        .ok_or(format!("container {name}: no port named metrics"))?;
    if named["containerPort"].as_u64() != Some(u64::from(port)) {
        return Err(format!(
            "container {name}: port metrics is {}, --listen says {port}",
            named["containerPort"]
        ));
    }
    let probe = &c["livenessProbe"]["httpGet"];
    if probe["path"] != "/metrics"
        || !(probe["port"] == "metrics" || probe["port"].as_u64() == Some(u64::from(port)))
    {
        return Err(format!(
            "container {name}: the liveness probe is not GET /metrics on the metrics port: {probe}"
        ));
    }
    let a = &meta["annotations"];
    let want = [
        ("prometheus.io/scrape", "true".to_string()),
        ("prometheus.io/port", port.to_string()),
        ("prometheus.io/path", "/metrics".to_string()),
    ];
    for (k, v) in want {
        if a[k].as_str() != Some(v.as_str()) {
            return Err(format!("annotation {k} is {}, not {v:?}", a[k]));
        }
    }
    Ok((i, addr))
}

/// `GET /metrics` from `addr`: the body of a 200 answer.
fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    write!(c, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut text = String::new();
    c.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    body.to_string()
}

#[test]
fn the_metrics_sidecar_serves_the_pods_pool() {
    let Some(python) = k8s_python() else { return };
    let docs = examples(&python);
    let all = pods(&docs);
    let pod = all
        .iter()
        .find(|p| p.label.starts_with("pod-metrics-sidecar.yaml"))
        .unwrap();
    let (i, _) = check_metrics_sidecar(&pod.label, pod.meta, pod.spec)
        .unwrap_or_else(|e| panic!("{}: {e}", pod.label));
    let containers = pod.spec["containers"].as_array().unwrap();
    let trainer = containers
        .iter()
        .enumerate()
        .find(|(k, _)| *k != i)
        .map(|(_, c)| c)
        .unwrap();
    assert_eq!(gpus(trainer), 1, "the trainer uses the GPU");

    // Run it: the sidecar's args (through gpucap, on loopback and any free port) with
    // the environment the pod gives it, and a member with the trainer's environment;
    // the pool directory is one scratch directory, as the emptyDir is one for the pod.
    let dir = scratch("k8s-metrics");
    let env = |c: &Value| -> Vec<(String, String)> {
        container_env(pod, c)
            .into_iter()
            .map(|(k, v)| {
                if POD_PATHS.contains(&k.as_str()) {
                    let d = dir.join(v.trim_start_matches('/'));
                    std::fs::create_dir_all(&d).unwrap();
                    (k, d.display().to_string())
                } else {
                    (k, v)
                }
            })
            .collect()
    };
    let sidecar = &containers[i];
    let mut args: Vec<String> = sidecar["args"].as_array().unwrap()[1..]
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    let k = args.iter().position(|a| a == "--listen").unwrap();
    args[k + 1] = "127.0.0.1:0".into();
    let log = dir.join("sidecar.log");
    let mut server = fake_cmd(cli(), &dir.join("s.json"))
        .args(&args)
        .envs(env(sidecar))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    let addr = loop {
        let text = std::fs::read_to_string(&log).unwrap();
        // Only a whole line: the sidecar may be writing it while it is read.
        if let Some(a) = text
            .split_once('\n')
            .and_then(|(l, _)| l.strip_prefix("gpucap metrics: serving http://"))
        {
            break a.split_once("/metrics").unwrap().0.to_string();
        }
        assert!(
            server.try_wait().unwrap().is_none(),
            "the sidecar exited: {text}"
        );
        assert!(
            start.elapsed().as_secs() < 60,
            "the sidecar printed no address"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let pool = env(sidecar)
        .into_iter()
        .find(|(k, _)| k == "GPUCAP_POOL")
        .unwrap()
        .1;
    // Its `user`: the pool file's owner, the sidecar's own uid before there is a file.
    let up = format!("gpucap_pool_up{{pool=\"{pool}\",user=\"");
    let up_is = |body: &str, v: u8| {
        body.lines()
            .any(|l| l.starts_with(&up) && l.ends_with(&format!("}} {v}")))
    };
    // Before the trainer's first CUDA call: up 0.
    assert!(up_is(&scrape(&addr), 0));

    let ready = dir.join("ready");
    let script = compile_c("script", "", &["-lcuda"]);
    let mut member = fake_cmd(cli(), &dir.join("m.json"))
        .args(["run", "--"])
        .arg(&script)
        .args([
            "alloc:100Mi".to_string(),
            format!("touch:{}", ready.display()),
            format!("wait:{}", dir.join("never").display()),
        ])
        .envs(env(trainer))
        .env("FAKECUDA_TOTAL_MEM", "40Gi")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    while !ready.exists() {
        assert!(member.try_wait().unwrap().is_none(), "the member exited");
        assert!(start.elapsed().as_secs() < 60, "the member never got ready");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let body = scrape(&addr);
    let limit = env(trainer)
        .into_iter()
        .find(|(k, _)| k == "GPUCAP_LIMIT")
        .unwrap()
        .1;
    assert_eq!(limit, "12Gi", "the figure below");
    let mine = |prefix: &str| {
        body.lines()
            .find(|l| l.starts_with(prefix) && l.contains(&format!("pool=\"{pool}\"")))
            .unwrap_or_else(|| panic!("no {prefix} in\n{body}"))
            .rsplit_once(' ')
            .unwrap()
            .1
            .to_string()
    };
    assert!(up_is(&body, 1), "{body}");
    assert_eq!(mine("gpucap_pool_cap_bytes{"), (12u64 << 30).to_string());
    assert_eq!(mine("gpucap_pool_used_bytes{"), (100u64 << 20).to_string());
    let member_line = format!("pid=\"{}\"", member.id());
    assert!(
        body.lines().any(|l| l.starts_with("gpucap_member_alive{")
            && l.contains(&member_line)
            && l.ends_with(" 1")),
        "{body}"
    );
    for child in [&mut member, &mut server] {
        // SAFETY: kill on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        let _ = child.wait();
    }

    // The check can fail: each of these makes a sidecar Prometheus cannot use.
    let broken = |edit: &dyn Fn(&mut Value, &mut Value)| {
        let (mut meta, mut spec) = (pod.meta.clone(), pod.spec.clone());
        edit(&mut meta, &mut spec);
        check_metrics_sidecar("broken", &meta, &spec)
    };
    fn nth(s: &mut Value, i: usize) -> &mut Value {
        &mut s["containers"][i]
    }
    for (what, result) in [
        (
            "loopback only",
            broken(&|_, s| nth(s, i)["args"][3] = json!("127.0.0.1:9400")),
        ),
        (
            "another port in the annotation",
            broken(&|m, _| m["annotations"]["prometheus.io/port"] = json!("9090")),
        ),
        (
            "no scrape annotation",
            broken(&|m, _| {
                m["annotations"]
                    .as_object_mut()
                    .unwrap()
                    .remove("prometheus.io/scrape");
            }),
        ),
        (
            "another containerPort",
            broken(&|_, s| nth(s, i)["ports"][0]["containerPort"] = json!(9401)),
        ),
        (
            "the probe elsewhere",
            broken(&|_, s| nth(s, i)["livenessProbe"]["httpGet"]["path"] = json!("/")),
        ),
        (
            "no pool volume",
            broken(&|_, s| nth(s, i)["volumeMounts"] = json!([])),
        ),
        (
            "another uid",
            broken(&|_, s| nth(s, i)["securityContext"]["runAsUser"] = json!(2000)),
        ),
        (
            "a GPU",
            broken(&|_, s| nth(s, i)["resources"]["limits"] = json!({"nvidia.com/gpu": 1})),
        ),
        (
            "no sidecar",
            broken(&|_, s| nth(s, i)["args"][1] = json!("status")),
        ),
    ] {
        assert!(result.is_err(), "{what}: accepted");
    }
}
