/*
 * edges: driver-level edge cases HAMi-core's users reported (issue 34, part 6), each as
 * a program does it. Every check states what must hold UNDER THE CAP (the caps are
 * given, per GPU, as the arguments); where a check can only hold with gpucap (a
 * refusal), running without the shim fails it.
 *
 *   edges <mode> <cap0> [<cap1>]
 *
 *   host-vmm   (2 GPUs, 2 host NUMA nodes: FAKECUDA_NUMA_NODES=2) cuMemCreate of host
 *              memory (CU_MEM_LOCATION_TYPE_HOST, _HOST_NUMA with id 1, _HOST_NUMA_CURRENT
 *              with id 1), each 8 times the cap: host memory, never charged to a GPU (no
 *              refusal, free unchanged on both GPUs) and id 1 never read as GPU 1; mapped,
 *              unmapped and released with nothing credited. Device-locality memory
 *              (type 6, CUDA 13.4) is charged to the device its id's first byte names:
 *              past GPU 1's cap refused, within it the driver's own answer. A location
 *              type the shim does not know (7) is not served. A device cuMemCreate of the
 *              whole cap is still charged: the next granule is refused on that GPU.
 *   external   (1 GPU) memory another API allocated (a memfd exported as an fd, as
 *              Vulkan's vkGetMemoryFdKHR gives it), 8 times the cap: cuImportExternalMemory
 *              and two overlapping cuExternalMemoryGetMappedBuffer are neither refused nor
 *              charged (free unchanged); the buffer is the memfd's bytes; the cap still
 *              holds for CUDA's own allocations; cuMemFree of each buffer and
 *              cuDestroyExternalMemory succeed and credit nothing, also in the other order
 *              (destroyed first, the buffer freed after).
 *   multicast  (1 GPU, FAKECUDA_MULTICAST=1) a multicast object (cuMulticastCreate) and its
 *              device (cuMulticastAddDevice) take nothing; cuMemCreate memory bound to it
 *              (cuMulticastBindMem) is charged once, the object mapped adds nothing;
 *              released while bound, the binding holds it: it stays in use and what the
 *              cap cannot take beside it is refused, until cuMulticastUnbind frees it.
 *              Bound by address (cuMulticastBindAddr), unmapped and released, it is freed
 *              with the object's release. Without multicast (the attribute 0): the calls
 *              answer CUDA_ERROR_NOT_SUPPORTED and nothing is charged.
 */
#define _GNU_SOURCE
#include "fakecuda.h"

#include <sys/mman.h>
#include <unistd.h>

/* ---- declarations beyond fakecuda.h --------------------------------------- */

/* CUmemLocationType values fakecuda.h does not name. */
#define LOC_HOST 2
#define LOC_HOST_NUMA 3
#define LOC_HOST_NUMA_CURRENT 4

/* External memory (cuda.h, CUDA 10.0 on). */
typedef struct CUextMemory_st *CUexternalMemory;
#define CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD 1
#define CUDA_EXTERNAL_MEMORY_DEDICATED 0x1
typedef struct {
    int type;
    union {
        int fd;
        struct {
            void *handle;
            const void *name;
        } win32;
        const void *nvSciBufObject;
    } handle;
    unsigned long long size;
    unsigned int flags;
    unsigned int reserved[16];
} CUDA_EXTERNAL_MEMORY_HANDLE_DESC;
typedef struct {
    unsigned long long offset;
    unsigned long long size;
    unsigned int flags;
    unsigned int reserved[16];
} CUDA_EXTERNAL_MEMORY_BUFFER_DESC;
FAKECUDA_STATIC_ASSERT(sizeof(CUDA_EXTERNAL_MEMORY_HANDLE_DESC) == 104, "handle desc is 104 bytes");
FAKECUDA_STATIC_ASSERT(offsetof(CUDA_EXTERNAL_MEMORY_HANDLE_DESC, size) == 24, "size at 24");
CUresult cuImportExternalMemory(CUexternalMemory *ext, const CUDA_EXTERNAL_MEMORY_HANDLE_DESC *desc);
CUresult cuExternalMemoryGetMappedBuffer(CUdeviceptr *dptr, CUexternalMemory ext,
                                         const CUDA_EXTERNAL_MEMORY_BUFFER_DESC *desc);
