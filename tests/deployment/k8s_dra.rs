//! The Kubernetes DRA examples, `scripts/k8s/dra/*.yaml` (docs/src/kubernetes.md, "DRA
//! drivers"):
//!
//! - every document is valid, strictly, against the API schemas of every Kubernetes version
//!   from 1.34 (resource.k8s.io/v1 with consumable capacity) to the newest the pinned
//!   `kubernetes-validate` bundles, and Kubernetes 1.33's schemas refuse the DRA kinds;
//!   manifests broken on purpose (a misspelt capacity field) are refused;
//! - each ResourceClaimTemplate asks for one device with `capacity.requests.memory`, of a
//!   DeviceClass of the same file, and each pod's containers use the claim it makes;
//! - the node DaemonSet's `gpucap cdi generate` commands, run as written (the host's `/`
//!   a scratch directory), put the files where its hostPath volumes are, and where the DRA
//!   example pod's hostPath volumes look for them;
//! - HAMi's library DaemonSet's script installs libgpucap.so as HAMi's libvgpu.so.
//!
//! The validator runs in `GPUCAP_TEST_PYTHON_K8S` (scripts/test.sh: target/venv-k8s);
//! without it the tests print SKIP and pass, unless CI or GPUCAP_TEST_REQUIRE_CLIENTS=1.

use super::common;

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// The versions the DRA examples must be valid in.
const VERSIONS: &[&str] = &["1.34.0", "1.35.0", "1.36.0", "1.37.0"];

fn python() -> Option<PathBuf> {
    client_python("GPUCAP_TEST_PYTHON_K8S", "kubernetes-validate")
}

fn dra_files() -> Vec<PathBuf> {
    let dir = root().join("scripts/k8s/dra");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// `validate.py -k VERSION --json FILES`: the output and the documents.
fn validate(python: &Path, version: &str, files: &[PathBuf]) -> (Output, Value) {
    let o = run(Command::new(python)
        .arg(root().join("scripts/k8s/validate.py"))
        .args(["-k", version, "--json"])
        .args(files));
    let v = serde_json::from_str(&stdout(&o)).unwrap_or_else(|e| panic!("{e}\n{}", dump(&o)));
    (o, v)
}

/// The documents, valid in Kubernetes 1.34 (the validity test checks every version), by
/// file name; validated once for all the tests of this file.
fn documents(python: &Path) -> &'static BTreeMap<String, Vec<Value>> {
    static DOCS: OnceLock<BTreeMap<String, Vec<Value>>> = OnceLock::new();
    DOCS.get_or_init(|| read_documents(python))
}

fn read_documents(python: &Path) -> BTreeMap<String, Vec<Value>> {
    let (o, report) = validate(python, VERSIONS[0], &dra_files());
    assert_eq!(
        o.status.code(),
        Some(0),
        "Kubernetes {}\n{}",
        VERSIONS[0],
        dump(&o)
    );
    let mut out: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for d in report["documents"].as_array().unwrap() {
        let f = Path::new(d["file"].as_str().unwrap()).file_name().unwrap();
        out.entry(f.to_string_lossy().into_owned())
            .or_default()
            .push(d["doc"].clone());
    }
    out
}

fn kinds(docs: &[Value]) -> Vec<&str> {
    docs.iter().map(|d| d["kind"].as_str().unwrap()).collect()
}

