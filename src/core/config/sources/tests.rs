//! Each driver's hand-over, and the conflicts between sources.

use super::super::*;
use super::quantity::parse_quantity;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const GPU0: &str = "GPU-face0000-0000-0000-0000-000000000000";
const GPU1: &str = "GPU-face0000-0000-0000-0000-000000000001";

fn vars(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
    from_vars(pairs.iter().copied())
}

fn uuid(s: &str) -> [u8; 16] {
    DeviceUuid::parse(s).unwrap().bytes
}

#[test]
fn vgpu_manager_keys_each_cap_to_its_gpus_uuid() {
    let c = vars(&[
        ("CUDA_MEM_LIMIT", ""),
        ("MANAGER_VISIBLE_DEVICES", ""),
        ("CUDA_MEM_LIMIT_3", "1024m"),
        ("MANAGER_VISIBLE_DEVICE_3", GPU1),
        ("CUDA_MEM_LIMIT_5", ""),
        ("MANAGER_VISIBLE_DEVICE_5", GPU0),
    ])
    .unwrap();
    let l = c.limit.unwrap();
    // Index 3 is the node's: it caps GPU1 whatever its CUDA ordinal; index 5 (empty) none.
    assert_eq!(l.for_device(0, Some(&uuid(GPU1))), Some(Limit::Bytes(GIB)));
    assert_eq!(l.for_device(0, Some(&uuid(GPU0))), None);
    assert_eq!(l.for_device(3, Some(&uuid(GPU0))), None);
    assert_eq!(c.origins.len(), 1);
    assert_eq!(c.origins[0].var, "CUDA_MEM_LIMIT_3");
    assert_eq!(c.origins[0].driver, "vgpu-manager");
    // The unindexed one is every GPU's.
    let c = vars(&[("CUDA_MEM_LIMIT", "2g")]).unwrap();
    assert_eq!(c.limit.unwrap().default, Some(Limit::Bytes(2 * GIB)));
}

#[test]
fn vgpu_manager_refuses_what_it_cannot_place_or_read() {
    for (pairs, why) in [
        (
            vec![("CUDA_MEM_LIMIT_3", "1024m")],
            "no MANAGER_VISIBLE_DEVICE_3",
        ),
        (
            vec![
                ("CUDA_MEM_LIMIT_0", "1.5g"),
                ("MANAGER_VISIBLE_DEVICE_0", GPU0),
            ],
            "not a whole number",
        ),
        (
            vec![
                ("CUDA_MEM_LIMIT_0", "0m"),
                ("MANAGER_VISIBLE_DEVICE_0", GPU0),
            ],
            "a cap of 0",
        ),
        (
            vec![
                ("CUDA_MEM_LIMIT_0", "64"),
                ("MANAGER_VISIBLE_DEVICE_0", GPU0),
            ],
            "did you mean 64g",
        ),
        (vec![("CUDA_MEM_LIMITS", "1g")], "a typo?"),
        (
            vec![
                ("CUDA_MEM_LIMIT_0", "1g"),
                ("MANAGER_VISIBLE_DEVICE_0", "gpu-0"),
            ],
            "is not a UUID",
        ),
    ] {
        let e = vars(&pairs).unwrap_err();
        assert!(e.to_string().contains(why), "{pairs:?}: {e}");
    }
}

#[test]
fn dra_example_amounts_are_kubernetes_quantities() {
    for (q, b) in [
        ("16Gi", 16 * GIB),
        ("1536Mi", 1536 * MIB),
        ("4G", 4_000_000_000),
        ("1.5Gi", 1536 * MIB),
        ("2e9", 2_000_000_000),
        ("1073741824", GIB),
        ("500M", 500_000_000),
    ] {
        assert_eq!(parse_quantity(q), Ok(b), "{q}");
    }
    for q in ["", "1.5Gb", "-1Gi", "0", "100m", "1.2.3", "Gi", "0.5"] {
        assert!(parse_quantity(q).is_err(), "{q}");
    }
    let c = vars(&[("GPU_DEVICE_0", "gpu-0"), ("GPU_DEVICE_0_MEMORY", "16Gi")]).unwrap();
    assert_eq!(c.limit.unwrap().default, Some(Limit::Bytes(16 * GIB)));
    // Several amounts name no GPU: every GPU gets the smallest, and a note says so.
    let c = vars(&[
        ("GPU_DEVICE_0_MEMORY", "16Gi"),
        ("GPU_DEVICE_3_PARTITION_1_MEMORY", "4Gi"),
    ])
    .unwrap();
    assert_eq!(c.limit.unwrap().default, Some(Limit::Bytes(4 * GIB)));
    assert!(
        c.notes.iter().any(|n| n.contains("the smallest")),
        "{:?}",
        c.notes
    );
    // GPU_DEVICE_<ID> and its other variables place no cap.
    assert_eq!(vars(&[("GPU_DEVICE_0", "gpu-0")]).unwrap().limit, None);
    // A name the driver never writes fails closed, naming the variable.
    for name in [
        "GPU_DEVICE_gpu-0_MEMORY",
        "GPU_DEVICE__MEMORY",
        "GPU_DEVICE_0.1_MEMORY",
    ] {
        let e = vars(&[(name, "4Gi")]).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("gpucap: invalid {name}=\"4Gi\": not a name")),
            "{e}"
        );
    }
}

