/*
 * liblocal.so: a plugin that dlsym_compat dlopens with RTLD_LOCAL. Its lookups go
 * through whatever dlsym the process has (gpucap's override under the shim), and
 * glibc resolves RTLD_DEFAULT/RTLD_NEXT relative to the CALLER: these helpers make
 * the caller a library other than the shim and the main program.
 */
#define _GNU_SOURCE
#include <dlfcn.h>

/* Visible only through liblocal's own scope (it is loaded RTLD_LOCAL). */
int local_only_symbol = 42;

void *local_lookup_default(const char *name) { return dlsym(RTLD_DEFAULT, name); }
void *local_lookup_next(const char *name) { return dlsym(RTLD_NEXT, name); }
/* dlerror() right after a lookup, so the caller sees this library's lookup's error state. */
const char *local_lookup_error(void *handle, const char *name, void **out) {
    dlerror();
    *out = dlsym(handle, name);
    return dlerror();
}
