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
 *   altstack SIZE                a SIGUSR1 handler on an alternate stack of SIZE bytes (its
 *                                own pages, an inaccessible page below them: an overflow
 *                                is a crash) execve's /bin/true (its exit status is this
 *                                program's); prints "returned" where the execve came back
 *   as-root CMD [ARG...]         sets its user and group to 0 (a set-user-ID program such
 *                                as su), then execve's CMD with PATH alone, as su does
 *   atfork-lock                  a fork handler of its own takes a lock that a thread holds
 *                                while it walks the loader's list (a cache made fork-safe
 *                                so); the main thread forks once (its child execve's
 *                                /bin/true), under an alarm of 5 s; prints "forked"
 *   unloaded-fork LIB            opens LIB (dlopen), calls its cuInit (the shim registers
 *                                its fork handlers then), closes it (dlclose), then forks a
 *                                child that execve's /bin/true; prints "forked"
 *   unloaded-thread LIB          opens LIB; a thread calls LIB's execve (on a file that is not
 *                                there, with an environment of 3,000 variables: the hooks'
 *                                pages of that thread) and waits; LIB is closed (dlclose);
 *                                the thread ends; prints "thread ended"
 *   lock-fork                    a thread takes a lock of the program's inside its walks of
 *                                the loader's list; the main thread forks while holding
 *                                that lock (its child execve's /bin/true), under an alarm
 *                                of 5 s; prints "forked"
 *   lists                        the variadic calls, each in a child, the environment cleared
 *                                first (clearenv): execl and execlp of sh with 4 arguments
 *                                (past the argument registers) and with 70 (past the vector
 *                                the shim builds on its stack), execle with an environment of
 *                                its own; each sh prints its argument count, first and last
 *                                argument, and GPUCAP_LIMIT; an execl of a file that is not
 *                                there prints its errno
 *   system CMD                   system(CMD); exits with the shell's exit status
 *   system-cleared CMD           the same after clearenv
 *   vfork-list N                 N children made by vfork, each execl's /bin/true with 70
 *                                arguments; prints "grew K", the bytes the parent's address
 *                                space grew by (/proc/self/statm)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static char *true_argv[] = {"true", NULL};
static char *no_env[] = {NULL};

/* A child that execve's /bin/true with an empty environment (alarm: 3 s if it hangs). */
static pid_t fork_true(void) {
    pid_t pid = fork();
    if (pid == 0) {
        alarm(3);
        execve("/bin/true", true_argv, no_env);
        _exit(127);
    }
    return pid;
}

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
        pid_t pid = fork_true();
        if (pid < 0) return 3;
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
    long page = sysconf(_SC_PAGESIZE);
    size_t len = (size + page - 1) / page * page;
    char *map = mmap(NULL, len + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED || mprotect(map, page, PROT_NONE) != 0) return 3;
    /* The stack grows down from its top: its lowest byte just above the guard page. */
    stack_t ss = {.ss_sp = map + page + (len - size), .ss_size = size, .ss_flags = 0};
    if (sigaltstack(&ss, NULL) != 0) return 3;
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

static pthread_mutex_t cache = PTHREAD_MUTEX_INITIALIZER;
static void cache_lock(void) { pthread_mutex_lock(&cache); }
static void cache_unlock(void) { pthread_mutex_unlock(&cache); }

static int count_under_lock(struct dl_phdr_info *info, size_t size, void *data) {
    (void)info;
    (void)size;
    pthread_mutex_lock(&cache);
    ++*(volatile long *)data;
    usleep(200);
    pthread_mutex_unlock(&cache);
    return 0;
}

static void *walk_under_lock(void *arg) {
    (void)arg;
    volatile long n = 0;
    for (;;) dl_iterate_phdr(count_under_lock, (void *)&n);
    return NULL;
}

static int wait_true(pid_t pid) {
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return 3;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

static int atfork_lock(void) {
    if (pthread_atfork(cache_lock, cache_unlock, cache_unlock) != 0) return 3;
    pthread_t t;
    if (pthread_create(&t, NULL, walk_under_lock, NULL) != 0) return 3;
    usleep(20000);
    alarm(5);
    pid_t pid = fork_true();
    int rc = wait_true(pid);
    if (rc == 0) printf("forked\n");
    return rc;
}

static int unloaded_fork(const char *lib) {
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", lib, dlerror());
        return 3;
    }
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
    if (!init || init(0) != 0) return 3;
    if (dlclose(h) != 0) return 3;
    pid_t pid = fork_true();
    int rc = wait_true(pid);
    if (rc == 0) printf("forked\n");
    return rc;
}

static int (*opened_execve)(const char *, char *const[], char *const[]);
static pthread_mutex_t gate = PTHREAD_MUTEX_INITIALIZER;

static void *exec_through_handle(void *arg) {
    (void)arg;
    static char *env[3001];
    static char text[3000][24];
    for (int i = 0; i < 3000; i++) {
        snprintf(text[i], sizeof text[i], "V%d=xxxxxxxxxxxxxxxx", i);
        env[i] = text[i];
    }
    env[3000] = NULL;
    opened_execve("/nonexistent/x", true_argv, env);
    pthread_mutex_lock(&gate); /* until the library is closed */
    pthread_mutex_unlock(&gate);
    return NULL;
}

static int unloaded_thread(const char *lib) {
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) return 3;
    opened_execve = (int (*)(const char *, char *const[], char *const[]))dlsym(h, "execve");
    if (!opened_execve) return 3;
    pthread_mutex_lock(&gate);
    pthread_t t;
    if (pthread_create(&t, NULL, exec_through_handle, NULL) != 0) return 3;
    usleep(100000);
    if (dlclose(h) != 0) return 3;
    pthread_mutex_unlock(&gate);
    pthread_join(t, NULL);
    printf("thread ended\n");
    return 0;
}

