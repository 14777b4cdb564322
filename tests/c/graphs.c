/*
 * graphs: CUDA graph memory (graph memory nodes) under a cap. The driver reserves an
 * executable graph's memory in the device's graph memory pool when it is instantiated,
 * keeps it for reuse, and gives back what no graph holds at cuDeviceGraphMemTrim. Every
 * check states what must hold UNDER THE CAP; run without the shim (the control) the
 * program must fail, which shows the escape is real.
 *
 *   graphs <mode> <cap>      (one GPU; the fake's context takes nothing)
 *
 *   nodes    graphs built with cuGraphAddMemAllocNode (+ cuGraphAddMemFreeNode)
 *   capture  graphs captured from cuMemAllocAsync/cuMemFreeAsync on a stream
 *   unlisted graphs of alloc nodes whose nodes the driver will not list (the fake's
 *            FAKECUDA_GRAPH_NODES_FAIL=1): A of 5/8 of the cap is charged as the driver
 *            reserves it at its instantiation (never taken as nothing), so half the cap
 *            beside it is refused; its launch after a trim is charged again; destroyed
 *            and trimmed, it is given back.
 *
 * Both: graph A of 5/8 of the cap instantiated (charged: cuMemGetInfo shows it) and
 * launched twice; graph B of 5/8 refused at instantiation with CUDA_ERROR_OUT_OF_MEMORY;
 * A's exec destroyed (its memory stays reserved, idle) and the pool trimmed (credited);
 * B then fits; a trim gives B's idle memory back, and B's next launch beside a plain
 * allocation of half the cap is refused (the launch must reserve again); once that is
 * freed it runs.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fakecuda.h"

CUresult cuGraphUpload(CUgraphExec exec, CUstream stream);
CUresult cuDeviceGetGraphMemAttribute(CUdevice dev, int attr, void *value);
CUresult cuStreamBeginCapture_v2(CUstream stream, int mode);
CUresult cuStreamEndCapture(CUstream stream, CUgraph *graph);
CUresult cuStreamDestroy_v2(CUstream stream);

#define CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT 2

static size_t g_cap;
static CUstream g_stream;
static int g_capture;

static size_t free_now(void) {
    size_t f = 0, t = 0;
    MUST(cuMemGetInfo_v2(&f, &t));
    return f;
}

#define IN_USE(used, ...)                                                                    \
    do {                                                                                     \
        size_t f_ = free_now(), w_ = g_cap - (used);                                         \
        char what_[200];                                                                     \
        snprintf(what_, sizeof what_, __VA_ARGS__);                                          \
        CHECK(f_ == w_, "%s: free %zu MiB, expected %zu MiB (cap %zu MiB - %zu MiB)", what_, \
              f_ / MIB, w_ / MIB, g_cap / MIB, (size_t)(used) / MIB);                        \
    } while (0)

/* A graph that allocates `bytes` on GPU 0 and frees it again. */
static CUgraph graph_of(size_t bytes) {
    CUgraph g = NULL;
    if (g_capture) {
        CUdeviceptr p = 0;
        MUST(cuStreamBeginCapture_v2(g_stream, 0));
        MUST(cuMemAllocAsync(&p, bytes, g_stream));
        MUST(cuMemFreeAsync(p, g_stream));
        MUST(cuStreamEndCapture(g_stream, &g));
        return g;
    }
    CUDA_MEM_ALLOC_NODE_PARAMS params;
    memset(&params, 0, sizeof params);
    params.poolProps.allocType = 1; /* PINNED */
    params.poolProps.location.type = 1; /* DEVICE */
    params.poolProps.location.id = 0;
    params.bytesize = bytes;
    CUgraphNode alloc = NULL, free_node = NULL;
    MUST(cuGraphCreate(&g, 0));
    MUST(cuGraphAddMemAllocNode(&alloc, g, NULL, 0, &params));
    MUST(cuGraphAddMemFreeNode(&free_node, g, &alloc, 1, params.dptr));
    return g;
}

