/*
 * script: runs a list of steps on one GPU, so that tests can choreograph one or two
 * processes sharing a (fake) GPU.
 *
 *   script STEP...
 *
 *   alloc:SIZE     cuMemAlloc_v2; prints "alloc SIZE rc"; keeps the pointer when rc == 0
 *   fill:SIZE      allocate SIZE-sized blocks until one fails; prints "filled N"
 *   write          write a pattern into every kept block (first and last 4 KiB
 *                  of each page-sized stretch), then read it back; prints "verify ok|bad"
 *   free           frees every kept block (last first); prints "free rc" per block
 *   info           prints "info FREE TOTAL" (cuMemGetInfo_v2)
 *   range          prints "range ok|bad" after cuMemGetAddressRange_v2 on each block's
 *                  interior returns its own base and size
 *   kernel         loads a library (cuLibraryLoadData) and launches its kernel k0 for the
 *                  first time (CUDA's lazy loading loads it then: FAKECUDA_LIBRARY_MEM);
 *                  prints "kernel rc"
 *   contexts:N     loads a library and launches its kernel k0 in N contexts it creates (the
 *                  driver loads it into each: FAKECUDA_LIBRARY_MEM each), keeping them;
 *                  prints "contexts N rc" per context (rc of the launch)
 *   getfn          loads a module (cuModuleLoadData) and asks for its function k0 (lazy
 *                  loading loads the kernel there: FAKECUDA_FUNCTION_MEM); prints "getfn rc"
 *   module:SIZE    loads a module (cuModuleLoadData of PTX) whose one global takes SIZE
 *                  (the fake allocates it at the load, as a driver does a module's globals),
 *                  keeping it; prints "module SIZE rc"
 *   stack:K        cuCtxSetLimit(CU_LIMIT_STACK_SIZE) to the default 1 KiB plus K x 512 bytes
 *                  per thread (the fake's stack then takes K x 132 MiB); prints "stack K rc"
 *   graph:SIZE     a graph with one alloc node of SIZE (and its free node), instantiated,
 *                  launched, synchronised and its exec destroyed: the driver keeps the
 *                  graph memory reserved until a trim; prints "graph SIZE rc"
 *   trim           cuDeviceGraphMemTrim: the driver gives back the graph memory no graph
 *                  holds; prints "trim rc"
 *   cache:SIZE     SIZE allocated from the device's default memory pool and freed again
 *                  (cuMemAllocAsync, cuMemFreeAsync, synchronised), the pool set to keep what
 *                  it caches (its release threshold the most): the pool keeps SIZE reserved
 *                  until a trim; prints "cache SIZE rc"
 *   cachefree:SIZE SIZE allocated from the device's default memory pool and freed again
 *                  (cuMemAllocAsync, cuMemFreeAsync), not synchronised, the pool's release
 *                  threshold left at 0: the pool keeps SIZE reserved until the next
 *                  synchronisation releases it; prints "cachefree SIZE rc"
 *   sync           cuCtxSynchronize (pools release what they cache above their release
 *                  threshold); prints "sync rc"
 *   pooltrim       cuMemPoolTrimTo(the default pool, 0): the driver releases what it
 *                  caches; prints "pooltrim rc"
 *   sleep:MS       sleeps MS milliseconds
 *   nvml           NVML's memory figures of its device 0 (libnvidia-ml.so.1 dlopened, as
 *                  pynvml does; nvmlInit_v2, nvmlDeviceGetHandleByIndex_v2,
 *                  nvmlDeviceGetMemoryInfo); prints "nvml RC TOTAL USED" (RC the first
 *                  call that failed, else 0)
 *   closefds       closes every descriptor from 3 up (close_range, as a daemon does at its
 *                  start), gpucap's among them; prints "closefds rc"
 *   reusefds:DIR   opens DIR/fd-N (made, empty) until the numbers 3 to 63 are all open, so
 *                  that the program's own files take the numbers gpucap's descriptors had
 *                  (after closefds); keeps them; prints "reusefds N" (how many it opened)
 *   fork           forks a child that checks that every file reusefds opened is still
 *                  open under its number (gpucap's fork handlers run in the child);
 *                  prints "fork lost N" (how many were not)
 *   arenas         prints "arenas N": the C library's malloc arenas (malloc_info's heaps;
 *                  1 while every thread that freed memory is the main one)
 *   touch:PATH     creates PATH
 *   wait:PATH      waits (up to 60 s) until PATH exists
 *   exec:HOW       replaces the process with the program named by the next argument,
 *                  given the arguments after it (HOW: execv, execve, execvp, or the
 *                  variadic execl, execlp, execle, which take at most 8 of them: the
 *                  last ones then passed on the stack); the steps after it are that
 *                  program's. Exit 3 if it fails
 *
 * The context the steps run in is made on ordinal $SCRIPT_DEVICE (0 when unset).
 * Exit 0 unless a step could not run (exit 3) or a verify/range failed (exit 1).
 */
