/*
 * lbshim: an LD_PRELOAD library for crash testing Letterbox.
 *
 * It does two things, both configured by environment variables:
 *
 * 1. A "durable mirror" (LBSHIM_MIRROR): the process works on the real
 *    files under LBSHIM_ROOT, while the mirror keeps what a power cut would
 *    leave of them: only data made durable by fsync/fdatasync of the file
 *    (sync_file_range counts only in lenient mode), and only directory
 *    entries (creations, renames, deletions) made durable by an fsync of
 *    their directory. After the process is killed, `chaos` rebuilds the
 *    directory from the mirror and starts the server on that.
 *
 *    Model: every inode under the root has a key (device, inode number,
 *    generation; the generation tells apart files that reuse an inode
 *    number). Writes (write, pwrite, writev, pwritev, ftruncate, fallocate,
 *    copy_file_range, open with O_TRUNC) only mark ranges of the inode
 *    dirty. fsync/fdatasync of a file copies its dirty ranges from the real
 *    file into mirror/files/<key> and sets its size. fsync of a directory
 *    writes its current listing (name -> key) to mirror/dirs/<key>.
 *    sync()/syncfs() do both for the whole tree. The mirror starts as a
 *    copy of the tree when the library is loaded (what survived the last
 *    crash is, by definition, durable).
 *
 * 2. Kill points (LBSHIM_KILL=<class>:<n>[:<delay_ms>]): on the n-th call
 *    of a class of calls on files under the root, the library records the
 *    kill point, waits delay_ms (other threads go on: replies already
 *    decided reach their clients), and sends SIGKILL to the process,
 *    before the call itself is made. Classes: write pwrite fsync fdatasync
 *    sync_file_range rename unlink ftruncate fallocate create mkdir.
 *
 * LBSHIM_COUNTS=<file>: call counts per class are kept in this file
 * (shared memory mapping, so they survive SIGKILL), one line per class
 * written at load, then updated in place as binary counters at offset
 * 4096 (see chaos's reader).
 *
 * LBSHIM_MODE=strict (default) | lenient | torn. In torn mode the library
 * also journals every write's range (mirror/writes.log, "W key start end")
 * and every sync ("S key"), so that `chaos` can let a random subset of the
 * pages written but not synced reach the rebuilt files too, as a disk's
 * write-back may have done before the power went: torn and reordered
 * writes.
 *
 * Not modelled: writes through shared writable mmaps of files under the
 * root (counted as class "mmap_write"; the harness fails a run where it is
 * not zero), O_DIRECT (treated like ordinary writes), io_uring.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

enum {
    C_WRITE,
    C_PWRITE,
    C_FSYNC,
    C_FDATASYNC,
    C_SFR,
    C_RENAME,
    C_UNLINK,
    C_FTRUNCATE,
    C_FALLOCATE,
    C_CREATE,
    C_MKDIR,
    C_SYNCFS,
    C_MMAP_WRITE,
    C_COPY,
    C_COUNT
};

static const char *class_names[C_COUNT] = {
    "write",  "pwrite",    "fsync",     "fdatasync", "sync_file_range",
    "rename", "unlink",    "ftruncate", "fallocate", "create",
    "mkdir",  "syncfs",    "mmap_write", "copy_file_range"};

/* ---- real functions ---------------------------------------------------- */

static int (*real_open)(const char *, int, ...);
static int (*real_open64)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static int (*real_openat64)(int, const char *, int, ...);
static int (*real_creat)(const char *, mode_t);
static int (*real_creat64)(const char *, mode_t);
static int (*real_close)(int);
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_pwrite64)(int, const void *, size_t, off_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static ssize_t (*real_pwritev)(int, const struct iovec *, int, off_t);
static ssize_t (*real_pwritev64)(int, const struct iovec *, int, off_t);
static ssize_t (*real_pwritev2)(int, const struct iovec *, int, off_t, int);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_sync_file_range)(int, off64_t, off64_t, unsigned int);
static int (*real_syncfs)(int);
static void (*real_sync)(void);
static int (*real_rename)(const char *, const char *);
static int (*real_renameat)(int, const char *, int, const char *);
static int (*real_renameat2)(int, const char *, int, const char *, unsigned int);
static int (*real_unlink)(const char *);
static int (*real_unlinkat)(int, const char *, int);
static int (*real_rmdir)(const char *);
static int (*real_ftruncate)(int, off_t);
static int (*real_ftruncate64)(int, off64_t);
static int (*real_truncate)(const char *, off_t);
static int (*real_truncate64)(const char *, off64_t);
static int (*real_fallocate)(int, int, off_t, off_t);
static int (*real_fallocate64)(int, int, off64_t, off64_t);
static int (*real_posix_fallocate)(int, off_t, off_t);
static int (*real_posix_fallocate64)(int, off64_t, off64_t);
static int (*real_mkdir)(const char *, mode_t);
static int (*real_mkdirat)(int, const char *, mode_t);
static int (*real_dup2)(int, int);
static int (*real_dup3)(int, int, int);
static void *(*real_mmap)(void *, size_t, int, int, int, off_t);
static void *(*real_mmap64)(void *, size_t, int, int, int, off64_t);
static ssize_t (*real_copy_file_range)(int, off64_t *, int, off64_t *, size_t, unsigned int);

