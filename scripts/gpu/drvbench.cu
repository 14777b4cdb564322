// drvbench: driver-API helper of scripts/gpu-check.sh (built with `nvcc -O2 ... -lcuda`).
//
//   drvbench pair SIZE TARGET_MS       time cuMemAlloc + cuMemFree pairs of SIZE bytes
//   drvbench churn TARGET_MS MAX_BYTES  time alloc/free churn over 32 live blocks of
//                                      64 KiB .. MAX_BYTES (a fixed pseudo-random
//                                      sequence, the same in every run)
//   drvbench ctx                       create the first context, print
//                                      "READY free=F total=T" (cuMemGetInfo as this
//                                      process sees it), then wait for a line (or EOF)
//                                      on stdin and exit
//
// pair and churn warm up, then run until TARGET_MS have passed (at least 16
// iterations) and print "RESULT <ns per pair/op> iterations=N" as the last line.
// Any driver error prints "FAIL: ..." and exits 1. Uses the primary context of device
// 0 (CUDA_VISIBLE_DEVICES picks the GPU).
#include <cstring>
#include <vector>

#include "drv_common.h"

static unsigned long long parse_u64(const char *s, const char *what) {
    char *end = nullptr;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || *end != '\0' || v == 0) {
        fprintf(stderr, "drvbench: bad %s '%s' (a positive whole number)\n", what, s);
        exit(2);
    }
    return v;
}

static void pair_once(size_t size) {
    CUdeviceptr p = 0;
    check(cuMemAlloc(&p, size), "cuMemAlloc");
    check(cuMemFree(p), "cuMemFree");
}

static int bench_pair(size_t size, int64_t target_ns) {
    init_context();
    for (int i = 0; i < 16; i++) {
        pair_once(size);
    }
    long n = 0;
    const int64_t t0 = now_ns();
    int64_t t1 = t0;
    do {
        for (int i = 0; i < 16; i++) {
            pair_once(size);
        }
        n += 16;
        t1 = now_ns();
    } while (t1 - t0 < target_ns);
    printf("RESULT %.1f iterations=%ld size=%zu\n", double(t1 - t0) / double(n), n, size);
    return 0;
}

// xorshift64: the same sequence in every run, with and without the shim.
static uint64_t next_rand(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

static size_t churn_size(uint64_t *s, int max_log2) {
    // a power of two from 64 KiB to MAX_BYTES / 2, plus up to as much again, in 4 KiB
    // steps: sizes spread over the whole range, few of them powers of two
    const int lo = 16;
    int e = lo + int(next_rand(s) % uint64_t(max_log2 - lo));
    size_t base = size_t(1) << e;
    size_t extra = size_t(next_rand(s) % base) & ~size_t(4095);
    return base + extra;
}

static int bench_churn(int64_t target_ns, size_t max_bytes) {
    int max_log2 = 0;
    while ((size_t(2) << max_log2) <= max_bytes) {
        max_log2++;
    }
    // max_log2 = floor(log2(max_bytes)); sizes stay below 2^max_log2 <= max_bytes
    if (max_log2 <= 16) {
        fprintf(stderr, "drvbench: MAX_BYTES must be at least 128 KiB\n");
        return 2;
    }
    init_context();
    const int slots = 32;
    std::vector<CUdeviceptr> live(slots, 0);
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < slots; i++) {
        check(cuMemAlloc(&live[i], churn_size(&seed, max_log2)), "cuMemAlloc (fill)");
    }
    auto op = [&]() {
        int i = int(next_rand(&seed) % slots);
        check(cuMemFree(live[i]), "cuMemFree");
        live[i] = 0;
        check(cuMemAlloc(&live[i], churn_size(&seed, max_log2)), "cuMemAlloc");
    };
    for (int i = 0; i < 4 * slots; i++) {
        op();
    }
    long n = 0;
    const int64_t t0 = now_ns();
    int64_t t1 = t0;
    do {
        for (int i = 0; i < 16; i++) {
            op();
        }
        n += 16;
        t1 = now_ns();
    } while (t1 - t0 < target_ns);
    for (int i = 0; i < slots; i++) {
        check(cuMemFree(live[i]), "cuMemFree (drain)");
    }
    printf("RESULT %.1f iterations=%ld max_bytes=%zu\n", double(t1 - t0) / double(n), n, max_bytes);
    return 0;
}

static int ctx_probe() {
    init_context();
    size_t free_b = 0, total_b = 0;
    check(cuMemGetInfo(&free_b, &total_b), "cuMemGetInfo");
    printf("READY free=%zu total=%zu\n", free_b, total_b);
    fflush(stdout);
    char line[64];
    if (fgets(line, sizeof line, stdin) == nullptr) {
        // EOF: the parent is done (or gone)
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "pair") == 0 && argc == 4) {
        size_t size = size_t(parse_u64(argv[2], "SIZE"));
        int64_t target = int64_t(parse_u64(argv[3], "TARGET_MS")) * 1000000;
        return bench_pair(size, target);
    }
    if (argc >= 2 && strcmp(argv[1], "churn") == 0 && argc == 4) {
        int64_t target = int64_t(parse_u64(argv[2], "TARGET_MS")) * 1000000;
        size_t max_bytes = size_t(parse_u64(argv[3], "MAX_BYTES"));
        return bench_churn(target, max_bytes);
    }
    if (argc == 2 && strcmp(argv[1], "ctx") == 0) {
        return ctx_probe();
    }
    fprintf(stderr,
            "usage: drvbench pair SIZE TARGET_MS\n"
            "       drvbench churn TARGET_MS MAX_BYTES\n"
            "       drvbench ctx\n");
    return 2;
}