#[test]
fn the_dra_examples_are_valid_from_kubernetes_1_34_to_1_37() {
    let Some(python) = python() else { return };
    for version in &VERSIONS[1..] {
        let (o, _) = validate(&python, version, &dra_files());
        assert_eq!(
            o.status.code(),
            Some(0),
            "Kubernetes {version}\n{}",
            dump(&o)
        );
    }
    let docs = documents(&python);
    let want: BTreeMap<&str, Vec<&str>> = [
        (
            "dra-example-driver.yaml",
            vec!["DeviceClass", "ResourceClaimTemplate", "Pod"],
        ),
        ("gpucap-node.yaml", vec!["Namespace", "DaemonSet"]),
        (
            "hami-dra.yaml",
            vec!["DaemonSet", "DeviceClass", "ResourceClaimTemplate", "Pod"],
        ),
    ]
    .into();
    let got: BTreeMap<&str, Vec<&str>> = docs.iter().map(|(f, d)| (f.as_str(), kinds(d))).collect();
    assert_eq!(got, want);
    // Kubernetes 1.33 has no resource.k8s.io/v1: the validator knows the versions apart.
    let (o, report) = validate(&python, "1.33.0", &dra_files());
    assert_eq!(o.status.code(), Some(1), "{}", dump(&o));
    let errors: Vec<&str> = report["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert_eq!(errors.len(), 4, "{errors:?}");
    assert!(
        errors.iter().all(|e| e.contains("resource.k8s.io/v1")),
        "{errors:?}"
    );
}

#[test]
fn the_validator_refuses_broken_claim_templates() {
    let Some(python) = python() else { return };
    let docs = documents(&python);
    let template = docs["hami-dra.yaml"]
        .iter()
        .find(|d| d["kind"] == "ResourceClaimTemplate")
        .unwrap()
        .clone();
    let dir = scratch("k8s-dra-broken");
    type Break = fn(&mut Value);
    // (A misspelt capacity name, `requests: {memry: 4Gi}`, is valid for the API: requests
    // is a map of names. each_claim_asks_for_memory_and_each_pod_uses_its_claim checks it.)
    let breaks: [(&str, Break); 2] = [
        ("exactly.capacities", |t| {
            let e = &mut t["spec"]["spec"]["devices"]["requests"][0]["exactly"];
            e["capacities"] = e["capacity"].take();
            e.as_object_mut().unwrap().remove("capacity");
        }),
        ("count as a string", |t| {
            t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = "one".into();
        }),
    ];
    for (what, f) in breaks {
        let mut t = template.clone();
        f(&mut t);
        let file = dir.join("broken.json");
        std::fs::write(&file, serde_json::to_string(&t).unwrap()).unwrap();
        for version in [VERSIONS[0], VERSIONS[VERSIONS.len() - 1]] {
            let (o, _) = validate(&python, version, std::slice::from_ref(&file));
            assert_eq!(
                o.status.code(),
                Some(1),
                "{what}, Kubernetes {version}: accepted\n{}",
                dump(&o)
            );
        }
    }
}

#[test]
fn each_claim_asks_for_memory_and_each_pod_uses_its_claim() {
    let Some(python) = python() else { return };
    let docs = documents(&python);
    let mut pods = 0;
    for (file, docs) in docs {
        let named = |kind: &str, name: &str| {
            docs.iter()
                .any(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        };
        for t in docs.iter().filter(|d| d["kind"] == "ResourceClaimTemplate") {
            let requests = t["spec"]["spec"]["devices"]["requests"].as_array().unwrap();
            assert_eq!(requests.len(), 1, "{file}");
            let exactly = &requests[0]["exactly"];
            assert_eq!(exactly["count"], 1, "{file}");
            let class = exactly["deviceClassName"].as_str().unwrap();
            assert!(
                named("DeviceClass", class),
                "{file}: no DeviceClass {class}"
            );
            let memory = exactly["capacity"]["requests"]["memory"].as_str().unwrap();
            assert!(
                memory.ends_with("Gi") && memory[..memory.len() - 2].parse::<u64>().is_ok(),
                "{file}: {memory}"
            );
        }
        for p in docs.iter().filter(|d| d["kind"] == "Pod") {
            let claims = p["spec"]["resourceClaims"].as_array().unwrap();
            for c in claims {
                let t = c["resourceClaimTemplateName"].as_str().unwrap();
                assert!(named("ResourceClaimTemplate", t), "{file}: no template {t}");
            }
            let containers = p["spec"]["containers"].as_array().unwrap();
            for c in containers {
                let used = c["resources"]["claims"][0]["name"].as_str();
                assert_eq!(used, claims[0]["name"].as_str(), "{file}: {}", c["name"]);
            }
            if file == "hami-dra.yaml" {
                assert!(containers.len() >= 2, "two containers of one claim");
            }
            pods += 1;
        }
    }
    assert_eq!(pods, 2);
}

/// A container's command, for the commands of the DaemonSets.
fn command(c: &Value) -> Vec<String> {
    c["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap().to_string())
        .collect()
}

fn hostpaths(spec: &Value) -> BTreeMap<String, String> {
    spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| {
            Some((
                v["name"].as_str()?.to_string(),
                v["hostPath"]["path"].as_str()?.to_string(),
            ))
        })
        .collect()
}

#[test]
fn the_node_daemonset_writes_what_the_pods_mount() {
    let Some(python) = python() else { return };
    let docs = documents(&python);
    let ds = docs["gpucap-node.yaml"]
        .iter()
        .find(|d| d["kind"] == "DaemonSet")
        .unwrap();
    let spec = &ds["spec"]["template"]["spec"];
    let volumes = hostpaths(spec);
    let host = scratch("k8s-dra-host");
    let inits = spec["initContainers"].as_array().unwrap();
    assert_eq!(inits.len(), 2);
    for c in inits {
        let words = command(c);
        assert_eq!(
            words[0], "/usr/local/lib/gpucap/gpucap",
            "the image's gpucap"
        );
        let value = |flag: &str| {
            words
                .iter()
                .position(|w| w == flag)
                .map(|i| words[i + 1].clone())
        };
        // Every path it writes is under a host volume, mounted at /host + its hostPath.
        let mounts: Vec<(String, String)> = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["mountPath"].as_str().unwrap().into(),
                    volumes[m["name"].as_str().unwrap()].clone(),
                )
            })
            .collect();
        assert_eq!(value("--root").as_deref(), Some("/host"));
        for (mount, hostpath) in &mounts {
            assert_eq!(*mount, format!("/host{hostpath}"));
        }
        for flag in ["--dir", "--output"] {
            let p = value(flag).unwrap();
            assert!(
                mounts.iter().any(|(_, h)| p.starts_with(h.as_str())),
                "{flag} {p} is on no host volume"
            );
        }
        // Run as written, with the scratch directory for the host's /.
        let mut args: Vec<String> = words[1..].to_vec();
        let at = args.iter().position(|w| w == "--root").unwrap();
        args[at + 1] = host.display().to_string();
        let o = run(Command::new(cli()).args(&args));
        assert_ok(&o);
        let spec_file = host.join(value("--output").unwrap().trim_start_matches('/'));
        let text = std::fs::read_to_string(&spec_file).unwrap();
        let cdi: Value = serde_json::from_str(&text).unwrap();
        let name = value("--name").unwrap();
        assert_eq!(cdi["devices"][0]["name"], name.as_str());
        assert_eq!(
            cdi["devices"][0]["containerEdits"]["mounts"][0]["hostPath"],
            format!("{}/{name}", value("--dir").unwrap()).as_str(),
            "the spec names the host's path, not /host's"
        );
    }
    // What the DRA example pod mounts from the node is there.
    let pod = docs["dra-example-driver.yaml"]
        .iter()
        .find(|d| d["kind"] == "Pod")
        .unwrap();
    let mounted = hostpaths(&pod["spec"]);
    assert_eq!(mounted.len(), 2);
    for path in mounted.values() {
        assert!(
            host.join(path.trim_start_matches('/')).exists(),
            "{path} is not on the node"
        );
    }
    assert!(
        !host.join("var/lib/gpucap/cdi/library/gpucap.env").exists(),
        "the library alone"
    );
    assert!(host.join("var/lib/gpucap/cdi/capped/gpucap.env").exists());
}

