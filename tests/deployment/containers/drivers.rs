//! The drivers' hand-overs: each driver's exact variables and mounts in a plain image.

use super::*;

/// HAMi's DRA kubelet plugin (`hami-core-gpu.project-hami.io`): gpucap's library where
/// HAMi's goes, the claim's directory (0777, as the plugin makes it, unless the test made
/// it otherwise), and the variables of a claim of `mib` MiB.
pub fn hami_dra(c: &mut Container, dir: &Path, claim: &str, mib: u64) {
    let claims = dir.join("claims").join(claim);
    if !claims.exists() {
        std::fs::create_dir_all(&claims).unwrap();
        set_mode(&claims, 0o777); // as HAMi's plugin makes it
    }
    let vgpulock = dir.join("vgpulock");
    std::fs::create_dir_all(&vgpulock).unwrap();
    let preload = write(
        &dir.join("hami-ld.so.preload"),
        "/usr/local/vgpu/libvgpu.so\n",
    );
    c.mount_ro(&shim(), "/usr/local/vgpu/libvgpu.so")
        .mount_ro(&preload, "/etc/ld.so.preload")
        .mount(&claims, &format!("/usr/local/vgpu/claims/{claim}"))
        .mount(&vgpulock, "/tmp/vgpulock")
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", &format!("{mib}m"))
        .env("CUDA_DEVICE_SM_LIMIT_0", "50")
        // A new file per container, as the plugin names it.
        .env(
            "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            &format!("/usr/local/vgpu/claims/{claim}/{}.cache", unique("cache")),
        );
}

/// vgpu-manager's DRA plugin (`manager.nvidia.com`, pkg/kubeletplugin/vgpu.go): its
/// library and ld.so.preload, the claim's partition directories, and exactly the
/// variables it sets (the common ones, several empty, and the device's, index 0).
pub fn vgpu_manager(c: &mut Container, dir: &Path, claim: &str, mib: u64) {
    let part = dir.join("vgpu-manager/claims").join(claim).join("default");
    for sub in ["config", "vgpu_lock", "vmem_node", "sm_node"] {
        std::fs::create_dir_all(part.join(sub)).unwrap();
        set_mode(&part.join(sub), 0o777); // as vgpu-manager makes them
    }
    let lib = "/etc/vgpu-manager/driver/libvgpu-control.so";
    let preload = write(&dir.join("vgpu-manager-ld.so.preload"), &format!("{lib}\n"));
    c.mount_ro(&shim(), lib)
        .mount_ro(&preload, "/etc/ld.so.preload")
        .mount(&part.join("config"), "/etc/vgpu-manager/config")
        .mount(&part.join("vgpu_lock"), "/tmp/.vgpu_lock")
        .mount(&part.join("vmem_node"), "/tmp/.vmem_node")
        .mount(&part.join("sm_node"), "/tmp/.sm_node");
    for (k, v) in [
        ("LD_PRELOAD", lib),
        ("MANAGER_COMPATIBILITY_MODE", "1"),
        ("MANAGER_VISIBLE_DEVICES", ""),
        ("CUDA_MEM_RATIO", "1.00"),
        ("CUDA_CORE_LIMIT", ""),
        ("CUDA_CORE_SOFT_LIMIT", ""),
        ("CUDA_MEM_LIMIT", ""),
        ("CUDA_MEM_OVERSOLD", "FALSE"),
        ("VMEMORY_NODE_ENABLED", "TRUE"),
        ("CUDA_SM_SHARED_BUCKET", "TRUE"),
        ("MANAGER_VGPU_CLAIM_UID", ""),
        ("EXTERNAL_SM_WATCHER_ENABLED", "FALSE"),
        ("CUDA_MEM_RATIO_0", "1.00"),
        ("CUDA_MEM_OVERSOLD_0", "FALSE"),
        ("MANAGER_VISIBLE_DEVICE_0", GPU0),
        ("CUDA_CORE_LIMIT_0", "50"),
        ("CUDA_CORE_SOFT_LIMIT_0", "50"),
    ] {
        c.env(k, v);
    }
    c.env("CUDA_MEM_LIMIT_0", &format!("{mib}m"));
}

/// gpucap's library and ld.so.preload as `gpucap cdi generate` without `--limit` mounts
/// them (the library alone: the container's variables set the cap), for the drivers that
/// mount no library of their own.
pub fn gpucap_library(c: &mut Container, dir: &Path) {
    let preload = write(
        &dir.join("gpucap-ld.so.preload"),
        "/usr/local/lib/gpucap-cdi/libgpucap.so\n",
    );
    c.mount_ro(&shim(), "/usr/local/lib/gpucap-cdi/libgpucap.so")
        .mount_ro(&preload, "/etc/ld.so.preload");
}

/// `gpucap check` for a library mounted at `lib` (GPUCAP_LIB names it: the test's gpucap
/// is elsewhere).
pub fn check_with(lib: &str) -> String {
    format!("GPUCAP_LIB={lib} {BIN}/gpucap check")
}

/// What the CDI device mounts: its own gpucap beside the library. No GPUCAP_LIB, which
/// as a GPUCAP_* variable would make gpucap.env unread.
pub const CDI_CHECK: &str = "/usr/local/lib/gpucap-cdi/gpucap check";

