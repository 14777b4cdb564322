/*
 * libwrapnext.so: a library that wraps cuMemAlloc_v2 the classic way, forwarding to
 * dlsym(RTLD_NEXT, "cuMemAlloc_v2"), opened by tests/c/wrapnext.c with RTLD_LOCAL (so
 * it comes after the shim in the loader's list). A program that looks the name up on
 * this library's handle has the shim take the wrapper for the driver's function; the
 * shim must then not answer the wrapper's RTLD_NEXT with its hook, or the two call
 * each other without end (a depth past 3 aborts).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "fakecuda.h"

static __thread int depth;

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
    if (depth > 3) {
        fprintf(stderr, "libwrapnext: cuMemAlloc_v2 re-entered %d times\n", depth);
        abort();
    }
    CUresult (*next)(CUdeviceptr *, size_t) =
        (CUresult(*)(CUdeviceptr *, size_t))dlsym(RTLD_NEXT, "cuMemAlloc_v2");
    depth++;
    CUresult rc = next ? next(p, bytes) : CUDA_ERROR_NOT_FOUND;
    depth--;
    return rc;
}
