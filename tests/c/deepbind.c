/*
 * deepbind: a program that opens tests/c/libdeepbind.c's library and allocates through
 * it, as Julia does with every library it loads (RTLD_DEEPBIND).
 *
 *   deepbind <deepbind|plain> <cap bytes> <library: a path, or a bare name this
 *            program's RUNPATH finds>
 *
 * Under a cap of <cap>: for each way the library reaches the driver (linked, libcuda's
 * symbol by dlsym, cuGetProcAddress, dlsym(RTLD_DEFAULT)), 0.6 of the cap fits and 0.6 more is refused,
 * then freed. The library's own definitions stay its own with the flag (the reason a
 * program asks for it) and are the program's without it. Without the shim the refusals
 * are not there (the control).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fakecuda.h"

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);

/* The program's definition of the name the library defines too (exported: -rdynamic). */
int which_definition(void) { return 1; }

int main(int argc, char **argv) {
    if (argc != 4 || (strcmp(argv[1], "deepbind") && strcmp(argv[1], "plain"))) {
        fprintf(stderr, "usage: %s <deepbind|plain> <cap bytes> <library>\n", argv[0]);
        return 2;
    }
    int deep = strcmp(argv[1], "deepbind") == 0;
    size_t cap = parse_size(argv[2]), part = cap / 10 * 6;
    CUdevice dev;
    CUcontext ctx;
    MUST(cuInit(0));
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuDevicePrimaryCtxRetain(&ctx, dev));
    MUST(cuCtxSetCurrent(ctx));
    void *lib = dlopen(argv[3], RTLD_NOW | (deep ? RTLD_DEEPBIND : 0));
    CHECK(lib != NULL, "dlopen(%s, %s): %s", argv[3], argv[1], lib ? "opened" : dlerror());
    if (!lib) return finish();
    int (*which)(void) = (int (*)(void))dlsym(lib, "deep_which_definition");
    CHECK(which && which() == (deep ? 2 : 1), "the library calls %s definition of a name both define",
          deep ? "its own" : "the program's");
    const char *ways[] = {"deep_linked", "deep_looked_up", "deep_procaddr", "deep_default"};
    for (int i = 0; i < 4; i++) {
        alloc_fn f = (alloc_fn)dlsym(lib, ways[i]);
        CUdeviceptr a = 0, b = 0;
        CUresult ra = f ? f(&a, part) : CUDA_ERROR_NOT_FOUND;
        CUresult rb = f ? f(&b, part) : CUDA_ERROR_NOT_FOUND;
        CHECK(ra == CUDA_SUCCESS, "%s: 0.6 of the cap fits (%d)", ways[i], ra);
        CHECK(rb == CUDA_ERROR_OUT_OF_MEMORY, "%s: 0.6 of the cap more is refused (%d)", ways[i], rb);
        if (a) cuMemFree_v2(a);
        if (b) cuMemFree_v2(b);
    }
    return finish();
}