#define LOAD(name) real_##name = dlsym(RTLD_NEXT, #name)

static void load_real(void) {
    LOAD(open); LOAD(open64); LOAD(openat); LOAD(openat64); LOAD(creat);
    LOAD(creat64); LOAD(close); LOAD(write); LOAD(pwrite); LOAD(pwrite64);
    LOAD(writev); LOAD(pwritev); LOAD(pwritev64); LOAD(pwritev2); LOAD(fsync);
    LOAD(fdatasync); LOAD(sync_file_range); LOAD(syncfs); LOAD(sync);
    LOAD(rename); LOAD(renameat); LOAD(renameat2); LOAD(unlink);
    LOAD(unlinkat); LOAD(rmdir); LOAD(ftruncate); LOAD(ftruncate64);
    LOAD(truncate); LOAD(truncate64); LOAD(fallocate); LOAD(fallocate64);
    LOAD(posix_fallocate); LOAD(posix_fallocate64); LOAD(mkdir);
    LOAD(mkdirat); LOAD(dup2); LOAD(dup3); LOAD(mmap); LOAD(mmap64);
    LOAD(copy_file_range);
}

/* ---- configuration ----------------------------------------------------- */

static char root[PATH_MAX];
static size_t root_len;
static char mirror[PATH_MAX];
static int mirror_on;
static int lenient;
static int torn;
static int journal_fd = -1;
static int kill_class = -1;
static uint64_t kill_at;
static unsigned kill_delay_ms;
static volatile uint64_t *counts;
static uint64_t local_counts[C_COUNT];
static int ready;

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t flush_lock = PTHREAD_MUTEX_INITIALIZER;

static void die(const char *what) {
    char buf[512];
    int n = snprintf(buf, sizeof buf, "lbshim: %s: %s\n", what, strerror(errno));
    if (real_write) real_write(2, buf, (size_t)n);
    _exit(97);
}

/* ---- inodes -------------------------------------------------------------- */

struct range { uint64_t start, end; };

struct inode {
    int used;
    dev_t dev;
    ino_t ino;
    uint64_t gen;
    int dirty;               /* data or size changed since the last sync */
    struct range *ranges;
    size_t nranges, cap;
};

#define INODES 65536
static struct inode inodes[INODES];
static uint64_t next_gen = 1;

static struct inode *inode_get(dev_t dev, ino_t ino, int create) {
    size_t h = ((size_t)ino * 0x9E3779B97F4A7C15ull ^ (size_t)dev) % INODES;
    for (size_t i = 0; i < INODES; i++) {
        struct inode *n = &inodes[(h + i) % INODES];
        if (n->used && n->dev == dev && n->ino == ino) return n;
        if (!n->used) {
            if (!create) return NULL;
            memset(n, 0, sizeof *n);
            n->used = 1;
            n->dev = dev;
            n->ino = ino;
            return n;
        }
    }
    errno = ENOSPC;
    die("inode table full");
    return NULL;
}

static void add_range(struct inode *n, uint64_t start, uint64_t end) {
    n->dirty = 1;
    if (end <= start) return;
    /* Merge with an overlapping or adjacent range (most writes extend the
     * last one). */
    for (size_t i = n->nranges; i-- > 0;) {
        struct range *r = &n->ranges[i];
        if (start <= r->end && end >= r->start) {
            if (start < r->start) r->start = start;
            if (end > r->end) r->end = end;
            return;
        }
        if (n->nranges - i > 8) break;
    }
    if (n->nranges == n->cap) {
        if (n->cap >= 8192) {
            /* Collapse: copy the hull at the next sync. */
            uint64_t lo = start, hi = end;
            for (size_t i = 0; i < n->nranges; i++) {
                if (n->ranges[i].start < lo) lo = n->ranges[i].start;
                if (n->ranges[i].end > hi) hi = n->ranges[i].end;
            }
            n->ranges[0].start = lo;
            n->ranges[0].end = hi;
            n->nranges = 1;
            return;
        }
        size_t cap = n->cap ? n->cap * 2 : 16;
        struct range *r = realloc(n->ranges, cap * sizeof *r);
        if (!r) die("realloc");
        n->ranges = r;
        n->cap = cap;
    }
    n->ranges[n->nranges].start = start;
    n->ranges[n->nranges].end = end;
    n->nranges++;
}

/* ---- file descriptors ---------------------------------------------------- */

enum { FD_UNKNOWN = 0, FD_UNTRACKED, FD_FILE, FD_DIR };

struct fdinfo {
    int state;
    dev_t dev;
    ino_t ino;
    char *path; /* directories only */
};

#define FDS 65536
static struct fdinfo fds[FDS];

static int under_root(const char *abs) {
    return root_len && strncmp(abs, root, root_len) == 0 &&
           (abs[root_len] == '/' || abs[root_len] == 0);
}

