/*
 * growth_small: many small and mixed-size allocations on GPU 0, for growth mode's
 * sub-allocation (tests/cap/growth_small.rs).
 *
 *   growth_small STEP...
 *
 *   many:N:SIZE    N x cuMemAlloc_v2(SIZE), kept; stops at the first failure;
 *                  prints "many N SIZE ok K rc RC" (K successes, RC the failure or 0)
 *   alloc:SIZE     one cuMemAlloc_v2, kept when it succeeds; prints "alloc SIZE RC"
 *   write          writes a tag into the first and last 512 bytes of every kept block,
 *                  then reads all back; prints "verify ok|bad" (overlapping blocks fail)
 *   range          cuMemGetAddressRange_v2 at each block's base, middle and last byte
 *                  must give its base and size; prints "range ok|bad"
 *   align          every kept pointer is 512-aligned; prints "align ok|bad"
 *   free           frees every kept block (last first); prints "freed K failed F"
 *   refree         frees the last pointer freed again; prints "refree RC"
 *   free-interior  cuMemFree_v2 of the last kept block's base + 512; prints
 *                  "free-interior RC" (the block stays kept)
 *   info           prints "info FREE TOTAL" (cuMemGetInfo_v2)
 *   other:KIND:SIZE one allocation that growth mode does not serve, then its free:
 *                  KIND pitch (cuMemAllocPitch_v2, SIZE bytes as rows of 1 MiB), managed
 *                  (cuMemAllocManaged), async (cuMemAllocAsync on the default stream,
 *                  synced) or create (cuMemCreate of SIZE rounded up to the granularity);
 *                  prints "other KIND SIZE RC"
 *   mixed:SEED:OPS:BUDGET
 *                  a random workload (fixed seed): allocations of small (512 B to
 *                  1 MiB, log-uniform) and large (1 to 24 MiB) sizes, odd sizes included,
 *                  interleaved with frees of random live blocks, at most BUDGET bytes
 *                  live. Before each allocation cuMemGetInfo_v2's free figure is read:
 *                  an allocation refused although that figure was at least its size is
 *                  a broken promise. Each block's tag is checked when it is freed.
 *                  Frees everything at the end; prints
 *                  "mixed allocs A small S large L refused R broken B bad D"
 *
 * Exit 0 unless a step could not run (exit 3).
 */
#define _GNU_SOURCE
#include "fakecuda.h"

CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr dptr);

#define MAX_HELD 20000
static CUdeviceptr held[MAX_HELD];
static size_t held_size[MAX_HELD];
static int n_held;
static CUdeviceptr last_freed;

static size_t tag_len(size_t size) { return size < 512 ? size : 512; }

static void tag(unsigned char *buf, size_t len, CUdeviceptr block, size_t off) {
    for (size_t i = 0; i < len; i++) buf[i] = (unsigned char)((block + off + i) * 2654435761u >> 11);
}

static void write_tags(CUdeviceptr d, size_t size) {
    unsigned char buf[512];
    size_t len = tag_len(size);
    tag(buf, len, d, 0);
    MUST(cuMemcpyHtoD_v2(d, buf, len));
    tag(buf, len, d, size - len);
    MUST(cuMemcpyHtoD_v2(d + size - len, buf, len));
}

static int check_tags(CUdeviceptr d, size_t size) {
    unsigned char want[512], got[512];
    size_t len = tag_len(size);
    int ok = 1;
    tag(want, len, d, 0);
    MUST(cuMemcpyDtoH_v2(got, d, len));
    ok &= memcmp(want, got, len) == 0;
    tag(want, len, d, size - len);
    MUST(cuMemcpyDtoH_v2(got, d + size - len, len));
    ok &= memcmp(want, got, len) == 0;
    return ok;
}

static int range_ok(CUdeviceptr d, size_t size) {
    CUdeviceptr at[3] = {d, d + size / 2, d + size - 1};
    int ok = 1;
    for (int i = 0; i < 3; i++) {
        CUdeviceptr base = 0;
        size_t got = 0;
        ok &= cuMemGetAddressRange_v2(&base, &got, at[i]) == CUDA_SUCCESS && base == d && got == size;
    }
    return ok;
}

static uint64_t rng;
static uint64_t next(void) { /* xorshift64* */
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 2685821657736338717ULL;
}

