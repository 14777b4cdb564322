/*
 * nonpie: a program built without PIE (-no-pie) that takes the address of
 * cuMemAlloc_v2. Its PLT entry is then the canonical address of that symbol: the
 * loader binds every reference to it there, and dlsym(RTLD_DEFAULT, ...) answers it.
 * gpucap must neither take that address for the driver's function (calling it would
 * come back into the hook: endless recursion) nor lose the cap.
 *
 *   nonpie <cap bytes>
 *
 * Under a cap of <cap>: 0.6 of the cap through the program's own reference fits, and
 * then the same through dlsym (RTLD_DEFAULT, and the program's own handle, which the
 * shim answers itself) and through cuGetProcAddress_v2 is refused
 * (the cap holds); after the free, each of the three ways fits again, one at a time.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "fakecuda.h"

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);

/* The address taken in code (an absolute immediate without PIE): the program's PLT
 * entry becomes the symbol's canonical address. A pointer in initialised data would
 * instead be a dynamic relocation to the library's own function. */
__attribute__((noinline)) static alloc_fn linked_address(void) { return cuMemAlloc_v2; }

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s <cap bytes>\n", argv[0]);
        return 2;
    }
    size_t cap = strtoull(argv[1], NULL, 0), half = cap / 10 * 6;
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) {
        printf("FAIL: driver set-up\n");
        return 1;
    }
    alloc_fn g_linked = linked_address();
    alloc_fn by_default = (alloc_fn)dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
    /* the program's own handle: a handle lookup, which the shim's dlsym answers itself */
    void *self = dlopen(NULL, RTLD_NOW);
    alloc_fn by_dlsym = self ? (alloc_fn)dlsym(self, "cuMemAlloc_v2") : NULL;
    void *by_procaddr = NULL;
    CUdriverProcAddressQueryResult status;
    if (cuGetProcAddress_v2("cuMemAlloc", &by_procaddr, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status) ||
        !by_default || !by_dlsym || !by_procaddr) {
        printf("FAIL: lookups (dlsym %p, cuGetProcAddress %p)\n", (void *)by_dlsym, by_procaddr);
        return 1;
    }
    printf("linked %p RTLD_DEFAULT %p own handle %p procaddr %p\n", (void *)g_linked, (void *)by_default,
           (void *)by_dlsym, by_procaddr);
    CUdeviceptr a = 0, b = 0, c = 0, d = 0;
    CUresult ra = g_linked(&a, half);
    CUresult rb = by_dlsym(&b, half);
    CUresult rc = ((alloc_fn)by_procaddr)(&c, half);
    CUresult rd = by_default(&d, half);
    printf("0.6 of the cap: linked %d, own handle %d, cuGetProcAddress %d, RTLD_DEFAULT %d\n", ra, rb, rc, rd);
    int ok = ra == CUDA_SUCCESS && rb == CUDA_ERROR_OUT_OF_MEMORY && rc == CUDA_ERROR_OUT_OF_MEMORY &&
             rd == CUDA_ERROR_OUT_OF_MEMORY;
    if (ra == CUDA_SUCCESS) cuMemFree_v2(a);
    if (rb == CUDA_SUCCESS) cuMemFree_v2(b);
    if (rc == CUDA_SUCCESS) cuMemFree_v2(c);
    if (rd == CUDA_SUCCESS) cuMemFree_v2(d);
    /* after the free, each way fits again, one at a time */
    CUresult again[4];
    alloc_fn ways[4] = {g_linked, by_dlsym, (alloc_fn)by_procaddr, by_default};
    for (int i = 0; i < 4; i++) {
        CUdeviceptr p = 0;
        again[i] = ways[i](&p, half);
        if (again[i] == CUDA_SUCCESS) cuMemFree_v2(p);
        ok = ok && again[i] == CUDA_SUCCESS;
    }
    printf("%s: the cap held on each way, and after the free each fitted again: %d %d %d %d\n",
           ok ? "ok" : "FAIL", again[0], again[1], again[2], again[3]);
    printf("summary: %s\n", ok ? "passed" : "failed");
    return ok ? 0 : 1;
}
