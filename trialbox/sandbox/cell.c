/* A cell's hot path in C: what zygote.py's cell init (B) does for each run, and what
 * each candidate (C) does between its fork and its `S` record — the same steps, in the
 * same order, with the same system calls as the zygote's Python (kept for when this
 * file cannot be built; see docs/sandbox.md, "The cell's hot path in C").
 *
 * Why C: B is a Python process and C is forked from it, so the two share B's heap
 * copy-on-write. Every Python step on either side writes to objects of that heap (a
 * reference count is a write) and pays a copy-on-write fault (~3 us in a VM) for each
 * page it first writes after the fork: ~170 faults a run in B and ~340 in C before
 * its first instruction, and ~1.4 ms of C's CPU. The steps here touch no Python object.
 *
 * Built by trialbox.sandbox.native (gcc, cached) and loaded by the zygote with ctypes.
 * libc only. The message formats are zygote_client.Cell.send's and zygote_client.encode_spec's.
 *
 * tb_cell(cfg, res) is B's life after its root is built: runs, resets, runs... It
 * returns in two processes: in B with TB_EOF (the session socket closed) or -1 (res
 * says what failed); in a freshly forked C, set up and isolated, with TB_CHILD
 * (res[R_STATUS], res[R_OFF], res[R_LEN]: the status pipe, and where the spec's
 * program part lies in tb_buffer(); res[R_ERRNO]: why cwd could not be entered, or 0). A C whose set-up fails reports `E` and exits 70
 * here.
 *
 * cfg (longs, see C_*): the session socket, the status pipe, &sock_fprog (seccomp), the
 *   mount targets (NUL-separated) and how many, whether the cell has the host's
 *   network, the number of cgroup.procs fds, then those fds.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_FDS 67          /* stdio, pass_fds targets 3..63, a session's three trees */
#define MAX_TARGETS 8
#define INNER_UID 1000
#define BUF_SIZE (1 << 20)  /* zygote.recv_raw's limit */
#define NEXT_RUN_GRACE_MS 10

enum { TB_CHILD = 1, TB_EOF = 3 };
enum { C_SESSION, C_STATUS, C_FPROG, C_TARGETS, C_NTARGETS, C_NET, C_NCG, C_CG };
enum { R_STATUS, R_OFF, R_LEN, R_ERRNO, R_STEP, R_PID, R_PIDFD, R_CHAN, R_SIZE };

static const char *const STEPS[] = {
    "", "join cgroup", "receive go", "spec", "place fds", "setgroups", "setresgid",
    "setresuid", "dumpable", "unshare user", "uid/gid maps", "capset", "setrlimit",
    "no_new_privs", "chdir", "seccomp", "pdeathsig", "socketpair", "fork", "pidfd_open",
    "receive", "move_mount", "forward go", "wait", "report", "unshare", "loopback up",
    "cgroup namespace", "ns_last_pid",
};
enum { S_CGROUP = 1, S_RECV_GO, S_SPEC, S_FDS, S_SETGROUPS, S_SETGID, S_SETUID,
       S_DUMPABLE, S_USERNS, S_MAPS, S_CAPSET, S_RLIMIT, S_NNP, S_CHDIR, S_SECCOMP,
       S_PDEATHSIG, S_SOCKETPAIR, S_FORK, S_PIDFD, S_RECV, S_MOVE_MOUNT, S_FORWARD,
       S_WAIT, S_REPORT, S_UNSHARE, S_LOOPBACK, S_CGROUPNS,
       S_LASTPID };

/* One message at a time: B receives into it, forwards, and zeroes what it received
 * (a candidate forked later must not find an earlier run's spec in its copy); C
 * receives its go into its own copy. */
static unsigned char BUF[BUF_SIZE];

unsigned char *tb_buffer(void) { return BUF; }

long tb_buffer_size(void) { return BUF_SIZE; }

const char *tb_step(long step) {
    return step > 0 && step < (long)(sizeof STEPS / sizeof *STEPS) ? STEPS[step] : "?";
}

static int fail(long *res, int step) {
    res[R_ERRNO] = errno;
    res[R_STEP] = step;
    return -1;
}

static void put(int fd, const void *data, size_t len) {
    ssize_t n;
    do
        n = write(fd, data, len);
    while (n < 0 && errno == EINTR);
}

