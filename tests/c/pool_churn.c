/*
 * pool_churn: threads allocating and freeing random sizes on GPU 0, to hammer a
 * pool shared by several processes.
 *
 *   pool_churn THREADS OPS MAXSIZE [READY GO [GUARANTEE]]
 *
 * With READY and GO, the process creates READY once its context exists and waits
 * (up to 60 s) for GO before churning: contexts are charged too, and a context
 * refused because the others filled the pool is not what such a test is about.
 * Each thread makes OPS random steps: allocate 1 byte to MAXSIZE (cuMemAlloc_v2;
 * refusals are counted, any other error is fatal) or free one of its blocks; at the
 * end it frees everything it holds. Prints "churn ok=N refused=M". Exit 3 on an
 * unexpected error.
 *
 * With GUARANTEE (the process's GPUCAP_GUARANTEE in bytes), a quarter of the requests
 * fit in what the process's threads hold below it, and a refusal that could only
 * break the guarantee is counted: one made while no other thread of the process was
 * allocating (so the process held at most what it held when the request started) and
 * for no more than the guarantee left then (as charged: `linear_charge`). Also prints
 * "checked=C broken=B".
 *
 * With CHURN_HOLD=PATH in the environment, the process keeps its context after
 * churning until PATH exists (up to 60 s), so that it counts beside contexts made
 * later, however fast it churned.
 *
 * With CHURN_KINDS=mixed in the environment, each block is of a kind drawn at random:
 * cuMemAlloc_v2, cuMemAllocAsync (freed with cuMemFreeAsync, then the stream synced),
 * cuMemCreate (a VMM handle, freed with cuMemRelease) or cuMemAllocManaged.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fakecuda.h"

static CUcontext g_ctx;
static long g_ops;
static size_t g_max;
static long g_ok, g_refused;
static size_t g_guarantee;
static long g_seq, g_inflight, g_held, g_checked, g_broken;
static volatile int g_failed;
static int g_mixed;

#define HELD 64

/* A block of kind `kind` (0 plain, 1 stream-ordered, 2 VMM, 3 managed): its address or
 * handle in *d. */
static CUresult alloc_kind(int kind, CUdeviceptr *d, size_t size) {
    switch (kind) {
    case 1:
        return cuMemAllocAsync(d, size, NULL);
    case 2: {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        size_t gran = 2u << 20;
        CUmemGenericAllocationHandle h = 0;
        CUresult rc = cuMemCreate(&h, (size + gran - 1) / gran * gran, &prop, 0);
        *d = (CUdeviceptr)h;
        return rc;
    }
    case 3:
        return cuMemAllocManaged(d, size, CU_MEM_ATTACH_GLOBAL);
    default:
        return cuMemAlloc_v2(d, size);
    }
}

static CUresult free_kind(int kind, CUdeviceptr d) {
    switch (kind) {
    case 1: {
        CUresult rc = cuMemFreeAsync(d, NULL);
        return rc != CUDA_SUCCESS ? rc : cuStreamSynchronize(NULL);
    }
    case 2:
        return cuMemRelease((CUmemGenericAllocationHandle)d);
    default:
        return cuMemFree_v2(d);
    }
}

static void *worker(void *arg) {
    unsigned long long seed = (unsigned long long)(size_t)arg * 0x9E3779B97F4A7C15ull ^ (unsigned long long)getpid();
    CUdeviceptr held[HELD];
    size_t held_size[HELD];
    int held_kind[HELD];
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
            __atomic_fetch_add(&g_inflight, 1, __ATOMIC_SEQ_CST);
            long s0 = __atomic_add_fetch(&g_seq, 1, __ATOMIC_SEQ_CST);
            int alone = __atomic_load_n(&g_inflight, __ATOMIC_SEQ_CST) == 1;
            size_t held0 = (size_t)__atomic_load_n(&g_held, __ATOMIC_SEQ_CST);
            if (g_guarantee > held0 && (seed >> 8) % 4 == 0)
                size = 1 + (size_t)((seed >> 24) % (g_guarantee - held0));
            CUdeviceptr d = 0;
            int kind = g_mixed ? (int)((seed >> 4) % 4) : 0;
            CUresult rc = alloc_kind(kind, &d, size);
            /* No other thread of this process reserved during the request: it held at
             * most held0, so a request within the guarantee left must be served. */
            int strict = alone && __atomic_load_n(&g_seq, __ATOMIC_SEQ_CST) == s0 &&
                         held0 + linear_charge(size) <= g_guarantee;
            if (strict) __atomic_fetch_add(&g_checked, 1, __ATOMIC_RELAXED);
            if (rc == CUDA_SUCCESS) {
                /* Held as charged: above 1 MiB in whole 2 MiB pages. */
                __atomic_fetch_add(&g_held, (long)linear_charge(size), __ATOMIC_SEQ_CST);
                held_size[n] = linear_charge(size);
                held_kind[n] = kind;
                held[n++] = d;
                ok++;
            } else if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
                refused++;
                if (strict) {
                    __atomic_fetch_add(&g_broken, 1, __ATOMIC_RELAXED);
                    fprintf(stderr, "guarantee broken: %zu refused holding %zu of %zu\n", size, held0, g_guarantee);
                }
            } else {
                fprintf(stderr, "alloc (kind %d): %d\n", kind, rc);
                g_failed = 1;
                __atomic_fetch_sub(&g_inflight, 1, __ATOMIC_SEQ_CST);
                break;
            }
            __atomic_fetch_sub(&g_inflight, 1, __ATOMIC_SEQ_CST);
        } else {
            int k = (int)((seed >> 33) % (unsigned long long)n);
            if (free_kind(held_kind[k], held[k]) != CUDA_SUCCESS) g_failed = 1;
            __atomic_fetch_sub(&g_held, (long)held_size[k], __ATOMIC_SEQ_CST);
            held_size[k] = held_size[n - 1];
            held_kind[k] = held_kind[n - 1];
            held[k] = held[--n];
        }
    }
    while (n > 0) {
        n--;
        if (free_kind(held_kind[n], held[n]) != CUDA_SUCCESS) g_failed = 1;
        __atomic_fetch_sub(&g_held, (long)held_size[n], __ATOMIC_SEQ_CST);
    }
    __atomic_fetch_add(&g_ok, ok, __ATOMIC_RELAXED);
    __atomic_fetch_add(&g_refused, refused, __ATOMIC_RELAXED);
    return NULL;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 4 && argc != 6 && argc != 7) {
        fprintf(stderr, "usage: pool_churn THREADS OPS MAXSIZE [READY GO [GUARANTEE]]\n");
        return 3;
    }
    int threads = atoi(argv[1]);
    g_ops = atol(argv[2]);
    g_max = parse_size(argv[3]);
    if (argc == 7) g_guarantee = parse_size(argv[6]);
    const char *kinds = getenv("CHURN_KINDS");
    g_mixed = kinds && strcmp(kinds, "mixed") == 0;
    CUresult rc = cuInit(0);
    if (rc != CUDA_SUCCESS) {
        printf("cuInit %d\n", rc);
        return 3;
    }
    CUdevice dev;
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuDevicePrimaryCtxRetain(&g_ctx, dev));
    if (argc >= 6) {
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
    if (g_guarantee) printf("checked=%ld broken=%ld\n", g_checked, g_broken);
    const char *hold = getenv("CHURN_HOLD");
    if (hold) {
        struct timespec ts = {0, 5 * 1000 * 1000};
        for (int i = 0; i < 12000 && access(hold, F_OK) != 0; i++) nanosleep(&ts, NULL);
    }
    return g_failed ? 3 : 0;
}