#define _GNU_SOURCE
#include "fakecuda.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <malloc.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr dptr);
CUresult cuCtxSetLimit(int limit, size_t value);
CUresult cuCtxSynchronize(void);
typedef struct CUmod_st *CUmodule;
typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;
typedef struct CUfunc_st *CUfunction;
CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleGetFunction(CUfunction *func, CUmodule module, const char *name);
CUresult cuLibraryLoadData(CUlibrary *library, const void *code, void *jit_options, void **jit_values,
                           unsigned num_jit, void *lib_options, void **lib_values, unsigned num_lib);
CUresult cuLibraryGetKernel(CUkernel *kernel, CUlibrary library, const char *name);
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, CUstream stream, void **params, void **extra);

static const char PTX[] = ".version 6.0\n.target sm_50\n.address_size 64\n"
                          ".visible .entry k0()\n{\n\tret;\n}\n";

#define MAX_HELD 4096
static CUdeviceptr held[MAX_HELD];
static size_t held_size[MAX_HELD];
static int n_held;
/* The program's own files opened by reusefds, and what each was. */
static struct {
    int fd;
    ino_t ino;
} reused[64];
static int n_reused;

static void pattern(unsigned char *buf, size_t len, CUdeviceptr at) {
    for (size_t i = 0; i < len; i++) buf[i] = (unsigned char)((at + i) * 2654435761u >> 13);
}

/* Writes and reads back 4 KiB at `off` in block `b`; returns 1 when it matched. */
static int probe(int b, size_t off) {
    static unsigned char out[4096], in[4096];
    size_t len = held_size[b] - off < sizeof out ? held_size[b] - off : sizeof out;
    pattern(out, len, held[b] + off);
    MUST(cuMemcpyHtoD_v2(held[b] + off, out, len));
    memset(in, 0, len);
    MUST(cuMemcpyDtoH_v2(in, held[b] + off, len));
    return memcmp(in, out, len) == 0;
}

