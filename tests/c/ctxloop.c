/*
 * ctxloop: every way a context ends, in a loop, with memory still live in it. The
 * driver frees a context's memory with the context (its own overhead, allocations,
 * arrays); the cap must get all of it back, or a program that makes and ends contexts
 * in a loop loses its cap round by round. Stream-ordered pool allocations are not the
 * context's (cuCtxDestroy in cuda.h: "not associated with any CUDA context"): they
 * outlive it, still charged, until the program frees them.
 *
 *   ctxloop loop <how> <rounds> <block> <cap|-> <phys>
 *       <how>: destroy, destroy_v1 (cuCtxDestroy_v2 / cuCtxDestroy of a created
 *       context), detach (cuCtxDetach, its only reference), attach (cuCtxAttach, then
 *       cuCtxDetach: the context stays alive, its block usable and still charged; then
 *       cuCtxDetach again, or cuCtxDestroy_v2 in odd rounds), release, release_v1 (cuDevicePrimaryCtxRelease_v2 / _v1 of
 *       the primary context retained twice: the first release leaves it alive), reset,
 *       reset_v1 (cuDevicePrimaryCtxReset_v2 / _v1), detach_primary (cuCtxDetach of the
 *       primary context retained once, which the fake, like pycuda's use of it, takes
 *       as its release).
 *       Each round leaves live: cuMemAlloc_v2 of <block>, cuMemAllocAsync of <block>/4
 *       and a 1 MiB cuArrayCreate_v2. After the context ended, cuMemGetInfo_v2 (asked
 *       with a context of the device that stays, an "observer") must show the free
 *       memory of the start minus what the pool holds for the allocation (a chunk),
 *       which is still valid; then the
 *       observer frees it (cuMemFreeAsync, cuStreamSynchronize: the pool releases it)
 *       and the free memory of the start is back.
 *       <cap>: the total cuMemGetInfo_v2 must show (the cap), "-" for <phys>.
 *
 *   ctxloop roomforone <create|retain> <refused|allowed>
 *       the first context of the device (cuCtxCreate_v2 or cuDevicePrimaryCtxRetain)
 *       when the device has room for exactly one context: refused with
 *       CUDA_ERROR_OUT_OF_MEMORY, or allowed.
 *
 *   ctxloop first <create|retain> <devices> <block>
 *       first use: cuInit, then on each of the first <devices> devices its first context
 *       (cuCtxCreate_v2, or cuDevicePrimaryCtxRetain and cuCtxSetCurrent), the free memory
 *       it sees printed as "first dev=D free=F total=T" (cuMemGetInfo_v2), and a
 *       cuMemAlloc_v2 of <block> freed again; then every context ends.
 */
#define _GNU_SOURCE
#include "fakecuda.h"

typedef struct {
    size_t Width, Height;
    int Format; /* CUarray_format */
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;
#define CU_AD_FORMAT_UNSIGNED_INT8 0x01

CUresult cuCtxCreate(CUcontext *ctx, unsigned int flags, CUdevice dev);
CUresult cuCtxDestroy(CUcontext ctx);
CUresult cuCtxAttach(CUcontext *ctx, unsigned int flags);
CUresult cuCtxDetach(CUcontext ctx);
CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
CUresult cuDevicePrimaryCtxReset(CUdevice dev);
CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *desc);
CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr dptr);

static size_t g_start;

static size_t free_now(CUcontext with, size_t *total) {
    size_t f = 0, t = 0;
    MUST(cuCtxSetCurrent(with));
    MUST(cuMemGetInfo_v2(&f, &t));
    if (total) *total = t;
    return f;
}

/* Writes and reads back a few bytes at both ends of a block. */
static int usable(CUdeviceptr p, size_t size) {
    unsigned char out[256], back[256];
    for (int i = 0; i < 256; i++) out[i] = (unsigned char)(i * 7 + 3);
    for (int end = 0; end < 2; end++) {
        CUdeviceptr at = end ? p + size - sizeof out : p;
        memset(back, 0, sizeof back);
        if (cuMemcpyHtoD_v2(at, out, sizeof out) || cuMemcpyDtoH_v2(back, at, sizeof back) ||
            memcmp(out, back, sizeof out) != 0)
            return 0;
    }
    return 1;
}

