/*
 * escapes: ways users took the driver past gpucap's cap, each as the user hit it.
 * Every check states what must hold UNDER THE CAP; run without the shim (the control)
 * the program must fail, which shows the escape is real.
 *
 *   escapes <mode> <cap0> [<cap1>]
 *
 * VMM (one GPU, cap <cap0>, 2 MiB granularity):
 *   vmm-idiom      NVIDIA's documented idiom, cuMemCreate -> cuMemAddressReserve ->
 *                  cuMemMap -> cuMemSetAccess -> cuMemRelease at once, 8 times
 *                  <cap0>/2: the mapping keeps the memory, so the third cuMemCreate is
 *                  refused; the last cuMemUnmap of a handle credits it.
 *   vmm-aliases    one handle mapped at two addresses and released: charged until the
 *                  second mapping goes.
 *   vmm-retain     cuMemRetainAllocationHandle adds a reference: release and unmap leave
 *                  it charged until that reference is released too.
 *   vmm-unmap-many one cuMemUnmap over two mappings credits both handles; a cuMemUnmap
 *                  the driver refuses (half a mapping) credits nothing;
 *                  cuMemAddressFree of a range still mapped (the fake unmaps it)
 *                  credits the released handle mapped there.
 *   array-mapping  (cap <cap0>) handles of a quarter of the cap mapped into a
 *                  deferred-mapping array's level and a sparse mipmapped array's mip tail
 *                  (cuMemMapArrayAsync) and released: charged while mapped (3/4 of the cap
 *                  refused); an unmapping, or the array's end, frees each.
 *   no-context-thread (cap <cap0>) a thread with no current context (a loader's worker
 *                  thread: PyTorch's expandable segments) makes handles of <cap0>/2 with
 *                  cuMemCreate: the location names the GPU, the driver needs no context,
 *                  so the third is refused; then the main thread, its context popped,
 *                  allocates <cap0>/2 with cuMemAllocAsync on a stream of GPU 0 (the
 *                  stream names the GPU): the third refused too.
 * Pools:
 *   pool-other-gpu (2 GPUs, caps <cap0> <cap1>) GPU 0's context current, GPU 1's
 *                  default pool from cuDeviceGetDefaultMemPool(&p, 1): allocations of
 *                  <cap1> from it are charged to GPU 1 (the second is refused), never to
 *                  GPU 0; a pool created on GPU 1 likewise, and cuMemAllocAsync on a
 *                  stream of GPU 1 (GPU 1's current pool). A handle that is no pool
 *                  gets the driver's own error.
 *   pool-free-then-destroy / pool-destroy-then-free
 *                  (cap <cap0>) <cap0>/2 from a created pool freed with cuMemFree_v2
 *                  (legal for stream-ordered memory) and the pool destroyed, in either
 *                  order, with no trim or synchronisation: the driver holds nothing, so
 *                  a later cuMemAlloc_v2 of 3/4 of the cap succeeds.
 * The driver's pages:
 *   page-rounding  (cap <cap0>) the cap filled with cuMemAlloc_v2 blocks of 2 MiB + 4 KiB,
 *                  then 1 MiB + 4 KiB, then 3 MiB + 1 byte, then cuMemAllocPitch_v2 rows
 *                  of 2 MiB + 4 KiB, each until one is refused: what was asked stays
 *                  within the cap, and once all is freed 3/4 of the cap fits. The real
 *                  driver takes whole 2 MiB pages for each (an H200: 4 MiB for 3 MiB +
 *                  1 byte), as the fake does: the test reads the fake's own figure.
 * Modules:
 *   module-globals (cap <cap0>) a module whose __device__ global takes 5/8 of the cap
 *                  (cuModuleLoadData, PTX): charged while loaded, so a cuMemAlloc_v2 of
 *                  half the cap and a second such module are refused; cuModuleUnload
 *                  gives it back; one loaded in a created context is given back when
 *                  that context is destroyed, one in the primary context at its last
 *                  release.
 * Limits:
 *   stack-limit    (cap <cap0>) cuCtxSetLimit(CU_LIMIT_STACK_SIZE) raised so that the
 *                  stack takes over half the cap (each 512 bytes more per thread take
 *                  512 x SMs x threads per SM: 132 MiB on an H100 or the fake): charged,
 *                  so a cuMemAlloc_v2 of half the cap is refused; a stack the cap cannot
 *                  take is refused with CUDA_ERROR_OUT_OF_MEMORY and the old value kept;
 *                  lowering it gives the memory back (raised and lowered three times,
 *                  charged once); a created context's stack goes with that context, the
 *                  primary context's with its last release.
 *   local-stack    (cap <cap0> = 2 GiB) a module's kernels whose threads take 4 KiB and
 *                  8 KiB of local memory: the driver grows the context's stack to what a
 *                  launched kernel takes (as cuCtxSetLimit would: 792 and 1848 MiB on an
 *                  H100 or the fake) and keeps it. With half the cap allocated the 4 KiB
 *                  kernel's launch is charged its stack (512 MiB more refused); the 8 KiB
 *                  one's is refused with CUDA_ERROR_OUT_OF_MEMORY before the driver grows
 *                  anything (the stack stays 4 KiB); with the half freed it is served;
 *                  the stack lowered gives it back, and the 4 KiB kernel's next launch
 *                  grows it again.
 *   graph-local-stack (cap <cap0> = 2 GiB) the 8 KiB kernel captured into a graph: its
 *                  instantiation with half the cap allocated is refused with
 *                  CUDA_ERROR_OUT_OF_MEMORY (the stack stays 1 KiB); with the half freed it
 *                  is instantiated with the stack grown to 8 KiB, charged, and launched.
 *   capture-local-library (cap <cap0> = 2 GiB; FAKECUDA_LIBRARY_MEM=<code>) a library's
 *                  8 KiB kernel launched first inside a capture: lazy loading loads the
 *                  library's code into the context then, charged at the capture (the
 *                  stack not grown); the graph's instantiation grows it (charged), a
 *                  launch outside the capture then takes nothing more; lowered, the next
 *                  launch grows it again; the library's unload gives its code back. With
 *                  FAKECUDA_CAPTURE_UNSAFE=cuMemGetInfo_v2 the program's own cuMemGetInfo
 *                  inside a capture is refused and ends it (answered in relaxed mode),
 *                  and the captured launch, measured by gpucap, still ends its capture.
 *   kernel-function-stack (cap <cap0> = 2 GiB; FAKECUDA_LIBRARY_MEM=<code>) a library's
 *                  8 KiB kernel's function asked for (cuKernelGetFunction loads the
 *                  library's code, charged), then the kernel handle launched: the stack
 *                  it grows is charged too (before, the handle was taken as seen).
 *   graph-node-library (cap <cap0> = 2 GiB; FAKECUDA_LIBRARY_MEM=<code>) a graph built by
 *                  hand with a kernel node of a library never used in the context
 *                  (cuGraphAddKernelNode_v2 with the kernel handle): the library's code
 *                  the driver loads for it is charged; an executable graph's node given a
 *                  second library's kernel (cuGraphExecKernelNodeSetParams_v2) likewise,
 *                  and the graph's own node given a third's (cuGraphKernelNodeSetParams_v2).
 *   graph-generic-node, graph-generic-node-v2 (the same) with CUDA 12.2's generic calls:
 *                  cuGraphAddNode (or _v2), cuGraphExecNodeSetParams, cuGraphNodeSetParams.
 *   enumerated-functions (cap <cap0> = 2 GiB; FAKECUDA_FUNCTION_MEM=<code>) a module's two
 *                  functions listed by cuModuleEnumerateFunctions (partially loaded:
 *                  nothing taken); the first one's first launch and cuFuncLoad of the
 *                  second each take its code, charged; the unload gives both back.
 *   enumerated-attributes (cap <cap0> = 2 GiB; FAKECUDA_FUNCTION_MEM=<code>) a module's
 *                  three functions listed; the program's cuFuncGetAttribute and
 *                  cuFuncSetAttribute load their code: charged, and the third refused
 *                  before it loads while the cap has half its code's room.
 *   legacy-launches (cap <cap0> = 2 GiB; FAKECUDA_FUNCTION_MEM=<code>) the deprecated
 *                  launches (cuLaunch, cuLaunchGrid, cuLaunchGridAsync, the block set by
 *                  cuFuncSetBlockShape): the stack a first launch grows and the code of a
 *                  partially loaded function it loads are charged; the 8 KiB kernel's
 *                  stack refused past the cap before it grows.
 *   printf-fifo    (cap <cap0> = 2 GiB; FAKECUDA_PRINTF_AT_LAUNCH=1) the same with the printf
 *                  FIFO raised (CU_LIMIT_PRINTF_FIFO_SIZE).
 *   multi-device   (2 GPUs, caps <cap0> <cap1> = 2 GiB; FAKECUDA_FUNCTION_MEM=<code>,
 *                  FAKECUDA_HEAP_AT_LAUNCH=1) cuLaunchCooperativeKernelMultiDevice on both
 *                  GPUs: each context's stack grown (charged on its GPU; refused before the
 *                  driver grows any where GPU 1's cap cannot take it), a listed function's code loaded and
 *                  a raised heap taken at its launch, each charged on its own GPU.
 *   green-contexts (cap <cap0> = 2 GiB; FAKECUDA_CONTEXT_MEM=256Mi, FAKECUDA_GREEN_CTX_MEM=64Mi)
 *                  green contexts made with the primary context inactive, then active:
 *                  the primary context and each one's own part charged, one past the cap
 *                  refused, the last one's end taking the primary context with it.
 *   graph-heap     (cap <cap0> = 2 GiB; FAKECUDA_HEAP_AT_LAUNCH=1) the malloc heap raised
 *                  after a kernel and a graph of it were launched: the graph's next launch
 *                  takes it, a direct launch takes a second raise; charged, kept with the
 *                  context past the module's unload, credited when the context ends.
 *   stuck-stack    (cap <cap0>; FAKECUDA_STACK_LOWER_FAILS=1: the driver will not lower a
 *                  stack) in a created context, half the cap allocated, then a stack of
 *                  over half the cap: the driver takes it, gpucap refuses it
 *                  (CUDA_ERROR_OUT_OF_MEMORY) and cannot set it back, so the stack stays
 *                  and stays charged: with the half freed, it is in use, the rest of the
 *                  cap is served and 2 MiB more refused; a lowering the driver refuses
 *                  keeps the charge too; the context's end gives it all back.
 * Kernels loaded lazily (run with FAKECUDA_LIBRARY_MEM=<lib>, what a library takes in a
 * context at its first use, as CUDA's lazy loading does):
 *   library-global (cap <cap0> = 2 GiB) a library's global asked (cuLibraryGetGlobal) before
 *                  any kernel of it ran: the library loaded into the context there,
 *                  charged; refused in a created context while the cap lacks room.
 *   library-managed (the same) the library's __managed__ variable asked
 *                  (cuLibraryGetManaged): loaded there, charged, as for its global.
 *   library-module-global (the same) the library's global reached through its module
 *                  (cuLibraryGetModule, cuModuleGetGlobal_v2): loaded there, charged.
 *   lazy-kernels   (cap <cap0>, <lib> 3/8 of it) half the cap allocated, then a library's
 *                  kernel launched (first with an empty block, which the driver refuses: where
 *                  FAKECUDA_KERNEL_ATTRIBUTE_LOADS=1 made its question load the library, that
 *                  is charged): charged at its first launch (3/8 more), so a quarter
 *                  of the cap is refused; a second launch charges nothing; a second
 *                  library's first launch cannot be refused, is charged past the cap, and
 *                  every allocation is refused until memory is given back; unloading
 *                  that library gives its kernels back; a kernel loaded by
 *                  cuKernelGetFunction in a created context goes with that context, the
 *                  primary context's with its last release. With FAKECUDA_FUNCTION_MEM=
 *                  <cap0>/8: a module's kernels are charged when their functions are
 *                  first asked for (cuModuleGetFunction), once each, and go with the
 *                  module.
 *   lazy-contexts  (cap <cap0>, <lib> 1/5 of it) a library's kernel launched in the
 *                  primary context, then in five created contexts (launched in three,
 *                  cuKernelGetFunction in two): the driver loads it into each context,
 *                  so each is charged; the sixth copy (past the cap) is refused with
 *                  CUDA_ERROR_OUT_OF_MEMORY before the driver loads it; each created
 *                  context's copy goes with that context.
 * Eager loading (run with CUDA_MODULE_LOADING=EAGER and FAKECUDA_LIBRARY_MEM=<lib>):
 *   eager-libraries (2 GPUs, caps <cap0> <cap1>, equal; <lib> 1/4 of them) a library
 *                  loaded with GPU 0's and GPU 1's primary contexts held is loaded into
 *                  both at its load, so each is charged <lib>; its kernel's launch and
 *                  cuKernelGetFunction load nothing more; a context made on GPU 0 gets
 *                  its copy at its creation; a second library is charged in all three
 *                  contexts; a third, past GPU 0's cap, is refused with
 *                  CUDA_ERROR_OUT_OF_MEMORY and keeps nothing on either GPU; the created
 *                  context's copies go with it, each library's with its unload.
 */
#define _GNU_SOURCE
#include <pthread.h>

