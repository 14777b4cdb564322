/*
 * launch_loop <n> [gl]: a library's kernel (a CUkernel, as CUDA 13's runtime launches
 * them) used n times in each of two contexts: n cuLaunchKernel and n cuKernelGetFunction
 * in the first, then the second made current and n launches there, then the first again
 * and n launches. "gl": then a third context made and pushed by cuGLCtxCreate (the
 * deprecated OpenGL-interop creator) and n launches there. tests/cap/escapes.rs counts the driver calls the shim adds (FAKECUDA_TRACE):
 * what is asked once per context switch, not once per launch.
 */
#include "fakecuda.h"

typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;
typedef struct CUfunc_st *CUfunction;
CUresult cuLibraryLoadData(CUlibrary *library, const void *code, void *jit_options, void **jit_values,
                           unsigned num_jit, void *lib_options, void **lib_values, unsigned num_lib);
CUresult cuLibraryGetKernel(CUkernel *kernel, CUlibrary library, const char *name);
CUresult cuKernelGetFunction(CUfunction *func, CUkernel kernel);
CUresult cuGLCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice dev);
CUresult cuLaunchKernel(CUkernel f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, CUstream stream, void **params, void **extra);

static void launches(CUkernel k, long n) {
    for (long i = 0; i < n; i++) MUST(cuLaunchKernel(k, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
}

int main(int argc, char **argv) {
    if (argc != 2 && !(argc == 3 && strcmp(argv[2], "gl") == 0)) {
        fprintf(stderr, "usage: %s <n> [gl]\n", argv[0]);
        return 2;
    }
    long n = atol(argv[1]);
    static const char ptx[] = ".version 6.0\n.target sm_50\n.address_size 64\n"
                              ".visible .entry k()\n{\n\tret;\n}\n";
    MUST(cuInit(0));
    CUdevice dev;
    MUST(cuDeviceGet(&dev, 0));
    CUcontext a, b;
    MUST(cuCtxCreate_v2(&b, 0, dev));
    MUST(cuCtxCreate_v2(&a, 0, dev));
    CUlibrary lib;
    MUST(cuLibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0));
    CUkernel k;
    MUST(cuLibraryGetKernel(&k, lib, "k"));
    launches(k, n);
    for (long i = 0; i < n; i++) {
        CUfunction f;
        MUST(cuKernelGetFunction(&f, k));
    }
    MUST(cuCtxSetCurrent(b));
    launches(k, n);
    MUST(cuCtxSetCurrent(a));
    launches(k, n);
    if (argc == 3) {
        CUcontext g;
        MUST(cuGLCtxCreate_v2(&g, 0, dev));
        launches(k, n);
    }
    printf("launch_loop: %ld launches in each of two contexts\n", n);
    return 0;
}
