/*
 * intercept: proves that every way a program can reach the driver's memory entry
 * points lands in gpucap's hooks.
 *
 *   intercept <mode> <capped|uncapped> <cap> <phys>
 *
 * <cap> is GPUCAP_LIMIT (for GPU 0), <phys> is FAKECUDA_TOTAL_MEM (larger than the cap).
 * "capped" expects the shim to be preloaded: totals read the cap, allocations past
 * it are refused with CUDA_ERROR_OUT_OF_MEMORY, frees credit the ledger back.
 * "uncapped" is the control run without the shim: the same calls see the fake's
 * physical memory and the allocations past the cap succeed. Both modes must pass,
 * so a check that passes "capped" is due to the shim.
 *
 * Modes of the binary built with -DLINKED (and -lcuda):
 *   direct           the linked symbols cuMemAlloc_v2, ... (and the _ptsz variants)
 *   procaddr-linked  cuGetProcAddress/_v2 as linked symbols, and as returned by themselves
 * Modes of the binary built without (it only dlopens the driver):
 *   dlopen-so1       dlopen("libcuda.so.1") + dlsym(handle, ...)
 *   dlopen-so        dlopen("libcuda.so") + dlsym(handle, ...)
 *   dlopen-path=P    dlopen(P) (an absolute path, e.g. libcuda.so.570.86.10) + dlsym
 *   rtld-default     dlopen("libcuda.so.1", RTLD_GLOBAL) + dlsym(RTLD_DEFAULT, ...)
 *   procaddr         cuGetProcAddress/_v2 from dlsym(handle), and as returned by themselves
 *
 * Output: one "ok"/"FAIL" line per check, and "addr ..." lines that name where the
 * unhooked entry points live (library + offset), which the Rust test compares between
 * the run with and without the shim. Exit 0 when every check passed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>

#include "fakecuda.h"

static int g_capped;
static size_t g_cap, g_phys;
static void *g_cuda; /* handle of libcuda.so.1 */

/* Every entry point a suite exercises; NULL ones are skipped. */
typedef struct {
    const char *how;
    PFN_cuMemAlloc memAlloc;
    PFN_cuMemFree memFree;
    PFN_cuMemAllocPitch memAllocPitch;
    PFN_cuMemAllocManaged memAllocManaged;
    PFN_cuMemAllocAsync memAllocAsync;
    PFN_cuMemFreeAsync memFreeAsync;
    PFN_cuMemAllocFromPoolAsync memAllocFromPoolAsync;
    PFN_cuMemCreate memCreate;
    PFN_cuMemRelease memRelease;
    PFN_cuMemGetInfo memGetInfo;
    PFN_cuDeviceTotalMem deviceTotalMem;
} api_t;

/* Unhooked helpers, looked up once from the driver handle. */
static CUresult (*p_cuDeviceGet)(CUdevice *, int);
static CUresult (*p_cuCtxCreate)(CUcontext *, unsigned int, CUdevice);
static PFN_cuDeviceGetDefaultMemPool p_cuDeviceGetDefaultMemPool;
static CUresult (*p_cuMemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *,
                                                   CUmemAllocationGranularity_flags);
static CUresult (*p_cuStreamSynchronize)(CUstream);

static void cuMemFree_v2_via(CUdeviceptr d);

static void *must_sym(void *h, const char *name) {
    dlerror();
    void *p = dlsym(h, name);
    if (!p) {
        printf("FATAL dlsym(%s): %s\n", name, dlerror());
        exit(3);
    }
    return p;
}

static size_t expected_total(void) { return g_capped ? g_cap : g_phys; }

static size_t round_up(size_t v, size_t g) { return (v + g - 1) / g * g; }

/* The ledger is back to empty: free == total == cap (or the fake's own figures). */
static void check_empty(const api_t *a, const char *when) {
    if (!a->memGetInfo) return;
    size_t f = 0, t = 0;
    CUresult rc = a->memGetInfo(&f, &t);
    CHECK(rc == CUDA_SUCCESS && f == expected_total() && t == expected_total(),
          "%s: %s: cuMemGetInfo -> rc=%d free=%zu total=%zu, expected free=total=%zu", a->how,
          when, rc, f, t, expected_total());
}