/* The memory a round leaves live in the current context; the pool allocation in *pool. */
static CUdeviceptr leave_live(int round, size_t block, CUdeviceptr *pool) {
    CUdeviceptr p = 0, q = 0;
    CUarray a = NULL;
    CUDA_ARRAY_DESCRIPTOR d = {1024, 1024, CU_AD_FORMAT_UNSIGNED_INT8, 1};
    CUresult r1 = cuMemAlloc_v2(&p, block);
    CUresult r2 = cuMemAllocAsync(&q, block / 4, NULL);
    CUresult r3 = cuArrayCreate_v2(&a, &d);
    if (r1 || r2 || r3 || round % 25 == 0)
        CHECK(!r1 && !r2 && !r3,
              "round %d: cuMemAlloc_v2 -> %d, cuMemAllocAsync -> %d, cuArrayCreate_v2 -> %d", round, r1,
              r2, r3);
    if (!r2) MUST(cuStreamSynchronize(NULL));
    *pool = r2 ? 0 : q;
    return r1 ? 0 : p;
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value);

/* What device 0's default pool holds reserved (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT): a
 * pool grows by chunks (32 MiB on the real driver), so this is what a live pool
 * allocation keeps from the device, at least its own size. */
static size_t pool_reserved(void) {
    CUmemoryPool pool = NULL;
    unsigned long long v = 0;
    MUST(cuDeviceGetDefaultMemPool(&pool, 0));
    MUST(cuMemPoolGetAttribute(pool, 5, &v));
    return (size_t)v;
}

/* After the context ended: only the pool allocation `q` of `qsize` bytes is still
 * held, and valid, in what its pool reserves; the observer frees it and the free memory
 * of the start is back. */
static void round_trip_free(CUcontext observer, int round, const char *how, CUdeviceptr q,
                            size_t qsize) {
    size_t f = free_now(observer, NULL);
    size_t held = q ? pool_reserved() : 0;
    CHECK(held >= qsize, "round %d (%s): the pool reserves %zu for an allocation of %zu", round, how,
          held, qsize);
    size_t want = g_start - held;
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult rq = q ? cuMemGetAddressRange_v2(&base, &size, q) : CUDA_ERROR_INVALID_VALUE;
    /* Every round is checked; only failures and every 25th round are printed. */
    if (f != want || rq || base != q || size != qsize || round % 25 == 0)
        CHECK(f == want && !rq && base == q && size == qsize,
              "round %d (%s): free %zu after the context ended, %zu at the start less the "
              "pool allocation still live (cuMemGetAddressRange_v2 -> %d, size %zu)",
              round, how, f, want, rq, size);
    if (q) {
        MUST(cuMemFreeAsync(q, NULL));
        MUST(cuStreamSynchronize(NULL));
    }
    f = free_now(observer, NULL);
    if (f != g_start || round % 25 == 0)
        CHECK(f == g_start, "round %d (%s): free %zu once the pool allocation was freed, %zu at the start",
              round, how, f, g_start);
}

static void loop(const char *how, int rounds, size_t block, const char *cap, size_t phys) {
    int primary = strncmp(how, "release", 7) == 0 || strncmp(how, "reset", 5) == 0 ||
                  strcmp(how, "detach_primary") == 0;
    MUST(cuInit(0));
    CUcontext observer, c, again;
    if (primary) {
        MUST(cuCtxCreate_v2(&observer, 0, 0));
    } else {
        MUST(cuDevicePrimaryCtxRetain(&observer, 0));
    }
    size_t total = 0;
    g_start = free_now(observer, &total);
    size_t want_total = strcmp(cap, "-") == 0 ? phys : parse_size(cap);
    CHECK(total == want_total, "cuMemGetInfo_v2 total %zu, expected %zu", total, want_total);
    printf("start free=%zu total=%zu\n", g_start, total);

    for (int r = 0; r < rounds; r++) {
        if (primary) {
            MUST(cuDevicePrimaryCtxRetain(&c, 0));
            MUST(cuCtxSetCurrent(c));
        } else {
            MUST(cuCtxCreate_v2(&c, 0, 0)); /* current now */
        }
        CUdeviceptr q = 0;
        CUdeviceptr p = leave_live(r, block, &q);
        if (strcmp(how, "destroy") == 0) {
            MUST(cuCtxDestroy_v2(c));
        } else if (strcmp(how, "destroy_v1") == 0) {
            MUST(cuCtxDestroy(c));
        } else if (strcmp(how, "detach") == 0 || strcmp(how, "detach_primary") == 0) {
            MUST(cuCtxDetach(c));
        } else if (strcmp(how, "attach") == 0) {
            MUST(cuCtxAttach(&again, 0));
            CHECK(again == c, "round %d: cuCtxAttach returns the current context", r);
            size_t before = free_now(c, NULL);
            MUST(cuCtxSetCurrent(c));
            MUST(cuCtxDetach(c)); /* one usage count left: the context lives on */
            MUST(cuCtxSetCurrent(c));
            size_t after = free_now(c, NULL);
            if (r % 25 == 0 || after != before || !p || !usable(p, block))
                CHECK(after == before && p && usable(p, block),
                      "round %d: after the first cuCtxDetach the block is usable and still "
                      "charged (free %zu, %zu before)",
                      r, after, before);
            MUST(cuCtxSetCurrent(c));
            /* The last usage count; every other round cuCtxDestroy_v2 ends it instead,
             * as it ends a context whatever its count. */
            MUST(r % 2 ? cuCtxDestroy_v2(again) : cuCtxDetach(again));
        } else if (strncmp(how, "release", 7) == 0) {
            MUST(cuDevicePrimaryCtxRetain(&again, 0));
            size_t before = free_now(c, NULL);
            MUST(how[7] ? cuDevicePrimaryCtxRelease(0) : cuDevicePrimaryCtxRelease_v2(0));
            size_t after = free_now(c, NULL);
            if (r % 25 == 0 || after != before || !p || !usable(p, block))
                CHECK(after == before && p && usable(p, block),
                      "round %d: after the first release of two the block is usable and still "
                      "charged (free %zu, %zu before)",
                      r, after, before);
            MUST(how[7] ? cuDevicePrimaryCtxRelease(0) : cuDevicePrimaryCtxRelease_v2(0));
        } else if (strncmp(how, "reset", 5) == 0) {
            MUST(how[5] ? cuDevicePrimaryCtxReset(0) : cuDevicePrimaryCtxReset_v2(0));
        } else {
            fprintf(stderr, "unknown way to end a context: %s\n", how);
            exit(2);
        }
        round_trip_free(observer, r, how, q, block / 4);
    }
    if (primary) {
        MUST(cuCtxDestroy_v2(observer));
    } else {
        MUST(cuDevicePrimaryCtxRelease_v2(0));
    }
}

