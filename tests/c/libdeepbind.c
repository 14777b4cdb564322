/*
 * libdeepbind.so: a library that tests/c/deepbind.c opens with RTLD_DEEPBIND (Julia's
 * default for every library it loads). It reaches the driver the three ways a CUDA
 * library does: linked with -lcuda, libcuda opened and its symbol found with dlsym (the
 * CUDA runtime nvcc links in), and cuGetProcAddress found the same way (CUDA 12's
 * runtime), besides dlsym(RTLD_DEFAULT) and dlsym(RTLD_NEXT), and through the C
 * library's own dlsym, taken by its version with dlvsym (the way interposers that wrap
 * dlsym find the one they wrap) or as the next definition with dlsym(RTLD_NEXT). Opened
 * with RTLD_DEEPBIND, each of those references looks in this library's own dependencies
 * (libcuda, the C library's dlsym and dlvsym) before the process's global scope, where
 * the shim comes first; and the next definition after this library, opened with the
 * flag or not, is libcuda's (or the C library's, for dlsym).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

#include "fakecuda.h"

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef void *(*dlsym_fn)(void *, const char *);

/* Defined by the program too (which exports it): opened with RTLD_DEEPBIND this
 * library's own definition is the one it calls, without the flag the program's. */
int which_definition(void) { return 2; }
int deep_which_definition(void) { return which_definition(); }

CUresult deep_linked(CUdeviceptr *p, size_t bytes) { return cuMemAlloc_v2(p, bytes); }

CUresult deep_looked_up(CUdeviceptr *p, size_t bytes) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    alloc_fn f = h ? (alloc_fn)dlsym(h, "cuMemAlloc_v2") : NULL;
    return f ? f(p, bytes) : CUDA_ERROR_NOT_FOUND;
}

CUresult deep_default(CUdeviceptr *p, size_t bytes) {
    alloc_fn f = (alloc_fn)dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
    return f ? f(p, bytes) : CUDA_ERROR_NOT_FOUND;
}

/* The next definition after this library, as an interposer finds what it wraps: the
 * driver's own function (this library comes after the shim in the loader's list). */
CUresult deep_next(CUdeviceptr *p, size_t bytes) {
    alloc_fn f = (alloc_fn)dlsym(RTLD_NEXT, "cuMemAlloc_v2");
    return f ? f(p, bytes) : CUDA_ERROR_NOT_FOUND;
}

CUresult deep_procaddr(CUdeviceptr *p, size_t bytes) {
    typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    gpa_fn gpa = h ? (gpa_fn)dlsym(h, "cuGetProcAddress_v2") : NULL;
    void *f = NULL;
    CUdriverProcAddressQueryResult status;
    if (!gpa || gpa("cuMemAlloc", &f, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status) || !f)
        return CUDA_ERROR_NOT_FOUND;
    return ((alloc_fn)f)(p, bytes);
}

/* cuMemAlloc_v2 looked up on libcuda's handle with the dlsym that `find` gives. */
static CUresult through(dlsym_fn find, CUdeviceptr *p, size_t bytes) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    alloc_fn f = find && h ? (alloc_fn)find(h, "cuMemAlloc_v2") : NULL;
    return f ? f(p, bytes) : CUDA_ERROR_NOT_FOUND;
}

/* The C library's dlsym by its version (GLIBC_2.34 since glibc moved it into libc;
 * the first version of the architecture before), as interposers that wrap dlsym take
 * the one they wrap. */
static dlsym_fn versioned_dlsym(void *where) {
    const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    for (int i = 0; i < 3; i++) {
        dlsym_fn f = (dlsym_fn)dlvsym(where, "dlsym", versions[i]);
        if (f) return f;
    }
    return NULL;
}

CUresult deep_versioned(CUdeviceptr *p, size_t bytes) { return through(versioned_dlsym(RTLD_DEFAULT), p, bytes); }

CUresult deep_versioned_next(CUdeviceptr *p, size_t bytes) { return through(versioned_dlsym(RTLD_NEXT), p, bytes); }

/* The next dlsym after this library: the C library's. */
CUresult deep_next_dlsym(CUdeviceptr *p, size_t bytes) {
    return through((dlsym_fn)dlsym(RTLD_NEXT, "dlsym"), p, bytes);
}
