/*
 * driver_probe: what the CUDA driver (and NVML) answer for what the fake GPU models,
 * printed as one JSON document, so the answers of a real driver can be recorded
 * (scripts/gpu/probe-driver.sh) and the fake held to them (tests/real_clients/driver_answers.rs).
 *
 *   driver_probe [REQUESTS]
 *
 * REQUESTS (optional) is a file of lines "procaddr NAME VERSION FLAGS [CLIENT...]" and
 * "export UUID [CLIENT...]": cuGetProcAddress_v2 / cuGetExportTable requests that real
 * clients made (gpucap's GPUCAP_LOG=debug "driver request:" lines); each is asked of this
 * driver and its answer recorded with the clients that asked.
 *
 * Output: {"schema":1, "machine":{...}, "answers":{...}, "requests":{...}, "accepted":[]}
 *   machine   figures that legitimately differ per machine (names, totals, UUID-free
 *             sizes of contexts and modules, timings): recorded, never compared;
 *   answers   what must match between the real driver and the fake: return codes,
 *             relations (true/false), architecture constants, attribute values;
 *   requests  per request: {"rc", "status" (procaddr), "export" (the exported symbol the
 *             pointer is, if any), "asked_by"};
 *   accepted  empty here: in a committed real-driver file, the differences from the fake
 *             that are accepted, each {"key": ..., "why": ...}.
 *
 * Each group of checks runs in its own child process (forked before any CUDA call, so
 * each initialises CUDA itself): a crash or hang (60 s) in one group is recorded as
 * "GROUP.crashed" (an answer like any other: the fake must not crash where a real driver
 * answers) and the others still answer. A group that finished ends with "GROUP.done".
 *
 * Built on the fake by the tests (cc ... -lcuda -ldl against tests/c/fakecuda.h) and on a
 * real machine by scripts/gpu/probe-driver.sh the same way, linked to the real libcuda.
 */
#define _GNU_SOURCE
#include <pthread.h>

#include "driver_probe.h"

/* ---- groups ----------------------------------------------------------------- */

/* Before cuInit, without a context, the device and its figures. */
static void g_init(void) {
    CUdeviceptr d = 0;
    size_t f = 0, t = 0;
    int v = 0;
    RC("init.before.cuMemAlloc_v2", cuMemAlloc_v2(&d, MIB));
    RC("init.before.cuMemGetInfo_v2", cuMemGetInfo_v2(&f, &t));
    RC("init.before.cuDriverGetVersion", cuDriverGetVersion(&v));
    long long t0 = now_ns();
    RC("init.cuInit", cuInit(0));
    mach_int("init.cuInit_ns", now_ns() - t0);
    MUST(cuDriverGetVersion(&v));
    mach_int("driver_version", v);
    int n = 0;
    MUST(cuDeviceGetCount(&n));
    mach_int("device_count", n);
    CUdevice dev;
    RC("init.cuDeviceGet(count)", cuDeviceGet(&dev, n));
    RC("init.cuDeviceGet(-1)", cuDeviceGet(&dev, -1));
    char name[256] = "";
    MUST(cuDeviceGetName(name, sizeof name, 0));
    mach_str("gpu", name);
    int major = 0, minor = 0;
    MUST(cuDeviceGetAttribute(&major, ATTR_CC_MAJOR, 0));
    MUST(cuDeviceGetAttribute(&minor, ATTR_CC_MINOR, 0));
    mach_int("compute_capability", major * 10 + minor);
    int coop = -1; /* whether cuLaunchCooperativeKernelMultiDevice may launch here */
    if (cuDeviceGetAttribute(&coop, 96 /* COOPERATIVE_MULTI_DEVICE_LAUNCH */, 0) == CUDA_SUCCESS)
        mach_int("device.cooperative_multi_device", coop);
    size_t total = 0;
    MUST(cuDeviceTotalMem_v2(&total, 0));
    mach_int("total_mem", (long long)total);
    RC("init.no_context.cuMemGetInfo_v2", cuMemGetInfo_v2(&f, &t));
    RC("init.no_context.cuMemAlloc_v2", cuMemAlloc_v2(&d, MIB));
    CUcontext c = (CUcontext)1;
    RC("init.no_context.cuCtxGetCurrent", cuCtxGetCurrent(&c));
    ans_bool("init.no_context.current_is_null", c == NULL);
}

/* Contexts: what a first and a second context take, and the wrong-context frees. */
static void g_context(void) {
    int have_nvml = nvml_open();
    ans_bool("context.nvml_available", have_nvml);
    unsigned long long used0 = have_nvml ? nvml_used() : 0;
    char text[256] = "";
    if (have_nvml && nv.driver && nv.driver(text, sizeof text) == 0) mach_str("nvml.driver_version", text);
    if (have_nvml && nv.name && nv.name(nv.dev, text, sizeof text) == 0) mach_str("nvml.gpu", text);
    if (have_nvml) ans_bool("context.nvml.before.own_pid_listed", nvml_own("context.nvml.before") >= 0);
    MUST(cuInit(0));
    long long t0 = now_ns();
    CUcontext p = primary();
    mach_int("context.primary_ns", now_ns() - t0);
    size_t f1 = 0, total = 0, dev_total = 0;
    MUST(cuMemGetInfo_v2(&f1, &total));
    MUST(cuDeviceTotalMem_v2(&dev_total, 0));
    ans_bool("context.cuMemGetInfo_total_is_cuDeviceTotalMem", total == dev_total);
    ans_bool("context.free_below_total", f1 < total);
    mach_int("context.primary.free", (long long)f1);
    if (have_nvml) {
        unsigned long long used1 = nvml_used();
        mach_int("context.nvml.used_before_context", (long long)used0);
        mach_int("context.nvml.used_after_context", (long long)used1);
        ans_bool("context.nvml.used_rises_with_context", used1 > used0);
        long long own = nvml_own("context.nvml.after");
        ans_bool("context.nvml.after.own_pid_listed", own >= 0);
        mach_int("context.nvml.own_used_after_context", own);
        nvmlMemory_t m = {0};
        MUST(nv.memory(nv.dev, &m));
        ans_bool("context.nvml.total_is_cuDeviceTotalMem", m.total == dev_total);
        ans_bool("context.nvml.free_plus_used_is_total", m.free + m.used == m.total);
        mach_int("context.nvml.total", (long long)m.total);
        nvmlMemory_v2_t m2 = {0};
        m2.version = (unsigned int)sizeof m2 | 2u << 24;
        RC("context.nvml.nvmlDeviceGetMemoryInfo_v2", nv.memory_v2(nv.dev, &m2));
        ans_bool("context.nvml.v2.reserved_nonzero", m2.reserved > 0);
        ans_bool("context.nvml.v2.free_plus_used_plus_reserved_is_total",
                 m2.free + m2.used + m2.reserved == m2.total);
        mach_int("context.nvml.v2.reserved", (long long)m2.reserved);
        /* 256 MiB allocated: does NVML's per-process and device figure follow? */
        CUdeviceptr big = 0;
        MUST(cuMemAlloc_v2(&big, 256 * MIB));
        ans_bool("context.nvml.alloc_256MiB.used_rises_by_at_least_256MiB",
                 nvml_used() >= m.used + 256 * MIB);
        long long own2 = nvml_own("context.nvml.alloc_256MiB");
        ans_bool("context.nvml.alloc_256MiB.own_used_rises_by_at_least_256MiB",
                 own >= 0 && own2 >= own + (long long)(256 * MIB));
        MUST(cuMemFree_v2(big));
    }
    t0 = now_ns();
    CUcontext b = NULL;
    MUST(cuCtxCreate_v2(&b, 0, 0)); /* current now */
    mach_int("context.second_ns", now_ns() - t0);
    size_t f2 = info_free();
    ans_bool("context.second_context_lowers_free", f2 < f1);
    mach_int("context.second_context_takes", (long long)f1 - (long long)f2);
    CUdeviceptr d = 0, d2 = 0;
    MUST(cuMemAlloc_v2(&d, 2 * MIB));
    MUST(cuMemAlloc_v2(&d2, 2 * MIB));
    unsigned long long owner = 0;
    MUST(cuPointerGetAttribute(&owner, 1 /* CONTEXT */, d));
    ans_bool("context.pointer_context_is_the_allocating_one", owner == (unsigned long long)b);
    MUST(cuCtxSetCurrent(p));
    RC("context.wrong_context.cuMemFree_v2", cuMemFree_v2(d));
    MUST(cuCtxDestroy_v2(b));
    ans_bool("context.destroy_gives_back_its_allocations", info_free() >= f1 - 4 * MIB);
    RC("context.destroyed.cuMemFree_v2(its allocation)", cuMemFree_v2(d2));
    CUcontext cur = NULL;
    MUST(cuCtxGetCurrent(&cur));
    ans_bool("context.destroyed_other_leaves_current", cur == p);
    RC("context.cuCtxDestroy_v2(NULL)", cuCtxDestroy_v2(NULL));
}