static size_t append(char *dst, size_t at, size_t cap, const char *s) {
    while (*s && at < cap)
        dst[at++] = *s++;
    return at;
}

/* `E` + uint16 length + text, as zygote.report_error frames it; then exit 70 */
static void die_in_child(int status_w, long *res) {
    char rec[3 + 400];
    size_t n = append(rec + 3, 0, 400, "cell setup (C): ");
    n = append(rec + 3, n, 400, tb_step(res[R_STEP]));
    n = append(rec + 3, n, 400, ": ");
    n = append(rec + 3, n, 400, strerror((int)res[R_ERRNO]));
    rec[0] = 'E';
    rec[1] = (char)(n & 0xff);
    rec[2] = (char)(n >> 8);
    put(status_w, rec, 3 + n);
    _exit(70);
}

static int write_file(const char *path, const char *data, size_t len) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, data, len);
    int saved = errno;
    close(fd);
    errno = saved;
    return n == (ssize_t)len ? 0 : -1;
}

static uint64_t le(const unsigned char *p, int n) {  /* little-endian, n bytes */
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static int decimal(char *out, unsigned v) {
    char tmp[12];
    int k = 0, n = 0;
    do
        tmp[k++] = (char)('0' + v % 10);
    while (v /= 10);
    while (k)
        out[n++] = tmp[--k];
    return n;
}

/* One message and the fds passed with it; 0 at end of stream; -1 on failure (EMSGSIZE:
 * larger than the buffer, its fds closed). */
static ssize_t receive(int sock, unsigned char *buf, size_t cap, int *fds, int *nfds) {
    union { char b[CMSG_SPACE(MAX_FDS * sizeof(int))]; struct cmsghdr align; } u;
    struct iovec iov = { buf, cap };
    struct msghdr msg = { 0 };
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = u.b;
    msg.msg_controllen = sizeof u.b;
    ssize_t n;
    do
        n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    *nfds = 0;
    if (n < 0)
        return n;
    if (msg.msg_flags & MSG_TRUNC)  /* never within the supervisor's SPEC_MAX: refuse */
        n = -2;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int i = 0; i < k; i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
                if (*nfds < MAX_FDS)
                    fds[(*nfds)++] = fd;
                else
                    close(fd);
            }
        }
    if (n <= 0) {
        for (int i = 0; i < *nfds; i++)
            close(fds[i]);
        *nfds = 0;
    }
    if (n == -2)
        errno = EMSGSIZE;
    return n < 0 ? -1 : n;
}

/* ------------------------------------------------------------ C: the candidate */

/* C, forked ahead: join the cell's cgroups, wait for the go, isolate. 1 when set up,
 * 0 when the session ended before its go, -1 on failure. */
