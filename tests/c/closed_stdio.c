/*
 * closed_stdio: a program that closed some of its standard descriptors before its first
 * CUDA call (a daemon, a program started with `<&-` or `2>&-`), then allocates, and
 * opens a file of its own after.
 *
 *   closed_stdio OUT FDS SIZE...
 *
 * OUT: where it reports (its stdout may be closed); FDS: the descriptors it closes, as
 * digits ("2", "012"). Reports "cuInit RC", "alloc SIZE RC" per size, "next N" (the
 * number its own `open` of /dev/null got, 100 ms later: the lowest free one) and, for each descriptor
 * 0-2 open at the end, "fd N TARGET" (where it leads). Exit 0.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fakecuda.h"

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    int out = open(argv[1], O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) return 2;
    /* The report's descriptor kept clear of the numbers under test. */
    int report = fcntl(out, F_DUPFD_CLOEXEC, 100);
    close(out);
    for (const char *d = argv[2]; *d; d++) close(*d - '0');
    FILE *f = fdopen(report, "w");
    setvbuf(f, NULL, _IOLBF, 0);
    fprintf(f, "cuInit %d\n", cuInit(0));
    CUdevice dev;
    CUcontext ctx;
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuCtxCreate_v2(&ctx, 0, dev));
    for (int i = 3; i < argc; i++) {
        CUdeviceptr p;
        fprintf(f, "alloc %s %d\n", argv[i], cuMemAlloc_v2(&p, strtoull(argv[i], NULL, 0)));
    }
    /* A moment for gpucap's threads (a claim's serving thread) to be waiting. */
    usleep(100 * 1000);
    fprintf(f, "next %d\n", open("/dev/null", O_RDONLY));
    for (int d = 0; d < 3; d++) {
        char link[64], target[512];
        snprintf(link, sizeof link, "/proc/self/fd/%d", d);
        ssize_t n = readlink(link, target, sizeof target - 1);
        if (n < 0) continue;
        target[n] = 0;
        fprintf(f, "fd %d %s\n", d, target);
    }
    return 0;
}
