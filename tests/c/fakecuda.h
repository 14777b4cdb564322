/*
 * fakecuda.h: the small subset of the CUDA driver API that gpucap's C tests use.
 *
 * Hand-written from the driver API's documented signatures and values (CUDA 12);
 * it is not NVIDIA's cuda.h. Only what the tests call is declared. Function names
 * are the exported ABI names (cuMemAlloc_v2, ...), without cuda.h's #define layer,
 * so what a test calls is exactly the symbol it names.
 *
 * The second half holds tiny helpers shared by the test programs (argument parsing,
 * checks that print "ok"/"FAIL" lines). They live here, not in a separate header,
 * because common::compile_c rebuilds a test program when this file changes.
 */
#ifndef GPUCAP_TESTS_FAKECUDA_H
#define GPUCAP_TESTS_FAKECUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define FAKECUDA_STATIC_ASSERT static_assert /* also C++: tests/standins/include/cuda.h */
extern "C" {
#else
#define FAKECUDA_STATIC_ASSERT _Static_assert
#endif

/* ---- types ---------------------------------------------------------------- */

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef uint64_t cuuint64_t;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef unsigned long long CUmemGenericAllocationHandle;

/* ---- CUresult values ------------------------------------------------------ */

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_PERMITTED 800
#define CUDA_ERROR_NOT_SUPPORTED 801

/* ---- cuMemAllocManaged flags ---------------------------------------------- */

#define CU_MEM_ATTACH_GLOBAL 0x1
#define CU_MEM_ATTACH_HOST 0x2

/* ---- virtual memory management (cuMemCreate) ------------------------------ */

typedef enum {
    CU_MEM_ALLOCATION_TYPE_INVALID = 0,
    CU_MEM_ALLOCATION_TYPE_PINNED = 1,
} CUmemAllocationType;

typedef enum {
    CU_MEM_HANDLE_TYPE_NONE = 0,
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1,
} CUmemAllocationHandleType;

typedef enum {
    CU_MEM_LOCATION_TYPE_INVALID = 0,
    CU_MEM_LOCATION_TYPE_DEVICE = 1,
} CUmemLocationType;

typedef enum {
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1,
} CUmemAllocationGranularity_flags;

typedef struct {
    CUmemLocationType type;
    int id;
} CUmemLocation;

/* CUDA 12 layout: 4 + 4 + 8 + 8 + 8 = 32 bytes. */
typedef struct {
    CUmemAllocationType type;
    CUmemAllocationHandleType requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

FAKECUDA_STATIC_ASSERT(sizeof(CUmemLocation) == 8, "CUmemLocation is 8 bytes");
FAKECUDA_STATIC_ASSERT(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp is 32 bytes");
FAKECUDA_STATIC_ASSERT(offsetof(CUmemAllocationProp, location) == 8, "location at 8");
FAKECUDA_STATIC_ASSERT(offsetof(CUmemAllocationProp, win32HandleMetaData) == 16, "metadata at 16");

typedef struct {
    CUmemLocation location;
    int flags; /* CUmemAccess_flags */
} CUmemAccessDesc;
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE 3

/* CUmemPoolProps: 4 + 4 + 8 + 8 + 8 + 2 + 54 = 88 bytes. */
typedef struct {
    int allocType, handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;
FAKECUDA_STATIC_ASSERT(sizeof(CUmemPoolProps) == 88, "CUmemPoolProps is 88 bytes");
FAKECUDA_STATIC_ASSERT(offsetof(CUmemAllocationProp, allocFlags) == 24, "allocFlags at 24");

/* Graphs with memory nodes (cuGraphAddMemAllocNode) and the device's graph memory. */
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphExec_st *CUgraphExec;
/* CUDA_MEM_ALLOC_NODE_PARAMS (v1): 88 + 8 + 8 + 8 + 8 = 120 bytes. */
typedef struct {
    CUmemPoolProps poolProps;
    const CUmemAccessDesc *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr;
} CUDA_MEM_ALLOC_NODE_PARAMS;
FAKECUDA_STATIC_ASSERT(sizeof(CUDA_MEM_ALLOC_NODE_PARAMS) == 120, "alloc node params are 120 bytes");
CUresult cuGraphCreate(CUgraph *graph, unsigned int flags);
CUresult cuGraphDestroy(CUgraph graph);
CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t n,
                                CUDA_MEM_ALLOC_NODE_PARAMS *params);
CUresult cuGraphAddMemFreeNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t n,
                               CUdeviceptr dptr);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags);
CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream);
CUresult cuGraphExecDestroy(CUgraphExec exec);
CUresult cuDeviceGraphMemTrim(CUdevice dev);

