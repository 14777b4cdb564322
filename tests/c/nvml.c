/*
 * nvml: what NVML reports, read the ways programs read it.
 *
 *   nvml list <linked|dl>         every NVML device (and MIG instance): uuid, memory v1 and v2
 *   nvml consistent <linked|dl> <alloc>
 *                                 allocates <alloc> with CUDA on ordinal 0, then compares
 *                                 NVML's figures for the same GPU (found by UUID) with
 *                                 cuMemGetInfo_v2
 *   nvml denied <linked|dl>       NVML device 0's memory (v1 and v2) and processes (v1, v3)
 *                                 must be refused with NVML_ERROR_NO_PERMISSION (4): what
 *                                 gpucap answers under an invalid configuration
 *   nvml procs <linked|dl> [cuda] every NVML device as `list` shows it, then its compute
 *                                 processes by nvmlDeviceGetComputeRunningProcesses, _v2 and
 *                                 _v3, each asked as clients ask (the size query with
 *                                 *infoCount = 0 and no array, an array one too small, then
 *                                 a larger one), NVML's count protocol checked on the way;
 *                                 with `cuda`, after cuInit and a context on ordinal 0 (a
 *                                 process that uses CUDA but allocates nothing)
 *
 * Output lines (list): "dev <nvml index>[.mig] uuid=<uuid> total=B free=B used=B
 * v2total=B v2reserved=B v2free=B v2used=B"; procs adds "proc <nvml index> <v1|v2|v3>
 * pid=P used=B gi=G ci=C" per process (gi, ci: 4294967295 outside MIG; v1 has neither).
 * "linked" calls the symbols this program is linked with (-lnvidia-ml); "dl" dlopens
 * libnvidia-ml.so.1 and uses dlsym, as pynvml and frameworks do.
 */
#define _GNU_SOURCE
#include "fakecuda.h"

#include <dlfcn.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
#define NVML_MEMORY_V2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;
/* What _v2 and _v3 fill (nvmlProcessInfo_v2_t; _v3's nvmlProcessInfo_t is the same). */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t;
#define NVML_ERROR_INSUFFICIENT_SIZE 7

nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlShutdown(void);
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory);
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                 nvmlDevice_t *mig);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *count,
                                                  nvmlProcessInfo_v1_t *infos);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_v2_t *infos);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_v2_t *infos);
CUresult cuDeviceGetUuid_v2(unsigned char uuid[16], CUdevice dev);

static struct {
    nvmlReturn_t (*init)(void);
    nvmlReturn_t (*count)(unsigned int *);
    nvmlReturn_t (*handle)(unsigned int, nvmlDevice_t *);
    nvmlReturn_t (*uuid)(nvmlDevice_t, char *, unsigned int);
    nvmlReturn_t (*mem)(nvmlDevice_t, nvmlMemory_t *);
    nvmlReturn_t (*mem2)(nvmlDevice_t, nvmlMemory_v2_t *);
    nvmlReturn_t (*mig)(nvmlDevice_t, unsigned int, nvmlDevice_t *);
    nvmlReturn_t (*procs1)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_v1_t *);
    nvmlReturn_t (*procs2)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_v2_t *);
    nvmlReturn_t (*procs3)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_v2_t *);
} N;

static void bind(const char *how) {
    if (strcmp(how, "linked") == 0) {
        N.init = nvmlInit_v2;
        N.count = nvmlDeviceGetCount_v2;
        N.handle = nvmlDeviceGetHandleByIndex_v2;
        N.uuid = nvmlDeviceGetUUID;
        N.mem = nvmlDeviceGetMemoryInfo;
        N.mem2 = nvmlDeviceGetMemoryInfo_v2;
        N.mig = nvmlDeviceGetMigDeviceHandleByIndex;
        N.procs1 = nvmlDeviceGetComputeRunningProcesses;
        N.procs2 = nvmlDeviceGetComputeRunningProcesses_v2;
        N.procs3 = nvmlDeviceGetComputeRunningProcesses_v3;
        return;
    }
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("FATAL dlopen(libnvidia-ml.so.1): %s\n", dlerror());
        exit(3);
    }