/* Absolute, lexically normalised form of `path` relative to `dirfd`. */
static int absolute(int dirfd, const char *path, char *out) {
    char base[PATH_MAX];
    char tmp[PATH_MAX * 2];
    if (!path) return -1;
    if (path[0] == '/') {
        snprintf(tmp, sizeof tmp, "%s", path);
    } else {
        if (dirfd == AT_FDCWD) {
            if (!getcwd(base, sizeof base)) return -1;
        } else {
            char link[64];
            snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
            ssize_t n = readlink(link, base, sizeof base - 1);
            if (n < 0) return -1;
            base[n] = 0;
        }
        snprintf(tmp, sizeof tmp, "%s/%s", base, path);
    }
    /* Normalise "." and ".." and repeated slashes. */
    char *parts[PATH_MAX / 2];
    int np = 0;
    char *save = NULL;
    for (char *p = strtok_r(tmp, "/", &save); p; p = strtok_r(NULL, "/", &save)) {
        if (strcmp(p, ".") == 0) continue;
        if (strcmp(p, "..") == 0) {
            if (np > 0) np--;
            continue;
        }
        parts[np++] = p;
    }
    size_t len = 0;
    out[0] = 0;
    for (int i = 0; i < np; i++) {
        size_t l = strlen(parts[i]);
        if (len + l + 2 >= PATH_MAX) return -1;
        out[len++] = '/';
        memcpy(out + len, parts[i], l);
        len += l;
        out[len] = 0;
    }
    if (len == 0) strcpy(out, "/");
    return 0;
}

static void fd_forget(int fd) {
    if (fd < 0 || fd >= FDS) return;
    free(fds[fd].path);
    memset(&fds[fd], 0, sizeof fds[fd]);
}

/* Classifies an fd seen for the first time (dup'd, inherited...). Called
 * with table_lock held. */
static struct fdinfo *fd_info(int fd) {
    if (fd < 0 || fd >= FDS) return NULL;
    struct fdinfo *f = &fds[fd];
    if (f->state == FD_UNKNOWN) {
        char link[64], target[PATH_MAX];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, target, sizeof target - 1);
        struct stat st;
        if (n > 0 && (target[n] = 0, under_root(target)) && fstat(fd, &st) == 0 &&
            (S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))) {
            f->dev = st.st_dev;
            f->ino = st.st_ino;
            if (S_ISDIR(st.st_mode)) {
                f->state = FD_DIR;
                f->path = strdup(target);
            } else {
                f->state = FD_FILE;
            }
        } else {
            f->state = FD_UNTRACKED;
        }
    }
    return f->state == FD_UNTRACKED ? NULL : f;
}

/* ---- counting and kill points ---------------------------------------- */