#include "fakecuda.h"

/* ---- declarations beyond fakecuda.h --------------------------------------- */

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr);
CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props);
CUresult cuMemPoolDestroy(CUmemoryPool pool);
CUresult cuCtxSynchronize(void);
typedef struct CUmod_st *CUmodule;
CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleUnload(CUmodule module);
CUresult cuCtxSetLimit(int limit, size_t value);
typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;
typedef struct CUfunc_st *CUfunction;
CUresult cuLibraryLoadData(CUlibrary *library, const void *code, void *jit_options, void **jit_values,
                           unsigned num_jit, void *lib_options, void **lib_values, unsigned num_lib);
CUresult cuLibraryUnload(CUlibrary library);
CUresult cuModuleGetFunction(CUfunction *func, CUmodule module, const char *name);
CUresult cuLibraryGetKernel(CUkernel *kernel, CUlibrary library, const char *name);
CUresult cuKernelGetFunction(CUfunction *func, CUkernel kernel);
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, CUstream stream, void **params, void **extra);
CUresult cuCtxGetLimit(size_t *value, int limit);
CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev);

/* ---- helpers --------------------------------------------------------------- */

static size_t g_cap[2];
static CUcontext g_ctx[2];
static size_t g_gran;

static void use(int dev) { MUST(cuCtxSetCurrent(g_ctx[dev])); }

/* GPU dev's cuMemGetInfo_v2 free figure (its context made current for the question). */
static size_t free_on(int dev) {
    CUcontext saved;
    size_t f = 0, t = 0;
    MUST(cuCtxGetCurrent(&saved));
    use(dev);
    MUST(cuMemGetInfo_v2(&f, &t));
    MUST(cuCtxSetCurrent(saved));
    return f;
}

#define IN_USE(dev, used, ...)                                                                \
    do {                                                                                      \
        size_t f_ = free_on(dev), w_ = g_cap[dev] - (used);                                   \
        char what_[200];                                                                      \
        snprintf(what_, sizeof what_, __VA_ARGS__);                                           \
        CHECK(f_ == w_, "%s: GPU %d free %zu MiB, expected %zu MiB (cap %zu MiB - %zu MiB)",  \
              what_, dev, f_ / MIB, w_ / MIB, g_cap[dev] / MIB, (size_t)(used) / MIB);        \
    } while (0)

static CUmemAllocationProp prop_on(int dev) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    return prop;
}

static CUresult create(CUmemGenericAllocationHandle *h, size_t size) {
    CUmemAllocationProp prop = prop_on(0);
    return cuMemCreate(h, size, &prop, 0);
}

/* Maps `h` (all `size` bytes) at `at` and makes it readable and writable by GPU 0. */
static void map_rw(CUdeviceptr at, size_t size, CUmemGenericAllocationHandle h) {
    MUST(cuMemMap(at, size, 0, h, 0));
    CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    MUST(cuMemSetAccess(at, size, &access, 1));
}

static CUdeviceptr reserve_va(size_t size) {
    CUdeviceptr va = 0;
    MUST(cuMemAddressReserve(&va, size, 0, 0, 0));
    return va;
}

static void one_context(void) {
    MUST(cuDevicePrimaryCtxRetain(&g_ctx[0], 0));
    use(0);
    CUmemAllocationProp prop = prop_on(0);
    MUST(cuMemGetAllocationGranularity(&g_gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
}

/* ---- VMM ------------------------------------------------------------------- */

static void vmm_idiom(void) {
    one_context();
    const size_t half = g_cap[0] / 2;
    CUdeviceptr va[8] = {0};
    int made = 0;
    for (int i = 0; i < 8; i++) {
        CUmemGenericAllocationHandle h = 0;
        CUresult rc = create(&h, half);
        if (i < 2) {
            CHECK(rc == CUDA_SUCCESS, "idiom #%d: cuMemCreate(cap/2) -> %d", i + 1, rc);
        } else {
            CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY,
                  "idiom #%d: cuMemCreate(cap/2) with two released-but-mapped handles -> %d, expected 2",
                  i + 1, rc);
        }
        if (rc != CUDA_SUCCESS) continue;
        va[made] = reserve_va(half);
        map_rw(va[made], half, h);
        MUST(cuMemRelease(h)); /* the mapping keeps the memory alive */
        /* The memory is usable after the release. */
        unsigned v = 0xC0FFEE00u + i, back = 0;
        MUST(cuMemcpyHtoD_v2(va[made], &v, sizeof v));
        MUST(cuMemcpyDtoH_v2(&back, va[made], sizeof back));
        CHECK(back == v, "idiom #%d: the mapping works after cuMemRelease", i + 1);
        made++;
    }
    IN_USE(0, made * half, "after the idiom loop (%d handles released, still mapped)", made);
    /* The last unmap frees the memory: credited then, and a new idiom round fits. */
    MUST(cuMemUnmap(va[0], half));
    IN_USE(0, (made - 1) * half, "after cuMemUnmap of the first mapping");
    CUmemGenericAllocationHandle h = 0;
    CUresult rc = create(&h, half);
    CHECK(rc == CUDA_SUCCESS, "cuMemCreate(cap/2) after an unmap -> %d", rc);
    if (rc == CUDA_SUCCESS) {
        map_rw(va[0], half, h);
        MUST(cuMemRelease(h));
    }
    for (int i = 0; i < made; i++) {
        if (i > 0 || rc == CUDA_SUCCESS) MUST(cuMemUnmap(va[i], half));
        MUST(cuMemAddressFree(va[i], half));
    }
    IN_USE(0, 0, "after unmapping everything");
}

static int g_thread_made;
static CUmemGenericAllocationHandle g_thread_handles[4];

static void *create_without_context(void *arg) {
    (void)arg;
    CUcontext none = (CUcontext)1;
    MUST(cuCtxGetCurrent(&none));
    CHECK(none == NULL, "the new thread has no current context");
    for (int i = 0; i < 4; i++) {
        CUresult rc = create(&g_thread_handles[g_thread_made], g_cap[0] / 2);
        CHECK(rc == (i < 2 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY),
              "no current context: cuMemCreate(cap/2) #%d -> %d", i + 1, rc);
        if (rc == CUDA_SUCCESS) g_thread_made++;
    }
    return NULL;
}

static void no_context_thread(void) {
    one_context();
    pthread_t t;
    CHECK(pthread_create(&t, NULL, create_without_context, NULL) == 0, "pthread_create");
    pthread_join(t, NULL);
    IN_USE(0, g_thread_made * (g_cap[0] / 2), "handles made by a thread with no context");
    for (int i = 0; i < g_thread_made; i++) MUST(cuMemRelease(g_thread_handles[i]));
    IN_USE(0, 0, "the handles released");

    CUstream s;
    MUST(cuStreamCreate(&s, 0));
    MUST(cuCtxSetCurrent(NULL));
    CUdeviceptr p[4] = {0};
    int served = 0;
    for (int i = 0; i < 4; i++) {
        CUresult rc = cuMemAllocAsync(&p[served], g_cap[0] / 2, s);
        CHECK(rc == (i < 2 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY),
              "no current context: cuMemAllocAsync(cap/2, a stream of GPU 0) #%d -> %d", i + 1, rc);
        if (rc == CUDA_SUCCESS) served++;
    }
    use(0);
    IN_USE(0, served * (g_cap[0] / 2), "allocated on a stream with no context current");
    for (int i = 0; i < served; i++) MUST(cuMemFreeAsync(p[i], s));
    MUST(cuStreamSynchronize(s));
    IN_USE(0, 0, "freed, the stream synchronised");
}

static void vmm_aliases(void) {
    one_context();
    const size_t half = g_cap[0] / 2;
    CUmemGenericAllocationHandle h = 0, other = 0;
    MUST(create(&h, half));
    CUdeviceptr a = reserve_va(half), b = reserve_va(half);
    map_rw(a, half, h);
    map_rw(b, half, h);
    MUST(cuMemRelease(h));
    IN_USE(0, half, "one handle mapped twice, released");
    MUST(cuMemUnmap(a, half));
    IN_USE(0, half, "first of two mappings unmapped: the other keeps the memory");
    CUresult rc = create(&other, half + g_cap[0] / 4);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate(3/4 cap) while the second mapping lives -> %d, expected 2", rc);
    if (rc == CUDA_SUCCESS) MUST(cuMemRelease(other));
    MUST(cuMemUnmap(b, half));
    IN_USE(0, 0, "second mapping unmapped: the memory is gone");
    rc = create(&other, half + g_cap[0] / 4);
    CHECK(rc == CUDA_SUCCESS, "cuMemCreate(3/4 cap) after the last unmap -> %d", rc);
    if (rc == CUDA_SUCCESS) MUST(cuMemRelease(other));
    MUST(cuMemAddressFree(a, half));
    MUST(cuMemAddressFree(b, half));
}

static void vmm_retain(void) {
    one_context();
    const size_t half = g_cap[0] / 2;
    CUmemGenericAllocationHandle h = 0, again = 0, other = 0;
    MUST(create(&h, half));
    CUdeviceptr a = reserve_va(half);
    map_rw(a, half, h);
    CUresult rc = cuMemRetainAllocationHandle(&again, (void *)(uintptr_t)(a + g_gran));
    CHECK(rc == CUDA_SUCCESS && again == h, "cuMemRetainAllocationHandle(inside the mapping) -> %d, same handle %d",
          rc, again == h);
    MUST(cuMemRelease(h));
    MUST(cuMemUnmap(a, half));
    IN_USE(0, half, "released and unmapped, but retained once more");
    rc = create(&other, half + g_cap[0] / 4);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate(3/4 cap) while the retained reference lives -> %d, expected 2", rc);
    if (rc == CUDA_SUCCESS) MUST(cuMemRelease(other));
    MUST(cuMemRelease(again));
    IN_USE(0, 0, "the retained reference released");
    rc = cuMemRelease(again);
    CHECK(rc != CUDA_SUCCESS, "a third cuMemRelease is the driver's error -> %d", rc);
    IN_USE(0, 0, "after the refused release");
    MUST(cuMemAddressFree(a, half));
}

static void vmm_unmap_many(void) {
    one_context();
    const size_t quarter = g_cap[0] / 4;
    CUmemGenericAllocationHandle h1 = 0, h2 = 0, h3 = 0, other = 0;
    MUST(create(&h1, quarter));
    MUST(create(&h2, quarter));
    CUdeviceptr va = reserve_va(2 * quarter);
    map_rw(va, quarter, h1);
    map_rw(va + quarter, quarter, h2);
    MUST(cuMemRelease(h1));
    MUST(cuMemRelease(h2));
    IN_USE(0, 2 * quarter, "two released handles mapped side by side");
    CUresult rc = cuMemUnmap(va, quarter + g_gran);
    CHECK(rc != CUDA_SUCCESS, "cuMemUnmap of one mapping and part of the next is the driver's error -> %d", rc);
    IN_USE(0, 2 * quarter, "after the refused cuMemUnmap");
    MUST(cuMemUnmap(va, 2 * quarter));
    IN_USE(0, 0, "one cuMemUnmap over both mappings credits both");

    /* A range freed with its mapping still in it (the fake unmaps it). */
    MUST(create(&h3, 2 * quarter));
    map_rw(va, 2 * quarter, h3);
    MUST(cuMemRelease(h3));
    IN_USE(0, 2 * quarter, "a released handle mapped");
    MUST(cuMemAddressFree(va, 2 * quarter));
    IN_USE(0, 0, "cuMemAddressFree took the mapping with it");
    rc = create(&other, 3 * quarter);
    CHECK(rc == CUDA_SUCCESS, "cuMemCreate(3/4 cap) afterwards -> %d", rc);
    if (rc == CUDA_SUCCESS) MUST(cuMemRelease(other));
}

/* cuMemCreate memory mapped into arrays (cuMemMapArrayAsync, CUDA 11.1): a deferred-mapping
   array's level 0 and a sparse mipmapped array's mip tail each map a handle of a quarter of
   the cap; released right after, as with cuMemMap, each stays charged while the array maps
   it, so 3/4 of the cap is refused; an unmapping that covers it, or the array's end, gives
   it back. */
typedef struct {
    int resourceType; /* CU_RESOURCE_TYPE_ARRAY 0, _MIPMAPPED_ARRAY 1 */
    void *resource;
    int subresourceType; /* SPARSE_LEVEL 0, MIPTAIL 1 */
    union {
        struct {
            unsigned level, layer, offsetX, offsetY, offsetZ, extentWidth, extentHeight, extentDepth;
        } sparseLevel;
        struct {
            unsigned layer;
            unsigned long long offset, size;
        } miptail;
    } subresource;
    int memOperationType; /* MAP 1, UNMAP 2 */
    int memHandleType;    /* GENERIC 0 */
    unsigned long long memHandle, offset;
    unsigned deviceBitMask, flags, reserved[2];
} CUarrayMapInfo;
CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d);
CUresult cuArrayDestroy(CUarray a);
CUresult cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels);
CUresult cuMipmappedArrayDestroy(CUmipmappedArray m);
CUresult cuMemMapArrayAsync(CUarrayMapInfo *list, unsigned count, CUstream stream);