#[test]
fn the_toolkits_pair_is_both_or_neither_request_at_most_limit() {
    let c = vars(&[
        ("NVIDIA_GPU_MEMORY_LIMIT", "2048"),
        ("NVIDIA_GPU_MEMORY_REQUEST", "1024"),
    ])
    .unwrap();
    assert_eq!(c.limit.unwrap().default, Some(Limit::Bytes(2 * GIB)));
    assert_eq!(c.guarantee, None, "no pool: nothing to guarantee against");
    assert!(
        c.notes
            .iter()
            .any(|n| n.contains("NVIDIA_GPU_MEMORY_REQUEST"))
    );
    for (pairs, var, why) in [
        (
            vec![("NVIDIA_GPU_MEMORY_LIMIT", "2048")],
            "NVIDIA_GPU_MEMORY_LIMIT",
            "both or neither",
        ),
        (
            vec![("NVIDIA_GPU_MEMORY_REQUEST", "1")],
            "NVIDIA_GPU_MEMORY_REQUEST",
            "both or neither",
        ),
        (
            vec![
                ("NVIDIA_GPU_MEMORY_LIMIT", "1024"),
                ("NVIDIA_GPU_MEMORY_REQUEST", "2048"),
            ],
            "NVIDIA_GPU_MEMORY_REQUEST",
            "above",
        ),
        (
            vec![
                ("NVIDIA_GPU_MEMORY_LIMIT", "0"),
                ("NVIDIA_GPU_MEMORY_REQUEST", "0"),
            ],
            "NVIDIA_GPU_MEMORY_LIMIT",
            "a limit of 0",
        ),
        (
            vec![
                ("NVIDIA_GPU_MEMORY_LIMIT", "2Gi"),
                ("NVIDIA_GPU_MEMORY_REQUEST", "1"),
            ],
            "NVIDIA_GPU_MEMORY_LIMIT",
            "not a whole number of MiB",
        ),
        (
            vec![("NVIDIA_GPU_MEMORY_LIMITS", "1024")],
            "NVIDIA_GPU_MEMORY_LIMITS",
            "a typo?",
        ),
    ] {
        let e = vars(&pairs).unwrap_err();
        assert_eq!(e.var, var, "{pairs:?}: {e}");
        assert!(e.reason.contains(why), "{pairs:?}: {e}");
    }
}

#[test]
fn in_a_pool_with_its_own_cap_the_request_is_the_guarantee_and_the_limit_the_ceiling() {
    let c = vars(&[
        ("GPUCAP_POOL", "node"),
        ("GPUCAP_LIMIT", "8Gi"),
        ("NVIDIA_GPU_MEMORY_LIMIT", "2048"),
        ("NVIDIA_GPU_MEMORY_REQUEST", "1024"),
    ])
    .unwrap();
    assert_eq!(c.limit.unwrap().default, Some(Limit::Bytes(8 * GIB)));
    assert_eq!(c.guarantee.unwrap().default, Some(Limit::Bytes(GIB)));
    assert_eq!(c.ceiling.unwrap().default, Some(Limit::Bytes(2 * GIB)));
    // GPUCAP_CEILING that says otherwise is a conflict naming both.
    let e = vars(&[
        ("GPUCAP_POOL", "node"),
        ("GPUCAP_LIMIT", "8Gi"),
        ("GPUCAP_CEILING", "3Gi"),
        ("NVIDIA_GPU_MEMORY_LIMIT", "2048"),
        ("NVIDIA_GPU_MEMORY_REQUEST", "1024"),
    ])
    .unwrap_err();
    assert_eq!(e.var, "GPUCAP_CEILING");
    assert!(e.reason.contains("NVIDIA_GPU_MEMORY_LIMIT=\"2048\""), "{e}");
    // A ceiling above the pool's cap is refused as GPUCAP_CEILING's would be.
    let e = vars(&[
        ("GPUCAP_POOL", "node"),
        ("GPUCAP_LIMIT", "1Gi"),
        ("NVIDIA_GPU_MEMORY_LIMIT", "2048"),
        ("NVIDIA_GPU_MEMORY_REQUEST", "1024"),
    ])
    .unwrap_err();
    assert!(e.reason.contains("above the pool's cap"), "{e}");
}

