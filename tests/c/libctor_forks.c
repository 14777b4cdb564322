/*
 * libctor_forks: a library whose constructor starts a thread that forks N children (N from
 * CTOR_FORKS, default 40) as fast as it can, each of which execve's
 * `/bin/sh -c 'echo ${GPUCAP_LIMIT-unset}'` with an empty environment, while the loader
 * goes on to the other libraries' constructors (gpucap's copies the environment the
 * process started with then). `ctor_forks_wait()` waits for the thread and prints
 * "uncapped K of N": the children whose shell saw no GPUCAP_LIMIT (the hand-down's
 * variables were read as none while gpucap's copy was being made: a review found it).
 * Linked into a program with `-L DIR -lctor_forks -Wl,-rpath,DIR -Wl,--no-as-needed`
 * (tests/cap/process_tree.rs).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static pthread_t thread;
static int started, total, uncapped;

static void *fork_children(void *unused) {
    (void)unused;
    static int fds[4096];
    static pid_t pids[4096];
    if (total > 4096) total = 4096;
    // All forked first, as fast as it goes (some while gpucap's constructor runs), then
    // each child's answer read.
    for (int i = 0; i < total; i++) {
        int out[2];
        if (pipe(out)) {
            total = i;
            break;
        }
        pid_t pid = fork();
        if (pid == 0) {
            dup2(out[1], 1);
            char *argv[] = {"sh", "-c", "echo ${GPUCAP_LIMIT-unset}", NULL};
            char *env[] = {NULL};
            execve("/bin/sh", argv, env);
            _exit(127);
        }
        close(out[1]);
        fds[i] = out[0];
        pids[i] = pid;
    }
    for (int i = 0; i < total; i++) {
        char line[64] = {0};
        ssize_t n = read(fds[i], line, sizeof line - 1);
        close(fds[i]);
        waitpid(pids[i], NULL, 0);
        uncapped += n <= 0 || strncmp(line, "unset", 5) == 0;
    }
    return NULL;
}

__attribute__((constructor)) static void start_forking(void) {
    const char *n = getenv("CTOR_FORKS");
    total = n ? atoi(n) : 40;
    started = pthread_create(&thread, NULL, fork_children, NULL) == 0;
}

void ctor_forks_wait(void) {
    if (started) pthread_join(thread, NULL);
    printf("uncapped %d of %d\n", uncapped, total);
}
