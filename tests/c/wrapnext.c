/*
 * wrapnext: looks cuMemAlloc_v2 up on tests/c/libwrapnext.c's handle, then allocates
 * 1 MiB through what it got and directly; prints both results and how many calls the
 * wrapper saw. Run under the shim, it must end (the wrapper's RTLD_NEXT and the shim's
 * hook never call each other without end).
 *
 *   wrapnext <library>
 */
#include <dlfcn.h>
#include <stdio.h>

#include "fakecuda.h"

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s <library>\n", argv[0]);
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    alloc_fn f = h ? (alloc_fn)dlsym(h, "cuMemAlloc_v2") : NULL;
    CHECK(f != NULL, "cuMemAlloc_v2 found on %s", argv[1]);
    if (!f) return finish();
    primary_context_on_gpu0();
    CUdeviceptr a = 0, b = 0;
    CUresult ra = f(&a, 1 << 20), rb = cuMemAlloc_v2(&b, 1 << 20);
    int (*seen)(void) = (int (*)(void))dlsym(h, "wrapnext_calls");
    printf("through what dlsym found %d, directly %d, the wrapper saw %d calls\n", ra, rb, seen ? seen() : -1);
    return finish();
}
