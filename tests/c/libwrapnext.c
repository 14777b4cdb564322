/*
 * libwrapnext.so: a library that wraps cuMemAlloc_v2 the classic way, forwarding to
 * dlsym(RTLD_NEXT, "cuMemAlloc_v2"), opened by tests/c/wrapnext.c with RTLD_LOCAL (so
 * it comes after the shim in the loader's list), and counts the calls it wraps.
 *
 * Built with -DWHOLE_DRIVER (and -lcuda) it defines cuInit too, as an interposer of the
 * whole driver does: a program that looks cuMemAlloc_v2 up on its handle then has the shim take the
 * wrapper for the driver's function, and the shim must not answer the wrapper's
 * RTLD_NEXT with its hook, or the two call each other without end (a depth past 3
 * aborts). Without it, the wrapper of one name is not the driver: the program gets the
 * wrapper itself, whose RTLD_NEXT is the shim's hook.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "fakecuda.h"

static __thread int depth;
static int calls;

/* How many calls the wrapper saw. */
int wrapnext_calls(void) { return calls; }

#ifdef WHOLE_DRIVER
CUresult cuInit(unsigned flags) {
    CUresult (*next)(unsigned) = (CUresult(*)(unsigned))dlsym(RTLD_NEXT, "cuInit");
    return next ? next(flags) : CUDA_ERROR_NOT_FOUND;
}
#endif

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
    if (depth > 3) {
        fprintf(stderr, "libwrapnext: cuMemAlloc_v2 re-entered %d times\n", depth);
        abort();
    }
    CUresult (*next)(CUdeviceptr *, size_t) =
        (CUresult(*)(CUdeviceptr *, size_t))dlsym(RTLD_NEXT, "cuMemAlloc_v2");
    depth++;
    calls++;
    CUresult rc = next ? next(p, bytes) : CUDA_ERROR_NOT_FOUND;
    depth--;
    return rc;
}