static void check_free_is(const api_t *a, size_t want, const char *when) {
    if (!a->memGetInfo) return;
    size_t f = 0, t = 0;
    CUresult rc = a->memGetInfo(&f, &t);
    CHECK(rc == CUDA_SUCCESS && f == want, "%s: %s: cuMemGetInfo free=%zu, expected %zu (rc=%d)",
          a->how, when, f, want, rc);
}

/*
 * An allocation of `size` past the cap: refused with OUT_OF_MEMORY under the shim,
 * granted by the fake without it (then released with `release`).
 */
#define OVER_CAP(what, call, release)                                                          \
    do {                                                                                       \
        CUresult rc_ = (call);                                                                 \
        if (g_capped) {                                                                        \
            CHECK(rc_ == CUDA_ERROR_OUT_OF_MEMORY, "%s: %s past the cap -> %d, expected 2",    \
                  a->how, what, rc_);                                                          \
            if (rc_ == CUDA_SUCCESS) (void)(release);                                          \
        } else {                                                                               \
            CHECK(rc_ == CUDA_SUCCESS, "%s: %s past the cap without the shim -> %d, expected 0", \
                  a->how, what, rc_);                                                          \
            if (rc_ == CUDA_SUCCESS) (void)(release);                                          \
        }                                                                                      \
    } while (0)