#[test]
fn hami_dra_caps_every_gpu_at_the_grant_and_pools_the_claim() {
    let c = vars(&[
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "4096m"),
        ("CUDA_DEVICE_MEMORY_LIMIT_1", "1024m"),
        (
            "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            "/usr/local/vgpu/claims/5f0c-77/0d1e.cache",
        ),
    ])
    .unwrap();
    // The indices name no GPU: the smallest grant for every GPU, said in a note.
    let l = c.limit.unwrap();
    assert_eq!((l.default, l.devices.len()), (Some(Limit::Bytes(GIB)), 0));
    assert!(
        c.notes.iter().any(|n| n.contains("the smallest")),
        "{:?}",
        c.notes
    );
    assert_eq!(
        c.pool,
        Some(PoolSpec::Claim("/usr/local/vgpu/claims/5f0c-77".into()))
    );
    assert_eq!(
        c.pool.unwrap().to_string(),
        "/usr/local/vgpu/claims/5f0c-77/gpucap.pool"
    );
    // HAMi's device plugin (no claims/ directory): the cache file is the pool, as before.
    let c = vars(&[
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "1024m"),
        (
            "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            "/usr/local/vgpu/0d1e.cache",
        ),
    ])
    .unwrap();
    assert_eq!(
        c.pool,
        Some(PoolSpec::Path("/usr/local/vgpu/0d1e.cache".into()))
    );
    assert_eq!(c.limit.unwrap().for_ordinal(0), Some(Limit::Bytes(GIB)));
}

#[test]
fn a_claim_directory_names_the_pool_and_gpucap_pool_may_not_name_another() {
    let c = vars(&[("GPUCAP_CLAIM_DIR", "/mnt/claim"), ("GPUCAP_LIMIT", "1Gi")]).unwrap();
    assert_eq!(c.pool, Some(PoolSpec::Claim("/mnt/claim".into())));
    let e = vars(&[("GPUCAP_CLAIM_DIR", "/mnt/claim"), ("GPUCAP_POOL", "p")]).unwrap_err();
    assert_eq!(e.var, "GPUCAP_POOL");
    let e = vars(&[("GPUCAP_CLAIM_DIR", "claim")]).unwrap_err();
    assert!(e.reason.contains("absolute"), "{e}");
}

#[test]
fn sources_that_disagree_are_one_error_naming_both_and_agreeing_ones_are_fine() {
    let e = vars(&[
        ("GPUCAP_LIMIT", "2Gi"),
        ("NVIDIA_GPU_MEMORY_LIMIT", "1024"),
        ("NVIDIA_GPU_MEMORY_REQUEST", "0"),
    ])
    .unwrap_err();
    let line = e.to_string();
    assert!(!line.contains('\n'));
    assert!(
        line.contains("1 GiB from NVIDIA_GPU_MEMORY_LIMIT=\"1024\""),
        "{line}"
    );
    assert!(line.contains("2 GiB from GPUCAP_LIMIT=\"2Gi\""), "{line}");
    let e = vars(&[
        ("GPU_DEVICE_0_MEMORY", "2Gi"),
        ("NVIDIA_GPU_MEMORY_LIMIT", "1024"),
        ("NVIDIA_GPU_MEMORY_REQUEST", "0"),
    ])
    .unwrap_err();
    assert!(e.to_string().contains("GPU_DEVICE_0_MEMORY=\"2Gi\""), "{e}");
    let ok = vars(&[
        ("GPUCAP_LIMIT", "1Gi"),
        ("GPU_DEVICE_0_MEMORY", "1Gi"),
        ("NVIDIA_GPU_MEMORY_LIMIT", "1024"),
        ("NVIDIA_GPU_MEMORY_REQUEST", "0"),
    ])
    .unwrap();
    assert_eq!(ok.cap_sources.len(), 3);
    assert_eq!(ok.limit.unwrap().from, LimitFrom::Both);
}

