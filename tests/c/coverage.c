/*
 * coverage: the cap applies to every way a program takes device memory (CUDA arrays,
 * memory pools, contexts, the CUDA 2.x entry points), and what is not device memory of
 * this process (pinned host memory, IPC and shareable-handle imports) is not counted.
 *
 *   coverage <mode> <capped|uncapped> <cap> <phys>
 *
 * Like intercept.c: "capped" expects the shim (GPUCAP_LIMIT=<cap>), "uncapped" is the
 * control run without it, seeing the fake's physical memory <phys>. Modes:
 *
 *   arrays      cuArrayCreate_v2, cuArray3DCreate_v2, cuMipmappedArrayCreate and their
 *               destroy calls; deferred-mapping arrays
 *   pools       default pool, cuMemPoolCreate pools, release threshold, trim on refusal,
 *               cuMemPoolTrimTo, cuMemPoolDestroy with an allocation outstanding
 *   contexts    (FAKECUDA_CONTEXT_MEM=<cap>/4) primary retain/release/reset, cuCtxCreate
 *               v1..v4, cuCtxDestroy v1/v2
 *   host        cuMemAllocHost_v2, cuMemHostAlloc, cuMemHostRegister_v2 past the cap
 *   legacy      the 32-bit CUDA 2.x variants (cuMemAlloc, ...), which the fake does not
 *               implement (CUDA_ERROR_NOT_SUPPORTED): refused before the driver when past
 *               the cap
 *   share       cuMemCreate with an exportable handle, cuMemExportToShareableHandle,
 *               cuMemImportFromShareableHandle in the same process
 *   ipc-export  allocates <cap>/2, exports it (cuIpcGetMemHandle, and a shareable VMM
 *               handle), prints "ipc <hex> pid=<pid> fd=<fd>", waits for a line on stdin
 *   ipc-import <hex> <pid> <fd>
 *               opens the exporter's memory (cuIpcOpenMemHandle_v2, and the shareable
 *               handle through /proc/<pid>/fd/<fd>) twice over, past its own cap
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fakecuda.h"

/* ---- declarations beyond fakecuda.h --------------------------------------- */

typedef struct CUevent_st *CUevent;

typedef struct {
    size_t Width, Height;
    int Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct {
    unsigned int Width, Height;
    int Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v1;

typedef struct {
    unsigned int Width, Height, Depth;
    int Format;
    unsigned int NumChannels, Flags;
} CUDA_ARRAY3D_DESCRIPTOR_v1;

typedef struct {
    size_t size, alignment;
    unsigned int reserved[4];
} CUDA_ARRAY_MEMORY_REQUIREMENTS;

#define CU_AD_FORMAT_UNSIGNED_INT8 0x01
#define CU_AD_FORMAT_FLOAT 0x20
#define CUDA_ARRAY3D_DEFERRED_MAPPING 0x80

#define CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT 5

typedef struct {
    char reserved[64];
} CUipcMemHandle;
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 1

CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d);
CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d);
CUresult cuArrayCreate(CUarray *a, const CUDA_ARRAY_DESCRIPTOR_v1 *d);
CUresult cuArray3DCreate(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d);
CUresult cuArrayDestroy(CUarray a);
CUresult cuArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *r, CUarray a, CUdevice d);
CUresult cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                unsigned int levels);
CUresult cuMipmappedArrayDestroy(CUmipmappedArray m);
CUresult cuMipmappedArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *r,
                                               CUmipmappedArray m, CUdevice d);

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props);
CUresult cuMemPoolDestroy(CUmemoryPool pool);
CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value);
CUresult cuCtxSynchronize(void);
CUresult cuEventCreate(CUevent *e, unsigned int flags);
CUresult cuEventRecord(CUevent e, CUstream s);
CUresult cuEventSynchronize(CUevent e);

