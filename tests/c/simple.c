/*
 * simple: cuInit, a context on GPU 0, then cuMemAlloc_v2 of each size in turn.
 *
 *   simple <size>...
 *
 * Prints "cuInit <rc>" (and stops there when it failed), then "alloc <size> <rc>"
 * per size and "info <free> <total>" at the end; frees everything it got. Exit 0.
 */
#define _GNU_SOURCE
#include "fakecuda.h"

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    CUresult rc = cuInit(0);
    printf("cuInit %d\n", rc);
    if (rc != CUDA_SUCCESS) return 0;
    CUdevice dev;
    CUcontext ctx;
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuCtxCreate_v2(&ctx, 0, dev));
    CUdeviceptr held[64];
    int n = 0;
    for (int i = 1; i < argc && n < 64; i++) {
        size_t size = parse_size(argv[i]);
        CUdeviceptr d = 0;
        rc = cuMemAlloc_v2(&d, size);
        printf("alloc %zu %d\n", size, rc);
        if (rc == CUDA_SUCCESS) held[n++] = d;
    }
    size_t f = 0, t = 0;
    MUST(cuMemGetInfo_v2(&f, &t));
    printf("info %zu %zu\n", f, t);
    while (n > 0) MUST(cuMemFree_v2(held[--n]));
    return 0;
}
