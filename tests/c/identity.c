/*
 * identity: what each CUDA ordinal is and what the cap lets it have.
 *
 *   identity <alloc>
 *
 * Prints "init rc=N"; then, if cuInit succeeded, one line per visible ordinal:
 *   "ordinal I uuid=<hex> total=B free=B alloc=<rc of cuMemAlloc_v2(alloc)>"
 * (total from cuDeviceTotalMem_v2, free from cuMemGetInfo_v2 in its primary context).
 * If cuInit failed: "after rc=N" for a cuMemAlloc_v2 attempted anyway.
 */
#define _GNU_SOURCE
#include "fakecuda.h"

CUresult cuDeviceGetUuid_v2(unsigned char uuid[16], CUdevice dev);

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s <alloc>\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    size_t bytes = parse_size(argv[1]);
    CUresult rc = cuInit(0);
    printf("init rc=%d\n", rc);
    if (rc != CUDA_SUCCESS) {
        CUdeviceptr p = 0;
        printf("after rc=%d\n", cuMemAlloc_v2(&p, 1 << 20));
        return 0;
    }
    int n = 0;
    MUST(cuDeviceGetCount(&n));
    for (int i = 0; i < n; i++) {
        unsigned char u[16];
        size_t total = 0, free = 0, t2 = 0;
        CUcontext ctx;
        MUST(cuDeviceGetUuid_v2(u, i));
        MUST(cuDeviceTotalMem_v2(&total, i));
        MUST(cuDevicePrimaryCtxRetain(&ctx, i));
        MUST(cuCtxSetCurrent(ctx));
        MUST(cuMemGetInfo_v2(&free, &t2));
        CUdeviceptr p = 0;
        CUresult a = cuMemAlloc_v2(&p, bytes);
        if (a == CUDA_SUCCESS) MUST(cuMemFree_v2(p));
        printf("ordinal %d uuid=", i);
        for (int k = 0; k < 16; k++) printf("%02x", u[k]);
        printf(" total=%zu free=%zu alloc=%d\n", total, free, a);
    }
    return 0;
}
