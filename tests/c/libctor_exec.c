/*
 * libctor_exec: a library whose constructor makes its process root and replaces it with
 * /usr/bin/env under an environment of its own (PATH alone), as a set-user-ID program's
 * own library might before the program's main runs: the exec happens before gpucap's own
 * load-time code (tests/cap/secure_execution.rs). Linked into a program with
 * `-L DIR -lctor_exec -Wl,-rpath,DIR -Wl,--no-as-needed`.
 */
#include <stdio.h>
#include <unistd.h>

__attribute__((constructor)) static void become_root_and_exec(void) {
    if (setgid(0) != 0 || setuid(0) != 0) {
        perror("libctor_exec");
        _exit(1);
    }
    char *argv[] = {"env", NULL};
    char *env[] = {"PATH=/usr/bin:/bin", NULL};
    execve("/usr/bin/env", argv, env);
    perror("libctor_exec: /usr/bin/env");
    _exit(127);
}
