/*
 * libother.so: another LD_PRELOAD interposer, preloaded beside gpucap. It wraps a
 * driver function (cuMemGetInfo_v2) and a libc function (getpid) the classic way:
 * count the call, then forward to dlsym(RTLD_NEXT, name). With gpucap's dlsym
 * override in the process, RTLD_NEXT must still mean "the next definition after
 * libother", or these wrappers recurse into themselves or call garbage.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

#include "fakecuda.h"

int other_calls_cuMemGetInfo = 0;
int other_calls_getpid = 0;
/* Set while a wrapper runs: a second entry means RTLD_NEXT returned the wrapper itself. */
static __thread int depth;

static void *next(const char *name) {
    dlerror();
    void *p = dlsym(RTLD_NEXT, name);
    if (!p) {
        fprintf(stderr, "libother: dlsym(RTLD_NEXT, %s) failed: %s\n", name, dlerror());
        abort();
    }
    return p;
}

static void reentered(const char *name) {
    fprintf(stderr, "libother: %s re-entered: dlsym(RTLD_NEXT) returned libother's own %s\n", name,
            name);
    abort();
}

CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
    static PFN_cuMemGetInfo real;
    if (depth) reentered("cuMemGetInfo_v2");
    if (!real) real = (PFN_cuMemGetInfo)next("cuMemGetInfo_v2");
    if ((void *)real == (void *)cuMemGetInfo_v2) reentered("cuMemGetInfo_v2");
    __atomic_add_fetch(&other_calls_cuMemGetInfo, 1, __ATOMIC_RELAXED);
    depth++;
    CUresult rc = real(free, total);
    depth--;
    return rc;
}

pid_t getpid(void) {
    static pid_t (*real)(void);
    if (depth) reentered("getpid");
    if (!real) real = (pid_t(*)(void))next("getpid");
    if ((void *)real == (void *)getpid) reentered("getpid");
    __atomic_add_fetch(&other_calls_getpid, 1, __ATOMIC_RELAXED);
    depth++;
    pid_t p = real();
    depth--;
    return p;
}

/* What RTLD_NEXT gives libother for malloc (libc's). */
void *other_next_malloc(void) { return dlsym(RTLD_NEXT, "malloc"); }