static void count(int cls) {
    uint64_t n = __atomic_add_fetch(&local_counts[cls], 1, __ATOMIC_SEQ_CST);
    if (counts) __atomic_store_n(&counts[cls], n, __ATOMIC_SEQ_CST);
    if (cls == kill_class && n == kill_at) {
        char path[PATH_MAX + 16];
        char line[128];
        if (mirror_on || getenv("LBSHIM_MARK")) {
            const char *mark = getenv("LBSHIM_MARK");
            if (mark) snprintf(path, sizeof path, "%s", mark);
            else snprintf(path, sizeof path, "%s/killed", mirror);
            int fd = real_open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
            if (fd >= 0) {
                int l = snprintf(line, sizeof line, "%s %llu\n", class_names[cls],
                                 (unsigned long long)n);
                real_write(fd, line, (size_t)l);
                real_close(fd);
            }
        }
        if (kill_delay_ms) {
            struct timespec ts = {kill_delay_ms / 1000, (long)(kill_delay_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
        kill(getpid(), SIGKILL);
        for (;;) pause();
    }
}

/* ---- mirror ------------------------------------------------------------- */

static void key_path(char *out, size_t len, const char *kind, dev_t dev, ino_t ino, uint64_t gen) {
    snprintf(out, len, "%s/%s/%llu.%llu.%llu", mirror, kind, (unsigned long long)dev,
             (unsigned long long)ino, (unsigned long long)gen);
}

/* Torn mode: appends a line to the write journal. */
static void journal(char kind, dev_t dev, ino_t ino, uint64_t gen, uint64_t start, uint64_t end) {
    if (journal_fd < 0) return;
    char line[160];
    int n = snprintf(line, sizeof line, "%c %llu.%llu.%llu %llu %llu\n", kind,
                     (unsigned long long)dev, (unsigned long long)ino, (unsigned long long)gen,
                     (unsigned long long)start, (unsigned long long)end);
    real_write(journal_fd, line, (size_t)n);
}

static uint64_t gen_of(dev_t dev, ino_t ino) {
    struct inode *n = inode_get(dev, ino, 0);
    return n ? n->gen : 0;
}

/* Copies `len` bytes at `off` from fd `in` to fd `out`. */
static int copy_range(int in, int out, uint64_t off, uint64_t len) {
    static __thread char buf[1 << 16];
    while (len > 0) {
        size_t want = len < sizeof buf ? (size_t)len : sizeof buf;
        ssize_t n = pread(in, buf, want, (off_t)off);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (n == 0) break; /* beyond the end: the size is set separately */
        ssize_t w = real_pwrite(out, buf, (size_t)n, (off_t)off);
        if (w != n) return -1;
        off += (uint64_t)n;
        len -= (uint64_t)n;
    }
    return 0;
}

/* Makes the dirty ranges (all, or those meeting [lo, hi)) of the file open
 * as `fd` durable in the mirror. */
static void flush_file(int fd, dev_t dev, ino_t ino, int all, uint64_t lo, uint64_t hi, int set_size) {
    struct range *taken = NULL;
    size_t ntaken = 0;
    uint64_t gen;
    pthread_mutex_lock(&table_lock);
    struct inode *n = inode_get(dev, ino, 1);
    gen = n->gen;
    if (all) {
        taken = n->ranges;
        ntaken = n->nranges;
        n->ranges = NULL;
        n->nranges = n->cap = 0;
        n->dirty = 0;
    } else if (n->nranges) {
        /* Take the parts of the ranges inside [lo, hi); what lies outside
         * stays dirty. */
        taken = malloc(n->nranges * sizeof *taken);
        struct range *left = malloc(2 * n->nranges * sizeof *left);
        if (!taken || !left) die("malloc");
        size_t nleft = 0;
        for (size_t i = 0; i < n->nranges; i++) {
            struct range r = n->ranges[i];
            uint64_t s = r.start > lo ? r.start : lo;
            uint64_t e = r.end < hi ? r.end : hi;
            if (s < e) {
                taken[ntaken++] = (struct range){s, e};
                if (r.start < s) left[nleft++] = (struct range){r.start, s};
                if (e < r.end) left[nleft++] = (struct range){e, r.end};
            } else {
                left[nleft++] = r;
            }
        }
        size_t cap = 2 * n->nranges;
        free(n->ranges);
        n->ranges = left;
        n->nranges = nleft;
        n->cap = cap;
    }
    pthread_mutex_unlock(&table_lock);

    pthread_mutex_lock(&flush_lock);
    char link[64], dst[PATH_MAX + 64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    int in = real_open(link, O_RDONLY | O_CLOEXEC);
    key_path(dst, sizeof dst, "files", dev, ino, gen);
    int out = real_open(dst, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (in < 0 || out < 0) die("mirror open");
    for (size_t i = 0; i < ntaken; i++) {
        if (copy_range(in, out, taken[i].start, taken[i].end - taken[i].start) < 0)
            die("mirror copy");
    }
    struct stat st;
    if (fstat(in, &st) < 0) die("fstat");
    if (set_size) {
        if (real_ftruncate(out, st.st_size) < 0) die("mirror truncate");
    } else {
        struct stat ost;
        if (fstat(out, &ost) == 0 && ost.st_size < st.st_size) {
            /* lenient sync_file_range: the data in the range counts */
            uint64_t end = hi < (uint64_t)st.st_size ? hi : (uint64_t)st.st_size;
            if ((uint64_t)ost.st_size < end) real_ftruncate(out, (off_t)end);
        }
    }
    real_close(in);
    real_close(out);
    if (all) journal('S', dev, ino, gen, 0, 0);
    pthread_mutex_unlock(&flush_lock);
    free(taken);
}

/* Writes the current listing of directory `path` as its durable one. */
static void flush_dir(const char *path, dev_t dev, ino_t ino) {
    char dst[PATH_MAX + 64], tmp[PATH_MAX + 80], entry[PATH_MAX * 2];
    pthread_mutex_lock(&flush_lock);
    pthread_mutex_lock(&table_lock);
    uint64_t gen = gen_of(dev, ino);
    key_path(dst, sizeof dst, "dirs", dev, ino, gen);
    snprintf(tmp, sizeof tmp, "%s.tmp", dst);
    FILE *out = NULL;
    int ofd = real_open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (ofd >= 0) out = fdopen(ofd, "w");
    DIR *d = opendir(path);
    if (!out || !d) {
        pthread_mutex_unlock(&table_lock);
        die("mirror listing");
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        struct stat st;
        snprintf(entry, sizeof entry, "%s/%s", path, e->d_name);
        if (lstat(entry, &st) < 0) continue; /* removed meanwhile */
        char kind = S_ISDIR(st.st_mode) ? 'D' : S_ISREG(st.st_mode) ? 'F' : 0;
        if (!kind) continue;
        fprintf(out, "%c %llu %llu %llu %s\n", kind, (unsigned long long)st.st_dev,
                (unsigned long long)st.st_ino,
                (unsigned long long)gen_of(st.st_dev, st.st_ino), e->d_name);
    }
    closedir(d);
    pthread_mutex_unlock(&table_lock);
    if (fclose(out) != 0) die("mirror listing write");
    if (real_rename(tmp, dst) < 0) die("mirror listing rename");
    pthread_mutex_unlock(&flush_lock);
}

/* Makes the whole tree under `path` durable (sync, syncfs, and the initial
 * copy at load). */
static void flush_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) < 0) return;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (!d) return;
        struct dirent *e;
        char child[PATH_MAX];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            snprintf(child, sizeof child, "%s/%s", path, e->d_name);
            flush_tree(child);
        }
        closedir(d);
        flush_dir(path, st.st_dev, st.st_ino);
    } else if (S_ISREG(st.st_mode)) {
        int fd = real_open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) return;
        pthread_mutex_lock(&table_lock);
        struct inode *n = inode_get(st.st_dev, st.st_ino, 1);
        n->nranges = 0;
        add_range(n, 0, (uint64_t)st.st_size);
        pthread_mutex_unlock(&table_lock);
        flush_file(fd, st.st_dev, st.st_ino, 1, 0, 0, 1);
        real_close(fd);
    }
}

