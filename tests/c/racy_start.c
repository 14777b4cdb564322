/*
 * racy_start: the first CUDA calls of a process made by many threads at once, so
 * the shim's lazy initialisation (configuration, real entry points, ledger) is raced.
 *
 *   racy_start <cap> <threads>
 *
 * After a barrier every thread calls cuInit, retains the primary context, looks
 * cuMemAlloc/cuMemFree up with cuGetProcAddress_v2 (and cuMemGetInfo with dlsym), and
 * allocates cap/threads bytes: together exactly the cap, so all must succeed. After a
 * second barrier each asks for 1 MiB more: all must be refused. Then all free, and
 * the main thread checks free == total == cap.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>

#include "fakecuda.h"

static size_t g_cap;
static int g_threads;
static pthread_barrier_t g_b1, g_b2, g_b3;
static int g_ok_first, g_refused_second, g_errors;

static void *worker(void *arg) {
    (void)arg;
    pthread_barrier_wait(&g_b1);
    CUresult rc = cuInit(0);
    CUcontext ctx = NULL;
    if (rc == CUDA_SUCCESS) rc = cuDevicePrimaryCtxRetain(&ctx, 0);
    if (rc == CUDA_SUCCESS) rc = cuCtxSetCurrent(ctx);
    PFN_cuMemAlloc alloc = NULL;
    PFN_cuMemFree release = NULL;
    CUdriverProcAddressQueryResult st;
    if (rc == CUDA_SUCCESS) rc = cuGetProcAddress_v2("cuMemAlloc", (void **)&alloc, 12000, 0, &st);
    if (rc == CUDA_SUCCESS) rc = cuGetProcAddress_v2("cuMemFree", (void **)&release, 12000, 0, &st);
    PFN_cuMemGetInfo info = (PFN_cuMemGetInfo)dlsym(RTLD_DEFAULT, "cuMemGetInfo_v2");
    CUdeviceptr d = 0, extra = 0;
    if (rc == CUDA_SUCCESS) {
        rc = alloc(&d, g_cap / (size_t)g_threads);
        if (rc == CUDA_SUCCESS) __atomic_add_fetch(&g_ok_first, 1, __ATOMIC_RELAXED);
        else printf("error: first allocation -> %d\n", rc);
    } else {
        printf("error: set-up -> %d\n", rc);
        __atomic_add_fetch(&g_errors, 1, __ATOMIC_RELAXED);
    }
    size_t f, t;
    if (info && info(&f, &t) != CUDA_SUCCESS) __atomic_add_fetch(&g_errors, 1, __ATOMIC_RELAXED);
    pthread_barrier_wait(&g_b2);
    if (alloc) {
        CUresult rc2 = alloc(&extra, MIB);
        if (rc2 == CUDA_ERROR_OUT_OF_MEMORY) __atomic_add_fetch(&g_refused_second, 1, __ATOMIC_RELAXED);
        else if (rc2 == CUDA_SUCCESS) release(extra);
    }
    pthread_barrier_wait(&g_b3);
    if (d && release(d) != CUDA_SUCCESS) __atomic_add_fetch(&g_errors, 1, __ATOMIC_RELAXED);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s <cap> <threads>\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    g_cap = parse_size(argv[1]);
    g_threads = atoi(argv[2]);
    if (g_threads < 1 || g_threads > 64) return 2;
    pthread_t tids[64];
    pthread_barrier_init(&g_b1, NULL, (unsigned)g_threads);
    pthread_barrier_init(&g_b2, NULL, (unsigned)g_threads);
    pthread_barrier_init(&g_b3, NULL, (unsigned)g_threads);
    for (int i = 0; i < g_threads; i++) pthread_create(&tids[i], NULL, worker, NULL);
    for (int i = 0; i < g_threads; i++) pthread_join(tids[i], NULL);

    CHECK(g_errors == 0, "no errors (%d)", g_errors);
    CHECK(g_ok_first == g_threads, "%d of %d first allocations (cap/threads each) succeeded", g_ok_first,
          g_threads);
    CHECK(g_refused_second == g_threads, "%d of %d extra MiB refused with the cap full", g_refused_second,
          g_threads);
    CUcontext ctx;
    MUST(cuDevicePrimaryCtxRetain(&ctx, 0));
    MUST(cuCtxSetCurrent(ctx));
    size_t f = 0, t = 0;
    MUST(cuMemGetInfo_v2(&f, &t));
    CHECK(f == g_cap && t == g_cap, "end: free == total == cap (%zu, %zu)", f, t);
    return finish();
}
