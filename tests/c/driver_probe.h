/*
 * driver_probe.h: the machinery of tests/c/driver_probe.c (see there): the driver API it
 * needs beyond fakecuda.h, its output lines, NVML loaded at run time, and the parent that
 * runs each group in a child process and writes the JSON document.
 */
#ifndef GPUCAP_TESTS_DRIVER_PROBE_H
#define GPUCAP_TESTS_DRIVER_PROBE_H

#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fakecuda.h"

/* ---- driver API beyond fakecuda.h (documented signatures and values) ------ */

typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev);
CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr);
CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr dptr);
CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props);
CUresult cuMemPoolDestroy(CUmemoryPool pool);
CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value);
CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleUnload(CUmodule module);
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name);
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, CUstream stream, void **params, void **extra);
CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule m, const char *name);
CUresult cuCtxSynchronize(void);
CUresult cuCtxSetLimit(int limit, size_t value);
CUresult cuCtxGetLimit(size_t *value, int limit);
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes);
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n);
typedef struct CUlib_st *CUlibrary;
CUresult cuLibraryLoadData(CUlibrary *library, const void *code, void *jit_options, void **jit_values,
                           unsigned int num_jit, void *lib_options, void **lib_values, unsigned int num_lib);
CUresult cuLibraryUnload(CUlibrary library);
CUresult cuLibraryGetModule(CUmodule *module, CUlibrary library);
typedef struct CUkern_st *CUkernel;
CUresult cuLibraryGetKernel(CUkernel *kernel, CUlibrary library, const char *name);
CUresult cuKernelGetAttribute(int *value, int attribute, CUkernel kernel, CUdevice dev);
CUresult cuKernelGetFunction(CUfunction *function, CUkernel kernel);
CUresult cuKernelSetAttribute(int attribute, int value, CUkernel kernel, CUdevice dev);
CUresult cuFuncIsLoaded(int *state, CUfunction function);
CUresult cuFuncLoad(CUfunction function);
CUresult cuFuncSetBlockShape(CUfunction f, int x, int y, int z);
CUresult cuLaunch(CUfunction f);
CUresult cuLibraryGetManaged(CUdeviceptr *dptr, size_t *bytes, CUlibrary library, const char *name);
CUresult cuLaunchGrid(CUfunction f, int w, int h);
CUresult cuFuncGetAttribute(int *value, int attribute, CUfunction function);
CUresult cuFuncSetAttribute(CUfunction function, int attribute, int value);
CUresult cuFuncGetName(const char **name, CUfunction function);
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, CUfunction function, int block_size,
                                                     size_t dynamic_smem);
CUresult cuGetExportTable(const void **table, const unsigned char *uuid);

#define ATTR_CC_MAJOR 75
#define ATTR_CC_MINOR 76
#define POOL_ATTRS 8 /* CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES (1) .. USED_MEM_HIGH (8) */
static const char *const POOL_ATTR_NAMES[POOL_ATTRS + 1] = {
    "", "reuse_follow_event_dependencies", "reuse_allow_opportunistic",
    "reuse_allow_internal_dependencies", "release_threshold", "reserved_mem_current",
    "reserved_mem_high", "used_mem_current", "used_mem_high"};

/* ---- output: "A key<TAB>json" (answer) and "M key<TAB>json" (machine) lines -- */

static void line(char kind, const char *key, const char *json) {
    printf("%c %s\t%s\n", kind, key, json);
    fflush(stdout);
}
static void ans_int(const char *key, long long v) {
    char b[32];
    snprintf(b, sizeof b, "%lld", v);
    line('A', key, b);
}
static void ans_bool(const char *key, int v) { line('A', key, v ? "true" : "false"); }
static void mach_int(const char *key, long long v) {
    char b[32];
    snprintf(b, sizeof b, "%lld", v);
    line('M', key, b);
}
static void mach_str(const char *key, const char *s) {
    char b[512];
    size_t n = 0;
    b[n++] = '"';
    for (; *s && n < sizeof b - 3; s++) {
        if (*s == '"' || *s == '\\') b[n++] = '\\';
        b[n++] = (unsigned char)*s < 0x20 ? '?' : *s;
    }
    b[n++] = '"';
    b[n] = 0;
    line('M', key, b);
}

/* A return code: the answer is the code itself. */
#define RC(key, call) ans_int(key, (long long)(call))

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static size_t info_free(void) {
    size_t f = 0, t = 0;
    return cuMemGetInfo_v2(&f, &t) == CUDA_SUCCESS ? f : 0;
}

static CUcontext primary(void) {
    CUcontext ctx = NULL;
    MUST(cuInit(0));
    MUST(cuDevicePrimaryCtxRetain(&ctx, 0));
    MUST(cuCtxSetCurrent(ctx));
    return ctx;
}