CUresult cuCtxCreate(CUcontext *ctx, unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v3(CUcontext *ctx, void *params, int n, unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v4(CUcontext *ctx, void *params, unsigned int flags, CUdevice dev);
CUresult cuCtxDestroy(CUcontext ctx);
CUresult cuCtxPopCurrent_v2(CUcontext *ctx);
CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
CUresult cuDevicePrimaryCtxReset(CUdevice dev);

CUresult cuMemAllocHost_v2(void **p, size_t bytes);
CUresult cuMemHostAlloc(void **p, size_t bytes, unsigned int flags);
CUresult cuMemFreeHost(void *p);
CUresult cuMemHostRegister_v2(void *p, size_t bytes, unsigned int flags);
CUresult cuMemHostUnregister(void *p);

CUresult cuMemAlloc(unsigned int *dptr, unsigned int bytes);
CUresult cuMemAllocPitch(unsigned int *dptr, unsigned int *pitch, unsigned int w, unsigned int h,
                         unsigned int elem);
CUresult cuMemFree(unsigned int dptr);
CUresult cuMemGetInfo(unsigned int *free, unsigned int *total);
CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev);

CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle h, int type,
                                      unsigned long long flags);
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *shareable, int type);
CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr p);
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle handle, unsigned int flags);
CUresult cuIpcCloseMemHandle(CUdeviceptr p);

/* ---- helpers --------------------------------------------------------------- */

static int g_capped;
static size_t g_cap, g_phys;

static size_t total_seen(void) { return g_capped ? g_cap : g_phys; }

static size_t free_now(void) {
    size_t f = 0, t = 0;
    MUST(cuMemGetInfo_v2(&f, &t));
    return f;
}

/* cuMemGetInfo_v2's free is `want` (as a distance below the total seen). */
#define FREE_IS(used, ...)                                                                  \
    do {                                                                                    \
        size_t f_ = free_now(), w_ = total_seen() - (used);                                 \
        char what_[200];                                                                    \
        snprintf(what_, sizeof what_, __VA_ARGS__);                                         \
        CHECK(f_ == w_, "%s: free %zu, expected %zu (total %zu - %zu in use)", what_, f_, w_, \
              total_seen(), (size_t)(used));                                                \
    } while (0)

/* Past the cap: refused (OUT_OF_MEMORY) with the shim, succeeds without it. */
#define PAST_CAP(what, rc, undo)                                                            \
    do {                                                                                    \
        CUresult r_ = (rc);                                                                 \
        if (g_capped) {                                                                     \
            CHECK(r_ == CUDA_ERROR_OUT_OF_MEMORY, "%s past the cap -> %d, expected 2", what, r_); \
        } else {                                                                            \
            CHECK(r_ == CUDA_SUCCESS, "%s past the cap, without the shim -> %d", what, r_); \
        }                                                                                   \
        if (r_ == CUDA_SUCCESS) { undo; }                                                   \
    } while (0)

static void setup_context(void) {
    MUST(cuInit(0));
    CUcontext ctx;
    MUST(cuDevicePrimaryCtxRetain(&ctx, 0));
    MUST(cuCtxSetCurrent(ctx));
}

/* ---- arrays ---------------------------------------------------------------- */

static size_t array_size(CUarray a) {
    CUDA_ARRAY_MEMORY_REQUIREMENTS r;
    memset(&r, 0, sizeof r);
    MUST(cuArrayGetMemoryRequirements(&r, a, 0));
    return r.size;
}