static int enter(const long *cfg, long *res, int chan, int first) {
    int status_w = (int)cfg[C_STATUS];
    int ncg = (int)cfg[C_NCG];
    res[R_STATUS] = status_w;

    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
        return fail(res, S_PDEATHSIG);
    for (int i = 0; i < ncg; i++)  /* "0" moves the writer into the cgroup */
        if (write((int)cfg[C_CG + i], "0", 1) != 1)
            return fail(res, S_CGROUP);
    /* a cgroup namespace rooted there: /proc/self/cgroup says "/", not the host's path
     * (which names the pool and counts its cells) */
    if (unshare(CLONE_NEWCGROUP) < 0)
        return fail(res, S_CGROUPNS);
    if (first)
        put(status_w, "R", 1);

    int fds[MAX_FDS], nfds;
    ssize_t n = receive(chan, BUF, BUF_SIZE, fds, &nfds);
    if (n < 0)
        return fail(res, S_RECV_GO);
    if (n == 0)
        return 0;
    close(chan);

    /* after B's tag byte: u32 uid, u8 n, n x {u8 resource, u64 soft, u64 hard},
     * u8 m, m x u8 fd target, u16 length + cwd; then the Python part */
    const unsigned char *p = BUF + 1, *end = BUF + n;
    errno = EINVAL;
    if (end - p < 5)
        return fail(res, S_SPEC);
    unsigned uid = (unsigned)le(p, 4);
    int nrl = p[4];
    p += 5;
    if (end - p < nrl * 17 + 1)
        return fail(res, S_SPEC);
    const unsigned char *rl = p;
    p += nrl * 17;
    int ntargets = *p++;
    if (ntargets > MAX_FDS - 3 || end - p < ntargets + 2)
        return fail(res, S_SPEC);
    const unsigned char *targets = p;
    p += ntargets;
    int cwd_len = (int)le(p, 2);
    p += 2;
    char cwd[4096];
    if (end - p < cwd_len || cwd_len >= (int)sizeof cwd)
        return fail(res, S_SPEC);
    memcpy(cwd, p, cwd_len);
    cwd[cwd_len] = 0;
    p += cwd_len;
    res[R_OFF] = p - BUF;
    res[R_LEN] = end - p;

    /* stdin/stdout/stderr on 0-2, each passed fd on its target (3..63); every other fd
     * closed but the status pipe, which moves above 63 so no target can clobber it */
    if ((status_w = fcntl(status_w, F_DUPFD_CLOEXEC, 64)) < 0)
        return fail(res, S_FDS);
    res[R_STATUS] = status_w;
    int high[MAX_FDS], keep[MAX_FDS + 4], nkeep = 0;
    for (int i = 0; i < nfds; i++)
        if ((high[i] = fcntl(fds[i], F_DUPFD, 64)) < 0)
            return fail(res, S_FDS);
    for (int i = 0; i < nfds && i < 3 + ntargets; i++)  /* dup2's copy is inheritable */
        if (dup2(high[i], i < 3 ? i : targets[i - 3]) < 0)
            return fail(res, S_FDS);
    keep[nkeep++] = 0;
    keep[nkeep++] = 1;
    keep[nkeep++] = 2;
    for (int i = 0; i < ntargets; i++)
        keep[nkeep++] = targets[i];
    keep[nkeep++] = status_w;
    for (int i = 1; i < nkeep; i++)
        for (int j = i; j > 0 && keep[j - 1] > keep[j]; j--) {
            int t = keep[j];
            keep[j] = keep[j - 1];
            keep[j - 1] = t;
        }
    for (int i = 0; i < nkeep; i++) {
        unsigned lo = (unsigned)keep[i] + 1;
        unsigned hi = i + 1 < nkeep ? (unsigned)keep[i + 1] : 1u << 16;
        if (hi > lo && syscall(SYS_close_range, lo, hi - 1, 0) < 0)
            return fail(res, S_FDS);
    }

    /* the session's unprivileged uid, then a user namespace of its own (uid 1000
     * inside) and not one capability */
    if (setgroups(0, NULL) < 0)
        return fail(res, S_SETGROUPS);
    if (setresgid(uid, uid, uid) < 0)
        return fail(res, S_SETGID);
    if (setresuid(uid, uid, uid) < 0)  /* leaving root clears every capability */
        return fail(res, S_SETUID);
    if (prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) < 0)  /* so it may write its own maps */
        return fail(res, S_DUMPABLE);
    if (unshare(CLONE_NEWUSER) < 0)
        return fail(res, S_USERNS);
    char map[32];
    int m = decimal(map, INNER_UID);
    map[m++] = ' ';
    m += decimal(map + m, uid);
    map[m++] = ' ';
    map[m++] = '1';
    if (write_file("/proc/self/setgroups", "deny", 4) < 0
        || write_file("/proc/self/uid_map", map, m) < 0
        || write_file("/proc/self/gid_map", map, m) < 0)
        return fail(res, S_MAPS);
    struct __user_cap_header_struct hdr = { _LINUX_CAPABILITY_VERSION_3, 0 };
    struct __user_cap_data_struct none[2];
    memset(none, 0, sizeof none);
    if (syscall(SYS_capset, &hdr, none) < 0)
        return fail(res, S_CAPSET);

    for (int i = 0; i < nrl; i++) {
        const unsigned char *r = rl + i * 17;
        struct rlimit lim = { (rlim_t)le(r + 1, 8), (rlim_t)le(r + 9, 8) };
        if (setrlimit(r[0], &lim) < 0)
            return fail(res, S_RLIMIT);
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        return fail(res, S_NNP);
    /* The supervisor checked that cwd is a directory of the session just before the
     * go, and no process of the session was alive since: if it cannot be entered now,
     * an earlier run made it so (chmod 000...). That is the candidate's doing, reported
     * after `S` as its own failure (zygote.start_program), never as the machinery's. */
    int cwd_errno = chdir(cwd) < 0 ? errno : 0;
    if (prctl(PR_SET_SECCOMP, 2 /* SECCOMP_MODE_FILTER */, (void *)cfg[C_FPROG], 0, 0) < 0)
        return fail(res, S_SECCOMP);
    res[R_ERRNO] = cwd_errno;
    return 1;
}

