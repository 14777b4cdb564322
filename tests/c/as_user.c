/*
 * as_user: runs a program as another user, as `setpriv --reuid=UID --regid=UID
 * --clear-groups` does (an image made with debootstrap's minbase has no setpriv).
 *
 *   as_user UID CMD [ARG...]
 */
#define _GNU_SOURCE
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: as_user UID CMD [ARG...]\n");
        return 2;
    }
    char *end;
    unsigned long id = strtoul(argv[1], &end, 10);
    if (*argv[1] == '\0' || *end != '\0') {
        fprintf(stderr, "as_user: %s is not a uid\n", argv[1]);
        return 2;
    }
    if (setgroups(0, NULL) != 0 || setgid((gid_t)id) != 0 || setuid((uid_t)id) != 0) {
        perror("as_user");
        return 1;
    }
    execvp(argv[2], argv + 2);
    perror(argv[2]);
    return 127;
}