#define SYM(field, name)                                          \
    do {                                                          \
        *(void **)&N.field = dlsym(h, name);                      \
        if (!N.field) {                                           \
            printf("FATAL dlsym(%s): %s\n", name, dlerror());     \
            exit(3);                                              \
        }                                                         \
    } while (0)
    SYM(init, "nvmlInit_v2");
    SYM(count, "nvmlDeviceGetCount_v2");
    SYM(handle, "nvmlDeviceGetHandleByIndex_v2");
    SYM(uuid, "nvmlDeviceGetUUID");
    SYM(mem, "nvmlDeviceGetMemoryInfo");
    SYM(mem2, "nvmlDeviceGetMemoryInfo_v2");
    SYM(mig, "nvmlDeviceGetMigDeviceHandleByIndex");
    SYM(procs1, "nvmlDeviceGetComputeRunningProcesses");
    SYM(procs2, "nvmlDeviceGetComputeRunningProcesses_v2");
    SYM(procs3, "nvmlDeviceGetComputeRunningProcesses_v3");
}

static void show(const char *label, nvmlDevice_t d) {
    char uuid[96] = {0};
    nvmlMemory_t m = {0};
    nvmlMemory_v2_t m2 = {0};
    m2.version = NVML_MEMORY_V2;
    int r1 = N.uuid(d, uuid, sizeof uuid), r2 = N.mem(d, &m), r3 = N.mem2(d, &m2);
    CHECK(r1 == 0 && r2 == 0 && r3 == 0, "%s: nvmlDeviceGetUUID/GetMemoryInfo/_v2 -> %d %d %d", label,
          r1, r2, r3);
    printf("dev %s uuid=%s total=%llu free=%llu used=%llu v2total=%llu v2reserved=%llu v2free=%llu "
           "v2used=%llu\n",
           label, uuid, m.total, m.free, m.used, m2.total, m2.reserved, m2.free, m2.used);
    CHECK(m.total == m.free + m.used, "%s: v1 total = free + used", label);
    CHECK(m2.total == m2.reserved + m2.free + m2.used, "%s: v2 total = reserved + free + used", label);
    CHECK(m.total == m2.total && m.free == m2.free, "%s: v1 and v2 agree", label);
}

static void list(void) {
    unsigned int n = 0;
    MUST(N.init());
    MUST(N.count(&n));
    printf("count %u\n", n);
    for (unsigned int i = 0; i < n; i++) {
        nvmlDevice_t d;
        MUST(N.handle(i, &d));
        char label[32];
        snprintf(label, sizeof label, "%u", i);
        show(label, d);
        nvmlDevice_t mig;
        if (N.mig(d, 0, &mig) == 0) {
            snprintf(label, sizeof label, "%u.mig", i);
            show(label, mig);
        }
    }
}

