/*
 * init_and_stay: calls cuInit, prints "cuInit RC", creates READY and stays until killed,
 * whatever cuInit answered (a program that goes on without the GPU when it is refused,
 * as a framework falling back to its CPU does).
 *
 *   init_and_stay READY
 */
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include "fakecuda.h"

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 2) return 2;
    printf("cuInit %d\n", cuInit(0));
    int fd = open(argv[1], O_CREAT | O_WRONLY, 0644);
    if (fd >= 0) close(fd);
    for (;;) pause();
}