/* ---- set-up ------------------------------------------------------------ */

__attribute__((constructor)) static void lbshim_init(void) {
    load_real();
    const char *r = getenv("LBSHIM_ROOT");
    if (r && *r) {
        if (absolute(AT_FDCWD, r, root) < 0) die("LBSHIM_ROOT");
        root_len = strlen(root);
    }
    const char *mode = getenv("LBSHIM_MODE");
    lenient = mode && strcmp(mode, "lenient") == 0;
    torn = mode && strcmp(mode, "torn") == 0;
    const char *k = getenv("LBSHIM_KILL");
    if (k && *k) {
        char cls[64];
        unsigned long long at = 0;
        unsigned delay = 0;
        if (sscanf(k, "%63[^:]:%llu:%u", cls, &at, &delay) < 2) {
            errno = EINVAL;
            die("LBSHIM_KILL must be class:n[:delay_ms]");
        }
        for (int i = 0; i < C_COUNT; i++)
            if (strcmp(cls, class_names[i]) == 0) kill_class = i;
        if (kill_class < 0) {
            errno = EINVAL;
            die("LBSHIM_KILL: unknown class");
        }
        kill_at = at;
        kill_delay_ms = delay;
    }
    const char *c = getenv("LBSHIM_COUNTS");
    if (c && *c) {
        int fd = real_open(c, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) die("LBSHIM_COUNTS");
        char head[4096];
        memset(head, ' ', sizeof head);
        size_t off = 0;
        for (int i = 0; i < C_COUNT; i++)
            off += (size_t)snprintf(head + off, sizeof head - off, "%s\n", class_names[i]);
        head[off] = ' ';
        head[4095] = '\n';
        if (real_write(fd, head, sizeof head) != (ssize_t)sizeof head) die("counts");
        if (real_ftruncate(fd, 8192) < 0) die("counts");
        void *m = real_mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 4096);
        if (m == MAP_FAILED) die("counts mmap");
        counts = m;
        real_close(fd);
    }
    const char *m = getenv("LBSHIM_MIRROR");
    if (m && *m) {
        if (!root_len) {
            errno = EINVAL;
            die("LBSHIM_MIRROR needs LBSHIM_ROOT");
        }
        if (absolute(AT_FDCWD, m, mirror) < 0) die("LBSHIM_MIRROR");
        char p[PATH_MAX + 16];
        real_mkdir(mirror, 0755);
        snprintf(p, sizeof p, "%s/files", mirror);
        real_mkdir(p, 0755);
        snprintf(p, sizeof p, "%s/dirs", mirror);
        real_mkdir(p, 0755);
        mirror_on = 1;
        if (torn) {
            snprintf(p, sizeof p, "%s/writes.log", mirror);
            journal_fd = real_open(p, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
            if (journal_fd < 0) die("mirror journal");
        }
        ready = 1;
        struct stat st;
        if (stat(root, &st) < 0) die("LBSHIM_ROOT");
        flush_tree(root);
        /* The mirror counts only once `root` names the tree's root, and a
         * kill can come at any instruction: written aside and renamed into
         * place, so that it is never read half-written. */
        char done[PATH_MAX + 16];
        snprintf(p, sizeof p, "%s/root.tmp", mirror);
        snprintf(done, sizeof done, "%s/root", mirror);
        FILE *f = fopen(p, "w");
        if (!f) die("mirror root");
        fprintf(f, "%llu %llu %llu\n", (unsigned long long)st.st_dev,
                (unsigned long long)st.st_ino, 0ull);
        if (fclose(f) != 0) die("mirror root");
        if (real_rename(p, done) < 0) die("mirror root rename");
    }
    ready = 1;
}

/* ---- bookkeeping helpers -------------------------------------------------- */

static int tracking(void) { return ready && root_len; }

/* After a successful open of `abs` as `fd`. */
static void opened(int fd, const char *abs, int flags, int existed) {
    if (fd < 0 || fd >= FDS) return;
    struct stat st;
    if (fstat(fd, &st) < 0) return;
    pthread_mutex_lock(&table_lock);
    fd_forget(fd);
    struct fdinfo *f = &fds[fd];
    if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
        f->state = FD_UNTRACKED;
        pthread_mutex_unlock(&table_lock);
        return;
    }
    f->dev = st.st_dev;
    f->ino = st.st_ino;
    if (S_ISDIR(st.st_mode)) {
        f->state = FD_DIR;
        f->path = strdup(abs);
    } else {
        f->state = FD_FILE;
    }
    struct inode *n = inode_get(st.st_dev, st.st_ino, 1);
    if (!existed) {
        /* A new inode: nothing of it is durable yet. */
        n->gen = next_gen++;
        n->nranges = 0;
        n->dirty = 1;
    } else if ((flags & O_TRUNC) && S_ISREG(st.st_mode)) {
        n->dirty = 1;
    }
    pthread_mutex_unlock(&table_lock);
}