/* ------------------------------------------------------------ B: the cell's init */

/* Fork the next C. In B: 0, with its pid, pidfd and B's end of its socket in res; -1 on
 * failure. In C: TB_CHILD once set up (or exit, quietly when the session ended). */
static int spawn(const long *cfg, long *res, int first) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
        return fail(res, S_SOCKETPAIR);
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(sv[0]);
        close(sv[1]);
        errno = e;
        return fail(res, S_FORK);
    }
    if (pid == 0) {
        close(sv[0]);
        int r = enter(cfg, res, sv[1], first);
        if (r == 1)
            return TB_CHILD;
        if (r == 0)
            _exit(0);  /* the session ended before this run */
        die_in_child((int)res[R_STATUS], res);
    }
    close(sv[1]);
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0) {
        int e = errno;
        close(sv[0]);
        kill(pid, SIGKILL);
        errno = e;
        return fail(res, S_PIDFD);
    }
    res[R_PID] = pid;
    res[R_PIDFD] = pidfd;
    res[R_CHAN] = sv[0];
    return 0;
}

/* From pid 1, kill(-1) reaches every other process of the namespace; reap them. */
static void kill_everyone(void) {
    kill(-1, SIGKILL);
    while (waitpid(-1, NULL, 0) > 0 || errno == EINTR)
        ;
}

/* Wait for C; meanwhile reap orphans (they count against pids.max) and obey `S`.
 * 0 with C's wait status in *status, -1 on failure; EOF on the session socket ends
 * the cell (B exits). */
static int supervise(int session, pid_t pid, int pidfd, long *res, int *status) {
    int stopped = 0, have = 0;
    while (!have) {
        struct pollfd pf[2] = { { pidfd, POLLIN, 0 }, { session, POLLIN, 0 } };
        if (poll(pf, stopped ? 1 : 2, 100) < 0 && errno != EINTR)
            return fail(res, S_WAIT);
        if (!stopped && pf[1].revents) {
            unsigned char tag[16];
            int fds[MAX_FDS], nfds;
            ssize_t n = receive(session, tag, sizeof tag, fds, &nfds);
            for (int i = 0; i < nfds; i++)
                close(fds[i]);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EMSGSIZE)) {
                kill_everyone();
                _exit(0);
            }
            if (n == 1 && tag[0] == 'S') {
                stopped = 1;  /* C is reaped below, with its status */
                kill(-1, SIGKILL);
            }
        }
        for (;;) {
            int st;
            pid_t p = waitpid(-1, &st, WNOHANG);
            if (p <= 0)
                break;
            if (p == pid) {
                *status = st;
                have = 1;
            }
        }
    }
    close(pidfd);
    return 0;
}

/* A /proc file, NUL-terminated, in buf; its length, or -1. */
static ssize_t read_proc(const char *path, char *buf, size_t cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t len = 0;
    for (;;) {
        ssize_t n = read(fd, buf + len, cap - 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            close(fd);
            if (n < 0)
                return -1;
            buf[len] = 0;
            return (ssize_t)len;
        }
        len += (size_t)n;
        if (len == cap - 1) {  /* larger than any of these files: refuse */
            close(fd);
            return -1;
        }
    }
}

/* The line of buf starting with `prefix` (the nth such line, from 0), or NULL. */
static char *line_of(char *buf, const char *prefix, int nth) {
    size_t k = strlen(prefix);
    for (char *p = buf; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, prefix, k) == 0 && nth-- == 0)
            return p;
    return NULL;
}