#[test]
fn sources_keyed_by_uuid_are_compared_on_the_visible_gpus() {
    let c = vars(&[
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "512m"),
        ("CUDA_MEM_LIMIT_3", "1024m"),
        ("MANAGER_VISIBLE_DEVICE_3", GPU1),
    ])
    .unwrap();
    assert!(names_gpus(&c));
    // GPU1 is CUDA's GPU 0 (CUDA_VISIBLE_DEVICES=1): 512 MiB from HAMi, 1 GiB from
    // vgpu-manager.
    let seen = [uuid(GPU1)];
    let e = check_gpu_keys(&c, Some(1), || Some(&seen[..])).unwrap_err();
    assert!(
        e.starts_with("gpucap: invalid CUDA_MEM_LIMIT_3=\"1024m\": "),
        "{e}"
    );
    assert!(
        e.contains("512 MiB from CUDA_DEVICE_MEMORY_LIMIT_0=\"512m\""),
        "{e}"
    );
    assert!(e.contains(&format!("GPU 0 ({GPU1})")), "{e}");
    // The same caps agree.
    let c = vars(&[
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "1024m"),
        ("CUDA_MEM_LIMIT_3", "1024m"),
        ("MANAGER_VISIBLE_DEVICE_3", GPU1),
    ])
    .unwrap();
    assert_eq!(check_gpu_keys(&c, Some(1), || Some(&seen[..])), Ok(()));
    // A UUID no visible GPU has is the key error, as in GPUCAP_LIMIT.
    let other = [uuid(GPU0)];
    let e = check_gpu_keys(&c, Some(1), || Some(&other[..])).unwrap_err();
    assert!(e.contains("matches none of the 1 GPU(s)"), "{e}");
}

#[test]
fn the_shim_copies_every_drivers_variable() {
    for name in [
        "CUDA_MEM_LIMIT_0",
        "CUDA_MEM_LIMIT",
        "MANAGER_VISIBLE_DEVICE_0",
        "GPU_DEVICE_0_MEMORY",
        "NVIDIA_GPU_MEMORY_LIMIT",
        "NVIDIA_GPU_MEMORY_REQUEST",
    ] {
        assert!(looked_at(name.as_bytes()), "{name}");
        assert!(has_gpucap_vars([(name, "1")]), "{name}");
    }
    assert!(!looked_at(b"GPU_DEVICE_0"));
    // Copied to key HAMi's caps (and to know whether the environment chose the GPUs a
    // ceiling's ordinals name), but no cap: gpucap.env is still read beside them.
    for name in ["NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"] {
        assert!(looked_at(name.as_bytes()), "{name}");
        assert!(!has_gpucap_vars([(name, GPU0)]), "{name}");
    }
}