static void run_suite(const api_t *a) {
    const size_t over = g_cap + g_cap / 2;
    const size_t half = g_cap / 2;
    CUdeviceptr d = 0, d2 = 0;
    CUresult rc;

    if (a->deviceTotalMem) {
        size_t t = 0;
        rc = a->deviceTotalMem(&t, 0);
        CHECK(rc == CUDA_SUCCESS && t == expected_total(),
              "%s: cuDeviceTotalMem -> rc=%d %zu, expected %zu", a->how, rc, t, expected_total());
    }
    check_empty(a, "at start");

    if (a->memAlloc && a->memFree) {
        OVER_CAP("cuMemAlloc", a->memAlloc(&d, over), a->memFree(d));
        rc = a->memAlloc(&d, half);
        CHECK(rc == CUDA_SUCCESS, "%s: cuMemAlloc(cap/2) -> %d", a->how, rc);
        if (rc == CUDA_SUCCESS) {
            check_free_is(a, expected_total() - half, "after cuMemAlloc(cap/2)");
            /* The second half plus 1 MiB does not fit any more. */
            OVER_CAP("second cuMemAlloc", a->memAlloc(&d2, half + MIB), a->memFree(d2));
            rc = a->memFree(d);
            CHECK(rc == CUDA_SUCCESS, "%s: cuMemFree -> %d", a->how, rc);
        }
        check_empty(a, "after cuMemAlloc/cuMemFree");
    }

    if (a->memAllocPitch && a->memFree) {
        size_t pitch = 0;
        size_t width = MIB, height = over / MIB;
        OVER_CAP("cuMemAllocPitch", a->memAllocPitch(&d, &pitch, width, height, 4), a->memFree(d));
        rc = a->memAllocPitch(&d, &pitch, width, 16, 4);
        CHECK(rc == CUDA_SUCCESS && pitch >= width, "%s: cuMemAllocPitch(1 MiB x 16) -> %d pitch %zu",
              a->how, rc, pitch);
        if (rc == CUDA_SUCCESS) {
            check_free_is(a, expected_total() - pitch * 16, "after cuMemAllocPitch");
            CHECK(a->memFree(d) == CUDA_SUCCESS, "%s: cuMemFree(pitched)", a->how);
        }
        /* A width the driver pads: what is charged is pitch x height, what the driver took. */
        rc = a->memAllocPitch(&d, &pitch, 1000, 1024, 4);
        CHECK(rc == CUDA_SUCCESS && pitch >= 1000, "%s: cuMemAllocPitch(1000 x 1024) -> %d pitch %zu",
              a->how, rc, pitch);
        if (rc == CUDA_SUCCESS) {
            check_free_is(a, expected_total() - pitch * 1024, "after cuMemAllocPitch(1000 x 1024)");
            CHECK(a->memFree(d) == CUDA_SUCCESS, "%s: cuMemFree(pitched)", a->how);
        }
        check_empty(a, "after cuMemAllocPitch/cuMemFree");
    }

    if (a->memAllocManaged && a->memFree) {
        OVER_CAP("cuMemAllocManaged", a->memAllocManaged(&d, over, CU_MEM_ATTACH_GLOBAL),
                 a->memFree(d));
        rc = a->memAllocManaged(&d, half, CU_MEM_ATTACH_GLOBAL);
        CHECK(rc == CUDA_SUCCESS, "%s: cuMemAllocManaged(cap/2) -> %d", a->how, rc);
        if (rc == CUDA_SUCCESS) {
            check_free_is(a, expected_total() - half, "after cuMemAllocManaged");
            CHECK(a->memFree(d) == CUDA_SUCCESS, "%s: cuMemFree(managed)", a->how);
        }
        check_empty(a, "after cuMemAllocManaged/cuMemFree");
    }

    if (a->memAllocAsync && a->memFreeAsync) {
        /* Stream-ordered frees return memory to the pool; the pool (release threshold 0)
         * gives it back to the device at the next synchronisation. */
        OVER_CAP("cuMemAllocAsync", a->memAllocAsync(&d, over, NULL),
                 (a->memFreeAsync(d, NULL), p_cuStreamSynchronize(NULL)));
        rc = a->memAllocAsync(&d, half, NULL);
        CHECK(rc == CUDA_SUCCESS, "%s: cuMemAllocAsync(cap/2) -> %d", a->how, rc);
        if (rc == CUDA_SUCCESS) {
            check_free_is(a, expected_total() - half, "after cuMemAllocAsync");
            rc = a->memFreeAsync(d, NULL);
            CHECK(rc == CUDA_SUCCESS, "%s: cuMemFreeAsync -> %d", a->how, rc);
            p_cuStreamSynchronize(NULL);
        }
        check_empty(a, "after cuMemAllocAsync/cuMemFreeAsync");
    }

    /* cuMemFreeAsync credits the ledger: 3/4 of the cap fits twice in a row only then. */
    if (a->memAlloc && a->memFree && a->memFreeAsync) {
        size_t big = g_cap / 4 * 3;
        rc = a->memAlloc(&d, big);
        CHECK(rc == CUDA_SUCCESS, "%s: cuMemAlloc(3/4 cap) -> %d", a->how, rc);
        if (rc == CUDA_SUCCESS) {
            rc = a->memFreeAsync(d, NULL);
            CHECK(rc == CUDA_SUCCESS, "%s: cuMemFreeAsync(3/4 cap) -> %d", a->how, rc);
            p_cuStreamSynchronize(NULL);
            rc = a->memAlloc(&d, big);
            CHECK(rc == CUDA_SUCCESS,
                  "%s: cuMemAlloc(3/4 cap) after cuMemFreeAsync of the first -> %d (was it credited?)",
                  a->how, rc);
            if (rc == CUDA_SUCCESS) a->memFree(d);
        }
        check_empty(a, "after cuMemFreeAsync credit");
    }

    if (a->memAllocFromPoolAsync && a->memFreeAsync) {
        CUmemoryPool pool = NULL;
        rc = p_cuDeviceGetDefaultMemPool(&pool, 0);
        CHECK(rc == CUDA_SUCCESS, "%s: cuDeviceGetDefaultMemPool -> %d", a->how, rc);
        OVER_CAP("cuMemAllocFromPoolAsync", a->memAllocFromPoolAsync(&d, over, pool, NULL),
                 (a->memFreeAsync(d, NULL), p_cuStreamSynchronize(NULL)));
        rc = a->memAllocFromPoolAsync(&d, half, pool, NULL);
        CHECK(rc == CUDA_SUCCESS, "%s: cuMemAllocFromPoolAsync(cap/2) -> %d", a->how, rc);
        if (rc == CUDA_SUCCESS) {
            check_free_is(a, expected_total() - half, "after cuMemAllocFromPoolAsync");
            CHECK(a->memFreeAsync(d, NULL) == CUDA_SUCCESS, "%s: cuMemFreeAsync(pool)", a->how);
            p_cuStreamSynchronize(NULL);
        }
        check_empty(a, "after cuMemAllocFromPoolAsync/cuMemFreeAsync");
    }

    if (a->memCreate && a->memRelease) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        size_t gran = 0;
        MUST(p_cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        CUmemGenericAllocationHandle h = 0;
        OVER_CAP("cuMemCreate", a->memCreate(&h, round_up(over, gran), &prop, 0), a->memRelease(h));
        size_t hs = round_up(half, gran);
        rc = a->memCreate(&h, hs, &prop, 0);
        CHECK(rc == CUDA_SUCCESS, "%s: cuMemCreate(cap/2) -> %d", a->how, rc);
        if (rc == CUDA_SUCCESS) {
            check_free_is(a, expected_total() - hs, "after cuMemCreate");
            CHECK(a->memRelease(h) == CUDA_SUCCESS, "%s: cuMemRelease", a->how);
        }
        check_empty(a, "after cuMemCreate/cuMemRelease");
    }
}

