// Diagnostic: which NVML process calls nvidia-smi makes, with what arguments.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
typedef int r_t;
typedef void *dev_t_;
typedef struct { unsigned version, mode, n; void *arr; } dl_t;
#define FWD(name, ...) static r_t (*real)(); if (!real) real = (r_t(*)())dlsym(RTLD_NEXT, #name);
r_t nvmlDeviceGetRunningProcessDetailList(dev_t_ d, dl_t *l) {
    FWD(nvmlDeviceGetRunningProcessDetailList)
    unsigned v = l ? l->version : 0, m = l ? l->mode : 0, n = l ? l->n : 0;
    r_t rc = real(d, l);
    fprintf(stderr, "DIAG DetailList version=0x%x mode=%u n_in=%u arr=%p -> rc=%d n_out=%u\n", v, m, n, l ? l->arr : 0, rc, l ? l->n : 0);
    return rc;
}
#define CNT(name) r_t name(dev_t_ d, unsigned *c, void *a) { FWD(name) unsigned in = c ? *c : 0; r_t rc = real(d, c, a); \
    fprintf(stderr, "DIAG " #name " in=%u arr=%p -> rc=%d out=%u\n", in, a, rc, c ? *c : 0); return rc; }
CNT(nvmlDeviceGetComputeRunningProcesses)
CNT(nvmlDeviceGetComputeRunningProcesses_v2)
CNT(nvmlDeviceGetComputeRunningProcesses_v3)
CNT(nvmlDeviceGetGraphicsRunningProcesses)
CNT(nvmlDeviceGetGraphicsRunningProcesses_v2)
CNT(nvmlDeviceGetGraphicsRunningProcesses_v3)
CNT(nvmlDeviceGetMPSComputeRunningProcesses)
CNT(nvmlDeviceGetMPSComputeRunningProcesses_v2)
CNT(nvmlDeviceGetMPSComputeRunningProcesses_v3)
