// What reaching a pool's live words in a sealed memfd would cost a mass start, and that a
// truncated pool file then kills no member: a prototype of the design written in
// docs/src/threat-model.md ("Truncate a pool file under a live member"), not gpucap's code.
// Run by tests/pool/pool_memfd.rs; by hand:
//
//   cc -O2 -pthread -o /tmp/memfd-join tests/c/memfd_join.c
//   /tmp/memfd-join MODE N [DIR]      (DIR: default /dev/shm/gpucap-memfd-join)
//
// Forks N members at once; each opens the pool file (828,544 bytes, a layout-8 pool file's
// size, allocated whole), reaches the words as MODE says, maps them and adds 1 to a word.
// Prints the time from the first fork until every member has done so, then truncates the
// pool file to 0 bytes and has every member add 1 again, and counts the members that died
// of a signal:
//   file          the words are the pool file's (gpucap today)
//   proc          the words live in a memfd sealed against shrinking and growing; the first
//                 member makes it under a lock on the file, copying the file's words, and
//                 writes its pid, descriptor and the memfd's inode into the file (pwrite);
//                 the others open /proc/PID/fd/N (one PID namespace), check the inode and
//                 the seals
//   proc-thread   proc, and each member starts one thread (64 KiB stack) that only waits:
//                 the bare cost of a thread in every member
//   socket        the memfd and a listening socket (<DIR>/pool.sock) are handed over by
//                 SCM_RIGHTS (which crosses PID namespaces): each member connects, receives
//                 both, and serves the next ones from a thread blocked in accept() on the
//                 shared listening socket
//   claim         socket, joined as a claim's pool joins in gpucap: the memfd is made only
//                 where no process holds one, decided under two locks of the pool file (see
//                 claim_join), so that two sets of members never keep two budgets
//
//   /tmp/memfd-join churn N ROUNDS [DIR]
// Starts N members (claim), then in each round starts K more (K drawn from 1 to N) while
// killing K of the members alive (SIGKILL, each kill right after a fork), and checks that
// every member alive after the round holds the same memfd (one budget): prints the rounds
// whose members held more than one, with each member's memfd, the pool file it opened (its
// inode: another file made at the path would show) and whether it made its memfd or was
// handed it. In every tenth round (5, 15, ...) all members are
// stopped (SIGSTOP; waited for until each of their threads is) while two more join, and
// let go once both have reported: nobody answers them, and they must be refused (after
// 3 s) rather than make a second memfd; MEMFD_JOIN_NO_HOLD=1 makes it all the same, which
// the check then finds. (On a loaded machine a member's serving thread answered after
// its SIGSTOP was sent, before any of its threads had taken it, and a fixed stop let a
// joiner not yet run ask past it.)
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BYTES 828544
#define HOLDER 4096 /* where the holder's record lies in the file */
#define SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
#define HOLD_BYTE ((1LL << 40) - 2) /* read-locked for life by every process holding the memfd */
#define MAKE_BYTE ((1LL << 40) - 1) /* write-locked by the one process deciding to make it */

struct holder { int32_t pid, fd; uint64_t ino; };

static char pool[256], sock[sizeof(((struct sockaddr_un *)0)->sun_path)];
static int listening = -1, live = -1;
static int made_here;          /* this member made the memfd it holds (claim) */
static uint64_t file_ino;       /* the pool file it opened (claim) */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void lock(int fd, short type) {
    struct flock f = { .l_type = type, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1 };
    fcntl(fd, F_OFD_SETLKW, &f);
}

static int sealed(int fd, uint64_t ino) {
    struct stat st;
    return fstat(fd, &st) == 0 && (ino == 0 || st.st_ino == ino) && st.st_size == BYTES &&
           (fcntl(fd, F_GET_SEALS) & SEALS) == SEALS;
}

static int make_memfd(int file) {
    static char words[BYTES];
    int m = memfd_create("gpucap-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (m < 0 || ftruncate(m, BYTES) || pread(file, words, BYTES, 0) != BYTES ||
        pwrite(m, words, BYTES, 0) != BYTES || fcntl(m, F_ADD_SEALS, SEALS))
        return -1;
    return m;
}