/* ---- cuGetProcAddress ----------------------------------------------------- */

typedef struct {
    const char *how;
    void *fn;
    int v2; /* cuGetProcAddress_v2 signature */
} getter_t;

static CUresult lookup(const getter_t *g, const char *sym, void **pfn, int ver, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *status) {
    *pfn = NULL;
    *status = (CUdriverProcAddressQueryResult)-1;
    if (g->v2) return ((PFN_cuGetProcAddress_v2)g->fn)(sym, pfn, ver, flags, status);
    CUresult rc = ((PFN_cuGetProcAddress)g->fn)(sym, pfn, ver, flags);
    *status = rc == CUDA_SUCCESS ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return rc;
}

/* Looks `sym` up and checks it exists exactly from `since` on. */
static void *lookup_checked(const getter_t *g, const char *sym, int ver, cuuint64_t flags,
                            int since) {
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    CUresult rc = lookup(g, sym, &p, ver, flags, &st);
    if (ver >= since) {
        CHECK(rc == CUDA_SUCCESS && p != NULL && st == CU_GET_PROC_ADDRESS_SUCCESS,
              "%s(%s, %d, %llu) -> rc=%d pfn=%p status=%d", g->how, sym, ver,
              (unsigned long long)flags, rc, p, (int)st);
    } else {
        /* _v2 answers with the status (CUDA_SUCCESS, as CUDA 13.0 does); the status-less
         * cuGetProcAddress with CUDA_ERROR_NOT_FOUND. */
        CHECK(rc == (g->v2 ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND) && p == NULL &&
                  (!g->v2 || st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT),
              "%s(%s, %d, %llu) before %d -> rc=%d pfn=%p status=%d, expected 0 (_v2) or 500, NULL, "
              "VERSION_NOT_SUFFICIENT",
              g->how, sym, ver, (unsigned long long)flags, since, rc, p, (int)st);
    }
    return p;
}

/* Failed lookups: the driver's error, and no hook written to *pfn. */
static void procaddr_errors(const getter_t *g) {
    void *p = (void *)1;
    CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)-1;
    CUresult rc;
#define CALL(sym, pp, ver, fl, stp)                                                           \
    (g->v2 ? ((PFN_cuGetProcAddress_v2)g->fn)(sym, pp, ver, fl, stp)                         \
           : ((PFN_cuGetProcAddress)g->fn)(sym, pp, ver, fl))
    rc = CALL("cuNoSuchFunction_gpucap", &p, 12000, 0, &st);
    CHECK(rc == (g->v2 ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND) && p == NULL &&
              (!g->v2 || st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND),
          "%s(missing name) -> rc=%d pfn=%p status=%d", g->how, rc, p, (int)st);
    p = (void *)1;
    rc = CALL("cuMemAlloc", &p, 99990, 0, &st); /* newer than the driver */
    CHECK(rc == CUDA_ERROR_INVALID_VALUE && p == NULL,
          "%s(cuMemAlloc, 99990) -> rc=%d pfn=%p (newer than the driver)", g->how, rc, p);
    p = (void *)1;
    rc = CALL("cuMemAlloc", &p, 12000, 8, &st); /* undefined flag bit */
    CHECK(rc == CUDA_ERROR_INVALID_VALUE && p == NULL,
          "%s(cuMemAlloc, bad flags) -> rc=%d pfn=%p (no hook handed out on error)", g->how, rc, p);
    p = (void *)1;
    rc = CALL("cuMemAllocAsync", &p, 11010, 0, &st); /* older than the function */
    CHECK(rc == (g->v2 ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND) && p == NULL,
          "%s(cuMemAllocAsync, 11010) -> rc=%d pfn=%p", g->how, rc, p);
    rc = CALL("cuMemAlloc", NULL, 12000, 0, &st);
    CHECK(rc == CUDA_ERROR_INVALID_VALUE, "%s(cuMemAlloc, pfn NULL) -> rc=%d", g->how, rc);
    p = (void *)1;
    rc = CALL(NULL, &p, 12000, 0, &st);
    CHECK(rc == CUDA_ERROR_INVALID_VALUE, "%s(symbol NULL) -> rc=%d", g->how, rc);
    if (g->v2) {
        /* symbolStatus may be NULL. */
        p = NULL;
        rc = CALL("cuMemAlloc", &p, 12000, 0, NULL);
        CHECK(rc == CUDA_SUCCESS && p != NULL, "%s(cuMemAlloc, status NULL) -> rc=%d pfn=%p", g->how, rc, p);
        if (p) {
            CUdeviceptr d;
            rc = ((PFN_cuMemAlloc)p)(&d, g_cap + MIB);
            CHECK(g_capped ? rc == CUDA_ERROR_OUT_OF_MEMORY : rc == CUDA_SUCCESS,
                  "%s: cuMemAlloc (status NULL) past the cap -> %d", g->how, rc);
            if (rc == CUDA_SUCCESS) cuMemFree_v2_via(d);
        }
    }
