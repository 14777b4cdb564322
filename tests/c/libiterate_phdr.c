/*
 * libiterate_phdr.so: a library preloaded before the shim that interposes on
 * dl_iterate_phdr the classic way (a profiler's, an unwinder's), finding the C library's
 * with dlsym(RTLD_NEXT) at its first call. The shim's dlsym must not need
 * dl_iterate_phdr to answer it: the two would call each other until the stack ran out.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stddef.h>

typedef int (*each_fn)(struct dl_phdr_info *, size_t, void *);

static int calls;

/* How many calls the interposer saw. */
int iterate_phdr_calls(void) { return calls; }

int dl_iterate_phdr(each_fn each, void *data) {
    static int (*real)(each_fn, void *);
    if (!real) real = (int (*)(each_fn, void *))dlsym(RTLD_NEXT, "dl_iterate_phdr");
    calls++;
    return real ? real(each, data) : 0;
}
