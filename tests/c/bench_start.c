/*
 * bench_start: N processes started at once, each making its CUDA context and taking one
 * block; how long until every one holds its block (scripts/bench/bench-start.sh).
 *
 *   bench_start N [PRELOAD]
 *
 * Forks N children; each sets LD_PRELOAD=PRELOAD (when given) and execs this program
 * again as a member, which calls cuInit, makes its primary context current, allocates
 * 1 MiB, says so on a pipe (its index, 4 bytes) and then blocks reading a second pipe
 * (no polling: a waiting member costs no CPU) until the launcher closes it. The
 * launcher itself never calls CUDA nor loads the shim. Prints one line:
 *
 *   n=N all_ms=T median_ms=M p90_ms=P max_ms=X failed=F
 *
 * all_ms: from the first fork until the last member holds its block; the others: each
 * member's own time from its fork until it holds its block. Exit 1 if any member failed.
 * With BENCH_START_HOLD=1 the members keep their blocks, once the line is printed, until
 * a line (or the end) on the launcher's standard input (a test looks at the pool then).
 *
 *   bench_start once
 *
 * One member's start alone, in this process (no fork, no pipe): cuInit, the primary
 * context made current, 1 MiB allocated and freed; exit 0 if all succeeded. What
 * `scripts/bench/bench-start.sh --instructions` counts under callgrind.
 *
 *   bench_start faults
 *
 * The same start, then prints the page faults the process took (minor and major, its
 * whole life so far: `minflt=M majflt=J`): what a start touches of the pool file shows
 * there (tests/bench/join_faults.rs).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fakecuda.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* A member's start: cuInit, the primary context made current, 1 MiB in *d. */
static CUresult start(CUdeviceptr *d) {
    CUcontext ctx = NULL;
    CUresult rc = cuInit(0);
    if (rc == CUDA_SUCCESS) rc = cuDevicePrimaryCtxRetain(&ctx, 0);
    if (rc == CUDA_SUCCESS) rc = cuCtxSetCurrent(ctx);
    if (rc == CUDA_SUCCESS) rc = cuMemAlloc_v2(d, MIB);
    return rc;
}

static int member(int index, int ready_fd, int go_fd) {
    CUdeviceptr d = 0;
    CUresult rc = start(&d);
    int32_t word = rc == CUDA_SUCCESS ? index : -1 - index;
    if (write(ready_fd, &word, sizeof word) != (ssize_t)sizeof word) return 3;
    char c;
    while (read(go_fd, &c, 1) < 0 && errno == EINTR) {
    }
    if (d) cuMemFree_v2(d);
    return rc == CUDA_SUCCESS ? 0 : 1;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One start in this process: see "bench_start once" above. */
static int once(void) {
    CUdeviceptr d = 0;
    CUresult rc = start(&d);
    if (rc == CUDA_SUCCESS) rc = cuMemFree_v2(d);
    if (rc != CUDA_SUCCESS) fprintf(stderr, "bench_start once: driver error %d\n", rc);
    return rc == CUDA_SUCCESS ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "once") == 0) return once();
    if (argc == 2 && strcmp(argv[1], "faults") == 0) {
        int rc = once();
        struct rusage ru;
        if (getrusage(RUSAGE_SELF, &ru) != 0) return 2;
        printf("minflt=%ld majflt=%ld\n", ru.ru_minflt, ru.ru_majflt);
        return rc;
    }
    if (argc == 5 && strcmp(argv[1], "member") == 0)
        return member(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
    if (argc < 2 || argc > 3 || atoi(argv[1]) < 1) {
        fprintf(stderr, "usage: %s N [PRELOAD] | %s once | %s faults\n", argv[0], argv[0], argv[0]);
        return 2;
    }
    int n = atoi(argv[1]);
    const char *preload = argc == 3 ? argv[2] : NULL;
    int ready[2], go[2];
    if (pipe(ready) != 0 || pipe(go) != 0) {
        perror("pipe");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    double *forked = calloc((size_t)n, sizeof *forked);
    double *took = calloc((size_t)n, sizeof *took);
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    if (!forked || !took || !pids) return 2;
    char rfd[16], gfd[16], idx[16];
    snprintf(rfd, sizeof rfd, "%d", ready[1]);
    snprintf(gfd, sizeof gfd, "%d", go[0]);
    double t0 = now_ms();
    for (int i = 0; i < n; i++) {
        forked[i] = now_ms();
        pid_t p = fork();
        if (p < 0) {
            perror("fork");
            return 2;
        }
        if (p == 0) {
            close(ready[0]);
            close(go[1]);
            if (preload) setenv("LD_PRELOAD", preload, 1);
            snprintf(idx, sizeof idx, "%d", i);
            execl("/proc/self/exe", argv[0], "member", idx, rfd, gfd, (char *)NULL);
            _exit(127);
        }
        pids[i] = p;
    }
    close(ready[1]);
    close(go[0]);
    int got = 0, failed = 0;
    double last = t0;
    while (got < n) {
        int32_t word;
        ssize_t r = read(ready[0], &word, sizeof word);
        if (r < 0 && errno == EINTR) continue;
        if (r != (ssize_t)sizeof word) break; /* every member exited */
        last = now_ms();
        int i = word < 0 ? -1 - word : word;
        if (i < 0 || i >= n) break;
        if (word < 0) failed++;
        took[i] = last - forked[i];
        got++;
    }
    qsort(took, (size_t)got, sizeof *took, cmp);
    double median = got ? took[got / 2] : 0, p90 = got ? took[(got * 9) / 10] : 0, max = got ? took[got - 1] : 0;
    printf("n=%d all_ms=%.1f median_ms=%.1f p90_ms=%.1f max_ms=%.1f failed=%d\n", n, last - t0, median, p90, max,
           failed + n - got);
    fflush(stdout);
    const char *hold = getenv("BENCH_START_HOLD");
    if (hold && strcmp(hold, "1") == 0) {
        char line[8];
        if (!fgets(line, sizeof line, stdin)) line[0] = 0;
    }
    close(go[1]);
    for (int i = 0; i < n; i++) waitpid(pids[i], NULL, 0);
    failed += n - got; /* members that exited without saying */
    return failed ? 1 : 0;
}