static void *serve(void *unused) {
    (void)unused;
    for (;;) {
        int c = accept4(listening, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) continue;
        int fds[2] = { live, listening };
        char b = 'p';
        struct iovec io = { &b, 1 };
        union { char buf[CMSG_SPACE(sizeof fds)]; struct cmsghdr align; } u;
        struct msghdr m = { .msg_iov = &io, .msg_iovlen = 1, .msg_control = u.buf,
                            .msg_controllen = sizeof u.buf };
        struct cmsghdr *h = CMSG_FIRSTHDR(&m);
        h->cmsg_level = SOL_SOCKET;
        h->cmsg_type = SCM_RIGHTS;
        h->cmsg_len = CMSG_LEN(sizeof fds);
        memcpy(CMSG_DATA(h), fds, sizeof fds);
        sendmsg(c, &m, MSG_NOSIGNAL);
        close(c);
    }
    return NULL;
}

static void *wait_forever(void *unused) {
    (void)unused;
    for (;;) pause();
    return NULL;
}

static int thread(void *(*f)(void *)) {
    pthread_attr_t a;
    pthread_t t;
    pthread_attr_init(&a);
    pthread_attr_setstacksize(&a, 64 * 1024);
    return pthread_create(&t, &a, f, NULL);
}

static struct sockaddr_un sock_addr(void) {
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock);
    return sa;
}

// The memfd and the listening socket from a live member; -1 where none answers.
static int receive(void) {
    struct sockaddr_un sa = sock_addr();
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(s, (void *)&sa, sizeof sa)) { close(s); return -1; }
    struct timeval patience = { .tv_sec = 1 };
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof patience);
    char b;
    struct iovec io = { &b, 1 };
    union { char buf[CMSG_SPACE(2 * sizeof(int))]; struct cmsghdr align; } u;
    struct msghdr m = { .msg_iov = &io, .msg_iovlen = 1, .msg_control = u.buf,
                        .msg_controllen = sizeof u.buf };
    ssize_t got = recvmsg(s, &m, MSG_CMSG_CLOEXEC);
    close(s);
    struct cmsghdr *h = got > 0 ? CMSG_FIRSTHDR(&m) : NULL;
    if (!h || h->cmsg_type != SCM_RIGHTS || h->cmsg_len != CMSG_LEN(2 * sizeof(int))) return -1;
    int fds[2];
    memcpy(fds, CMSG_DATA(h), sizeof fds);
    if (!sealed(fds[0], 0)) { close(fds[0]); close(fds[1]); return -1; }
    listening = fds[1];
    return fds[0];
}

static int through_proc(int file) {
    struct holder h;
    if (pread(file, &h, sizeof h, HOLDER) != sizeof h || h.pid <= 0) return -1;
    char p[64];
    snprintf(p, sizeof p, "/proc/%d/fd/%d", h.pid, h.fd);
    int fd = open(p, O_RDWR | O_CLOEXEC);
    if (fd >= 0 && !sealed(fd, h.ino)) { close(fd); fd = -1; }
    return fd;
}

static int lk(int fd, int cmd, short type, off_t at) {
    struct flock f = { .l_type = type, .l_whence = SEEK_SET, .l_start = at, .l_len = 1 };
    return fcntl(fd, cmd, &f);
}

static int make_words(int file) {
    struct sockaddr_un sa = sock_addr();
    if ((live = make_memfd(file)) < 0) return -1;
    unlink(sock); // a dead set's socket: nobody holds it any more
    listening = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (bind(listening, (void *)&sa, sizeof sa) || listen(listening, 4096)) return -1;
    return 0;
}

// The claim's protocol (gpucap's, src/pool-file/live/). Every process holding the memfd
// read-locks HOLD for life, taken right after it was handed the memfd, and keeps what it
// got only where the socket at the path is still the one it asked (lstat before and
// after: inode and change time): a memfd is made only under HOLD's write lock (no process
// holds one) and always served from a new socket bound there, so what a joiner keeps is
// the one set's and stays so while it holds the lock. A joiner whom nobody answers asks
// again under MAKE (write-locked, one joiner at a time, never waited on) and makes the
// memfd if it can write-lock HOLD; the others wait for that decision (MAKE read-locked).
// Asking without HOLD locked leaves the maker free to write-lock it while thousands ask.
static int no_hold; // MEMFD_JOIN_NO_HOLD=1: make the memfd whenever nobody answers (to see a split)