/* Allocation misuse in the primary context. */
static void g_alloc(void) {
    primary();
    size_t total = 0;
    MUST(cuDeviceTotalMem_v2(&total, 0));
    CUdeviceptr d = 0, w = 0;
    MUST(cuMemAlloc_v2(&w, MIB)); /* warm-up: the first allocation may set things up */
    const size_t sizes[] = {1, 4 * KIB, 2 * MIB, 3 * MIB + 1};
    const char *const names[] = {"1B", "4KiB", "2MiB", "3MiB+1"};
    for (int i = 0; i < 4; i++) {
        char k[96];
        size_t before = info_free();
        MUST(cuMemAlloc_v2(&d, sizes[i]));
        snprintf(k, sizeof k, "alloc.%s.cuMemGetInfo_drop", names[i]);
        ans_int(k, (long long)before - (long long)info_free());
        CUdeviceptr base = 0;
        size_t size = 0;
        MUST(cuMemGetAddressRange_v2(&base, &size, d));
        snprintf(k, sizeof k, "alloc.%s.address_range_size", names[i]);
        ans_int(k, (long long)size);
        snprintf(k, sizeof k, "alloc.%s.aligned_to_512", names[i]);
        ans_bool(k, d % 512 == 0);
        MUST(cuMemFree_v2(d));
    }
    /* Recorded, not compared: where the driver stops packing small blocks into shared
       pages (gpucap charges whole 2 MiB pages above 1 MiB: src/core/linear.rs), and how
       far apart two 1-byte blocks lie (gpucap charges small ones in 512-byte blocks). */
    const size_t around[] = {MIB + 4 * KIB, MIB + MIB / 2};
    const char *const around_names[] = {"1MiB+4KiB", "1.5MiB"};
    for (int i = 0; i < 2; i++) {
        char k[96];
        size_t before = info_free();
        MUST(cuMemAlloc_v2(&d, around[i]));
        snprintf(k, sizeof k, "alloc.%s.cuMemGetInfo_drop", around_names[i]);
        mach_int(k, (long long)before - (long long)info_free());
        MUST(cuMemFree_v2(d));
    }
    CUdeviceptr b1 = 0, b2 = 0;
    MUST(cuMemAlloc_v2(&b1, 1));
    MUST(cuMemAlloc_v2(&b2, 1));
    mach_int("alloc.1B_then_1B.address_step", b2 > b1 ? (long long)(b2 - b1) : -(long long)(b1 - b2));
    MUST(cuMemFree_v2(b2));
    MUST(cuMemFree_v2(b1));
    RC("alloc.cuMemFree_v2(NULL)", cuMemFree_v2(0));
    RC("alloc.cuMemFree_v2(unknown)", cuMemFree_v2((CUdeviceptr)0xdead0000ULL));
    MUST(cuMemAlloc_v2(&d, 2 * MIB));
    RC("alloc.cuMemFree_v2(interior)", cuMemFree_v2(d + 4096));
    CUdeviceptr base = 0;
    size_t size = 0;
    RC("alloc.cuMemGetAddressRange_v2(interior)", cuMemGetAddressRange_v2(&base, &size, d + 4096));
    ans_bool("alloc.address_range_of_interior_is_the_allocation", base == d && size == 2 * MIB);
    RC("alloc.cuMemGetAddressRange_v2(unknown)",
       cuMemGetAddressRange_v2(&base, &size, (CUdeviceptr)0xdead0000ULL));
    MUST(cuMemFree_v2(d));
    RC("alloc.cuMemFree_v2(double)", cuMemFree_v2(d));
    RC("alloc.cuMemAlloc_v2(0)", cuMemAlloc_v2(&d, 0));
    RC("alloc.cuMemAlloc_v2(2 x total)", cuMemAlloc_v2(&d, 2 * total));
    RC("alloc.cuMemAlloc_v2(total + 1)", cuMemAlloc_v2(&d, total + 1));
    RC("alloc.cuMemAlloc_v2(SIZE_MAX)", cuMemAlloc_v2(&d, SIZE_MAX));
    RC("alloc.cuMemAllocManaged(0)", cuMemAllocManaged(&d, 0, CU_MEM_ATTACH_GLOBAL));
    RC("alloc.cuMemAllocManaged(flags 0)", cuMemAllocManaged(&d, MIB, 0));
    size_t pitch = 0;
    RC("alloc.cuMemAllocPitch_v2(width 0)", cuMemAllocPitch_v2(&d, &pitch, 0, 16, 4));
    RC("alloc.cuMemAllocPitch_v2(element 3)", cuMemAllocPitch_v2(&d, &pitch, 64, 16, 3));
    if (cuMemAllocPitch_v2(&d, &pitch, 100, 3, 4) == CUDA_SUCCESS) {
        ans_int("alloc.cuMemAllocPitch_v2(100 x 3).pitch", (long long)pitch);
        cuMemFree_v2(d);
    }
    RC("alloc.cuMemAllocAsync(0)", cuMemAllocAsync(&d, 0, NULL));
    MUST(cuMemAllocAsync(&d, MIB, NULL));
    MUST(cuMemFreeAsync(d, NULL));
    MUST(cuStreamSynchronize(NULL));
    RC("alloc.cuMemFreeAsync(double)", cuMemFreeAsync(d, NULL));
    RC("alloc.cuMemFree_v2(after cuMemFreeAsync)", cuMemFree_v2(d));
    RC("alloc.cuMemFreeAsync(NULL)", cuMemFreeAsync(0, NULL));
    MUST(cuMemFree_v2(w));
}

/* Pointer attributes of device, managed, host and unknown pointers. */
static void g_pointer(void) {
    CUcontext ctx = primary();
    CUdeviceptr d = 0, m = 0;
    MUST(cuMemAlloc_v2(&d, 2 * MIB));
    static const struct {
        int id;
        const char *name;
    } A[] = {{2, "MEMORY_TYPE"},       {6, "SYNC_MEMOPS"},  {8, "IS_MANAGED"},
             {9, "DEVICE_ORDINAL"},    {10, "IS_LEGACY_CUDA_IPC_CAPABLE"},
             {12, "RANGE_SIZE"},       {13, "MAPPED"},      {14, "ALLOWED_HANDLE_TYPES"},
             {15, "IS_GPU_DIRECT_RDMA_CAPABLE"}, {16, "ACCESS_FLAGS"},
             {18, "MAPPING_SIZE"},     {4, "HOST_POINTER"}, {17, "MEMPOOL_HANDLE"}};
    char k[128];
    for (size_t i = 0; i < sizeof A / sizeof *A; i++) {
        snprintf(k, sizeof k, "pointer.device.%s", A[i].name);
        ptr_attr(k, A[i].id, d);
        snprintf(k, sizeof k, "pointer.device_interior.%s", A[i].name);
        ptr_attr(k, A[i].id, d + 4096);
    }
    unsigned long long v = 0;
    MUST(cuPointerGetAttribute(&v, 1, d));
    ans_bool("pointer.device.CONTEXT_is_current", v == (unsigned long long)ctx);
    MUST(cuPointerGetAttribute(&v, 3, d + 4096));
    ans_bool("pointer.device_interior.DEVICE_POINTER_is_itself", v == d + 4096);
    MUST(cuPointerGetAttribute(&v, 11, d + 4096));
    ans_bool("pointer.device_interior.RANGE_START_ADDR_is_base", v == d);
    MUST(cuPointerGetAttribute(&v, 19, d + 4096));
    ans_bool("pointer.device_interior.MAPPING_BASE_ADDR_is_base", v == d);
    ans_bool("pointer.device.BUFFER_ID_nonzero", cuPointerGetAttribute(&v, 7, d) == 0 && v != 0);
    MUST(cuMemAllocManaged(&m, 2 * MIB, CU_MEM_ATTACH_GLOBAL));
    ptr_attr("pointer.managed.MEMORY_TYPE", 2, m);
    ptr_attr("pointer.managed.IS_MANAGED", 8, m);
    ptr_attr("pointer.managed.MAPPED", 13, m);
    void *host = malloc(4096);
    ptr_attr("pointer.host_malloc.MEMORY_TYPE", 2, (CUdeviceptr)(uintptr_t)host);
    ptr_attr("pointer.host_malloc.IS_MANAGED", 8, (CUdeviceptr)(uintptr_t)host);
    free(host);
    ptr_attr("pointer.unknown.MEMORY_TYPE", 2, (CUdeviceptr)0xdead0000ULL);
    ptr_attr("pointer.null.MEMORY_TYPE", 2, 0);
    ptr_attr("pointer.device.bad_attribute_9999", 9999, d);
    MUST(cuMemFree_v2(d));
    ptr_attr("pointer.freed.MEMORY_TYPE", 2, d);
    MUST(cuMemFree_v2(m));
}