#[test]
fn the_hami_library_daemonset_installs_gpucap_as_libvgpu() {
    let Some(python) = python() else { return };
    let docs = documents(&python);
    let ds = docs["hami-dra.yaml"]
        .iter()
        .find(|d| d["kind"] == "DaemonSet")
        .unwrap();
    let spec = &ds["spec"]["template"]["spec"];
    let words = command(&spec["containers"][0]);
    assert_eq!(words[..2], ["/bin/sh", "-c"]);
    let volumes = hostpaths(spec);
    assert_eq!(
        volumes.values().collect::<Vec<_>>(),
        ["/usr/local/vgpu"],
        "HAMi's driver.vgpuInitPath"
    );
    let host = scratch("k8s-dra-hami");
    std::fs::create_dir_all(host.join("usr/local/vgpu")).unwrap();
    std::fs::write(
        host.join("usr/local/vgpu/libvgpu.so"),
        "HAMi-core's library",
    )
    .unwrap();
    let script = words[2]
        .replace(
            "/usr/local/lib/gpucap/libgpucap.so",
            shim().to_str().unwrap(),
        )
        .replace("/host/", &format!("{}/", host.display()));
    // Its output to a file, not a pipe: the `sleep 30` it leaves behind when SIGTERM ends
    // it would hold a pipe open for 30 s. Its own process group, killed at the end as a
    // container runtime kills what PID 1 leaves.
    let out = host.join("install.out");
    let mut child = Command::new("sh")
        .args(["-c", &script])
        .stdout(std::fs::File::create(&out).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let installed = host.join("usr/local/vgpu/libvgpu.so");
    let want = std::fs::read(shim()).unwrap();
    let start = Instant::now();
    while std::fs::read(&installed).ok().as_deref() != Some(&want[..]) {
        // A harness limit, not a timing assertion.
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "libvgpu.so was not replaced"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // SIGTERM: the script's trap ends it with status 0.
    // SAFETY: kill has no memory preconditions; the pid is our child's, not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    // SAFETY: as above; the group our child led (its sleep), signalled once.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    let printed = std::fs::read_to_string(&out).unwrap();
    assert!(status.success(), "{status}: {printed}");
    assert!(printed.contains("installed"), "{printed}");
}
