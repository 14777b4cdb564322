/*
 * misuse: wrong calls must get the driver's own answer and leave the ledger alone.
 *
 *   misuse misuse   <capped|uncapped> <cap> <phys>
 *   misuse rollback <capped|uncapped> <cap> <phys>     (cap > phys: the FAKE refuses)
 *
 * "misuse": frees of NULL / unknown / interior / already freed pointers, size 0,
 * NULL output pointers, sizes near SIZE_MAX, overflowing pitch products, bad VMM
 * handles. Every error code is printed as "rc <label> <code>" so the Rust test can
 * check that the shim returned exactly what the fake returns without it. After each,
 * cuMemGetInfo_v2 must show the same free memory as before.
 *
 * "rollback": allocations past the fake's physical memory (but within the cap) fail
 * in the driver; the shim must not keep them charged.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>

#include "fakecuda.h"

static int g_capped;
static size_t g_cap, g_phys;

static size_t info_free(void) {
    size_t f = 0, t = 0;
    CUresult rc = cuMemGetInfo_v2(&f, &t);
    if (rc != CUDA_SUCCESS) {
        printf("FATAL cuMemGetInfo_v2 -> %d\n", rc);
        exit(3);
    }
    return f;
}

static size_t info_total(void) {
    size_t f = 0, t = 0;
    MUST(cuMemGetInfo_v2(&f, &t));
    return t;
}

/* A call that succeeds doing nothing (a CUDA 13.0 driver's answer); prints its code and
 * checks the ledger did not move. */
#define MUST_NOOP(label, call)                                                                 \
    do {                                                                                       \
        size_t before_ = info_free();                                                          \
        CUresult rc_ = (call);                                                                 \
        size_t after_ = info_free();                                                           \
        printf("rc %s %d\n", label, rc_);                                                      \
        CHECK(rc_ == CUDA_SUCCESS, "%s succeeds (rc=%d)", label, rc_);                         \
        CHECK(after_ == before_, "%s leaves cuMemGetInfo free unchanged (%zu -> %zu)", label,  \
              before_, after_);                                                                \
    } while (0)

/* A call that must fail; prints its code and checks the ledger did not move. */
#define MUST_FAIL(label, call)                                                                 \
    do {                                                                                       \
        size_t before_ = info_free();                                                          \
        CUresult rc_ = (call);                                                                 \
        size_t after_ = info_free();                                                           \
        printf("rc %s %d\n", label, rc_);                                                      \
        CHECK(rc_ != CUDA_SUCCESS, "%s fails (rc=%d)", label, rc_);                            \
        CHECK(after_ == before_, "%s leaves cuMemGetInfo free unchanged (%zu -> %zu)", label,  \
              before_, after_);                                                                \
    } while (0)

static size_t granularity(int dev) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t g = 0;
    MUST(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    return g;
}

static CUmemAllocationProp device_prop(int dev) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    return prop;
}