/* The word after the word `key` on a "TCP: inuse 0 orphan 0 tw 0 ..." line: is it "0"? */
static int pair_is_zero(const char *line, const char *key) {
    size_t k = strlen(key);
    for (const char *p = line; *p && *p != '\n'; p++)
        if ((p == line || p[-1] == ' ') && strncmp(p, key, k) == 0 && p[k] == ' ')
            return p[k + 1] == '0' && (p[k + 2] == ' ' || p[k + 2] == '\n' || !p[k + 2]);
    return 0;
}

/* This network namespace's counters as they were when it was made (net_snapshot), and
 * the files they come from: IPv4 (Ip, Icmp, Tcp, Udp...) and IPv6. */
static const char *const COUNTER_FILES[2] = { "/proc/self/net/snmp", "/proc/self/net/snmp6" };
static char PRISTINE[2][16384];
static ssize_t PRISTINE_LEN[2] = { -1, -1 };

static void net_snapshot(void) {
    for (int i = 0; i < 2; i++)
        PRISTINE_LEN[i] = read_proc(COUNTER_FILES[i], PRISTINE[i], sizeof PRISTINE[i]);
}

/* zygote.net_is_clean, the same rule: every counter of this network namespace is as
 * it was when the namespace was made (no packet sent, received or refused a route),
 * and it holds no socket at all (TIME_WAIT included; a Unix socket kept alive by a
 * descriptor cycle would keep its abstract name). */
static int net_is_clean(void) {
    static char buf[16384];
    for (int i = 0; i < 2; i++) {
        ssize_t n = read_proc(COUNTER_FILES[i], buf, sizeof buf);
        if (n < 0 && errno == ENOENT && PRISTINE_LEN[i] < 0)
            continue;  /* no IPv6 in this kernel */
        if (n < 0 || n != PRISTINE_LEN[i] || memcmp(buf, PRISTINE[i], (size_t)n) != 0)
            return 0;
    }
    if (read_proc("/proc/self/net/sockstat", buf, sizeof buf) < 0)
        return 0;
    char *used = line_of(buf, "sockets:", 0), *tcp = line_of(buf, "TCP:", 0);
    return used && tcp && pair_is_zero(used, "used") && pair_is_zero(tcp, "tw");
}

static int loopback_up(void) {
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return -1;
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    memcpy(ifr.ifr_name, "lo", 3);
    int r = ioctl(s, SIOCGIFFLAGS, &ifr);
    if (r == 0) {
        ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
        r = ioctl(s, SIOCSIFFLAGS, &ifr);
    }
    int e = errno;
    close(s);
    errno = e;
    return r;
}