/* Frees a random one of the n held blocks (its tags checked first) and forgets it;
   returns how many of its tag check and its free went wrong (0 to 2). */
static int drop_random(CUdeviceptr *ptr, size_t *len, int *n, size_t *live) {
    int i = (int)(next() % (uint64_t)*n), bad = 0;
    bad += !check_tags(ptr[i], len[i]);
    if (cuMemFree_v2(ptr[i]) != CUDA_SUCCESS) bad++;
    *live -= len[i];
    ptr[i] = ptr[--*n];
    len[i] = len[*n];
    return bad;
}

static void mixed(uint64_t seed, long ops, size_t budget) {
    static CUdeviceptr ptr[MAX_HELD];
    static size_t len[MAX_HELD];
    int n = 0;
    size_t live = 0;
    long allocs = 0, small = 0, large = 0, refused = 0, broken = 0, bad = 0;
    rng = seed ? seed : 1;
    for (long op = 0; op < ops; op++) {
        if (n > 0 && (next() % 100 < 40 || n == MAX_HELD)) {
            bad += drop_random(ptr, len, &n, &live);
            continue;
        }
        size_t size;
        int is_small = next() % 100 < 80;
        if (is_small) { /* log-uniform: as many 1 KiB blocks as 512 KiB ones */
            size_t low = (size_t)512 << (next() % 11);
            size = low + next() % low;
            if (size > 1 * MIB) size = 1 * MIB;
        } else
            size = 1 * MIB + next() % (23 * MIB);
        if (next() % 4 == 0) size = (size & ~(size_t)4095) | 1; /* odd sizes too */
        while (n > 0 && live + size > budget) bad += drop_random(ptr, len, &n, &live);
        size_t f = 0, t = 0;
        MUST(cuMemGetInfo_v2(&f, &t));
        CUdeviceptr d = 0;
        CUresult rc = cuMemAlloc_v2(&d, size);
        if (rc != CUDA_SUCCESS) {
            refused++;
            if (f >= size) {
                broken++;
                printf("broken promise: free %zu, alloc %zu -> %d\n", f, size, rc);
            }
            continue;
        }
        allocs++;
        small += is_small;
        large += !is_small;
        if (d % 512 != 0 || !range_ok(d, size)) bad++;
        write_tags(d, size);
        ptr[n] = d;
        len[n++] = size;
        live += size;
    }
    while (n > 0) {
        n--;
        bad += !check_tags(ptr[n], len[n]);
        if (cuMemFree_v2(ptr[n]) != CUDA_SUCCESS) bad++;
    }
    printf("mixed allocs %ld small %ld large %ld refused %ld broken %ld bad %ld\n", allocs, small, large, refused,
           broken, bad);
}

/* One allocation of `kind` (see other:KIND:SIZE), freed at once when served; -1 for an
 * unknown kind. */