static int pool_attr(CUmemoryPool pool, const char *prefix) {
    char k[128];
    int ok = 1;
    for (int a = 1; a <= POOL_ATTRS; a++) {
        unsigned long long v = 0; /* int attributes fill the first 4 bytes (little-endian) */
        CUresult rc = cuMemPoolGetAttribute(pool, a, &v);
        snprintf(k, sizeof k, "%s.%s", prefix, POOL_ATTR_NAMES[a]);
        if (rc == CUDA_SUCCESS) ans_int(k, (long long)(a <= 3 ? (unsigned int)v : v));
        else {
            snprintf(k, sizeof k, "%s.%s.rc", prefix, POOL_ATTR_NAMES[a]);
            ans_int(k, rc);
            ok = 0;
        }
    }
    return ok;
}

/* Stream-ordered pools: the default pool's attributes, what a pool reserves, and what
 * cuMemGetInfo shows. */
static void g_pool(void) {
    primary();
    CUmemoryPool def = NULL;
    MUST(cuDeviceGetDefaultMemPool(&def, 0));
    pool_attr(def, "pool.default.fresh");
    size_t f0 = info_free();
    CUdeviceptr d = 0;
    MUST(cuMemAllocAsync(&d, MIB, NULL));
    MUST(cuStreamSynchronize(NULL));
    ans_int("pool.default.alloc_1MiB.cuMemGetInfo_drop", (long long)f0 - (long long)info_free());
    pool_attr(def, "pool.default.alloc_1MiB");
    unsigned long long h = 0;
    MUST(cuPointerGetAttribute(&h, 17, d));
    ans_bool("pool.default.pointer_MEMPOOL_HANDLE_is_the_pool", h == (unsigned long long)def);
    ptr_attr("pool.default.pointer.MEMORY_TYPE", 2, d);
    MUST(cuMemFreeAsync(d, NULL));
    pool_attr(def, "pool.default.freed_before_sync");
    MUST(cuStreamSynchronize(NULL));
    pool_attr(def, "pool.default.freed_synced");
    ans_int("pool.default.freed_synced.cuMemGetInfo_drop", (long long)f0 - (long long)info_free());
    /* Pool memory freed by cuMemFree_v2 (not cuMemFreeAsync). */
    MUST(cuMemAllocAsync(&d, MIB, NULL));
    MUST(cuStreamSynchronize(NULL));
    RC("pool.default.cuMemFree_v2(pool allocation)", cuMemFree_v2(d));
    MUST(cuCtxSynchronize());
    pool_attr(def, "pool.default.after_cuMemFree_v2");

    /* An explicit pool, then used after its destruction. */
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 0;
    CUmemoryPool pool = NULL;
    RC("pool.create.cuMemPoolCreate", cuMemPoolCreate(&pool, &props));
    pool_attr(pool, "pool.create.fresh");
    f0 = info_free();
    MUST(cuMemAllocFromPoolAsync(&d, MIB, pool, NULL));
    MUST(cuStreamSynchronize(NULL));
    ans_int("pool.create.alloc_1MiB.cuMemGetInfo_drop", (long long)f0 - (long long)info_free());
    pool_attr(pool, "pool.create.alloc_1MiB");
    RC("pool.create.cuMemPoolDestroy(while allocated)", cuMemPoolDestroy(pool));
    RC("pool.create.cuMemFreeAsync(after destroy)", cuMemFreeAsync(d, NULL));
    MUST(cuStreamSynchronize(NULL));
    ans_int("pool.create.destroyed_and_freed.cuMemGetInfo_drop",
            (long long)f0 - (long long)info_free());
    CUmemPoolProps bad = props;
    bad.location.id = 99;
    RC("pool.create.cuMemPoolCreate(device 99)", cuMemPoolCreate(&pool, &bad));
    bad = props;
    bad.allocType = 0;
    RC("pool.create.cuMemPoolCreate(type invalid)", cuMemPoolCreate(&pool, &bad));
}

