/*
 * ctxswitch: every byte is charged to the GPU of the context current on the thread
 * that allocates, however contexts are switched, on a 3-GPU fake.
 *
 *   ctxswitch <cap0> <cap1> <cap2>
 *
 * Phase 1 (one thread, exact): cuCtxSetCurrent, cuCtxPushCurrent/PopCurrent (nested),
 * a created context, no context at all, a destroyed context, a context created and
 * destroyed with an allocation in it. After each step every GPU's cuMemGetInfo_v2
 * must show its cap minus exactly what was allocated on it; at the end each GPU takes
 * exactly its remaining bytes and not one MiB more.
 * Phase 2 (4 threads): each thread switches between GPUs (set, push/pop, a created
 * context), allocates, frees every other block under whatever context is current;
 * afterwards each GPU's figure matches what the threads allocated on it, and after
 * every block is freed (from one thread, other GPUs' contexts current) each GPU is back
 * to its whole cap.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include "fakecuda.h"

#define GPUS 3
#define THREADS 4
#define ROUNDS 240

static size_t g_cap[GPUS];
static CUcontext g_primary[GPUS];
static CUcontext g_created2; /* a created context on GPU 2, shared by the threads */
static size_t g_expect[GPUS];

static void check_all(const char *when) {
    for (int d = 0; d < GPUS; d++) {
        size_t f = 0, t = 0;
        MUST(cuCtxPushCurrent_v2(g_primary[d]));
        MUST(cuMemGetInfo_v2(&f, &t));
        MUST(cuCtxPopCurrent_v2(NULL));
        CHECK(f == g_cap[d] - g_expect[d] && t == g_cap[d],
              "%s: GPU %d free=%zu total=%zu, expected free=%zu total=%zu", when, d, f, t,
              g_cap[d] - g_expect[d], g_cap[d]);
    }
}

struct block {
    CUdeviceptr p;
    int dev;
    size_t bytes;
};

/* Phase 1's live blocks, and the context each was made in. */
static struct block g_live[16];
static CUcontext g_live_ctx[16];
static int g_nlive;

/* Allocates on whatever is current; expects GPU `dev` to be charged. */
static void alloc_on(int dev, size_t bytes, const char *when) {
    CUdeviceptr p = 0;
    CUcontext ctx = NULL;
    CUresult rc = cuMemAlloc_v2(&p, bytes);
    CHECK(rc == CUDA_SUCCESS, "%s: cuMemAlloc_v2(%zu) = %d", when, bytes, rc);
    if (rc == CUDA_SUCCESS) {
        MUST(cuCtxGetCurrent(&ctx));
        g_expect[dev] += linear_charge(bytes);
        g_live[g_nlive] = (struct block){p, dev, linear_charge(bytes)};
        g_live_ctx[g_nlive++] = ctx;
    }
    check_all(when);
}

/* The driver freed the blocks of a destroyed context: so must the figures. */
static void context_gone(CUcontext ctx) {
    for (int i = 0; i < g_nlive; i++)
        if (g_live[i].p && g_live_ctx[i] == ctx) {
            g_expect[g_live[i].dev] -= g_live[i].bytes;
            g_live[i].p = 0;
        }
}

enum op { SET, PUSH, POP };

/* One step of phase 1: a context call, then (mib > 0) an allocation that GPU `dev`
   must be charged for. */
struct step {
    enum op op;
    CUcontext *ctx;
    int dev;
    size_t mib;
    const char *what;
};

static CUcontext g_c2; /* a created context on GPU 2 */