static void arrays(void) {
    setup_context();
    FREE_IS(0, "start");

    /* 1000 x 1000 bytes: the driver pads it (the fake to 512 bytes). */
    CUarray a2, a3;
    CUDA_ARRAY_DESCRIPTOR d2 = {1000, 1000, CU_AD_FORMAT_UNSIGNED_INT8, 1};
    MUST(cuArrayCreate_v2(&a2, &d2));
    size_t s2 = array_size(a2);
    CHECK(s2 >= 1000 * 1000, "cuArrayGetMemoryRequirements(1000x1000 uchar) = %zu", s2);
    FREE_IS(s2, "after cuArrayCreate_v2: charged the driver's size %zu (estimate 1000000)", s2);

    CUDA_ARRAY3D_DESCRIPTOR d3 = {64, 64, 64, CU_AD_FORMAT_FLOAT, 4, 0};
    MUST(cuArray3DCreate_v2(&a3, &d3));
    size_t s3 = array_size(a3);
    FREE_IS(s2 + s3, "after cuArray3DCreate_v2 (64^3 float4, %zu)", s3);

    CUmipmappedArray m;
    CUDA_ARRAY3D_DESCRIPTOR dm = {1024, 1024, 0, CU_AD_FORMAT_UNSIGNED_INT8, 4, 0};
    MUST(cuMipmappedArrayCreate(&m, &dm, 11));
    CUDA_ARRAY_MEMORY_REQUIREMENTS rm;
    memset(&rm, 0, sizeof rm);
    MUST(cuMipmappedArrayGetMemoryRequirements(&rm, m, 0));
    CHECK(rm.size >= 4 * (1024 * 1024 * 4 / 3), "mipmapped 1024^2 uchar4 x 11 levels = %zu", rm.size);
    FREE_IS(s2 + s3 + rm.size, "after cuMipmappedArrayCreate");

    /* Past the cap, by the estimate: refused before the driver. */
    CUarray big;
    CUDA_ARRAY_DESCRIPTOR db = {g_cap, 1, CU_AD_FORMAT_UNSIGNED_INT8, 1};
    PAST_CAP("cuArrayCreate_v2", cuArrayCreate_v2(&big, &db), cuArrayDestroy(big));
    CUDA_ARRAY3D_DESCRIPTOR db3 = {g_cap / 16, 1, 1, CU_AD_FORMAT_FLOAT, 4, 0};
    db3.Width += 1;
    PAST_CAP("cuArray3DCreate_v2", cuArray3DCreate_v2(&big, &db3), cuArrayDestroy(big));
    CUmipmappedArray bigm;
    CUDA_ARRAY3D_DESCRIPTOR dbm = {g_cap / 4, 0, 0, CU_AD_FORMAT_FLOAT, 1, 0};
    PAST_CAP("cuMipmappedArrayCreate", cuMipmappedArrayCreate(&bigm, &dbm, 2),
             cuMipmappedArrayDestroy(bigm));
    FREE_IS(s2 + s3 + rm.size, "after the refusals");

    /* The estimate fits, the driver's padded size does not: destroyed and refused. */
    size_t used = s2 + s3 + rm.size;
    CUdeviceptr odd;
    /* Leaves a headroom that is not a multiple of 512: managed memory is charged the bytes
       asked for (a cuMemAlloc of 1000 bytes is charged a whole 512-byte block, 1024). */
    MUST(cuMemAllocManaged(&odd, 1000, CU_MEM_ATTACH_GLOBAL));
    used += 1000;
    size_t headroom = g_cap - used;
    CUDA_ARRAY_DESCRIPTOR dp = {headroom, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1};
    CUresult rc = cuArrayCreate_v2(&big, &dp);
    if (g_capped) {
        CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY,
              "cuArrayCreate_v2(%zu bytes = the headroom; padded past it) -> %d, expected 2", headroom,
              rc);
    } else {
        CHECK(rc == CUDA_SUCCESS, "cuArrayCreate_v2(%zu), without the shim -> %d", headroom, rc);
    }
    if (rc == CUDA_SUCCESS) cuArrayDestroy(big);
    FREE_IS(used, "after the padded array was refused");

    /* Deferred mapping: no memory until mapped (from cuMemCreate handles). */
    CUarray deferred;
    CUDA_ARRAY3D_DESCRIPTOR dd = {g_cap, 1, 0, CU_AD_FORMAT_FLOAT, 4, CUDA_ARRAY3D_DEFERRED_MAPPING};
    rc = cuArray3DCreate_v2(&deferred, &dd);
    CHECK(rc == CUDA_SUCCESS, "cuArray3DCreate_v2(4 x cap, DEFERRED_MAPPING) -> %d (not charged)", rc);
    FREE_IS(used, "after a deferred-mapping array");
    if (rc == CUDA_SUCCESS) MUST(cuArrayDestroy(deferred));

    MUST(cuMemFree_v2(odd));
    MUST(cuArrayDestroy(a2));
    FREE_IS(s3 + rm.size, "after cuArrayDestroy (2D)");
    MUST(cuArrayDestroy(a3));
    FREE_IS(rm.size, "after cuArrayDestroy (3D)");
    MUST(cuMipmappedArrayDestroy(m));
    FREE_IS(0, "after cuMipmappedArrayDestroy");
    CHECK(cuArrayDestroy(a2) != CUDA_SUCCESS, "a second cuArrayDestroy is the driver's error");
    FREE_IS(0, "after the double destroy");

    /* The whole cap in one array works; one byte more does not. */
    CUDA_ARRAY_DESCRIPTOR whole = {g_cap / 4, 0, CU_AD_FORMAT_FLOAT, 1};
    MUST(cuArrayCreate_v2(&big, &whole));
    FREE_IS(g_cap, "an array of exactly the cap");
    MUST(cuArrayDestroy(big));
}