static int do_open(int dirfd, const char *path, int flags, mode_t mode, int which) {
    char abs[PATH_MAX];
    int track = tracking() && absolute(dirfd, path, abs) == 0 && under_root(abs);
    int existed = 1;
    if (track && (flags & O_CREAT)) {
        struct stat st;
        existed = lstat(abs, &st) == 0;
        if (!existed) count(C_CREATE);
    }
    int fd;
    switch (which) {
    case 0: fd = real_open(path, flags, mode); break;
    case 1: fd = real_open64(path, flags, mode); break;
    case 2: fd = real_openat(dirfd, path, flags, mode); break;
    default: fd = real_openat64(dirfd, path, flags, mode); break;
    }
    if (fd >= 0) {
        if (track) {
            int saved = errno;
            opened(fd, abs, flags, existed);
            errno = saved;
        } else if (fd < FDS && ready) {
            pthread_mutex_lock(&table_lock);
            fd_forget(fd);
            fds[fd].state = FD_UNTRACKED;
            pthread_mutex_unlock(&table_lock);
        }
    }
    return fd;
}

static mode_t open_mode(int flags, va_list ap) {
    if (flags & (O_CREAT | __O_TMPFILE)) return (mode_t)va_arg(ap, int);
    return 0;
}

/* Records a write of `n` bytes at `off` (or at the position now reached,
 * when `off` < 0) on `fd`. */
static void wrote(int fd, int64_t off, ssize_t n) {
    if (!tracking() || n <= 0) return;
    pthread_mutex_lock(&table_lock);
    struct fdinfo *f = fd_info(fd);
    if (f && f->state == FD_FILE) {
        if (off < 0) {
            off_t pos = lseek(fd, 0, SEEK_CUR);
            off = pos >= n ? (int64_t)pos - n : 0;
        }
        struct inode *in = inode_get(f->dev, f->ino, 1);
        add_range(in, (uint64_t)off, (uint64_t)off + (uint64_t)n);
        journal('W', f->dev, f->ino, in->gen, (uint64_t)off, (uint64_t)off + (uint64_t)n);
    }
    pthread_mutex_unlock(&table_lock);
}

/* Is `fd` a tracked file or directory? Fills dev/ino/dir path. */
static int tracked_fd(int fd, int *is_dir, dev_t *dev, ino_t *ino, char *path) {
    if (!tracking()) return 0;
    pthread_mutex_lock(&table_lock);
    struct fdinfo *f = fd_info(fd);
    int ok = f != NULL;
    if (ok) {
        *is_dir = f->state == FD_DIR;
        *dev = f->dev;
        *ino = f->ino;
        if (f->state == FD_DIR && path) snprintf(path, PATH_MAX, "%s", f->path);
    }
    pthread_mutex_unlock(&table_lock);
    return ok;
}

static int path_tracked(int dirfd, const char *path) {
    char abs[PATH_MAX];
    return tracking() && absolute(dirfd, path, abs) == 0 && under_root(abs);
}

/* ---- interposed calls ------------------------------------------------------ */

int open(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = open_mode(flags, ap);
    va_end(ap);
    if (!real_open) load_real();
    return do_open(AT_FDCWD, path, flags, mode, 0);
}

int open64(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = open_mode(flags, ap);
    va_end(ap);
    if (!real_open64) load_real();
    return do_open(AT_FDCWD, path, flags, mode, 1);
}

int openat(int dirfd, const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = open_mode(flags, ap);
    va_end(ap);
    if (!real_openat) load_real();
    return do_open(dirfd, path, flags, mode, 2);
}

int openat64(int dirfd, const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = open_mode(flags, ap);
    va_end(ap);
    if (!real_openat64) load_real();
    return do_open(dirfd, path, flags, mode, 3);
}

int __open_2(const char *path, int flags) { return do_open(AT_FDCWD, path, flags, 0, 0); }
int __open64_2(const char *path, int flags) { return do_open(AT_FDCWD, path, flags, 0, 1); }
int __openat_2(int dirfd, const char *path, int flags) { return do_open(dirfd, path, flags, 0, 2); }
int __openat64_2(int dirfd, const char *path, int flags) { return do_open(dirfd, path, flags, 0, 3); }

int creat(const char *path, mode_t mode) {
    return do_open(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode, 0);
}

int creat64(const char *path, mode_t mode) {
    return do_open(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode, 1);
}

int close(int fd) {
    if (ready && fd >= 0 && fd < FDS) {
        pthread_mutex_lock(&table_lock);
        fd_forget(fd);
        pthread_mutex_unlock(&table_lock);
    }
    return real_close(fd);
}

int dup2(int old, int new) {
    int r = real_dup2(old, new);
    if (r >= 0 && ready && r < FDS) {
        pthread_mutex_lock(&table_lock);
        fd_forget(r);
        pthread_mutex_unlock(&table_lock);
    }
    return r;
}

