/*
 * ctxcharge: makes contexts on chosen GPUs, with or without a current context, so that
 * tests can see which GPU each is charged to and which are refused.
 *
 *   ctxcharge STEP...
 *
 *   retain:D       cuDevicePrimaryCtxRetain on GPU D (nothing is made current);
 *                  prints "retain D rc"
 *   create:D       cuCtxCreate_v2 on GPU D, then popped again (what was current before
 *   create_v1:D    is current again); cuCtxCreate, cuCtxCreate_v3, cuCtxCreate_v4 alike;
 *   create_v3:D    prints "NAME D rc" (NAME as written)
 *   create_v4:D
 *   current:D      cuCtxSetCurrent with the last context made on GPU D; "current D rc"
 *   none           cuCtxSetCurrent(NULL); prints "none rc"
 *   alloc:SIZE     cuMemAlloc_v2 in the current context; prints "alloc SIZE rc"
 *   info:D         cuMemGetInfo_v2 with the last context made on GPU D pushed;
 *                  prints "info D FREE TOTAL"
 *
 * Runs cuInit first. Exit 0 unless a step could not run (exit 3).
 */
#define _GNU_SOURCE
#include "fakecuda.h"

CUresult cuCtxCreate(CUcontext *ctx, unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v3(CUcontext *ctx, void *params, int n, unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v4(CUcontext *ctx, void *params, unsigned int flags, CUdevice dev);

#define MAX_DEV 64
static CUcontext made[MAX_DEV];

static int device_of(const char *arg) {
    int d = atoi(arg);
    if (d < 0 || d >= MAX_DEV) {
        fprintf(stderr, "bad device %s\n", arg);
        exit(3);
    }
    return d;
}

static CUresult create(const char *how, CUcontext *c, int d) {
    if (strcmp(how, "create") == 0) return cuCtxCreate_v2(c, 0, d);
    if (strcmp(how, "create_v1") == 0) return cuCtxCreate(c, 0, d);
    if (strcmp(how, "create_v3") == 0) return cuCtxCreate_v3(c, NULL, 0, 0, d);
    return cuCtxCreate_v4(c, NULL, 0, d);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    MUST(cuInit(0));
    for (int i = 1; i < argc; i++) {
        char step[256];
        snprintf(step, sizeof step, "%s", argv[i]);
        char *arg = strchr(step, ':');
        if (arg) *arg++ = '\0';
        if (strcmp(step, "retain") == 0 && arg) {
            int d = device_of(arg);
            CUcontext c = NULL;
            CUresult rc = cuDevicePrimaryCtxRetain(&c, d);
            if (rc == CUDA_SUCCESS) made[d] = c;
            printf("retain %d %d\n", d, rc);
        } else if (strncmp(step, "create", 6) == 0 && arg) {
            int d = device_of(arg);
            CUcontext c = NULL;
            CUresult rc = create(step, &c, d);
            if (rc == CUDA_SUCCESS) {
                made[d] = c;
                CUcontext popped;
                MUST(cuCtxPopCurrent_v2(&popped));
            }
            printf("%s %d %d\n", step, d, rc);
        } else if (strcmp(step, "current") == 0 && arg) {
            int d = device_of(arg);
            printf("current %d %d\n", d, cuCtxSetCurrent(made[d]));
        } else if (strcmp(step, "none") == 0) {
            printf("none %d\n", cuCtxSetCurrent(NULL));
        } else if (strcmp(step, "alloc") == 0 && arg) {
            CUdeviceptr p;
            printf("alloc %zu %d\n", parse_size(arg), cuMemAlloc_v2(&p, parse_size(arg)));
        } else if (strcmp(step, "info") == 0 && arg) {
            int d = device_of(arg);
            size_t free = 0, total = 0;
            CUcontext popped;
            MUST(cuCtxPushCurrent_v2(made[d]));
            MUST(cuMemGetInfo_v2(&free, &total));
            MUST(cuCtxPopCurrent_v2(&popped));
            printf("info %d %zu %zu\n", d, free, total);
        } else {
            fprintf(stderr, "bad step %s\n", argv[i]);
            return 3;
        }
    }
    return 0;
}
