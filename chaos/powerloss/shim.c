/* LD_PRELOAD journal of what a power loss could undo, for chaos/power_loss.py.
 *
 * For files and directories under POWERLOSS_ROOT, appends one line per event to
 * POWERLOSS_JOURNAL (tab separated, one write(2) per line, O_APPEND, so lines from
 * threads never interleave):
 *   C ino path        a regular file was created (O_CREAT and the name did not exist)
 *   S ino size        fsync/fdatasync of a regular file returned; size is taken BEFORE
 *                     the call, so every byte up to it was in the page cache when it began
 *   T ino size        ftruncate or truncate of a regular file
 *   D path            fsync of a directory returned: its entries are durable
 *   M path            a directory was created
 *   R old new stash   rename; if it replaced a file, that file's bytes were first copied
 *                     to POWERLOSS_STASH/stash so the rename can be undone ("-": none)
 *   U path            unlink (informational: an unlink is treated as durable at once)
 * POWERLOSS_SLOW_FSYNC (optional) names a file; while it exists, each fsync/fdatasync of a
 * file under the root first sleeps the number of milliseconds it holds ("MS" or "MS SUFFIX":
 * only files whose name ends with SUFFIX): a slow disk, so a test can cut the power while
 * an fsync is still in flight.
 * Writes themselves are not journalled: a file's size at the power loss is what was
 * written; what survives is the size at its last fsync (see chaos/power_loss.py).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define MAX_FD 65536
enum { UNTRACKED = 0, TRACKED_FILE = 1, TRACKED_DIR = 2 };
static unsigned char tracked[MAX_FD];
static char root[PATH_MAX];
static size_t root_len;
static char stash_dir[PATH_MAX];
static char slow_flag[PATH_MAX];
static int journal_fd = -1;
static unsigned long stash_counter;
static pthread_mutex_t stash_lock = PTHREAD_MUTEX_INITIALIZER;

static int (*real_open)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static int (*real_close)(int);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_ftruncate)(int, off_t);
static int (*real_truncate)(const char *, off_t);
static int (*real_rename)(const char *, const char *);
static int (*real_mkdir)(const char *, mode_t);
static int (*real_unlink)(const char *);

__attribute__((constructor)) static void init(void) {
    real_open = dlsym(RTLD_NEXT, "open64");
    real_openat = dlsym(RTLD_NEXT, "openat64");
    real_close = dlsym(RTLD_NEXT, "close");
    real_fsync = dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
    real_ftruncate = dlsym(RTLD_NEXT, "ftruncate64");
    real_truncate = dlsym(RTLD_NEXT, "truncate64");
    real_rename = dlsym(RTLD_NEXT, "rename");
    real_mkdir = dlsym(RTLD_NEXT, "mkdir");
    real_unlink = dlsym(RTLD_NEXT, "unlink");
    const char *r = getenv("POWERLOSS_ROOT"), *j = getenv("POWERLOSS_JOURNAL"), *s = getenv("POWERLOSS_STASH");
    if (!r || !j || !s || strlen(r) >= PATH_MAX - 1 || strlen(s) >= PATH_MAX - 64) return;
    snprintf(root, sizeof root, "%s", r);
    root_len = strlen(root);
    snprintf(stash_dir, sizeof stash_dir, "%s", s);
    const char *slow = getenv("POWERLOSS_SLOW_FSYNC");
    if (slow) snprintf(slow_flag, sizeof slow_flag, "%s", slow);
    journal_fd = real_open(j, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
}

static void journal(const char *fmt, ...) {
    char line[3 * PATH_MAX + 64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n > 0 && (size_t)n < sizeof line) {
        int saved = errno;
        ssize_t ignored = write(journal_fd, line, (size_t)n);
        (void)ignored;
        errno = saved;
    }
}

static int under_root(const char *path) {
    return journal_fd >= 0 && strncmp(path, root, root_len) == 0 && (path[root_len] == '/' || path[root_len] == 0);
}

/* The absolute path of fd (what the kernel says), or "" */
static void fd_path(int fd, char *out) {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, out, PATH_MAX - 1);
    out[n > 0 ? n : 0] = 0;
}

/* The absolute path of a name relative to dirfd: its parent resolved, its last part kept. */
static void abs_path(int dirfd, const char *path, char *out) {
    char joined[2 * PATH_MAX], parent[PATH_MAX];
    if (path[0] == '/') {
        snprintf(joined, sizeof joined, "%s", path);
    } else {
        char base[PATH_MAX];
        if (dirfd == AT_FDCWD) { if (!getcwd(base, sizeof base)) base[0] = 0; }
        else fd_path(dirfd, base);
        snprintf(joined, sizeof joined, "%s/%s", base, path);
    }
    char *slash = strrchr(joined, '/');
    *slash = 0;
    if (!realpath(joined[0] ? joined : "/", parent)) { out[0] = 0; return; }
    snprintf(out, PATH_MAX, "%s/%s", strcmp(parent, "/") ? parent : "", slash + 1);
}

static int opened(int fd, int flags, int existed) {
    if (fd < 0 || fd >= MAX_FD || journal_fd < 0) return fd;
    char path[PATH_MAX];
    struct stat st;
    tracked[fd] = UNTRACKED;
    fd_path(fd, path);
    if (!under_root(path) || fstat(fd, &st) != 0) return fd;
    if (S_ISDIR(st.st_mode)) tracked[fd] = TRACKED_DIR;
    else if (S_ISREG(st.st_mode)) {
        tracked[fd] = TRACKED_FILE;
        if ((flags & O_CREAT) && !existed) journal("C\t%lu\t%s\n", (unsigned long)st.st_ino, path);
    }
    return fd;
}