/* A destroyed pool's handle used again (a group of its own: a driver may crash). */
static void g_pool_freed(void) {
    primary();
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUmemoryPool pool = NULL;
    MUST(cuMemPoolCreate(&pool, &props));
    MUST(cuMemPoolDestroy(pool));
    CUdeviceptr d = 0;
    RC("pool_freed.cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync(&d, MIB, pool, NULL));
    RC("pool_freed.cuMemPoolDestroy(again)", cuMemPoolDestroy(pool));
}

/* Virtual memory management: granularity, sizes, release while mapped. */
static void g_vmm(void) {
    primary();
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    size_t gmin = 0, grec = 0;
    MUST(cuMemGetAllocationGranularity(&gmin, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    MUST(cuMemGetAllocationGranularity(&grec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    ans_int("vmm.granularity.minimum", (long long)gmin);
    ans_int("vmm.granularity.recommended", (long long)grec);
    RC("vmm.cuMemGetAllocationGranularity(option 7)",
       cuMemGetAllocationGranularity(&gmin, &prop, (CUmemAllocationGranularity_flags)7));
    CUmemGenericAllocationHandle h = 0;
    RC("vmm.cuMemCreate(0)", cuMemCreate(&h, 0, &prop, 0));
    RC("vmm.cuMemCreate(granularity / 2)", cuMemCreate(&h, gmin / 2, &prop, 0));
    RC("vmm.cuMemCreate(granularity + 4096)", cuMemCreate(&h, gmin + 4096, &prop, 0));
    RC("vmm.cuMemCreate(flags 1)", cuMemCreate(&h, gmin, &prop, 1));
    size_t f0 = info_free();
    MUST(cuMemCreate(&h, 2 * gmin, &prop, 0));
    ans_int("vmm.create_2_granules.cuMemGetInfo_drop", (long long)f0 - (long long)info_free());
    CUdeviceptr va = 0;
    MUST(cuMemAddressReserve(&va, 4 * gmin, 0, 0, 0));
    CUresult unaligned = cuMemMap(va + 4096, 2 * gmin, 0, h, 0);
    ans_int("vmm.cuMemMap(unaligned)", unaligned);
    if (unaligned == CUDA_SUCCESS) MUST(cuMemUnmap(va + 4096, 2 * gmin));
    RC("vmm.cuMemMap(offset past the handle)", cuMemMap(va, 2 * gmin, 2 * gmin, h, 0));
    MUST(cuMemMap(va, 2 * gmin, 0, h, 0));
    RC("vmm.cuMemMap(over a mapping)", cuMemMap(va, 2 * gmin, 0, h, 0));
    CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    RC("vmm.cuMemSetAccess", cuMemSetAccess(va, 2 * gmin, &acc, 1));
    ptr_attr("vmm.pointer.MEMORY_TYPE", 2, va);
    ptr_attr("vmm.pointer.MAPPED", 13, va);
    ptr_attr("vmm.pointer.RANGE_SIZE", 12, va);
    ptr_attr("vmm.pointer.MAPPING_SIZE", 18, va);
    CUdeviceptr base = 0;
    size_t size = 0;
    RC("vmm.cuMemGetAddressRange_v2(mapped)", cuMemGetAddressRange_v2(&base, &size, va + 4096));
    ans_bool("vmm.address_range_is_the_mapping", base == va && size == 2 * gmin);
    RC("vmm.cuMemFree_v2(mapped)", cuMemFree_v2(va));
    RC("vmm.cuMemRelease(while mapped)", cuMemRelease(h));
    ans_bool("vmm.release_while_mapped_keeps_the_memory",
             (long long)f0 - (long long)info_free() >= (long long)(2 * gmin));
    CUresult part = cuMemUnmap(va, gmin);
    ans_int("vmm.cuMemUnmap(part of a mapping)", part);
    if (part == CUDA_SUCCESS) RC("vmm.cuMemUnmap(the rest)", cuMemUnmap(va + gmin, gmin));
    else RC("vmm.cuMemUnmap(whole, part refused)", cuMemUnmap(va, 2 * gmin));
    ans_bool("vmm.unmap_after_release_gives_it_back", info_free() >= f0);
    ptr_attr("vmm.unmapped.pointer.MAPPED", 13, va);
    RC("vmm.cuMemAddressFree", cuMemAddressFree(va, 4 * gmin));
}

/* Bad VMM handles (a group of its own: a driver may crash). */
static void g_vmm_bad(void) {
    primary();
    RC("vmm_bad.cuMemRelease(0)", cuMemRelease(0));
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    size_t g = 0;
    MUST(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUmemGenericAllocationHandle h = 0;
    MUST(cuMemCreate(&h, g, &prop, 0));
    MUST(cuMemRelease(h));
    RC("vmm_bad.cuMemRelease(double)", cuMemRelease(h));
}

/* A module: what loading it takes, its global, bad images. */
static const char PTX[] = ".version 6.0\n.target sm_50\n.address_size 64\n"
                          ".visible .global .align 4 .b8 probe_buf[1048576];\n"
                          ".visible .entry probe_kernel()\n{\n\tret;\n}\n";
/* Kernel handle `k` launched once (one thread) and waited for: NAME.rc and what the launch
   took of the device's free memory, NAME_takes. */
static void first_launch_takes(CUkernel k, const char *name) {
    char key[128];
    size_t before = info_free();
    CUresult rc = cuLaunchKernel((CUfunction)k, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    if (rc == CUDA_SUCCESS) cuCtxSynchronize();
    snprintf(key, sizeof key, "%s.rc", name);
    mach_int(key, rc);
    snprintf(key, sizeof key, "%s_takes", name);
    mach_int(key, (long long)before - (long long)info_free());
}

static void g_module(void) {
    primary();
    CUdeviceptr w = 0;
    MUST(cuMemAlloc_v2(&w, MIB));
    size_t f0 = info_free();
    CUmodule m = NULL;
    long long t0 = now_ns();
    RC("module.cuModuleLoadData(ptx)", cuModuleLoadData(&m, PTX));
    mach_int("module.load_ns", now_ns() - t0);
    size_t f1 = info_free();
    ans_bool("module.load_lowers_free", f1 < f0);
    mach_int("module.load_takes", (long long)f0 - (long long)f1);
    CUfunction fn = NULL;
    /* Recorded, not compared: what a lazily loaded kernel takes when its function is asked
       for, and at its first launch (gpucap measures the first launch, not the lookup). */
    size_t fg0 = info_free();
    RC("module.cuModuleGetFunction(probe_kernel)", cuModuleGetFunction(&fn, m, "probe_kernel"));
    mach_int("module.get_function_takes", (long long)fg0 - (long long)info_free());
    /* Recorded, not compared: whether the function asked for is loaded then
       (CU_FUNCTION_LOADING_STATE_LOADED 1, UNLOADED 0; CUDA 12.4): gpucap measures a
       module's function at cuModuleGetFunction and a graph's with cuFuncLoad. */
    int loaded = -1;
    if (fn) mach_int("module.cuFuncIsLoaded(after get_function).rc", cuFuncIsLoaded(&loaded, fn));
    mach_int("module.get_function_loaded", loaded);
    if (fn) {
        size_t fl0 = info_free();
        CUresult lrc0 = cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
        if (lrc0 == CUDA_SUCCESS) cuCtxSynchronize();
        mach_int("module.first_launch.rc", lrc0);
        mach_int("module.first_launch_takes", (long long)fl0 - (long long)info_free());
    }
    /* Recorded, not compared: the deprecated launches (CUDA 2.0's; gpucap measures them as
       cuLaunchKernel): what cuLaunch answers before any block shape was set (the fake:
       CUDA_ERROR_INVALID_VALUE, a 0 x 0 x 0 block), and after cuFuncSetBlockShape. */
    if (fn) {
        mach_int("launch.legacy_no_shape.rc", cuLaunch(fn));
        mach_int("launch.legacy_set_block_shape.rc", cuFuncSetBlockShape(fn, 1, 1, 1));
        mach_int("launch.legacy_launch_grid.rc", cuLaunchGrid(fn, 1, 1));
        cuCtxSynchronize();
    }
    /* Recorded, not compared: the functions of a second copy of the module as
       cuModuleEnumerateFunctions gives them (CUDA 12.4; "may be partially loaded" under lazy
       loading, and "CUDA APIs may load the function automatically"): loaded or not, and
       what asking one's attribute (as gpucap does before a first launch) and cuFuncLoad
       take. Looked up at run time: the fake has no such call. */
    CUresult (*fn_count)(unsigned *, CUmodule) = NULL;
    CUresult (*fn_enum)(CUfunction *, unsigned, CUmodule) = NULL;
    *(void **)&fn_count = dlsym(RTLD_DEFAULT, "cuModuleGetFunctionCount");
    *(void **)&fn_enum = dlsym(RTLD_DEFAULT, "cuModuleEnumerateFunctions");
    mach_int("module.enumerate.available", fn_count && fn_enum);
    CUmodule m2 = NULL;
    if (fn_count && fn_enum && cuModuleLoadData(&m2, PTX) == CUDA_SUCCESS) {
        unsigned n = 0;
        CUfunction fs[8] = {0};
        mach_int("module.cuModuleGetFunctionCount.rc", fn_count(&n, m2));
        unsigned k = n < 8 ? n : 8;
        size_t e0 = info_free();
        mach_int("module.cuModuleEnumerateFunctions.rc", fn_enum(fs, k, m2));
        mach_int("module.enumerate_takes", (long long)e0 - (long long)info_free());
        if (k && fs[0]) {
            int st = -1, v = 0;
            cuFuncIsLoaded(&st, fs[0]);
            mach_int("module.enumerated_loaded", st);
            size_t a0 = info_free();
            mach_int("module.enumerated_attribute.rc", cuFuncGetAttribute(&v, 3 /* LOCAL_SIZE_BYTES */, fs[0]));
            mach_int("module.enumerated_attribute_takes", (long long)a0 - (long long)info_free());
            st = -1;
            cuFuncIsLoaded(&st, fs[0]);
            mach_int("module.enumerated_loaded_after_attribute", st);
            size_t l1 = info_free();
            mach_int("module.enumerated_cuFuncLoad.rc", cuFuncLoad(fs[0]));
            mach_int("module.enumerated_cuFuncLoad_takes", (long long)l1 - (long long)info_free());
        }
        cuModuleUnload(m2);
    }
    /* Recorded, not compared: which other calls load a partially loaded function (gpucap
       loads one first, measured, at cuFuncGetAttribute and cuFuncSetAttribute, as the fake
       loads there; not at an occupancy question or its name): each of three listed
       functions asked one thing, then whether it is loaded, and what the call took. */
    static const char PTX3[] = ".version 6.0\n.target sm_50\n.address_size 64\n"
                               ".visible .entry e0()\n{\n\tret;\n}\n.visible .entry e1()\n{\n\tret;\n}\n"
                               ".visible .entry e2()\n{\n\tret;\n}\n";
    CUmodule m3 = NULL;
    if (fn_enum && cuModuleLoadData(&m3, PTX3) == CUDA_SUCCESS) {
        CUfunction fs[3] = {0};
        if (fn_enum(fs, 3, m3) == CUDA_SUCCESS && fs[0] && fs[1] && fs[2]) {
            int st = -1, blocks = 0;
            const char *name = NULL;
            size_t s0 = info_free();
            mach_int("module.enumerated_set_attribute.rc", cuFuncSetAttribute(fs[0], 8 /* MAX_DYNAMIC_SHARED */, 1024));
            mach_int("module.enumerated_set_attribute_takes", (long long)s0 - (long long)info_free());
            cuFuncIsLoaded(&st, fs[0]);
            mach_int("module.enumerated_loaded_after_set_attribute", st);
            size_t o0 = info_free();
            mach_int("module.enumerated_occupancy.rc", cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fs[1], 128, 0));
            mach_int("module.enumerated_occupancy_takes", (long long)o0 - (long long)info_free());
            st = -1;
            cuFuncIsLoaded(&st, fs[1]);
            mach_int("module.enumerated_loaded_after_occupancy", st);
            size_t n0 = info_free();
            mach_int("module.enumerated_name.rc", cuFuncGetName(&name, fs[2]));
            mach_int("module.enumerated_name_takes", (long long)n0 - (long long)info_free());
            st = -1;
            cuFuncIsLoaded(&st, fs[2]);
            mach_int("module.enumerated_loaded_after_name", st);
        }
        cuModuleUnload(m3);
    }
    RC("module.cuModuleGetFunction(absent)", cuModuleGetFunction(&fn, m, "absent"));
    CUdeviceptr g = 0;
    size_t bytes = 0;
    RC("module.cuModuleGetGlobal_v2(probe_buf)", cuModuleGetGlobal_v2(&g, &bytes, m, "probe_buf"));
    ans_int("module.global_bytes", (long long)bytes);
    size_t f2 = info_free();
    ans_bool("module.global_lowers_free_at_first_lookup", f2 < f1);
    RC("module.cuModuleUnload", cuModuleUnload(m));
    ans_bool("module.unload_gives_back_what_load_took", info_free() >= f0);
    /* Recorded, not compared: what loading the same image as a library takes at the call
       (gpucap charges modules, not libraries: docs/src/counting.md). */
    CUlibrary lib = NULL;
    size_t l0 = info_free();
    CUresult lrc = cuLibraryLoadData(&lib, PTX, NULL, NULL, 0, NULL, NULL, 0);
    mach_int("library.cuLibraryLoadData.rc", lrc);
    mach_int("library.load_takes", (long long)l0 - (long long)info_free());
    /* Recorded, not compared: a library's function reached through its module in this
       context (cuLibraryGetModule, cuModuleGetFunction): loaded then, or only at
       cuFuncLoad, and what each takes (the fake loads a library's code at its first use). */
    CUmodule lm = NULL;
    CUfunction lf = NULL;
    int lstate = -1;
    size_t gm0 = info_free();
    if (lrc == CUDA_SUCCESS) mach_int("library.cuLibraryGetModule.rc", cuLibraryGetModule(&lm, lib));
    mach_int("library.get_module_takes", (long long)gm0 - (long long)info_free());
    /* ... and its global through that module (cuModuleGetGlobal): whether the library is
       loaded into the context there (gpucap measures cuLibraryGetGlobal, not these). */
    CUdeviceptr lg = 0;
    size_t lgb = 0, gg0 = info_free();
    if (lm) mach_int("library.module_get_global.rc", cuModuleGetGlobal_v2(&lg, &lgb, lm, "probe_buf"));
    mach_int("library.module_get_global_takes", (long long)gg0 - (long long)info_free());
    size_t q0 = info_free();
    if (lm) mach_int("library.module_get_function.rc", cuModuleGetFunction(&lf, lm, "probe_kernel"));
    mach_int("library.module_get_function_takes", (long long)q0 - (long long)info_free());
    if (lf) {
        mach_int("library.cuFuncIsLoaded.rc", cuFuncIsLoaded(&lstate, lf));
        mach_int("library.function_loaded", lstate);
        size_t q1 = info_free();
        mach_int("library.cuFuncLoad.rc", cuFuncLoad(lf));
        mach_int("library.cuFuncLoad_takes", (long long)q1 - (long long)info_free());
        lstate = -1;
        cuFuncIsLoaded(&lstate, lf);
        mach_int("library.function_loaded_after_load", lstate);
    }
    if (lrc == CUDA_SUCCESS) cuLibraryUnload(lib);
    /* Recorded, not compared: a library whose 1 MiB variable is __managed__, the variable
       asked with cuLibraryGetManaged before any kernel of it ran: what that takes (gpucap
       measures it as the library's first use in the context, as for cuLibraryGetGlobal;
       the fake loads the library there). */
    static const char MANAGED_PTX[] = ".version 6.0\n.target sm_50\n.address_size 64\n"
                                      ".visible .global .attribute(.managed) .align 4 .b8 probe_managed[1048576];\n"
                                      ".visible .entry probe_kernel()\n{\n\tret;\n}\n";
    CUlibrary ml = NULL;
    size_t ml0 = info_free();
    CUresult mlrc = cuLibraryLoadData(&ml, MANAGED_PTX, NULL, NULL, 0, NULL, NULL, 0);
    mach_int("library.managed_load.rc", mlrc);
    mach_int("library.managed_load_takes", (long long)ml0 - (long long)info_free());
    if (mlrc == CUDA_SUCCESS) {
        CUdeviceptr mp = 0;
        size_t mb = 0, ml1 = info_free();
        mach_int("library.get_managed.rc", cuLibraryGetManaged(&mp, &mb, ml, "probe_managed"));
        mach_int("library.get_managed_bytes", (long long)mb);
        mach_int("library.get_managed_takes", (long long)ml1 - (long long)info_free());
        cuLibraryUnload(ml);
    }
    /* Recorded, not compared: a kernel handle's attributes asked and set on the device before
       any kernel of its library ran in the context, then the first launch (gpucap asks
       CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES inside a kernel handle's first launch's measurement:
       which of the two loads the library is what these say). */
    CUlibrary al = NULL;
    CUkernel ak = NULL;
    CUresult alrc = cuLibraryLoadData(&al, PTX, NULL, NULL, 0, NULL, NULL, 0);
    mach_int("library.attr_load.rc", alrc);
    if (alrc == CUDA_SUCCESS && cuLibraryGetKernel(&ak, al, "probe_kernel") == CUDA_SUCCESS) {
        int v = -1;
        size_t a0 = info_free();
        mach_int("library.kernel_get_attribute.rc", cuKernelGetAttribute(&v, 3 /* LOCAL_SIZE_BYTES */, ak, 0));
        mach_int("library.kernel_get_attribute_takes", (long long)a0 - (long long)info_free());
        size_t a1 = info_free();
        mach_int("library.kernel_set_attribute.rc",
                 cuKernelSetAttribute(8 /* MAX_DYNAMIC_SHARED_SIZE_BYTES */, 1024, ak, 0));
        mach_int("library.kernel_set_attribute_takes", (long long)a1 - (long long)info_free());
        first_launch_takes(ak, "library.kernel_first_launch_after_attributes");
    }
    if (alrc == CUDA_SUCCESS) cuLibraryUnload(al);
    /* Recorded, not compared: what cuKernelGetFunction takes for a kernel handle whose library
       holds a 64 MiB global, and what its first launch takes after it (gpucap loads a graph's
       kernel handles, and those of a multi-device launch, with its own measured
       cuKernelGetFunction, and leaves a launch that takes nothing more unmeasured). */
    static const char BIG_PTX[] = ".version 6.0\n.target sm_50\n.address_size 64\n"
                                  ".visible .global .align 4 .b8 probe_big[67108864];\n"
                                  ".visible .entry probe_kernel()\n{\n\tret;\n}\n";
    CUlibrary gl = NULL;
    CUkernel gk = NULL;
    CUresult glrc = cuLibraryLoadData(&gl, BIG_PTX, NULL, NULL, 0, NULL, NULL, 0);
    mach_int("library.get_function_load.rc", glrc);
    if (glrc == CUDA_SUCCESS && cuLibraryGetKernel(&gk, gl, "probe_kernel") == CUDA_SUCCESS) {
        CUfunction gf = NULL;
        size_t g0 = info_free();
        mach_int("library.kernel_get_function.rc", cuKernelGetFunction(&gf, gk));
        mach_int("library.kernel_get_function_takes", (long long)g0 - (long long)info_free());
        first_launch_takes(gk, "library.kernel_first_launch_after_get_function");
    }
    if (glrc == CUDA_SUCCESS) cuLibraryUnload(gl);
    /* Recorded, not compared: what raising a context's limits takes right at the call
       (gpucap measures a limit there, docs/src/counting.md's cuCtxSetLimit; one the driver
       takes later, as it takes the malloc heap, is not charged by that measurement). */
    const struct {
        int limit;
        size_t value;
        const char *name;
    } limits[] = {{2 /* CU_LIMIT_MALLOC_HEAP_SIZE */, 64 * MIB, "limit.malloc_heap_64MiB"},
                  {0 /* CU_LIMIT_STACK_SIZE */, 16 * KIB, "limit.stack_16KiB"},
                  {1 /* CU_LIMIT_PRINTF_FIFO_SIZE */, 64 * MIB, "limit.printf_fifo_64MiB"},
                  {4 /* CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT */, 65536, "limit.pending_launches_65536"}};
    for (int i = 0; i < (int)(sizeof limits / sizeof *limits); i++) {
        char k[96];
        size_t before = info_free();
        CUresult rc = cuCtxSetLimit(limits[i].limit, limits[i].value);
        snprintf(k, sizeof k, "%s.rc", limits[i].name);
        mach_int(k, rc);
        snprintf(k, sizeof k, "%s.takes", limits[i].name);
        mach_int(k, (long long)before - (long long)info_free());
    }
    /* Recorded, not compared: the limits CUDA 12.5 added for CUDA-in-Graphics contexts
       ("can only be queried"), read in an ordinary context; cuDNN 9 asks CU_LIMIT_CIG_ENABLED
       (8), which the fake answers with 0 (7 and 9 it does not know). */
    for (int l = 7; l <= 9; l++) {
        char k[96];
        size_t val = 0;
        CUresult rc = cuCtxGetLimit(&val, l);
        snprintf(k, sizeof k, "limit.get_%d.rc", l);
        mach_int(k, rc);
        snprintf(k, sizeof k, "limit.get_%d.value", l);
        mach_int(k, rc == CUDA_SUCCESS ? (long long)val : -1);
    }
    /* Recorded, not compared: copies and sets of 0 bytes to NULL (XLA, in TensorFlow's
       jit-compiled steps, copies 0 bytes to a NULL destination; the fake answers
       CUDA_ERROR_INVALID_VALUE). */
    mach_int("copy.cuMemcpyDtoD_v2(NULL,w,0).rc", cuMemcpyDtoD_v2(0, w, 0));
    mach_int("copy.cuMemsetD8_v2(NULL,0,0).rc", cuMemsetD8_v2(0, 0, 0));
    RC("module.cuModuleLoadData(garbage)", cuModuleLoadData(&m, "not an image"));
    MUST(cuMemFree_v2(w));
    /* Recorded, not compared: green contexts (CUDA 12.4), the primary context active: the
       SM resource's partition rules, and what a green context takes of its own at its
       making (gpucap charges it; the fake takes FAKECUDA_GREEN_CTX_MEM) and gives back at
       its end. Looked up at run time: a driver older than 12.4 has none. */
    CUresult (*get_res)(CUdevice, CUdevResource *, int) = NULL;
    CUresult (*split)(CUdevResource *, unsigned *, const CUdevResource *, CUdevResource *, unsigned, unsigned) = NULL;
    CUresult (*gen_desc)(void **, CUdevResource *, unsigned) = NULL;
    CUresult (*green_create)(void **, void *, CUdevice, unsigned) = NULL;
    CUresult (*green_destroy)(void *) = NULL;
    *(void **)&get_res = dlsym(RTLD_DEFAULT, "cuDeviceGetDevResource");
    *(void **)&split = dlsym(RTLD_DEFAULT, "cuDevSmResourceSplitByCount");
    *(void **)&gen_desc = dlsym(RTLD_DEFAULT, "cuDevResourceGenerateDesc");
    *(void **)&green_create = dlsym(RTLD_DEFAULT, "cuGreenCtxCreate");
    *(void **)&green_destroy = dlsym(RTLD_DEFAULT, "cuGreenCtxDestroy");
    mach_int("green.available", get_res && split && gen_desc && green_create && green_destroy);
    CUdevResource all, part;
    if (get_res && split && gen_desc && green_create && green_destroy &&
        get_res(0, &all, 1 /* CU_DEV_RESOURCE_TYPE_SM */) == CUDA_SUCCESS) {
        mach_int("green.sm_count", all.sm_count);
        mach_int("green.min_partition", all.min_partition);
        mach_int("green.alignment", all.alignment);
        unsigned n = 1;
        void *desc = NULL, *g = NULL;
        mach_int("green.split.rc", split(&part, &n, &all, NULL, 0, 1));
        mach_int("green.split_sms_for_1", part.sm_count);
        mach_int("green.desc.rc", gen_desc(&desc, &part, 1));
        size_t g0 = info_free();
        mach_int("green.create.rc", green_create(&g, desc, 0, 1 /* CU_GREEN_CTX_DEFAULT_STREAM */));
        mach_int("green.create_takes", (long long)g0 - (long long)info_free());
        if (g) {
            /* A module loaded while the green context is current: whether it outlives the
               green context (held by the primary context, whose memory green contexts share)
               or goes with it. */
            CUresult (*from_green)(CUcontext *, void *) = NULL;
            *(void **)&from_green = dlsym(RTLD_DEFAULT, "cuCtxFromGreenCtx");
            CUcontext gc = NULL, saved = NULL;
            CUmodule gm = NULL;
            cuCtxGetCurrent(&saved);
            if (from_green && from_green(&gc, g) == CUDA_SUCCESS && cuCtxSetCurrent(gc) == CUDA_SUCCESS) {
                mach_int("green.ctx_is_primary", gc == saved);
                size_t m0 = info_free();
                mach_int("green.module_load.rc", cuModuleLoadData(&gm, PTX));
                mach_int("green.module_takes", (long long)m0 - (long long)info_free());
                cuCtxSetCurrent(saved);
            }
            size_t g1 = info_free();
            mach_int("green.destroy.rc", green_destroy(g));
            mach_int("green.destroy_gives", (long long)info_free() - (long long)g1);
            if (gm) {
                size_t u0 = info_free();
                mach_int("green.module_unload_after.rc", cuModuleUnload(gm));
                mach_int("green.module_unload_after_gives", (long long)info_free() - (long long)u0);
            }
        }
    }
}

/* The requests real clients made, asked of this driver (no context, as cudart asks). */
static const char *g_requests;
static void g_request(void) {
    MUST(cuInit(0));
    FILE *f = g_requests ? fopen(g_requests, "r") : NULL;
    if (g_requests && !f) {
        printf("FATAL cannot read %s\n", g_requests);
        exit(3);
    }
    char l[1024];
    while (f && fgets(l, sizeof l, f)) {
        char kind[16], name[256];
        int n = 0;
        l[strcspn(l, "\n")] = 0;
        if (sscanf(l, "%15s %255s%n", kind, name, &n) != 2) continue;
        char json[1024];
        char *rest = l + n;
        if (strcmp(kind, "procaddr") == 0) {
            const char *symbol = strcmp(name, "\"\"") == 0 ? "" : name; /* cudart asks for "" */
            int version = 0, used = 0;
            unsigned long long flags = 0;
            if (sscanf(rest, "%d %llu%n", &version, &flags, &used) != 2) continue;
            rest += used;
            void *p = NULL;
            CUdriverProcAddressQueryResult status = 0;
            CUresult rc = cuGetProcAddress_v2(symbol, &p, version, flags, &status);
            Dl_info info;
            const char *export = NULL;
            if (rc == CUDA_SUCCESS && p && dladdr(p, &info) && info.dli_saddr == p) export = info.dli_sname;
            snprintf(json, sizeof json, "{\"rc\":%d,\"status\":%d,\"export\":%s%s%s", rc, (int)status,
                     export ? "\"" : "", export ? export : "null", export ? "\"" : "");
            printf("R procaddr %s %d %llu\t%s", name, version, flags, json); /* the key keeps "" */
        } else if (strcmp(kind, "export") == 0) {
            unsigned char id[16];
            const char *s = name;
            int ok = 1;
            for (int i = 0; i < 16 && ok; i++) {
                while (*s == '-') s++;
                ok = sscanf(s, "%2hhx", &id[i]) == 1;
                s += 2;
            }
            if (!ok) continue;
            const void *t = NULL;
            CUresult rc = cuGetExportTable(&t, id);
            printf("R export %s\t{\"rc\":%d,\"table\":%s", name, rc, t ? "true" : "false");
        } else {
            continue;
        }
        /* The clients that asked, as a JSON list. */
        printf(",\"asked_by\":[");
        char *save = NULL, *c = strtok_r(rest, " \t", &save);
        for (int i = 0; c; c = strtok_r(NULL, " \t", &save), i++) printf("%s\"%s\"", i ? "," : "", c);
        printf("]}\n");
    }
    if (f) fclose(f);
}

/* NULL where the driver writes or reads: each call in a process of its own (a driver may
 * crash on one; the crash is then that call's recorded answer). */
static int g_null_case;
static void g_null(void) {
    primary();
    size_t f = 0, g = 2 * MIB;
    CUmemGenericAllocationHandle h = 0;
    CUmemoryPool pool = NULL;
    CUmodule m = NULL;
    switch (g_null_case) {
        case 0: RC("null.cuDeviceTotalMem_v2(NULL)", cuDeviceTotalMem_v2(NULL, 0)); break;
        case 1: RC("null.cuMemAlloc_v2(NULL out)", cuMemAlloc_v2(NULL, MIB)); break;
        case 2: RC("null.cuMemGetInfo_v2(NULL, NULL)", cuMemGetInfo_v2(NULL, NULL)); break;
        case 3: RC("null.cuMemGetInfo_v2(free, NULL)", cuMemGetInfo_v2(&f, NULL)); break;
        case 4: RC("null.cuMemPoolCreate(NULL props)", cuMemPoolCreate(&pool, NULL)); break;
        case 5: RC("null.cuMemCreate(NULL prop)", cuMemCreate(&h, g, NULL, 0)); break;
        case 6: RC("null.cuModuleLoadData(NULL)", cuModuleLoadData(&m, NULL)); break;
        case 7: RC("null.cuMemGetInfo_v2(NULL, total)", cuMemGetInfo_v2(NULL, &f)); break;
    }
}
#define NULL_CASES 8

/* Edge cases of issue 34.6: cuMemCreate of host memory (does it lower the device's free
 * memory?), memory imported with cuImportExternalMemory (an fd a cuMemCreate handle
 * exported: does the import or its buffer take device memory again?), and multicast
 * objects (supported here? does cuMulticastCreate take device memory itself?). */
typedef struct CUextMemory_st *CUexternalMemory;
typedef struct {
    int type;
    union {
        int fd;
        struct {
            void *handle;
            const void *name;
        } win32;
        const void *nvSciBufObject;
    } handle;
    unsigned long long size;
    unsigned int flags;
    unsigned int reserved[16];
} ProbeExtMemDesc;
typedef struct {
    unsigned long long offset, size;
    unsigned int flags;
    unsigned int reserved[16];
} ProbeExtBufferDesc;
typedef struct {
    unsigned int numDevices;
    size_t size;
    unsigned long long handleTypes, flags;
} ProbeMulticastProp;
CUresult cuImportExternalMemory(CUexternalMemory *ext, const ProbeExtMemDesc *desc);
CUresult cuExternalMemoryGetMappedBuffer(CUdeviceptr *dptr, CUexternalMemory ext,
                                         const ProbeExtBufferDesc *desc);
CUresult cuDestroyExternalMemory(CUexternalMemory ext);
CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle h, int type,
                                      unsigned long long flags);
CUresult cuMulticastGetGranularity(size_t *g, const ProbeMulticastProp *prop, int option);
CUresult cuMulticastCreate(CUmemGenericAllocationHandle *mc, const ProbeMulticastProp *prop);
CUresult cuMulticastAddDevice(CUmemGenericAllocationHandle mc, CUdevice dev);
CUresult cuMulticastBindMem(CUmemGenericAllocationHandle mc, size_t mc_offset, CUmemGenericAllocationHandle mem,
                            size_t mem_offset, size_t size, unsigned long long flags);
CUresult cuMulticastUnbind(CUmemGenericAllocationHandle mc, CUdevice dev, size_t mc_offset, size_t size);

typedef struct CUarray_st *ProbeArray;
typedef struct {
    size_t width, height;
    int format;
    unsigned channels;
} ProbeArrayDesc;
typedef struct {
    size_t size, alignment;
    unsigned reserved[4];
} ProbeArrayReqs;
CUresult cuArrayCreate_v2(ProbeArray *a, const ProbeArrayDesc *desc);
CUresult cuArrayDestroy(ProbeArray a);
CUresult cuArrayGetMemoryRequirements(ProbeArrayReqs *reqs, ProbeArray a, CUdevice dev);
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os, int type);

static CUresult g_thread_rc = (CUresult)-1;
static void *create_on_a_bare_thread(void *arg) {
    CUmemAllocationProp *p = arg;
    CUmemGenericAllocationHandle h = 0;
    g_thread_rc = cuMemCreate(&h, 32 * MIB, p, 0);
    if (g_thread_rc == CUDA_SUCCESS) cuMemRelease(h);
    return NULL;
}

/* What gpucap's review found and no real driver has answered yet (2026-12-07), recorded
 * as machine figures (never compared) until a GPU session commits them: whether memory a
 * call places on a GPU is served with no context current, what an ordinary array takes
 * and whether the driver sizes it, and whether an imported handle keeps memory its
 * exporter released. */
static void unrecorded(void) {
    CUmemAllocationProp dp;
    memset(&dp, 0, sizeof dp);
    dp.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    dp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    pthread_t t;
    if (pthread_create(&t, NULL, create_on_a_bare_thread, &dp) == 0) {
        pthread_join(t, NULL);
        mach_int("edges.no_context.cuMemCreate", g_thread_rc);
    }
    CUstream st = NULL;
    if (cuStreamCreate(&st, 0) == CUDA_SUCCESS) {
        CUcontext saved = NULL;
        MUST(cuCtxGetCurrent(&saved));
        MUST(cuCtxSetCurrent(NULL));
        CUdeviceptr p = 0;
        CUresult rc = cuMemAllocAsync(&p, 32 * MIB, st);
        mach_int("edges.no_context.cuMemAllocAsync(stream)", rc);
        MUST(cuCtxSetCurrent(saved));
        if (rc == CUDA_SUCCESS) cuMemFreeAsync(p, st);
        cuStreamSynchronize(st);
        cuStreamDestroy_v2(st);
    }
    static const struct {
        const char *key;
        size_t w, h;
    } ARRAYS[] = {{"1x1", 1, 1}, {"1000x1000", 1000, 1000}, {"4097x3", 4097, 3}};
    char k[128];
    for (size_t i = 0; i < sizeof ARRAYS / sizeof *ARRAYS; i++) {
        ProbeArrayDesc d = {ARRAYS[i].w, ARRAYS[i].h, 0x20 /* FLOAT */, 1};
        ProbeArray a = NULL;
        size_t f0 = info_free();
        CUresult rc = cuArrayCreate_v2(&a, &d);
        snprintf(k, sizeof k, "edges.array.%s.cuArrayCreate_v2", ARRAYS[i].key);
        mach_int(k, rc);
        if (rc != CUDA_SUCCESS) continue;
        snprintf(k, sizeof k, "edges.array.%s.cuMemGetInfo_drop", ARRAYS[i].key);
        mach_int(k, (long long)f0 - (long long)info_free());
        ProbeArrayReqs r;
        memset(&r, 0, sizeof r);
        rc = cuArrayGetMemoryRequirements(&r, a, 0);
        snprintf(k, sizeof k, "edges.array.%s.cuArrayGetMemoryRequirements", ARRAYS[i].key);
        mach_int(k, rc);
        snprintf(k, sizeof k, "edges.array.%s.requirements_size", ARRAYS[i].key);
        mach_int(k, rc == CUDA_SUCCESS ? (long long)r.size : -1);
        cuArrayDestroy(a);
    }
    dp.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUmemGenericAllocationHandle h = 0, again = 0;
    if (cuMemCreate(&h, 32 * MIB, &dp, 0) == CUDA_SUCCESS) {
        int fd = -1;
        CUresult rc = cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        if (rc == CUDA_SUCCESS) {
            rc = cuMemImportFromShareableHandle(&again, (void *)(intptr_t)fd,
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
            close(fd);
        }
        mach_int("edges.import_own.cuMemImportFromShareableHandle", rc);
        size_t f0 = info_free();
        MUST(cuMemRelease(h));
        /* 0: the import keeps the memory (NVIDIA's cuMemRelease documentation); 32 MiB:
           the exporter's release freed it. */
        mach_int("edges.import_own.release_original_back", (long long)info_free() - (long long)f0);
        if (rc == CUDA_SUCCESS) {
            f0 = info_free();
            MUST(cuMemRelease(again));
            mach_int("edges.import_own.release_import_back", (long long)info_free() - (long long)f0);
        }
    }
}

static void g_edges(void) {
    primary();
    static const struct {
        const char *key;
        int type, id;
    } HOSTS[] = {{"host", 2, 0}, {"host_numa0", 3, 0}, {"host_numa_current", 4, 0}};
    char k[128];
    for (size_t i = 0; i < sizeof HOSTS / sizeof *HOSTS; i++) {
        CUmemAllocationProp p;
        memset(&p, 0, sizeof p);
        p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        p.location.type = (CUmemLocationType)HOSTS[i].type;
        p.location.id = HOSTS[i].id;
        size_t g = 0;
        snprintf(k, sizeof k, "edges.%s.cuMemGetAllocationGranularity", HOSTS[i].key);
        RC(k, cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        if (g == 0) g = 2 * MIB;
        CUmemGenericAllocationHandle h = 0;
        size_t f0 = info_free();
        snprintf(k, sizeof k, "edges.%s.cuMemCreate", HOSTS[i].key);
        CUresult rc = cuMemCreate(&h, 32 * g, &p, 0);
        ans_int(k, rc);
        if (rc != CUDA_SUCCESS) continue;
        snprintf(k, sizeof k, "edges.%s.cuMemGetInfo_drop", HOSTS[i].key);
        ans_int(k, (long long)f0 - (long long)info_free());
        MUST(cuMemRelease(h));
    }
    CUmemAllocationProp bad;
    memset(&bad, 0, sizeof bad);
    bad.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    bad.location.type = (CUmemLocationType)3;
    bad.location.id = 4096;
    CUmemGenericAllocationHandle hb = 0;
    RC("edges.host_numa4096.cuMemCreate", cuMemCreate(&hb, 2 * MIB, &bad, 0));

    /* External memory: a device handle exported as an fd, imported back. */
    CUmemAllocationProp dp;
    memset(&dp, 0, sizeof dp);
    dp.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    dp.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    dp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUmemGenericAllocationHandle h = 0;
    const size_t size = 32 * MIB;
    MUST(cuMemCreate(&h, size, &dp, 0));
    int fd = -1;
    MUST(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    ProbeExtMemDesc d;
    memset(&d, 0, sizeof d);
    d.type = 1; /* CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD */
    d.handle.fd = fd;
    d.size = size;
    CUexternalMemory ext = NULL;
    size_t f0 = info_free();
    CUresult rc = cuImportExternalMemory(&ext, &d);
    ans_int("edges.external.cuImportExternalMemory(exported fd)", rc);
    if (rc == CUDA_SUCCESS) {
        ans_int("edges.external.import.cuMemGetInfo_drop", (long long)f0 - (long long)info_free());
        ProbeExtBufferDesc b;
        memset(&b, 0, sizeof b);
        b.size = size;
        CUdeviceptr p = 0;
        rc = cuExternalMemoryGetMappedBuffer(&p, ext, &b);
        ans_int("edges.external.cuExternalMemoryGetMappedBuffer", rc);
        if (rc == CUDA_SUCCESS) {
            ans_int("edges.external.buffer.cuMemGetInfo_drop",
                    (long long)f0 - (long long)info_free());
            RC("edges.external.cuMemFree_v2(buffer)", cuMemFree_v2(p));
        }
        RC("edges.external.cuDestroyExternalMemory", cuDestroyExternalMemory(ext));
        RC("edges.external.cuDestroyExternalMemory(again)", cuDestroyExternalMemory(ext));
    } else {
        close(fd);
    }
    MUST(cuMemRelease(h));

    /* Multicast. */
    int mc_supported = -1;
    RC("edges.multicast.attribute_rc", cuDeviceGetAttribute(&mc_supported, 132, 0));
    ans_int("edges.multicast.supported", mc_supported);
    ProbeMulticastProp mp = {1, 0, 0, 0};
    size_t mg = 0;
    rc = cuMulticastGetGranularity(&mg, &mp, 0);
    ans_int("edges.multicast.cuMulticastGetGranularity", rc);
    if (rc == CUDA_SUCCESS) {
        mach_int("edges.multicast.granularity", (long long)mg);
        mp.size = 32 * mg;
        CUmemGenericAllocationHandle mc = 0;
        f0 = info_free();
        rc = cuMulticastCreate(&mc, &mp);
        ans_int("edges.multicast.cuMulticastCreate", rc);
        if (rc == CUDA_SUCCESS) {
            RC("edges.multicast.cuMulticastAddDevice", cuMulticastAddDevice(mc, 0));
            /* What the object itself takes (recorded, the fake has no multicast). */
            mach_int("edges.multicast.create_drop", (long long)f0 - (long long)info_free());
            /* Memory bound to it, then released while bound: does the driver give it back at
               the release (gpucap keeps it charged until the unbind), or at the unbind? */
            dp.requestedHandleTypes = 0;
            CUmemGenericAllocationHandle bound = 0;
            if (cuMemCreate(&bound, mp.size, &dp, 0) == CUDA_SUCCESS) {
                rc = cuMulticastBindMem(mc, 0, bound, 0, mp.size, 0);
                ans_int("edges.multicast.cuMulticastBindMem", rc);
                f0 = info_free();
                RC("edges.multicast.cuMemRelease(bound)", cuMemRelease(bound));
                mach_int("edges.multicast.bound_release_back", (long long)info_free() - (long long)f0);
                if (rc == CUDA_SUCCESS) {
                    f0 = info_free();
                    RC("edges.multicast.cuMulticastUnbind", cuMulticastUnbind(mc, 0, 0, mp.size));
                    mach_int("edges.multicast.unbind_back", (long long)info_free() - (long long)f0);
                }
            }
            RC("edges.multicast.cuMemRelease", cuMemRelease(mc));
        }
    }
    unrecorded();
}

/* ---- the groups, in order ------------------------------------------------------ */

static const struct {
    const char *name;
    void (*run)(void);
} GROUPS[] = {{"init", g_init},     {"context", g_context},     {"alloc", g_alloc},
              {"pointer", g_pointer}, {"pool", g_pool},          {"pool_freed", g_pool_freed},
              {"vmm", g_vmm},       {"vmm_bad", g_vmm_bad},     {"module", g_module},
              {"request", g_request}, {"edges", g_edges}};

int main(int argc, char **argv) {
    if (argc > 2) {
        fprintf(stderr, "usage: %s [REQUESTS]\n", argv[0]);
        return 2;
    }
    g_requests = argc == 2 ? argv[1] : NULL;
    for (size_t i = 0; i < sizeof GROUPS / sizeof *GROUPS; i++) run_group(GROUPS[i].name, GROUPS[i].run);
    for (g_null_case = 0; g_null_case < NULL_CASES; g_null_case++) {
        char name[32];
        snprintf(name, sizeof name, "null.%d", g_null_case);
        run_group(name, g_null);
    }
    print_document();
    return 0;
}