CUresult cuDestroyExternalMemory(CUexternalMemory ext);

/* Multicast objects (cuda.h, CUDA 12.1 on). */
typedef struct {
    unsigned int numDevices;
    size_t size;
    unsigned long long handleTypes;
    unsigned long long flags;
} CUmulticastObjectProp;
FAKECUDA_STATIC_ASSERT(sizeof(CUmulticastObjectProp) == 32, "multicast prop is 32 bytes");
#define CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED 132
CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev);
CUresult cuMulticastGetGranularity(size_t *granularity, const CUmulticastObjectProp *prop, int option);
CUresult cuMulticastCreate(CUmemGenericAllocationHandle *mc, const CUmulticastObjectProp *prop);
CUresult cuMulticastAddDevice(CUmemGenericAllocationHandle mc, CUdevice dev);
CUresult cuMulticastBindMem(CUmemGenericAllocationHandle mc, size_t mc_offset, CUmemGenericAllocationHandle mem,
                            size_t mem_offset, size_t size, unsigned long long flags);
CUresult cuMulticastBindAddr(CUmemGenericAllocationHandle mc, size_t mc_offset, CUdeviceptr ptr, size_t size,
                             unsigned long long flags);
CUresult cuMulticastUnbind(CUmemGenericAllocationHandle mc, CUdevice dev, size_t mc_offset, size_t size);

/* ---- helpers --------------------------------------------------------------- */

static size_t g_cap[2];
static CUcontext g_ctx[2];
static int g_devices;

/* GPU dev's cuMemGetInfo_v2 free figure (its context made current for the question). */
static size_t free_on(int dev) {
    CUcontext saved;
    size_t f = 0, t = 0;
    MUST(cuCtxGetCurrent(&saved));
    MUST(cuCtxSetCurrent(g_ctx[dev]));
    MUST(cuMemGetInfo_v2(&f, &t));
    MUST(cuCtxSetCurrent(saved));
    return f;
}

/* Every GPU's free figure is its whole cap: nothing charged. */
#define NOTHING_CHARGED(...)                                                                  \
    do {                                                                                      \
        char what_[200];                                                                      \
        snprintf(what_, sizeof what_, __VA_ARGS__);                                           \
        for (int d_ = 0; d_ < g_devices; d_++) {                                              \
            size_t f_ = free_on(d_);                                                          \
            CHECK(f_ == g_cap[d_], "%s: GPU %d free %zu MiB, the whole cap (%zu MiB)", what_, \
                  d_, f_ / MIB, g_cap[d_] / MIB);                                             \
        }                                                                                     \
    } while (0)

static CUmemAllocationProp prop_at(int type, int id) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = (CUmemLocationType)type;
    prop.location.id = id;
    return prop;
}

/* ---- host-vmm --------------------------------------------------------------- */

