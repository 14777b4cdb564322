/*
 * Stand-in cuda.h for tests/standins/bin/nvcc: the tests' hand-written driver API header
 * (tests/c/fakecuda.h, not NVIDIA's cuda.h) plus the #define layer of cuda.h that
 * scripts/gpu/drvbench.cu relies on: cuMemAlloc/cuMemFree/cuMemGetInfo name the _v2
 * exports, as with NVIDIA's header; and the module, launch, capture and graph calls of
 * scripts/gpu/launchbench.cu, declared as NVIDIA's cuda.h declares them.
 */
#ifndef GPUCAP_STANDIN_CUDA_H
#define GPUCAP_STANDIN_CUDA_H

#include "../../c/fakecuda.h"

#define cuMemAlloc cuMemAlloc_v2
#define cuMemFree cuMemFree_v2
#define cuMemGetInfo cuMemGetInfo_v2
#define cuMemcpyDtoH cuMemcpyDtoH_v2
#define cuStreamBeginCapture cuStreamBeginCapture_v2

typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
#define CU_STREAM_NON_BLOCKING 0x1
#define CU_STREAM_CAPTURE_MODE_GLOBAL 0

#ifdef __cplusplus
extern "C" {
#endif
CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);
CUresult cuModuleUnload(CUmodule hmod);
CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                        void **kernelParams, void **extra);
CUresult cuStreamBeginCapture_v2(CUstream hStream, int mode);
CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                     unsigned long long flags);
CUresult cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream);
CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream);
CUresult cuGraphExecDestroy(CUgraphExec hGraphExec);
CUresult cuGraphDestroy(CUgraph hGraph);
#ifdef __cplusplus
}
#endif

#endif
