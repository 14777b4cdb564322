/*
 * pool_fork: a pool member that forks.
 *
 *   pool_fork MODE READY GO
 *
 * Joins the pool (cuInit), allocates 600 MiB on GPU 0, then forks a child:
 *   exit   the child exits at once with exit(0) (exit handlers and the shim's run);
 *   cuda   the child uses CUDA itself: cuInit, a context, then allocates 300 MiB and
 *          200 MiB, printing "child alloc SIZE rc" for each, and exits;
 *   sleep  the child never uses CUDA: it prints "child up" (past fork and its
 *          handlers) and sleeps until killed (it keeps the parent's open files, as
 *          children of servers do);
 *   nocuinit  the child allocates 300 MiB without cuInit, in the context it inherited
 *          (the fake lets it; a real driver usually refuses), printing "child alloc
 *          300 rc", creates READY and waits for GO before it exits;
 *   nocuinit_late  the same, but the parent creates READY and waits for GO before it
 *          forks (the test changes the pool's directory meanwhile).
 * or, without forking:
 *   exec   the process execs READY (a program) with GO as its one argument: the new
 *          image starts afresh, with the 600 MiB of the old one gone.
 * The parent waits for the child (except in sleep mode), creates READY and waits
 * (up to 60 s) for GO, then exits. Prints "child pid N" in sleep mode.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fakecuda.h"

static void touch(const char *p) {
    int fd = open(p, O_CREAT | O_WRONLY, 0644);
    if (fd >= 0) close(fd);
}

static void wait_for(const char *p) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    for (int i = 0; i < 6000 && access(p, F_OK) != 0; i++) nanosleep(&ts, NULL);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 4) return 3;
    const char *mode = argv[1];
    CUresult rc = cuInit(0);
    printf("cuInit %d\n", rc);
    if (rc != CUDA_SUCCESS) return 3;
    context_on_gpu0();
    CUdeviceptr d;
    printf("parent alloc %d\n", cuMemAlloc_v2(&d, 600 * MIB));
    if (strcmp(mode, "exec") == 0) {
        execl(argv[2], argv[2], argv[3], (char *)NULL);
        perror("execl");
        return 3;
    }
    if (strcmp(mode, "nocuinit_late") == 0) {
        touch(argv[2]);
        wait_for(argv[3]);
    }
    pid_t child = fork();
    if (child == 0) {
        if (strcmp(mode, "exit") == 0) exit(0);
        if (strcmp(mode, "cuda") == 0) {
            CUresult r = cuInit(0);
            printf("child cuInit %d\n", r);
            context_on_gpu0();
            CUdeviceptr a, b;
            printf("child alloc 300 %d\n", cuMemAlloc_v2(&a, 300 * MIB));
            printf("child alloc 200 %d\n", cuMemAlloc_v2(&b, 200 * MIB));
            exit(0);
        }
        if (strncmp(mode, "nocuinit", 8) == 0) {
            CUdeviceptr a;
            printf("child alloc 300 %d\n", cuMemAlloc_v2(&a, 300 * MIB));
            touch(argv[2]);
            wait_for(argv[3]);
            exit(0);
        }
        printf("child up\n");
        for (;;) pause();
    }
    if (strcmp(mode, "sleep") == 0) {
        printf("child pid %d\n", (int)child);
    } else {
        int st;
        waitpid(child, &st, 0);
    }
    touch(argv[2]);
    wait_for(argv[3]);
    return 0;
}
