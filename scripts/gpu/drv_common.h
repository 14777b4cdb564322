// The driver-API helpers of scripts/gpu/drvbench.cu and scripts/gpu/launchbench.cu (each
// built alone with `nvcc -O2 ... -lcuda`; this header is found beside them): a driver
// error ends the program with "FAIL: ..." (exit 1), device 0's primary context, a
// monotonic clock in nanoseconds.
#ifndef GPUCAP_DRV_COMMON_H
#define GPUCAP_DRV_COMMON_H

#include <cuda.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

static inline void check(CUresult rc, const char *what) {
    if (rc != CUDA_SUCCESS) {
        const char *name = nullptr;
        if (cuGetErrorName(rc, &name) != CUDA_SUCCESS || name == nullptr) {
            name = "?";
        }
        printf("FAIL: %s -> %s (%d)\n", what, name, int(rc));
        fflush(stdout);
        exit(1);
    }
}

static inline CUcontext init_context() {
    check(cuInit(0), "cuInit");
    CUdevice dev = 0;
    check(cuDeviceGet(&dev, 0), "cuDeviceGet(0)");
    CUcontext ctx = nullptr;
    check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    return ctx;
}

static inline int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

#endif
