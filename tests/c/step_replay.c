/*
 * step_replay: replays the driver calls gpucap hooks in one recorded step of a real
 * program (a PyTorch training step, a CUDA-graph inference step), STEPS times, so that
 * callgrind can count what gpucap adds per step (scripts/bench/bench-instructions.sh, N vs 2N
 * steps) without PyTorch.
 *
 *   step_replay <sequence file> <steps>
 *
 * The sequence file (written from tests/fixtures/steps/<name>.json by
 * scripts/bench/step-profile.py --sequence) holds one call per line, in the step's order:
 *   L i    cuLaunchKernel of kernel handle i          X i    cuLaunchKernelEx of kernel i
 *   LF i   cuLaunchKernel of kernel i's function      XF i   cuLaunchKernelEx of its function
 *   G i    cuKernelGetFunction of kernel i            S      cuStreamSynchronize(NULL)
 *   GL     cuGraphLaunch of an instantiated graph on the NULL stream
 * Kernels are numbered from 0 in order of first use; the program loads one library with
 * as many kernels as the highest number + 1 and takes each kernel's function once, as
 * cudart does, in the primary context made current (PyTorch's). One step runs first as a
 * warm-up (each kernel's first use in the context), then STEPS steps: under callgrind run
 * with --collect-atstart=no, only these are counted (set-up, warm-up and exit are not,
 * whatever they did). Prints
 * "steps=N calls_per_step=C ns_per_step=T" (T: the steps' wall time, CLOCK_MONOTONIC);
 * exits 1 on a driver error, 2 on a bad sequence file.
 */
#define _GNU_SOURCE
#include <time.h>
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else
#define CALLGRIND_TOGGLE_COLLECT
#endif

#include "fakecuda.h"

typedef struct CUlib_st *CUlibrary;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
CUresult cuLibraryLoadData(CUlibrary *library, const void *code, void *jit_options, void **jit_values,
                           unsigned num_jit, void *lib_options, void **lib_values, unsigned num_lib);
CUresult cuLibraryGetKernel(void **kernel, CUlibrary library, const char *name);
CUresult cuKernelGetFunction(void **func, void *kernel);
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, CUstream stream, void **params, void **extra);
/* CUlaunchConfig: grid, block, dynamic shared memory, stream, attributes. */
typedef struct {
    unsigned grid[3], block[3], shared;
    CUstream stream;
    void *attrs;
    unsigned num_attrs;
} LaunchConfig;
CUresult cuLaunchKernelEx(const LaunchConfig *config, void *f, void **params, void **extra);
CUresult cuGraphCreate(CUgraph *graph, unsigned int flags);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags);
CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream);

enum op { LAUNCH, LAUNCH_FN, LAUNCH_EX, LAUNCH_EX_FN, GET_FUNCTION, SYNC, GRAPH_LAUNCH };
struct call {
    enum op op;
    int k;
};

static void **g_kernels, **g_functions;
static CUgraphExec g_exec;

#define CALL(what, call)                                                    \
    do {                                                                     \
        CUresult rc_ = (call);                                               \
        if (rc_ != CUDA_SUCCESS) {                                           \
            fprintf(stderr, "step_replay: %s -> %d\n", (what), rc_);         \
            return 1;                                                        \
        }                                                                    \
    } while (0)

