/*
 * fork: children that never touch CUDA, forked from a process that does.
 *
 *   fork <cap>
 *
 * 1. Allocate half the cap, fork a child that exits normally with exit(0) (atexit
 *    handlers and library destructors run in it), another that execs /bin/true
 *    (which loads the preloaded shim afresh), and one that _exit()s.
 * 2. Fork 20 more times while two threads keep allocating and freeing, so locks of
 *    the shim (and of the fake) may be held at the moment of fork(); each child
 *    exits with exit(0) and must not hang (alarm: 10 s).
 * 3. The parent frees everything: free == total == cap.
 * The Rust test also requires an empty stderr.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fakecuda.h"

static size_t g_cap;
static CUcontext g_ctx;
static volatile int g_stop;
static long g_churn;

static void *churn(void *arg) {
    (void)arg;
    if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS) return NULL;
    while (!g_stop) {
        CUdeviceptr d;
        if (cuMemAlloc_v2(&d, 64 * KIB) == CUDA_SUCCESS) {
            cuMemFree_v2(d);
            __atomic_add_fetch(&g_churn, 1, __ATOMIC_RELAXED);
        }
    }
    return NULL;
}

static int wait_child(pid_t pid, const char *what) {
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) {
        CHECK(0, "waitpid(%s)", what);
        return -1;
    }
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child (%s) exited 0 (status %#x%s)", what,
          status, WIFSIGNALED(status) ? ", killed by a signal" : "");
    return status;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s <cap>\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    g_cap = parse_size(argv[1]);
    MUST(cuInit(0));
    CUdevice dev;
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuCtxCreate_v2(&g_ctx, 0, dev));

    CUdeviceptr half;
    MUST(cuMemAlloc_v2(&half, g_cap / 2));
    fflush(stdout);

    pid_t pid = fork();
    if (pid == 0) {
        alarm(10);
        exit(0);
    }
    wait_child(pid, "exit(0)");

    pid = fork();
    if (pid == 0) {
        alarm(10);
        execl("/bin/true", "true", (char *)NULL);
        _exit(127);
    }
    wait_child(pid, "exec /bin/true");

    pid = fork();
    if (pid == 0) _exit(0);
    wait_child(pid, "_exit(0)");

    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, churn, NULL);
    for (int i = 0; i < 20; i++) {
        usleep(2000);
        fflush(stdout);
        pid = fork();
        if (pid == 0) {
            alarm(10);
            exit(0);
        }
        wait_child(pid, "exit(0) while other threads allocate");
    }
    g_stop = 1;
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    printf("info churn: %ld alloc/free pairs during the forks\n", g_churn);

    size_t f = 0, tot = 0;
    MUST(cuMemGetInfo_v2(&f, &tot));
    CHECK(f == g_cap - g_cap / 2 && tot == g_cap, "parent: half the cap still charged (free %zu of %zu)", f,
          tot);
    MUST(cuMemFree_v2(half));
    MUST(cuMemGetInfo_v2(&f, &tot));
    CHECK(f == g_cap && tot == g_cap, "parent: after freeing, free == total == cap (%zu, %zu)", f, tot);
    CUdeviceptr d;
    CUresult rc = cuMemAlloc_v2(&d, g_cap);
    CHECK(rc == CUDA_SUCCESS, "parent: the whole cap can be allocated again -> %d", rc);
    if (rc == CUDA_SUCCESS) MUST(cuMemFree_v2(d));
    return finish();
}