static CUarrayMapInfo tile_of(int mipmapped, void *resource, int op, CUmemGenericAllocationHandle h) {
    CUarrayMapInfo m;
    memset(&m, 0, sizeof m);
    m.resourceType = mipmapped;
    m.resource = resource;
    m.memOperationType = op;
    m.memHandle = op == 1 ? h : 0;
    m.deviceBitMask = 1;
    if (mipmapped) {
        m.subresourceType = 1;
        m.subresource.miptail.size = 2 * MIB;
    } else {
        m.subresource.sparseLevel.extentWidth = 1024;
        m.subresource.sparseLevel.extentHeight = 1024;
        m.subresource.sparseLevel.extentDepth = 1;
    }
    return m;
}

static void array_mapping(void) {
    one_context();
    size_t quarter = g_cap[0] / 4;
    CUDA_ARRAY3D_DESCRIPTOR d = {1024, 1024, 0, 0x20 /* FLOAT */, 4, 0x80 /* DEFERRED_MAPPING */};
    CUarray arr = NULL;
    MUST(cuArray3DCreate_v2(&arr, &d));
    CUDA_ARRAY3D_DESCRIPTOR md = {1024, 1024, 0, 0x20, 4, 0x40 /* SPARSE */};
    CUmipmappedArray mip = NULL;
    MUST(cuMipmappedArrayCreate(&mip, &md, 4));
    IN_USE(0, 0, "a deferred-mapping array and a sparse mipmapped array: no memory of their own");
    CUmemGenericAllocationHandle h1 = 0, h2 = 0;
    MUST(create(&h1, quarter));
    MUST(create(&h2, quarter));
    CUarrayMapInfo maps[2] = {tile_of(0, arr, 1, h1), tile_of(1, mip, 1, h2)};
    MUST(cuMemMapArrayAsync(maps, 2, NULL));
    MUST(cuMemRelease(h1));
    MUST(cuMemRelease(h2));
    IN_USE(0, 2 * quarter, "both handles released while the arrays map them");
    CUdeviceptr a = 0;
    CUresult rc = cuMemAlloc_v2(&a, 3 * quarter);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "3/4 of the cap beside two mapped quarters -> %d, expected 2", rc);
    if (rc == CUDA_SUCCESS) MUST(cuMemFree_v2(a));
    CUarrayMapInfo unmap = tile_of(0, arr, 2, 0);
    MUST(cuMemMapArrayAsync(&unmap, 1, NULL));
    IN_USE(0, quarter, "the array's level unmapped: its handle freed");
    MUST(cuMipmappedArrayDestroy(mip));
    IN_USE(0, 0, "the mipmapped array destroyed with its mip tail mapped: that handle freed");
    MUST(cuMemAlloc_v2(&a, 3 * quarter));
    MUST(cuMemFree_v2(a));
    /* Mapped, released, then the array destroyed while it maps it. */
    MUST(create(&h1, quarter));
    CUarrayMapInfo again = tile_of(0, arr, 1, h1);
    MUST(cuMemMapArrayAsync(&again, 1, NULL));
    MUST(cuMemRelease(h1));
    IN_USE(0, quarter, "mapped again and released");
    MUST(cuArrayDestroy(arr));
    IN_USE(0, 0, "the array destroyed: the handle it mapped freed");
}

/* ---- pools ----------------------------------------------------------------- */

static void pool_other_gpu(void) {
    for (int dev = 0; dev < 2; dev++) MUST(cuCtxCreate_v2(&g_ctx[dev], 0, dev));
    use(0);
    CUmemoryPool p1;
    MUST(cuDeviceGetDefaultMemPool(&p1, 1));
    CUdeviceptr d[3] = {0};
    for (int i = 0; i < 3; i++) {
        CUresult rc = cuMemAllocFromPoolAsync(&d[i], g_cap[1], p1, NULL);
        if (i == 0) {
            CHECK(rc == CUDA_SUCCESS, "#%d: cuMemAllocFromPoolAsync(GPU 1's default pool, cap1) with GPU 0 current -> %d", i + 1, rc);
        } else {
            CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY,
                  "#%d: cuMemAllocFromPoolAsync(GPU 1's default pool, cap1) past GPU 1's cap -> %d, expected 2", i + 1, rc);
        }
        if (rc != CUDA_SUCCESS) d[i] = 0;
    }
    IN_USE(1, g_cap[1], "GPU 1 charged for its pool");
    IN_USE(0, 0, "GPU 0 not charged for GPU 1's pool");
    for (int i = 0; i < 3; i++)
        if (d[i]) MUST(cuMemFreeAsync(d[i], NULL));
    use(1);
    MUST(cuStreamSynchronize(NULL));
    use(0);
    IN_USE(1, 0, "GPU 1's pool released at the synchronisation");

    /* Not a pool at all: the driver's own error, nothing charged. */
    CUdeviceptr bogus = 0;
    CUresult rc = cuMemAllocFromPoolAsync(&bogus, MIB, (CUmemoryPool)(uintptr_t)0x1234, NULL);
    CHECK(rc == CUDA_ERROR_INVALID_VALUE, "cuMemAllocFromPoolAsync from a handle that is no pool -> %d, expected 1", rc);
    IN_USE(0, 0, "nothing charged for it");

    /* A pool created on GPU 1 while GPU 0 is current. */
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 1;
    CUmemoryPool mine;
    MUST(cuMemPoolCreate(&mine, &props));
    CUdeviceptr x = 0, y = 0;
    rc = cuMemAllocFromPoolAsync(&x, g_cap[1], mine, NULL);
    CHECK(rc == CUDA_SUCCESS, "created pool on GPU 1: cap1 -> %d", rc);
    rc = cuMemAllocFromPoolAsync(&y, g_cap[1], mine, NULL);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "created pool on GPU 1: cap1 more -> %d, expected 2", rc);
    if (rc == CUDA_SUCCESS) MUST(cuMemFreeAsync(y, NULL));
    IN_USE(0, 0, "GPU 0 not charged for GPU 1's created pool");
    if (x) MUST(cuMemFreeAsync(x, NULL));
    MUST(cuMemPoolDestroy(mine));
    IN_USE(1, 0, "created pool destroyed");

    /* cuMemAllocAsync on a stream of GPU 1: from GPU 1's current pool. */
    CUstream s1;
    use(1);
    MUST(cuStreamCreate(&s1, 0));
    use(0);
    rc = cuMemAllocAsync(&x, g_cap[1], s1);
    CHECK(rc == CUDA_SUCCESS, "cuMemAllocAsync(cap1) on GPU 1's stream with GPU 0 current -> %d", rc);
    rc = cuMemAllocAsync(&y, g_cap[1], s1);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "cuMemAllocAsync(cap1) more on GPU 1's stream -> %d, expected 2", rc);
    if (rc == CUDA_SUCCESS) MUST(cuMemFreeAsync(y, s1));
    IN_USE(1, g_cap[1], "GPU 1 charged for the allocation on its stream");
    IN_USE(0, 0, "GPU 0 not charged for GPU 1's stream");
    MUST(cuMemFreeAsync(x, s1));
    MUST(cuStreamSynchronize(s1));
    IN_USE(1, 0, "end");
}

static void pool_free_destroy(int destroy_first) {
    one_context();
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 0;
    CUmemoryPool pool;
    MUST(cuMemPoolCreate(&pool, &props));
    CUdeviceptr p = 0, big = 0;
    MUST(cuMemAllocFromPoolAsync(&p, g_cap[0] / 2, pool, NULL));
    IN_USE(0, g_cap[0] / 2, "cap/2 from a created pool");
    if (destroy_first) {
        MUST(cuMemPoolDestroy(pool));
        IN_USE(0, g_cap[0] / 2, "pool destroyed, its allocation outstanding");
        MUST(cuMemFree_v2(p));
    } else {
        MUST(cuMemFree_v2(p));
        MUST(cuMemPoolDestroy(pool));
    }
    IN_USE(0, 0, "allocation freed with cuMemFree_v2 and pool destroyed");
    CUresult rc = cuMemAlloc_v2(&big, g_cap[0] / 4 * 3);
    CHECK(rc == CUDA_SUCCESS, "cuMemAlloc_v2(3/4 cap) afterwards -> %d", rc);
    if (rc == CUDA_SUCCESS) MUST(cuMemFree_v2(big));
    IN_USE(0, 0, "end");

    /* The default pool, freed with cuMemFree_v2: the pool keeps the memory until a
     * synchronisation, and the cap reads so. */
    MUST(cuMemAllocAsync(&p, g_cap[0] / 2, NULL));
    MUST(cuMemFree_v2(p));
    MUST(cuCtxSynchronize());
    IN_USE(0, 0, "default-pool memory freed with cuMemFree_v2, then a synchronisation");
}

/* ---- the driver's pages ------------------------------------------------------ */

/* Fills the cap with blocks of `block` bytes (rows of a pitched allocation if `pitched`)
 * until one is refused, checks what was asked, frees them. */
static void fill_with(size_t block, int pitched) {
    enum { MAX_BLOCKS = 100000 };
    static CUdeviceptr got[MAX_BLOCKS];
    size_t n = 0, pitch = 0;
    CUresult rc = CUDA_SUCCESS;
    while (n < MAX_BLOCKS) {
        rc = pitched ? cuMemAllocPitch_v2(&got[n], &pitch, block, 1, 4) : cuMemAlloc_v2(&got[n], block);
        if (rc != CUDA_SUCCESS) break;
        n++;
    }
    const char *how = pitched ? "cuMemAllocPitch_v2" : "cuMemAlloc_v2";
    printf("%s: %zu blocks of %zu bytes before a refusal\n", how, n, block);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "%s(%zu) ended with %d, expected 2", how, block, rc);
    CHECK(n * block <= g_cap[0], "%s: %zu blocks of %zu bytes asked, %zu MiB of the %zu MiB cap", how, n,
          block, n * block / MIB, g_cap[0] / MIB);
    for (size_t i = 0; i < n; i++) MUST(cuMemFree_v2(got[i]));
    CUdeviceptr big = 0;
    rc = cuMemAlloc_v2(&big, g_cap[0] / 4 * 3);
    CHECK(rc == CUDA_SUCCESS, "cuMemAlloc_v2(3/4 cap) after freeing the blocks of %zu bytes -> %d", block, rc);
    if (rc == CUDA_SUCCESS) MUST(cuMemFree_v2(big));
}

static void page_rounding(void) {
    one_context();
    fill_with(2 * MIB + 4096, 0);
    fill_with(MIB + 4096, 0);
    fill_with(3 * MIB + 1, 0);
    fill_with(2 * MIB + 4096, 1);
}

/* ---- modules ------------------------------------------------------------------- */

/* PTX declaring one global of `bytes` bytes. */
static const char *ptx_with_global(size_t bytes) {
    static char ptx[256];
    snprintf(ptx, sizeof ptx,
             ".version 6.0\n.target sm_50\n.address_size 64\n"
             ".visible .global .align 4 .b8 big[%zu];\n",
             bytes);
    return ptx;
}

static void module_globals(void) {
    one_context();
    size_t global = g_cap[0] / 8 * 5;
    const char *ptx = ptx_with_global(global);
    CUmodule m = NULL, m2 = NULL, m3 = NULL;
    CUresult rc = cuModuleLoadData(&m, ptx);
    CHECK(rc == CUDA_SUCCESS, "cuModuleLoadData(a global of 5/8 of the cap) -> %d", rc);
    IN_USE(0, global, "a module holding 5/8 of the cap loaded");
    CUdeviceptr half = 0;
    rc = cuMemAlloc_v2(&half, g_cap[0] / 2);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc_v2(cap/2) beside the module -> %d, expected 2", rc);
    if (rc == CUDA_SUCCESS) MUST(cuMemFree_v2(half));
    rc = cuModuleLoadData(&m2, ptx);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "a second such module -> %d, expected 2", rc);
    if (rc == CUDA_SUCCESS) MUST(cuModuleUnload(m2));
    IN_USE(0, global, "the second module refused");
    if (m) MUST(cuModuleUnload(m));
    IN_USE(0, 0, "the module unloaded");
    rc = cuMemAlloc_v2(&half, g_cap[0] / 2);
    CHECK(rc == CUDA_SUCCESS, "cuMemAlloc_v2(cap/2) once it is unloaded -> %d", rc);
    if (rc == CUDA_SUCCESS) MUST(cuMemFree_v2(half));

    /* A module of a created context goes with that context. */
    CUcontext c = NULL;
    MUST(cuCtxCreate_v2(&c, 0, 0));
    rc = cuModuleLoadData(&m3, ptx);
    CHECK(rc == CUDA_SUCCESS, "cuModuleLoadData in a created context -> %d", rc);
    MUST(cuCtxDestroy_v2(c));
    use(0);
    IN_USE(0, 0, "the created context destroyed with its module");
    rc = cuMemAlloc_v2(&half, g_cap[0] / 2);
    CHECK(rc == CUDA_SUCCESS, "cuMemAlloc_v2(cap/2) after the context went -> %d", rc);
    if (rc == CUDA_SUCCESS) MUST(cuMemFree_v2(half));

    /* And one of the primary context goes with its last release. */
    rc = cuModuleLoadData(&m3, ptx);
    CHECK(rc == CUDA_SUCCESS, "cuModuleLoadData in the primary context -> %d", rc);
    IN_USE(0, global, "a module in the primary context");
    MUST(cuDevicePrimaryCtxRelease_v2(0));
    MUST(cuDevicePrimaryCtxRetain(&g_ctx[0], 0));
    use(0);
    IN_USE(0, 0, "the primary context released with its module, and retained again");
}