static int step(const struct call *calls, long n) {
    static const LaunchConfig cfg = {{1, 1, 1}, {32, 1, 1}, 0, NULL, NULL, 0};
    for (long i = 0; i < n; i++) {
        const struct call *c = &calls[i];
        void *f;
        switch (c->op) {
        case LAUNCH:
        case LAUNCH_FN:
            f = c->op == LAUNCH ? g_kernels[c->k] : g_functions[c->k];
            CALL("cuLaunchKernel", cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
            break;
        case LAUNCH_EX:
        case LAUNCH_EX_FN:
            f = c->op == LAUNCH_EX ? g_kernels[c->k] : g_functions[c->k];
            CALL("cuLaunchKernelEx", cuLaunchKernelEx(&cfg, f, NULL, NULL));
            break;
        case GET_FUNCTION:
            CALL("cuKernelGetFunction", cuKernelGetFunction(&f, g_kernels[c->k]));
            break;
        case SYNC:
            CALL("cuStreamSynchronize", cuStreamSynchronize(NULL));
            break;
        case GRAPH_LAUNCH:
            CALL("cuGraphLaunch", cuGraphLaunch(g_exec, NULL));
            break;
        }
    }
    return 0;
}

static int parse(FILE *in, struct call **out, long *n, int *kernels) {
    static const struct {
        const char *word;
        enum op op;
        int has_k;
    } ops[] = {{"L", LAUNCH, 1},      {"LF", LAUNCH_FN, 1}, {"X", LAUNCH_EX, 1},    {"XF", LAUNCH_EX_FN, 1},
               {"G", GET_FUNCTION, 1}, {"S", SYNC, 0},       {"GL", GRAPH_LAUNCH, 0}};
    char line[64];
    long cap = 0, lineno = 0;
    *n = 0;
    *kernels = 0;
    while (fgets(line, sizeof line, in)) {
        lineno++;
        char word[8];
        int k = 0, got = sscanf(line, "%7s %d", word, &k);
        if (got < 1 || word[0] == '#') continue;
        size_t j = 0;
        while (j < sizeof ops / sizeof *ops && strcmp(ops[j].word, word) != 0) j++;
        if (j == sizeof ops / sizeof *ops || (ops[j].has_k && (got != 2 || k < 0 || k > 100000))) {
            fprintf(stderr, "step_replay: line %ld: '%s': expected L|LF|X|XF|G <kernel> or S or GL\n", lineno,
                    word);
            return 2;
        }
        if (*n == cap) {
            cap = cap ? 2 * cap : 256;
            *out = realloc(*out, (size_t)cap * sizeof **out);
            if (!*out) return 1;
        }
        (*out)[(*n)++] = (struct call){ops[j].op, k};
        if (ops[j].has_k && k + 1 > *kernels) *kernels = k + 1;
    }
    return *n > 0 ? 0 : 2;
}

int main(int argc, char **argv) {
    if (argc != 3 || atol(argv[2]) < 1) {
        fprintf(stderr, "usage: %s <sequence file> <steps>\n", argv[0]);
        return 2;
    }
    long steps = atol(argv[2]);
    FILE *in = fopen(argv[1], "r");
    if (!in) {
        perror(argv[1]);
        return 2;
    }
    struct call *calls = NULL;
    long n;
    int kernels;
    int rc = parse(in, &calls, &n, &kernels);
    fclose(in);
    if (rc) return rc;

    MUST(cuInit(0));
    CUdevice dev;
    MUST(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    MUST(cuDevicePrimaryCtxRetain(&ctx, dev));
    MUST(cuCtxSetCurrent(ctx));

    /* One library naming kernels k0 .. k<kernels-1>. */
    size_t cap = 128 + (size_t)kernels * 48;
    char *ptx = malloc(cap);
    if (!ptx) return 1;
    size_t len = (size_t)snprintf(ptx, cap, ".version 6.0\n.target sm_50\n.address_size 64\n");
    for (int i = 0; i < kernels; i++)
        len += (size_t)snprintf(ptx + len, cap - len, ".visible .entry k%d()\n{\n\tret;\n}\n", i);
    CUlibrary lib = NULL;
    MUST(cuLibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0));
    g_kernels = calloc((size_t)kernels + 1, sizeof *g_kernels);
    g_functions = calloc((size_t)kernels + 1, sizeof *g_functions);
    if (!g_kernels || !g_functions) return 1;
    for (int i = 0; i < kernels; i++) {
        char name[16];
        snprintf(name, sizeof name, "k%d", i);
        MUST(cuLibraryGetKernel(&g_kernels[i], lib, name));
        MUST(cuKernelGetFunction(&g_functions[i], g_kernels[i]));
    }
    CUgraph graph;
    MUST(cuGraphCreate(&graph, 0));
    MUST(cuGraphInstantiateWithFlags(&g_exec, graph, 0));

    if (step(calls, n)) return 1; /* warm-up: each kernel's first use */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CALLGRIND_TOGGLE_COLLECT;
    for (long s = 0; s < steps; s++)
        if (step(calls, n)) return 1;
    CALLGRIND_TOGGLE_COLLECT;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns = (double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec);
    printf("steps=%ld calls_per_step=%ld ns_per_step=%.0f\n", steps, n, ns / (double)steps);
    return 0;
}