static void host_vmm(void) {
    static const struct {
        const char *name;
        int type, id;
    } HOSTS[] = {{"HOST", LOC_HOST, 0},
                 {"HOST_NUMA id 1", LOC_HOST_NUMA, 1},
                 {"HOST_NUMA_CURRENT id 1", LOC_HOST_NUMA_CURRENT, 1}};
    MUST(cuCtxSetCurrent(g_ctx[0]));
    size_t gran = 0;
    CUmemAllocationProp dev0 = prop_at(CU_MEM_LOCATION_TYPE_DEVICE, 0);
    MUST(cuMemGetAllocationGranularity(&gran, &dev0, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    const size_t big = 8 * g_cap[1];
    CUmemGenericAllocationHandle h[3] = {0, 0, 0};
    for (int i = 0; i < 3; i++) {
        CUmemAllocationProp p = prop_at(HOSTS[i].type, HOSTS[i].id);
        size_t g = 0;
        CUresult rc = cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        CHECK(rc == CUDA_SUCCESS && g > 0 && big % g == 0, "granularity of %s: rc %d, %zu",
              HOSTS[i].name, rc, g);
        rc = cuMemCreate(&h[i], big, &p, 0);
        CHECK(rc == CUDA_SUCCESS, "cuMemCreate %s of %zu MiB (8 x GPU 1's cap) -> %d, expected 0",
              HOSTS[i].name, big / MIB, rc);
        NOTHING_CHARGED("after cuMemCreate %s", HOSTS[i].name);
    }
    /* Mapped, read and written from the host side, unmapped, released: nothing moves. */
    if (h[1]) {
        CUdeviceptr va = 0;
        MUST(cuMemAddressReserve(&va, big, 0, 0, 0));
        CUresult rc = cuMemMap(va, big, 0, h[1], 0);
        CHECK(rc == CUDA_SUCCESS, "cuMemMap of the HOST_NUMA handle -> %d", rc);
        NOTHING_CHARGED("HOST_NUMA handle mapped");
        if (rc == CUDA_SUCCESS) MUST(cuMemUnmap(va, big));
        MUST(cuMemAddressFree(va, big));
    }
    for (int i = 0; i < 3; i++) {
        if (!h[i]) continue;
        CUresult rc = cuMemRelease(h[i]);
        CHECK(rc == CUDA_SUCCESS, "cuMemRelease of %s -> %d", HOSTS[i].name, rc);
    }
    NOTHING_CHARGED("host handles released");
    /* CUDA 13.4's DEVICE_LOCALITY_DOMAIN (6: a portion of a device's memory; the id's first
     * byte, localized.deviceId, names the device): charged to that device. Past GPU 1's cap,
     * refused; within it, the driver's own answer (one before 13.4 knows no such type:
     * INVALID_VALUE), with nothing left charged. */
    {
        CUmemAllocationProp p = prop_at(6, 1 | (0 << 8));
        CUmemGenericAllocationHandle x = 0;
        CUresult rc = cuMemCreate(&x, big, &p, 0);
        CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY,
              "cuMemCreate of location type 6 on GPU 1, 8 x its cap -> %d, expected %d", rc,
              CUDA_ERROR_OUT_OF_MEMORY);
        if (rc == CUDA_SUCCESS) MUST(cuMemRelease(x));
        rc = cuMemCreate(&x, gran, &p, 0);
        CHECK(rc != CUDA_ERROR_OUT_OF_MEMORY,
              "cuMemCreate of location type 6 on GPU 1, one granule -> %d: refused within the cap",
              rc);
        if (rc == CUDA_SUCCESS) {
            size_t f = free_on(1);
            CHECK(f == g_cap[1] - gran, "type 6 granule on GPU 1: free %zu MiB, expected %zu",
                  f / MIB, (g_cap[1] - gran) / MIB);
            MUST(cuMemRelease(x));
        }
        NOTHING_CHARGED("after cuMemCreate of location type 6");
    }
    /* A location type that names no device (7, unknown to every header so far): never
     * served uncounted. */
    {
        CUmemAllocationProp p = prop_at(7, 0);
        CUmemGenericAllocationHandle x = 0;
        CUresult rc = cuMemCreate(&x, big, &p, 0);
        CHECK(rc != CUDA_SUCCESS, "cuMemCreate of location type 7 -> %d, expected an error", rc);
        if (rc == CUDA_SUCCESS) MUST(cuMemRelease(x));
        NOTHING_CHARGED("after cuMemCreate of location type 7");
    }
    /* Device memory is still charged, on the GPU its location names. */
    for (int d = 0; d < g_devices; d++) {
        CUmemAllocationProp p = prop_at(CU_MEM_LOCATION_TYPE_DEVICE, d);
        CUmemGenericAllocationHandle whole = 0, more = 0;
        MUST(cuMemCreate(&whole, g_cap[d], &p, 0));
        size_t f = free_on(d);
        CHECK(f == 0, "device cuMemCreate of GPU %d's whole cap: free %zu MiB, expected 0", d,
              f / MIB);
        CUresult rc = cuMemCreate(&more, gran, &p, 0);
        CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY,
              "one granule more on GPU %d past its cap -> %d, expected 2", d, rc);
        if (rc == CUDA_SUCCESS) MUST(cuMemRelease(more));
        MUST(cuMemRelease(whole));
    }
    NOTHING_CHARGED("device handles released");
}