/* ---- pools ----------------------------------------------------------------- */

static size_t reserved(CUmemoryPool pool) {
    cuuint64_t v = 0;
    MUST(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v));
    return (size_t)v;
}

static void pools(void) {
    setup_context();
    CUmemoryPool def;
    MUST(cuDeviceGetDefaultMemPool(&def, 0));
    size_t q = g_cap / 4;
    CUdeviceptr p, p2;

    /* The default pool keeps freed memory until a synchronisation. */
    MUST(cuMemAllocAsync(&p, q, NULL));
    FREE_IS(q, "after cuMemAllocAsync(cap/4)");
    MUST(cuMemFreeAsync(p, NULL));
    FREE_IS(q, "after cuMemFreeAsync: the pool still reserves it");
    MUST(cuStreamSynchronize(NULL));
    FREE_IS(0, "after cuStreamSynchronize: released (threshold 0)");
    MUST(cuMemAllocAsync(&p, q, NULL));
    MUST(cuMemFreeAsync(p, NULL));
    MUST(cuCtxSynchronize());
    FREE_IS(0, "after cuCtxSynchronize");
    CUevent ev;
    MUST(cuEventCreate(&ev, 0));
    MUST(cuMemAllocAsync(&p, q, NULL));
    MUST(cuMemFreeAsync(p, NULL));
    MUST(cuEventRecord(ev, NULL));
    MUST(cuEventSynchronize(ev));
    FREE_IS(0, "after cuEventSynchronize");

    /* A pool that caches everything: the cache counts until trimmed. */
    cuuint64_t keep_all = ~(cuuint64_t)0;
    MUST(cuMemPoolSetAttribute(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all));
    MUST(cuMemAllocAsync(&p, 3 * q, NULL));
    MUST(cuMemFreeAsync(p, NULL));
    MUST(cuStreamSynchronize(NULL));
    FREE_IS(3 * q, "a pool caching 3/4 of the cap (release threshold max)");
    CUresult rc;
    /* Not a refusal: near the cap the shim trims the cache, then reserves the request
     * (the driver may serve it from the cache, but a concurrent allocation may take the
     * cache first, so the shim cannot count on it). */
    rc = cuMemAllocAsync(&p, 2 * q, NULL);
    CHECK(rc == CUDA_SUCCESS, "cuMemAllocAsync(cap/2) with 3/4 of the cap cached -> %d", rc);
    FREE_IS(g_capped ? 2 * q : 3 * q, "after cuMemAllocAsync(cap/2) (with the shim: the cache was trimmed)");
    MUST(cuMemFreeAsync(p, NULL));
    MUST(cuStreamSynchronize(NULL));
    /* A plain allocation that fits only if the cache goes: the shim trims the pool. */
    rc = cuMemAlloc_v2(&p2, 3 * q);
    CHECK(rc == CUDA_SUCCESS, "cuMemAlloc_v2(3/4 cap) with 3/4 cached in the pool -> %d", rc);
    if (g_capped) {
        CHECK(reserved(def) == 0, "the shim trimmed the pool first (reserved %zu)", reserved(def));
    }
    FREE_IS(g_capped ? 3 * q : 6 * q, "after the trim and the allocation (without the shim: no trim)");
    if (rc == CUDA_SUCCESS) MUST(cuMemFree_v2(p2));
    FREE_IS(g_capped ? 0 : reserved(def), "after cuMemFree_v2");
    MUST(cuMemPoolTrimTo(def, 0));
    FREE_IS(0, "after cuMemPoolTrimTo(default, 0)");

    /* Past the cap. */
    PAST_CAP("cuMemAllocAsync", cuMemAllocAsync(&p, g_cap + 1, NULL),
             (cuMemFreeAsync(p, NULL), cuMemPoolTrimTo(def, 0)));
    FREE_IS(0, "after the refused cuMemAllocAsync");

    /* A pool of our own. */
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 0;
    CUmemoryPool pool;
    MUST(cuMemPoolCreate(&pool, &props));
    MUST(cuMemAllocFromPoolAsync(&p, q, pool, NULL));
    FREE_IS(q, "after cuMemAllocFromPoolAsync(created pool, cap/4)");
    MUST(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all));
    MUST(cuMemFreeAsync(p, NULL));
    MUST(cuStreamSynchronize(NULL));
    FREE_IS(q, "created pool caching cap/4");
    MUST(cuMemPoolTrimTo(pool, 0));
    FREE_IS(0, "after cuMemPoolTrimTo(created pool, 0)");
    PAST_CAP("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync(&p, g_cap + 1, pool, NULL),
             (cuMemFreeAsync(p, NULL), cuMemPoolTrimTo(pool, 0)));

    /* Destroyed with an allocation outstanding: the cache goes, the allocation stays
     * charged until freed. */
    MUST(cuMemAllocFromPoolAsync(&p, q, pool, NULL));
    MUST(cuMemAllocFromPoolAsync(&p2, q, pool, NULL));
    MUST(cuMemFreeAsync(p2, NULL));
    MUST(cuStreamSynchronize(NULL));
    FREE_IS(2 * q, "created pool: cap/4 used, cap/4 cached");
    MUST(cuMemPoolDestroy(pool));
    FREE_IS(q, "after cuMemPoolDestroy with cap/4 outstanding");
    MUST(cuMemFreeAsync(p, NULL));
    MUST(cuStreamSynchronize(NULL));
    FREE_IS(0, "after freeing the destroyed pool's last allocation");

    /* An empty pool destroyed. */
    MUST(cuMemPoolCreate(&pool, &props));
    MUST(cuMemAllocFromPoolAsync(&p, q, pool, NULL));
    MUST(cuMemFreeAsync(p, NULL));
    MUST(cuMemPoolDestroy(pool));
    FREE_IS(0, "after cuMemPoolDestroy of a pool that only cached");
}