static int do_openat(int dirfd, const char *path, int flags, mode_t mode) {
    int existed = 1;
    if ((flags & O_CREAT) && journal_fd >= 0) existed = faccessat(dirfd, path, F_OK, 0) == 0;
    return opened(real_openat(dirfd, path, flags, mode), flags, existed);
}

int open(const char *path, int flags, ...) {
    mode_t mode = 0;
    if (flags & (O_CREAT | __O_TMPFILE)) { va_list ap; va_start(ap, flags); mode = va_arg(ap, mode_t); va_end(ap); }
    return do_openat(AT_FDCWD, path, flags, mode);
}
int open64(const char *path, int flags, ...) __attribute__((alias("open")));
int openat(int dirfd, const char *path, int flags, ...) {
    mode_t mode = 0;
    if (flags & (O_CREAT | __O_TMPFILE)) { va_list ap; va_start(ap, flags); mode = va_arg(ap, mode_t); va_end(ap); }
    return do_openat(dirfd, path, flags, mode);
}
int openat64(int dirfd, const char *path, int flags, ...) __attribute__((alias("openat")));

int close(int fd) {
    if (fd >= 0 && fd < MAX_FD) tracked[fd] = UNTRACKED;
    return real_close(fd);
}

static int synced(int fd, int (*call)(int)) {
    if (fd < 0 || fd >= MAX_FD || tracked[fd] == UNTRACKED) return call(fd);
    struct stat st;
    int have = fstat(fd, &st) == 0;
    if (slow_flag[0] && tracked[fd] == TRACKED_FILE) {
        /* Slow disk: the bytes are in the page cache, the fsync has not reached the disk. */
        char spec[256] = "", suffix[200] = "", path[PATH_MAX];
        int ms = 0;
        int flag = real_open(slow_flag, O_RDONLY | O_CLOEXEC, 0);
        if (flag >= 0) {
            ssize_t n = read(flag, spec, sizeof spec - 1);
            spec[n > 0 ? n : 0] = 0;
            real_close(flag);
            sscanf(spec, "%d %199s", &ms, suffix);
            fd_path(fd, path);
            size_t plen = strlen(path), slen = strlen(suffix);
            if (ms > 0 && (slen == 0 || (plen >= slen && strcmp(path + plen - slen, suffix) == 0)))
                usleep((useconds_t)ms * 1000);
        }
    }
    int rc = call(fd);
    if (rc == 0 && have) {
        if (tracked[fd] == TRACKED_FILE) journal("S\t%lu\t%lld\n", (unsigned long)st.st_ino, (long long)st.st_size);
        else { char path[PATH_MAX]; fd_path(fd, path); journal("D\t%s\n", path); }
    }
    return rc;
}
int fsync(int fd) { return synced(fd, real_fsync); }
int fdatasync(int fd) { return synced(fd, real_fdatasync); }

int ftruncate(int fd, off_t size) {
    int rc = real_ftruncate(fd, size);
    struct stat st;
    if (rc == 0 && fd >= 0 && fd < MAX_FD && tracked[fd] == TRACKED_FILE && fstat(fd, &st) == 0)
        journal("T\t%lu\t%lld\n", (unsigned long)st.st_ino, (long long)size);
    return rc;
}
int ftruncate64(int fd, off_t size) __attribute__((alias("ftruncate")));

int truncate(const char *path, off_t size) {
    int rc = real_truncate(path, size);
    char p[PATH_MAX];
    struct stat st;
    if (rc == 0 && journal_fd >= 0) {
        abs_path(AT_FDCWD, path, p);
        if (under_root(p) && stat(p, &st) == 0 && S_ISREG(st.st_mode))
            journal("T\t%lu\t%lld\n", (unsigned long)st.st_ino, (long long)size);
    }
    return rc;
}
int truncate64(const char *path, off_t size) __attribute__((alias("truncate")));

/* Copy a file about to be replaced into the stash; its name, or "-" if there was none. */
static void stash_copy(const char *path, char *name) {
    strcpy(name, "-");
    int in = real_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (in < 0) return;
    pthread_mutex_lock(&stash_lock);
    unsigned long n = ++stash_counter;
    pthread_mutex_unlock(&stash_lock);
    char target[PATH_MAX + 64];
    snprintf(name, 64, "%d-%lu", (int)getpid(), n);
    snprintf(target, sizeof target, "%s/%s", stash_dir, name);
    int out = real_open(target, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    char buf[65536];
    ssize_t got;
    while (out >= 0 && (got = read(in, buf, sizeof buf)) > 0)
        if (write(out, buf, (size_t)got) != got) break;
    if (out >= 0) real_close(out); else strcpy(name, "-");
    real_close(in);
}

int rename(const char *old, const char *new) {
    char a[PATH_MAX], b[PATH_MAX], stash[64] = "-";
    if (journal_fd < 0) return real_rename(old, new);
    abs_path(AT_FDCWD, old, a);
    abs_path(AT_FDCWD, new, b);
    int track = under_root(b);
    if (track) stash_copy(b, stash);
    int rc = real_rename(old, new);
    if (rc == 0 && track) journal("R\t%s\t%s\t%s\n", a, b, stash);
    return rc;
}

int mkdir(const char *path, mode_t mode) {
    int rc = real_mkdir(path, mode);
    if (rc == 0 && journal_fd >= 0) {
        char p[PATH_MAX];
        abs_path(AT_FDCWD, path, p);
        if (under_root(p)) journal("M\t%s\n", p);
    }
    return rc;
}

int unlink(const char *path) {
    char p[PATH_MAX] = "";
    if (journal_fd >= 0) abs_path(AT_FDCWD, path, p);
    int rc = real_unlink(path);
    if (rc == 0 && p[0] && under_root(p)) journal("U\t%s\n", p);
    return rc;
}
