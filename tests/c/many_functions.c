/*
 * many_functions <n> [heap]: a module of n kernels (PTX written here: k0 .. k<n-1>), each asked
 * for with cuModuleGetFunction (under CUDA's eager loading, CUDA's runtime asks for every
 * function it registers: TensorFlow's, 49,086), then each launched twice. Between the two
 * phases it writes "many_functions: launches" to stderr, so that a test can count the
 * driver calls (FAKECUDA_TRACE) the launches made beside their own: tests/cap/escapes.rs.
 * "heap": the malloc heap raised to 64 MiB (cuCtxSetLimit) just before the launches, which
 * the driver takes at a later launch, not at the call.
 */
#include "fakecuda.h"

typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuCtxSetLimit(int limit, size_t value);
CUresult cuModuleGetFunction(CUfunction *func, CUmodule module, const char *name);
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, CUstream stream, void **params, void **extra);

int main(int argc, char **argv) {
    if (argc != 2 && !(argc == 3 && strcmp(argv[2], "heap") == 0)) {
        fprintf(stderr, "usage: %s <n> [heap]\n", argv[0]);
        return 2;
    }
    long n = atol(argv[1]);
    if (n <= 0 || n > 1000000) return 2;
    const char head[] = ".version 6.0\n.target sm_50\n.address_size 64\n";
    size_t cap = sizeof head + (size_t)n * 48;
    char *ptx = malloc(cap);
    CUfunction *f = calloc((size_t)n, sizeof *f);
    if (!ptx || !f) return 3;
    size_t len = (size_t)snprintf(ptx, cap, "%s", head);
    for (long i = 0; i < n; i++)
        len += (size_t)snprintf(ptx + len, cap - len, ".visible .entry k%ld()\n{\n\tret;\n}\n", i);
    MUST(cuInit(0));
    context_on_gpu0();
    CUmodule mod;
    MUST(cuModuleLoadData(&mod, ptx));
    char name[32];
    for (long i = 0; i < n; i++) {
        snprintf(name, sizeof name, "k%ld", i);
        MUST(cuModuleGetFunction(&f[i], mod, name));
    }
    if (argc == 3) MUST(cuCtxSetLimit(2 /* CU_LIMIT_MALLOC_HEAP_SIZE */, 64u << 20));
    fprintf(stderr, "many_functions: launches\n");
    for (int round = 0; round < 2; round++)
        for (long i = 0; i < n; i++) MUST(cuLaunchKernel(f[i], 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    printf("launched %ld functions twice\n", n);
    return 0;
}