/* ---- contexts -------------------------------------------------------------- */

static void contexts(void) {
    size_t c = g_cap / 4; /* FAKECUDA_CONTEXT_MEM */
    MUST(cuInit(0));
    CUcontext prim, again, c2, c3, c4, c1, extra;
    MUST(cuDevicePrimaryCtxRetain(&prim, 0));
    MUST(cuCtxSetCurrent(prim));
    FREE_IS(c, "the primary context takes FAKECUDA_CONTEXT_MEM");
    MUST(cuDevicePrimaryCtxRetain(&again, 0));
    FREE_IS(c, "retained twice: one context");

    MUST(cuCtxCreate_v2(&c2, 0, 0));
    FREE_IS(2 * c, "after cuCtxCreate_v2");
    MUST(cuCtxCreate_v3(&c3, NULL, 0, 0, 0));
    FREE_IS(3 * c, "after cuCtxCreate_v3");
    MUST(cuCtxCreate_v4(&c4, NULL, 0, 0));
    FREE_IS(4 * c, "after cuCtxCreate_v4: the cap is full of contexts");
    /* An allocation no longer fits; nor does a fifth context. */
    CUdeviceptr p;
    PAST_CAP("cuMemAlloc_v2(1 MiB) with the cap full of contexts", cuMemAlloc_v2(&p, MIB),
             cuMemFree_v2(p));
    PAST_CAP("cuCtxCreate_v2 (a fifth context)", cuCtxCreate_v2(&extra, 0, 0), cuCtxDestroy_v2(extra));
    MUST(cuCtxDestroy_v2(c4));
    FREE_IS(3 * c, "after cuCtxDestroy_v2");
    MUST(cuCtxDestroy_v2(c3));
    MUST(cuCtxCreate(&c1, 0, 0));
    FREE_IS(3 * c, "after cuCtxCreate (v1)");
    /* A context's allocations go with it. */
    MUST(cuMemAlloc_v2(&p, c / 2));
    FREE_IS(3 * c + c / 2, "an allocation in the v1 context");
    MUST(cuCtxDestroy(c1));
    FREE_IS(2 * c, "after cuCtxDestroy (v1): its allocation went with it");

    /* The primary context goes at the last release. */
    MUST(cuCtxSetCurrent(c2));
    MUST(cuDevicePrimaryCtxRelease_v2(0));
    FREE_IS(2 * c, "after one of two releases");
    MUST(cuDevicePrimaryCtxRelease(0));
    FREE_IS(c, "after the last release (v1 entry point)");
    MUST(cuDevicePrimaryCtxRetain(&prim, 0));
    FREE_IS(2 * c, "primary retained again");
    MUST(cuCtxSetCurrent(prim));
    MUST(cuMemAlloc_v2(&p, c / 2));
    MUST(cuCtxSetCurrent(c2));
    MUST(cuDevicePrimaryCtxReset_v2(0));
    FREE_IS(c, "after cuDevicePrimaryCtxReset_v2 (its allocation went too)");
    MUST(cuDevicePrimaryCtxRetain(&prim, 0));
    MUST(cuDevicePrimaryCtxReset(0));
    FREE_IS(c, "after cuDevicePrimaryCtxReset (v1)");
    MUST(cuCtxDestroy_v2(c2));
    MUST(cuCtxCreate_v2(&c2, 0, 0));
    FREE_IS(c, "one context left");
    MUST(cuCtxDestroy_v2(c2));
}

