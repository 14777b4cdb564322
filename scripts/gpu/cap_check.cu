// cap_check: what a CUDA runtime (cudart) program sees under gpucap.
//
//   cap_check CAP_BYTES
//
// Built twice by scripts/gpu-check.sh, with nvcc's default static cudart and with
// -cudart shared, and run under `gpucap run --limit CAP_BYTES`. No kernels of its own
// (cudaMemset and cudaMemcpy only), so it runs on any GPU architecture whatever nvcc
// targets by default. Checks, in order:
//   1. cudaMemGetInfo: total == CAP_BYTES, FREE0 = free <= CAP_BYTES (and at least a
//      quarter of it: whatever gpucap charges before the first allocation, such as the
//      context, leaves the program most of its cap);
//   2. an allocation within the cap (half of FREE0) works: cudaMemset + host/device
//      round trips; free drops by at least its size;
//   3. a second allocation that would take the process past the cap (0.6 of FREE0)
//      fails with cudaErrorMemoryAllocation, as does one larger than the whole cap;
//   4. the process goes on: the first allocation is still usable, and once it is freed
//      the 0.6-of-FREE0 allocation succeeds.
// Prints INFO lines, then one "OK: ..." line (exit 0) or "FAIL: ..." line (exit 1).
#include <cuda_runtime.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static const size_t MiB = size_t(1) << 20;

static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    exit(1);
}

