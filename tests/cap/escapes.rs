//! Escapes users found: ways a program got the driver to hold more than its cap
//! through VMM handles and stream-ordered pools (tests/c/escapes.c). Each runs as the
//! user hit it, with the shim (the program's own checks must pass, the fake driver's
//! recorded peak must stay within the cap, gpucap must have refused) and without it
//! (the same checks must fail: the escape is real).

use super::common;

use std::path::PathBuf;
use std::process::Output;

use common::*;

fn prog() -> PathBuf {
    compile_c("escapes", "", &["-lcuda"])
}

/// Runs `escapes args` on `devices` fake GPUs of 8 GiB, with the shim and
/// `GPUCAP_LIMIT=limit` when `limit` is given; `env` goes to the run too.
fn escapes(
    args: &[&str],
    devices: u32,
    limit: Option<&str>,
    env: &[(&str, &str)],
) -> (Output, Vec<DevStats>) {
    let stats = scratch(&format!("escapes-{}", args[0])).join("stats.json");
    let mut c = fake_cmd(prog(), &stats);
    c.env("FAKECUDA_TOTAL_MEM", "8Gi")
        .env("FAKECUDA_DEVICES", devices.to_string());
    if let Some(limit) = limit {
        preload(&mut c).env("GPUCAP_LIMIT", limit);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let o = run(c.args(args));
    let s = read_stats(&stats);
    (o, s)
}

/// The escape without the shim: the program's checks of the cap fail.
#[track_caller]
fn control_fails(args: &[&str], devices: u32) -> Vec<DevStats> {
    let (o, s) = escapes(args, devices, None, &[]);
    assert_failed(&o, &format!("{} without the shim", args[0]));
    s
}

#[track_caller]
fn count(lines: &[String], needle: &str) -> usize {
    lines.iter().filter(|l| l.contains(needle)).count()
}

/// cuMemCreate -> cuMemAddressReserve -> cuMemMap -> cuMemSetAccess -> cuMemRelease at
/// once (NVIDIA's documented idiom), 8 x 512 MiB under a 1 GiB cap: the mapping keeps
/// the memory, so the cap stays charged until the last unmap.
#[test]
fn vmm_memory_released_while_mapped_stays_charged() {
    for env in [&[][..], &[("GPUCAP_GROWTH", "1")][..]] {
        // At debug every refusal has its line (the same one repeated at once prints once).
        let env = [env, &[("GPUCAP_LOG", "debug")][..]].concat();
        let (o, s) = escapes(&["vmm-idiom", "1Gi"], 1, Some("1Gi"), &env);
        assert_passed(&o, &format!("vmm-idiom with the shim {env:?}"));
        assert!(
            s[0].peak_used <= GIB,
            "the driver held more than the 1 GiB cap {env:?}: {:?}",
            s[0]
        );
        assert_eq!(s[0].final_used, 0, "{:?}", s[0]);
        let refused = refusals(&stderr(&o));
        assert_eq!(
            count(
                &refused,
                "refused cuMemCreate of 512 MiB on GPU 0: 1 GiB of the 1 GiB cap in use"
            ),
            6,
            "the third to eighth rounds were refused {env:?}: {refused:?}"
        );
    }
    let s = control_fails(&["vmm-idiom", "1Gi"], 1);
    assert_eq!(
        s[0].peak_used,
        4 * GIB,
        "without the shim the driver holds all eight: {:?}",
        s[0]
    );
}

/// One handle mapped twice; a reference added by cuMemRetainAllocationHandle; one
/// cuMemUnmap over two mappings, one the driver refuses, a cuMemAddressFree that takes
/// a mapping with it: charged exactly while the driver holds the memory.
#[test]
fn vmm_memory_is_credited_at_the_last_unmap_and_the_last_reference() {
    for mode in ["vmm-aliases", "vmm-retain", "vmm-unmap-many"] {
        let (o, s) = escapes(&[mode, "1Gi"], 1, Some("1Gi"), &[]);
        assert_passed(&o, &format!("{mode} with the shim"));
        assert!(s[0].peak_used <= GIB, "{mode}: {:?}", s[0]);
        assert_eq!(s[0].final_used, 0, "{mode}: {:?}", s[0]);
        let refused = refusals(&stderr(&o));
        let want = match mode {
            "vmm-unmap-many" => 0,
            _ => 1,
        };
        assert_eq!(
            count(
                &refused,
                "refused cuMemCreate of 768 MiB on GPU 0: 512 MiB of the 1 GiB cap in use"
            ),
            want,
            "{mode}: {refused:?}"
        );
        control_fails(&[mode, "1Gi"], 1);
    }
}

/// A thread with no current context (a loader's worker thread: PyTorch's expandable
/// segments under HF transformers' threaded weight loading) makes `cuMemCreate` handles
/// of half the 1 GiB cap, and the main thread with its context popped allocates half the
/// cap with `cuMemAllocAsync` on a stream of GPU 0: the handle's location and the stream
/// name the GPU, and the driver serves them without a context, so each third is
/// refused (before, both passed uncharged: the fake driver held 2 GiB under a 1 GiB
/// cap, gpucap counting none of it).
#[test]
fn memory_a_call_places_on_a_gpu_is_charged_without_a_current_context() {
    let (o, s) = escapes(&["no-context-thread", "1Gi"], 1, Some("1Gi"), &[]);
    assert_passed(&o, "no-context-thread with the shim");
    assert!(s[0].peak_used <= GIB, "{:?}", s[0]);
    let refused = refusals(&stderr(&o));
    for api in ["cuMemCreate", "cuMemAllocAsync"] {
        assert!(
            count(&refused, &format!("refused {api} of 512 MiB on GPU 0")) >= 1,
            "{api}: {refused:?}"
        );
    }
    let s = control_fails(&["no-context-thread", "1Gi"], 1);
    assert_eq!(s[0].peak_used, 2 * GIB, "without the shim: {:?}", s[0]);
}

/// GPU 0's context current, GPU 1's default pool: `cuMemAllocFromPoolAsync` x3 of 1 GiB
/// under `0=4Gi,1=1Gi`. The pool is GPU 1's, and so is the charge. Likewise a pool
/// created on GPU 1, and `cuMemAllocAsync` on a stream of GPU 1.
#[test]
fn a_pool_of_another_gpu_is_charged_to_that_gpu() {
    // A CUDA 13.2+ driver answers the pool's location attributes; an older one does
    // not, and the pool is found among the devices' default and current pools.
    for version in ["13050", "12080"] {
        pool_of_another_gpu(version);
    }
}

#[track_caller]
fn pool_of_another_gpu(version: &str) {
    let args = ["pool-other-gpu", "4Gi", "1Gi"];
    // At debug every refusal has its line (the same one repeated at once prints once).
    let env = [
        ("FAKECUDA_DRIVER_VERSION", version),
        ("GPUCAP_LOG", "debug"),
    ];
    let (o, s) = escapes(&args, 2, Some("0=4Gi,1=1Gi"), &env);
    assert_passed(
        &o,
        &format!("pool-other-gpu with the shim, driver {version}"),
    );
    assert!(s[1].peak_used <= GIB, "GPU 1 over its cap: {:?}", s[1]);
    assert_eq!(s[0].peak_used, 0, "GPU 0 holds nothing: {:?}", s[0]);
    assert_eq!((s[0].final_used, s[1].final_used), (0, 0));
    let refused = refusals(&stderr(&o));
    assert_eq!(
        count(
            &refused,
            "refused cuMemAllocFromPoolAsync of 1 GiB on GPU 1: 1 GiB of the 1 GiB cap in use"
        ),
        3,
        "two from the default pool, one from the created pool: {refused:?}"
    );
    assert_eq!(
        count(
            &refused,
            "refused cuMemAllocAsync of 1 GiB on GPU 1: 1 GiB of the 1 GiB cap in use"
        ),
        1,
        "one on GPU 1's stream: {refused:?}"
    );
    let s = control_fails(&args, 2);
    assert!(s[1].peak_used >= 3 * GIB, "{:?}", s[1]);
}

/// Pool memory freed with cuMemFree_v2 and its pool destroyed, in either order, with no
/// trim: nothing stays charged, so a later 768 MiB cuMemAlloc fits a 1 GiB cap.
#[test]
fn pool_memory_freed_with_cu_mem_free_is_credited() {
    for mode in ["pool-free-then-destroy", "pool-destroy-then-free"] {
        let (o, s) = escapes(&[mode, "1Gi"], 1, Some("1Gi"), &[]);
        assert_passed(&o, &format!("{mode} with the shim"));
        assert!(s[0].peak_used <= GIB, "{mode}: {:?}", s[0]);
        assert_eq!(s[0].final_used, 0, "{mode}: {:?}", s[0]);
        let refused = refusals(&stderr(&o));
        assert!(refused.is_empty(), "{mode}: {refused:?}");
        control_fails(&[mode, "1Gi"], 1);
    }
}

/// The driver backs an allocation above 1 MiB with whole 2 MiB pages (an H200 with
/// driver 580 took 4 MiB for 3 MiB + 1 byte; the fake does the same): charged the bytes
/// asked for, blocks of 2 MiB + 4 KiB got the driver to hold twice the cap. Charged in
/// pages (`gpucap_core::linear`), the driver's own figure stays within the cap for
/// cuMemAlloc_v2 and cuMemAllocPitch_v2 blocks just over a page, over 1 MiB, and over
/// 3 MiB; the refusal names the bytes asked for.
#[test]
fn allocations_just_over_a_page_cannot_take_the_driver_past_the_cap() {
    let (o, s) = escapes(&["page-rounding", "256Mi"], 1, Some("256Mi"), &[]);
    assert_passed(&o, "page-rounding with the shim");
    assert!(
        s[0].peak_used <= 256 * MIB,
        "the driver held more than the 256 MiB cap: {:?}",
        s[0]
    );
    assert_eq!(s[0].final_used, 0, "{:?}", s[0]);
    let out = String::from_utf8_lossy(&o.stdout);
    for line in [
        "cuMemAlloc_v2: 64 blocks of 2101248 bytes",
        "cuMemAlloc_v2: 128 blocks of 1052672 bytes",
        "cuMemAlloc_v2: 64 blocks of 3145729 bytes",
        "cuMemAllocPitch_v2: 64 blocks of 2101248 bytes",
    ] {
        assert!(out.contains(line), "{line:?} in {out}");
    }
    let refused = refusals(&stderr(&o));
    for line in [
        "refused cuMemAlloc of 2 MiB (2101248 B, charged 4 MiB) on GPU 0: 256 MiB of the 256 MiB cap in use",
        "refused cuMemAlloc of 1 MiB (1052672 B, charged 2 MiB) on GPU 0: 256 MiB of the 256 MiB cap in use",
        "refused cuMemAllocPitch of 2 MiB (2101248 B, charged 4 MiB) on GPU 0: 256 MiB of the 256 MiB cap in use",
    ] {
        assert!(
            refused.iter().any(|l| l.ends_with(line)),
            "{line:?} in {refused:?}"
        );
    }
    let s = control_fails(&["page-rounding", "256Mi"], 1);
    assert!(s[0].peak_used > 256 * MIB, "{:?}", s[0]);
}

/// A module's `__device__` globals take device memory when the driver loads it (an H200
/// with driver 580 took 2 MiB for a module with a 1 MiB global; the fake takes their
/// size): no allocation call shows it. Measured around cuModuleLoadData and charged, a
/// module holding 5/8 of a 256 MiB cap leaves no room for half the cap nor for a second
/// such module (loaded, measured, unloaded and refused: the driver held it for that
/// moment); cuModuleUnload and the end of the module's context give it back.
#[test]
fn a_modules_globals_are_charged_while_it_is_loaded() {
    let dir = scratch("escapes-module-pool");
    let pool_dir = dir.to_str().unwrap();
    // Alone, then as a pool's only member (the pool's rule refuses, with its line): the
    // load measured with the pool's marks, charged to both, credited to both.
    for env in [
        &[][..],
        &[("GPUCAP_POOL", "modules"), ("GPUCAP_POOL_DIR", pool_dir)][..],
    ] {
        let (o, s) = escapes(&["module-globals", "256Mi"], 1, Some("256Mi"), env);
        assert_passed(&o, &format!("module-globals with the shim {env:?}"));
        assert_eq!(s[0].final_used, 0, "{:?}", s[0]);
        assert!(
            s[0].peak_used <= 256 * MIB + 160 * MIB,
            "beyond the cap only the refused module, for its moment: {:?}",
            s[0]
        );
        let refused = refusals(&stderr(&o));
        let of = of_the(env);
        for api in ["cuMemAlloc of 128 MiB", "cuModuleLoadData of 160 MiB"] {
            let line = format!("refused {api} on GPU 0: 160 MiB of {of} 256 MiB cap in use");
            assert!(
                refused.iter().any(|l| l.contains(&line)),
                "{line:?} in {refused:?}"
            );
        }
    }
    control_fails(&["module-globals", "256Mi"], 1);
}

/// A larger stack (`cuCtxSetLimit(CU_LIMIT_STACK_SIZE)`, `cudaDeviceSetLimit`) takes
/// device memory at the call, which no allocation call shows: an H100 took 3.87 GiB for
/// 16 KiB per thread. Measured around the call and charged, a stack of over half a
/// 512 MiB cap leaves no room for half the cap; one the cap cannot take is refused with
/// the old value kept; lowering it, and the end of its context, give it back.
#[test]
fn a_larger_stack_is_charged_while_the_context_has_it() {
    let dir = scratch("escapes-stack-pool");
    let pool_dir = dir.to_str().unwrap();
    for env in [
        &[][..],
        &[("GPUCAP_POOL", "stacks"), ("GPUCAP_POOL_DIR", pool_dir)][..],
    ] {
        let (o, s) = escapes(&["stack-limit", "512Mi"], 1, Some("512Mi"), env);
        assert_passed(&o, &format!("stack-limit with the shim {env:?}"));
        assert_eq!(s[0].final_used, 0, "{:?}", s[0]);
        assert!(
            s[0].peak_used <= 512 * MIB + 528 * MIB,
            "beyond the cap only the refused stack, for its moment: {:?}",
            s[0]
        );
        let refused = refusals(&stderr(&o));
        let of = of_the(env);
        for api in ["cuMemAlloc of 256 MiB", "cuCtxSetLimit of 264 MiB"] {
            let line = format!("refused {api} on GPU 0: 264 MiB of {of} 512 MiB cap in use");
            assert!(
                refused.iter().any(|l| l.contains(&line)),
                "{line:?} in {refused:?}"
            );
        }
    }
    control_fails(&["stack-limit", "512Mi"], 1);
}

/// On a driver that will not set a stack back (`FAKECUDA_STACK_LOWER_FAILS=1`): a stack
/// the cap cannot take is refused before the driver takes it (it stays as it was: measured
/// and refused after the call, the driver kept it past the cap, charged by force), and one
/// it can take, whose lowering the driver refuses, stays charged: the rest of the cap is
/// served and no more, the refused lowering credits nothing, and the context's end gives
/// it all back. Alone and in a pool.
#[test]
fn a_stack_the_driver_will_not_set_back_stays_charged() {
    let dir = scratch("escapes-stuck-stack-pool");
    let pool_dir = dir.to_str().unwrap();
    let stuck = ("FAKECUDA_STACK_LOWER_FAILS", "1");
    for env in [
        &[stuck][..],
        &[
            stuck,
            ("GPUCAP_POOL", "stuck"),
            ("GPUCAP_POOL_DIR", pool_dir),
        ][..],
    ] {
        let (o, s) = escapes(&["stuck-stack", "512Mi"], 1, Some("512Mi"), env);
        assert_passed(&o, &format!("stuck-stack with the shim {env:?}"));
        assert_eq!(s[0].final_used, 0, "{:?}", s[0]);
        assert!(
            s[0].peak_used <= 512 * MIB,
            "the stack refused before the driver took it: never beyond the cap: {:?}",
            s[0]
        );
        let err = stderr(&o);
        let refused = refusals(&err);
        assert!(
            refused
                .iter()
                .any(|l| l.contains("refused cuCtxSetLimit of 264 MiB on GPU 0")),
            "{refused:?}"
        );
    }
    let (o, _) = escapes(&["stuck-stack", "512Mi"], 1, None, &[stuck]);
    assert_failed(&o, "stuck-stack without the shim");
}

/// Kernels loaded lazily (CUDA's default): a library's kernels take device memory in a
/// context at their first use there, inside the launch, which no allocation call shows
/// (PyTorch's first kernel: 92 MiB on an H200). Measured at each function's first launch
/// (or `cuKernelGetFunction`) and charged, past the cap if need be (a launch cannot be
/// refused once made): allocations the cap cannot take beside them are refused; the
/// context's end gives them back. Also on a driver that loads a kernel at the question of
/// its attributes (`FAKECUDA_KERNEL_ATTRIBUTE_LOADS`; not recorded of a real one): gpucap
/// loads a kernel handle itself, measured, before it asks its local memory (before, its
/// own question loaded the library unmeasured: 96 MiB charged nothing).
#[test]
fn kernels_loaded_at_a_first_launch_are_charged() {
    let dir = scratch("escapes-lazy-pool");
    let pool_dir = dir.to_str().unwrap();
    let lib = [
        ("FAKECUDA_LIBRARY_MEM", "96Mi"),
        ("FAKECUDA_FUNCTION_MEM", "32Mi"),
    ];
    for env in [
        &[][..],
        &[("GPUCAP_POOL", "lazy"), ("GPUCAP_POOL_DIR", pool_dir)][..],
        &[("FAKECUDA_NVML_FAIL", "1")][..],
        // NVML lists the host's pids (a container): this process is not in its list.
        &[("FAKECUDA_NVML_PID_OFFSET", "100000")][..],
        // A driver that loads a kernel at an attribute question gpucap asks.
        &[("FAKECUDA_KERNEL_ATTRIBUTE_LOADS", "1")][..],
    ] {
        let env = [&lib[..], env].concat();
        let (o, s) = escapes(&["lazy-kernels", "256Mi"], 1, Some("256Mi"), &env);
        assert_passed(&o, &format!("lazy-kernels with the shim {env:?}"));
        assert_eq!(s[0].final_used, 0, "{:?}", s[0]);
        let err = stderr(&o);
        assert!(
            err.contains("cuLaunchKernel: the kernels its first use loaded took 96 MiB on GPU 0, past the cap (320 MiB of 256 MiB in use)"),
            "{env:?}: {err}"
        );
        let refused = refusals(&err);
        let line = format!(
            "refused cuMemAlloc of 64 MiB on GPU 0: 224 MiB of {} 256 MiB cap in use",
            of_the(&env)
        );
        assert!(
            refused.iter().any(|l| l.contains(&line)),
            "{line:?} in {refused:?}"
        );
    }
    let (o, _) = escapes(&["lazy-kernels", "256Mi"], 1, None, &lib);
    assert_failed(&o, "lazy-kernels without the shim");
}

/// A library's kernel is loaded by the driver into every context that uses it (issue
/// 34): a kernel handle launched (or asked for with `cuKernelGetFunction`) in five
/// created contexts beside the primary is charged in each, so that a sixth copy past the
/// cap is refused before the driver loads it, and the fake driver's own figure never
/// passes the cap; each created context's copy is credited with it. Alone, in a pool,
/// without NVML, with NVML listing host pids as in a container (this process is not
/// in its list: the measurement falls back to the context's free memory), and on a driver
/// that loads a kernel at the question of its attributes.
#[test]
fn a_librarys_kernels_are_charged_in_every_context_they_are_loaded_into() {
    let dir = scratch("escapes-lazy-contexts-pool");
    let pool_dir = dir.to_str().unwrap();
    let lib = [("FAKECUDA_LIBRARY_MEM", "200Mi")];
    for env in [
        &[][..],
        &[("GPUCAP_POOL", "ctxs"), ("GPUCAP_POOL_DIR", pool_dir)][..],
        &[("FAKECUDA_NVML_FAIL", "1")][..],
        &[("FAKECUDA_NVML_PID_OFFSET", "100000")][..],
        &[("FAKECUDA_KERNEL_ATTRIBUTE_LOADS", "1")][..],
    ] {
        let env = [&lib[..], env].concat();
        let (o, s) = escapes(&["lazy-contexts", "1000Mi"], 1, Some("1000Mi"), &env);
        assert_passed(&o, &format!("lazy-contexts with the shim {env:?}"));
        assert!(
            s[0].peak_used <= 1000 << 20,
            "{env:?}: the fake driver held {} MiB under a 1000 MiB cap",
            s[0].peak_used >> 20
        );
        assert_eq!(s[0].final_used, 0, "{:?}", s[0]);
        let err = stderr(&o);
        assert!(
            err.contains("cuLaunchKernel: refused before the driver loaded anything: a first use of this library or module in this context is expected to load 200 MiB on GPU 0"),
            "{env:?}: {err}"
        );
    }
    let (o, s) = escapes(&["lazy-contexts", "1000Mi"], 1, None, &lib);
    assert_failed(&o, "lazy-contexts without the shim");
    assert!(
        s[0].peak_used >= 1200 << 20,
        "six copies without the shim: {:?}",
        s[0]
    );
}

/// Under eager loading (`CUDA_MODULE_LOADING=EAGER`) the driver loads a library into
/// every context of the process at its load and into a later context at its creation, and
/// a first use loads nothing (its documentation; an H200 took 732 MiB more with PyTorch's
/// context, 512 MiB against 98 at cuBLAS's first matmul). Each copy is charged where it
/// is taken, on both GPUs; one past the cap is refused and keeps nothing; each goes with
/// its context or its library (`escapes.c`, `eager-libraries`). Alone, in a pool and
/// without NVML. Lazily, the same program's checks fail: nothing is taken at the load.
#[test]
fn a_library_loaded_eagerly_is_charged_in_every_context_at_its_load() {
    let dir = scratch("escapes-eager-pool");
    let pool_dir = dir.to_str().unwrap();
    let args = ["eager-libraries", "1000Mi", "1000Mi"];
    let eager = [
        ("CUDA_MODULE_LOADING", "EAGER"),
        ("FAKECUDA_LIBRARY_MEM", "250Mi"),
    ];
    for env in [
        &[][..],
        &[("GPUCAP_POOL", "eager"), ("GPUCAP_POOL_DIR", pool_dir)][..],
        &[("FAKECUDA_NVML_FAIL", "1")][..],
    ] {
        let env = [&eager[..], env].concat();
        let (o, s) = escapes(&args, 2, Some("1000Mi"), &env);
        assert_passed(&o, &format!("eager-libraries with the shim {env:?}"));
        assert_eq!((s[0].final_used, s[1].final_used), (0, 0), "{s:?}");
        let err = stderr(&o);
        assert!(
            err.contains("refused cuLibraryLoadData") && err.contains("on GPU 0"),
            "{env:?}: {err}"
        );
    }
    let (o, _) = escapes(&args, 2, None, &eager);
    assert_failed(&o, "eager-libraries without the shim");
    let (o, _) = escapes(&args, 2, Some("1000Mi"), &eager[1..]);
    assert_failed(&o, "eager-libraries loaded lazily");
}

/// A launch of a kernel whose threads take more local memory than the context's stack
/// makes the driver grow the stack to it and keep it (CUDA's `cuCtxSetLimit`
/// documentation; an H100 takes 3.87 GiB for 16 KiB a thread): charged as the stack is,
/// and refused before the driver grows anything where the cap cannot take it (`escapes.c`,
/// `local-stack`). Lazily and eagerly loaded, alone and in a pool; the fake driver's
/// figure never passes the cap. A graph's kernel likewise, at the graph's instantiation
/// (`graph-local-stack`).
#[test]
fn a_launch_that_grows_the_stack_is_charged_and_refused_past_the_cap() {
    let dir = scratch("escapes-local-stack-pool");
    let pool_dir = dir.to_str().unwrap();
    for env in [
        &[][..],
        &[("CUDA_MODULE_LOADING", "EAGER")][..],
        &[("GPUCAP_POOL", "stack"), ("GPUCAP_POOL_DIR", pool_dir)][..],
        &[("FAKECUDA_KERNEL_ATTRIBUTE_LOADS", "1")][..],
    ] {
        let (o, s) = escapes(&["local-stack", "2Gi"], 1, Some("2Gi"), env);
        assert_passed(&o, &format!("local-stack with the shim {env:?}"));
        assert!(
            s[0].peak_used <= 2 << 30,
            "{env:?}: the driver held {} MiB",
            s[0].peak_used >> 20
        );
        let err = stderr(&o);
        assert!(err.contains("refused cuLaunchKernel"), "{env:?}: {err}");
    }
    let (o, s) = escapes(&["local-stack", "2Gi"], 1, None, &[]);
    assert_failed(&o, "local-stack without the shim");
    assert!(
        s[0].peak_used > 2 << 30,
        "without the shim the stack passes the cap: {s:?}"
    );
    // A graph's kernel grows the stack when the graph runs: raised or refused at its
    // instantiation.
    for env in [
        &[][..],
        &[("CUDA_MODULE_LOADING", "EAGER")][..],
        &[("FAKECUDA_KERNEL_ATTRIBUTE_LOADS", "1")][..],
    ] {
        let (o, s) = escapes(&["graph-local-stack", "2Gi"], 1, Some("2Gi"), env);
        assert_passed(&o, &format!("graph-local-stack with the shim {env:?}"));
        assert!(
            s[0].peak_used <= 2 << 30,
            "{env:?}: the driver held {} MiB",
            s[0].peak_used >> 20
        );
        let err = stderr(&o);
        assert!(
            err.contains("refused cuGraphInstantiateWithFlags"),
            "{env:?}: {err}"
        );
    }
    let (o, s) = escapes(&["graph-local-stack", "2Gi"], 1, None, &[]);
    assert_failed(&o, "graph-local-stack without the shim");
    assert!(
        s[0].peak_used > 2 << 30,
        "without the shim the graph's stack passes the cap: {s:?}"
    );
}

/// A library's kernel whose threads take more than the stack, launched first inside a
/// stream capture: lazy loading loads the library's code into the context at the capture,
/// and gpucap charges it then (before, such a launch was forwarded unseen: its code was
/// charged nowhere), while the stack is grown only where the kernel runs (the graph's
/// instantiation, a launch outside a capture). Alone and in a pool (`escapes.c`,
/// `capture-local-library`). And on a driver that forbids `cuMemGetInfo` during a capture
/// (`FAKECUDA_CAPTURE_UNSAFE`; the program checks that its own call is refused there), with
/// NVML failing so that gpucap measures the load by the context's free memory: gpucap's
/// queries are made in relaxed capture mode, so the capture still ends with its graph (a
/// GPU-sharing shim's own call inside a capture broke llama.cpp's graphs: nvshare issue 28).
#[test]
fn a_kernel_first_launched_in_a_capture_has_its_code_charged_and_its_stack_left_for_its_run() {
    let dir = scratch("escapes-capture-local-pool");
    let pool_dir = dir.to_str().unwrap();
    let code = ("FAKECUDA_LIBRARY_MEM", "128Mi");
    let strict = [
        ("FAKECUDA_CAPTURE_UNSAFE", "cuMemGetInfo_v2"),
        ("FAKECUDA_NVML_FAIL", "1"),
    ];
    for env in [
        &[code][..],
        &[
            code,
            ("GPUCAP_POOL", "capture"),
            ("GPUCAP_POOL_DIR", pool_dir),
        ][..],
        &[code, strict[0], strict[1]][..],
    ] {
        let (o, s) = escapes(&["capture-local-library", "2Gi"], 1, Some("2Gi"), env);
        assert_passed(&o, &format!("capture-local-library with the shim {env:?}"));
        assert!(
            s[0].peak_used <= 2 << 30,
            "{env:?}: the driver held {} MiB",
            s[0].peak_used >> 20
        );
    }
    let (o, _) = escapes(&["capture-local-library", "2Gi"], 1, None, &[code]);
    assert_failed(&o, "capture-local-library without the shim");
}

/// `escapes MODE 2Gi` under a 2 GiB cap with the fake's `code` setting: alone, in a fresh
/// pool and with each of `more` added, it passes and the driver holds nothing at its end;
/// without the shim the same run fails (the escape is real).
#[track_caller]
fn charged_alone_and_in_a_pool(mode: &str, code: &[(&str, &str)], more: &[(&str, &str)]) {
    let dir = scratch(&format!("escapes-{mode}-pool"));
    let pool_dir = dir.to_str().unwrap();
    let pool = [("GPUCAP_POOL", "escape"), ("GPUCAP_POOL_DIR", pool_dir)];
    let mut envs = vec![code.to_vec(), [code, &pool[..]].concat()];
    envs.extend(more.iter().map(|&m| [code, &[m][..]].concat()));
    for env in &envs {
        let (o, s) = escapes(&[mode, "2Gi"], 1, Some("2Gi"), env);
        assert_passed(&o, &format!("{mode} with the shim {env:?}"));
        assert_eq!(s[0].final_used, 0, "{env:?}: {:?}", s[0]);
    }
    let (o, _) = escapes(&[mode, "2Gi"], 1, None, code);
    assert_failed(&o, &format!("{mode} without the shim"));
}

/// A library's kernel whose threads take more than the stack, its function asked for first
/// (`cuKernelGetFunction` loads the library's code into the context: charged), then
/// launched by its kernel handle: the launch grows the stack, and gpucap charges it.
/// Before, asking for the function marked the kernel handle seen in the context, so its
/// launch was forwarded unmeasured and the stack it grew (1,848 MiB here) charged
/// nowhere. Alone and in a pool (`escapes.c`, `kernel-function-stack`).
#[test]
fn a_kernel_launched_by_its_handle_after_its_function_was_asked_for_has_its_stack_charged() {
    charged_alone_and_in_a_pool(
        "kernel-function-stack",
        &[("FAKECUDA_LIBRARY_MEM", "128Mi")],
        &[("FAKECUDA_KERNEL_ATTRIBUTE_LOADS", "1")],
    );
}

/// A graph built by hand (`cuGraphAddKernelNode_v2` with a kernel handle of a library
/// never used in the context): the driver loads the library's code into the context for
/// the graph (the fake at the node's making), and an executable graph's node given a
/// second library's kernel (`cuGraphExecKernelNodeSetParams_v2`) loads that one: gpucap
/// loads each such kernel first itself (`cuKernelGetFunction`), measured as a first use,
/// wherever the driver would have loaded it. Before, neither was charged (128 MiB each
/// here). Alone, in a pool, and with NVML failing (measured by the context's free memory).
#[test]
fn a_graph_built_by_hand_has_its_kernels_code_charged() {
    charged_alone_and_in_a_pool(
        "graph-node-library",
        &[("FAKECUDA_LIBRARY_MEM", "128Mi")],
        &[
            ("FAKECUDA_NVML_FAIL", "1"),
            ("FAKECUDA_KERNEL_ATTRIBUTE_LOADS", "1"),
        ],
    );
}

/// The same graph built with CUDA 12.2's generic node calls (`cuGraphAddNode`, `_v2`, and
/// `cuGraphExecNodeSetParams`, a `CUgraphNodeParams` of the kernel type): gpucap loads the
/// node's kernel first, measured, as for `cuGraphAddKernelNode`. Before, they were
/// forwarded: each library's code (128 MiB here) was charged nothing. Alone and in a pool
/// (`escapes.c`, `graph-generic-node`, `graph-generic-node-v2`).
#[test]
fn a_graph_built_with_the_generic_node_calls_has_its_kernels_code_charged() {
    for mode in ["graph-generic-node", "graph-generic-node-v2"] {
        charged_alone_and_in_a_pool(mode, &[("FAKECUDA_LIBRARY_MEM", "128Mi")], &[]);
    }
}

/// A module's functions listed by `cuModuleEnumerateFunctions` (CUDA 12.4) are "partially
/// loaded" under lazy loading, and "CUDA APIs may load the function automatically" (NVIDIA's
/// documentation; the fake loads one at its first launch, an attribute asked, `cuFuncLoad`):
/// gpucap loads such a function itself, measured, before it asks its local memory at the
/// first launch, and measures the program's `cuFuncLoad`. Before, its own question loaded
/// the code unmeasured (128 MiB a function here). Alone and in a pool.
#[test]
fn functions_listed_by_their_module_are_charged_when_a_call_loads_them() {
    charged_alone_and_in_a_pool(
        "enumerated-functions",
        &[("FAKECUDA_FUNCTION_MEM", "128Mi")],
        &[],
    );
}

/// The program's own `cuFuncGetAttribute` and `cuFuncSetAttribute` on functions listed by
/// `cuModuleEnumerateFunctions` load their code (the fake, as NVIDIA documents "CUDA APIs
/// may load the function automatically"): gpucap loads such a function first, measured,
/// and refuses the call before the load where the cap has no room for what the module's
/// first function took. Before, each loaded 128 MiB here uncharged. Alone and in a pool
/// (`escapes.c`, `enumerated-attributes`).
#[test]
fn functions_listed_by_their_module_are_charged_when_their_attributes_load_them() {
    charged_alone_and_in_a_pool(
        "enumerated-attributes",
        &[("FAKECUDA_FUNCTION_MEM", "128Mi")],
        &[],
    );
}

/// The deprecated launches (`cuLaunch`, `cuLaunchGrid`, `cuLaunchGridAsync`, replaced by
/// `cuLaunchKernel` in CUDA 4.0, still exported by driver 580): a first launch through
/// them grows the context's stack to its kernel's local memory and loads a partially
/// loaded function's code, as `cuLaunchKernel`'s does; gpucap measures them so, and refuses
/// a stack past the cap before the driver grows it. Before, gpucap forwarded them: the
/// stacks (792 and 1,848 MiB here) and the code (64 MiB a function) were charged nothing.
/// Alone and in a pool (`escapes.c`, `legacy-launches`).
#[test]
fn the_deprecated_launches_are_measured_as_cu_launch_kernel_is() {
    charged_alone_and_in_a_pool("legacy-launches", &[("FAKECUDA_FUNCTION_MEM", "64Mi")], &[]);
}

/// `cuLaunchCooperativeKernelMultiDevice` (deprecated since CUDA 11.3, still in driver 580
/// and cudart 13): one call launching a function on two GPUs, each on a stream of its own
/// GPU's context. Each context's first launch grows its stack to the kernel's local memory,
/// loads a partially loaded function's code and takes a raised heap: gpucap makes each
/// function ready in its own context first (loaded, measured; the stack grown, or the call
/// refused before the driver grows GPU 1's past its cap) and measures the call on both GPUs
/// where a raised heap may be taken there. Before, the call was forwarded: 1,848 MiB of
/// stack past GPU 1's cap, 64 MiB of code and 256 MiB of heap on each GPU charged nothing.
/// Alone and in a pool (`escapes.c`, `multi-device`).
#[test]
fn a_launch_on_several_gpus_in_one_call_is_charged_on_each() {
    let dir = scratch("escapes-multi-device-pool");
    let pool_dir = dir.to_str().unwrap();
    let fake = [
        ("FAKECUDA_FUNCTION_MEM", "64Mi"),
        ("FAKECUDA_HEAP_AT_LAUNCH", "1"),
    ];
    let pool = [("GPUCAP_POOL", "multi"), ("GPUCAP_POOL_DIR", pool_dir)];
    for env in [fake.to_vec(), [&fake[..], &pool[..]].concat()] {
        let (o, s) = escapes(&["multi-device", "2Gi", "2Gi"], 2, Some("2Gi"), &env);
        assert_passed(&o, &format!("multi-device with the shim {env:?}"));
        for d in &s {
            assert!(
                d.peak_used <= 2 << 30,
                "{env:?}: the driver held {} MiB on a GPU capped at 2 GiB",
                d.peak_used >> 20
            );
        }
        let err = stderr(&o);
        assert!(
            err.contains("refused cuLaunchCooperativeKernelMultiDevice"),
            "{env:?}: {err}"
        );
    }
    let (o, _) = escapes(&["multi-device", "2Gi", "2Gi"], 2, None, &fake);
    assert_failed(&o, "multi-device without the shim");
}

/// `cuMemCreate` memory mapped into a deferred-mapping array and a sparse mipmapped array
/// (`cuMemMapArrayAsync`) and released at once, as NVIDIA's VMM idiom releases a mapped
/// handle: the driver keeps it while the array maps it, so gpucap keeps it charged until an
/// unmapping covers it or the array ends. Before, each release credited its handle (a
/// quarter of the cap here) while the array still held it, and 3/4 of the cap more was
/// served. Alone and in a pool (`escapes.c`, `array-mapping`).
#[test]
fn memory_mapped_into_an_array_stays_charged_until_it_is_unmapped() {
    charged_alone_and_in_a_pool("array-mapping", &[], &[]);
}

/// A raised malloc heap, which the driver takes at a later launch (the fake with
/// `FAKECUDA_HEAP_AT_LAUNCH`: the context's next one), is charged wherever it is taken: at
/// a graph's launch (each executable graph's first launch after a raise is measured) as at
/// a kernel's, kept with the context past the unload of the module whose launch took it,
/// credited when the context ends. Before, a graph's launch took 512 MiB uncharged, and a
/// module's unload credited the heap its kernel's launch had taken. Alone and in a pool
/// (`escapes.c`, `graph-heap`).
#[test]
fn a_raised_heap_is_charged_at_whichever_launch_takes_it() {
    charged_alone_and_in_a_pool("graph-heap", &[("FAKECUDA_HEAP_AT_LAUNCH", "1")], &[]);
}

/// A raised printf FIFO (`CU_LIMIT_PRINTF_FIFO_SIZE`), which a driver may take after the
/// call as it takes the malloc heap (the fake with `FAKECUDA_PRINTF_AT_LAUNCH`: at the
/// context's next launch), is charged wherever it is taken, a graph's launch or a
/// kernel's, kept with the context. Before, gpucap measured only the call: the FIFO (512
/// MiB here) taken at the launch was charged nothing. Alone and in a pool (`escapes.c`,
/// `printf-fifo`).
#[test]
fn a_raised_printf_fifo_is_charged_at_whichever_launch_takes_it() {
    charged_alone_and_in_a_pool("printf-fifo", &[("FAKECUDA_PRINTF_AT_LAUNCH", "1")], &[]);
}

/// Green contexts (CUDA 12.4): `cuGreenCtxCreate` retains the device's primary context, so
/// one made while the primary context is inactive makes it (256 MiB here), and takes a
/// part of its own (64 MiB on the fake): both are charged, one the cap has no room for is
/// refused and not left made, and the last one's end takes the primary context with it,
/// credited. Before, gpucap forwarded the call: the primary context and every green
/// context were charged nothing. Alone and in a pool (`escapes.c`, `green-contexts`).
#[test]
fn a_green_context_and_the_primary_context_it_retains_are_charged() {
    let dir = scratch("escapes-green-pool");
    let mem = [
        ("FAKECUDA_CONTEXT_MEM", "256Mi"),
        ("FAKECUDA_GREEN_CTX_MEM", "64Mi"),
    ];
    let pool = [
        ("GPUCAP_POOL", "green"),
        ("GPUCAP_POOL_DIR", dir.to_str().unwrap()),
    ];
    for env in [mem.to_vec(), [&mem[..], &pool[..]].concat()] {
        let (o, s) = escapes(&["green-contexts", "2Gi"], 1, Some("2Gi"), &env);
        assert_passed(&o, &format!("green-contexts with the shim {env:?}"));
        assert_eq!(s[0].final_used, 0, "{env:?}: {:?}", s[0]);
    }
    let (o, _) = escapes(&["green-contexts", "2Gi"], 1, None, &mem);
    assert_failed(&o, "green-contexts without the shim");
}

/// `cuLibraryGetGlobal` before any kernel of the library ran (cudart's
/// `cudaGetSymbolAddress`, `cudaMemcpyToSymbol`): under lazy loading the library is loaded
/// into the context there (the fake: its code, 128 MiB here, and its 8 MiB global), so
/// gpucap measures it as a first use of the library: charged, refused before it loads in a
/// second context where the cap lacks room for what the first copy took, credited with its
/// context and at its unload. Before, it was charged nothing, and its kernel's first launch
/// found it loaded (measured 0). Alone and in a pool (`escapes.c`, `library-global`).
#[test]
fn a_library_loaded_for_its_global_is_charged() {
    charged_alone_and_in_a_pool("library-global", &[("FAKECUDA_LIBRARY_MEM", "128Mi")], &[]);
}

/// A library's `__managed__` variable asked for (`cuLibraryGetManaged`, as cudart reaches
/// one under CUDA 12's context-independent loading) before any kernel of it ran: managed
/// memory is "registered when the library is loaded into at least one context" (NVIDIA's
/// documentation), and the fake loads the library into the current context there (its
/// code and the variable), so gpucap measures it as the library's first use there, as for
/// `cuLibraryGetGlobal`. Before, it was forwarded: 136 MiB uncharged here, and the
/// kernel's first launch found the library loaded (measured 0). Alone and in a pool
/// (`escapes.c`, `library-managed`).
#[test]
fn a_library_loaded_for_its_managed_variable_is_charged() {
    charged_alone_and_in_a_pool("library-managed", &[("FAKECUDA_LIBRARY_MEM", "128Mi")], &[]);
}

/// The same library's global reached through its module (`cuLibraryGetModule`, then
/// `cuModuleGetGlobal_v2`): the fake loads the library into the context there, as
/// `cuLibraryGetGlobal` does, and gpucap measures it so. Before, the fake allocated the
/// global alone there, outside the library's copy, and gpucap charged nothing. Alone and in
/// a pool (`escapes.c`, `library-module-global`).
#[test]
fn a_library_loaded_for_its_global_through_its_module_is_charged() {
    charged_alone_and_in_a_pool(
        "library-module-global",
        &[("FAKECUDA_LIBRARY_MEM", "128Mi")],
        &[],
    );
}

/// The driver's `cuCtxGetCurrent` calls in a run of `launch_loop n` under the shim
/// (FAKECUDA_TRACE logs each call the fake driver gets).
fn current_context_asks(n: u32) -> usize {
    stderr(&launch_loop(&[&n.to_string()]))
        .lines()
        .filter(|l| l.starts_with("fakecuda: cuCtxGetCurrent("))
        .count()
}

/// `launch_loop args` under the shim (a cap of 1 GiB, debug log), the fake driver
/// tracing its calls and loading 64 MiB of the library at its first use in a context.
fn launch_loop(args: &[&str]) -> Output {
    let prog = compile_c("launch_loop", "", &["-lcuda"]);
    let stats = scratch("escapes-launch-loop").join("stats.json");
    let mut c = fake_cmd(prog, &stats);
    c.env("FAKECUDA_TRACE", "1")
        .env("FAKECUDA_LIBRARY_MEM", "64Mi");
    preload(&mut c)
        .env("GPUCAP_LIMIT", "1Gi")
        .env("GPUCAP_LOG", "debug");
    let o = run(c.args(args));
    assert_ok(&o);
    o
}

/// A launch of a kernel handle (`cuLibraryGetKernel`, what CUDA 13's runtime launches)
/// after its first use in the current context makes no driver call of the shim's: the
/// context is the one this thread's context hooks last saw, not asked of the driver
/// (`cuCtxGetCurrent`) at each launch and each `cuKernelGetFunction`. Before, a PyTorch
/// step made 532 more driver calls under gpucap than without it, one per launch. What
/// the shim asks grows with the context switches (two here), not with the launches.
#[test]
fn a_kernel_handles_later_launches_do_not_ask_the_driver_for_the_context() {
    let (few, many) = (current_context_asks(5), current_context_asks(105));
    assert_eq!(
        few,
        many,
        "100 more launches and lookups in each context asked the driver for the current context {} more times",
        many.saturating_sub(few)
    );
}

/// A context `cuGLCtxCreate` makes and pushes (deprecated OpenGL interop) is followed: a
/// kernel handle used before in another context is measured at its first launch there,
/// not taken for the context this thread's hooks saw before (its library loaded into
/// each of the three contexts: three first uses measured).
#[test]
fn a_kernel_handle_is_measured_in_a_context_cu_gl_ctx_create_made() {
    let o = launch_loop(&["3", "gl"]);
    let err = stderr(&o);
    let measured: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("cuLaunchKernel: its first use loaded 64 MiB of kernels"))
        .collect();
    assert_eq!(measured.len(), 3, "{}", tail(&err, 4000));
}