#undef CALL
}

/* Names where an address lives: "libcuda.so+0x1234" (basename of the object + offset). */
static void describe(void *p, char *buf, size_t n) {
    Dl_info info;
    if (!p || !dladdr(p, &info) || !info.dli_fname) {
        snprintf(buf, n, "%p(unknown)", p);
        return;
    }
    const char *base = strrchr(info.dli_fname, '/');
    base = base ? base + 1 : info.dli_fname;
    snprintf(buf, n, "%s+0x%lx", base, (unsigned long)((char *)p - (char *)info.dli_fbase));
}

static int in_fake_driver(void *p) {
    Dl_info info, mine;
    void *anchor = dlsym(g_cuda, "cuDriverGetVersion");
    return p && anchor && dladdr(p, &info) && dladdr(anchor, &mine) &&
           info.dli_fbase == mine.dli_fbase;
}

static const int VERSIONS[] = {3020, 11030, 12000, 12080};
static const cuuint64_t FLAGS[] = {CU_GET_PROC_ADDRESS_DEFAULT,
                                   CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM};

static void procaddr_suite(const getter_t *g) {
    char how[256];
    procaddr_errors(g);
    for (size_t vi = 0; vi < sizeof VERSIONS / sizeof *VERSIONS; vi++) {
        for (size_t fi = 0; fi < sizeof FLAGS / sizeof *FLAGS; fi++) {
            int ver = VERSIONS[vi];
            cuuint64_t fl = FLAGS[fi];
            snprintf(how, sizeof how, "%s@%d/flags=%llu", g->how, ver, (unsigned long long)fl);
            getter_t gv = *g;
            gv.how = how;
            api_t a = {.how = how};
            a.memAlloc = (PFN_cuMemAlloc)lookup_checked(&gv, "cuMemAlloc", ver, fl, 2000);
            a.memFree = (PFN_cuMemFree)lookup_checked(&gv, "cuMemFree", ver, fl, 2000);
            a.memAllocPitch = (PFN_cuMemAllocPitch)lookup_checked(&gv, "cuMemAllocPitch", ver, fl, 2000);
            a.memAllocManaged =
                (PFN_cuMemAllocManaged)lookup_checked(&gv, "cuMemAllocManaged", ver, fl, 6000);
            a.memAllocAsync = (PFN_cuMemAllocAsync)lookup_checked(&gv, "cuMemAllocAsync", ver, fl, 11020);
            a.memFreeAsync = (PFN_cuMemFreeAsync)lookup_checked(&gv, "cuMemFreeAsync", ver, fl, 11020);
            a.memAllocFromPoolAsync = (PFN_cuMemAllocFromPoolAsync)lookup_checked(
                &gv, "cuMemAllocFromPoolAsync", ver, fl, 11020);
            a.memCreate = (PFN_cuMemCreate)lookup_checked(&gv, "cuMemCreate", ver, fl, 10020);
            a.memRelease = (PFN_cuMemRelease)lookup_checked(&gv, "cuMemRelease", ver, fl, 10020);
            a.memGetInfo = (PFN_cuMemGetInfo)lookup_checked(&gv, "cuMemGetInfo", ver, fl, 2000);
            a.deviceTotalMem =
                (PFN_cuDeviceTotalMem)lookup_checked(&gv, "cuDeviceTotalMem", ver, fl, 2000);
            run_suite(&a);

            /* An entry point gpucap does not hook: exactly the driver's own pointer. */
            void *p = lookup_checked(&gv, "cuMemcpyHtoD", ver, fl, 2000);
            const char *export = (fl == CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM && ver >= 7000)
                                     ? "cuMemcpyHtoD_v2_ptds"
                                     : "cuMemcpyHtoD_v2";
            void *real = dlsym(g_cuda, export);
            char where[256];
            describe(p, where, sizeof where);
            CHECK(p != NULL && p == real && in_fake_driver(p),
                  "%s: unhooked cuMemcpyHtoD -> %s (%p), dlsym(libcuda, %s) -> %p", how, where, p,
                  export, real);
            printf("addr %s cuMemcpyHtoD %d %llu %s\n", g->how, ver, (unsigned long long)fl, where);

            /* Hooked ones, for the record (not asserted: where a hook lives is the shim's business). */
            char w2[256];
            describe((void *)a.memAlloc, w2, sizeof w2);
            printf("info %s: cuMemAlloc -> %s\n", how, w2);
        }
    }

    /* cuGetProcAddress("cuGetProcAddress") hands out a getter that still substitutes hooks. */
    for (size_t fi = 0; fi < sizeof FLAGS / sizeof *FLAGS; fi++) {
        cuuint64_t fl = FLAGS[fi];
        struct {
            int ver;
            int v2;
        } self[] = {{11030, 0}, {12000, 1}, {12080, 1}};
        for (size_t i = 0; i < sizeof self / sizeof *self; i++) {
            void *w = lookup_checked(g, "cuGetProcAddress", self[i].ver, fl, 11030);
            if (!w) continue;
            snprintf(how, sizeof how, "%s->cuGetProcAddress@%d/flags=%llu", g->how, self[i].ver,
                     (unsigned long long)fl);
            getter_t inner = {how, w, self[i].v2};
            /* Asked again, twice over. */
            for (int depth = 0; depth < 2; depth++) {
                api_t a = {.how = inner.how};
                a.memAlloc = (PFN_cuMemAlloc)lookup_checked(&inner, "cuMemAlloc", 12000, 0, 2000);
                a.memFree = (PFN_cuMemFree)lookup_checked(&inner, "cuMemFree", 12000, 0, 2000);
                a.memGetInfo = (PFN_cuMemGetInfo)lookup_checked(&inner, "cuMemGetInfo", 12000, 0, 2000);
                a.memAllocAsync =
                    (PFN_cuMemAllocAsync)lookup_checked(&inner, "cuMemAllocAsync", 12000, 2, 11020);
                a.memFreeAsync =
                    (PFN_cuMemFreeAsync)lookup_checked(&inner, "cuMemFreeAsync", 12000, 2, 11020);
                a.deviceTotalMem =
                    (PFN_cuDeviceTotalMem)lookup_checked(&inner, "cuDeviceTotalMem", 12000, 0, 2000);
                run_suite(&a);
                void *p = lookup_checked(&inner, "cuMemcpyHtoD", 12000, 0, 2000);
                CHECK(p != NULL && p == dlsym(g_cuda, "cuMemcpyHtoD_v2"),
                      "%s: unhooked cuMemcpyHtoD is the driver's own", inner.how);
                void *again = lookup_checked(&inner, "cuGetProcAddress", 12000, 0, 11030);
                if (!again) break;
                static char how2[300];
                snprintf(how2, sizeof how2, "%s->cuGetProcAddress@12000", inner.how);
                inner.how = how2;
                inner.fn = again;
                inner.v2 = 1;
            }
        }
    }
}