static void info(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("INFO: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
}

static double mib(size_t n) { return double(n) / double(MiB); }

// Must succeed: FAIL with the call and the error name otherwise.
static void must(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        fail("%s -> %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
    }
}

// Rounds down to a multiple of 2 MiB (at least 2 MiB).
static size_t align2m(double bytes) {
    size_t b = size_t(bytes) & ~(2 * MiB - 1);
    return b < 2 * MiB ? 2 * MiB : b;
}

// Copies the first and last MiB of [p, p + size) to the host and compares each byte
// with `expect`.
static void expect_bytes(const unsigned char *p, size_t size, unsigned char expect, const char *what) {
    size_t n = size < MiB ? size : MiB;
    std::vector<unsigned char> host(n);
    const size_t offsets[2] = {0, size - n};
    for (size_t o : offsets) {
        must(cudaMemcpy(host.data(), p + o, n, cudaMemcpyDeviceToHost), "cudaMemcpy (device to host)");
        for (size_t i = 0; i < n; i++) {
            if (host[i] != expect) {
                fail("%s: byte %zu of the allocation is 0x%02x, expected 0x%02x", what, o + i, host[i], expect);
            }
        }
    }
}

// An allocation that must be refused with cudaErrorMemoryAllocation.
static void expect_refused(size_t bytes, const char *what) {
    void *q = nullptr;
    cudaError_t e = cudaMalloc(&q, bytes);
    if (e == cudaSuccess) {
        cudaFree(q);
        fail("%s: cudaMalloc(%.1f MiB) succeeded past the cap", what, mib(bytes));
    }
    // Not a sticky error: clear it from the thread's last-error slot.
    cudaError_t last = cudaGetLastError();
    if (e != cudaErrorMemoryAllocation) {
        fail("%s: cudaMalloc(%.1f MiB) -> %s (%d), expected cudaErrorMemoryAllocation", what, mib(bytes),
             cudaGetErrorName(e), int(e));
    }
    if (last != cudaErrorMemoryAllocation && last != cudaSuccess) {
        fail("%s: cudaGetLastError() after the refusal -> %s", what, cudaGetErrorName(last));
    }
    info("%s: cudaMalloc(%.1f MiB) -> cudaErrorMemoryAllocation", what, mib(bytes));
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s CAP_BYTES\n", argv[0]);
        return 2;
    }
    char *end = nullptr;
    unsigned long long cap_arg = strtoull(argv[1], &end, 10);
    if (end == argv[1] || *end != '\0' || cap_arg < 8 * MiB) {
        fprintf(stderr, "cap_check: bad CAP_BYTES '%s' (a number of bytes, at least 8 MiB)\n", argv[1]);
        return 2;
    }
    const size_t cap = size_t(cap_arg);

    int runtime_version = 0, driver_version = 0;
    cudaRuntimeGetVersion(&runtime_version);
    cudaDriverGetVersion(&driver_version);
    info("cudart %d, driver API %d, cap %.1f MiB", runtime_version, driver_version, mib(cap));

    must(cudaSetDevice(0), "cudaSetDevice(0)");
    must(cudaFree(nullptr), "cudaFree(0) (context creation)");
    cudaDeviceProp prop;
    must(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    info("device 0: %s, totalGlobalMem %.1f MiB", prop.name, mib(prop.totalGlobalMem));

    // 1. The memory figures show the cap.
    size_t free0 = 0, total0 = 0;
    must(cudaMemGetInfo(&free0, &total0), "cudaMemGetInfo");
    info("cudaMemGetInfo: free %.1f MiB, total %.1f MiB", mib(free0), mib(total0));
    if (total0 != cap) {
        fail("cudaMemGetInfo total is %zu bytes (%.1f MiB), not the cap %zu", total0, mib(total0), cap);
    }
    if (free0 > cap) {
        fail("cudaMemGetInfo free %zu is more than the cap %zu", free0, cap);
    }
    if (free0 < cap / 4) {
        fail("cudaMemGetInfo free is only %.1f MiB of the %.1f MiB cap before any allocation", mib(free0), mib(cap));
    }

    // 2. Within the cap: half of what is free, written and read back.
    const size_t a_bytes = align2m(double(free0) * 0.5);
    unsigned char *a = nullptr;
    must(cudaMalloc(reinterpret_cast<void **>(&a), a_bytes), "cudaMalloc within the cap");
    must(cudaMemset(a, 0x5A, a_bytes), "cudaMemset");
    must(cudaDeviceSynchronize(), "cudaDeviceSynchronize after cudaMemset");
    expect_bytes(a, a_bytes, 0x5A, "after cudaMemset");
    {
        // host -> device -> host with a pattern, in the middle of the allocation
        std::vector<unsigned char> pattern(MiB), back(MiB);
        for (size_t i = 0; i < MiB; i++) {
            pattern[i] = static_cast<unsigned char>((i * 2654435761u) >> 13);
        }
        unsigned char *mid = a + a_bytes / 2;
        must(cudaMemcpy(mid, pattern.data(), MiB, cudaMemcpyHostToDevice), "cudaMemcpy (host to device)");
        must(cudaMemcpy(back.data(), mid, MiB, cudaMemcpyDeviceToHost), "cudaMemcpy (device to host)");
        if (memcmp(pattern.data(), back.data(), MiB) != 0) {
            fail("host -> device -> host round trip of 1 MiB changed the data");
        }
        // device -> device
        must(cudaMemcpy(a, mid, MiB, cudaMemcpyDeviceToDevice), "cudaMemcpy (device to device)");
        must(cudaMemcpy(back.data(), a, MiB, cudaMemcpyDeviceToHost), "cudaMemcpy (device to host)");
        if (memcmp(pattern.data(), back.data(), MiB) != 0) {
            fail("device -> device copy of 1 MiB changed the data");
        }
    }
    size_t free1 = 0, total1 = 0;
    must(cudaMemGetInfo(&free1, &total1), "cudaMemGetInfo");
    info("after cudaMalloc(%.1f MiB): free %.1f MiB, total %.1f MiB", mib(a_bytes), mib(free1), mib(total1));
    if (free1 > cap - a_bytes) {
        fail("cudaMemGetInfo free is %.1f MiB with %.1f MiB of the %.1f MiB cap allocated", mib(free1), mib(a_bytes),
             mib(cap));
    }

    // 3. Past the cap: fails with cudaErrorMemoryAllocation.
    const size_t b_bytes = align2m(double(free0) * 0.6);
    expect_refused(b_bytes, "past the cap (second allocation)");
    expect_refused(cap + 64 * MiB, "larger than the cap");

    // 4. The process goes on.
    must(cudaMemset(a, 0x11, MiB), "cudaMemset after the refusals");
    must(cudaDeviceSynchronize(), "cudaDeviceSynchronize after the refusals");
    {
        std::vector<unsigned char> host(MiB);
        must(cudaMemcpy(host.data(), a, MiB, cudaMemcpyDeviceToHost), "cudaMemcpy (device to host)");
        for (size_t i = 0; i < MiB; i++) {
            if (host[i] != 0x11) {
                fail("after the refusals: byte %zu is 0x%02x, expected 0x11", i, host[i]);
            }
        }
    }
    must(cudaFree(a), "cudaFree");
    void *b = nullptr;
    must(cudaMalloc(&b, b_bytes), "cudaMalloc of 0.6 of the cap after freeing the first allocation");
    must(cudaMemset(b, 0x22, b_bytes), "cudaMemset");
    must(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    expect_bytes(static_cast<unsigned char *>(b), b_bytes, 0x22, "after freeing and allocating again");
    must(cudaFree(b), "cudaFree");
    size_t free2 = 0, total2 = 0;
    must(cudaMemGetInfo(&free2, &total2), "cudaMemGetInfo");
    info("after freeing everything: free %.1f MiB, total %.1f MiB", mib(free2), mib(total2));

    printf("OK: cudaMemGetInfo total = cap (%.1f MiB); %.1f MiB within the cap written and read back; "
           "%.1f MiB more and %.1f MiB at once refused with cudaErrorMemoryAllocation; "
           "%.1f MiB allocated after the free\n",
           mib(cap), mib(a_bytes), mib(b_bytes), mib(cap + 64 * MiB), mib(b_bytes));
    return 0;
}