/* ---- limits ---------------------------------------------------------------- */

#define CU_LIMIT_STACK_SIZE 0
#define DEFAULT_STACK 1024

/* The stack of `k` x 512 bytes more per thread than the default, and what it takes:
   512 k for each resident thread (SMs x threads per SM), whole 2 MiB pages already. */
static size_t stack_of(int k) { return DEFAULT_STACK + 512 * (size_t)k; }
static size_t stack_takes(int k) {
    int sms = 0, per_sm = 0;
    MUST(cuDeviceGetAttribute(&sms, 16 /* MULTIPROCESSOR_COUNT */, 0));
    MUST(cuDeviceGetAttribute(&per_sm, 39 /* MAX_THREADS_PER_MULTIPROCESSOR */, 0));
    return 512 * (size_t)k * (size_t)sms * (size_t)per_sm;
}

static void stack_is(size_t want, const char *what) {
    size_t v = 0;
    MUST(cuCtxGetLimit(&v, CU_LIMIT_STACK_SIZE));
    CHECK(v == want, "%s: the stack limit is %zu, expected %zu", what, v, want);
}

/* Kernels whose threads take 4 KiB and 8 KiB of local memory (`.local` arrays). */
static const char LOCAL_PTX[] = ".version 6.0\n.target sm_50\n.address_size 64\n"
                                ".visible .entry local4k()\n{\n\t.local .align 16 .b8 __local_depot0[4096];\n\tret;\n}\n"
                                ".visible .entry local8k()\n{\n\t.local .align 16 .b8 __local_depot1[8192];\n\tret;\n}\n";

static CUresult launch_fn(CUfunction f) { return cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL); }

typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
CUresult cuStreamBeginCapture_v2(CUstream stream, int mode);
CUresult cuStreamEndCapture(CUstream stream, CUgraph *graph);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags);
CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream);
CUresult cuGraphExecDestroy(CUgraphExec exec);
CUresult cuGraphDestroy(CUgraph graph);
CUresult cuStreamIsCapturing(CUstream stream, int *status);
CUresult cuThreadExchangeStreamCaptureMode(int *mode);

/* A graph's kernel grows the stack when the graph runs: raised (or refused) at its
   instantiation. */
static void graph_local_stack(void) {
    one_context();
    size_t s8 = stack_takes(14), half = g_cap[0] / 2; /* 8192 bytes */
    CHECK(half + s8 > g_cap[0] && s8 < g_cap[0], "the test needs a cap of 2 GiB");
    CUmodule m = NULL;
    CUfunction k8 = NULL;
    MUST(cuModuleLoadData(&m, LOCAL_PTX));
    MUST(cuModuleGetFunction(&k8, m, "local8k"));
    CUstream s = NULL;
    MUST(cuStreamCreate(&s, 1));
    CUgraph g = NULL;
    MUST(cuStreamBeginCapture_v2(s, 0));
    MUST(cuLaunchKernel(k8, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL));
    MUST(cuStreamEndCapture(s, &g));
    IN_USE(0, 0, "the 8 KiB kernel captured: nothing taken");
    CUdeviceptr a = 0;
    MUST(cuMemAlloc_v2(&a, half));
    CUgraphExec e = NULL;
    CUresult rc = cuGraphInstantiateWithFlags(&e, g, 0);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "instantiating it beside half the cap -> %d, expected 2", rc);
    if (rc == CUDA_SUCCESS) {
        MUST(cuGraphLaunch(e, s));
        MUST(cuStreamSynchronize(s));
        MUST(cuGraphExecDestroy(e));
    }
    stack_is(DEFAULT_STACK, "the graph refused");
    IN_USE(0, half, "the graph refused: nothing more");
    MUST(cuMemFree_v2(a));
    MUST(cuGraphInstantiateWithFlags(&e, g, 0));
    MUST(cuGraphLaunch(e, s));
    MUST(cuStreamSynchronize(s));
    stack_is(8192, "the graph launched");
    IN_USE(0, s8, "the stack the graph's kernel grew");
    MUST(cuGraphExecDestroy(e));
    MUST(cuGraphDestroy(g));
    MUST(cuModuleUnload(m));
    MUST(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, DEFAULT_STACK));
    IN_USE(0, 0, "the stack lowered");
}

/* The primary context current and a library of LOCAL_PTX loaded, `name` its kernel in
   *k: what its code takes in a context (FAKECUDA_LIBRARY_MEM), which with `more` must
   fit the cap of 2 GiB. */
static size_t local_library(CUlibrary *l, CUkernel *k, const char *name, size_t more) {
    one_context();
    const char *e = getenv("FAKECUDA_LIBRARY_MEM");
    size_t code = e ? parse_size(e) : 0;
    CHECK(code > 0 && code + more < g_cap[0], "the test needs FAKECUDA_LIBRARY_MEM and a cap of 2 GiB");
    MUST(cuLibraryLoadData(l, LOCAL_PTX, NULL, NULL, 0, NULL, NULL, 0));
    MUST(cuLibraryGetKernel(k, *l, name));
    return code;
}

/* A library's kernel past the stack, launched first inside a capture: the library's code
   is loaded into the context at the capture (lazy loading), the stack grown only when the
   graph is instantiated or the kernel launched outside a capture. */
static void capture_local_library(void) {
    CUlibrary l = NULL;
    CUkernel k = NULL;
    size_t s8 = stack_takes(14), code = local_library(&l, &k, "local8k", s8); /* 8192 bytes */
    IN_USE(0, 0, "a library loaded, its kernel asked for");
    CUstream s = NULL;
    MUST(cuStreamCreate(&s, 1));
    CUgraph g = NULL;
    if (getenv("FAKECUDA_CAPTURE_UNSAFE")) {
        /* A driver that forbids cuMemGetInfo during a capture: the program's own call is
           refused and ends the capture; in relaxed mode it is answered. */
        size_t f = 0, t = 0;
        int status = -1, mode = 2 /* RELAXED */;
        MUST(cuStreamBeginCapture_v2(s, 0));
        CUresult r = cuMemGetInfo_v2(&f, &t);
        CHECK(r == 900, "cuMemGetInfo inside a capture -> %d, expected 900 (unsupported)", r);
        MUST(cuStreamIsCapturing(s, &status));
        CHECK(status == 2, "the capture after it: status %d, expected 2 (invalidated)", status);
        r = cuStreamEndCapture(s, &g);
        CHECK(r == 901, "its end -> %d, expected 901 (invalidated)", r);
        MUST(cuThreadExchangeStreamCaptureMode(&mode));
        MUST(cuStreamBeginCapture_v2(s, 0));
        r = cuMemGetInfo_v2(&f, &t);
        CHECK(r == CUDA_SUCCESS, "cuMemGetInfo inside a capture, in relaxed mode -> %d", r);
        MUST(cuStreamEndCapture(s, &g));
        MUST(cuGraphDestroy(g));
        MUST(cuThreadExchangeStreamCaptureMode(&mode)); /* back to global */
        CHECK(mode == 2, "the thread's mode was %d, expected 2", mode);
    }
    /* gpucap measures the load at the captured launch below: its own queries must not end
       the capture (with FAKECUDA_CAPTURE_UNSAFE, they would). */
    MUST(cuStreamBeginCapture_v2(s, 0));
    MUST(cuLaunchKernel((CUfunction)k, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL));
    MUST(cuStreamEndCapture(s, &g));
    stack_is(DEFAULT_STACK, "the 8 KiB kernel captured");
    IN_USE(0, code, "the library's code loaded into the context at the capture");
    CUgraphExec x = NULL;
    MUST(cuGraphInstantiateWithFlags(&x, g, 0));
    MUST(cuGraphLaunch(x, s));
    MUST(cuStreamSynchronize(s));
    stack_is(8192, "the graph launched");
    IN_USE(0, code + s8, "the library's code and the stack the graph's kernel grew");
    MUST(launch_fn((CUfunction)k));
    IN_USE(0, code + s8, "launched outside the capture: nothing more");
    MUST(cuGraphExecDestroy(x));
    MUST(cuGraphDestroy(g));
    MUST(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, DEFAULT_STACK));
    IN_USE(0, code, "the stack lowered");
    MUST(launch_fn((CUfunction)k));
    stack_is(8192, "launched again");
    IN_USE(0, code + s8, "the kernel grew the lowered stack again");
    MUST(cuLibraryUnload(l));
    IN_USE(0, s8, "the library unloaded: its code given back, the stack kept");
    MUST(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, DEFAULT_STACK));
    IN_USE(0, 0, "the stack lowered");
}

/* A library's kernel past the stack, its function asked for first (cuKernelGetFunction
   loads the library into the context), then launched by its kernel handle: the launch
   grows the stack all the same. */
static void kernel_function_stack(void) {
    CUlibrary l = NULL;
    CUkernel k = NULL;
    CUfunction f = NULL;
    size_t s8 = stack_takes(14), code = local_library(&l, &k, "local8k", s8); /* 8192 bytes */
    MUST(cuKernelGetFunction(&f, k));
    IN_USE(0, code, "the kernel's function asked for: its library's code loaded");
    stack_is(DEFAULT_STACK, "the function asked for");
    MUST(launch_fn((CUfunction)k));
    stack_is(8192, "the kernel handle launched");
    IN_USE(0, code + s8, "the library's code and the stack its kernel handle's launch grew");
    MUST(cuLibraryUnload(l));
    MUST(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, DEFAULT_STACK));
    IN_USE(0, 0, "the library unloaded, the stack lowered");
}

typedef struct {
    CUfunction func;
    unsigned int gx, gy, gz, bx, by, bz, shared;
    void **params, **extra;
    CUkernel kern;
    CUcontext ctx;
} KernelNodeParams;
CUresult cuGraphCreate(CUgraph *graph, unsigned int flags);
CUresult cuGraphAddKernelNode_v2(void **node, CUgraph graph, const void **deps, size_t n, const KernelNodeParams *p);
CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec exec, void *node, const KernelNodeParams *p);
/* CUDA 12.2's generic node parameters: the type, then (at 16) the type's own struct. */
typedef struct {
    int type;
    int reserved0[3];
    union {
        long long reserved1[29];
        KernelNodeParams kernel;
    } u;
    long long reserved2;
} CUgraphNodeParams;
CUresult cuGraphAddNode(void **node, CUgraph graph, const void **deps, size_t n, CUgraphNodeParams *p);
CUresult cuGraphAddNode_v2(void **node, CUgraph graph, const void **deps, const void *edges, size_t n,
                           CUgraphNodeParams *p);
CUresult cuGraphExecNodeSetParams(CUgraphExec exec, void *node, CUgraphNodeParams *p);
CUresult cuGraphKernelNodeSetParams_v2(void *node, const KernelNodeParams *p);
CUresult cuGraphNodeSetParams(void *node, CUgraphNodeParams *p);

/* A kernel node made from `p` by the call `how` names: 0 cuGraphAddKernelNode_v2, 1 the
   generic cuGraphAddNode, 2 cuGraphAddNode_v2. */
static CUresult add_kernel_node(int how, void **node, CUgraph g, const KernelNodeParams *p) {
    if (how == 0) return cuGraphAddKernelNode_v2(node, g, NULL, 0, p);
    CUgraphNodeParams gp;
    memset(&gp, 0, sizeof gp);
    gp.u.kernel = *p;
    return how == 1 ? cuGraphAddNode(node, g, NULL, 0, &gp) : cuGraphAddNode_v2(node, g, NULL, NULL, 0, &gp);
}

/* A graph's own kernel node given `p`: cuGraphKernelNodeSetParams_v2 (how 0) or the
   generic cuGraphNodeSetParams. */
static CUresult set_graph_kernel_node(int how, void *node, const KernelNodeParams *p) {
    if (how == 0) return cuGraphKernelNodeSetParams_v2(node, p);
    CUgraphNodeParams gp;
    memset(&gp, 0, sizeof gp);
    gp.u.kernel = *p;
    return cuGraphNodeSetParams(node, &gp);
}

/* An executable graph's kernel node given `p`: cuGraphExecKernelNodeSetParams_v2 (how 0) or
   the generic cuGraphExecNodeSetParams. */
static CUresult set_exec_kernel_node(int how, CUgraphExec x, void *node, const KernelNodeParams *p) {
    if (how == 0) return cuGraphExecKernelNodeSetParams_v2(x, node, p);
    CUgraphNodeParams gp;
    memset(&gp, 0, sizeof gp);
    gp.u.kernel = *p;
    return cuGraphExecNodeSetParams(x, node, &gp);
}

/* A graph built by hand: a kernel node of a library never used in the context makes the
   driver load the library's code for the graph (the fake: at cuGraphAddKernelNode), and so
   do an executable graph's node given another library's kernel and the graph's own node
   given a third's. `how`: the calls, as add_kernel_node's. */
