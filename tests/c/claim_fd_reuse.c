/*
 * claim_fd_reuse: a claim's member that puts a listening socket of its own under the
 * number of gpucap's (a server closing the descriptors it did not open, then listening on
 * its own), as a program may after cuInit.
 *
 *   claim_fd_reuse SOCKET READY
 *
 * cuInit, a context, 1 MiB; finds its one listening socket (gpucap's: SO_ACCEPTCONN),
 * binds a Unix socket of its own at SOCKET, listens and dup2s it onto that number; prints
 * "replaced fd N", creates READY and sleeps until killed, never accepting.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "fakecuda.h"

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 3) return 2;
    CUresult rc = cuInit(0);
    printf("cuInit %d\n", rc);
    if (rc != CUDA_SUCCESS) return 3;
    context_on_gpu0();
    CUdeviceptr d;
    printf("alloc %d\n", cuMemAlloc_v2(&d, MIB));
    int theirs = -1;
    DIR *dir = opendir("/proc/self/fd");
    for (struct dirent *e; dir && (e = readdir(dir));) {
        int fd = atoi(e->d_name), on = 0;
        socklen_t len = sizeof on;
        if (e->d_name[0] != '.' && fd != dirfd(dir) &&
            getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &on, &len) == 0 && on)
            theirs = fd;
    }
    if (dir) closedir(dir);
    if (theirs < 0) return 4;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", argv[1]);
    int mine = socket(AF_UNIX, SOCK_STREAM, 0);
    if (bind(mine, (void *)&sa, sizeof sa) || listen(mine, 16) || dup2(mine, theirs) != theirs) return 5;
    close(mine);
    printf("replaced fd %d\n", theirs);
    int r = open(argv[2], O_CREAT | O_WRONLY, 0644);
    if (r >= 0) close(r);
    for (;;) pause();
}
