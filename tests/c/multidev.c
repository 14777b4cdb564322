/*
 * multidev: per-device caps on a 2-device fake.
 *
 *   multidev perdevice <cap0> <cap1>
 *   multidev vmm       <cap0> <cap1>
 *
 * "perdevice": a context on each device; allocations are charged to the current
 * context's device, frees credit the device the pointer was charged to (even when
 * another device's context is current), cuMemGetInfo_v2 and cuDeviceTotalMem_v2
 * report each device's own cap.
 * "vmm": cuMemCreate is charged to prop.location.id (not the current context's
 * device), counted per handle, and cuMemRelease credits it back.
 */
#define _GNU_SOURCE
#include "fakecuda.h"

static size_t g_cap[2];
static CUcontext g_ctx[2];

static void use(int dev) { MUST(cuCtxSetCurrent(g_ctx[dev])); }

static void info(int dev, size_t *f, size_t *t) {
    CUcontext saved;
    MUST(cuCtxGetCurrent(&saved));
    use(dev);
    MUST(cuMemGetInfo_v2(f, t));
    MUST(cuCtxSetCurrent(saved));
}

static void check_free(int dev, size_t want, const char *when) {
    size_t f, t;
    info(dev, &f, &t);
    CHECK(f == want && t == g_cap[dev], "%s: GPU %d free=%zu total=%zu, expected free=%zu total=%zu",
          when, dev, f, t, want, g_cap[dev]);
}

static void perdevice(void) {
    CUdeviceptr a = 0, b = 0, c = 0;
    CUresult rc;
    for (int dev = 0; dev < 2; dev++) {
        size_t t = 0;
        CUdevice h;
        MUST(cuDeviceGet(&h, dev));
        MUST(cuDeviceTotalMem_v2(&t, h));
        CHECK(t == g_cap[dev], "cuDeviceTotalMem_v2(%d) = %zu, expected %zu", dev, t, g_cap[dev]);
        check_free(dev, g_cap[dev], "start");
    }

    /* GPU 1 takes more than GPU 0's whole cap. */
    use(1);
    size_t big = g_cap[0] * 2;
    rc = cuMemAlloc_v2(&a, big);
    CHECK(rc == CUDA_SUCCESS, "GPU 1: cuMemAlloc_v2(2x GPU 0's cap) -> %d", rc);
    CUdevice cur = -1;
    MUST(cuCtxGetDevice(&cur));
    CHECK(cur == 1, "current device is 1 (%d)", cur);
    check_free(1, g_cap[1] - big, "after GPU 1 allocation");
    check_free(0, g_cap[0], "GPU 0 untouched by GPU 1's allocation");

    /* GPU 0 has its own, smaller cap. */
    use(0);
    rc = cuMemAlloc_v2(&b, g_cap[0] + MIB);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "GPU 0: cuMemAlloc_v2(cap0 + 1 MiB) -> %d, expected 2", rc);
    if (rc == CUDA_SUCCESS) cuMemFree_v2(b);
    rc = cuMemAlloc_v2(&b, g_cap[0] / 4 * 3);
    CHECK(rc == CUDA_SUCCESS, "GPU 0: cuMemAlloc_v2(3/4 cap0) -> %d", rc);
    check_free(0, g_cap[0] - g_cap[0] / 4 * 3, "after GPU 0 allocation");
    rc = cuMemAllocAsync(&c, g_cap[0] / 2, NULL);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "GPU 0: cuMemAllocAsync(1/2 cap0) with 3/4 in use -> %d", rc);
    if (rc == CUDA_SUCCESS) cuMemFreeAsync(c, NULL);

    /* Free GPU 1's pointer while GPU 0's context is current: GPU 1 gets the credit. */
    rc = cuMemFree_v2(a);
    CHECK(rc == CUDA_SUCCESS, "cuMemFree_v2(GPU 1 pointer) with GPU 0 current -> %d", rc);
    check_free(1, g_cap[1], "GPU 1 credited although GPU 0 was current");
    check_free(0, g_cap[0] - g_cap[0] / 4 * 3, "GPU 0 unchanged by GPU 1's free");

    /* Same with cuMemFreeAsync, the other way round. */
    use(1);
    rc = cuMemFreeAsync(b, NULL);
    CHECK(rc == CUDA_SUCCESS, "cuMemFreeAsync(GPU 0 pointer) with GPU 1 current -> %d", rc);
    MUST(cuStreamSynchronize(NULL));
    check_free(0, g_cap[0], "GPU 0 credited by cuMemFreeAsync from GPU 1's context");
    check_free(1, g_cap[1], "GPU 1 unchanged");

    /* Both caps can be filled at once. */
    use(0);
    rc = cuMemAlloc_v2(&a, g_cap[0]);
    CHECK(rc == CUDA_SUCCESS, "GPU 0: whole cap -> %d", rc);
    use(1);
    rc = cuMemAlloc_v2(&b, g_cap[1]);
    CHECK(rc == CUDA_SUCCESS, "GPU 1: whole cap -> %d", rc);
    rc = cuMemAlloc_v2(&c, MIB);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "GPU 1: 1 MiB more -> %d", rc);
    MUST(cuMemFree_v2(a));
    MUST(cuMemFree_v2(b));
    check_free(0, g_cap[0], "end");
    check_free(1, g_cap[1], "end");
}