static void format_uuid(const unsigned char u[16], char *out) {
    sprintf(out, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
            u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

static void consistent(size_t bytes) {
    MUST(cuInit(0));
    CUcontext ctx;
    MUST(cuDevicePrimaryCtxRetain(&ctx, 0));
    MUST(cuCtxSetCurrent(ctx));
    CUdeviceptr p = 0;
    if (bytes) MUST(cuMemAlloc_v2(&p, bytes));
    size_t free = 0, total = 0;
    MUST(cuMemGetInfo_v2(&free, &total));
    unsigned char u[16];
    char want[64];
    MUST(cuDeviceGetUuid_v2(u, 0));
    format_uuid(u, want);

    unsigned int n = 0;
    MUST(N.init());
    MUST(N.count(&n));
    int found = 0;
    for (unsigned int i = 0; i < n; i++) {
        nvmlDevice_t d, mig;
        MUST(N.handle(i, &d));
        nvmlDevice_t cands[2] = {d, NULL};
        if (N.mig(d, 0, &mig) == 0) cands[1] = mig;
        for (int c = 0; c < 2 && cands[c]; c++) {
            char uuid[96] = {0};
            MUST(N.uuid(cands[c], uuid, sizeof uuid));
            if (strlen(uuid) < 4 || strcmp(uuid + 4, want) != 0) continue;
            found = 1;
            nvmlMemory_t m = {0};
            nvmlMemory_v2_t m2 = {0};
            m2.version = NVML_MEMORY_V2;
            MUST(N.mem(cands[c], &m));
            MUST(N.mem2(cands[c], &m2));
            printf("cuda free=%zu total=%zu nvml %s total=%llu free=%llu used=%llu\n", free, total,
                   uuid, m.total, m.free, m.used);
            printf("nvml v2 %s total=%llu reserved=%llu free=%llu used=%llu\n", uuid, m2.total, m2.reserved,
                   m2.free, m2.used);
            /* As a real driver's NVML: the total is CUDA's plus what the driver reserves
               (v2's reserved; 0 under a cap), which v1 counts as used; free is CUDA's. */
            CHECK(m.total == total + m2.reserved && m.free == free,
                  "NVML %s (total %llu, free %llu) agrees with cuMemGetInfo_v2 (total %zu + reserved %llu, free %zu)",
                  uuid, m.total, m.free, total, m2.reserved, free);
            CHECK(m2.total == m.total && m2.free == free && m2.used + m2.reserved == m.used &&
                      m2.free + m2.used + m2.reserved == m2.total,
                  "NVML v2 %s agrees with v1 and cuMemGetInfo_v2", uuid);
        }
    }
    CHECK(found, "an NVML device has CUDA ordinal 0's UUID %s", want);
    if (p) MUST(cuMemFree_v2(p));
}

#define MAX_PROCS 64

/* One version of the process query, asked as clients ask it; prints the processes. The
   v1 array is read through the v2 struct's first two fields only. */
static void procs_of(const char *label, nvmlDevice_t d, int version) {
    nvmlProcessInfo_v1_t p1[MAX_PROCS];
    nvmlProcessInfo_v2_t p2[MAX_PROCS];
    /* Size query: *infoCount = 0, no array. */
    unsigned int n = 0;
    int rc = version == 1 ? N.procs1(d, &n, NULL) : version == 2 ? N.procs2(d, &n, NULL) : N.procs3(d, &n, NULL);
    CHECK((rc == 0 && n == 0) || (rc == NVML_ERROR_INSUFFICIENT_SIZE && n > 0),
          "%s v%d: the size query -> %d with count %u (SUCCESS for none, else INSUFFICIENT_SIZE "
          "with the count)",
          label, version, rc, n);
    if (rc != 0 && rc != NVML_ERROR_INSUFFICIENT_SIZE) return;
    CHECK(n < MAX_PROCS - 4, "%s v%d: %u processes", label, version, n);
    if (n >= MAX_PROCS - 4) return;
    /* One too small: INSUFFICIENT_SIZE, the count needed, nothing written. */
    if (n > 0) {
        unsigned int small = n - 1;
        memset(p1, 0xab, sizeof p1);
        memset(p2, 0xab, sizeof p2);
        rc = version == 1 ? N.procs1(d, &small, p1) : version == 2 ? N.procs2(d, &small, p2) : N.procs3(d, &small, p2);
        CHECK(rc == NVML_ERROR_INSUFFICIENT_SIZE && small == n,
              "%s v%d: an array of %u -> %d, count %u (INSUFFICIENT_SIZE, count %u)", label, version,
              n - 1, rc, small, n);
        CHECK(p1[0].pid == 0xabababab && p2[0].pid == 0xabababab, "%s v%d: nothing written to a small array",
              label, version);
    }
    /* Room for more: SUCCESS, the count written. */
    unsigned int room = n + 4;
    memset(p1, 0xab, sizeof p1);
    memset(p2, 0xab, sizeof p2);
    rc = version == 1 ? N.procs1(d, &room, p1) : version == 2 ? N.procs2(d, &room, p2) : N.procs3(d, &room, p2);
    CHECK(rc == 0 && room == n, "%s v%d: an array of %u -> %d, count %u (SUCCESS, count %u)", label,
          version, n + 4, rc, room, n);
    if (rc != 0) return;
    CHECK(p1[room].pid == 0xabababab && p2[room].pid == 0xabababab,
          "%s v%d: nothing written past the count", label, version);
    for (unsigned int i = 0; i < room; i++) {
        if (version == 1)
            printf("proc %s v1 pid=%u used=%llu\n", label, p1[i].pid, p1[i].usedGpuMemory);
        else
            printf("proc %s v%d pid=%u used=%llu gi=%u ci=%u\n", label, version, p2[i].pid,
                   p2[i].usedGpuMemory, p2[i].gpuInstanceId, p2[i].computeInstanceId);
    }
}

static void procs(int cuda) {
    if (cuda) {
        MUST(cuInit(0));
        CUcontext ctx;
        MUST(cuDevicePrimaryCtxRetain(&ctx, 0));
        MUST(cuCtxSetCurrent(ctx));
    }
    unsigned int n = 0;
    MUST(N.init());
    MUST(N.count(&n));
    printf("count %u\n", n);
    for (unsigned int i = 0; i < n; i++) {
        nvmlDevice_t d;
        MUST(N.handle(i, &d));
        char label[32];
        snprintf(label, sizeof label, "%u", i);
        show(label, d);
        for (int v = 1; v <= 3; v++) procs_of(label, d, v);
    }
}

static void denied(void) {
    nvmlDevice_t d;
    MUST(N.init());
    MUST(N.handle(0, &d));
    nvmlMemory_t m = {0};
    nvmlMemory_v2_t m2 = {0};
    m2.version = NVML_MEMORY_V2;
    int r1 = N.mem(d, &m), r2 = N.mem2(d, &m2);
    unsigned int n1 = 0, n3 = 0;
    int r3 = N.procs1(d, &n1, NULL), r4 = N.procs3(d, &n3, NULL);
    printf("denied v1=%d v2=%d procs=%d,%d total=%llu\n", r1, r2, r3, r4, m.total);
    CHECK(r1 == 4 && r2 == 4, "nvmlDeviceGetMemoryInfo/_v2 -> %d %d, expected NVML_ERROR_NO_PERMISSION (4)",
          r1, r2);
    CHECK(r3 == 4 && r4 == 4 && n1 == 0 && n3 == 0,
          "nvmlDeviceGetComputeRunningProcesses/_v3 -> %d %d, expected NVML_ERROR_NO_PERMISSION (4)", r3, r4);
    CHECK(m.total == 0 && m2.total == 0, "no figures written when refused");
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 3 && strcmp(argv[1], "list") == 0) {
        bind(argv[2]);
        list();
    } else if (argc == 3 && strcmp(argv[1], "denied") == 0) {
        bind(argv[2]);
        denied();
    } else if ((argc == 3 || argc == 4) && strcmp(argv[1], "procs") == 0) {
        bind(argv[2]);
        procs(argc == 4 && strcmp(argv[3], "cuda") == 0);
    } else if (argc == 4 && strcmp(argv[1], "consistent") == 0) {
        bind(argv[2]);
        consistent(parse_size(argv[3]));
    } else {
        fprintf(stderr,
                "usage: %s list <linked|dl> | consistent <linked|dl> <bytes> | denied <linked|dl> | "
                "procs <linked|dl> [cuda]\n",
                argv[0]);
        return 2;
    }
    return finish();
}