static void graph_node_library(int how) {
    CUlibrary l = NULL;
    CUkernel k = NULL;
    size_t code = local_library(&l, &k, "local4k", 0);
    IN_USE(0, 0, "a library loaded, its kernel asked for");
    CUgraph g = NULL;
    MUST(cuGraphCreate(&g, 0));
    KernelNodeParams p;
    memset(&p, 0, sizeof p);
    p.kern = k;
    p.gx = p.gy = p.gz = 1;
    p.bx = 32;
    p.by = p.bz = 1;
    void *node = NULL;
    MUST(add_kernel_node(how, &node, g, &p));
    CUgraphExec x = NULL;
    MUST(cuGraphInstantiateWithFlags(&x, g, 0));
    CUstream s = NULL;
    MUST(cuStreamCreate(&s, 1));
    MUST(cuGraphLaunch(x, s));
    MUST(cuStreamSynchronize(s));
    IN_USE(0, code + stack_takes(6), "the graph's kernel loaded and its stack grown");
    /* The executable graph's node given a kernel of a second library, never used. */
    CUlibrary l2 = NULL;
    CUkernel k2 = NULL;
    MUST(cuLibraryLoadData(&l2, LOCAL_PTX, NULL, NULL, 0, NULL, NULL, 0));
    MUST(cuLibraryGetKernel(&k2, l2, "local4k"));
    p.kern = k2;
    MUST(set_exec_kernel_node(how, x, node, &p));
    MUST(cuGraphLaunch(x, s));
    MUST(cuStreamSynchronize(s));
    IN_USE(0, 2 * code + stack_takes(6), "the node's new kernel loaded with its library");
    /* The graph's own node given a kernel of a third library, never used (an exec updated
       from the graph would take it). */
    CUlibrary l3 = NULL;
    CUkernel k3 = NULL;
    MUST(cuLibraryLoadData(&l3, LOCAL_PTX, NULL, NULL, 0, NULL, NULL, 0));
    MUST(cuLibraryGetKernel(&k3, l3, "local4k"));
    p.kern = k3;
    MUST(set_graph_kernel_node(how, node, &p));
    IN_USE(0, 3 * code + stack_takes(6), "the graph's node given a third library's kernel: loaded with its library");
    MUST(cuGraphExecDestroy(x));
    MUST(cuGraphDestroy(g));
    MUST(cuLibraryUnload(l3));
    MUST(cuLibraryUnload(l2));
    IN_USE(0, code + stack_takes(6), "the second library unloaded");
    MUST(cuLibraryUnload(l));
    MUST(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, DEFAULT_STACK));
    IN_USE(0, 0, "the library unloaded, the stack lowered");
}

CUresult cuModuleGetFunctionCount(unsigned *count, CUmodule m);
CUresult cuModuleEnumerateFunctions(CUfunction *functions, unsigned n, CUmodule m);
CUresult cuFuncLoad(CUfunction f);
CUresult cuFuncGetAttribute(int *value, int attribute, CUfunction f);
CUresult cuFuncSetAttribute(CUfunction f, int attribute, int value);
enum { MAX_THREADS_PER_BLOCK = 0, LOCAL_SIZE_BYTES = 3, MAX_DYNAMIC_SHARED_SIZE_BYTES = 8 };

/* Functions listed by cuModuleEnumerateFunctions (CUDA 12.4) are "partially loaded" under
   lazy loading: each one's code is taken by the first call that needs it, here its first
   launch (gpucap's own question of its local memory must not be the call that loads it,
   unmeasured) and cuFuncLoad. */
/* The primary context current, and what a module's function's code takes
   (FAKECUDA_FUNCTION_MEM), which `parts` of must fit the cap. */
static size_t function_code(size_t parts) {
    one_context();
    const char *e = getenv("FAKECUDA_FUNCTION_MEM");
    size_t code = e ? parse_size(e) : 0;
    CHECK(code > 0 && parts * code < g_cap[0], "the test needs FAKECUDA_FUNCTION_MEM under 1/%zu of the cap", parts);
    return code;
}

static void enumerated_functions(void) {
    size_t code = function_code(2);
    static const char TWO[] = ".version 6.0\n.target sm_50\n.address_size 64\n"
                              ".visible .entry p0()\n{\n\tret;\n}\n.visible .entry p1()\n{\n\tret;\n}\n";
    CUmodule m = NULL;
    MUST(cuModuleLoadData(&m, TWO));
    unsigned n = 0;
    CUfunction fs[2] = {NULL, NULL};
    MUST(cuModuleGetFunctionCount(&n, m));
    CHECK(n == 2, "the module holds %u functions, expected 2", n);
    MUST(cuModuleEnumerateFunctions(fs, 2, m));
    IN_USE(0, 0, "two functions listed, partially loaded");
    MUST(launch_fn(fs[0]));
    IN_USE(0, code, "the first one's first launch loaded its code");
    MUST(cuFuncLoad(fs[1]));
    IN_USE(0, 2 * code, "cuFuncLoad loaded the second's");
    MUST(launch_fn(fs[1]));
    MUST(launch_fn(fs[0]));
    IN_USE(0, 2 * code, "both launched: nothing more");
    MUST(cuModuleUnload(m));
    IN_USE(0, 0, "the module unloaded with its functions' code");
}

/* The program's own attribute calls on functions listed by cuModuleEnumerateFunctions
   load their code (NVIDIA: "CUDA APIs may load the function automatically when called
   with partially loaded function handle"; the fake at cuFuncGetAttribute and
   cuFuncSetAttribute): charged, and refused before the load where the cap has no room for
   what the module's first function took. */
static void enumerated_attributes(void) {
    size_t code = function_code(4);
    static const char THREE[] = ".version 6.0\n.target sm_50\n.address_size 64\n"
                                ".visible .entry q0()\n{\n\tret;\n}\n.visible .entry q1()\n{\n\tret;\n}\n"
                                ".visible .entry q2()\n{\n\tret;\n}\n";
    CUmodule m = NULL;
    MUST(cuModuleLoadData(&m, THREE));
    CUfunction fs[3] = {NULL, NULL, NULL};
    MUST(cuModuleEnumerateFunctions(fs, 3, m));
    IN_USE(0, 0, "three functions listed, partially loaded");
    int v = -1;
    MUST(cuFuncGetAttribute(&v, LOCAL_SIZE_BYTES, fs[0]));
    IN_USE(0, code, "the first one's attribute asked: its code loaded");
    MUST(cuFuncGetAttribute(&v, MAX_THREADS_PER_BLOCK, fs[0]));
    IN_USE(0, code, "asked again: nothing more");
    MUST(cuFuncSetAttribute(fs[1], MAX_DYNAMIC_SHARED_SIZE_BYTES, 65536));
    IN_USE(0, 2 * code, "the second one's attribute set: its code loaded");
    CUdeviceptr a = 0;
    size_t most = g_cap[0] - 2 * code - code / 2;
    MUST(cuMemAlloc_v2(&a, most));
    CUresult rc = cuFuncGetAttribute(&v, LOCAL_SIZE_BYTES, fs[2]);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "the third one's attribute with half its code's room left -> %d, expected 2", rc);
    IN_USE(0, 2 * code + most, "the third one refused before it loaded");
    MUST(cuMemFree_v2(a));
    MUST(cuFuncGetAttribute(&v, LOCAL_SIZE_BYTES, fs[2]));
    IN_USE(0, 3 * code, "the third one's attribute with room: its code loaded");
    for (int i = 0; i < 3; i++) MUST(launch_fn(fs[i]));
    IN_USE(0, 3 * code, "all three launched: nothing more");
    MUST(cuModuleUnload(m));
    IN_USE(0, 0, "the module unloaded with its functions' code");
}

/* The deprecated launches (cuLaunch, cuLaunchGrid, cuLaunchGridAsync: CUDA 2.0's, before
   cuLaunchKernel; the block set by cuFuncSetBlockShape, the parameters by cuParamSet*): a
   first launch through them grows the stack to its kernel's local memory and loads a
   partially loaded function's code, as cuLaunchKernel's does: charged, and refused past
   the cap before the driver grows anything. */
CUresult cuFuncSetBlockShape(CUfunction f, int x, int y, int z);
CUresult cuFuncSetSharedSize(CUfunction f, unsigned bytes);
CUresult cuParamSetSize(CUfunction f, unsigned bytes);
CUresult cuParamSetv(CUfunction f, int offset, void *ptr, unsigned bytes);
CUresult cuLaunch(CUfunction f);
CUresult cuLaunchGrid(CUfunction f, int w, int h);
CUresult cuLaunchGridAsync(CUfunction f, int w, int h, CUstream stream);

static void legacy_launches(void) {
    size_t code = function_code(8);
    size_t s4 = stack_takes(6), s8 = stack_takes(14); /* 4096, 8192 bytes */
    CHECK(2 * code + s8 < g_cap[0] && 2 * code + s4 + 512 * MIB < g_cap[0], "the test needs a cap of 2 GiB");
    CUmodule m = NULL;
    CUfunction k4 = NULL, k8 = NULL;
    MUST(cuModuleLoadData(&m, LOCAL_PTX));
    MUST(cuModuleGetFunction(&k4, m, "local4k"));
    MUST(cuModuleGetFunction(&k8, m, "local8k"));
    IN_USE(0, 2 * code, "a module's two kernels asked for: their code");
    int arg = 7;
    MUST(cuFuncSetBlockShape(k4, 32, 1, 1));
    MUST(cuFuncSetBlockShape(k8, 32, 1, 1));
    MUST(cuFuncSetSharedSize(k8, 0));
    MUST(cuParamSetv(k4, 0, &arg, sizeof arg));
    MUST(cuParamSetSize(k4, sizeof arg));
    CUdeviceptr a = 0, b = 0;
    size_t most = g_cap[0] - 2 * code - s4 - 256 * MIB;
    MUST(cuMemAlloc_v2(&a, most));
    CUresult rc = cuLaunch(k4);
    CHECK(rc == CUDA_SUCCESS, "cuLaunch of the 4 KiB kernel -> %d", rc);
    stack_is(4096, "after the 4 KiB kernel's cuLaunch");
    IN_USE(0, 2 * code + most + s4, "cuLaunch grew the stack to the 4 KiB kernel's");
    rc = cuMemAlloc_v2(&b, 512 * MIB);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "512 MiB beside the grown stack -> %d, expected 2", rc);
    if (rc == CUDA_SUCCESS) MUST(cuMemFree_v2(b));
    rc = cuLaunchGridAsync(k8, 2, 1, NULL);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "cuLaunchGridAsync of the 8 KiB kernel past the cap -> %d, expected 2", rc);
    stack_is(4096, "the 8 KiB kernel's cuLaunchGridAsync refused");
    IN_USE(0, 2 * code + most + s4, "the 8 KiB kernel refused: nothing more");
    MUST(cuMemFree_v2(a));
    rc = cuLaunchGrid(k8, 2, 1);
    CHECK(rc == CUDA_SUCCESS, "cuLaunchGrid of the 8 KiB kernel with room -> %d", rc);
    stack_is(8192, "after the 8 KiB kernel's cuLaunchGrid");
    IN_USE(0, 2 * code + s8, "cuLaunchGrid grew the stack to the 8 KiB kernel's");
    MUST(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, DEFAULT_STACK));
    IN_USE(0, 2 * code, "the stack lowered");
    MUST(cuLaunchGridAsync(k4, 1, 1, NULL));
    stack_is(4096, "the 4 KiB kernel's cuLaunchGridAsync");
    IN_USE(0, 2 * code + s4, "cuLaunchGridAsync grew the lowered stack again");
    MUST(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, DEFAULT_STACK));
    /* Partially loaded functions: their code loaded at a deprecated first launch. */
    static const char TWO[] = ".version 6.0\n.target sm_50\n.address_size 64\n"
                              ".visible .entry r0()\n{\n\tret;\n}\n.visible .entry r1()\n{\n\tret;\n}\n";
    CUmodule m2 = NULL;
    CUfunction fs[2] = {NULL, NULL};
    MUST(cuModuleLoadData(&m2, TWO));
    MUST(cuModuleEnumerateFunctions(fs, 2, m2));
    for (int i = 0; i < 2; i++) MUST(cuFuncSetBlockShape(fs[i], 64, 1, 1));
    IN_USE(0, 2 * code, "two more functions listed, partially loaded");
    MUST(cuLaunch(fs[0]));
    IN_USE(0, 3 * code, "cuLaunch loaded the first one's code");
    MUST(cuLaunchGridAsync(fs[1], 4, 1, NULL));
    IN_USE(0, 4 * code, "cuLaunchGridAsync loaded the second one's");
    MUST(cuLaunchGrid(fs[0], 1, 1));
    MUST(cuLaunch(fs[1]));
    IN_USE(0, 4 * code, "both launched again: nothing more");
    MUST(cuModuleUnload(m2));
    MUST(cuModuleUnload(m));
    IN_USE(0, 0, "both modules unloaded with their functions' code");
}

/* A malloc heap raised takes nothing at the call (driver 580) and is taken at a later
   launch (FAKECUDA_HEAP_AT_LAUNCH=1: the context's next kernel launch, a graph's or a
   direct one): charged wherever it is taken, kept with the context (not given back with
   the module whose kernel's launch took it), credited when the context ends. A printf
   FIFO raised likewise (FAKECUDA_PRINTF_AT_LAUNCH=1). `limit` is the one raised, `base`
   its default (which the context's own memory holds), `what` its name. */