static void phase1(void) {
    CUcontext c0 = NULL, popped = NULL;
    CUresult rc;
    check_all("start");

    MUST(cuCtxCreate_v2(&g_c2, 0, 2)); /* current now; popped again below */
    MUST(cuCtxPopCurrent_v2(&popped));
    CHECK(popped == g_c2, "the created context was current");

    const struct step steps[] = {
        {SET, &g_primary[0], 0, 1, "set GPU 0"},
        {SET, &g_primary[1], 1, 2, "set GPU 1 after GPU 0"},
        {PUSH, &g_c2, 2, 3, "push a created context of GPU 2"},
        {POP, NULL, 1, 4, "pop back to GPU 1"},
        {PUSH, &g_primary[0], 0, 0, "push GPU 0"},
        {PUSH, &g_primary[2], 2, 5, "two pushes: GPU 2 on top"},
        {POP, NULL, 0, 6, "one pop: GPU 0"},
        {POP, NULL, 1, 7, "second pop: GPU 1 again"},
    };
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        const struct step *s = &steps[i];
        if (s->op == SET) MUST(cuCtxSetCurrent(*s->ctx));
        else if (s->op == PUSH) MUST(cuCtxPushCurrent_v2(*s->ctx));
        else MUST(cuCtxPopCurrent_v2(NULL));
        if (s->mib) alloc_on(s->dev, s->mib * MIB, s->what);
    }

    /* No context current: the driver's own error, nothing charged anywhere. */
    MUST(cuCtxSetCurrent(NULL));
    CUdeviceptr none = 0;
    rc = cuMemAlloc_v2(&none, MIB);
    CHECK(rc == CUDA_ERROR_INVALID_CONTEXT, "no context current: cuMemAlloc_v2 = %d, expected 201", rc);
    check_all("no context current");

    /* A context made current and destroyed: whatever the driver makes of the thread then,
       an allocation is charged to the GPU of the context it runs in, or refused. */
    MUST(cuCtxSetCurrent(g_c2));
    alloc_on(2, 1 * MIB, "set the created context of GPU 2");
    MUST(cuCtxDestroy_v2(g_c2));
    context_gone(g_c2); /* the driver freed its two blocks with it */
    check_all("the current context destroyed");
    rc = cuMemAlloc_v2(&none, MIB);
    if (rc == CUDA_SUCCESS) {
        CUdevice dev = -1;
        MUST(cuCtxGetDevice(&dev));
        g_expect[dev] += MIB;
        check_all("after the destroy, in what the driver left current");
        MUST(cuMemFree_v2(none));
        g_expect[dev] -= MIB;
    } else {
        check_all("after the destroy, refused by the driver");
    }

    /* A context created on GPU 0 is current at once. */
    MUST(cuCtxCreate_v2(&c0, 0, 0));
    alloc_on(0, 8 * MIB, "a context created on GPU 0");
    MUST(cuCtxSetCurrent(g_primary[2]));
    alloc_on(2, 9 * MIB, "set GPU 2");
    MUST(cuCtxDestroy_v2(c0)); /* not current here: GPU 2 stays current */
    context_gone(c0);
    alloc_on(2, 10 * MIB, "another context destroyed: GPU 2 still current");

    /* Exactly the rest of each cap fits, not one MiB more: its whole 2 MiB pages in one
       block, then the odd MiB (charged as asked) in another. */
    for (int d = 0; d < GPUS; d++) {
        CUdeviceptr rest = 0, odd = 0, more = 0;
        MUST(cuCtxPushCurrent_v2(g_primary[d]));
        size_t left = g_cap[d] - g_expect[d], pages = left / (2 * MIB) * (2 * MIB);
        rc = pages ? cuMemAlloc_v2(&rest, pages) : CUDA_SUCCESS;
        CHECK(rc == CUDA_SUCCESS, "GPU %d takes its last %zu bytes of pages: %d", d, pages, rc);
        rc = left > pages ? cuMemAlloc_v2(&odd, left - pages) : CUDA_SUCCESS;
        CHECK(rc == CUDA_SUCCESS, "GPU %d takes its last %zu bytes: %d", d, left - pages, rc);
        rc = cuMemAlloc_v2(&more, MIB);
        CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "GPU %d full: one MiB more = %d, expected 2", d, rc);
        if (rest) MUST(cuMemFree_v2(rest));
        if (odd) MUST(cuMemFree_v2(odd));
        MUST(cuCtxPopCurrent_v2(NULL));
    }

    /* Freed from GPU 1's context: each block credits its own GPU. */
    MUST(cuCtxSetCurrent(g_primary[1]));
    for (int i = 0; i < g_nlive; i++)
        if (g_live[i].p) {
            MUST(cuMemFree_v2(g_live[i].p));
            g_expect[g_live[i].dev] -= g_live[i].bytes;
            check_all("a block freed from GPU 1's context");
        }
    MUST(cuCtxSetCurrent(NULL));
}

