/* One run at a time on what it writes: an exclusive flock on a lock file, held until released
 * or until the process dies (lock.h). */
#include "io/lock.h"

#include <fsdp/log.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

struct fsdp_lock {
    int fd;
    char *path;
};

/* A few retries cover a holder that removes the file between our open and our flock. */
#define LOCK_TRIES 8

/* "pid N on HOST" from the holder's lock file, or what is known without it. */
static void lock_holder(int fd, char *out, size_t len)
{
    char buf[320], host[256];
    ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
    long pid;

    if (n > 0) {
        buf[n] = '\0';
        if (sscanf(buf, "%ld %255s", &pid, host) == 2 && pid > 0) {
            snprintf(out, len, "pid %ld on %s", pid, host);
            return;
        }
    }
    snprintf(out, len, "a process that has not written its pid yet");
}

/* This process's pid and host into the lock file, for a refused run's message. Informational
 * alone: a file system with no room for it leaves the lock held all the same. */
static void lock_write_holder(int fd)
{
    char text[320], host[256];
    int n;

    if (gethostname(host, sizeof(host)) != 0 || host[0] == '\0')
        snprintf(host, sizeof(host), "localhost");
    host[sizeof(host) - 1] = '\0';
    n = snprintf(text, sizeof(text), "%ld %s\n", (long)getpid(), host);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)n, 0) != n)
        fsdp_debug("cannot write the holder into the lock file: %s", strerror(errno));
}

fsdp_status_t fsdp_lock_take(const char *path, const char *what, int flags, fsdp_lock_t **lock_p)
{
    fsdp_lock_t *lock;
    int fd = -1;

    for (int tries = 0; fd < 0; tries++) {
        struct stat mine, named;
        char holder[300];

        fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0 && (flags & FSDP_LOCK_IF_WRITABLE)) {
            fsdp_debug("%s: not locked: cannot create %s: %s", what, path, strerror(errno));
            *lock_p = NULL;
            return FSDP_OK;
        }
        if (fd < 0) {
            fsdp_error("%s: cannot create the lock file %s: %s", what, path, strerror(errno));
            return FSDP_ERR_IO;
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int err = errno;
            if (err == EWOULDBLOCK) {
                lock_holder(fd, holder, sizeof(holder));
                fsdp_error("%s is in use by another run (%s, lock file %s): one run at a time "
                           "may write it",
                           what, holder, path);
            } else {
                fsdp_error("%s: cannot lock %s: %s", what, path, strerror(err));
            }
            close(fd);
            return err == EWOULDBLOCK ? FSDP_ERR_INVALID_PARAM : FSDP_ERR_IO;
        }
        /* the holder before us removes the file as it releases it: the lock counts only on the
         * file that path still names */
        if (fstat(fd, &mine) != 0 || stat(path, &named) != 0 || mine.st_dev != named.st_dev ||
            mine.st_ino != named.st_ino) {
            close(fd);
            fd = -1;
            if (tries + 1 == LOCK_TRIES) {
                fsdp_error("%s: the lock file %s keeps being replaced: another run is starting "
                           "or ending there",
                           what, path);
                return FSDP_ERR_IO;
            }
        }
    }
    lock = calloc(1, sizeof(*lock));
    if (lock == NULL || (lock->path = strdup(path)) == NULL) {
        free(lock);
        close(fd);
        fsdp_error("%s: out of host memory", what);
        return FSDP_ERR_NO_MEMORY;
    }
    lock->fd = fd;
    lock_write_holder(fd);
    *lock_p = lock;
    return FSDP_OK;
}

void fsdp_lock_release(fsdp_lock_t *lock)
{
    if (lock == NULL)
        return;
    /* removed while still held, so that no run locks a file that is no longer at path */
    if (unlink(lock->path) != 0 && errno != ENOENT)
        fsdp_debug("cannot remove the lock file %s: %s", lock->path, strerror(errno));
    close(lock->fd);
    free(lock->path);
    free(lock);
}
