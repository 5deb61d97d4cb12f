/* File-system helpers shared by the readers and writers of lib/ (safetensors, checkpoints, token
 * data, profiles): the one open of a file to read, which refuses what is not a regular file,
 * atomic writes, and directory syncs with one policy for filesystems that cannot sync a
 * directory. */
#include "io/fs.h"

#include <fsdp/log.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *fs_kind(mode_t mode)
{
    return S_ISDIR(mode)                    ? "a directory"
           : S_ISFIFO(mode)                 ? "a FIFO"
           : S_ISCHR(mode) || S_ISBLK(mode) ? "a device"
           : S_ISSOCK(mode)                 ? "a socket"
                                            : "a special file";
}

fsdp_status_t fsdp_fs_open_read(const char *path, int quiet_missing, int *fd_p, struct stat *st_p)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC), err;

    if (fd < 0) {
        err = errno;
        if (quiet_missing && err == ENOENT)
            return FSDP_ERR_NOT_FOUND;
        fsdp_error("%s: cannot open: %s", path, strerror(err));
        errno = err;
        return FSDP_ERR_IO;
    }
    if (fstat(fd, st_p) != 0) {
        err = errno;
        fsdp_error("%s: cannot stat: %s", path, strerror(err));
        close(fd);
        errno = err;
        return FSDP_ERR_IO;
    }
    if (!S_ISREG(st_p->st_mode)) {
        fsdp_error("%s: is %s, not a regular file: only a regular file is read", path,
                   fs_kind(st_p->st_mode));
        close(fd);
        return FSDP_ERR_INVALID_PARAM;
    }
    (void)fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    *fd_p = fd;
    return FSDP_OK;
}

fsdp_status_t fsdp_fs_fopen_read(const char *path, int quiet_missing, FILE **f_p)
{
    struct stat st;
    int fd;
    fsdp_status_t status = fsdp_fs_open_read(path, quiet_missing, &fd, &st);

    if (status != FSDP_OK)
        return status;
    *f_p = fdopen(fd, "r");
    if (*f_p == NULL) {
        int err = errno;
        fsdp_error("%s: cannot open: %s", path, strerror(err));
        close(fd);
        errno = err;
        return err == ENOMEM ? FSDP_ERR_NO_MEMORY : FSDP_ERR_IO;
    }
    return FSDP_OK;
}

/* 0, or the errno of the failing open or fsync (EINVAL from fsync counts as success). */
static int fs_sync_dir_errno(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), err = 0;

    if (fd < 0)
        return errno;
    if (fsync(fd) != 0 && errno != EINVAL)
        err = errno;
    close(fd);
    return err;
}

fsdp_status_t fsdp_fs_sync_dir(const char *dir)
{
    int err = fs_sync_dir_errno(dir);

    if (err != 0) {
        fsdp_error("%s: cannot sync the directory: %s", dir, strerror(err));
        return FSDP_ERR_IO;
    }
    return FSDP_OK;
}

/* Writes to fd, the temporary file of path (removed on failure: only path is named). */
static fsdp_status_t fs_write_all(int fd, const void *buf, uint64_t len, const char *path)
{
    const unsigned char *p = buf;

    while (len > 0) {
        size_t chunk = len > (1u << 30) ? (1u << 30) : (size_t)len;
        ssize_t w = write(fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            fsdp_error("%s: cannot write: %s", path, strerror(errno));
            return FSDP_ERR_IO;
        }
        p += w;
        len -= (uint64_t)w;
    }
    return FSDP_OK;
}

/* Makes the rename of path durable. */
static fsdp_status_t fs_sync_parent(const char *path)
{
    const char *slash = strrchr(path, '/');
    fsdp_status_t status = FSDP_OK;
    char *dir;
    int err;

    if (slash == NULL)
        dir = strdup(".");
    else if (slash == path)
        dir = strdup("/");
    else
        dir = strndup(path, (size_t)(slash - path));
    if (dir == NULL) {
        fsdp_error("%s: written, but out of memory syncing its directory", path);
        return FSDP_ERR_NO_MEMORY;
    }
    err = fs_sync_dir_errno(dir);
    if (err != 0) {
        fsdp_error("%s: written, but syncing directory %s failed: %s", path, dir, strerror(err));
        status = FSDP_ERR_IO;
    }
    free(dir);
    return status;
}

fsdp_status_t fsdp_fs_write_atomic(const char *path, const fsdp_fs_chunk_t *chunks, int n)
{
    fsdp_status_t status = FSDP_OK;
    size_t tmp_size = strlen(path) + 32;
    char *tmp;
    int fd;

    tmp = malloc(tmp_size);
    if (tmp == NULL) {
        fsdp_error("%s: out of memory", path);
        return FSDP_ERR_NO_MEMORY;
    }
    snprintf(tmp, tmp_size, "%s.tmp.%ld", path, (long)getpid());
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (fd < 0) {
        fsdp_error("%s: cannot create %s: %s", path, tmp, strerror(errno));
        status = FSDP_ERR_IO;
        goto err_free_tmp;
    }
    for (int i = 0; i < n && status == FSDP_OK; i++)
        status = fs_write_all(fd, chunks[i].data, chunks[i].len, path);
    if (status != FSDP_OK)
        goto err_unlink;
    if (fsync(fd) != 0) {
        fsdp_error("%s: fsync of %s failed: %s", path, tmp, strerror(errno));
        status = FSDP_ERR_IO;
        goto err_unlink;
    }
    if (close(fd) != 0) {
        fd = -1;
        fsdp_error("%s: closing %s failed: %s", path, tmp, strerror(errno));
        status = FSDP_ERR_IO;
        goto err_unlink;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        fsdp_error("%s: cannot rename %s over it: %s", path, tmp, strerror(errno));
        status = FSDP_ERR_IO;
        goto err_unlink;
    }
    free(tmp);
    return fs_sync_parent(path);

err_unlink:
    if (fd >= 0)
        close(fd);
    unlink(tmp);
err_free_tmp:
    free(tmp);
    return status;
}
