/*
 * Stand-in cuda.h for tests/standins/bin/nvcc: the tests' hand-written driver API header
 * (tests/c/fakecuda.h, not NVIDIA's cuda.h) plus the #define layer of cuda.h that
 * scripts/gpu/drvbench.cu relies on: cuMemAlloc/cuMemFree/cuMemGetInfo name the _v2
 * exports, as with NVIDIA's header.
 */
#ifndef GPUCAP_STANDIN_CUDA_H
#define GPUCAP_STANDIN_CUDA_H

#include "../../c/fakecuda.h"

#define cuMemAlloc cuMemAlloc_v2
#define cuMemFree cuMemFree_v2
#define cuMemGetInfo cuMemGetInfo_v2

#endif