/* ---- modes ------------------------------------------------------------------ */

/* Frees through dlsym(libcuda, "cuMemFree_v2") (the hook under the shim). */
static void cuMemFree_v2_via(CUdeviceptr d) {
    PFN_cuMemFree f = (PFN_cuMemFree)must_sym(g_cuda, "cuMemFree_v2");
    MUST(f(d));
}

static void setup(void *h, PFN_cuInit init) {
    p_cuDeviceGet = must_sym(h, "cuDeviceGet");
    p_cuCtxCreate = must_sym(h, "cuCtxCreate_v2");
    p_cuDeviceGetDefaultMemPool = must_sym(h, "cuDeviceGetDefaultMemPool");
    p_cuMemGetAllocationGranularity = must_sym(h, "cuMemGetAllocationGranularity");
    p_cuStreamSynchronize = must_sym(h, "cuStreamSynchronize");
    MUST(init(0));
    CUdevice dev;
    CUcontext ctx;
    MUST(p_cuDeviceGet(&dev, 0));
    MUST(p_cuCtxCreate(&ctx, 0, dev));
}

static void dlsym_suite(void *h, const char *how, int ptsz) {
    api_t a = {.how = how};
    a.memAlloc = must_sym(h, "cuMemAlloc_v2");
    a.memFree = must_sym(h, "cuMemFree_v2");
    a.memAllocPitch = must_sym(h, "cuMemAllocPitch_v2");
    a.memAllocManaged = must_sym(h, "cuMemAllocManaged");
    a.memAllocAsync = must_sym(h, ptsz ? "cuMemAllocAsync_ptsz" : "cuMemAllocAsync");
    a.memFreeAsync = must_sym(h, ptsz ? "cuMemFreeAsync_ptsz" : "cuMemFreeAsync");
    a.memAllocFromPoolAsync =
        must_sym(h, ptsz ? "cuMemAllocFromPoolAsync_ptsz" : "cuMemAllocFromPoolAsync");
    a.memCreate = must_sym(h, "cuMemCreate");
    a.memRelease = must_sym(h, "cuMemRelease");
    a.memGetInfo = must_sym(h, "cuMemGetInfo_v2");
    a.deviceTotalMem = must_sym(h, "cuDeviceTotalMem_v2");
    run_suite(&a);
}

