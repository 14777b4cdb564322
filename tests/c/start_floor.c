/*
 * start_floor: the least a preloaded cap of gpucap's design does at a process's start,
 * for `scripts/bench/bench-start.sh --floor` to measure beside gpucap. Preloaded like the
 * shim; at load it
 *
 *   - loads the driver's NVML and reads a GPU's memory twice (gpucap measures a first
 *     context by NVML's figures before and after it), and
 *   - shows the process as gpucap shows a lone one: a sealed memfd of the live figures
 *     (the size of gpucap's lone layout, mapped, one page written) and a visible file in
 *     $BENCH_FLOOR_DIR made under a temporary name, written (two ranges, as gpucap's copy)
 *     and renamed into place; removed at exit.
 *
 * Nothing else: no configuration, no hooks, no driver function resolved, no cap. What a
 * start with gpucap costs beyond this one is gpucap's own (docs/src/performance.md,
 * "The floor of the design"). A step that fails prints why and ends the process
 * with status 3: the benchmark's start then fails, never measures less than the floor.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* gpucap's lone file: 64 KiB of figures, then a 4 KiB header (gpucap_core::lone). */
#define FIGURES_BYTES 65536
#define FILE_BYTES (FIGURES_BYTES + 4096)

static char visible[256];

static void fail(const char *what) {
    fprintf(stderr, "start_floor: %s failed\n", what);
    _exit(3);
}

static void nvml(void) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!h) fail("dlopen libnvidia-ml.so.1");
    unsigned (*init)(void) = (unsigned (*)(void))dlsym(h, "nvmlInit_v2");
    unsigned (*by_index)(unsigned, void **) =
        (unsigned (*)(unsigned, void **))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    unsigned (*memory)(void *, unsigned long long *) =
        (unsigned (*)(void *, unsigned long long *))dlsym(h, "nvmlDeviceGetMemoryInfo");
    void *device = NULL;
    unsigned long long info[3];
    if (!init || !by_index || !memory || init() != 0 || by_index(0, &device) != 0)
        fail("NVML's initialisation");
    if (memory(device, info) != 0 || memory(device, info) != 0) fail("nvmlDeviceGetMemoryInfo");
}

static void show(void) {
    const char *dir = getenv("BENCH_FLOOR_DIR");
    if (!dir) fail("BENCH_FLOOR_DIR (unset)");
    int figures = memfd_create("start-floor", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (figures < 0 || ftruncate(figures, FILE_BYTES) != 0 ||
        fcntl(figures, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0)
        fail("the figures' memfd");
    char *words = mmap(NULL, FILE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, figures, 0);
    if (words == MAP_FAILED) fail("mapping the memfd");
    words[FIGURES_BYTES] = 1;
    if (fcntl(figures, F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_FUTURE_WRITE) != 0) fail("sealing");
    char tmp[256];
    snprintf(tmp, sizeof tmp, "%s/.%d.lone.new", dir, (int)getpid());
    snprintf(visible, sizeof visible, "%s/%d.lone", dir, (int)getpid());
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) fail("creating the visible file");
    static char page[4096];
    if (pwrite(fd, page, 576, 0) != 576 || pwrite(fd, page, 4096, FIGURES_BYTES) != 4096)
        fail("writing the visible file");
    if (rename(tmp, visible) != 0) fail("naming the visible file");
}

__attribute__((constructor)) static void start_floor(void) {
    nvml();
    show();
}

__attribute__((destructor)) static void end_floor(void) {
    if (visible[0]) unlink(visible);
}