static void room_for_one(const char *call, int refused) {
    MUST(cuInit(0));
    CUcontext c = NULL;
    int create = strcmp(call, "create") == 0;
    CUresult rc = create ? cuCtxCreate_v2(&c, 0, 0) : cuDevicePrimaryCtxRetain(&c, 0);
    printf("%s rc=%d\n", call, rc);
    if (refused) {
        CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "%s: refused with CUDA_ERROR_OUT_OF_MEMORY (%d)", call,
              rc);
    } else {
        CHECK(rc == CUDA_SUCCESS, "%s: the device has room for the context (%d)", call, rc);
    }
    if (rc == CUDA_SUCCESS) {
        MUST(create ? cuCtxDestroy_v2(c) : cuDevicePrimaryCtxRelease_v2(0));
    }
}

static void first_use(const char *call, int devices, size_t block) {
    MUST(cuInit(0));
    int create = strcmp(call, "create") == 0;
    CUcontext ctx[16];
    CHECK(devices > 0 && devices <= 16, "1 to 16 devices (%d)", devices);
    for (int d = 0; d < devices; d++) {
        if (create) {
            MUST(cuCtxCreate_v2(&ctx[d], 0, d));
        } else {
            MUST(cuDevicePrimaryCtxRetain(&ctx[d], d));
            MUST(cuCtxSetCurrent(ctx[d]));
        }
        size_t f = 0, t = 0;
        MUST(cuMemGetInfo_v2(&f, &t));
        printf("first dev=%d free=%zu total=%zu\n", d, f, t);
        CUdeviceptr p = 0;
        MUST(cuMemAlloc_v2(&p, block));
        MUST(cuMemFree_v2(p));
    }
    for (int d = 0; d < devices; d++) {
        MUST(create ? cuCtxDestroy_v2(ctx[d]) : cuDevicePrimaryCtxRelease_v2(d));
    }
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 7 && strcmp(argv[1], "loop") == 0) {
        loop(argv[2], atoi(argv[3]), parse_size(argv[4]), argv[5], parse_size(argv[6]));
    } else if (argc == 4 && strcmp(argv[1], "roomforone") == 0) {
        room_for_one(argv[2], strcmp(argv[3], "refused") == 0);
    } else if (argc == 5 && strcmp(argv[1], "first") == 0) {
        first_use(argv[2], atoi(argv[3]), parse_size(argv[4]));
    } else {
        fprintf(stderr,
                "usage: %s loop <how> <rounds> <block> <cap|-> <phys> | roomforone "
                "<create|retain> <refused|allowed> | first <create|retain> <devices> <block>\n",
                argv[0]);
        return 2;
    }
    return finish();
}
