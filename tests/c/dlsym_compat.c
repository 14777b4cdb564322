/*
 * dlsym_compat: gpucap overrides dlsym; this checks that the override keeps dlsym's
 * contract for everyone else in the process.
 *
 *   dlsym_compat <capped|uncapped> <cap> <phys> <path of liblocal.so> <other|noother>
 *
 * Linked with -lcuda and -rdynamic (so main_marker is a global symbol). "other" means
 * libother.so is preloaded too (beside the shim, in either order); its wrappers of
 * cuMemGetInfo_v2 and getpid forward with dlsym(RTLD_NEXT).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fakecuda.h"

int main_marker = 7;

static size_t g_cap, g_phys;
static int g_capped;

static size_t expected_total(void) { return g_capped ? g_cap : g_phys; }

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s <capped|uncapped> <cap> <phys> <liblocal.so> <other|noother>\n",
                argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    g_capped = strcmp(argv[1], "capped") == 0;
    g_cap = parse_size(argv[2]);
    g_phys = parse_size(argv[3]);
    const char *liblocal = argv[4];
    int other = strcmp(argv[5], "other") == 0;

    MUST(cuInit(0));
    CUdevice dev;
    CUcontext ctx;
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuCtxCreate_v2(&ctx, 0, dev));

    /* ---- (i) another interposer, forwarding with RTLD_NEXT ---------------------- */
    int *calls_info = dlsym(RTLD_DEFAULT, "other_calls_cuMemGetInfo");
    int *calls_getpid = dlsym(RTLD_DEFAULT, "other_calls_getpid");
    CHECK(other ? (calls_info && calls_getpid) : (!calls_info && !calls_getpid),
          "libother's counters visible exactly when it is preloaded (%p %p)", (void *)calls_info,
          (void *)calls_getpid);

    size_t f = 0, t = 0;
    CUresult rc = cuMemGetInfo_v2(&f, &t);
    CHECK(rc == CUDA_SUCCESS && t == expected_total() && f == expected_total(),
          "cuMemGetInfo_v2 (through whichever interposer comes first) -> rc=%d free=%zu total=%zu, "
          "expected %zu",
          rc, f, t, expected_total());
    if (other) {
        printf("info libother saw %d cuMemGetInfo_v2 calls\n", *calls_info);
    }

    pid_t p1 = getpid();
    pid_t p2 = (pid_t)syscall(SYS_getpid);
    CHECK(p1 == p2, "getpid() = %d, the kernel says %d", (int)p1, (int)p2);
    if (other) {
        CHECK(*calls_getpid >= 1, "libother's getpid wrapper ran (%d calls)", *calls_getpid);
        void *(*next_malloc)(void) = (void *(*)(void))dlsym(RTLD_DEFAULT, "other_next_malloc");
        void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
        void *libc_malloc = libc ? dlsym(libc, "malloc") : NULL;
        CHECK(next_malloc && next_malloc() == libc_malloc && libc_malloc,
              "libother: dlsym(RTLD_NEXT, malloc) is libc's (%p)", libc_malloc);
    }

    /* The shim still caps while the other interposer is there. */
    CUdeviceptr d = 0;
    rc = cuMemAlloc_v2(&d, g_cap + MIB);
    CHECK(g_capped ? rc == CUDA_ERROR_OUT_OF_MEMORY : rc == CUDA_SUCCESS,
          "cuMemAlloc_v2(cap + 1 MiB) -> %d", rc);
    if (rc == CUDA_SUCCESS) cuMemFree_v2(d);

    /* ---- (ii) a RTLD_LOCAL plugin doing its own lookups ------------------------- */
    void *h = dlopen(liblocal, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("FATAL dlopen(%s): %s\n", liblocal, dlerror());
        return 3;
    }
    void *(*lookup_default)(const char *) = (void *(*)(const char *))dlsym(h, "local_lookup_default");
    void *(*lookup_next)(const char *) = (void *(*)(const char *))dlsym(h, "local_lookup_next");
    const char *(*lookup_error)(void *, const char *, void **) =
        (const char *(*)(void *, const char *, void **))dlsym(h, "local_lookup_error");
    int *local_only = dlsym(h, "local_only_symbol");
    if (!lookup_default || !lookup_next || !lookup_error || !local_only) {
        printf("FATAL liblocal exports missing\n");
        return 3;
    }
    CHECK(*local_only == 42, "dlsym(liblocal handle, local_only_symbol) -> %p", (void *)local_only);

    void *m = lookup_default("main_marker");
    CHECK(m == (void *)&main_marker, "liblocal: dlsym(RTLD_DEFAULT, main_marker) -> %p, expected %p",
          m, (void *)&main_marker);

    /* glibc searches the caller's own scope for RTLD_DEFAULT: the plugin sees itself... */
    void *lo = lookup_default("local_only_symbol");
    CHECK(lo == (void *)local_only,
          "liblocal: dlsym(RTLD_DEFAULT, local_only_symbol) -> %p, expected its own %p", lo,
          (void *)local_only);
    /* ...the main program does not. */
    dlerror();
    void *lo_main = dlsym(RTLD_DEFAULT, "local_only_symbol");
    const char *err = dlerror();
    CHECK(lo_main == NULL && err != NULL,
          "main: dlsym(RTLD_DEFAULT, local_only_symbol) of an RTLD_LOCAL library -> %p (dlerror %s)",
          lo_main, err ? err : "(null)");

    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    void *libc_malloc = libc ? dlsym(libc, "malloc") : NULL;
    void *nm = lookup_next("malloc");
    CHECK(nm != NULL && nm == libc_malloc, "liblocal: dlsym(RTLD_NEXT, malloc) -> %p, libc's is %p",
          nm, libc_malloc);
    void *nm_main = dlsym(RTLD_NEXT, "malloc");
    CHECK(nm_main != NULL && nm_main == libc_malloc, "main: dlsym(RTLD_NEXT, malloc) -> %p, libc's is %p",
          nm_main, libc_malloc);
    void *dm = lookup_default("malloc");
    CHECK(dm == libc_malloc, "liblocal: dlsym(RTLD_DEFAULT, malloc) -> %p, libc's is %p", dm,
          libc_malloc);

    /* The plugin looking the driver up globally gets the entry point everyone else calls. */
    PFN_cuMemAlloc alloc = (PFN_cuMemAlloc)lookup_default("cuMemAlloc_v2");
    PFN_cuMemFree release = (PFN_cuMemFree)lookup_default("cuMemFree_v2");
    CHECK(alloc != NULL && release != NULL, "liblocal: dlsym(RTLD_DEFAULT, cuMemAlloc_v2/cuMemFree_v2)");
    if (alloc && release) {
        rc = alloc(&d, g_cap + MIB);
        CHECK(g_capped ? rc == CUDA_ERROR_OUT_OF_MEMORY : rc == CUDA_SUCCESS,
              "liblocal's cuMemAlloc_v2(cap + 1 MiB) -> %d", rc);
        if (rc == CUDA_SUCCESS) release(d);
        rc = alloc(&d, MIB);
        CHECK(rc == CUDA_SUCCESS, "liblocal's cuMemAlloc_v2(1 MiB) -> %d", rc);
        if (rc == CUDA_SUCCESS) CHECK(release(d) == CUDA_SUCCESS, "liblocal's cuMemFree_v2");
    }

    /* ---- missing names and dlerror() ------------------------------------------- */
    void *out = NULL;
    const char *e;
    e = lookup_error(RTLD_DEFAULT, "no_such_symbol_gpucap", &out);
    CHECK(out == NULL && e != NULL, "dlsym(RTLD_DEFAULT, missing) -> %p, dlerror %s", out, e ? e : "(null)");
    e = lookup_error(RTLD_NEXT, "no_such_symbol_gpucap", &out);
    CHECK(out == NULL && e != NULL, "dlsym(RTLD_NEXT, missing) -> %p, dlerror %s", out, e ? e : "(null)");
    e = lookup_error(h, "no_such_symbol_gpucap", &out);
    CHECK(out == NULL && e != NULL, "dlsym(liblocal, missing) -> %p, dlerror %s", out, e ? e : "(null)");
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    CHECK(cuda != NULL, "libcuda.so.1 is loaded");
    e = lookup_error(cuda, "cuNoSuchFunction_gpucap", &out);
    CHECK(out == NULL && e != NULL, "dlsym(libcuda, missing cu* name) -> %p, dlerror %s", out,
          e ? e : "(null)");
    /* Successful lookups, hooked or not, leave no error behind (even right after a failure). */
    dlsym(RTLD_DEFAULT, "no_such_symbol_gpucap");
    e = lookup_error(cuda, "cuMemAlloc_v2", &out);
    CHECK(out != NULL && e == NULL, "dlsym(libcuda, cuMemAlloc_v2) -> %p, dlerror %s", out,
          e ? e : "(null)");
    e = lookup_error(cuda, "cuMemcpyHtoD_v2", &out);
    CHECK(out != NULL && e == NULL, "dlsym(libcuda, cuMemcpyHtoD_v2) -> %p, dlerror %s", out,
          e ? e : "(null)");
    e = lookup_error(RTLD_DEFAULT, "cuMemGetInfo_v2", &out);
    CHECK(out != NULL && e == NULL, "dlsym(RTLD_DEFAULT, cuMemGetInfo_v2) -> %p, dlerror %s", out,
          e ? e : "(null)");
    e = lookup_error(RTLD_DEFAULT, "main_marker", &out);
    CHECK(out == (void *)&main_marker && e == NULL, "dlsym(RTLD_DEFAULT, main_marker), dlerror %s",
          e ? e : "(null)");
#ifdef __x86_64__
    /* dlvsym of a versioned libc symbol still works. */
    void *vm = dlvsym(RTLD_NEXT, "malloc", "GLIBC_2.2.5");
    CHECK(vm == libc_malloc, "dlvsym(RTLD_NEXT, malloc, GLIBC_2.2.5) -> %p, libc's %p", vm, libc_malloc);
#endif

    dlclose(h);
    return finish();
}