/// `many_functions 20000` under the shim (a cap of 1 GiB), the fake driver tracing its
/// calls, with `env`: its trace before the launches (each function asked for) and during.
fn many_functions(env: &[(&str, &str)], heap: bool) -> (String, String) {
    let prog = compile_c("many_functions", "", &["-lcuda"]);
    let stats = scratch("escapes-many-functions").join("stats.json");
    let mut c = fake_cmd(prog, &stats);
    c.env("FAKECUDA_TRACE", "1").envs(env.iter().copied());
    preload(&mut c).env("GPUCAP_LIMIT", "1Gi");
    let o = run(c.arg("20000").args(heap.then_some("heap")));
    assert_ok(&o);
    let err = stderr(&o);
    let (asking, launching) = err
        .split_once("many_functions: launches\n")
        .unwrap_or_else(|| panic!("no launch phase\n{}", tail(&err, 20)));
    (asking.to_string(), launching.to_string())
}

/// Tens of thousands of functions (under CUDA's eager loading CUDA's runtime asks for
/// every one it registers: TensorFlow's, 49,086): each asked for once is a first use,
/// measured, and no launch of any of them afterwards is measured again. With room for
/// 16,384 only, each launch of the others was (two `cuKernelGetLibrary`, a
/// `cuFuncGetModule`, NVML's process list twice: 189,306 NVML calls in a Keras `fit`).
/// Under eager loading the driver loaded them with the module (measured there): no first
/// use is measured at all (each was: the context lock and two reads of NVML's list).
#[test]
fn no_launch_after_the_first_is_measured_again_among_tens_of_thousands_of_functions() {
    let (asking, launching) = many_functions(&[], false);
    let process_list_reads = asking
        .lines()
        .filter(|l| l.starts_with("fakenvml: nvmlDeviceGetComputeRunningProcesses"))
        .count();
    assert!(
        process_list_reads >= 20_000,
        "each function asked for is measured: {process_list_reads}"
    );
    let beside: Vec<&str> = launching
        .lines()
        .filter(|l| {
            (l.starts_with("fakecuda: ") || l.starts_with("fakenvml: "))
                && !l.starts_with("fakecuda: cuLaunchKernel(")
        })
        .collect();
    assert!(
        beside.len() <= 8,
        "40,000 launches made {} other driver and NVML calls (the first: {:?})",
        beside.len(),
        &beside[..beside.len().min(5)]
    );
    assert_eq!(
        launching
            .lines()
            .filter(|l| l.starts_with("fakecuda: cuLaunchKernel("))
            .count(),
        40_000
    );
    let eager = [("CUDA_MODULE_LOADING", "EAGER")];
    let (asking, launching) = many_functions(&eager, false);
    let measuring = |s: &str| {
        s.lines()
            .filter(|l| l.starts_with("fakenvml: ") || l.starts_with("fakecuda: cuMemGetInfo"))
            .count()
    };
    // The context's measurement (NVML) and the module's (two cuMemGetInfo) only.
    assert!(
        measuring(&asking) <= 16 && measuring(&launching) == 0,
        "under eager loading, 20,000 functions asked for and 40,000 launches made {} and {} measuring calls",
        measuring(&asking),
        measuring(&launching)
    );
    // A raised malloc heap is taken at a later launch (not at the call): then the next
    // launch of every function is measured, under either loading mode.
    for env in [&[][..], &eager[..]] {
        let (_, launching) = many_functions(env, true);
        let reads = launching
            .lines()
            .filter(|l| l.starts_with("fakenvml: nvmlDeviceGetComputeRunningProcesses"))
            .count();
        assert!(
            reads >= 20_000,
            "{env:?}: with the heap raised, 20,000 functions' next launches made {reads} NVML reads"
        );
    }
}

/// Whose cap a refusal line names under `env`: a pool's member is refused by the pool's
/// rule ("of the pool's 256 MiB cap"), a process alone by its own ("of the 256 MiB cap").
pub(crate) fn of_the(env: &[(&str, &str)]) -> &'static str {
    if env.iter().any(|(k, _)| *k == "GPUCAP_POOL") {
        "the pool's"
    } else {
        "the"
    }
}