int dup3(int old, int new, int flags) {
    int r = real_dup3(old, new, flags);
    if (r >= 0 && ready && r < FDS) {
        pthread_mutex_lock(&table_lock);
        fd_forget(r);
        pthread_mutex_unlock(&table_lock);
    }
    return r;
}

static int fd_is_file(int fd) {
    int is_dir = 0;
    dev_t dev;
    ino_t ino;
    return tracked_fd(fd, &is_dir, &dev, &ino, NULL) && !is_dir;
}

ssize_t write(int fd, const void *buf, size_t n) {
    if (fd > 2 && fd_is_file(fd)) count(C_WRITE);
    ssize_t r = real_write(fd, buf, n);
    if (r > 0 && fd > 2) wrote(fd, -1, r);
    return r;
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
    if (fd_is_file(fd)) count(C_PWRITE);
    ssize_t r = real_pwrite(fd, buf, n, off);
    if (r > 0) wrote(fd, off, r);
    return r;
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off64_t off) {
    if (fd_is_file(fd)) count(C_PWRITE);
    ssize_t r = real_pwrite64(fd, buf, n, off);
    if (r > 0) wrote(fd, off, r);
    return r;
}

ssize_t writev(int fd, const struct iovec *iov, int cnt) {
    if (fd > 2 && fd_is_file(fd)) count(C_WRITE);
    ssize_t r = real_writev(fd, iov, cnt);
    if (r > 0 && fd > 2) wrote(fd, -1, r);
    return r;
}

ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off) {
    if (fd_is_file(fd)) count(C_PWRITE);
    ssize_t r = real_pwritev(fd, iov, cnt, off);
    if (r > 0) wrote(fd, off, r);
    return r;
}

ssize_t pwritev64(int fd, const struct iovec *iov, int cnt, off64_t off) {
    if (fd_is_file(fd)) count(C_PWRITE);
    ssize_t r = real_pwritev64(fd, iov, cnt, off);
    if (r > 0) wrote(fd, off, r);
    return r;
}

ssize_t pwritev2(int fd, const struct iovec *iov, int cnt, off_t off, int flags) {
    if (fd_is_file(fd)) count(C_PWRITE);
    ssize_t r = real_pwritev2(fd, iov, cnt, off, flags);
    if (r > 0) wrote(fd, off, r);
    return r;
}

ssize_t copy_file_range(int in, off64_t *in_off, int out, off64_t *out_off, size_t len,
                        unsigned int flags) {
    int64_t at = out_off ? (int64_t)*out_off : -1;
    if (fd_is_file(out)) count(C_COPY);
    ssize_t r = real_copy_file_range(in, in_off, out, out_off, len, flags);
    if (r > 0) wrote(out, at, r);
    return r;
}

static int do_sync(int fd, int cls) {
    int is_dir = 0;
    dev_t dev = 0;
    ino_t ino = 0;
    char path[PATH_MAX];
    int tracked = tracked_fd(fd, &is_dir, &dev, &ino, path);
    if (tracked) {
        /* The fd table could be stale if an fd was closed behind our back:
         * check that it still names the same inode. */
        struct stat st;
        if (fstat(fd, &st) == 0 && (st.st_dev != dev || st.st_ino != ino)) {
            pthread_mutex_lock(&table_lock);
            fd_forget(fd);
            pthread_mutex_unlock(&table_lock);
            tracked = tracked_fd(fd, &is_dir, &dev, &ino, path);
        }
    }
    if (tracked) count(cls);
    int r = cls == C_FSYNC ? real_fsync(fd) : real_fdatasync(fd);
    if (r == 0 && tracked && mirror_on) {
        int saved = errno;
        if (is_dir) flush_dir(path, dev, ino);
        else flush_file(fd, dev, ino, 1, 0, 0, 1);
        errno = saved;
    }
    return r;
}

int fsync(int fd) { return do_sync(fd, C_FSYNC); }
int fdatasync(int fd) { return do_sync(fd, C_FDATASYNC); }

int sync_file_range(int fd, off64_t off, off64_t n, unsigned int flags) {
    int is_dir = 0;
    dev_t dev = 0;
    ino_t ino = 0;
    int tracked = tracked_fd(fd, &is_dir, &dev, &ino, NULL);
    if (tracked) count(C_SFR);
    int r = real_sync_file_range(fd, off, n, flags);
    if (r == 0 && tracked && !is_dir && mirror_on && lenient &&
        (flags & SYNC_FILE_RANGE_WAIT_AFTER) && (flags & SYNC_FILE_RANGE_WRITE)) {
        int saved = errno;
        uint64_t hi = n == 0 ? UINT64_MAX : (uint64_t)off + (uint64_t)n;
        flush_file(fd, dev, ino, 0, (uint64_t)off, hi, 0);
        errno = saved;
    }
    return r;
}

int syncfs(int fd) {
    if (tracking()) count(C_SYNCFS);
    int r = real_syncfs(fd);
    if (r == 0 && mirror_on) flush_tree(root);
    return r;
}

void sync(void) {
    if (tracking()) count(C_SYNCFS);
    real_sync();
    if (mirror_on) flush_tree(root);
}

