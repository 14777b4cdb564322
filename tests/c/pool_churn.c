/*
 * pool_churn: threads allocating and freeing random sizes on GPU 0, to hammer a
 * pool shared by several processes.
 *
 *   pool_churn THREADS OPS MAXSIZE [READY GO]
 *
 * With READY and GO, the process creates READY once its context exists and waits
 * (up to 60 s) for GO before churning: contexts are charged too, and a context
 * refused because the others filled the pool is not what such a test is about.
 * Each thread makes OPS random steps: allocate 1 byte to MAXSIZE (cuMemAlloc_v2;
 * refusals are counted, any other error is fatal) or free one of its blocks; at the
 * end it frees everything it holds. Prints "churn ok=N refused=M". Exit 3 on an
 * unexpected error.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "fakecuda.h"

static CUcontext g_ctx;
static long g_ops;
static size_t g_max;
static long g_ok, g_refused;
static volatile int g_failed;

#define HELD 64

static void *worker(void *arg) {
    unsigned long long seed = (unsigned long long)(size_t)arg * 0x9E3779B97F4A7C15ull ^ (unsigned long long)getpid();
    CUdeviceptr held[HELD];
    int n = 0;
    long ok = 0, refused = 0;
    if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS) {
        g_failed = 1;
        return NULL;
    }
    for (long i = 0; i < g_ops; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        if (n == 0 || (n < HELD && (seed >> 62) != 0)) {
            size_t size = 1 + (size_t)((seed >> 20) % g_max);
            CUdeviceptr d = 0;
            CUresult rc = cuMemAlloc_v2(&d, size);
            if (rc == CUDA_SUCCESS) {
                held[n++] = d;
                ok++;
            } else if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
                refused++;
            } else {
                fprintf(stderr, "cuMemAlloc_v2: %d\n", rc);
                g_failed = 1;
                break;
            }
        } else {
            int k = (int)((seed >> 33) % (unsigned long long)n);
            if (cuMemFree_v2(held[k]) != CUDA_SUCCESS) g_failed = 1;
            held[k] = held[--n];
        }
    }
    while (n > 0) {
        if (cuMemFree_v2(held[--n]) != CUDA_SUCCESS) g_failed = 1;
    }
    __atomic_fetch_add(&g_ok, ok, __ATOMIC_RELAXED);
    __atomic_fetch_add(&g_refused, refused, __ATOMIC_RELAXED);
    return NULL;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 4 && argc != 6) {
        fprintf(stderr, "usage: pool_churn THREADS OPS MAXSIZE [READY GO]\n");
        return 3;
    }
    int threads = atoi(argv[1]);
    g_ops = atol(argv[2]);
    g_max = parse_size(argv[3]);
    CUresult rc = cuInit(0);
    if (rc != CUDA_SUCCESS) {
        printf("cuInit %d\n", rc);
        return 3;
    }
    CUdevice dev;
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuDevicePrimaryCtxRetain(&g_ctx, dev));
    if (argc == 6) {
        int fd = open(argv[4], O_CREAT | O_WRONLY, 0644);
        if (fd >= 0) close(fd);
        struct timespec ts = {0, 5 * 1000 * 1000};
        for (int i = 0; i < 12000 && access(argv[5], F_OK) != 0; i++) nanosleep(&ts, NULL);
    }
    pthread_t t[256];
    if (threads > 256) threads = 256;
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, (void *)(size_t)(i + 1));
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    printf("churn ok=%ld refused=%ld\n", g_ok, g_refused);
    return g_failed ? 3 : 0;
}