int tb_cell(const long *cfg, long *res) {
    int session = (int)cfg[C_SESSION], status_w = (int)cfg[C_STATUS];
    int ntargets = (int)cfg[C_NTARGETS];
    const char *target_names = (const char *)cfg[C_TARGETS];
    const char *targets[MAX_TARGETS];
    if (ntargets > MAX_TARGETS) {
        errno = EINVAL;
        return fail(res, S_MOVE_MOUNT);
    }
    for (int i = 0; i < ntargets; i++) {
        targets[i] = target_names;
        target_names += strlen(target_names) + 1;
    }
    if (!cfg[C_NET] && PRISTINE_LEN[0] < 0)  /* the namespace build_root made */
        net_snapshot();
    /* a new cell, or one just reset: its first C says `R` (ready) */
    int r = spawn(cfg, res, 1);
    if (r != 0)
        return r;
    int have_child = 1;
    for (;;) {
        int fds[MAX_FDS], nfds;
        ssize_t n = receive(session, BUF, BUF_SIZE, fds, &nfds);
        if (n < 0)
            return fail(res, S_RECV);
        if (n == 0) {
            res[R_PID] = 0;
            return TB_EOF;
        }
        unsigned char op = BUF[0];
        if (op == 'G' || op == 'M' || op == 'g' || op == 'm') {
            int last = op == 'g' || op == 'm';  /* the session's last run */
            if (op == 'M' || op == 'm') {  /* a session's first run: attach its trees */
                if (nfds < ntargets) {
                    errno = EINVAL;
                    return fail(res, S_MOVE_MOUNT);
                }
                int base = nfds - ntargets;
                for (int i = 0; i < ntargets; i++) {
                    if (syscall(SYS_move_mount, fds[base + i], "", AT_FDCWD, targets[i],
                                0x4 /* MOVE_MOUNT_F_EMPTY_PATH */) < 0)
                        return fail(res, S_MOVE_MOUNT);
                    close(fds[base + i]);
                }
                nfds = base;
            }
            if (!have_child && (r = spawn(cfg, res, 0)) != 0)
                return r;
            have_child = 0;
            pid_t pid = (pid_t)res[R_PID];
            int pidfd = (int)res[R_PIDFD], chan = (int)res[R_CHAN];
            res[R_PID] = 0;
            /* C parses the spec (after the tag) itself */
            union { char b[CMSG_SPACE(MAX_FDS * sizeof(int))]; struct cmsghdr align; } u;
            struct iovec iov = { BUF, (size_t)n };
            struct msghdr msg = { 0 };
            msg.msg_iov = &iov;
            msg.msg_iovlen = 1;
            if (nfds > 0) {
                msg.msg_control = u.b;
                msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
                struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
                c->cmsg_level = SOL_SOCKET;
                c->cmsg_type = SCM_RIGHTS;
                c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
                memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
            }
            ssize_t sent;
            do
                sent = sendmsg(chan, &msg, MSG_NOSIGNAL);
            while (sent < 0 && errno == EINTR);
            /* a C that died before its go is reaped below with its status */
            close(chan);
            for (int i = 0; i < nfds; i++)  /* C has them now; the next C must not */
                close(fds[i]);
            memset(BUF, 0, (size_t)n);
            int status = 0;
            if (supervise(session, pid, pidfd, res, &status) < 0)
                return -1;
            kill_everyone();
            unsigned char rec[5] = { 'X', (unsigned char)(status & 0xff),
                                     (unsigned char)((status >> 8) & 0xff),
                                     (unsigned char)((status >> 16) & 0xff),
                                     (unsigned char)((unsigned)status >> 24) };
            put(status_w, rec, sizeof rec);
            /* Fork the next candidate ahead of time — unless this was the session's
             * last run or the supervisor speaks within a few ms (a session closing
             * sends `R` right away; a fork wasted on it costs more than forking on
             * demand for a quick next run). */
            struct pollfd pf = { session, POLLIN, 0 };
            int ready = 1;
            while (!last && (ready = poll(&pf, 1, NEXT_RUN_GRACE_MS)) < 0 && errno == EINTR)
                ;
            if (ready == 0) {
                if ((r = spawn(cfg, res, 0)) != 0)
                    return r;
                have_child = 1;
            }
        } else if (op == 'R') {
            /* The session closed; make this cell as good as new for the next one: no
             * process, no workspace, a fresh IPC namespace (SysV objects and POSIX
             * message queues outlive their processes: they stay behind with the old
             * one), a fresh network namespace if the last one kept any state or
             * counted anything, and pids from 2 again. */
            memset(BUF, 0, (size_t)n);
            for (int i = 0; i < nfds; i++)
                close(fds[i]);
            if (have_child) {  /* killed with everyone else */
                close((int)res[R_CHAN]);
                close((int)res[R_PIDFD]);
                res[R_PID] = 0;
                have_child = 0;
            }
            kill_everyone();
            for (int i = ntargets - 1; i >= 0; i--)
                umount2(targets[i], MNT_DETACH);
            int renew = !cfg[C_NET] && !net_is_clean();
            if (unshare(CLONE_NEWIPC | (renew ? CLONE_NEWNET : 0)) < 0)
                return fail(res, S_UNSHARE);
            if (renew) {
                if (loopback_up() < 0)
                    return fail(res, S_LOOPBACK);
                net_snapshot();
            }
            /* pids restart at 2, as in a new cell: how many processes earlier
             * sessions made is none of the next one's business */
            if (write_file("/proc/sys/kernel/ns_last_pid", "1", 1) < 0 && errno != ENOENT)
                return fail(res, S_LASTPID);  /* (absent without CHECKPOINT_RESTORE) */
            if ((r = spawn(cfg, res, 1)) != 0)  /* its first C says `R` (ready) */
                return r;
            have_child = 1;
        } else {
            for (int i = 0; i < nfds; i++)
                close(fds[i]);
        }
    }
}