/* ---- external --------------------------------------------------------------- */

/* A memfd of `size` bytes standing in for another API's exported memory. */
static int other_api_memory(size_t size) {
    int fd = memfd_create("other-api-memory", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        printf("FATAL memfd of %zu bytes\n", size);
        exit(3);
    }
    return fd;
}

static CUexternalMemory import(int fd, size_t size, CUresult *rc) {
    CUDA_EXTERNAL_MEMORY_HANDLE_DESC d;
    memset(&d, 0, sizeof d);
    d.type = CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = fd;
    d.size = size;
    d.flags = CUDA_EXTERNAL_MEMORY_DEDICATED;
    CUexternalMemory ext = NULL;
    *rc = cuImportExternalMemory(&ext, &d);
    return ext;
}

static CUdeviceptr buffer(CUexternalMemory ext, size_t offset, size_t size, CUresult *rc) {
    CUDA_EXTERNAL_MEMORY_BUFFER_DESC b;
    memset(&b, 0, sizeof b);
    b.offset = offset;
    b.size = size;
    CUdeviceptr p = 0;
    *rc = cuExternalMemoryGetMappedBuffer(&p, ext, &b);
    return p;
}

static void external(void) {
    MUST(cuCtxSetCurrent(g_ctx[0]));
    const size_t big = 8 * g_cap[0];
    int fd = other_api_memory(big);
    /* What the other API wrote, seen through CUDA's buffer. */
    char *host = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (host == MAP_FAILED) {
        printf("FATAL mmap of the memfd\n");
        exit(3);
    }
    host[big / 2] = 42;
    CUresult rc;
    CUexternalMemory ext = import(fd, big, &rc);
    CHECK(rc == CUDA_SUCCESS, "cuImportExternalMemory of %zu MiB (8 x the cap) -> %d", big / MIB,
          rc);
    NOTHING_CHARGED("imported");
    CUdeviceptr whole = buffer(ext, 0, big, &rc);
    CHECK(rc == CUDA_SUCCESS, "cuExternalMemoryGetMappedBuffer of all of it -> %d", rc);
    CUdeviceptr half = buffer(ext, big / 2, big / 2, &rc);
    CHECK(rc == CUDA_SUCCESS, "cuExternalMemoryGetMappedBuffer of its second half -> %d", rc);
    NOTHING_CHARGED("two buffers mapped");
    if (half) {
        char b = 0;
        MUST(cuMemcpyDtoH_v2(&b, half, 1));
        CHECK(b == 42, "the buffer is the other API's memory: read %d, expected 42", b);
    }
    /* The cap still holds for CUDA's own memory. */
    CUdeviceptr mine = 0, over = 0;
    MUST(cuMemAlloc_v2(&mine, g_cap[0]));
    rc = cuMemAlloc_v2(&over, 2 * MIB);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc_v2 past the cap -> %d, expected 2", rc);
    if (rc == CUDA_SUCCESS) MUST(cuMemFree_v2(over));
    MUST(cuMemFree_v2(mine));
    NOTHING_CHARGED("own allocation freed");
    if (whole) {
        rc = cuMemFree_v2(whole);
        CHECK(rc == CUDA_SUCCESS, "cuMemFree_v2 of the whole buffer -> %d", rc);
    }
    if (half) {
        rc = cuMemFree_v2(half);
        CHECK(rc == CUDA_SUCCESS, "cuMemFree_v2 of the half buffer -> %d", rc);
    }
    if (ext) {
        rc = cuDestroyExternalMemory(ext);
        CHECK(rc == CUDA_SUCCESS, "cuDestroyExternalMemory -> %d", rc);
        rc = cuDestroyExternalMemory(ext);
        CHECK(rc == CUDA_ERROR_INVALID_HANDLE, "cuDestroyExternalMemory again -> %d, expected 400",
              rc);
    }
    NOTHING_CHARGED("buffers freed, object destroyed");
    munmap(host, big);
    /* The other order: the object destroyed while a buffer lives, then the buffer freed. */
    fd = other_api_memory(big);
    ext = import(fd, big, &rc);
    CHECK(rc == CUDA_SUCCESS, "second cuImportExternalMemory -> %d", rc);
    CUdeviceptr late = ext ? buffer(ext, 0, big, &rc) : 0;
    CHECK(late != 0, "its buffer -> %d", rc);
    if (ext) {
        rc = cuDestroyExternalMemory(ext);
        CHECK(rc == CUDA_SUCCESS, "cuDestroyExternalMemory with a buffer still mapped -> %d", rc);
    }
    if (late) {
        rc = cuMemFree_v2(late);
        CHECK(rc == CUDA_SUCCESS, "cuMemFree_v2 of that buffer after the destroy -> %d", rc);
    }
    NOTHING_CHARGED("destroyed first, freed after");
    /* Nothing the imports did stays charged: the whole cap is CUDA's again. */
    MUST(cuMemAlloc_v2(&mine, g_cap[0]));
    MUST(cuMemFree_v2(mine));
}