static pthread_mutex_t program_lock = PTHREAD_MUTEX_INITIALIZER;

static int take_program_lock(struct dl_phdr_info *info, size_t size, void *data) {
    (void)info;
    (void)size;
    (void)data;
    pthread_mutex_lock(&program_lock);
    pthread_mutex_unlock(&program_lock);
    return 0;
}

static void *walk_taking_lock(void *arg) {
    (void)arg;
    for (;;) dl_iterate_phdr(take_program_lock, NULL);
    return NULL;
}

static int lock_fork(void) {
    pthread_t t;
    if (pthread_create(&t, NULL, walk_taking_lock, NULL) != 0) return 3;
    usleep(20000);
    alarm(5);
    pthread_mutex_lock(&program_lock);
    usleep(1000); /* the walking thread now waits for the lock, inside the loader's walk */
    pid_t pid = fork_true();
    pthread_mutex_unlock(&program_lock);
    int rc = wait_true(pid);
    if (rc == 0) printf("forked\n");
    return rc;
}

#define X10(p) p "0", p "1", p "2", p "3", p "4", p "5", p "6", p "7", p "8", p "9"
#define SHOW "echo $#:$1:${@: -1}:${GPUCAP_LIMIT-unset}"

/* Runs `which` (0-4) in a child with an empty environment; waits for it. */
static void list_child(int which) {
    pid_t pid = fork();
    if (pid == 0) {
        clearenv();
        char *env[] = {"FROM=execle", NULL};
        switch (which) {
        case 0: execl("/bin/bash", "bash", "-c", SHOW, "bash", "a", "b", "c", "d", (char *)NULL); break;
        case 1:
            execlp("/bin/bash", "bash", "-c", SHOW, "bash", X10("a"), X10("b"), X10("c"), X10("d"),
                   X10("e"), X10("f"), X10("g"), (char *)NULL);
            break;
        case 2: execle("/bin/bash", "bash", "-c", SHOW " $FROM", "bash", "x", (char *)NULL, env); break;
        case 3:
            execl("/nonexistent/x", "x", (char *)NULL);
            printf("%d\n", errno);
            _exit(0);
        }
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
}

static long mapped_bytes(void) {
    long size = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f && fscanf(f, "%ld", &size) != 1) size = 0;
    if (f) fclose(f);
    return size * sysconf(_SC_PAGESIZE);
}

static int vfork_list(int n) {
    long before = mapped_bytes();
    for (int i = 0; i < n; i++) {
        pid_t pid = vfork();
        if (pid == 0) {
            execl("/bin/true", "true", X10("a"), X10("b"), X10("c"), X10("d"), X10("e"), X10("f"),
                  X10("g"), (char *)NULL);
            _exit(127);
        }
        int st;
        if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) return 3;
    }
    printf("grew %ld\n", mapped_bytes() - before);
    return 0;
}

static int run_system(const char *cmd, int cleared) {
    if (cleared) clearenv();
    int st = system(cmd);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : 126;
}

static int lists(void) {
    for (int i = 0; i < 4; i++) list_child(i);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc >= 3 && strcmp(argv[1], "threaded-fork") == 0) return threaded_fork(atoi(argv[2]));
    if (argc >= 3 && strcmp(argv[1], "altstack") == 0)
        return altstack((size_t)strtoul(argv[2], NULL, 10));
    if (argc >= 3 && strcmp(argv[1], "as-root") == 0) return as_root(argv + 2);
    if (argc >= 2 && strcmp(argv[1], "atfork-lock") == 0) return atfork_lock();
    if (argc >= 3 && strcmp(argv[1], "unloaded-fork") == 0) return unloaded_fork(argv[2]);
    if (argc >= 2 && strcmp(argv[1], "lock-fork") == 0) return lock_fork();
    if (argc >= 3 && strcmp(argv[1], "unloaded-thread") == 0) return unloaded_thread(argv[2]);
    if (argc >= 2 && strcmp(argv[1], "lists") == 0) return lists();
    if (argc >= 3 && strcmp(argv[1], "system") == 0) return run_system(argv[2], 0);
    if (argc >= 3 && strcmp(argv[1], "system-cleared") == 0) return run_system(argv[2], 1);
    if (argc >= 3 && strcmp(argv[1], "vfork-list") == 0) return vfork_list(atoi(argv[2]));
    fprintf(stderr, "usage: exec_edges threaded-fork N | altstack SIZE | as-root CMD [ARG...] | "
                    "atfork-lock | unloaded-fork LIB | lock-fork | unloaded-thread LIB | lists | system CMD | system-cleared CMD | vfork-list N\n");
    return 2;
}
