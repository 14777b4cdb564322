/*
 * teardown: the driver frees a context's memory when the context goes away
 * (cuCtxDestroy, cuDevicePrimaryCtxReset, the last cuDevicePrimaryCtxRelease); the
 * cap must follow, or a program that tears down and recreates contexts is refused
 * memory it does not hold.
 *
 *   teardown <capped|uncapped> <cap> <phys>
 */
#define _GNU_SOURCE
#include "fakecuda.h"

static int g_capped;
static size_t g_cap, g_phys;

static size_t total(void) { return g_capped ? g_cap : g_phys; }

static void check_empty(const char *when) {
    size_t f = 0, t = 0;
    CUresult rc = cuMemGetInfo_v2(&f, &t);
    CHECK(rc == CUDA_SUCCESS && f == total() && t == total(),
          "%s: cuMemGetInfo_v2 -> rc=%d free=%zu total=%zu, expected free=total=%zu", when, rc, f, t,
          total());
}

static CUdeviceptr alloc_most(const char *when) {
    CUdeviceptr d = 0;
    CUresult rc = cuMemAlloc_v2(&d, g_cap / 4 * 3);
    CHECK(rc == CUDA_SUCCESS, "%s: cuMemAlloc_v2(3/4 of the cap) -> %d", when, rc);
    return rc == CUDA_SUCCESS ? d : 0;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s <capped|uncapped> <cap> <phys>\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    g_capped = strcmp(argv[1], "capped") == 0;
    g_cap = parse_size(argv[2]);
    g_phys = parse_size(argv[3]);
    MUST(cuInit(0));
    CUdevice dev;
    MUST(cuDeviceGet(&dev, 0));
    CUcontext ctx, prim;

    /* cuCtxDestroy_v2 with memory still allocated. */
    MUST(cuCtxCreate_v2(&ctx, 0, dev));
    CUdeviceptr stale = alloc_most("own context");
    MUST(cuCtxDestroy_v2(ctx));
    MUST(cuCtxCreate_v2(&ctx, 0, dev));
    check_empty("after cuCtxDestroy_v2 of a context holding 3/4 of the cap");
    CUdeviceptr d = alloc_most("after cuCtxDestroy_v2");
    /* The destroyed context's pointer is gone: freeing it is the driver's error and
     * credits nothing (even if the driver reused the address for d). */
    if (stale && stale != d) {
        CUresult rc = cuMemFree_v2(stale);
        CHECK(rc == CUDA_ERROR_INVALID_VALUE, "cuMemFree_v2(pointer of the destroyed context) -> %d", rc);
    }
    if (d) MUST(cuMemFree_v2(d));
    check_empty("after freeing in the new context");
    MUST(cuCtxDestroy_v2(ctx));

    /* cuDevicePrimaryCtxReset_v2. */
    MUST(cuDevicePrimaryCtxRetain(&prim, dev));
    MUST(cuCtxSetCurrent(prim));
    alloc_most("primary context");
    MUST(cuDevicePrimaryCtxReset_v2(dev));
    MUST(cuDevicePrimaryCtxRetain(&prim, dev));
    MUST(cuCtxSetCurrent(prim));
    check_empty("after cuDevicePrimaryCtxReset_v2");

    /* The last cuDevicePrimaryCtxRelease_v2. */
    alloc_most("primary context, retained once");
    MUST(cuDevicePrimaryCtxRelease_v2(dev));
    MUST(cuDevicePrimaryCtxRetain(&prim, dev));
    MUST(cuCtxSetCurrent(prim));
    check_empty("after the last cuDevicePrimaryCtxRelease_v2");
    d = alloc_most("after the primary context came back");
    if (d) MUST(cuMemFree_v2(d));
    check_empty("end");
    return finish();
}