static int same_socket(const struct stat *a, const struct stat *b) {
    return a->st_ino == b->st_ino && a->st_ctim.tv_sec == b->st_ctim.tv_sec &&
           a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

// 1: the set's memfd, HOLD read-locked; 0: nobody answered; -1: ask again.
static int held(int file) {
    struct stat before, after;
    int had = lstat(sock, &before) == 0;
    if ((live = receive()) < 0) return 0;
    if (lk(file, F_OFD_SETLK, F_RDLCK, HOLD_BYTE) == 0) {
        if (had && lstat(sock, &after) == 0 && same_socket(&before, &after)) return 1;
        lk(file, F_OFD_SETLK, F_UNLCK, HOLD_BYTE);
    }
    close(live);
    close(listening);
    live = listening = -1;
    return -1;
}

static int claim_join(int file) {
    int first = 1;
    // Without the hold lock (the control) a joiner whom nobody answers waits a second
    // twice before it makes its memfd: on a loaded machine 3 s ran out first (refused,
    // no split shown: 1 run in some 60 of the full suite), so the control waits longer.
    for (double give_up = now() + (no_hold ? 30 : 3); now() < give_up;) {
        if (!first) { // a decision under way: wait for it
            if (lk(file, F_OFD_SETLK, F_RDLCK, MAKE_BYTE)) { usleep(200); continue; }
            lk(file, F_OFD_SETLK, F_UNLCK, MAKE_BYTE);
        }
        first = 0;
        int r = held(file);
        if (r == 1) return 0;
        if (r < 0) { usleep(200); continue; }
        if (lk(file, F_OFD_SETLK, F_WRLCK, MAKE_BYTE) == 0) {
            int made = held(file) == 1 ? 0 : -1;
            if (made && (no_hold || lk(file, F_OFD_SETLK, F_WRLCK, HOLD_BYTE) == 0)) {
                made = made_here = make_words(file) == 0; // nobody else holds one: the set's
                made = made ? 0 : -1;
                lk(file, F_OFD_SETLK, F_RDLCK, HOLD_BYTE);
            }
            lk(file, F_OFD_SETLK, F_UNLCK, MAKE_BYTE);
            if (made == 0) return 0;
        }
        usleep(200);
    }
    return -1;
}

static _Atomic uint64_t *join(const char *mode) {
    int file = open(pool, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (file < 0) return NULL;
    struct stat fst;
    if (fstat(file, &fst) == 0) file_ino = fst.st_ino;
    int by_socket = !strcmp(mode, "socket");
    if (!strcmp(mode, "file")) {
        live = file;
    } else if (!strcmp(mode, "claim")) {
        if (claim_join(file) || thread(serve)) return NULL;
    } else {
        live = by_socket ? receive() : through_proc(file);
        if (live < 0) {
            lock(file, F_WRLCK); // the first member makes the memfd; the others find it
            live = by_socket ? receive() : through_proc(file);
            if (live < 0 && (live = make_memfd(file)) >= 0) {
                struct stat st;
                fstat(live, &st);
                struct holder me = { getpid(), live, st.st_ino };
                if (by_socket) {
                    struct sockaddr_un sa = sock_addr();
                    unlink(sock);
                    listening = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
                    if (bind(listening, (void *)&sa, sizeof sa) || listen(listening, 4096)) live = -1;
                }
                pwrite(file, &me, sizeof me, HOLDER);
            }
            lock(file, F_UNLCK);
        }
        if (live < 0) return NULL;
        if (by_socket && thread(serve)) return NULL;
        if (!strcmp(mode, "proc-thread") && thread(wait_forever)) return NULL;
    }
    void *w = mmap(NULL, BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, live, 0);
    return w == MAP_FAILED ? NULL : w;
}

struct report { int32_t pid, ok; uint64_t ino, file_ino; int32_t made, pad; };

static pid_t spawn_member(int rep) {
    pid_t c = fork();
    if (c == 0) {
        _Atomic uint64_t *w = join("claim");
        struct stat st;
        struct report r = { getpid(), w != NULL, 0, file_ino, made_here, 0 };
        if (w && fstat(live, &st) == 0) r.ino = st.st_ino;
        write(rep, &r, sizeof r);
        for (;;) pause();
    }
    return c;
}

// Waits (60 s at most) until every thread of `pid` is stopped: a process is stopped only
// once one of its threads runs and takes the signal, and on a loaded machine its serving
// thread may answer before then.
static void stopped_all(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    for (int tries = 0; tries < 60000; tries++) {
        DIR *d = opendir(path);
        if (!d) return;
        int running = 0;
        for (struct dirent *e; (e = readdir(d));) {
            if (e->d_name[0] == '.') continue;
            char stat[PATH_MAX], text[512];
            snprintf(stat, sizeof stat, "%s/%s/stat", path, e->d_name);
            FILE *f = fopen(stat, "r");
            if (!f) continue;
            const char *end = fgets(text, sizeof text, f) ? strrchr(text, ')') : NULL;
            fclose(f);
            running += !end || (end[2] != 'T' && end[2] != 't');
        }
        closedir(d);
        if (!running) return;
        usleep(1000);
    }
}

static int churn(int n, int rounds) {
    static pid_t alive[8192];
    static struct report info[8192]; // each member's report (ino 0: not yet, or refused)
    static int round_of[8192];        // the round it was started in
    int rep[2], count = 0, split = 0, failed = 0, stopped_refused = 0;
    if (pipe(rep)) return 1;
    srand(getpid());
    int fresh = n;
    for (int r = 0; r <= rounds; r++) {
        int from = count;
        for (int j = 0; j < fresh; j++) {
            pid_t c = spawn_member(rep[1]);
            if (r > 0) { // kill an old member as the new one joins
                int v = rand() % from;
                kill(alive[v], SIGKILL);
                waitpid(alive[v], NULL, 0);
                alive[v] = alive[from - 1], info[v] = info[from - 1], round_of[v] = round_of[from - 1];
                alive[from - 1] = alive[count - 1], info[from - 1] = info[count - 1];
                round_of[from - 1] = round_of[count - 1];
                from--;
                count--;
            }
            alive[count] = c, info[count] = (struct report){0}, round_of[count++] = r;
        }
        int stopping = r % 10 == 5, waiting = 0, stopped = count, got = 0;
        pid_t joiner[2] = {0, 0};
        // The control (MEMFD_JOIN_NO_HOLD=1) stops the members only once this round's have
        // joined: one stopped inside its decision holds the lock every joiner waits for, and
        // the two joiners were refused instead of showing the split (1 full suite in some 5,
        // loaded). The check itself stops them wherever they are.
        for (; stopping && no_hold && got < fresh; got++) {
            struct report rp;
            if (read(rep[0], &rp, sizeof rp) != sizeof rp) return 1;
            failed += !rp.ok;
            for (int i = 0; i < count; i++)
                if (alive[i] == rp.pid) info[i] = rp;
        }
        if (stopping) { // every old member stopped while two more join
            for (int i = 0; i < count; i++) kill(alive[i], SIGSTOP);
            for (int i = 0; i < count; i++) stopped_all(alive[i]);
            for (int j = 0; j < 2; j++) {
                joiner[j] = alive[count] = spawn_member(rep[1]);
                info[count] = (struct report){0}, round_of[count++] = r;
            }
            fresh += 2;
            waiting = 2;
        }
        for (int j = got; j < fresh; j++) {
            struct report rp;
            if (read(rep[0], &rp, sizeof rp) != sizeof rp) return 1;
            failed += !rp.ok;
            stopped_refused += !rp.ok && stopping; // every joiner of that round was stopped too
            for (int i = 0; i < count; i++)
                if (alive[i] == rp.pid) info[i] = rp;
            if (waiting && (rp.pid == joiner[0] || rp.pid == joiner[1]) && --waiting == 0)
                for (int i = 0; i < stopped; i++) kill(alive[i], SIGCONT); // both joiners have reported: let go
        }
        int sets = 0;
        for (int i = 0; i < count; i++) { // a member refused (ino 0) holds no budget
            int seen = info[i].ino == 0;
            for (int j = 0; j < i && !seen; j++) seen = info[j].ino == info[i].ino;
            sets += !seen;
        }
        if (sets != 1) {
            split++;
            printf("round %d: the %d members alive hold %d different memfds\n", r, count, sets);
            for (int i = 0; i < count; i++) // what each holds, which pool file it opened, how
                printf("  pid %d (started in round %d): memfd %llu, pool file %llu, %s\n",
                       (int)alive[i], round_of[i], (unsigned long long)info[i].ino,
                       (unsigned long long)info[i].file_ino,
                       !info[i].ok ? "refused" : info[i].made ? "made it" : "handed it");
        }
        fresh = 1 + rand() % n;
    }
    for (int i = 0; i < count; i++) kill(alive[i], SIGKILL);
    while (wait(NULL) > 0) {}
    printf("churn N=%d: %d rounds, %d with more than one budget, %d joins refused (%d of them "
           "while every member was stopped)\n", n, rounds, split, failed, stopped_refused);
    return split || failed != stopped_refused;
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: %s file|proc|proc-thread|socket|claim N [DIR], or churn N ROUNDS [DIR]\n", argv[0]); return 2; }
    int churning = !strcmp(argv[1], "churn");
    no_hold = getenv("MEMFD_JOIN_NO_HOLD") && !strcmp(getenv("MEMFD_JOIN_NO_HOLD"), "1");
    const char *mode = churning ? "claim" : argv[1];
    const char *dir = argc > 3 + churning ? argv[3 + churning] : "/dev/shm/gpucap-memfd-join";
    int n = atoi(argv[2]);
    if (n < 1 || n > 4096) { fprintf(stderr, "N: 1 to 4096\n"); return 2; }
    mkdir(dir, 0700);
    snprintf(pool, sizeof pool, "%s/pool", dir);
    if (snprintf(sock, sizeof sock, "%s/pool.sock", dir) >= (int)sizeof sock) {
        fprintf(stderr, "%s: too long for a socket's address (at most %zu bytes)\n", dir, sizeof sock - 11);
        return 2;
    }
    unlink(pool);
    unlink(sock);
    int f = open(pool, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (f < 0 || posix_fallocate(f, 0, BYTES)) { perror(pool); return 1; }
    close(f);
    if (churning) {
        int rc = churn(n, argc > 3 ? atoi(argv[3]) : 100);
        unlink(pool);
        unlink(sock);
        rmdir(dir);
        return rc;
    }
    int ready[2], go[2];
    if (pipe(ready) || pipe(go)) return 1;
    static pid_t kids[8192];
    double t0 = now();
    for (int i = 0; i < n; i++) {
        if ((kids[i] = fork()) == 0) {
            close(ready[0]);
            close(go[1]);
            _Atomic uint64_t *w = join(mode);
            char b = w ? 'k' : 'x';
            if (w) atomic_fetch_add(&w[16], 1);
            write(ready[1], &b, 1);
            read(go[0], &b, 1); // returns 0 once the parent closes its end
            if (w) atomic_fetch_add(&w[BYTES / 8 - 1], 1);
            _exit(0);
        }
    }
    close(ready[1]);
    close(go[0]);
    int joined = 0;
    char b;
    for (int i = 0; i < n && read(ready[0], &b, 1) == 1; i++) joined += b == 'k';
    double t1 = now();
    truncate(pool, 0);
    close(go[1]);
    int signalled = 0;
    for (int i = 0; i < n; i++) {
        int st;
        if (waitpid(kids[i], &st, 0) == kids[i] && WIFSIGNALED(st)) signalled++;
    }
    printf("%-11s N=%d  all joined in %.3f s (%.1f us a member)  joined %d  "
           "killed by a signal after the truncation: %d\n",
           mode, n, t1 - t0, (t1 - t0) * 1e6 / n, joined, signalled);
    unlink(pool);
    unlink(sock);
    rmdir(dir);
    return joined == n ? 0 : 1;
}
