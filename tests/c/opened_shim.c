/*
 * opened_shim: a program that opens libgpucap.so with dlopen (not LD_PRELOAD) and calls
 * the driver through the library's own exports: cuInit, the primary context of GPU 0
 * (its device from the driver, which the library does not export) made current, 0.6 of
 * the cap allocated (served) and 0.6 more (refused). The library
 * then comes after the C library in the loader's list, so the first definition of glibc's
 * dlvsym after it is none: it must find glibc's before it, else it finds no driver
 * function at all (cuInit answered CUDA_ERROR_NOT_FOUND).
 *
 *   opened_shim <libgpucap.so> <cap bytes>
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

#include "fakecuda.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s <libgpucap.so> <cap bytes>\n", argv[0]);
        return 2;
    }
    size_t part = parse_size(argv[2]) / 10 * 6;
    void *shim = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    CHECK(shim != NULL, "dlopen(%s): %s", argv[1], shim ? "opened" : dlerror());
    if (!shim) return finish();
    CUresult (*init)(unsigned) = (CUresult (*)(unsigned))dlsym(shim, "cuInit");
    CUresult (*retain)(CUcontext *, CUdevice) =
        (CUresult (*)(CUcontext *, CUdevice))dlsym(shim, "cuDevicePrimaryCtxRetain");
    CUresult (*current)(CUcontext) = (CUresult (*)(CUcontext))dlsym(shim, "cuCtxSetCurrent");
    CUresult (*alloc)(CUdeviceptr *, size_t) = (CUresult (*)(CUdeviceptr *, size_t))dlsym(shim, "cuMemAlloc_v2");
    CHECK(init && retain && current && alloc, "the library exports the driver's functions");
    if (!(init && retain && current && alloc)) return finish();
    CUdevice d = -1;
    CUcontext ctx = NULL;
    CUresult r = init(0);
    CHECK(r == CUDA_SUCCESS, "cuInit through the opened library (%d)", r);
    CHECK(cuDeviceGet(&d, 0) == CUDA_SUCCESS && retain(&ctx, d) == CUDA_SUCCESS && current(ctx) == CUDA_SUCCESS,
          "GPU 0's primary context made current");
    CUdeviceptr a = 0, b = 0;
    CUresult ra = alloc(&a, part), rb = alloc(&b, part);
    CHECK(ra == CUDA_SUCCESS, "0.6 of the cap fits (%d)", ra);
    CHECK(rb == CUDA_ERROR_OUT_OF_MEMORY, "0.6 of the cap more is refused (%d)", rb);
    return finish();
}