/// Runs cudarc-client `600 600` (and NVML's view, and `check`, the command line of
/// `gpucap check`) in `c` and checks that the second allocation was refused under a 1 GiB
/// cap that cuMemGetInfo and NVML show; `says` is what `gpucap check` must name as the
/// cap's source. Returns what `gpucap check` printed.
pub fn assert_capped_at_1gib(rt: &Runtime, c: &mut Container, check: &str, says: &str) -> String {
    c.shell(&format!(
        "{BIN}/cudarc-client 600 600 && echo --- && {BIN}/nvml list dl && echo --- && {check}"
    ));
    let o = rt.run(c);
    let out = stdout(&o);
    let parts: Vec<&str> = out.split("---\n").collect();
    assert!(o.status.success() && parts.len() == 3, "{}", dump(&o));
    let r = ClientReport::parse(parts[0]);
    assert_eq!(r.outcomes(), CAPPED, "{}", dump(&o));
    assert_eq!(r.total_mem, Some(GIB), "cuDeviceTotalMem\n{}", dump(&o));
    assert_eq!(
        r.mem_info.first().map(|m| m.1),
        Some(GIB),
        "cuMemGetInfo\n{}",
        dump(&o)
    );
    let nvml_total = parts[1]
        .lines()
        .find(|l| l.starts_with("dev 0 "))
        .and_then(|l| l.split_whitespace().find_map(|w| w.strip_prefix("total=")))
        .and_then(|v| v.parse::<u64>().ok());
    assert_eq!(nvml_total, Some(GIB), "NVML's total\n{}", dump(&o));
    assert!(
        parts[2].contains(says),
        "gpucap check does not name {says:?}\n{}",
        dump(&o)
    );
    parts[2].to_string()
}

/// A grant that no claim's directory comes with is shared in the container's pool, in
/// the container's own `/dev/shm`: `gpucap check` says so.
fn assert_in_the_containers_pool(check: &str) {
    assert!(
        check.contains("pool: one per container, container-mntns")
            && check.contains("(file /dev/shm/gpucap-container-"),
        "the grant is not the container's pool's\n{check}"
    );
}

#[test]
pub fn hami_dra_handover_caps_a_plain_image() {
    let Some(rt) = runtime() else { return };
    let dir = host_dir("ctr-hami-dra");
    let mut c = Container::new("hami-dra");
    hami_dra(&mut c, &dir, "claim-a", 1024);
    assert_capped_at_1gib(
        &rt,
        &mut c,
        &check_with("/usr/local/vgpu/libvgpu.so"),
        "CUDA_DEVICE_MEMORY_LIMIT_0",
    );
    // The control: the same variables, but HAMi's place holds no library.
    let mut bare = Container::new("hami-dra-bare");
    bare.env("CUDA_DEVICE_MEMORY_LIMIT_0", "1024m");
    assert_uncapped(&rt, &mut bare);
}

#[test]
pub fn hami_classic_handover_caps_a_plain_image() {
    let Some(rt) = runtime() else { return };
    let dir = host_dir("ctr-hami");
    let preload = write(&dir.join("ld.so.preload"), "/usr/local/vgpu/libvgpu.so\n");
    let mut c = Container::new("hami");
    c.mount_ro(&shim(), "/usr/local/vgpu/libvgpu.so")
        .mount_ro(&preload, "/etc/ld.so.preload")
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1024m")
        .env("CUDA_DEVICE_SM_LIMIT", "50")
        .env(
            "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            "/usr/local/vgpu/0b3f0a52-31c6-4a5e-9d0b-6c8e1f4d2a11.cache",
        );
    assert_capped_at_1gib(
        &rt,
        &mut c,
        &check_with("/usr/local/vgpu/libvgpu.so"),
        "CUDA_DEVICE_MEMORY_LIMIT_0",
    );
}

#[test]
pub fn vgpu_manager_handover_caps_a_plain_image() {
    let Some(rt) = runtime() else { return };
    let dir = host_dir("ctr-vgpu-manager");
    let mut c = Container::new("vgpu-manager");
    vgpu_manager(&mut c, &dir, "claim-a", 1024);
    assert_capped_at_1gib(
        &rt,
        &mut c,
        &check_with("/etc/vgpu-manager/driver/libvgpu-control.so"),
        "CUDA_MEM_LIMIT_0",
    );
}

#[test]
pub fn dra_example_driver_handover_caps_a_plain_image() {
    let Some(rt) = runtime() else { return };
    let dir = host_dir("ctr-dra-example");
    let mut c = Container::new("dra-example");
    gpucap_library(&mut c, &dir);
    c.env("GPU_DEVICE_0", "gpu-0")
        .env("GPU_DEVICE_0_MEMORY", "1Gi");
    let check = assert_capped_at_1gib(
        &rt,
        &mut c,
        &check_with("/usr/local/lib/gpucap-cdi/libgpucap.so"),
        "GPU_DEVICE_0_MEMORY",
    );
    assert_in_the_containers_pool(&check);
}

#[test]
pub fn nvidia_toolkit_handover_caps_a_plain_image() {
    let Some(rt) = runtime() else { return };
    let dir = host_dir("ctr-nvidia");
    let mut c = Container::new("nvidia");
    gpucap_library(&mut c, &dir);
    c.env("NVIDIA_VISIBLE_DEVICES", GPU0)
        .env("NVIDIA_GPU_MEMORY_LIMIT", "1024")
        .env("NVIDIA_GPU_MEMORY_REQUEST", "512");
    let check = assert_capped_at_1gib(
        &rt,
        &mut c,
        &check_with("/usr/local/lib/gpucap-cdi/libgpucap.so"),
        "NVIDIA_GPU_MEMORY_LIMIT",
    );
    assert_in_the_containers_pool(&check);
}