/* ---- multicast ---------------------------------------------------------------- */

/* GPU 0's figure of memory in use under its cap is `want`. */
#define IN_USE(want, ...)                                                                        \
    do {                                                                                         \
        char what_[200];                                                                         \
        snprintf(what_, sizeof what_, __VA_ARGS__);                                              \
        size_t f_ = free_on(0), w_ = (want);                                                     \
        CHECK(f_ + w_ == g_cap[0], "%s: GPU 0 free %zu MiB, expected %zu MiB (%zu MiB in use)", \
              what_, f_ / MIB, (g_cap[0] - w_) / MIB, w_ / MIB);                               \
    } while (0)

/* A handle of `size` bytes of GPU 0 mapped read-write at a new reservation. */
static CUdeviceptr mapped(CUmemGenericAllocationHandle h, size_t size) {
    CUdeviceptr va = 0;
    MUST(cuMemAddressReserve(&va, size, 0, 0, 0));
    MUST(cuMemMap(va, size, 0, h, 0));
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = 0;
    acc.flags = 3;
    MUST(cuMemSetAccess(va, size, &acc, 1));
    return va;
}

static void unmapped(CUdeviceptr va, size_t size) {
    MUST(cuMemUnmap(va, size));
    MUST(cuMemAddressFree(va, size));
}

/* cuMemAlloc_v2 of `size` is refused (`refused`) or served and freed again. */
static void alloc_is(size_t size, int refused, const char *what) {
    CUdeviceptr d = 0;
    CUresult rc = cuMemAlloc_v2(&d, size);
    CHECK(rc == (refused ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS), "%s: cuMemAlloc_v2 of %zu MiB -> %d, expected %d",
          what, size / MIB, rc, refused ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS);
    if (rc == CUDA_SUCCESS) MUST(cuMemFree_v2(d));
}

