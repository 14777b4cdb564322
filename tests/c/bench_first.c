/*
 * bench_first: first use of CUDA in a process: cuInit, the first context, the first
 * allocation, each timed (CLOCK_MONOTONIC).
 *
 *   bench_first <create|retain>
 *
 * "create": cuCtxCreate_v2 on device 0; "retain": cuDevicePrimaryCtxRetain and
 * cuCtxSetCurrent (as the runtime API does). Then a cuMemAlloc_v2 of 4 KiB and its
 * cuMemFree_v2. Prints one line:
 *   init_ns=I ctx_ns=C alloc_ns=A total_ns=T
 * Used by scripts/bench/bench.sh ("first use") with and without the shim; exits 1 on any
 * driver error. Nothing is torn down: the process exits as programs do.
 */
#define _GNU_SOURCE
#include <time.h>

#include "fakecuda.h"

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 2 || (strcmp(argv[1], "create") != 0 && strcmp(argv[1], "retain") != 0)) {
        fprintf(stderr, "usage: %s <create|retain>\n", argv[0]);
        return 2;
    }
    int create = strcmp(argv[1], "create") == 0;
    CUcontext ctx = NULL;
    CUdeviceptr p = 0;
    long long t0 = now_ns();
    MUST(cuInit(0));
    long long t1 = now_ns();
    if (create) {
        MUST(cuCtxCreate_v2(&ctx, 0, 0));
    } else {
        MUST(cuDevicePrimaryCtxRetain(&ctx, 0));
        MUST(cuCtxSetCurrent(ctx));
    }
    long long t2 = now_ns();
    MUST(cuMemAlloc_v2(&p, 4096));
    MUST(cuMemFree_v2(p));
    long long t3 = now_ns();
    printf("init_ns=%lld ctx_ns=%lld alloc_ns=%lld total_ns=%lld\n", t1 - t0, t2 - t1, t3 - t2,
           t3 - t0);
    return finish();
}