static void run(void) {
    MUST(cuStreamCreate(&g_stream, 1));
    const size_t big = g_cap / 8 * 5;
    CUgraph a = graph_of(big), b = graph_of(big);
    IN_USE(0, "two graphs of %zu MiB built: nodes take no memory", big / MIB);
    CUgraphExec ea = NULL, eb = NULL;
    CUresult rc = cuGraphInstantiateWithFlags(&ea, a, 0);
    CHECK(rc == CUDA_SUCCESS, "graph A instantiated -> %d", rc);
    IN_USE(big, "graph A's memory reserved at its instantiation");
    for (int i = 1; i <= 2; i++) {
        rc = cuGraphLaunch(ea, g_stream);
        CHECK(rc == CUDA_SUCCESS, "graph A launch %d -> %d", i, rc);
    }
    IN_USE(big, "graph A launched twice: its memory reused");
    rc = cuGraphInstantiateWithFlags(&eb, b, 0);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "graph B beside A (%zu MiB more) -> %d, expected 2", big / MIB, rc);
    if (rc == CUDA_SUCCESS) MUST(cuGraphExecDestroy(eb));
    IN_USE(big, "graph B refused: nothing more reserved");
    MUST(cuGraphExecDestroy(ea));
    IN_USE(big, "graph A's exec destroyed: its memory stays reserved for reuse");
    MUST(cuDeviceGraphMemTrim(0));
    IN_USE(0, "a trim gives back idle graph memory");
    rc = cuGraphInstantiateWithFlags(&eb, b, 0);
    CHECK(rc == CUDA_SUCCESS, "graph B alone -> %d", rc);
    IN_USE(big, "graph B's memory reserved");
    MUST(cuDeviceGraphMemTrim(0));
    IN_USE(0, "graph B idle: trimmed");
    CUdeviceptr half = 0;
    MUST(cuMemAlloc_v2(&half, g_cap / 2));
    rc = cuGraphLaunch(eb, g_stream);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "graph B's launch beside half the cap -> %d, expected 2", rc);
    IN_USE(g_cap / 2, "the launch refused: nothing reserved");
    MUST(cuMemFree_v2(half));
    rc = cuGraphLaunch(eb, g_stream);
    CHECK(rc == CUDA_SUCCESS, "graph B's launch alone -> %d", rc);
    IN_USE(big, "graph B's memory reserved again at its launch");
    MUST(cuGraphExecDestroy(eb));
    MUST(cuDeviceGraphMemTrim(0));
    IN_USE(0, "all given back");
    MUST(cuGraphDestroy(a));
    MUST(cuGraphDestroy(b));
    MUST(cuStreamDestroy_v2(g_stream));
}

/* A graph whose nodes the driver will not list: charged after each call, as reserved. */
static void unlisted(void) {
    MUST(cuStreamCreate(&g_stream, 1));
    const size_t big = g_cap / 8 * 5;
    CUgraph a = graph_of(big);
    CUgraphExec ea = NULL;
    CUresult rc = cuGraphInstantiateWithFlags(&ea, a, 0);
    CHECK(rc == CUDA_SUCCESS, "graph A (nodes not listed) instantiated -> %d", rc);
    IN_USE(big, "graph A's memory reserved at its instantiation, its nodes not listed");
    CUdeviceptr half = 0;
    rc = cuMemAlloc_v2(&half, g_cap / 2);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "half the cap beside graph A -> %d, expected 2", rc);
    if (rc == CUDA_SUCCESS) MUST(cuMemFree_v2(half));
    MUST(cuDeviceGraphMemTrim(0));
    IN_USE(0, "graph A idle: trimmed");
    rc = cuGraphLaunch(ea, g_stream);
    CHECK(rc == CUDA_SUCCESS, "graph A's launch after a trim -> %d", rc);
    IN_USE(big, "graph A's memory reserved again at its launch");
    MUST(cuGraphExecDestroy(ea));
    IN_USE(big, "graph A's exec destroyed: its memory stays reserved for reuse");
    MUST(cuDeviceGraphMemTrim(0));
    IN_USE(0, "all given back");
    MUST(cuGraphDestroy(a));
    MUST(cuStreamDestroy_v2(g_stream));
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s <nodes|capture|unlisted> <cap>\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    g_cap = parse_size(argv[2]);
    int unlisted_graphs = strcmp(argv[1], "unlisted") == 0;
    if (strcmp(argv[1], "capture") == 0) g_capture = 1;
    else if (strcmp(argv[1], "nodes") != 0 && !unlisted_graphs) {
        fprintf(stderr, "unknown mode %s\n", argv[1]);
        return 2;
    }
    CUcontext ctx = NULL;
    MUST(cuInit(0));
    MUST(cuDevicePrimaryCtxRetain(&ctx, 0));
    MUST(cuCtxSetCurrent(ctx));
    if (unlisted_graphs) unlisted();
    else run();
    return finish();
}
