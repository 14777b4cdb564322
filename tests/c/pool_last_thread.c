/*
 * pool_last_thread: a pool member whose last thread outlives its pool file.
 *
 *   pool_last_thread READY
 *
 * Joins the pool (cuInit), allocates 600 MiB on GPU 0, starts a thread and ends its
 * main thread (pthread_exit: the process's leader is a zombie while the thread runs).
 * The thread waits until /proc shows the leader a zombie, closes every descriptor and
 * mapping of a file under $GPUCAP_POOL_DIR/gpucap-UID (the pool file: its member's lock
 * goes), creates READY and sleeps until killed, still holding the fake GPU's file and
 * so its 600 MiB.
 * It holds still the state a killed multi-threaded member passes through in the kernel's
 * exit teardown: the leader a zombie, the pool file closed, the last thread closing the
 * driver's files, which the driver frees the process's memory on.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "fakecuda.h"

static const char *g_ready;

static char leader_state(void) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)getpid());
    int fd = open(path, O_RDONLY);
    if (fd < 0) return '?';
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return '?';
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : '?';
}

static void *last(void *arg) {
    (void)arg;
    struct timespec ts = {0, 2 * 1000 * 1000};
    for (int i = 0; i < 30000 && leader_state() != 'Z'; i++) nanosleep(&ts, NULL);
    char prefix[PATH_MAX + 32], dir[PATH_MAX];
    if (!realpath(getenv("GPUCAP_POOL_DIR"), dir)) return NULL;
    snprintf(prefix, sizeof prefix, "%s/gpucap-%u/", dir, (unsigned)geteuid());
    DIR *d = opendir("/proc/thread-self/fd");
    if (!d) return NULL;
    int mine = dirfd(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int fd = atoi(e->d_name);
        if (e->d_name[0] == '.' || fd == mine) continue;
        char link[64], target[4096];
        snprintf(link, sizeof link, "/proc/thread-self/fd/%d", fd);
        ssize_t n = readlink(link, target, sizeof target - 1);
        if (n <= 0) continue;
        target[n] = 0;
        if (strncmp(target, prefix, strlen(prefix)) == 0) close(fd);
    }
    closedir(d);
    /* A mapping holds the file open too: the kernel's teardown unmaps before it closes. */
    FILE *maps = fopen("/proc/thread-self/maps", "r");
    char line[PATH_MAX + 256];
    while (maps && fgets(line, sizeof line, maps)) {
        unsigned long start, end;
        char *path = strchr(line, '/');
        if (!path || sscanf(line, "%lx-%lx", &start, &end) != 2) continue;
        if (strncmp(path, prefix, strlen(prefix)) == 0) munmap((void *)start, end - start);
    }
    if (maps) fclose(maps);
    int fd = open(g_ready, O_CREAT | O_WRONLY, 0644);
    if (fd >= 0) close(fd);
    for (;;) pause();
    return NULL;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 2 || !getenv("GPUCAP_POOL_DIR")) return 3;
    g_ready = argv[1];
    MUST(cuInit(0));
    context_on_gpu0();
    CUdeviceptr d;
    printf("alloc %d\n", cuMemAlloc_v2(&d, 600 * MIB));
    pthread_t t;
    if (pthread_create(&t, NULL, last, NULL) != 0) return 3;
    pthread_exit(NULL);
}