static void misuse(void) {
    const size_t total = g_capped ? g_cap : g_phys;
    CUdeviceptr d = 0, d2 = 0;
    CUresult rc;
    CHECK(info_free() == total && info_total() == total, "start: free == total == %zu", total);

    /* Frees of pointers that are not (or no longer) allocations. */
    MUST_NOOP("cuMemFree_v2(NULL)", cuMemFree_v2(0));
    MUST_FAIL("cuMemFree_v2(unknown)", cuMemFree_v2((CUdeviceptr)0xdead0000ULL));
    MUST_NOOP("cuMemFreeAsync(NULL)", cuMemFreeAsync(0, NULL));
    MUST_FAIL("cuMemFreeAsync(unknown)", cuMemFreeAsync((CUdeviceptr)0xdead0000ULL, NULL));

    MUST(cuMemAlloc_v2(&d, 2 * MIB));
    size_t charged = info_free();
    CHECK(charged == total - 2 * MIB, "cuMemAlloc_v2(2 MiB) charges 2 MiB (free %zu)", charged);
    MUST_FAIL("cuMemFree_v2(interior)", cuMemFree_v2(d + 4096));
    MUST(cuMemFree_v2(d));
    CHECK(info_free() == total, "free credits 2 MiB back");
    MUST_FAIL("cuMemFree_v2(double)", cuMemFree_v2(d));
    MUST_FAIL("cuMemFreeAsync(after cuMemFree_v2)", cuMemFreeAsync(d, NULL));

    MUST(cuMemAllocAsync(&d, 3 * MIB, NULL));
    MUST(cuMemFreeAsync(d, NULL));
    MUST(cuStreamSynchronize(NULL));
    MUST_FAIL("cuMemFreeAsync(double)", cuMemFreeAsync(d, NULL));
    MUST_FAIL("cuMemFree_v2(after cuMemFreeAsync)", cuMemFree_v2(d));

    /* An address freed and handed out again by the driver is a new allocation. */
    MUST(cuMemAlloc_v2(&d, MIB));
    MUST(cuMemFree_v2(d));
    MUST(cuMemAlloc_v2(&d2, MIB));
    CHECK(info_free() == total - MIB, "re-allocation charged once (free %zu)", info_free());
    MUST(cuMemFree_v2(d2));
    CHECK(info_free() == total, "and credited once");

    /* Size 0 and NULL output pointers: the driver's error, nothing charged. */
    MUST_FAIL("cuMemAlloc_v2(size 0)", cuMemAlloc_v2(&d, 0));
    /* A 0-byte stream-ordered allocation succeeds with nothing allocated; freeing what
     * it wrote (NULL) changes nothing either, and neither is counted. */
    d = 0;
    MUST_NOOP("cuMemAllocAsync(size 0)", cuMemAllocAsync(&d, 0, NULL));
    MUST_NOOP("cuMemFreeAsync(of the 0-byte allocation)", cuMemFreeAsync(d, NULL));
    /* Also with no room left at all: there is nothing to refuse. */
    CUdeviceptr full = 0;
    MUST(cuMemAlloc_v2(&full, info_free()));
    MUST_NOOP("cuMemAllocAsync(size 0) with no room left", cuMemAllocAsync(&d, 0, NULL));
    MUST(cuMemFree_v2(full));
    MUST_FAIL("cuMemAllocManaged(size 0)", cuMemAllocManaged(&d, 0, CU_MEM_ATTACH_GLOBAL));
    size_t pitch = 0;
    MUST_FAIL("cuMemAllocPitch_v2(width 0)", cuMemAllocPitch_v2(&d, &pitch, 0, 16, 4));
    MUST_FAIL("cuMemAlloc_v2(NULL out)", cuMemAlloc_v2(NULL, MIB));
    MUST_FAIL("cuMemAllocAsync(NULL out)", cuMemAllocAsync(NULL, MIB, NULL));
    MUST_FAIL("cuMemAllocPitch_v2(NULL pitch)", cuMemAllocPitch_v2(&d, NULL, MIB, 4, 4));

    /* Sizes near SIZE_MAX: refused (by the shim, or by the fake without it), no wrap. */
    const size_t huge[] = {SIZE_MAX, SIZE_MAX - 4095, SIZE_MAX - g_cap / 2, (size_t)1 << 63,
                           SIZE_MAX / 2 + 1, SIZE_MAX - g_cap + 1};
    for (size_t i = 0; i < sizeof huge / sizeof *huge; i++) {
        char label[96];
        size_t before = info_free();
        snprintf(label, sizeof label, "cuMemAlloc_v2(%#zx)", huge[i]);
        rc = cuMemAlloc_v2(&d, huge[i]);
        printf("rc %s %d\n", label, rc);
        CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "%s -> %d, expected 2", label, rc);
        CHECK(info_free() == before, "%s leaves the ledger alone", label);
        snprintf(label, sizeof label, "cuMemAllocAsync(%#zx)", huge[i]);
        rc = cuMemAllocAsync(&d, huge[i], NULL);
        printf("rc %s %d\n", label, rc);
        CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "%s -> %d, expected 2", label, rc);
        CHECK(info_free() == before, "%s leaves the ledger alone", label);
        snprintf(label, sizeof label, "cuMemAllocManaged(%#zx)", huge[i]);
        rc = cuMemAllocManaged(&d, huge[i], CU_MEM_ATTACH_GLOBAL);
        printf("rc %s %d\n", label, rc);
        CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "%s -> %d, expected 2", label, rc);
        CHECK(info_free() == before, "%s leaves the ledger alone", label);
    }
    /* Half the cap in use, then something that only fits if the sum wraps around. */
    MUST(cuMemAlloc_v2(&d, total / 2));
    size_t before = info_free();
    rc = cuMemAlloc_v2(&d2, SIZE_MAX - total / 2 + 2);
    printf("rc cuMemAlloc_v2(wraps-with-used) %d\n", rc);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "used + size wrapping past 2^64 -> %d, expected 2", rc);
    CHECK(info_free() == before, "and the ledger is unchanged");
    MUST(cuMemFree_v2(d));

    /* Pitched: width * height (and pitch * height) overflow 64 bits. */
    MUST_FAIL("cuMemAllocPitch_v2(overflowing)",
              cuMemAllocPitch_v2(&d, &pitch, (size_t)1 << 33, (size_t)1 << 33, 4));
    MUST_FAIL("cuMemAllocPitch_v2(SIZE_MAX width)", cuMemAllocPitch_v2(&d, &pitch, SIZE_MAX, 2, 4));

    /* VMM: bad sizes and handles. */
    size_t g = granularity(0);
    CUmemAllocationProp prop = device_prop(0);
    CUmemGenericAllocationHandle h = 0;
    MUST_FAIL("cuMemCreate(size 0)", cuMemCreate(&h, 0, &prop, 0));
    MUST_FAIL("cuMemCreate(huge)", cuMemCreate(&h, SIZE_MAX / g * g, &prop, 0));
    MUST_FAIL("cuMemCreate(NULL prop)", cuMemCreate(&h, g, NULL, 0));
    MUST_FAIL("cuMemRelease(unknown)", cuMemRelease((CUmemGenericAllocationHandle)0x12345678ULL));
    MUST(cuMemCreate(&h, g, &prop, 0));
    CHECK(info_free() == total - g, "cuMemCreate(granularity) charged %zu", g);
    MUST(cuMemRelease(h));
    MUST_FAIL("cuMemRelease(double)", cuMemRelease(h));

    /* After all that, normal use works and the figures are sane. */
    CHECK(info_free() == total && info_total() == total, "end: free == total == %zu (free %zu)", total,
          info_free());
    rc = cuMemAlloc_v2(&d, total / 2);
    CHECK(rc == CUDA_SUCCESS, "cuMemAlloc_v2(half) after the misuse -> %d", rc);
    CHECK(info_free() == total - total / 2, "half charged");
    rc = cuMemAlloc_v2(&d2, total / 2);
    CHECK(rc == CUDA_SUCCESS, "cuMemAlloc_v2(other half) -> %d", rc);
    if (rc == CUDA_SUCCESS) MUST(cuMemFree_v2(d2));
    MUST(cuMemFree_v2(d));
    CHECK(info_free() == total, "all credited back");
}