static int verify_all(void) {
    int good = 1;
    for (int b = 0; b < n_held; b++) {
        for (size_t off = 0; off < held_size[b]; off += 2 * MIB) {
            good &= probe(b, off);
            if (held_size[b] - off > 4096) good &= probe(b, held_size[b] - 4096 > off + 2 * MIB - 4096 ? off + 2 * MIB - 4096 : held_size[b] - 4096);
        }
    }
    /* Read everything back once more: a later write must not have clobbered an
       earlier block (pages shared by two mappings would). */
    for (int b = 0; b < n_held; b++) {
        static unsigned char out[4096], in[4096];
        size_t len = held_size[b] < sizeof out ? held_size[b] : sizeof out;
        pattern(out, len, held[b]);
        MUST(cuMemcpyDtoH_v2(in, held[b], len));
        good &= memcmp(in, out, len) == 0;
    }
    return good;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    CUresult rc = cuInit(0);
    printf("cuInit %d\n", rc);
    if (rc != CUDA_SUCCESS) return 3;
    CUdevice dev;
    CUcontext ctx;
    /* SCRIPT_DEVICE: the ordinal whose context the steps run in (0 if unset). */
    const char *ordinal = getenv("SCRIPT_DEVICE");
    MUST(cuDeviceGet(&dev, ordinal ? atoi(ordinal) : 0));
    MUST(cuCtxCreate_v2(&ctx, 0, dev));
    int status = 0;
    for (int i = 1; i < argc; i++) {
        const char *step = argv[i];
        if (strncmp(step, "alloc:", 6) == 0) {
            size_t size = parse_size(step + 6);
            CUdeviceptr d = 0;
            rc = cuMemAlloc_v2(&d, size);
            printf("alloc %zu %d\n", size, rc);
            if (rc == CUDA_SUCCESS && n_held < MAX_HELD) {
                held[n_held] = d;
                held_size[n_held++] = size;
            }
        } else if (strncmp(step, "fill:", 5) == 0) {
            size_t size = parse_size(step + 5);
            int n = 0;
            CUdeviceptr d = 0;
            while (n_held < MAX_HELD && cuMemAlloc_v2(&d, size) == CUDA_SUCCESS) {
                held[n_held] = d;
                held_size[n_held++] = size;
                n++;
            }
            printf("filled %d\n", n);
        } else if (strcmp(step, "write") == 0) {
            int ok = verify_all();
            printf("verify %s\n", ok ? "ok" : "bad");
            if (!ok) status = 1;
        } else if (strcmp(step, "free") == 0) {
            while (n_held > 0) {
                n_held--;
                printf("free %d\n", cuMemFree_v2(held[n_held]));
            }
        } else if (strcmp(step, "info") == 0) {
            size_t f = 0, t = 0;
            MUST(cuMemGetInfo_v2(&f, &t));
            printf("info %zu %zu\n", f, t);
        } else if (strcmp(step, "range") == 0) {
            int ok = 1;
            for (int b = 0; b < n_held; b++) {
                CUdeviceptr base = 0;
                size_t size = 0;
                MUST(cuMemGetAddressRange_v2(&base, &size, held[b] + held_size[b] / 2));
                ok &= base == held[b] && size == held_size[b];
            }
            printf("range %s\n", ok ? "ok" : "bad");
            if (!ok) status = 1;
        } else if (strcmp(step, "kernel") == 0) {
            CUlibrary lib = NULL;
            CUkernel k = NULL;
            MUST(cuLibraryLoadData(&lib, PTX, NULL, NULL, 0, NULL, NULL, 0));
            MUST(cuLibraryGetKernel(&k, lib, "k0"));
            printf("kernel %d\n", cuLaunchKernel((CUfunction)k, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
        } else if (strncmp(step, "contexts:", 9) == 0) {
            int n = atoi(step + 9);
            CUlibrary lib = NULL;
            CUkernel k = NULL;
            MUST(cuLibraryLoadData(&lib, PTX, NULL, NULL, 0, NULL, NULL, 0));
            MUST(cuLibraryGetKernel(&k, lib, "k0"));
            for (int c = 0; c < n; c++) {
                CUcontext extra = NULL;
                MUST(cuCtxCreate_v2(&extra, 0, dev));
                printf("contexts %d %d\n", c + 1,
                       cuLaunchKernel((CUfunction)k, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
            }
            MUST(cuCtxSetCurrent(ctx));
        } else if (strcmp(step, "getfn") == 0) {
            CUmodule m = NULL;
            CUfunction f = NULL;
            MUST(cuModuleLoadData(&m, PTX));
            printf("getfn %d\n", cuModuleGetFunction(&f, m, "k0"));
        } else if (strncmp(step, "module:", 7) == 0) {
            size_t size = parse_size(step + 7);
            char ptx[256];
            snprintf(ptx, sizeof ptx,
                     ".version 6.0\n.target sm_50\n.address_size 64\n"
                     ".visible .global .align 1 .b8 g[%zu];\n", size);
            CUmodule m = NULL;
            printf("module %zu %d\n", size, cuModuleLoadData(&m, ptx));
        } else if (strncmp(step, "stack:", 6) == 0) {
            int k = atoi(step + 6);
            printf("stack %d %d\n", k, cuCtxSetLimit(0 /* CU_LIMIT_STACK_SIZE */, 1024 + 512 * (size_t)k));
        } else if (strncmp(step, "graph:", 6) == 0) {
            CUDA_MEM_ALLOC_NODE_PARAMS params;
            memset(&params, 0, sizeof params);
            params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
            params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            params.poolProps.location.id = (int)dev;
            params.bytesize = parse_size(step + 6);
            CUgraph g = NULL;
            CUgraphNode alloc_node = NULL, free_node = NULL;
            CUgraphExec e = NULL;
            MUST(cuGraphCreate(&g, 0));
            CUresult grc = cuGraphAddMemAllocNode(&alloc_node, g, NULL, 0, &params);
            if (grc == CUDA_SUCCESS) grc = cuGraphAddMemFreeNode(&free_node, g, &alloc_node, 1, params.dptr);
            if (grc == CUDA_SUCCESS) grc = cuGraphInstantiateWithFlags(&e, g, 0);
            if (grc == CUDA_SUCCESS) {
                grc = cuGraphLaunch(e, NULL);
                if (grc == CUDA_SUCCESS) grc = cuStreamSynchronize(NULL);
                MUST(cuGraphExecDestroy(e));
            }
            MUST(cuGraphDestroy(g));
            printf("graph %zu %d\n", params.bytesize, grc);
        } else if (strcmp(step, "trim") == 0) {
            printf("trim %d\n", cuDeviceGraphMemTrim(dev));
        } else if (strncmp(step, "cache:", 6) == 0) {
            CUmemoryPool pool = NULL;
            unsigned long long keep_all = ~0ull;
            size_t size = parse_size(step + 6);
            CUdeviceptr p = 0;
            MUST(cuDeviceGetDefaultMemPool(&pool, dev));
            MUST(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all));
            CUresult crc = cuMemAllocAsync(&p, size, NULL);
            if (crc == CUDA_SUCCESS) {
                MUST(cuMemFreeAsync(p, NULL));
                MUST(cuStreamSynchronize(NULL));
            }
            printf("cache %zu %d\n", size, crc);
        } else if (strncmp(step, "cachefree:", 10) == 0) {
            size_t size = parse_size(step + 10);
            CUdeviceptr p = 0;
            CUresult crc = cuMemAllocAsync(&p, size, NULL);
            if (crc == CUDA_SUCCESS) MUST(cuMemFreeAsync(p, NULL));
            printf("cachefree %zu %d\n", size, crc);
        } else if (strcmp(step, "sync") == 0) {
            printf("sync %d\n", cuCtxSynchronize());
        } else if (strcmp(step, "pooltrim") == 0) {
            CUmemoryPool pool = NULL;
            MUST(cuDeviceGetDefaultMemPool(&pool, dev));
            printf("pooltrim %d\n", cuMemPoolTrimTo(pool, 0));
        } else if (strncmp(step, "sleep:", 6) == 0) {
            long ms = atol(step + 6);
            struct timespec ts = {ms / 1000, (ms % 1000) * 1000 * 1000};
            nanosleep(&ts, NULL);
        } else if (strcmp(step, "nvml") == 0) {
            struct {
                unsigned long long total, free, used;
            } m = {0, 0, 0};
            void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
            int (*init)(void) = h ? (int (*)(void))dlsym(h, "nvmlInit_v2") : NULL;
            int (*by_index)(unsigned, void **) = h ? (int (*)(unsigned, void **))dlsym(h, "nvmlDeviceGetHandleByIndex_v2") : NULL;
            int (*memory)(void *, void *) = h ? (int (*)(void *, void *))dlsym(h, "nvmlDeviceGetMemoryInfo") : NULL;
            void *dev = NULL;
            int rc = !init || !by_index || !memory ? -1 : init();
            if (rc == 0) rc = by_index(0, &dev);
            if (rc == 0) rc = memory(dev, &m);
            printf("nvml %d %llu %llu\n", rc, m.total, m.used);
        } else if (strcmp(step, "closefds") == 0) {
            printf("closefds %ld\n", syscall(SYS_close_range, 3u, ~0u, 0u));
        } else if (strncmp(step, "reusefds:", 9) == 0) {
            int opened = 0;
            while (n_reused < 64) {
                char path[4096];
                snprintf(path, sizeof path, "%s/fd-%d", step + 9, opened);
                int fd = open(path, O_RDWR | O_CREAT, 0644);
                if (fd < 0 || fd >= 64) {
                    if (fd >= 0) close(fd);
                    break;
                }
                struct stat st;
                fstat(fd, &st);
                reused[n_reused].fd = fd;
                reused[n_reused].ino = st.st_ino;
                n_reused++;
                opened++;
            }
            printf("reusefds %d\n", opened);
        } else if (strcmp(step, "fork") == 0) {
            fflush(stdout);
            pid_t child = fork();
            if (child == 0) {
                int lost = 0;
                for (int r = 0; r < n_reused; r++) {
                    struct stat st;
                    if (fstat(reused[r].fd, &st) != 0 || st.st_ino != reused[r].ino) lost++;
                }
                printf("fork lost %d\n", lost);
                fflush(stdout);
                _exit(0);
            }
            int ws = 0;
            if (child < 0 || waitpid(child, &ws, 0) != child) {
                printf("FATAL fork\n");
                return 3;
            }
        } else if (strcmp(step, "arenas") == 0) {
            char *xml = NULL;
            size_t len = 0;
            FILE *m = open_memstream(&xml, &len);
            int heaps = -1;
            if (m) {
                int ok = malloc_info(0, m) == 0;
                fclose(m);
                for (char *p = ok && xml ? xml : NULL; p && (p = strstr(p, "<heap nr=")); p++) heaps += 1;
                heaps += ok ? 1 : 0;
            }
            free(xml);
            printf("arenas %d\n", heaps);
        } else if (strncmp(step, "exec:", 5) == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "exec: no program\n");
                return 3;
            }
            fflush(stdout);
            char **rest = &argv[i + 1];
            extern char **environ;
            if (strcmp(step + 5, "execv") == 0) execv(rest[0], rest);
            else if (strcmp(step + 5, "execve") == 0) execve(rest[0], rest, environ);
            else if (strcmp(step + 5, "execvp") == 0) execvp(rest[0], rest);
            else if (strncmp(step + 5, "execl", 5) == 0) {
                /* The variadic calls, with the arguments spelled out: at most 8, NULL
                 * after the last (then execle's environment): ten pointers after the
                 * path, the last ones on the stack. */
                char *a[10] = {0};
                int n = argc - (i + 1);
                if (n > 8) {
                    fprintf(stderr, "exec: at most 8 arguments for %s\n", step + 5);
                    return 3;
                }
                for (int k = 0; k < n; k++) a[k] = rest[k];
                a[n + 1] = (char *)environ;
                const char *how = step + 5;
                if (strcmp(how, "execl") == 0)
                    execl(a[0], a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], (char *)NULL);
                else if (strcmp(how, "execlp") == 0)
                    execlp(a[0], a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], (char *)NULL);
                else if (strcmp(how, "execle") == 0)
                    execle(a[0], a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], (char *)NULL, environ);
            }
            fprintf(stderr, "exec %s %s failed\n", step + 5, rest[0]);
            return 3;
        } else if (strncmp(step, "touch:", 6) == 0) {
            int fd = open(step + 6, O_CREAT | O_WRONLY, 0644);
            if (fd >= 0) close(fd);
        } else if (strncmp(step, "wait:", 5) == 0) {
            struct timespec ts = {0, 10 * 1000 * 1000};
            int tries = 6000;
            while (access(step + 5, F_OK) != 0 && tries-- > 0) nanosleep(&ts, NULL);
            if (tries <= 0) {
                printf("FATAL timed out waiting for %s\n", step + 5);
                return 3;
            }
        } else {
            fprintf(stderr, "unknown step %s\n", step);
            return 3;
        }
    }
    return status;
}
