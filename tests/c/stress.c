/*
 * stress: many threads allocating and freeing random sizes at once under a cap.
 *
 *   stress <cap> <threads> <iterations per thread> <seed> <max size>
 *
 * Each thread keeps up to 4 live allocations, made with cuMemAlloc_v2 or (one in
 * four) cuMemAllocAsync / cuMemAllocAsync_ptsz and freed with the matching free.
 * Refusals (CUDA_ERROR_OUT_OF_MEMORY) are expected and counted; any other error
 * fails. Along the way cuMemGetInfo_v2 must never report more free than the cap.
 * At the end every byte must be credited back: free == total == cap.
 *
 * Prints "allocs=N refused=N frees=N errors=N bad_info=N" and the final figures.
 */
#define _GNU_SOURCE
#include <pthread.h>

#include "fakecuda.h"

static size_t g_cap, g_max;
static int g_iters;
static unsigned g_seed;
static CUcontext g_ctx;
static pthread_barrier_t g_start;

static long g_allocs, g_refused, g_frees, g_errors, g_bad_info;

typedef struct {
    CUdeviceptr p;
    size_t size;
    int kind; /* 0 sync, 1 async, 2 async ptsz */
} slot_t;

static unsigned long long xorshift(unsigned long long *s) {
    unsigned long long x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static void release(slot_t *s) {
    CUresult rc;
    switch (s->kind) {
    case 0: rc = cuMemFree_v2(s->p); break;
    case 1: rc = cuMemFreeAsync(s->p, NULL); break;
    default: rc = cuMemFreeAsync_ptsz(s->p, NULL); break;
    }
    if (rc != CUDA_SUCCESS) {
        __atomic_add_fetch(&g_errors, 1, __ATOMIC_RELAXED);
        printf("error: free(kind %d, %zu bytes) -> %d\n", s->kind, s->size, rc);
    } else {
        __atomic_add_fetch(&g_frees, 1, __ATOMIC_RELAXED);
    }
}

static void *worker(void *arg) {
    long id = (long)arg;
    unsigned long long rng = 0x9E3779B97F4A7C15ULL ^ ((unsigned long long)g_seed << 20) ^ (id + 1);
    slot_t held[4];
    int n = 0;
    long allocs = 0, refused = 0;

    if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS) {
        __atomic_add_fetch(&g_errors, 1, __ATOMIC_RELAXED);
        printf("error: cuCtxSetCurrent failed in thread %ld\n", id);
        return NULL;
    }
    pthread_barrier_wait(&g_start);

    for (int i = 0; i < g_iters; i++) {
        unsigned long long r = xorshift(&rng);
        if (n == 4 || (n > 0 && r % 3 == 0)) {
            int k = (int)((r >> 8) % (unsigned)n);
            release(&held[k]);
            held[k] = held[--n];
            continue;
        }
        slot_t s = {0, 1 + (size_t)((r >> 4) % g_max), (int)((r >> 40) % 8)};
        if (s.kind > 2) s.kind = 0; /* 5 in 8 sync */
        CUresult rc;
        switch (s.kind) {
        case 0: rc = cuMemAlloc_v2(&s.p, s.size); break;
        case 1: rc = cuMemAllocAsync(&s.p, s.size, NULL); break;
        default: rc = cuMemAllocAsync_ptsz(&s.p, s.size, NULL); break;
        }
        if (rc == CUDA_SUCCESS) {
            allocs++;
            held[n++] = s;
        } else if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
            refused++;
        } else {
            __atomic_add_fetch(&g_errors, 1, __ATOMIC_RELAXED);
            printf("error: alloc(kind %d, %zu bytes) -> %d\n", s.kind, s.size, rc);
        }
        if (i % 64 == 0) {
            size_t f = 0, t = 0;
            rc = cuMemGetInfo_v2(&f, &t);
            if (rc != CUDA_SUCCESS || f > g_cap || t != g_cap) {
                if (__atomic_add_fetch(&g_bad_info, 1, __ATOMIC_RELAXED) <= 5)
                    printf("error: cuMemGetInfo_v2 mid-run -> rc=%d free=%zu total=%zu (cap %zu)\n",
                           rc, f, t, g_cap);
            }
        }
    }
    while (n > 0) release(&held[--n]);
    __atomic_add_fetch(&g_allocs, allocs, __ATOMIC_RELAXED);
    __atomic_add_fetch(&g_refused, refused, __ATOMIC_RELAXED);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s <cap> <threads> <iterations> <seed> <max size>\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    g_cap = parse_size(argv[1]);
    int threads = atoi(argv[2]);
    g_iters = atoi(argv[3]);
    g_seed = (unsigned)atoi(argv[4]);
    g_max = parse_size(argv[5]);

    MUST(cuInit(0));
    CUdevice dev;
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuCtxCreate_v2(&g_ctx, 0, dev));

    pthread_t tids[256];
    if (threads < 1 || threads > 256) return 2;
    pthread_barrier_init(&g_start, NULL, (unsigned)threads);
    for (long i = 0; i < threads; i++) pthread_create(&tids[i], NULL, worker, (void *)i);
    for (int i = 0; i < threads; i++) pthread_join(tids[i], NULL);
    MUST(cuStreamSynchronize(NULL));

    size_t f = 0, t = 0;
    MUST(cuMemGetInfo_v2(&f, &t));
    printf("allocs=%ld refused=%ld frees=%ld errors=%ld bad_info=%ld\n", g_allocs, g_refused,
           g_frees, g_errors, g_bad_info);
    printf("final free=%zu total=%zu\n", f, t);
    CHECK(g_errors == 0, "no unexpected errors (%ld)", g_errors);
    CHECK(g_bad_info == 0, "cuMemGetInfo_v2 never reported free > cap or total != cap (%ld)", g_bad_info);
    CHECK(g_allocs == g_frees, "every allocation freed (%ld allocs, %ld frees)", g_allocs, g_frees);
    CHECK(f == g_cap && t == g_cap, "at the end free == total == cap (%zu, %zu, cap %zu)", f, t, g_cap);
    return finish();
}
