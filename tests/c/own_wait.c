/*
 * own_wait: one thread of a pool member holds memory while another asks for more than
 * the pool has room for beside it; with GPUCAP_WAIT the second must wait for the first's
 * free (a member's own threads free memory as other members do).
 *
 *   own_wait HOLD ASK HOLD_MS
 *
 * Thread A allocates HOLD and tells thread B, which then allocates ASK; A frees HOLD
 * HOLD_MS after B started asking. Prints "A alloc RC", "B alloc RC", "A freed". Exit 0.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "fakecuda.h"

static CUcontext ctx;
static size_t hold, ask;
static int hold_ms;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int held, asking;

static void *a(void *arg) {
    (void)arg;
    MUST(cuCtxSetCurrent(ctx));
    CUdeviceptr p;
    CUresult rc = cuMemAlloc_v2(&p, hold);
    printf("A alloc %d\n", rc);
    pthread_mutex_lock(&mu);
    held = 1;
    pthread_cond_broadcast(&cv);
    while (!asking) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    usleep(hold_ms * 1000);
    if (rc == CUDA_SUCCESS) {
        MUST(cuMemFree_v2(p));
        printf("A freed\n");
    }
    return NULL;
}

static void *b(void *arg) {
    (void)arg;
    MUST(cuCtxSetCurrent(ctx));
    pthread_mutex_lock(&mu);
    while (!held) pthread_cond_wait(&cv, &mu);
    asking = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    CUdeviceptr p;
    CUresult rc = cuMemAlloc_v2(&p, ask);
    printf("B alloc %d\n", rc);
    if (rc == CUDA_SUCCESS) MUST(cuMemFree_v2(p));
    return NULL;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 4) return 2;
    hold = parse_size(argv[1]);
    ask = parse_size(argv[2]);
    hold_ms = atoi(argv[3]);
    CUresult rc = cuInit(0);
    printf("cuInit %d\n", rc);
    if (rc != CUDA_SUCCESS) return 0;
    CUdevice dev;
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuCtxCreate_v2(&ctx, 0, dev));
    pthread_t ta, tb;
    pthread_create(&ta, NULL, a, NULL);
    pthread_create(&tb, NULL, b, NULL);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    return 0;
}