/* A pointer attribute as {"rc":R} or {"rc":0,"value":V}. */
static void ptr_attr(const char *key, int attr, CUdeviceptr p) {
    unsigned long long v = 0; /* large enough for every attribute (pointers, u64 sizes) */
    CUresult rc = cuPointerGetAttribute(&v, attr, p);
    char b[96];
    if (rc == CUDA_SUCCESS) snprintf(b, sizeof b, "{\"rc\":0,\"value\":%llu}", v);
    else snprintf(b, sizeof b, "{\"rc\":%d}", rc);
    line('A', key, b);
}

/* ---- NVML, loaded at run time (absent on some machines) ------------------- */

typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;
static struct {
    int (*init)(void);
    int (*handle)(unsigned int, nvmlDevice_t *);
    int (*memory)(nvmlDevice_t, nvmlMemory_t *);
    int (*memory_v2)(nvmlDevice_t, nvmlMemory_v2_t *);
    int (*procs)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);
    int (*name)(nvmlDevice_t, char *, unsigned int);
    int (*driver)(char *, unsigned int);
    nvmlDevice_t dev;
} nv;

static int nvml_open(void) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!h) return 0;
    *(void **)&nv.init = dlsym(h, "nvmlInit_v2");
    *(void **)&nv.handle = dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    *(void **)&nv.memory = dlsym(h, "nvmlDeviceGetMemoryInfo");
    *(void **)&nv.memory_v2 = dlsym(h, "nvmlDeviceGetMemoryInfo_v2");
    *(void **)&nv.procs = dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v3");
    *(void **)&nv.name = dlsym(h, "nvmlDeviceGetName");
    *(void **)&nv.driver = dlsym(h, "nvmlSystemGetDriverVersion");
    if (!nv.init || !nv.handle || !nv.memory || !nv.memory_v2 || !nv.procs) return 0;
    return nv.init() == 0 && nv.handle(0, &nv.dev) == 0;
}

static unsigned long long nvml_used(void) {
    nvmlMemory_t m = {0};
    return nv.memory(nv.dev, &m) == 0 ? m.used : 0;
}

/* This process in NVML's compute processes: -1 if not listed, else its used memory. */
static long long nvml_own(const char *key) {
    nvmlProcessInfo_t p[64];
    unsigned int n = 64;
    int rc = nv.procs(nv.dev, &n, p);
    char k[96];
    snprintf(k, sizeof k, "%s.rc", key);
    ans_int(k, rc);
    if (rc != 0) return -1;
    for (unsigned int i = 0; i < n; i++)
        if (p[i].pid == (unsigned int)getpid()) return (long long)p[i].usedGpuMemory;
    return -1;
}

/* ---- the parent: runs each group in a child and collects its lines --------- */

/* What the children printed, by kind. */
static char *g_out[3]; /* answers, machine, requests */
static size_t g_len[3];

static void append(int which, const char *key, const char *json) {
    size_t need = 2 * strlen(key) + strlen(json) + 16;
    g_out[which] = realloc(g_out[which], g_len[which] + need);
    char *o = g_out[which] + g_len[which];
    o += sprintf(o, "%s\n    \"", g_len[which] ? "," : "");
    for (const char *k = key; *k; k++) { /* the key as a JSON string: '"' and '\\' escaped */
        if (*k == '"' || *k == '\\') *o++ = '\\';
        *o++ = *k;
    }
    o += sprintf(o, "\": %s", json);
    g_len[which] = (size_t)(o - g_out[which]);
}

static void run_group(const char *name, void (*fn)(void)) {
    int fd[2];
    if (pipe(fd) != 0) exit(3);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 1);
        alarm(60);
        fn();
        printf("A %s.done\ttrue\n", name);
        fflush(stdout);
        _exit(0);
    }
    close(fd[1]);
    FILE *in = fdopen(fd[0], "r");
    char l[4096];
    while (fgets(l, sizeof l, in)) {
        l[strcspn(l, "\n")] = 0;
        char *tab = strchr(l, '\t');
        int which = l[0] == 'A' ? 0 : l[0] == 'M' ? 1 : l[0] == 'R' ? 2 : -1;
        if (which >= 0 && l[1] == ' ' && tab) {
            *tab = 0;
            append(which, l + 2, tab + 1);
        } else {
            fprintf(stderr, "driver_probe: %s: %s\n", name, l); /* FATAL lines and the like */
        }
    }
    fclose(in);
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        char key[64], why[64];
        snprintf(key, sizeof key, "%s.crashed", name);
        if (WIFSIGNALED(st)) snprintf(why, sizeof why, "\"signal %d\"", WTERMSIG(st));
        else snprintf(why, sizeof why, "\"exit %d\"", WEXITSTATUS(st));
        append(0, key, why);
        fprintf(stderr, "driver_probe: group %s ended abnormally (%s)\n", name, why);
    }
}

/* The document: what the children printed, by kind. */
static void print_document(void) {
    printf("{\n  \"schema\": 1,\n  \"machine\": {%s\n  },\n  \"answers\": {%s\n  },\n"
           "  \"requests\": {%s\n  },\n  \"accepted\": []\n}\n",
           g_out[1] ? g_out[1] : "", g_out[0] ? g_out[0] : "", g_out[2] ? g_out[2] : "");
}

#endif /* GPUCAP_TESTS_DRIVER_PROBE_H */
