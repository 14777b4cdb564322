/*
 * bench_alloc: cost of one cuMemAlloc_v2 + cuMemFree_v2 pair.
 *
 *   bench_alloc <threads> <pairs per thread> [size, default 4Ki] [pair|info|rotate|launch] [live=K]
 *
 * "live=K" first allocates K blocks of the same size and keeps them until exit, so the
 * timed pairs run with K other allocations live (the shim's live-allocation map holds
 * K entries plus the pair's own).
 *
 * "rotate" (one thread, live=K with K >= 1): each pair frees one of the live blocks and
 * allocates it again, round robin over them, so that the pairs meet the live map at K
 * different keys rather than one ("pair" allocates and frees one block again and again:
 * the driver hands it the same address, whose place in the map decides the cost).
 *
 * "info" times cuMemGetInfo_v2 calls instead (one call per "pair"): a hooked call
 * whose driver side is nearly free, so the shim's own cost per call shows.
 *
 * "launch" times cuLaunchKernel of a library's kernel launched before (one launch per
 * "pair"): a launch after the first, the shim's path on every kernel a program runs.
 *
 * Each thread makes its context current, warms up (1000 pairs), waits at a barrier,
 * then runs its pairs. The wall time from the barrier to the last thread's end,
 * divided by the pairs per thread, is the time of one pair as each thread sees it
 * (with 2 threads, contention included). Each thread's own CPU time for its pairs
 * (CLOCK_THREAD_CPUTIME_ID), averaged, gives cpu_ns_per_pair: less sensitive to
 * other processes on a busy machine. Prints one line:
 *   threads=T pairs=N size=S elapsed_ns=E ns_per_pair=X cpu_ns_per_pair=Y
 * Used by scripts/bench/bench.sh with and without the shim; exits 1 on any driver error.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <time.h>

#include "fakecuda.h"

static CUcontext g_ctx;
static long g_pairs;
static size_t g_size;
static pthread_barrier_t g_go;
static int g_failed;
static long long g_cpu_ns; /* sum over threads */
static int g_info;
static int g_rotate;
static int g_launch;
static void *g_kernel;

typedef struct CUlib_st *CUlibrary;
CUresult cuLibraryLoadData(CUlibrary *library, const void *code, void *jit_options, void **jit_values,
                           unsigned num_jit, void *lib_options, void **lib_values, unsigned num_lib);
CUresult cuLibraryGetKernel(void **kernel, CUlibrary library, const char *name);
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, CUstream stream, void **params, void **extra);
static CUdeviceptr *g_live;
static long g_nlive;

static long long clock_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static long long now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }

static int pairs(long n) {
    if (g_info) {
        for (long i = 0; i < n; i++) {
            size_t f, t;
            CUresult rc = cuMemGetInfo_v2(&f, &t);
            if (rc != CUDA_SUCCESS) {
                fprintf(stderr, "bench_alloc: cuMemGetInfo_v2 -> %d\n", rc);
                return 1;
            }
        }
        return 0;
    }
    if (g_launch) {
        for (long i = 0; i < n; i++) {
            CUresult rc = cuLaunchKernel(g_kernel, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
            if (rc != CUDA_SUCCESS) {
                fprintf(stderr, "bench_alloc: cuLaunchKernel -> %d\n", rc);
                return 1;
            }
        }
        return 0;
    }
    if (g_rotate) {
        static long next;
        for (long i = 0; i < n; i++, next = (next + 1) % g_nlive) {
            CUresult rc = cuMemFree_v2(g_live[next]);
            if (rc == CUDA_SUCCESS) rc = cuMemAlloc_v2(&g_live[next], g_size);
            if (rc != CUDA_SUCCESS) {
                fprintf(stderr, "bench_alloc: rotating live block %ld -> %d\n", next, rc);
                return 1;
            }
        }
        return 0;
    }
    for (long i = 0; i < n; i++) {
        CUdeviceptr d;
        CUresult rc = cuMemAlloc_v2(&d, g_size);
        if (rc != CUDA_SUCCESS) {
            fprintf(stderr, "bench_alloc: cuMemAlloc_v2 -> %d\n", rc);
            return 1;
        }
        rc = cuMemFree_v2(d);
        if (rc != CUDA_SUCCESS) {
            fprintf(stderr, "bench_alloc: cuMemFree_v2 -> %d\n", rc);
            return 1;
        }
    }
    return 0;
}

static void *worker(void *arg) {
    (void)arg;
    if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS || pairs(1000)) g_failed = 1;
    pthread_barrier_wait(&g_go);
    long long c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    if (!g_failed && pairs(g_pairs)) g_failed = 1;
    __atomic_add_fetch(&g_cpu_ns, clock_ns(CLOCK_THREAD_CPUTIME_ID) - c0, __ATOMIC_RELAXED);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 6) {
        fprintf(stderr, "usage: %s <threads> <pairs per thread> [size] [pair|info|rotate|launch] [live=K]\n",
                argv[0]);
        return 2;
    }
    int threads = atoi(argv[1]);
    g_pairs = atol(argv[2]);
    g_size = argc >= 4 ? parse_size(argv[3]) : 4 * KIB;
    g_info = argc >= 5 && strcmp(argv[4], "info") == 0;
    g_rotate = argc >= 5 && strcmp(argv[4], "rotate") == 0;
    g_launch = argc >= 5 && strcmp(argv[4], "launch") == 0;
    if (argc >= 5 && !g_info && !g_rotate && !g_launch && strcmp(argv[4], "pair") != 0) {
        fprintf(stderr, "bench_alloc: mode %s: expected pair, info, rotate or launch\n", argv[4]);
        return 2;
    }
    long live = 0;
    if (argc == 6) {
        char *end = NULL;
        if (strncmp(argv[5], "live=", 5) == 0) live = strtol(argv[5] + 5, &end, 10);
        if (!end || *end != '\0' || live < 0) {
            fprintf(stderr, "bench_alloc: %s: expected live=K with K >= 0\n", argv[5]);
            return 2;
        }
    }
    if (threads < 1 || threads > 64 || g_pairs < 1) return 2;
    if (g_rotate && (threads != 1 || live < 1)) {
        fprintf(stderr, "bench_alloc: rotate needs one thread and live=K with K >= 1\n");
        return 2;
    }
    g_live = calloc(live > 0 ? (size_t)live : 1, sizeof *g_live);
    g_nlive = live;
    if (!g_live) return 1;

    MUST(cuInit(0));
    CUdevice dev;
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuCtxCreate_v2(&g_ctx, 0, dev));
    if (g_launch) {
        static const char ptx[] = ".version 6.0\n.target sm_50\n.address_size 64\n"
                                  ".visible .entry k()\n{\n\tret;\n}\n";
        CUlibrary lib = NULL;
        MUST(cuLibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0));
        MUST(cuLibraryGetKernel(&g_kernel, lib, "k"));
    }
    for (long i = 0; i < live; i++) {
        CUdeviceptr d; /* kept until exit ("rotate": freed and made again) */
        CUresult rc = cuMemAlloc_v2(&d, g_size);
        g_live[i] = d;
        if (rc != CUDA_SUCCESS) {
            fprintf(stderr, "bench_alloc: live allocation %ld of %ld: cuMemAlloc_v2 -> %d\n", i, live, rc);
            return 1;
        }
    }

    pthread_t tids[64];
    pthread_barrier_init(&g_go, NULL, (unsigned)threads + 1);
    for (int i = 0; i < threads; i++) pthread_create(&tids[i], NULL, worker, NULL);
    pthread_barrier_wait(&g_go);
    long long t0 = now_ns();
    for (int i = 0; i < threads; i++) pthread_join(tids[i], NULL);
    long long elapsed = now_ns() - t0;
    if (g_failed) return 1;
    printf("threads=%d pairs=%ld size=%zu elapsed_ns=%lld ns_per_pair=%.2f cpu_ns_per_pair=%.2f\n", threads,
           g_pairs, g_size, elapsed, (double)elapsed / (double)g_pairs,
           (double)g_cpu_ns / threads / (double)g_pairs);
    return 0;
}