#[test]
fn hamis_classic_caps_follow_nvidia_visible_devices_by_uuid() {
    // HAMi's device plugin lists GPU1 first: its CUDA_DEVICE_MEMORY_LIMIT_0 is GPU1's,
    // though CUDA may number GPU0 first.
    let pairs = [
        (
            "NVIDIA_VISIBLE_DEVICES",
            "GPU-face0000-0000-0000-0000-000000000001,GPU-face0000-0000-0000-0000-000000000000",
        ),
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "1024m"),
        ("CUDA_DEVICE_MEMORY_LIMIT_1", "2048m"),
        ("CUDA_DEVICE_SM_LIMIT", "50"),
        (
            "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            "/usr/local/vgpu/0b3f.cache",
        ),
    ];
    let c = vars(&pairs).unwrap();
    let l = c.limit.clone().unwrap();
    assert_eq!(
        l.for_device(0, Some(&uuid(GPU0))),
        Some(Limit::Bytes(2 * GIB))
    );
    assert_eq!(l.for_device(1, Some(&uuid(GPU1))), Some(Limit::Bytes(GIB)));
    let o: Vec<_> = c
        .origins
        .iter()
        .map(|o| (o.var.as_str(), o.key.clone()))
        .collect();
    assert_eq!(
        o,
        [
            (
                "CUDA_DEVICE_MEMORY_LIMIT_0",
                Some(DeviceKey::Uuid(DeviceUuid::parse(GPU1).unwrap()))
            ),
            (
                "CUDA_DEVICE_MEMORY_LIMIT_1",
                Some(DeviceKey::Uuid(DeviceUuid::parse(GPU0).unwrap()))
            ),
        ]
    );
    assert_eq!(
        o[0].1.as_ref().map(|_| c.origins[0].driver),
        Some("HAMi device plugin")
    );
    // Beside GPUCAP_LIMIT, compared on the visible GPUs: 1 GiB for every GPU disagrees
    // with GPU0's 2 GiB whatever CUDA's order.
    let mut with_ours = pairs.to_vec();
    with_ours.push(("GPUCAP_LIMIT", "1Gi"));
    let c = vars(&with_ours).unwrap();
    let seen = [uuid(GPU0), uuid(GPU1)];
    let e = check_gpu_keys(&c, Some(2), || Some(&seen[..])).unwrap_err();
    assert!(e.contains(&format!("GPU 0 ({GPU0})")), "{e}");
    assert!(e.contains("2 GiB from CUDA_DEVICE_MEMORY_LIMIT_0=\"1024m\", CUDA_DEVICE_MEMORY_LIMIT_1=\"2048m\" (HAMi device plugin)"), "{e}");
    assert!(e.contains("1 GiB from GPUCAP_LIMIT=\"1Gi\""), "{e}");
    // Indices (or `all`) name no UUID: HAMi-core's CUDA ordinals, as before.
    for v in ["1,0", "all"] {
        let mut p = pairs.to_vec();
        p[0].1 = v;
        let l = vars(&p).unwrap().limit.unwrap();
        assert_eq!(
            l.for_device(0, Some(&uuid(GPU0))),
            Some(Limit::Bytes(GIB)),
            "{v}"
        );
    }
    // A cap past the list cannot be placed.
    let mut p = pairs.to_vec();
    p[0].1 = GPU1;
    let e = vars(&p).unwrap_err();
    assert_eq!(e.var, "CUDA_DEVICE_MEMORY_LIMIT_1");
    assert!(
        e.reason
            .contains("lists 1 GPU(s), so there is no GPU 1 to cap"),
        "{e}"
    );
    // A list of UUIDs with one damaged (cut short, a stray index, mixed in) is refused:
    // read as CUDA ordinals, the caps would fall on other GPUs and the granted ones
    // would run uncapped.
    for v in [
        "GPU-face0000-0000-0000-0000-00000000000",
        "GPU-face0000-0000-0000-0000-000000000001,0",
        "1,MIG-x",
    ] {
        let mut p = pairs.to_vec();
        p[0].1 = v;
        let e = vars(&p).unwrap_err();
        assert_eq!(e.var, "CUDA_DEVICE_MEMORY_LIMIT_0", "{v}");
        assert!(
            e.reason.contains("lists GPUs by UUID, but not all of them"),
            "{v}: {e}"
        );
    }
}

#[test]
fn limit_none_beside_a_drivers_grant_is_a_conflict_naming_both() {
    let hami_dra_cache = "/usr/local/vgpu/claims/abc-1/x.cache";
    for (pairs, names) in [
        (
            vec![
                ("CUDA_MEM_LIMIT_0", "1024m"),
                ("MANAGER_VISIBLE_DEVICE_0", GPU0),
            ],
            "CUDA_MEM_LIMIT_0=\"1024m\" (vgpu-manager)",
        ),
        (
            vec![("GPU_DEVICE_0_MEMORY", "1Gi")],
            "GPU_DEVICE_0_MEMORY=\"1Gi\" (DRA example driver)",
        ),
        (
            vec![
                ("NVIDIA_GPU_MEMORY_LIMIT", "1024"),
                ("NVIDIA_GPU_MEMORY_REQUEST", "512"),
            ],
            "NVIDIA_GPU_MEMORY_LIMIT=\"1024\" (NVIDIA container toolkit)",
        ),
        // In a pool, where the toolkit's limit would otherwise become a ceiling.
        (
            vec![
                ("GPUCAP_POOL", "p"),
                ("NVIDIA_GPU_MEMORY_LIMIT", "1024"),
                ("NVIDIA_GPU_MEMORY_REQUEST", "512"),
            ],
            "NVIDIA_GPU_MEMORY_LIMIT=\"1024\" (NVIDIA container toolkit)",
        ),
        (
            vec![
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "1024m"),
                ("CUDA_DEVICE_MEMORY_SHARED_CACHE", hami_dra_cache),
            ],
            "CUDA_DEVICE_MEMORY_LIMIT_0",
        ),
    ] {
        for none in ["none", " NONE "] {
            let mut all = vec![("GPUCAP_LIMIT", none)];
            all.extend(pairs.iter().copied());
            let e = vars(&all).expect_err(&format!("{all:?} ran uncapped"));
            assert_eq!((e.var.as_str(), e.value.as_str()), ("GPUCAP_LIMIT", none));
            assert!(e.reason.starts_with("none asks for no cap, and "), "{e}");
            assert!(e.reason.contains(names), "{names:?} not in {e}");
        }
    }
}