/* Calls before cuInit: the driver's CUDA_ERROR_NOT_INITIALIZED, passed through. */
static void before_init(void) {
    CUdeviceptr d = 0;
    size_t f = 0, t = 0;
    CUresult rc = cuMemAlloc_v2(&d, MIB);
    printf("rc cuMemAlloc_v2(before cuInit) %d\n", rc);
    CHECK(rc == CUDA_ERROR_NOT_INITIALIZED, "cuMemAlloc_v2 before cuInit -> %d, expected 3", rc);
    rc = cuMemGetInfo_v2(&f, &t);
    printf("rc cuMemGetInfo_v2(before cuInit) %d\n", rc);
    CHECK(rc == CUDA_ERROR_NOT_INITIALIZED, "cuMemGetInfo_v2 before cuInit -> %d, expected 3", rc);
    rc = cuDeviceTotalMem_v2(&t, 0);
    printf("rc cuDeviceTotalMem_v2(before cuInit) %d\n", rc);
    CHECK(rc == CUDA_ERROR_NOT_INITIALIZED, "cuDeviceTotalMem_v2 before cuInit -> %d, expected 3", rc);
    rc = cuMemFree_v2((CUdeviceptr)0xdead0000ULL);
    printf("rc cuMemFree_v2(before cuInit) %d\n", rc);
    CHECK(rc != CUDA_SUCCESS, "cuMemFree_v2 before cuInit -> %d", rc);
}

/* A thread without a current context: the driver's error, nothing charged. */
static void *no_context_thread(void *arg) {
    CUresult *rcs = arg;
    CUdeviceptr d = 0;
    size_t f = 0, t = 0;
    rcs[0] = cuMemAlloc_v2(&d, MIB);
    rcs[1] = cuMemAllocAsync(&d, MIB, NULL);
    rcs[2] = cuMemGetInfo_v2(&f, &t);
    /* More than the cap: still the driver's error (no context), not a refusal. */
    rcs[3] = cuMemAlloc_v2(&d, g_cap + MIB);
    return NULL;
}

static void no_context(void) {
    size_t before = info_free();
    CUresult rcs[4] = {-1, -1, -1, -1};
    pthread_t th;
    pthread_create(&th, NULL, no_context_thread, rcs);
    pthread_join(th, NULL);
    const char *names[4] = {"cuMemAlloc_v2(no context)", "cuMemAllocAsync(no context)",
                            "cuMemGetInfo_v2(no context)", "cuMemAlloc_v2(no context, over the cap)"};
    for (int i = 0; i < 4; i++) {
        printf("rc %s %d\n", names[i], rcs[i]);
        CHECK(rcs[i] == CUDA_ERROR_INVALID_CONTEXT, "%s -> %d, expected 201", names[i], rcs[i]);
    }
    CHECK(info_free() == before, "nothing charged by the thread without a context");
}

