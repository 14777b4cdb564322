/*
 * pool_pairs: threads each allocating and freeing one block again and again (the
 * pair loop of a training step's temporaries), counting every refusal.
 *
 *   pool_pairs THREADS PAIRS SIZE [KIND [READY GO]]
 *
 * Each thread makes the process's context current, waits at a barrier, then makes
 * PAIRS pairs of an allocation of SIZE and its free. KIND says which allocation:
 * "plain" (the default: cuMemAlloc_v2, freed with cuMemFree_v2, the shim's short path
 * first), "managed" (cuMemAllocManaged, freed with cuMemFree_v2, the shim's full path
 * only) or "mixed" (each thread one or the other, by its number's parity). A refusal
 * (CUDA_ERROR_OUT_OF_MEMORY) is counted and the loop goes on; any other error is
 * fatal (exit 3). With READY and GO, the process creates the file READY once its
 * context exists and waits (up to 60 s) for the file GO before its threads start, so
 * that several processes pair at the same time.
 *
 * Prints "pairs ok=N refused=M" and, for the first refusal, "first_refusal=I" (the
 * pair it came at, counted over all threads). Exit 0 unless an error was fatal.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "fakecuda.h"

static CUcontext g_ctx;
static long g_pairs;
static size_t g_size;
static pthread_barrier_t g_go;
static long g_ok, g_refused, g_done, g_first_refusal = -1;
static volatile int g_failed;
static int g_kind; /* 0 plain, 1 managed, 2 mixed */
static long g_next_thread;

static void *worker(void *arg) {
    (void)arg;
    long me = __atomic_fetch_add(&g_next_thread, 1, __ATOMIC_RELAXED);
    int managed = g_kind == 1 || (g_kind == 2 && me % 2 == 1);
    if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS) g_failed = 1;
    pthread_barrier_wait(&g_go);
    long ok = 0, refused = 0;
    for (long i = 0; i < g_pairs && !g_failed; i++) {
        CUdeviceptr d;
        CUresult rc = managed ? cuMemAllocManaged(&d, g_size, CU_MEM_ATTACH_GLOBAL)
                              : cuMemAlloc_v2(&d, g_size);
        long at = __atomic_fetch_add(&g_done, 1, __ATOMIC_RELAXED);
        if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
            long none = -1;
            __atomic_compare_exchange_n(&g_first_refusal, &none, at, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED);
            refused++;
            continue;
        }
        if (rc != CUDA_SUCCESS) {
            fprintf(stderr, "pool_pairs: %s(%zu) -> %d\n",
                    managed ? "cuMemAllocManaged" : "cuMemAlloc_v2", g_size, rc);
            g_failed = 1;
            break;
        }
        rc = cuMemFree_v2(d);
        if (rc != CUDA_SUCCESS) {
            fprintf(stderr, "pool_pairs: cuMemFree_v2 -> %d\n", rc);
            g_failed = 1;
            break;
        }
        ok++;
    }
    __atomic_add_fetch(&g_ok, ok, __ATOMIC_RELAXED);
    __atomic_add_fetch(&g_refused, refused, __ATOMIC_RELAXED);
    return NULL;
}

/* Waits up to 60 s for `path` to exist. */
static int wait_for(const char *path) {
    for (int i = 0; i < 60000; i++) {
        if (access(path, F_OK) == 0) return 0;
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    return -1;
}

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5 && argc != 7) {
        fprintf(stderr, "usage: %s THREADS PAIRS SIZE [plain|managed|mixed [READY GO]]\n", argv[0]);
        return 2;
    }
    if (argc >= 5) {
        if (strcmp(argv[4], "managed") == 0) {
            g_kind = 1;
        } else if (strcmp(argv[4], "mixed") == 0) {
            g_kind = 2;
        } else if (strcmp(argv[4], "plain") != 0) {
            fprintf(stderr, "pool_pairs: kind %s: expected plain, managed or mixed\n", argv[4]);
            return 2;
        }
    }
    int threads = atoi(argv[1]);
    g_pairs = atol(argv[2]);
    g_size = parse_size(argv[3]);
    if (threads < 1 || threads > 64 || g_pairs < 1 || g_size == 0) {
        fprintf(stderr, "pool_pairs: expected 1 to 64 threads, at least 1 pair, a size above 0\n");
        return 2;
    }
    MUST(cuInit(0));
    CUdevice dev;
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuCtxCreate_v2(&g_ctx, 0, dev));
    if (argc == 7) {
        int fd = open(argv[5], O_CREAT | O_WRONLY, 0644);
        if (fd < 0) {
            perror("pool_pairs: READY");
            return 3;
        }
        close(fd);
        if (wait_for(argv[6])) {
            fprintf(stderr, "pool_pairs: %s did not appear within 60 s\n", argv[6]);
            return 3;
        }
    }
    pthread_t tids[64];
    pthread_barrier_init(&g_go, NULL, (unsigned)threads);
    for (int i = 0; i < threads; i++) pthread_create(&tids[i], NULL, worker, NULL);
    for (int i = 0; i < threads; i++) pthread_join(tids[i], NULL);
    printf("pairs ok=%ld refused=%ld\n", g_ok, g_refused);
    if (g_refused > 0) printf("first_refusal=%ld\n", g_first_refusal);
    fflush(stdout);
    return g_failed ? 3 : 0;
}