#[test]
fn a_grant_without_a_claim_directory_is_shared_by_the_containers_processes() {
    let container = Some(PoolSpec::Name(CONTAINER_POOL.into()));
    let dra = [("GPU_DEVICE_0", "gpu-0"), ("GPU_DEVICE_0_MEMORY", "1Gi")];
    let toolkit = [
        ("NVIDIA_GPU_MEMORY_LIMIT", "1024"),
        ("NVIDIA_GPU_MEMORY_REQUEST", "512"),
    ];
    let vgpu = [
        ("CUDA_MEM_LIMIT_0", "1024m"),
        ("MANAGER_VISIBLE_DEVICE_0", GPU0),
    ];
    for grant in [&dra[..], &toolkit[..], &vgpu[..]] {
        let c = vars(grant).unwrap();
        assert_eq!(c.pool, container, "{grant:?}");
        assert!(
            c.info
                .iter()
                .any(|l| l.starts_with("pool: one per container, container-mntns")),
            "{grant:?}: {:?}",
            c.info
        );
        assert!(
            c.notes.iter().all(|n| !n.contains("stays in")),
            "{:?}",
            c.notes
        );
        // GPUCAP_POOL=off does not leave it: the process stays, with a line.
        let mut env = grant.to_vec();
        env.push(("GPUCAP_POOL", "off"));
        let c = vars(&env).unwrap();
        assert_eq!(c.pool, container, "{env:?}");
        assert!(
            c.notes
                .iter()
                .any(|n| n.starts_with("GPUCAP_POOL=\"off\" would leave the container's pool")),
            "{env:?}: {:?}",
            c.notes
        );
        // Nor does another pool: a process of the container would hold the grant
        // beside its siblings'.
        for value in ["mine", "/x/y.pool"] {
            let mut env = grant.to_vec();
            env.push(("GPUCAP_POOL", value));
            let c = vars(&env).unwrap();
            assert_eq!(c.pool, container, "{env:?}");
            assert!(
                c.notes
                    .iter()
                    .any(|n| n.starts_with(&format!("GPUCAP_POOL={value:?} would "))
                        && n.contains("stays in")),
                "{env:?}: {:?}",
                c.notes
            );
        }
        // The pool directory places it.
        let mut env = grant.to_vec();
        env.push(("GPUCAP_POOL_DIR", "/pods/vol"));
        let c = vars(&env).unwrap();
        assert_eq!(
            (c.pool, c.pool_dir.as_deref()),
            (container.clone(), Some(std::path::Path::new("/pods/vol")))
        );
        // Naming the container's pool is no line.
        let mut env = grant.to_vec();
        env.push(("GPUCAP_POOL", CONTAINER_POOL));
        let c = vars(&env).unwrap();
        assert_eq!(c.pool, container);
        assert!(
            c.notes.iter().all(|n| !n.contains("stays in")),
            "{:?}",
            c.notes
        );
    }
    // A claim's directory, or HAMi-core's cache file, named beside a driver without
    // claims leaves the container's pool as another GPUCAP_POOL would: it stays.
    for (var, value) in [
        ("GPUCAP_CLAIM_DIR", "/mnt/mine"),
        ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/x/mine.cache"),
    ] {
        let c = vars(&[dra[0], dra[1], (var, value)]).unwrap();
        assert_eq!(c.pool, container, "{var}");
        assert!(
            c.notes
                .iter()
                .any(|n| n.starts_with(var) && n.contains(" would leave the container's pool")),
            "{var}: {:?}",
            c.notes
        );
    }
    // A claim's directory is the claim's pool, not the container's.
    let c = vars(&[vgpu[0], vgpu[1], ("GPUCAP_CLAIM_DIR", "/mnt/claim")]).unwrap();
    assert_eq!(c.pool, Some(PoolSpec::Claim("/mnt/claim".into())));
    // GPUCAP_LIMIT alone is no driver's grant: the process is capped on its own.
    assert_eq!(vars(&[("GPUCAP_LIMIT", "1Gi")]).unwrap().pool, None);
}