#define CU_LIMIT_PRINTF_FIFO_SIZE 1
#define CU_LIMIT_MALLOC_HEAP_SIZE 2
static void late_limit(int limit, size_t base, const char *what) {
    one_context();
    size_t heap = 512 * MIB, more = 256 * MIB;
    CHECK(heap + more + 4 * MIB < g_cap[0], "the test needs a cap above 772 MiB");
    static const char PLAIN[] = ".version 6.0\n.target sm_50\n.address_size 64\n"
                                ".visible .entry plain()\n{\n\tret;\n}\n";
    CUmodule m = NULL;
    CUfunction k = NULL;
    MUST(cuModuleLoadData(&m, PLAIN));
    MUST(cuModuleGetFunction(&k, m, "plain"));
    MUST(launch_fn(k));
    CUstream s = NULL;
    MUST(cuStreamCreate(&s, 1));
    CUgraph g = NULL;
    MUST(cuStreamBeginCapture_v2(s, 0));
    MUST(cuLaunchKernel(k, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL));
    MUST(cuStreamEndCapture(s, &g));
    CUgraphExec e = NULL;
    MUST(cuGraphInstantiateWithFlags(&e, g, 0));
    MUST(cuGraphLaunch(e, s));
    MUST(cuStreamSynchronize(s));
    IN_USE(0, 0, "a kernel launched, directly and by a graph, before the %s was raised", what);
    MUST(cuCtxSetLimit(limit, base + heap));
    IN_USE(0, 0, "the %s raised: nothing taken at the call", what);
    MUST(cuGraphLaunch(e, s));
    MUST(cuStreamSynchronize(s));
    IN_USE(0, heap, "the graph's launch took the raised %s", what);
    CUdeviceptr a = 0;
    CUresult rc = cuMemAlloc_v2(&a, g_cap[0] - heap + 2 * MIB);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "the cap's room beside the %s and 2 MiB more -> %d, expected 2", what, rc);
    if (rc == CUDA_SUCCESS) MUST(cuMemFree_v2(a));
    MUST(cuGraphLaunch(e, s));
    MUST(launch_fn(k));
    MUST(cuStreamSynchronize(s));
    IN_USE(0, heap, "launched again, by the graph and directly: nothing more");
    MUST(cuCtxSetLimit(limit, base + heap + more));
    MUST(launch_fn(k));
    IN_USE(0, heap + more, "a direct launch took the %s raised again", what);
    MUST(cuGraphExecDestroy(e));
    MUST(cuGraphDestroy(g));
    MUST(cuModuleUnload(m));
    IN_USE(0, heap + more, "the graph and the module gone: the %s stays with the context", what);
    MUST(cuDevicePrimaryCtxRelease_v2(0));
    MUST(cuDevicePrimaryCtxRetain(&g_ctx[0], 0));
    use(0);
    IN_USE(0, 0, "the context ended with its %s", what);
    MUST(cuDevicePrimaryCtxRelease_v2(0));
}

static void graph_heap(void) { late_limit(CU_LIMIT_MALLOC_HEAP_SIZE, 8 * MIB, "heap"); }
static void printf_fifo(void) { late_limit(CU_LIMIT_PRINTF_FIFO_SIZE, MIB, "printf FIFO"); }

/* CUDA_LAUNCH_PARAMS (cuda.h): one device's launch of the deprecated multi-device launch. */
typedef struct {
    CUfunction function;
    unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, shared;
    CUstream stream;
    void **params;
} LaunchParams;
CUresult cuLaunchCooperativeKernelMultiDevice(LaunchParams *list, unsigned n, unsigned flags);

/* f[0] on GPU 0 and f[1] on GPU 1, in one cuLaunchCooperativeKernelMultiDevice, each on its
   GPU's stream s[d]. */
static CUresult launch_both(CUfunction f[2], CUstream s[2]) {
    LaunchParams p[2];
    for (int d = 0; d < 2; d++) p[d] = (LaunchParams){f[d], 1, 1, 1, 32, 1, 1, 0, s[d], NULL};
    return cuLaunchCooperativeKernelMultiDevice(p, 2, 0);
}

/* cuLaunchCooperativeKernelMultiDevice (deprecated since CUDA 11.3, still in driver 580 and
   cudart 13): one call launching a function on both GPUs, each on a stream of its GPU's
   primary context. Each context's first launch grows its stack to the kernel's local
   memory (charged on each GPU; refused before the driver grows GPU 1's where its cap
   cannot take it), loads a partially loaded function's code (FAKECUDA_FUNCTION_MEM), and
   takes a raised heap (FAKECUDA_HEAP_AT_LAUNCH=1): each charged on its own GPU. */
static void multi_device(void) {
    const char *e = getenv("FAKECUDA_FUNCTION_MEM"), *h = getenv("FAKECUDA_HEAP_AT_LAUNCH");
    size_t code = e ? parse_size(e) : 0, heap = 256 * MIB, half = g_cap[0] / 2;
    size_t s4 = stack_takes(6), s8 = stack_takes(14); /* 4096, 8192 bytes */
    size_t two = 2 * code;                              /* the two kernels asked for */
    CHECK(g_cap[1] == g_cap[0] && half + two + s4 < g_cap[0] && half + s8 > g_cap[0] && two + s8 < g_cap[0] &&
              code > 0 && two + code + heap < half && h && strcmp(h, "1") == 0,
          "the test needs caps of 2 GiB on both GPUs, FAKECUDA_FUNCTION_MEM under 768 MiB and FAKECUDA_HEAP_AT_LAUNCH=1");
    CUmodule m[2] = {NULL, NULL}, p[2] = {NULL, NULL};
    CUfunction k4[2], k8[2], part[2];
    CUstream s[2];
    for (int d = 0; d < 2; d++) {
        MUST(cuDevicePrimaryCtxRetain(&g_ctx[d], d));
        use(d);
        MUST(cuModuleLoadData(&m[d], LOCAL_PTX));
        MUST(cuModuleGetFunction(&k4[d], m[d], "local4k"));
        MUST(cuModuleGetFunction(&k8[d], m[d], "local8k"));
        MUST(cuStreamCreate(&s[d], 1));
        IN_USE(d, two, "GPU %d: a module loaded, its two kernels asked for: their code", d);
    }
    CUdeviceptr a = 0;
    use(1);
    MUST(cuMemAlloc_v2(&a, half));
    CUresult rc = launch_both(k4, s);
    CHECK(rc == CUDA_SUCCESS, "the 4 KiB kernel on both GPUs -> %d", rc);
    IN_USE(0, two + s4, "GPU 0's stack grown to the 4 KiB kernel's");
    IN_USE(1, two + half + s4, "GPU 1's stack grown beside its half");
    rc = launch_both(k8, s);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "the 8 KiB kernel past GPU 1's cap -> %d, expected 2", rc);
    for (int d = 0; d < 2; d++) {
        use(d);
        stack_is(4096, "the 8 KiB kernel refused: no GPU's stack grown");
    }
    IN_USE(0, two + s4, "GPU 0: the 8 KiB kernel refused for GPU 1's cap, nothing more here either");
    IN_USE(1, two + half + s4, "GPU 1: the 8 KiB kernel refused, nothing more");
    MUST(cuMemFree_v2(a));
    rc = launch_both(k8, s);
    CHECK(rc == CUDA_SUCCESS, "the 8 KiB kernel on both GPUs with GPU 1's half freed -> %d", rc);
    for (int d = 0; d < 2; d++) {
        IN_USE(d, two + s8, "GPU %d's stack grown to the 8 KiB kernel's", d);
        use(d);
        stack_is(8192, "after the 8 KiB kernel on both GPUs");
        MUST(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, DEFAULT_STACK));
        IN_USE(d, two, "GPU %d's stack lowered", d);
    }
    /* Functions listed by cuModuleEnumerateFunctions: partially loaded until a first use. */
    static const char ONE[] = ".version 6.0\n.target sm_50\n.address_size 64\n"
                              ".visible .entry md0()\n{\n\tret;\n}\n";
    for (int d = 0; d < 2; d++) {
        use(d);
        MUST(cuModuleLoadData(&p[d], ONE));
        MUST(cuModuleEnumerateFunctions(&part[d], 1, p[d]));
    }
    MUST(launch_both(part, s));
    for (int d = 0; d < 2; d++) IN_USE(d, two + code, "GPU %d: the listed function's code loaded by its launch", d);
    /* A raised heap, taken at each context's next launch. */
    for (int d = 0; d < 2; d++) {
        use(d);
        MUST(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 8 * MIB + heap));
        IN_USE(d, two + code, "GPU %d: the heap raised, nothing taken at the call", d);
    }
    MUST(launch_both(part, s));
    for (int d = 0; d < 2; d++) IN_USE(d, two + code + heap, "GPU %d: the launch took the raised heap", d);
    MUST(launch_both(part, s));
    for (int d = 0; d < 2; d++) IN_USE(d, two + code + heap, "GPU %d: launched again, nothing more", d);
    for (int d = 0; d < 2; d++) {
        use(d);
        MUST(cuModuleUnload(p[d]));
        MUST(cuModuleUnload(m[d]));
        MUST(cuStreamDestroy_v2(s[d]));
        IN_USE(d, heap, "GPU %d: the modules unloaded, the heap stays with the context", d);
    }
}

/* Green contexts (CUDA 12.4): cuGreenCtxCreate retains the device's primary context (made
   then if inactive: FAKECUDA_CONTEXT_MEM) and takes FAKECUDA_GREEN_CTX_MEM of its own. */
typedef struct CUgreenCtx_st *CUgreenCtx;
typedef struct CUdevResourceDesc_st *CUdevResourceDesc;
CUresult cuDeviceGetDevResource(CUdevice dev, CUdevResource *res, int type);
CUresult cuDevSmResourceSplitByCount(CUdevResource *result, unsigned *nb_groups, const CUdevResource *input,
                                     CUdevResource *remaining, unsigned flags, unsigned min_count);
CUresult cuDevResourceGenerateDesc(CUdevResourceDesc *desc, CUdevResource *resources, unsigned count);
CUresult cuGreenCtxCreate(CUgreenCtx *green, CUdevResourceDesc desc, CUdevice dev, unsigned flags);
CUresult cuGreenCtxDestroy(CUgreenCtx green);
CUresult cuCtxFromGreenCtx(CUcontext *ctx, CUgreenCtx green);

/* cap <cap0> = 2 GiB, FAKECUDA_CONTEXT_MEM=256Mi, FAKECUDA_GREEN_CTX_MEM=64Mi: a green
   context made while the primary context is inactive makes it, both charged; a second
   takes its own part; one the cap has no room for is refused (and not left made); the
   last one's end takes the primary context with it, credited. */
static void green_contexts(void) {
    const size_t context = 256 * MIB, own = 64 * MIB;
    CUdevResource all, parts[3];
    MUST(cuDeviceGetDevResource(0, &all, 1));
    CHECK(all.type == 1 && all.sm_count >= 24, "the device's SM resource: type %u, %u SMs", all.type, all.sm_count);
    unsigned n = 3;
    MUST(cuDevSmResourceSplitByCount(parts, &n, &all, NULL, 0, 8));
    CHECK(n == 3 && parts[0].sm_count == 8, "split into %u partitions of %u SMs, expected 3 of 8", n, parts[0].sm_count);
    CUdevResourceDesc desc[3];
    for (int i = 0; i < 3; i++) MUST(cuDevResourceGenerateDesc(&desc[i], &parts[i], 1));
    CUgreenCtx g1 = NULL, g2 = NULL, g3 = NULL;
    MUST(cuGreenCtxCreate(&g1, desc[0], 0, 1));
    MUST(cuCtxFromGreenCtx(&g_ctx[0], g1));
    use(0);
    IN_USE(0, context + own, "a green context made while the primary context was inactive: both charged");
    MUST(cuGreenCtxCreate(&g2, desc[1], 0, 1));
    IN_USE(0, context + 2 * own, "a second green context: its own part");
    CUdeviceptr a = 0;
    size_t most = g_cap[0] - context - 2 * own - own / 2;
    MUST(cuMemAlloc_v2(&a, most));
    CUresult rc = cuGreenCtxCreate(&g3, desc[2], 0, 1);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "a third green context with half its part's room -> %d, expected 2", rc);
    IN_USE(0, context + 2 * own + most, "the third refused: nothing more");
    MUST(cuMemFree_v2(a));
    MUST(cuGreenCtxDestroy(g1));
    IN_USE(0, context + own, "the first green context destroyed: the primary context stays with the second");
    MUST(cuGreenCtxDestroy(g2));
    MUST(cuDevicePrimaryCtxRetain(&g_ctx[0], 0));
    use(0);
    IN_USE(0, context, "the last green context took the primary context with it: a new one is all that is charged");
    MUST(cuDevicePrimaryCtxRelease_v2(0));
}