static CUresult other(const char *kind, size_t size) {
    CUdeviceptr d = 0;
    CUresult rc;
    if (strcmp(kind, "pitch") == 0) {
        size_t pitch = 0, width = 1 << 20;
        rc = cuMemAllocPitch_v2(&d, &pitch, width, (size + width - 1) / width, 16);
        if (rc == CUDA_SUCCESS) MUST(cuMemFree_v2(d));
    } else if (strcmp(kind, "managed") == 0) {
        rc = cuMemAllocManaged(&d, size, CU_MEM_ATTACH_GLOBAL);
        if (rc == CUDA_SUCCESS) MUST(cuMemFree_v2(d));
    } else if (strcmp(kind, "async") == 0) {
        rc = cuMemAllocAsync(&d, size, NULL);
        if (rc == CUDA_SUCCESS) {
            MUST(cuMemFreeAsync(d, NULL));
            MUST(cuStreamSynchronize(NULL));
        }
    } else if (strcmp(kind, "create") == 0) {
        CUmemAllocationProp p;
        memset(&p, 0, sizeof p);
        p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        p.location.id = 0;
        size_t gran = 0;
        MUST(cuMemGetAllocationGranularity(&gran, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        CUmemGenericAllocationHandle h = 0;
        rc = cuMemCreate(&h, (size + gran - 1) / gran * gran, &p, 0);
        if (rc == CUDA_SUCCESS) MUST(cuMemRelease(h));
    } else {
        return (CUresult)-1;
    }
    return rc;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    MUST(cuInit(0));
    CUdevice dev;
    CUcontext ctx;
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuCtxCreate_v2(&ctx, 0, dev));
    for (int i = 1; i < argc; i++) {
        const char *step = argv[i];
        if (strncmp(step, "many:", 5) == 0) {
            char *end = NULL;
            long n = strtol(step + 5, &end, 10);
            if (!end || *end != ':' || n < 0) {
                fprintf(stderr, "bad step %s: expected many:N:SIZE\n", step);
                return 3;
            }
            size_t size = parse_size(end + 1);
            long ok = 0;
            CUresult rc = CUDA_SUCCESS;
            while (ok < n && n_held < MAX_HELD) {
                CUdeviceptr d = 0;
                rc = cuMemAlloc_v2(&d, size);
                if (rc != CUDA_SUCCESS) break;
                held[n_held] = d;
                held_size[n_held++] = size;
                ok++;
            }
            printf("many %ld %zu ok %ld rc %d\n", n, size, ok, rc);
        } else if (strncmp(step, "alloc:", 6) == 0) {
            size_t size = parse_size(step + 6);
            CUdeviceptr d = 0;
            CUresult rc = cuMemAlloc_v2(&d, size);
            printf("alloc %zu %d\n", size, rc);
            if (rc == CUDA_SUCCESS && n_held < MAX_HELD) {
                held[n_held] = d;
                held_size[n_held++] = size;
            }
        } else if (strcmp(step, "write") == 0) {
            for (int b = 0; b < n_held; b++) write_tags(held[b], held_size[b]);
            int ok = 1;
            for (int b = 0; b < n_held; b++) ok &= check_tags(held[b], held_size[b]);
            printf("verify %s\n", ok ? "ok" : "bad");
        } else if (strcmp(step, "range") == 0) {
            int ok = 1;
            for (int b = 0; b < n_held; b++) ok &= range_ok(held[b], held_size[b]);
            printf("range %s\n", ok ? "ok" : "bad");
        } else if (strcmp(step, "align") == 0) {
            int ok = 1;
            for (int b = 0; b < n_held; b++) ok &= held[b] % 512 == 0;
            printf("align %s\n", ok ? "ok" : "bad");
        } else if (strcmp(step, "free") == 0) {
            int freed = 0, failed = 0;
            while (n_held > 0) {
                n_held--;
                if (cuMemFree_v2(held[n_held]) == CUDA_SUCCESS) {
                    freed++;
                    last_freed = held[n_held];
                } else {
                    failed++;
                }
            }
            printf("freed %d failed %d\n", freed, failed);
        } else if (strcmp(step, "refree") == 0) {
            printf("refree %d\n", cuMemFree_v2(last_freed));
        } else if (strcmp(step, "free-interior") == 0) {
            if (n_held == 0) {
                fprintf(stderr, "free-interior: no block kept\n");
                return 3;
            }
            printf("free-interior %d\n", cuMemFree_v2(held[n_held - 1] + 512));
        } else if (strncmp(step, "other:", 6) == 0) {
            char kind[16] = "";
            char size_text[64] = "";
            if (sscanf(step + 6, "%15[a-z]:%63s", kind, size_text) != 2) {
                fprintf(stderr, "bad step %s: expected other:KIND:SIZE\n", step);
                return 3;
            }
            size_t size = parse_size(size_text);
            CUresult rc = other(kind, size);
            if ((int)rc < 0) {
                fprintf(stderr, "bad step %s: unknown kind %s\n", step, kind);
                return 3;
            }
            printf("other %s %zu %d\n", kind, size, rc);
        } else if (strcmp(step, "info") == 0) {
            size_t f = 0, t = 0;
            MUST(cuMemGetInfo_v2(&f, &t));
            printf("info %zu %zu\n", f, t);
        } else if (strncmp(step, "mixed:", 6) == 0) {
            unsigned long long seed = 0, ops = 0;
            char budget[64] = "";
            if (sscanf(step + 6, "%llu:%llu:%63s", &seed, &ops, budget) != 3) {
                fprintf(stderr, "bad step %s: expected mixed:SEED:OPS:BUDGET\n", step);
                return 3;
            }
            mixed(seed, (long)ops, parse_size(budget));
        } else {
            fprintf(stderr, "unknown step %s\n", step);
            return 3;
        }
    }
    return 0;
}