/* dlsym of names that do not exist: NULL, and dlerror() says why. */
static void check_missing(void *h, const char *how) {
    dlerror();
    void *p = dlsym(h, "cuNoSuchFunction_gpucap_test");
    const char *err = dlerror();
    CHECK(p == NULL && err != NULL, "%s: dlsym(missing) -> %p, dlerror=%s", how, p,
          err ? err : "(null)");
}

/* dlsym of an unhooked name: the driver's own function. */
static void check_unhooked_dlsym(void *h, const char *how) {
    void *p = dlsym(h, "cuMemcpyHtoD_v2");
    char where[256];
    describe(p, where, sizeof where);
    CHECK(in_fake_driver(p), "%s: dlsym(cuMemcpyHtoD_v2) -> %s is the driver's", how, where);
    printf("addr %s cuMemcpyHtoD_v2 %s\n", how, where);
}

#ifdef LINKED
static void mode_direct(void) {
    MUST(cuInit(0));
    CUdevice dev;
    CUcontext ctx;
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuCtxCreate_v2(&ctx, 0, dev));
    api_t a = {
        .how = "linked",
        .memAlloc = cuMemAlloc_v2,
        .memFree = cuMemFree_v2,
        .memAllocPitch = cuMemAllocPitch_v2,
        .memAllocManaged = cuMemAllocManaged,
        .memAllocAsync = cuMemAllocAsync,
        .memFreeAsync = cuMemFreeAsync,
        .memAllocFromPoolAsync = cuMemAllocFromPoolAsync,
        .memCreate = cuMemCreate,
        .memRelease = cuMemRelease,
        .memGetInfo = cuMemGetInfo_v2,
        .deviceTotalMem = cuDeviceTotalMem_v2,
    };
    run_suite(&a);
    api_t b = a;
    b.how = "linked-ptsz";
    b.memAllocAsync = cuMemAllocAsync_ptsz;
    b.memFreeAsync = cuMemFreeAsync_ptsz;
    b.memAllocFromPoolAsync = cuMemAllocFromPoolAsync_ptsz;
    run_suite(&b);

    /* Plain calls too (not through pointers taken by the program). */
    CUdeviceptr d;
    size_t f, t;
    CUresult rc = cuMemAlloc_v2(&d, g_cap + MIB);
    CHECK(g_capped ? rc == CUDA_ERROR_OUT_OF_MEMORY : rc == CUDA_SUCCESS,
          "linked call cuMemAlloc_v2(cap + 1 MiB) -> %d", rc);
    if (rc == CUDA_SUCCESS) cuMemFree_v2(d);
    rc = cuMemGetInfo_v2(&f, &t);
    CHECK(rc == CUDA_SUCCESS && t == expected_total() && f == expected_total(),
          "linked call cuMemGetInfo_v2 -> %zu/%zu", f, t);
}
#endif