/* A launch grows the stack to its kernel's local memory. */
static void local_stack(void) {
    one_context();
    size_t s4 = stack_takes(6), s8 = stack_takes(14), half = g_cap[0] / 2; /* 4096, 8192 bytes */
    CHECK(half + s4 < g_cap[0] && half + s8 > g_cap[0] && s8 < g_cap[0], "the test needs a cap of 2 GiB");
    CUmodule m = NULL;
    CUfunction k4 = NULL, k8 = NULL;
    MUST(cuModuleLoadData(&m, LOCAL_PTX));
    MUST(cuModuleGetFunction(&k4, m, "local4k"));
    MUST(cuModuleGetFunction(&k8, m, "local8k"));
    IN_USE(0, 0, "a module loaded, its kernels asked for");
    CUdeviceptr a = 0, b = 0;
    MUST(cuMemAlloc_v2(&a, half));
    CUresult rc = launch_fn(k4);
    CHECK(rc == CUDA_SUCCESS, "the 4 KiB kernel's launch -> %d", rc);
    stack_is(4096, "after the 4 KiB kernel's launch");
    IN_USE(0, half + s4, "half the cap and the stack the 4 KiB kernel grew");
    rc = cuMemAlloc_v2(&b, 512 * MIB);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "512 MiB beside the grown stack -> %d, expected 2", rc);
    if (rc == CUDA_SUCCESS) MUST(cuMemFree_v2(b));
    MUST(launch_fn(k4));
    IN_USE(0, half + s4, "launched again: nothing more");
    rc = launch_fn(k8);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "the 8 KiB kernel's stack past the cap -> %d, expected 2", rc);
    stack_is(4096, "the 8 KiB kernel refused");
    IN_USE(0, half + s4, "the 8 KiB kernel refused: nothing more");
    MUST(cuMemFree_v2(a));
    rc = launch_fn(k8);
    CHECK(rc == CUDA_SUCCESS, "the 8 KiB kernel with the half freed -> %d", rc);
    stack_is(8192, "after the 8 KiB kernel's launch");
    IN_USE(0, s8, "the stack the 8 KiB kernel grew");
    MUST(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, DEFAULT_STACK));
    IN_USE(0, 0, "the stack lowered");
    MUST(launch_fn(k4));
    stack_is(4096, "the 4 KiB kernel launched again");
    IN_USE(0, s4, "the 4 KiB kernel grew the lowered stack again");
    MUST(cuModuleUnload(m));
    IN_USE(0, s4, "the module unloaded: the stack stays with the context");
    MUST(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, DEFAULT_STACK));
    IN_USE(0, 0, "the stack lowered again");
}

static void stack_limit(void) {
    one_context();
    /* the least k whose stack takes more than half the cap */
    int k = 1;
    while (stack_takes(k) <= g_cap[0] / 2) k++;
    size_t takes = stack_takes(k);
    CHECK(takes < g_cap[0], "the test needs a stack of less than the cap (%zu MiB)", takes / MIB);
    CUdeviceptr half = 0;
    CUresult rc;
    for (int round = 1; round <= 3; round++) {
        rc = cuCtxSetLimit(CU_LIMIT_STACK_SIZE, stack_of(k));
        CHECK(rc == CUDA_SUCCESS, "round %d: cuCtxSetLimit(STACK, %zu) -> %d", round, stack_of(k), rc);
        IN_USE(0, takes, "round %d: a stack of %zu bytes per thread", round, stack_of(k));
        rc = cuMemAlloc_v2(&half, g_cap[0] / 2);
        CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "round %d: cuMemAlloc_v2(cap/2) beside the stack -> %d, expected 2",
              round, rc);
        if (rc == CUDA_SUCCESS) MUST(cuMemFree_v2(half));
        rc = cuCtxSetLimit(CU_LIMIT_STACK_SIZE, stack_of(2 * k));
        CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "round %d: a stack taking %zu MiB -> %d, expected 2", round,
              stack_takes(2 * k) / MIB, rc);
        stack_is(stack_of(k), "after the refused stack");
        IN_USE(0, takes, "round %d: the larger stack refused", round);
        MUST(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, DEFAULT_STACK));
        IN_USE(0, 0, "round %d: the stack lowered to its default", round);
    }
    rc = cuMemAlloc_v2(&half, g_cap[0] / 2);
    CHECK(rc == CUDA_SUCCESS, "cuMemAlloc_v2(cap/2) once the stack is lowered -> %d", rc);
    if (rc == CUDA_SUCCESS) MUST(cuMemFree_v2(half));

    /* A created context's stack goes with it. */
    CUcontext c = NULL;
    MUST(cuCtxCreate_v2(&c, 0, 0));
    size_t with_ctx = g_cap[0] - free_on(0);
    rc = cuCtxSetLimit(CU_LIMIT_STACK_SIZE, stack_of(k));
    CHECK(rc == CUDA_SUCCESS, "cuCtxSetLimit in a created context -> %d", rc);
    IN_USE(0, with_ctx + takes, "a stack in a created context");
    MUST(cuCtxDestroy_v2(c));
    use(0);
    IN_USE(0, 0, "the created context destroyed with its stack");

    /* And the primary context's with its last release. */
    rc = cuCtxSetLimit(CU_LIMIT_STACK_SIZE, stack_of(k));
    CHECK(rc == CUDA_SUCCESS, "cuCtxSetLimit in the primary context -> %d", rc);
    IN_USE(0, takes, "a stack in the primary context");
    MUST(cuDevicePrimaryCtxRelease_v2(0));
    MUST(cuDevicePrimaryCtxRetain(&g_ctx[0], 0));
    use(0);
    IN_USE(0, 0, "the primary context released with its stack, and retained again");
    stack_is(DEFAULT_STACK, "the primary context made anew");
}

/* A stack the driver took and would not give back (FAKECUDA_STACK_LOWER_FAILS=1). One the
   cap cannot take is refused before the driver takes it (the stack is as it was); one it
   can take, which the driver then will not lower, stays charged until the context ends. */
static void stuck_stack(void) {
    one_context();
    CUcontext c = NULL;
    MUST(cuCtxCreate_v2(&c, 0, 0));
    size_t with_ctx = g_cap[0] - free_on(0);
    int k = 1;
    while (stack_takes(k) <= g_cap[0] / 2) k++;
    size_t takes = stack_takes(k);
    CHECK(with_ctx + takes < g_cap[0], "the test needs a stack of less than the cap (%zu MiB)", takes / MIB);
    CUdeviceptr half = 0, d = 0;
    MUST(cuMemAlloc_v2(&half, g_cap[0] / 2));
    CUresult rc = cuCtxSetLimit(CU_LIMIT_STACK_SIZE, stack_of(k));
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "a stack of %zu MiB beside half the cap -> %d, expected 2", takes / MIB,
          rc);
    stack_is(DEFAULT_STACK, "refused before the driver took it");
    IN_USE(0, with_ctx + g_cap[0] / 2, "the refused stack charges nothing");
    MUST(cuMemFree_v2(half));
    rc = cuCtxSetLimit(CU_LIMIT_STACK_SIZE, stack_of(k));
    CHECK(rc == CUDA_SUCCESS, "the same stack once half the cap is free -> %d", rc);
    IN_USE(0, with_ctx + takes, "the stack");
    size_t rest = g_cap[0] - with_ctx - takes;
    rc = cuMemAlloc_v2(&d, rest);
    CHECK(rc == CUDA_SUCCESS, "the rest of the cap (%zu MiB) beside the stack -> %d", rest / MIB, rc);
    CUdeviceptr more = 0;
    CUresult rc2 = cuMemAlloc_v2(&more, 2 * MIB);
    CHECK(rc2 == CUDA_ERROR_OUT_OF_MEMORY, "2 MiB past the cap beside the stack -> %d, expected 2", rc2);
    if (rc2 == CUDA_SUCCESS) MUST(cuMemFree_v2(more));
    if (rc == CUDA_SUCCESS) MUST(cuMemFree_v2(d));
    rc = cuCtxSetLimit(CU_LIMIT_STACK_SIZE, DEFAULT_STACK);
    CHECK(rc == 999 /* CUDA_ERROR_UNKNOWN */, "lowering a stack the driver keeps -> %d, expected 999", rc);
    stack_is(stack_of(k), "the lowering refused");
    IN_USE(0, with_ctx + takes, "the stack after a lowering the driver refused");
    MUST(cuCtxDestroy_v2(c));
    use(0);
    IN_USE(0, 0, "the context destroyed with its stack");
    rc = cuMemAlloc_v2(&half, g_cap[0] / 2);
    CHECK(rc == CUDA_SUCCESS, "cuMemAlloc_v2(cap/2) once the context is gone -> %d", rc);
    if (rc == CUDA_SUCCESS) MUST(cuMemFree_v2(half));
}

/* ---- kernels loaded lazily ------------------------------------------------------ */

static const char LIB_PTX[] = ".version 6.0\n.target sm_50\n.address_size 64\n"
                              ".visible .entry k0()\n{\n\tret;\n}\n"
                              ".visible .entry k1()\n{\n\tret;\n}\n";

static CUkernel kernel_of(CUlibrary *lib, const char *name) {
    CUkernel k = NULL;
    MUST(cuLibraryLoadData(lib, LIB_PTX, NULL, NULL, 0, NULL, NULL, 0));
    MUST(cuLibraryGetKernel(&k, *lib, name));
    return k;
}

static CUresult launch(CUkernel k) { return cuLaunchKernel((CUfunction)k, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL); }

/* cuLibraryGetGlobal: under lazy loading the library is loaded into the context for its
   global (FAKECUDA_LIBRARY_MEM of code, and its globals): charged there, nothing more at
   its kernel's first launch, credited at the unload; in a created context refused before
   it loads where the cap lacks room for what the first context's copy took. */
CUresult cuLibraryGetGlobal(CUdeviceptr *dptr, size_t *bytes, CUlibrary library, const char *name);
CUresult cuLibraryGetModule(CUmodule *module, CUlibrary library);
CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule module, const char *name);
static const char GLOBAL_PTX[] = ".version 6.0\n.target sm_50\n.address_size 64\n"
                                 ".visible .global .align 4 .b8 table[8388608];\n"
                                 ".visible .entry k0()\n{\n\tret;\n}\n";

/* The same with its 8 MiB variable __managed__ (cuLibraryGetManaged answers for it). */
static const char MANAGED_PTX[] = ".version 6.0\n.target sm_50\n.address_size 64\n"
                                  ".visible .global .attribute(.managed) .align 4 .b8 table[8388608];\n"
                                  ".visible .entry k0()\n{\n\tret;\n}\n";
CUresult cuLibraryGetManaged(CUdeviceptr *dptr, size_t *bytes, CUlibrary library, const char *name);

/* The primary context current and a library of `ptx` (GLOBAL_PTX or MANAGED_PTX) loaded
   (nothing taken), its kernel in *k: what its copy takes in a context
   (FAKECUDA_LIBRARY_MEM and its 8 MiB variable), which three times over must fit the cap. */
static size_t global_library(const char *ptx, CUlibrary *l, CUkernel *k) {
    one_context();
    const char *e = getenv("FAKECUDA_LIBRARY_MEM");
    size_t table = 8 * MIB, lib = (e ? parse_size(e) : 0) + table;
    CHECK(lib > table && 3 * lib < g_cap[0], "the test needs FAKECUDA_LIBRARY_MEM under a third of the cap");
    MUST(cuLibraryLoadData(l, ptx, NULL, NULL, 0, NULL, NULL, 0));
    MUST(cuLibraryGetKernel(k, *l, "k0"));
    IN_USE(0, 0, "a library loaded: nothing taken (lazy loading)");
    return lib;
}

/* The same library's global reached through its module (cuLibraryGetModule, then
   cuModuleGetGlobal): the library loaded into the context there, charged. */
static void library_module_global(void) {
    CUlibrary l = NULL;
    CUkernel k = NULL;
    size_t lib = global_library(GLOBAL_PTX, &l, &k), n = 0;
    CUmodule m = NULL;
    CUdeviceptr p = 0;
    MUST(cuLibraryGetModule(&m, l));
    MUST(cuModuleGetGlobal_v2(&p, &n, m, "table"));
    CHECK(n == 8 * MIB, "the global's size %zu, expected 8 MiB", n);
    IN_USE(0, lib, "its global asked through its module: the library loaded into the context, charged");
    MUST(cuModuleGetGlobal_v2(&p, &n, m, "table"));
    MUST(cuLibraryGetGlobal(&p, &n, l, "table"));
    MUST(launch(k));
    IN_USE(0, lib, "asked again both ways, its kernel launched: nothing more");
    MUST(cuLibraryUnload(l));
    IN_USE(0, 0, "the library unloaded with its copy");
}

/* A library's variable asked for by `get` (cuLibraryGetGlobal, or cuLibraryGetManaged for a
   __managed__ one) before any kernel of it ran: the library loaded into the context there,
   charged; refused in a created context while the cap lacks room. */