int rename(const char *a, const char *b) {
    if (path_tracked(AT_FDCWD, a) || path_tracked(AT_FDCWD, b)) count(C_RENAME);
    return real_rename(a, b);
}

int renameat(int da, const char *a, int db, const char *b) {
    if (path_tracked(da, a) || path_tracked(db, b)) count(C_RENAME);
    return real_renameat(da, a, db, b);
}

int renameat2(int da, const char *a, int db, const char *b, unsigned int flags) {
    if (path_tracked(da, a) || path_tracked(db, b)) count(C_RENAME);
    return real_renameat2(da, a, db, b, flags);
}

int unlink(const char *p) {
    if (path_tracked(AT_FDCWD, p)) count(C_UNLINK);
    return real_unlink(p);
}

int unlinkat(int d, const char *p, int flags) {
    if (path_tracked(d, p)) count(C_UNLINK);
    return real_unlinkat(d, p, flags);
}

int rmdir(const char *p) {
    if (path_tracked(AT_FDCWD, p)) count(C_UNLINK);
    return real_rmdir(p);
}

static void size_changed(int fd) {
    if (!tracking()) return;
    pthread_mutex_lock(&table_lock);
    struct fdinfo *f = fd_info(fd);
    if (f && f->state == FD_FILE) inode_get(f->dev, f->ino, 1)->dirty = 1;
    pthread_mutex_unlock(&table_lock);
}

int ftruncate(int fd, off_t len) {
    if (fd_is_file(fd)) count(C_FTRUNCATE);
    int r = real_ftruncate(fd, len);
    if (r == 0) size_changed(fd);
    return r;
}

int ftruncate64(int fd, off64_t len) {
    if (fd_is_file(fd)) count(C_FTRUNCATE);
    int r = real_ftruncate64(fd, len);
    if (r == 0) size_changed(fd);
    return r;
}

static int truncate_path(const char *p, off64_t len, int big) {
    int tracked = path_tracked(AT_FDCWD, p);
    if (tracked) count(C_FTRUNCATE);
    int r = big ? real_truncate64(p, len) : real_truncate(p, (off_t)len);
    if (r == 0 && tracked) {
        struct stat st;
        if (stat(p, &st) == 0) {
            pthread_mutex_lock(&table_lock);
            inode_get(st.st_dev, st.st_ino, 1)->dirty = 1;
            pthread_mutex_unlock(&table_lock);
        }
    }
    return r;
}

int truncate(const char *p, off_t len) { return truncate_path(p, len, 0); }
int truncate64(const char *p, off64_t len) { return truncate_path(p, len, 1); }

int fallocate(int fd, int mode, off_t off, off_t len) {
    if (fd_is_file(fd)) count(C_FALLOCATE);
    int r = real_fallocate(fd, mode, off, len);
    if (r == 0) wrote(fd, off, (ssize_t)len);
    return r;
}

int fallocate64(int fd, int mode, off64_t off, off64_t len) {
    if (fd_is_file(fd)) count(C_FALLOCATE);
    int r = real_fallocate64(fd, mode, off, len);
    if (r == 0) wrote(fd, off, (ssize_t)len);
    return r;
}

int posix_fallocate(int fd, off_t off, off_t len) {
    if (fd_is_file(fd)) count(C_FALLOCATE);
    int r = real_posix_fallocate(fd, off, len);
    if (r == 0) wrote(fd, off, (ssize_t)len);
    return r;
}

int posix_fallocate64(int fd, off64_t off, off64_t len) {
    if (fd_is_file(fd)) count(C_FALLOCATE);
    int r = real_posix_fallocate64(fd, off, len);
    if (r == 0) wrote(fd, off, (ssize_t)len);
    return r;
}

static void made_dir(int dirfd, const char *p) {
    char abs[PATH_MAX];
    struct stat st;
    if (absolute(dirfd, p, abs) == 0 && stat(abs, &st) == 0) {
        pthread_mutex_lock(&table_lock);
        struct inode *n = inode_get(st.st_dev, st.st_ino, 1);
        n->gen = next_gen++;
        pthread_mutex_unlock(&table_lock);
    }
}

int mkdir(const char *p, mode_t mode) {
    int tracked = path_tracked(AT_FDCWD, p);
    if (tracked) count(C_MKDIR);
    int r = real_mkdir(p, mode);
    if (r == 0 && tracked) made_dir(AT_FDCWD, p);
    return r;
}

int mkdirat(int d, const char *p, mode_t mode) {
    int tracked = path_tracked(d, p);
    if (tracked) count(C_MKDIR);
    int r = real_mkdirat(d, p, mode);
    if (r == 0 && tracked) made_dir(d, p);
    return r;
}

static void check_map(int prot, int flags, int fd) {
    if ((prot & PROT_WRITE) && (flags & MAP_SHARED) && fd >= 0 && fd_is_file(fd))
        count(C_MMAP_WRITE);
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    if (ready) check_map(prot, flags, fd);
    return real_mmap(addr, len, prot, flags, fd, off);
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off64_t off) {
    if (ready) check_map(prot, flags, fd);
    return real_mmap64(addr, len, prot, flags, fd, off);
}