static void multicast(void) {
    MUST(cuCtxSetCurrent(g_ctx[0]));
    int supported = -1;
    MUST(cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, 0));
    const size_t half = g_cap[0] / 2;
    CUmulticastObjectProp mp = {1, half, 0, 0};
    size_t gran = 0;
    CUresult rc = cuMulticastGetGranularity(&gran, &mp, 0 /* MINIMUM */);
    CUmemGenericAllocationHandle mc = 0;
    if (supported == 0) {
        CHECK(rc == CUDA_ERROR_NOT_SUPPORTED, "cuMulticastGetGranularity without multicast -> %d, expected 801", rc);
        rc = cuMulticastCreate(&mc, &mp);
        CHECK(rc == CUDA_ERROR_NOT_SUPPORTED, "cuMulticastCreate without multicast -> %d, expected 801", rc);
        NOTHING_CHARGED("no multicast");
        return;
    }
    CHECK(supported == 1 && rc == CUDA_SUCCESS && gran > 0 && half % gran == 0,
          "multicast: attribute %d, granularity rc %d, %zu", supported, rc, gran);
    rc = cuMulticastCreate(&mc, &mp);
    CHECK(rc == CUDA_SUCCESS, "cuMulticastCreate of %zu MiB per device -> %d", half / MIB, rc);
    if (rc != CUDA_SUCCESS) return;
    IN_USE(0, "a multicast object takes no memory of its own");
    MUST(cuMulticastAddDevice(mc, 0));
    IN_USE(0, "nor does adding a device to it");

    /* Bound by handle: charged once, at cuMemCreate. */
    CUmemAllocationProp p = prop_at(CU_MEM_LOCATION_TYPE_DEVICE, 0);
    CUmemGenericAllocationHandle a = 0, b = 0;
    MUST(cuMemCreate(&a, half, &p, 0));
    IN_USE(half, "cuMemCreate of half the cap");
    rc = cuMulticastBindMem(mc, 0, a, 0, half, 0);
    CHECK(rc == CUDA_SUCCESS, "cuMulticastBindMem -> %d", rc);
    IN_USE(half, "bound to the object: nothing more");
    CUdeviceptr va = mapped(mc, half);
    IN_USE(half, "the object mapped: nothing more");
    unmapped(va, half);
    MUST(cuMemRelease(a));
    IN_USE(half, "released while bound: the binding holds it");
    alloc_is(half + gran, 1, "beside the bound memory");
    alloc_is(half, 0, "the rest of the cap beside the bound memory");
    rc = cuMulticastUnbind(mc, 0, 0, half);
    CHECK(rc == CUDA_SUCCESS, "cuMulticastUnbind -> %d", rc);
    IN_USE(0, "unbound: its memory is freed");
    alloc_is(g_cap[0], 0, "the whole cap once unbound");

    /* Bound by address, unmapped and released: freed with the object. */
    MUST(cuMemCreate(&b, half, &p, 0));
    va = mapped(b, half);
    rc = cuMulticastBindAddr(mc, 0, va, half, 0);
    CHECK(rc == CUDA_SUCCESS, "cuMulticastBindAddr -> %d", rc);
    IN_USE(half, "bound by address: nothing more");
    unmapped(va, half);
    MUST(cuMemRelease(b));
    IN_USE(half, "unmapped and released while bound");
    alloc_is(half + gran, 1, "beside the memory bound by address");
    MUST(cuMemRelease(mc));
    IN_USE(0, "the object released with what it bound");
    alloc_is(g_cap[0], 0, "the whole cap once the object is gone");
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s <mode> <cap0> [<cap1>]\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1];
    g_cap[0] = parse_size(argv[2]);
    g_cap[1] = argc > 3 ? parse_size(argv[3]) : g_cap[0];
    MUST(cuInit(0));
    MUST(cuDeviceGetCount(&g_devices));
    if (g_devices > 2) g_devices = 2;
    for (int d = 0; d < g_devices; d++) MUST(cuDevicePrimaryCtxRetain(&g_ctx[d], d));
    if (strcmp(mode, "host-vmm") == 0 && g_devices == 2) {
        host_vmm();
    } else if (strcmp(mode, "external") == 0) {
        external();
    } else if (strcmp(mode, "multicast") == 0) {
        multicast();
    } else {
        fprintf(stderr, "unknown mode %s (host-vmm needs 2 GPUs)\n", mode);
        return 2;
    }
    for (int d = 0; d < g_devices; d++) MUST(cuDevicePrimaryCtxRelease_v2(d));
    return finish();
}
