/*
 * bench_alloc: cost of one cuMemAlloc_v2 + cuMemFree_v2 pair.
 *
 *   bench_alloc <threads> <pairs per thread> [size, default 4Ki]
 *
 * Each thread makes its context current, warms up (1000 pairs), waits at a barrier,
 * then runs its pairs. The wall time from the barrier to the last thread's end,
 * divided by the pairs per thread, is the time of one pair as each thread sees it
 * (with 2 threads, contention included). Prints one line:
 *   threads=T pairs=N size=S elapsed_ns=E ns_per_pair=X
 * Used by scripts/bench.sh with and without the shim; exits 1 on any driver error.
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

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int pairs(long n) {
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
    if (!g_failed && pairs(g_pairs)) g_failed = 1;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: %s <threads> <pairs per thread> [size]\n", argv[0]);
        return 2;
    }
    int threads = atoi(argv[1]);
    g_pairs = atol(argv[2]);
    g_size = argc == 4 ? parse_size(argv[3]) : 4 * KIB;
    if (threads < 1 || threads > 64 || g_pairs < 1) return 2;

    MUST(cuInit(0));
    CUdevice dev;
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuCtxCreate_v2(&g_ctx, 0, dev));

    pthread_t tids[64];
    pthread_barrier_init(&g_go, NULL, (unsigned)threads + 1);
    for (int i = 0; i < threads; i++) pthread_create(&tids[i], NULL, worker, NULL);
    pthread_barrier_wait(&g_go);
    long long t0 = now_ns();
    for (int i = 0; i < threads; i++) pthread_join(tids[i], NULL);
    long long elapsed = now_ns() - t0;
    if (g_failed) return 1;
    printf("threads=%d pairs=%ld size=%zu elapsed_ns=%lld ns_per_pair=%.2f\n", threads, g_pairs, g_size,
           elapsed, (double)elapsed / (double)g_pairs);
    return 0;
}