static CUmemAllocationProp prop_on(int dev) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    return prop;
}

static void vmm(void) {
    CUmemAllocationProp p0 = prop_on(0), p1 = prop_on(1);
    size_t g = 0;
    MUST(cuMemGetAllocationGranularity(&g, &p0, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    printf("info granularity %zu\n", g);
    CUmemGenericAllocationHandle h[8] = {0};
    CUresult rc;
    const size_t q = g_cap[0] / 2; /* multiple of the granularity for the caps used */

    /* GPU 1's context is current; the allocations name GPU 0. */
    use(1);
    rc = cuMemCreate(&h[0], q, &p0, 0);
    CHECK(rc == CUDA_SUCCESS, "cuMemCreate(cap0/2 on GPU 0) -> %d", rc);
    check_free(0, g_cap[0] - q, "charged to prop.location.id = 0");
    check_free(1, g_cap[1], "not to the current context's GPU 1");
    rc = cuMemCreate(&h[1], q + g, &p0, 0);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate(cap0/2 + granule on GPU 0) -> %d, expected 2", rc);
    if (rc == CUDA_SUCCESS) cuMemRelease(h[1]);
    rc = cuMemCreate(&h[1], q, &p0, 0);
    CHECK(rc == CUDA_SUCCESS, "cuMemCreate(the other cap0/2 on GPU 0) -> %d", rc);
    check_free(0, 0, "GPU 0 full");
    rc = cuMemCreate(&h[2], g, &p0, 0);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate(one granule) on a full GPU 0 -> %d, expected 2", rc);
    if (rc == CUDA_SUCCESS) cuMemRelease(h[2]);
    /* cuMemAlloc on GPU 0 sees the same ledger. */
    use(0);
    CUdeviceptr d;
    rc = cuMemAlloc_v2(&d, MIB);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc_v2(1 MiB) on a GPU 0 full of cuMemCreate -> %d", rc);
    if (rc == CUDA_SUCCESS) cuMemFree_v2(d);

    /* GPU 1 has room while GPU 0 is full, even with GPU 0's context current. */
    rc = cuMemCreate(&h[3], g_cap[1] / 2, &p1, 0);
    CHECK(rc == CUDA_SUCCESS, "cuMemCreate(cap1/2 on GPU 1) with GPU 0 current -> %d", rc);
    check_free(1, g_cap[1] - g_cap[1] / 2, "GPU 1 charged");

    /* Release credits the handle's device. */
    use(1);
    MUST(cuMemRelease(h[0]));
    check_free(0, q, "cuMemRelease credits GPU 0");
    rc = cuMemCreate(&h[2], g, &p0, 0);
    CHECK(rc == CUDA_SUCCESS, "cuMemCreate(one granule) on GPU 0 after the release -> %d", rc);
    check_free(0, q - g, "one granule charged");
    rc = cuMemRelease(h[0]);
    CHECK(rc != CUDA_SUCCESS, "cuMemRelease of a released handle -> %d", rc);
    check_free(0, q - g, "double release credits nothing");

    MUST(cuMemRelease(h[1]));
    MUST(cuMemRelease(h[2]));
    MUST(cuMemRelease(h[3]));
    check_free(0, g_cap[0], "end");
    check_free(1, g_cap[1], "end");
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s <perdevice|vmm> <cap0> <cap1>\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    g_cap[0] = parse_size(argv[2]);
    g_cap[1] = parse_size(argv[3]);
    MUST(cuInit(0));
    int n = 0;
    MUST(cuDeviceGetCount(&n));
    if (n != 2) {
        printf("FATAL expected 2 devices, got %d\n", n);
        return 3;
    }
    for (int dev = 0; dev < 2; dev++) {
        CUdevice h;
        MUST(cuDeviceGet(&h, dev));
        MUST(cuCtxCreate_v2(&g_ctx[dev], 0, h));
    }

    if (strcmp(argv[1], "perdevice") == 0) perdevice();
    else if (strcmp(argv[1], "vmm") == 0) vmm();
    else return 2;
    return finish();
}