int main(int argc, char **argv) {
    if (argc != 5 || (strcmp(argv[2], "capped") && strcmp(argv[2], "uncapped"))) {
        fprintf(stderr, "usage: %s <mode> <capped|uncapped> <cap> <phys>\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1];
    g_capped = strcmp(argv[2], "capped") == 0;
    g_cap = parse_size(argv[3]);
    g_phys = parse_size(argv[4]);
    setvbuf(stdout, NULL, _IOLBF, 0);

#ifdef LINKED
    /* Already loaded as a dependency: this only returns its handle. */
    g_cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!g_cuda) {
        printf("FATAL libcuda.so.1 is not loaded: %s\n", dlerror());
        return 3;
    }
    setup(g_cuda, cuInit);
    if (strcmp(mode, "direct") == 0) {
        mode_direct();
        /* The already linked library's handle answers dlsym with the hooks too. */
        dlsym_suite(g_cuda, "dlsym(linked libcuda)", 0);
        dlsym_suite(g_cuda, "dlsym(linked libcuda)-ptsz", 1);
        dlsym_suite(RTLD_DEFAULT, "dlsym(RTLD_DEFAULT, linked)", 0);
        check_missing(g_cuda, "linked libcuda");
        check_unhooked_dlsym(g_cuda, "linked libcuda");
    } else if (strcmp(mode, "procaddr-linked") == 0) {
        getter_t g1 = {"linked cuGetProcAddress", (void *)cuGetProcAddress, 0};
        getter_t g2 = {"linked cuGetProcAddress_v2", (void *)cuGetProcAddress_v2, 1};
        procaddr_suite(&g1);
        procaddr_suite(&g2);
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
#else
    if (strcmp(mode, "dlopen-so1") == 0 || strcmp(mode, "dlopen-so") == 0 ||
        strncmp(mode, "dlopen-path=", 12) == 0) {
        const char *name = strcmp(mode, "dlopen-so1") == 0 ? "libcuda.so.1"
                           : strcmp(mode, "dlopen-so") == 0 ? "libcuda.so"
                                                            : mode + 12;
        void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            printf("FATAL dlopen(%s): %s\n", name, dlerror());
            return 3;
        }
        g_cuda = h;
        setup(h, (PFN_cuInit)must_sym(h, "cuInit"));
        char how[512];
        snprintf(how, sizeof how, "dlsym(%s)", name);
        dlsym_suite(h, how, 0);
        snprintf(how, sizeof how, "dlsym(%s)-ptsz", name);
        dlsym_suite(h, how, 1);
        check_missing(h, name);
        check_unhooked_dlsym(h, name);
        /* A second handle to the same library behaves the same. */
        void *h2 = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        CHECK(h2 != NULL, "dlopen(libcuda.so.1, RTLD_NOLOAD) after dlopen(%s)", name);
        if (h2) dlsym_suite(h2, "dlsym(RTLD_NOLOAD handle)", 0);
    } else if (strcmp(mode, "rtld-default") == 0) {
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
        if (!h) {
            printf("FATAL dlopen: %s\n", dlerror());
            return 3;
        }
        g_cuda = h;
        setup(h, (PFN_cuInit)must_sym(RTLD_DEFAULT, "cuInit"));
        dlsym_suite(RTLD_DEFAULT, "dlsym(RTLD_DEFAULT)", 0);
        check_missing(RTLD_DEFAULT, "RTLD_DEFAULT");
        check_unhooked_dlsym(RTLD_DEFAULT, "RTLD_DEFAULT");
    } else if (strcmp(mode, "procaddr") == 0) {
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            printf("FATAL dlopen: %s\n", dlerror());
            return 3;
        }
        g_cuda = h;
        setup(h, (PFN_cuInit)must_sym(h, "cuInit"));
        getter_t g1 = {"dlsym cuGetProcAddress", must_sym(h, "cuGetProcAddress"), 0};
        getter_t g2 = {"dlsym cuGetProcAddress_v2", must_sym(h, "cuGetProcAddress_v2"), 1};
        procaddr_suite(&g1);
        procaddr_suite(&g2);
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
#endif
    return finish();
}
