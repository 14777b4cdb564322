/*
 * cancelled: a thread with a cancellation pending (pthread_cancel of itself, deferred, the
 * default) calls into CUDA: its first cuInit (mode "init": the shim reads its configuration
 * there, open() being a cancellation point), or a cuMemAlloc_v2 past the cap (mode "refused":
 * the shim writes its refusal line, write() being one). The thread must come back from the
 * call with the driver's answer and be cancelled after it, at its own cancellation point; a
 * cancellation acted on inside the shim unwound into its Rust frames and aborted the process.
 *
 *   cancelled init|refused SIZE_MIB
 *
 * Prints "call RC" (the thread's answer), "joined cancelled|returned", then "ok".
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "fakecuda.h"

static const char *mode;
static size_t size_mib;
static CUcontext ctx;
static volatile int result = -1;

static void *worker(void *arg) {
    (void)arg;
    pthread_cancel(pthread_self());
    CUresult rc;
    if (strcmp(mode, "init") == 0) {
        rc = cuInit(0);
    } else {
        cuCtxSetCurrent(ctx);
        CUdeviceptr d;
        rc = cuMemAlloc_v2(&d, size_mib << 20);
    }
    result = rc;
    /* The program's own cancellation point: the thread ends here. */
    pthread_testcancel();
    return NULL;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) return 2;
    mode = argv[1];
    size_mib = argc > 2 ? strtoull(argv[2], NULL, 10) : 0;
    if (strcmp(mode, "init") != 0) {
        CUdevice dev;
        if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev)) return 3;
    }
    pthread_t t;
    void *res;
    pthread_create(&t, NULL, worker, NULL);
    pthread_join(t, &res);
    printf("call %d\n", result);
    printf("joined %s\n", res == PTHREAD_CANCELED ? "cancelled" : "returned");
    printf("ok\n");
    return 0;
}