static struct block g_blocks[THREADS][ROUNDS];
static size_t g_charged[THREADS][GPUS];
static int g_thread_failures[THREADS];

static void *worker(void *arg) {
    int t = (int)(intptr_t)arg;
    for (int r = 0; r < ROUNDS; r++) {
        int d = (t + r) % GPUS;
        int how = (r / GPUS + t) % 3;
        CUcontext ctx = (d == 2 && how == 2) ? g_created2 : g_primary[d];
        if (how == 0) MUST(cuCtxSetCurrent(ctx));
        else MUST(cuCtxPushCurrent_v2(ctx));
        size_t bytes = (1 + (size_t)((t * 7 + r) % 5)) * 64 * KIB;
        CUdeviceptr p = 0;
        CUresult rc = cuMemAlloc_v2(&p, bytes);
        if (rc != CUDA_SUCCESS) {
            printf("FAIL thread %d round %d: cuMemAlloc_v2 on GPU %d = %d\n", t, r, d, rc);
            g_thread_failures[t]++;
        } else {
            g_blocks[t][r] = (struct block){p, d, bytes};
            g_charged[t][d] += bytes;
        }
        if (how != 0) MUST(cuCtxPopCurrent_v2(NULL));
        /* Every other block goes at once, freed under whatever is current now. */
        if (r % 2 == 1 && g_blocks[t][r - 1].p) {
            MUST(cuMemFree_v2(g_blocks[t][r - 1].p));
            g_charged[t][g_blocks[t][r - 1].dev] -= g_blocks[t][r - 1].bytes;
            g_blocks[t][r - 1].p = 0;
        }
    }
    return NULL;
}

static void phase2(void) {
    pthread_t th[THREADS];
    MUST(cuCtxCreate_v2(&g_created2, 0, 2));
    MUST(cuCtxPopCurrent_v2(NULL));
    for (int t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    for (int t = 0; t < THREADS; t++) {
        CHECK(g_thread_failures[t] == 0, "thread %d: every allocation succeeded", t);
        for (int d = 0; d < GPUS; d++) g_expect[d] += g_charged[t][d];
    }
    check_all("4 threads switched GPUs");
    MUST(cuCtxSetCurrent(g_primary[0]));
    for (int t = 0; t < THREADS; t++)
        for (int r = 0; r < ROUNDS; r++)
            if (g_blocks[t][r].p) {
                MUST(cuMemFree_v2(g_blocks[t][r].p));
                g_expect[g_blocks[t][r].dev] -= g_blocks[t][r].bytes;
            }
    check_all("every block freed from GPU 0's context");
    MUST(cuCtxDestroy_v2(g_created2));
}

int main(int argc, char **argv) {
    if (argc != 1 + GPUS) {
        fprintf(stderr, "usage: ctxswitch <cap0> <cap1> <cap2>\n");
        return 2;
    }
    for (int d = 0; d < GPUS; d++) g_cap[d] = parse_size(argv[1 + d]);
    MUST(cuInit(0));
    for (int d = 0; d < GPUS; d++) MUST(cuDevicePrimaryCtxRetain(&g_primary[d], d));
    phase1();
    phase2();
    for (int d = 0; d < GPUS; d++) MUST(cuDevicePrimaryCtxRelease_v2(d));
    return finish();
}