/* NULL output pointers and bad devices in the queries the shim answers itself. */
static void bad_queries(void) {
    size_t f = 0, t = 0;
    /* NULL for either figure: the other is written, capped like both (CUDA 13.0 takes
     * NULL here). */
    MUST_NOOP("cuMemGetInfo_v2(NULL, &total)", cuMemGetInfo_v2(NULL, &t));
    CHECK(t == info_total(), "cuMemGetInfo_v2(NULL, &total): total %zu, as with both (%zu)", t,
          info_total());
    MUST_NOOP("cuMemGetInfo_v2(&free, NULL)", cuMemGetInfo_v2(&f, NULL));
    CHECK(f == info_free(), "cuMemGetInfo_v2(&free, NULL): free %zu, as with both (%zu)", f,
          info_free());
    MUST_NOOP("cuMemGetInfo_v2(NULL, NULL)", cuMemGetInfo_v2(NULL, NULL));
    MUST_FAIL("cuDeviceTotalMem_v2(NULL)", cuDeviceTotalMem_v2(NULL, 0));
    MUST_FAIL("cuDeviceTotalMem_v2(device 99)", cuDeviceTotalMem_v2(&t, 99));
    MUST_FAIL("cuDeviceTotalMem_v2(device -1)", cuDeviceTotalMem_v2(&t, -1));
}

/* cap > phys: what the fake refuses must not stay charged in the shim. */
static void rollback(void) {
    const size_t total = g_cap < g_phys ? g_cap : g_phys;
    const size_t big = g_phys + g_phys / 2; /* within the cap, past the fake's memory */
    size_t g = granularity(0);
    CUmemAllocationProp prop = device_prop(0);
    CUmemoryPool pool;
    MUST(cuDeviceGetDefaultMemPool(&pool, 0));
    CUdeviceptr d = 0;
    CUmemGenericAllocationHandle h = 0;
    size_t pitch = 0;

    CHECK(info_total() == total && info_free() == total, "start: free == total == %zu (got %zu/%zu)",
          total, info_free(), info_total());
    for (int round = 0; round < 3; round++) {
        MUST_FAIL("cuMemAlloc_v2(past the fake)", cuMemAlloc_v2(&d, big));
        MUST_FAIL("cuMemAllocPitch_v2(past the fake)",
                  cuMemAllocPitch_v2(&d, &pitch, MIB, big / MIB, 4));
        MUST_FAIL("cuMemAllocManaged(past the fake)", cuMemAllocManaged(&d, big, CU_MEM_ATTACH_GLOBAL));
        MUST_FAIL("cuMemAllocAsync(past the fake)", cuMemAllocAsync(&d, big, NULL));
        MUST_FAIL("cuMemAllocAsync_ptsz(past the fake)", cuMemAllocAsync_ptsz(&d, big, NULL));
        MUST_FAIL("cuMemAllocFromPoolAsync(past the fake)", cuMemAllocFromPoolAsync(&d, big, pool, NULL));
        MUST_FAIL("cuMemCreate(past the fake)", cuMemCreate(&h, (big + g - 1) / g * g, &prop, 0));
    }
    /* 21 failed attempts of 1.5x the memory each: had any stayed charged, nothing would fit now. */
    CHECK(info_free() == total, "after the refusals free == %zu (got %zu)", total, info_free());
    CUresult rc = cuMemAlloc_v2(&d, total / 4 * 3);
    CHECK(rc == CUDA_SUCCESS, "cuMemAlloc_v2(3/4 of the memory) after the refusals -> %d", rc);
    if (rc == CUDA_SUCCESS) {
        /* With part of the memory in use the fake refuses sooner; still no charge. */
        MUST_FAIL("cuMemAlloc_v2(past the rest)", cuMemAlloc_v2(&d, total / 2));
        MUST(cuMemFree_v2(d));
    }
    CHECK(info_free() == total, "end: free == %zu (got %zu)", total, info_free());
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s <misuse|rollback> <capped|uncapped> <cap> <phys>\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    g_capped = strcmp(argv[2], "capped") == 0;
    g_cap = parse_size(argv[3]);
    g_phys = parse_size(argv[4]);

    int is_misuse = strcmp(argv[1], "misuse") == 0;
    if (is_misuse) before_init();
    MUST(cuInit(0));
    CUdevice dev;
    CUcontext ctx;
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuCtxCreate_v2(&ctx, 0, dev));

    if (is_misuse) {
        no_context();
        bad_queries();
        misuse();
    } else if (strcmp(argv[1], "rollback") == 0) {
        rollback();
    } else {
        return 2;
    }
    return finish();
}