/* ---- not counted ------------------------------------------------------------ */

static void host(void) {
    setup_context();
    size_t big = g_cap * 2;
    void *h1 = NULL, *h2 = NULL;
    CUresult rc = cuMemAllocHost_v2(&h1, big);
    CHECK(rc == CUDA_SUCCESS, "cuMemAllocHost_v2(2 x cap) -> %d: host memory, not counted", rc);
    rc = cuMemHostAlloc(&h2, big, 0);
    CHECK(rc == CUDA_SUCCESS, "cuMemHostAlloc(2 x cap) -> %d", rc);
    void *buf = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    rc = cuMemHostRegister_v2(buf, big, 0);
    CHECK(rc == CUDA_SUCCESS, "cuMemHostRegister_v2(2 x cap) -> %d", rc);
    FREE_IS(0, "pinned host memory takes none of the cap");
    CUdeviceptr p;
    rc = cuMemAlloc_v2(&p, g_cap);
    CHECK(rc == CUDA_SUCCESS, "cuMemAlloc_v2(the whole cap) beside it -> %d", rc);
    if (rc == CUDA_SUCCESS) MUST(cuMemFree_v2(p));
    if (h1) MUST(cuMemFreeHost(h1));
    if (h2) MUST(cuMemFreeHost(h2));
    MUST(cuMemHostUnregister(buf));
    munmap(buf, big);
    FREE_IS(0, "end");
}

static void legacy(void) {
    setup_context();
    unsigned int p = 0, pitch = 0, f = 0, t = 0;
    unsigned int over = (unsigned int)(g_cap + MIB);
    /* The fake does not implement these (NOT_SUPPORTED); the shim refuses past the cap
     * before asking it. */
    CUresult want = g_capped ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_NOT_SUPPORTED;
    CUresult rc = cuMemAlloc(&p, over);
    CHECK(rc == want, "cuMemAlloc (v1) past the cap -> %d, expected %d", rc, want);
    rc = cuMemAllocPitch(&p, &pitch, over, 1, 4);
    CHECK(rc == want, "cuMemAllocPitch (v1) past the cap -> %d, expected %d", rc, want);
    CUarray a;
    CUDA_ARRAY_DESCRIPTOR_v1 d = {over, 1, CU_AD_FORMAT_UNSIGNED_INT8, 1};
    rc = cuArrayCreate(&a, &d);
    CHECK(rc == want, "cuArrayCreate (v1) past the cap -> %d, expected %d", rc, want);
    CUDA_ARRAY3D_DESCRIPTOR_v1 d3 = {over, 1, 1, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0};
    rc = cuArray3DCreate(&a, &d3);
    CHECK(rc == want, "cuArray3DCreate (v1) past the cap -> %d, expected %d", rc, want);
    /* Within the cap: the driver's own answer, nothing charged. */
    rc = cuMemAlloc(&p, MIB);
    CHECK(rc == CUDA_ERROR_NOT_SUPPORTED, "cuMemAlloc (v1, 1 MiB) -> %d: the driver's answer", rc);
    CHECK(cuMemFree(p) == CUDA_ERROR_NOT_SUPPORTED, "cuMemFree (v1): the driver's answer");
    CHECK(cuMemGetInfo(&f, &t) == CUDA_ERROR_NOT_SUPPORTED, "cuMemGetInfo (v1): the driver's answer");
    CHECK(cuDeviceTotalMem(&t, 0) == CUDA_ERROR_NOT_SUPPORTED, "cuDeviceTotalMem (v1): the driver's answer");
    FREE_IS(0, "nothing charged");
}

