// launchbench: the launch-bound loops of the step-cost benchmark (scripts/gpu/step_cost.py),
// driver API only (built with `nvcc -O2 ... -lcuda`; the kernel is PTX text the driver
// JIT-compiles, so no device code is built here).
//
//   launchbench launch N       a tiny kernel (one thread adds 1 to a counter) launched N
//                              times on a created stream, then one synchronize:
//                              "RESULT <ns per launch>"
//   launchbench graph REPLAYS  32 launches of that kernel captured into a CUDA graph
//                              (stream capture), instantiated, uploaded, then replayed
//                              REPLAYS times: "RESULT <ns per replay>"
//
// Both warm up first (1,000 launches; 20 replays) and print "TOTAL <bytes>" (cuMemGetInfo's
// total as this process sees it: under gpucap the cap) and "COUNTER <value> <expected>"
// (the counter read back: a real GPU ran every launch; the fake GPU runs none). Any driver
// error prints "FAIL: ..." and exits 1. Device 0's primary context.
#include <cstring>

#include "drv_common.h"

static const char PTX[] =
    ".version 7.0\n"
    ".target sm_70\n"
    ".address_size 64\n"
    ".visible .entry tiny(.param .u64 counter)\n"
    "{\n"
    "\t.reg .b64 %rd<3>;\n"
    "\t.reg .b32 %r<3>;\n"
    "\tld.param.u64 %rd1, [counter];\n"
    "\tcvta.to.global.u64 %rd2, %rd1;\n"
    "\tld.global.u32 %r1, [%rd2];\n"
    "\tadd.s32 %r2, %r1, 1;\n"
    "\tst.global.u32 [%rd2], %r2;\n"
    "\tret;\n"
    "}\n";

int main(int argc, char **argv) {
    if (argc != 3 || (strcmp(argv[1], "launch") != 0 && strcmp(argv[1], "graph") != 0)) {
        fprintf(stderr, "usage: launchbench launch N | graph REPLAYS\n");
        return 2;
    }
    char *end = nullptr;
    long long n = strtoll(argv[2], &end, 10);
    if (end == argv[2] || *end != '\0' || n <= 0) {
        fprintf(stderr, "launchbench: bad count '%s' (a positive whole number)\n", argv[2]);
        return 2;
    }
    init_context();
    size_t free_b = 0, total_b = 0;
    check(cuMemGetInfo(&free_b, &total_b), "cuMemGetInfo");
    printf("TOTAL %zu\n", total_b);
    CUmodule mod = nullptr;
    check(cuModuleLoadData(&mod, PTX), "cuModuleLoadData(the tiny kernel's PTX)");
    CUfunction fn = nullptr;
    check(cuModuleGetFunction(&fn, mod, "tiny"), "cuModuleGetFunction(tiny)");
    CUdeviceptr counter = 0;
    check(cuMemAlloc(&counter, 4096), "cuMemAlloc(4096)");
    unsigned zero[1024] = {0};
    check(cuMemcpyHtoD_v2(counter, zero, 4096), "cuMemcpyHtoD");
    CUstream s = nullptr;
    check(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    void *params[] = {&counter};
    auto launch = [&]() { check(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr), "cuLaunchKernel"); };
    long long expected = 0;
    double per = 0;
    if (strcmp(argv[1], "launch") == 0) {
        for (int i = 0; i < 1000; i++) launch();
        check(cuStreamSynchronize(s), "cuStreamSynchronize");
        int64_t t0 = now_ns();
        for (long long i = 0; i < n; i++) launch();
        check(cuStreamSynchronize(s), "cuStreamSynchronize");
        per = double(now_ns() - t0) / double(n);
        expected = 1000 + n;
    } else {
        const int per_graph = 32;
        CUgraph g = nullptr;
        check(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCapture");
        for (int i = 0; i < per_graph; i++) launch();
        check(cuStreamEndCapture(s, &g), "cuStreamEndCapture");
        CUgraphExec ge = nullptr;
        check(cuGraphInstantiateWithFlags(&ge, g, 0), "cuGraphInstantiateWithFlags");
        check(cuGraphUpload(ge, s), "cuGraphUpload");
        for (int i = 0; i < 20; i++) check(cuGraphLaunch(ge, s), "cuGraphLaunch (warm-up)");
        check(cuStreamSynchronize(s), "cuStreamSynchronize");
        int64_t t0 = now_ns();
        for (long long i = 0; i < n; i++) check(cuGraphLaunch(ge, s), "cuGraphLaunch");
        check(cuStreamSynchronize(s), "cuStreamSynchronize");
        per = double(now_ns() - t0) / double(n);
        expected = (20 + n) * per_graph;
        check(cuGraphExecDestroy(ge), "cuGraphExecDestroy");
        check(cuGraphDestroy(g), "cuGraphDestroy");
    }
    unsigned got = 0;
    check(cuMemcpyDtoH(&got, counter, 4), "cuMemcpyDtoH");
    printf("COUNTER %u %lld\n", got, expected);
    check(cuMemFree(counter), "cuMemFree");
    check(cuModuleUnload(mod), "cuModuleUnload");
    printf("RESULT %.1f %s=%lld\n", per, argv[1][0] == 'l' ? "launches" : "replays", n);
    return 0;
}