typedef CUresult (*variable_fn)(CUdeviceptr *, size_t *, CUlibrary, const char *);
static void library_variable(const char *ptx, variable_fn get) {
    CUlibrary l = NULL;
    CUkernel k = NULL;
    size_t lib = global_library(ptx, &l, &k);
    CUdeviceptr p = 0;
    size_t n = 0;
    MUST(get(&p, &n, l, "table"));
    CHECK(n == 8 * MIB, "the variable's size %zu, expected 8 MiB", n);
    IN_USE(0, lib, "its variable asked: the library loaded into the context, charged");
    MUST(get(&p, &n, l, "table"));
    MUST(launch(k));
    IN_USE(0, lib, "asked again, its kernel launched: nothing more");
    CUcontext c = NULL;
    MUST(cuCtxCreate_v2(&c, 0, 0));
    size_t with_ctx = g_cap[0] - free_on(0);
    CUdeviceptr a = 0;
    size_t most = g_cap[0] - with_ctx - lib / 2;
    MUST(cuMemAlloc_v2(&a, most));
    CUresult rc = get(&p, &n, l, "table");
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "its variable in a created context with half its room -> %d, expected 2", rc);
    IN_USE(0, with_ctx + most, "refused before it loaded: nothing more");
    MUST(cuMemFree_v2(a));
    MUST(get(&p, &n, l, "table"));
    IN_USE(0, with_ctx + lib, "with room: the created context's copy charged");
    MUST(cuCtxDestroy_v2(c));
    use(0);
    IN_USE(0, lib, "the created context gone with its copy");
    MUST(cuLibraryUnload(l));
    IN_USE(0, 0, "the library unloaded with its copy");
}

static void library_global(void) { library_variable(GLOBAL_PTX, cuLibraryGetGlobal); }
static void library_managed(void) { library_variable(MANAGED_PTX, cuLibraryGetManaged); }

static void lazy_kernels(void) {
    one_context();
    size_t lib = g_cap[0] / 8 * 3, half = g_cap[0] / 2;
    CUlibrary l1 = NULL, l2 = NULL, l3 = NULL;
    CUkernel k1 = kernel_of(&l1, "k0"), k1b = NULL, k2 = kernel_of(&l2, "k0");
    MUST(cuLibraryGetKernel(&k1b, l1, "k1"));
    IN_USE(0, 0, "two libraries loaded, no kernel used");
    CUdeviceptr a = 0, b = 0;
    MUST(cuMemAlloc_v2(&a, half));
    /* A first launch the driver refuses (an empty block): where the question of the kernel's
       local memory loaded the library (FAKECUDA_KERNEL_ATTRIBUTE_LOADS=1), that stays charged. */
    const char *al = getenv("FAKECUDA_KERNEL_ATTRIBUTE_LOADS");
    size_t asked = al && strcmp(al, "1") == 0 ? lib : 0;
    CUresult rc = cuLaunchKernel((CUfunction)k1, 1, 1, 1, 0, 1, 1, 0, NULL, NULL, NULL);
    CHECK(rc == CUDA_ERROR_INVALID_VALUE, "a launch with an empty block -> %d, expected 1", rc);
    IN_USE(0, half + asked, "a first launch the driver refused: what its question loaded is charged");
    rc = launch(k1);
    CHECK(rc == CUDA_SUCCESS, "the first launch of a library's kernel -> %d", rc);
    IN_USE(0, half + lib, "half the cap and a library's kernels loaded by a launch");
    rc = cuMemAlloc_v2(&b, g_cap[0] / 4);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc_v2(cap/4) beside the loaded kernels -> %d, expected 2", rc);
    if (rc == CUDA_SUCCESS) MUST(cuMemFree_v2(b));
    MUST(launch(k1));
    MUST(launch(k1b));
    IN_USE(0, half + lib, "the same library's kernels launched again");

    /* A launch cannot be refused once made: charged past the cap. */
    rc = launch(k2);
    CHECK(rc == CUDA_SUCCESS, "the first launch of a second library's kernel -> %d", rc);
    IN_USE(0, g_cap[0], "past the cap: nothing free");
    rc = cuMemAlloc_v2(&b, 2 * MIB);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc_v2(2 MiB) with the cap passed -> %d, expected 2", rc);
    if (rc == CUDA_SUCCESS) MUST(cuMemFree_v2(b));
    MUST(cuMemFree_v2(a));
    IN_USE(0, 2 * lib, "the half freed: the two libraries' kernels");
    MUST(cuLibraryUnload(l2));
    IN_USE(0, lib, "the second library unloaded with its kernels");

    /* Loaded by cuKernelGetFunction in a created context: goes with that context. */
    CUcontext c = NULL;
    MUST(cuCtxCreate_v2(&c, 0, 0));
    size_t before = g_cap[0] - free_on(0);
    CUkernel k3 = kernel_of(&l3, "k1");
    CUfunction f3 = NULL;
    rc = cuKernelGetFunction(&f3, k3);
    CHECK(rc == CUDA_SUCCESS, "cuKernelGetFunction in a created context -> %d", rc);
    IN_USE(0, before + lib, "a kernel loaded in a created context");
    MUST(cuCtxDestroy_v2(c));
    use(0);
    MUST(cuLibraryUnload(l3));

    /* And the primary context's go with its last release. */
    MUST(cuDevicePrimaryCtxRelease_v2(0));
    MUST(cuDevicePrimaryCtxRetain(&g_ctx[0], 0));
    use(0);
    IN_USE(0, 0, "the primary context released with its kernels, and retained again");
    MUST(launch(k1));
    IN_USE(0, lib, "the first launch in the new primary context loads again");
    MUST(cuLibraryUnload(l1));
    IN_USE(0, 0, "the library unloaded");

    /* A module's kernels are loaded at cuModuleGetFunction (FAKECUDA_FUNCTION_MEM each). */
    size_t fn_mem = g_cap[0] / 8;
    CUmodule m = NULL;
    CUfunction f0 = NULL, f0b = NULL, f1 = NULL;
    MUST(cuModuleLoadData(&m, LIB_PTX));
    IN_USE(0, 0, "a module loaded, no function asked for");
    MUST(cuModuleGetFunction(&f0, m, "k0"));
    IN_USE(0, fn_mem, "a module's kernel asked for");
    MUST(cuModuleGetFunction(&f0b, m, "k0"));
    MUST(cuLaunchKernel(f0, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    IN_USE(0, fn_mem, "the same kernel asked for again and launched");
    MUST(cuModuleGetFunction(&f1, m, "k1"));
    IN_USE(0, 2 * fn_mem, "its second kernel asked for");
    MUST(cuModuleUnload(m));
    IN_USE(0, 0, "the module unloaded with its kernels");
}

/* A library's kernel used in six contexts: loaded (and charged) in each. */
static void lazy_contexts(void) {
    one_context();
    size_t lib = g_cap[0] / 5;
    CUlibrary l = NULL;
    CUkernel k = kernel_of(&l, "k0");
    IN_USE(0, 0, "a library loaded, no kernel used");
    MUST(launch(k));
    IN_USE(0, lib, "the kernel launched in the primary context");
    CUcontext c[5] = {0};
    for (int i = 0; i < 4; i++) {
        MUST(cuCtxCreate_v2(&c[i], 0, 0));
        CUresult rc;
        if (i % 2 == 0) {
            rc = launch(k);
        } else {
            CUfunction f = NULL;
            rc = cuKernelGetFunction(&f, k);
        }
        CHECK(rc == CUDA_SUCCESS, "the kernel's first use in created context %d -> %d", i + 1, rc);
        /* IN_USE asks in GPU 0's primary context, then makes c[i] current again. */
        IN_USE(0, (size_t)(i + 2) * lib, "the kernel used in %d created contexts", i + 1);
        MUST(cuCtxSetCurrent(c[i]));
        MUST(launch(k));
        IN_USE(0, (size_t)(i + 2) * lib, "launched again in created context %d", i + 1);
    }
    /* A sixth copy does not fit: refused before the driver loads it. */
    MUST(cuCtxCreate_v2(&c[4], 0, 0));
    CUresult rc = launch(k);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "a sixth copy past the cap -> %d, expected 2", rc);
    IN_USE(0, 5 * lib, "the sixth copy refused: nothing loaded");
    for (int i = 4; i >= 0; i--) MUST(cuCtxDestroy_v2(c[i]));
    use(0);
    IN_USE(0, lib, "the created contexts destroyed with their copies");
    MUST(launch(k));
    IN_USE(0, lib, "the primary context's copy stays");
    MUST(cuLibraryUnload(l));
    IN_USE(0, 0, "the library unloaded");
}

/* Under eager loading: a library is loaded into every context at its load. */
static void eager_libraries(void) {
    size_t lib = g_cap[0] / 4;
    MUST(cuDevicePrimaryCtxRetain(&g_ctx[0], 0));
    MUST(cuDevicePrimaryCtxRetain(&g_ctx[1], 1));
    use(0);
    CUlibrary l1 = NULL, l2 = NULL, l3 = NULL;
    CUkernel k = kernel_of(&l1, "k0");
    IN_USE(0, lib, "a library loaded eagerly, in GPU 0's context");
    IN_USE(1, lib, "a library loaded eagerly, in GPU 1's context");
    MUST(launch(k));
    CUfunction f = NULL;
    MUST(cuKernelGetFunction(&f, k));
    IN_USE(0, lib, "its kernel launched and its function asked for: nothing more loaded");
    CUcontext c = NULL;
    MUST(cuCtxCreate_v2(&c, 0, 0));
    IN_USE(0, 2 * lib, "a context made on GPU 0 with its copy of the library");
    MUST(cuLibraryLoadData(&l2, LIB_PTX, NULL, NULL, 0, NULL, NULL, 0));
    IN_USE(0, 4 * lib, "a second library, in both contexts of GPU 0");
    IN_USE(1, 2 * lib, "a second library, in GPU 1's context");
    CUresult rc = cuLibraryLoadData(&l3, LIB_PTX, NULL, NULL, 0, NULL, NULL, 0);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "a third library past GPU 0's cap -> %d, expected 2", rc);
    if (rc == CUDA_SUCCESS) MUST(cuLibraryUnload(l3));
    IN_USE(0, 4 * lib, "the third library refused: nothing kept on GPU 0");
    IN_USE(1, 2 * lib, "the third library refused: nothing kept on GPU 1");
    MUST(cuCtxDestroy_v2(c));
    use(0);
    IN_USE(0, 2 * lib, "the created context's copies went with it");
    MUST(cuLibraryUnload(l2));
    IN_USE(0, lib, "the second library unloaded, GPU 0");
    IN_USE(1, lib, "the second library unloaded, GPU 1");
    MUST(cuLibraryUnload(l1));
    IN_USE(0, 0, "both libraries unloaded, GPU 0");
    IN_USE(1, 0, "both libraries unloaded, GPU 1");
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s <mode> <cap0> [<cap1>]\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = argv[1];
    g_cap[0] = parse_size(argv[2]);
    g_cap[1] = argc > 3 ? parse_size(argv[3]) : 0;
    MUST(cuInit(0));
    if (strcmp(mode, "vmm-idiom") == 0) vmm_idiom();
    else if (strcmp(mode, "vmm-aliases") == 0) vmm_aliases();
    else if (strcmp(mode, "no-context-thread") == 0) no_context_thread();
    else if (strcmp(mode, "vmm-retain") == 0) vmm_retain();
    else if (strcmp(mode, "vmm-unmap-many") == 0) vmm_unmap_many();
    else if (strcmp(mode, "array-mapping") == 0) array_mapping();
    else if (strcmp(mode, "pool-other-gpu") == 0 && argc > 3) pool_other_gpu();
    else if (strcmp(mode, "pool-free-then-destroy") == 0) pool_free_destroy(0);
    else if (strcmp(mode, "pool-destroy-then-free") == 0) pool_free_destroy(1);
    else if (strcmp(mode, "page-rounding") == 0) page_rounding();
    else if (strcmp(mode, "module-globals") == 0) module_globals();
    else if (strcmp(mode, "stack-limit") == 0) stack_limit();
    else if (strcmp(mode, "stuck-stack") == 0) stuck_stack();
    else if (strcmp(mode, "local-stack") == 0) local_stack();
    else if (strcmp(mode, "multi-device") == 0 && argc > 3) multi_device();
    else if (strcmp(mode, "graph-local-stack") == 0) graph_local_stack();
    else if (strcmp(mode, "capture-local-library") == 0) capture_local_library();
    else if (strcmp(mode, "kernel-function-stack") == 0) kernel_function_stack();
    else if (strcmp(mode, "graph-node-library") == 0) graph_node_library(0);
    else if (strcmp(mode, "graph-generic-node") == 0) graph_node_library(1);
    else if (strcmp(mode, "graph-generic-node-v2") == 0) graph_node_library(2);
    else if (strcmp(mode, "enumerated-functions") == 0) enumerated_functions();
    else if (strcmp(mode, "enumerated-attributes") == 0) enumerated_attributes();
    else if (strcmp(mode, "legacy-launches") == 0) legacy_launches();
    else if (strcmp(mode, "graph-heap") == 0) graph_heap();
    else if (strcmp(mode, "printf-fifo") == 0) printf_fifo();
    else if (strcmp(mode, "green-contexts") == 0) green_contexts();
    else if (strcmp(mode, "lazy-kernels") == 0) lazy_kernels();
    else if (strcmp(mode, "library-global") == 0) library_global();
    else if (strcmp(mode, "library-module-global") == 0) library_module_global();
    else if (strcmp(mode, "library-managed") == 0) library_managed();
    else if (strcmp(mode, "lazy-contexts") == 0) lazy_contexts();
    else if (strcmp(mode, "eager-libraries") == 0 && argc > 3) eager_libraries();
    else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    return finish();
}
