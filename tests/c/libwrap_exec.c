/*
 * libwrap_exec.so: a library preloaded before the shim that wraps execve the classic way,
 * forwarding to dlsym(RTLD_NEXT, "execve") (the shim's, which must then call the C
 * library's, not this wrapper again: a depth past 3 aborts). tests/cap/process_tree.rs.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>

static __thread int depth;

int execve(const char *path, char *const argv[], char *const envp[]) {
    if (++depth > 3) abort();
    int (*next)(const char *, char *const[], char *const[]) =
        (int (*)(const char *, char *const[], char *const[]))dlsym(RTLD_NEXT, "execve");
    int rc = next ? next(path, argv, envp) : -1;
    depth--;
    return rc;
}