/* CUDA arrays (cuArray3DCreate_v2, cuMipmappedArrayCreate). */
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct {
    size_t Width, Height, Depth;
    int Format;
    unsigned int NumChannels, Flags;
} CUDA_ARRAY3D_DESCRIPTOR;
FAKECUDA_STATIC_ASSERT(sizeof(CUDA_ARRAY3D_DESCRIPTOR) == 40, "CUDA_ARRAY3D_DESCRIPTOR is 40 bytes");

/* CUdevResource (green contexts, CUDA 12.4) as CUDA 13's cuda.h lays it out: 144 bytes
   (12.4's SM fields at the same offsets). */
typedef struct {
    unsigned type;
    unsigned char padding[92];
    unsigned sm_count, min_partition, alignment, flags;
    unsigned char rest[24];
    void *next;
} CUdevResource;
FAKECUDA_STATIC_ASSERT(sizeof(CUdevResource) == 144, "CUdevResource is 144 bytes");

/* ---- cuGetProcAddress ----------------------------------------------------- */

#define CU_GET_PROC_ADDRESS_DEFAULT 0
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM 1
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2

typedef enum {
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2,
} CUdriverProcAddressQueryResult;

/* cuGetProcAddress (CUDA 11.3) and cuGetProcAddress_v2 (CUDA 12.0). */
typedef CUresult (*PFN_cuGetProcAddress)(const char *symbol, void **pfn, int cudaVersion,
                                         cuuint64_t flags);
typedef CUresult (*PFN_cuGetProcAddress_v2)(const char *symbol, void **pfn, int cudaVersion,
                                            cuuint64_t flags,
                                            CUdriverProcAddressQueryResult *symbolStatus);

/* ---- function pointer types for the entry points the tests look up -------- */

typedef CUresult (*PFN_cuInit)(unsigned int flags);
typedef CUresult (*PFN_cuMemAlloc)(CUdeviceptr *dptr, size_t bytesize);
typedef CUresult (*PFN_cuMemAllocPitch)(CUdeviceptr *dptr, size_t *pitch, size_t widthBytes,
                                        size_t height, unsigned int elementSizeBytes);
typedef CUresult (*PFN_cuMemAllocManaged)(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
typedef CUresult (*PFN_cuMemFree)(CUdeviceptr dptr);
typedef CUresult (*PFN_cuMemAllocAsync)(CUdeviceptr *dptr, size_t bytesize, CUstream stream);
typedef CUresult (*PFN_cuMemAllocFromPoolAsync)(CUdeviceptr *dptr, size_t bytesize,
                                                CUmemoryPool pool, CUstream stream);
typedef CUresult (*PFN_cuMemFreeAsync)(CUdeviceptr dptr, CUstream stream);
typedef CUresult (*PFN_cuMemCreate)(CUmemGenericAllocationHandle *handle, size_t size,
                                    const CUmemAllocationProp *prop, unsigned long long flags);
typedef CUresult (*PFN_cuMemRelease)(CUmemGenericAllocationHandle handle);
typedef CUresult (*PFN_cuMemGetInfo)(size_t *free, size_t *total);
typedef CUresult (*PFN_cuDeviceTotalMem)(size_t *bytes, CUdevice dev);
typedef CUresult (*PFN_cuDeviceGetDefaultMemPool)(CUmemoryPool *pool, CUdevice dev);
typedef CUresult (*PFN_cuMemcpyHtoD)(CUdeviceptr dst, const void *src, size_t bytes);

/* ---- prototypes (exported ABI names) -------------------------------------- */

CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int *version);
CUresult cuGetErrorName(CUresult error, const char **name);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);

CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice dev);
CUresult cuCtxDestroy_v2(CUcontext ctx);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxGetCurrent(CUcontext *ctx);
CUresult cuCtxPushCurrent_v2(CUcontext ctx);
CUresult cuCtxPopCurrent_v2(CUcontext *ctx);
CUresult cuCtxGetDevice(CUdevice *device);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev);

CUresult cuStreamCreate(CUstream *stream, unsigned int flags);
CUresult cuStreamDestroy_v2(CUstream stream);
CUresult cuStreamSynchronize(CUstream stream);

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t widthBytes, size_t height,
                            unsigned int elementSizeBytes);
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream stream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream stream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream stream);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev);
CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep);
CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *value);
#define CU_MEMPOOL_ATTR_RELEASE_THRESHOLD 4

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                  unsigned long long flags);
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option);

CUresult cuMemGetInfo_v2(size_t *free, size_t *total);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes);
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes);

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus);

#ifdef __cplusplus
}
#endif

/* ========================================================================== */
/* Test helpers (not part of the driver API).                                 */
/* ========================================================================== */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

/* What gpucap charges a cuMemAlloc/cuMemAllocPitch of `bytes` (src/core/linear.rs):
 * above 1 MiB whole 2 MiB pages, as the real driver and the fake take them; 1 MiB or
 * less whole 512-byte blocks (the driver's alignment; the fake takes the bytes). */
static inline size_t linear_charge(size_t bytes) {
    size_t unit = bytes <= MIB ? 512 : 2 * MIB;
    return (bytes + unit - 1) / unit * unit;
}
#define GIB ((size_t)1 << 30)

static int g_failures __attribute__((unused));
static int g_checks __attribute__((unused));

/* Records one check: prints "ok <what>" or "FAIL <what>" (to stdout, flushed). */
#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        g_checks++;                                                                        \
        if (cond) {                                                                        \
            printf("ok   ");                                                               \
        } else {                                                                           \
            g_failures++;                                                                  \
            printf("FAIL ");                                                               \
        }                                                                                  \
        printf(__VA_ARGS__);                                                               \
        printf("   [%s:%d]\n", __FILE__, __LINE__);                                        \
        fflush(stdout);                                                                    \
    } while (0)

/* A driver call that must succeed; aborts the program (exit 3) otherwise. */
#define MUST(call)                                                                         \
    do {                                                                                   \
        CUresult must_rc_ = (call);                                                        \
        if (must_rc_ != CUDA_SUCCESS) {                                                    \
            printf("FATAL %s returned %d   [%s:%d]\n", #call, must_rc_, __FILE__, __LINE__); \
            fflush(stdout);                                                                \
            exit(3);                                                                       \
        }                                                                                  \
    } while (0)

/* Makes a context on GPU 0, current on this thread (cuCtxCreate_v2 pushes it); exits 3
 * if it cannot be made. */
static inline CUcontext context_on_gpu0(void) {
    CUdevice dev;
    CUcontext ctx;
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuCtxCreate_v2(&ctx, 0, dev));
    return ctx;
}

/* Initialises the driver and makes GPU 0's primary context current on this thread;
 * exits 3 if it cannot. */
static inline CUcontext primary_context_on_gpu0(void) {
    CUdevice dev;
    CUcontext ctx;
    MUST(cuInit(0));
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuDevicePrimaryCtxRetain(&ctx, dev));
    MUST(cuCtxSetCurrent(ctx));
    return ctx;
}

/* Parses a byte count: plain digits with an optional Ki/Mi/Gi suffix. */
static inline size_t parse_size(const char *s) {
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    if (end && strcmp(end, "Ki") == 0) v <<= 10;
    else if (end && strcmp(end, "Mi") == 0) v <<= 20;
    else if (end && strcmp(end, "Gi") == 0) v <<= 30;
    else if (!end || *end != '\0') {
        fprintf(stderr, "bad size %s\n", s);
        exit(2);
    }
    return (size_t)v;
}

/* Summary line and exit status: 0 when every check passed, 1 otherwise. */
static inline int finish(void) {
    printf("summary: %d checks, %d failed\n", g_checks, g_failures);
    fflush(stdout);
    return g_failures ? 1 : 0;
}

#endif /* GPUCAP_TESTS_FAKECUDA_H */
