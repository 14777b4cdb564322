/*
 * exec_edges: how a program starts children, for the hand-down of the cap
 * (tests/cap/process_tree.rs). Each child gets an empty environment, so that the shim's
 * exec hooks build one.
 *
 *   exec_edges threaded-fork N   a thread walks the loader's list of objects
 *                                (dl_iterate_phdr) without pause while the main thread
 *                                forks N children, each of which execve's /bin/true
 *                                (killed by SIGALRM after 3 s if it hangs); prints
 *                                "hung K" (children that did not exit 0 by themselves)
 *   altstack SIZE                a SIGUSR1 handler on an alternate stack of SIZE bytes
 *                                execve's /bin/true (its exit status is this program's);
 *                                prints "returned" where the execve came back
 *   as-root CMD [ARG...]         sets its user and group to 0 (a set-user-ID program such
 *                                as su), then execve's CMD with PATH alone, as su does
 */
#define _GNU_SOURCE
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char *true_argv[] = {"true", NULL};
static char *no_env[] = {NULL};

static int count_object(struct dl_phdr_info *info, size_t size, void *data) {
    (void)info;
    (void)size;
    ++*(volatile long *)data;
    return 0;
}

static void *walk(void *arg) {
    (void)arg;
    volatile long n = 0;
    for (;;) dl_iterate_phdr(count_object, (void *)&n);
    return NULL;
}

static int threaded_fork(int n) {
    pthread_t t;
    if (pthread_create(&t, NULL, walk, NULL) != 0) return 3;
    int hung = 0;
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid < 0) return 3;
        if (pid == 0) {
            alarm(3);
            execve("/bin/true", true_argv, no_env);
            _exit(127);
        }
        int status = 0;
        if (waitpid(pid, &status, 0) != pid) return 3;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) hung++;
    }
    printf("hung %d\n", hung);
    return 0;
}

static void exec_true(int sig) {
    (void)sig;
    execve("/bin/true", true_argv, no_env);
    static const char msg[] = "returned\n";
    if (write(1, msg, sizeof msg - 1) < 0) _exit(4);
    _exit(5);
}

static int altstack(size_t size) {
    stack_t ss = {.ss_sp = malloc(size), .ss_size = size, .ss_flags = 0};
    if (!ss.ss_sp || sigaltstack(&ss, NULL) != 0) return 3;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = exec_true;
    sa.sa_flags = SA_ONSTACK;
    if (sigaction(SIGUSR1, &sa, NULL) != 0) return 3;
    raise(SIGUSR1);
    return 6;
}

static int as_root(char **argv) {
    if (setgid(0) != 0 || setuid(0) != 0) {
        perror("exec_edges as-root");
        return 1;
    }
    char *env[] = {"PATH=/usr/bin:/bin", NULL};
    execve(argv[0], argv, env);
    perror(argv[0]);
    return 127;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc >= 3 && strcmp(argv[1], "threaded-fork") == 0) return threaded_fork(atoi(argv[2]));
    if (argc >= 3 && strcmp(argv[1], "altstack") == 0)
        return altstack((size_t)strtoul(argv[2], NULL, 10));
    if (argc >= 3 && strcmp(argv[1], "as-root") == 0) return as_root(argv + 2);
    fprintf(stderr, "usage: exec_edges threaded-fork N | altstack SIZE | as-root CMD [ARG...]\n");
    return 2;
}
