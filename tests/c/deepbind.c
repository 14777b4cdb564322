/*
 * deepbind: a program that opens tests/c/libdeepbind.c's library and allocates through
 * it, as Julia does with every library it loads (RTLD_DEEPBIND).
 *
 *   deepbind <deepbind|plain> <cap bytes> <library: a path, or a bare name this
 *            program's RUNPATH finds> [dlopen|dlmopen|libc|versioned|newlm]
 *
 * The library is opened with dlopen (the default), with dlmopen(LM_ID_BASE) (glibc's
 * dlopen by another name), with the dlopen that dlsym finds on the C library's handle
 * (glibc's own, where nothing answers for it), with the dlopen that dlvsym finds by its
 * version (glibc's own too), or with dlmopen(LM_ID_NEWLM) (a namespace
 * of its own, with its own libcuda: only opened and its definitions checked, as the shim
 * does not reach it). Under a cap of <cap>: for each way the library reaches the driver
 * (linked, libcuda's symbol by dlsym, cuGetProcAddress, dlsym(RTLD_DEFAULT), dlsym(RTLD_NEXT),
 * and libcuda's symbol by the C library's own dlsym: by dlvsym from the global scope and as
 * the next definition, and by dlsym(RTLD_NEXT, "dlsym")), 0.6 of the
 * cap fits and 0.6 more is refused, then freed. The library's own definitions stay its
 * own with the flag (the reason a program asks for it) and in a namespace of its own,
 * and are the program's otherwise. Without the shim the refusals are not there (the
 * control).
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
    const char *how = argc == 5 ? argv[4] : "dlopen";
    if (argc < 4 || argc > 5 || (strcmp(argv[1], "deepbind") && strcmp(argv[1], "plain")) ||
        (strcmp(how, "dlopen") && strcmp(how, "dlmopen") && strcmp(how, "libc") && strcmp(how, "versioned") &&
         strcmp(how, "newlm"))) {
        fprintf(stderr, "usage: %s <deepbind|plain> <cap bytes> <library> [dlopen|dlmopen|libc|versioned|newlm]\n",
                argv[0]);
        return 2;
    }
    int deep = strcmp(argv[1], "deepbind") == 0, own_namespace = strcmp(how, "newlm") == 0;
    size_t cap = parse_size(argv[2]), part = cap / 10 * 6;
    primary_context_on_gpu0();
    int flags = RTLD_NOW | (deep ? RTLD_DEEPBIND : 0);
    void *lib = NULL;
    if (!strcmp(how, "dlopen")) {
        lib = dlopen(argv[3], flags);
    } else if (!strcmp(how, "libc")) {
        void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
        void *(*open)(const char *, int) = libc ? (void *(*)(const char *, int))dlsym(libc, "dlopen") : NULL;
        CHECK(open != NULL, "dlsym(the C library's handle, \"dlopen\") found a dlopen");
        lib = open ? open(argv[3], flags) : NULL;
    } else if (!strcmp(how, "versioned")) {
        /* GLIBC_2.34 since glibc moved dlopen into libc; the architecture's first before. */
        const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
        void *(*open)(const char *, int) = NULL;
        for (int i = 0; i < 3 && !open; i++)
            open = (void *(*)(const char *, int))dlvsym(RTLD_DEFAULT, "dlopen", versions[i]);
        CHECK(open != NULL, "dlvsym(RTLD_DEFAULT, \"dlopen\", its version) found a dlopen");
        lib = open ? open(argv[3], flags) : NULL;
    } else {
        lib = dlmopen(own_namespace ? LM_ID_NEWLM : LM_ID_BASE, argv[3], flags);
    }
    CHECK(lib != NULL, "%s(%s, %s): %s", how, argv[3], argv[1], lib ? "opened" : dlerror());
    if (!lib) return finish();
    int (*which)(void) = (int (*)(void))dlsym(lib, "deep_which_definition");
    int own = deep || own_namespace;
    CHECK(which && which() == (own ? 2 : 1), "the library calls %s definition of a name both define",
          own ? "its own" : "the program's");
    if (own_namespace) return finish();
    const char *ways[] = {"deep_linked",  "deep_looked_up", "deep_procaddr",       "deep_default",
                          "deep_next",    "deep_versioned", "deep_versioned_next", "deep_next_dlsym"};
    for (int i = 0; i < 8; i++) {
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