static void share(void) {
    setup_context();
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    size_t size = g_cap / 2;
    CUmemGenericAllocationHandle h, imported[3];
    MUST(cuMemCreate(&h, size, &prop, 0));
    FREE_IS(size, "an exportable cuMemCreate handle of cap/2");
    int fd = -1;
    MUST(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    for (int i = 0; i < 3; i++) {
        CUresult rc = cuMemImportFromShareableHandle(&imported[i], (void *)(uintptr_t)fd,
                                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        CHECK(rc == CUDA_SUCCESS, "cuMemImportFromShareableHandle #%d -> %d", i + 1, rc);
    }
    FREE_IS(size, "three imports (3/2 of the cap) are not counted again");
    for (int i = 0; i < 3; i++) MUST(cuMemRelease(imported[i]));
    FREE_IS(size, "releasing the imports credits nothing");
    MUST(cuMemRelease(h));
    close(fd);
    FREE_IS(0, "after releasing the exporter's handle");
}

static void hex_out(const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) printf("%02x", b[i]);
}

static void ipc_export(void) {
    setup_context();
    CUdeviceptr p;
    MUST(cuMemAlloc_v2(&p, g_cap / 2));
    CUipcMemHandle ih;
    MUST(cuIpcGetMemHandle(&ih, p));
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUmemGenericAllocationHandle h;
    MUST(cuMemCreate(&h, g_cap / 4, &prop, 0));
    int fd = -1;
    MUST(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    FREE_IS(g_cap / 2 + g_cap / 4, "the exporter is charged");
    printf("ipc ");
    hex_out(&ih, sizeof ih);
    printf(" pid=%d fd=%d\n", (int)getpid(), fd);
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) { /* EOF: the importer is done */
    }
    MUST(cuMemFree_v2(p));
    MUST(cuMemRelease(h));
    FREE_IS(0, "exporter end");
}

static void ipc_import(const char *hex, int pid, int fd) {
    setup_context();
    CUipcMemHandle ih;
    for (size_t i = 0; i < sizeof ih; i++) sscanf(hex + 2 * i, "%2hhx", (unsigned char *)&ih.reserved[i]);
    CUdeviceptr p;
    CUresult rc = cuIpcOpenMemHandle_v2(&p, ih, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    CHECK(rc == CUDA_SUCCESS, "cuIpcOpenMemHandle_v2 -> %d: the exporter's memory, not counted here", rc);
    FREE_IS(0, "after opening the IPC handle");
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, fd);
    int myfd = open(path, O_RDWR);
    CHECK(myfd >= 0, "open(%s)", path);
    CUmemGenericAllocationHandle h[6];
    for (int i = 0; i < 6; i++) {
        rc = cuMemImportFromShareableHandle(&h[i], (void *)(uintptr_t)myfd,
                                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        CHECK(rc == CUDA_SUCCESS, "cuMemImportFromShareableHandle #%d of another process's handle -> %d",
              i + 1, rc);
    }
    FREE_IS(0, "six imports of cap/4 (3/2 of the cap) are the exporter's");
    CUdeviceptr mine;
    rc = cuMemAlloc_v2(&mine, g_cap);
    CHECK(rc == CUDA_SUCCESS, "the importer can still allocate its whole cap -> %d", rc);
    if (rc == CUDA_SUCCESS) MUST(cuMemFree_v2(mine));
    for (int i = 0; i < 6; i++) MUST(cuMemRelease(h[i]));
    if (p) MUST(cuIpcCloseMemHandle(p));
    FREE_IS(0, "importer end");
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s <mode> <capped|uncapped> <cap> <phys> [args]\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = argv[1];
    g_capped = strcmp(argv[2], "capped") == 0;
    g_cap = parse_size(argv[3]);
    g_phys = parse_size(argv[4]);
    if (strcmp(mode, "arrays") == 0) arrays();
    else if (strcmp(mode, "pools") == 0) pools();
    else if (strcmp(mode, "contexts") == 0) contexts();
    else if (strcmp(mode, "host") == 0) host();
    else if (strcmp(mode, "legacy") == 0) legacy();
    else if (strcmp(mode, "share") == 0) share();
    else if (strcmp(mode, "ipc-export") == 0) ipc_export();
    else if (strcmp(mode, "ipc-import") == 0 && argc == 8) ipc_import(argv[5], atoi(argv[6]), atoi(argv[7]));
    else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    return finish();
}
