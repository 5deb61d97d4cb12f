/* The library's file-system helpers (never installed): a file opened to be read, never blocking
 * and only when it is a regular file; a file written atomically, and a directory synced so that
 * a rename in it survives a crash.
 */
#ifndef FSDP_LIB_IO_FS_H
#define FSDP_LIB_IO_FS_H

#include <fsdp/status.h>

#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>

/* Opens path to read it; every file the library reads by path is opened here. The open does not
 * block (O_NONBLOCK: a FIFO's would wait for a writer), and what fstat says is not a regular
 * file is refused: a directory, a FIFO, a device or a socket could block a reader or never end.
 * On success *fd_p is the descriptor, blocking again, and *st_p its stat (st_size bounds what a
 * reader takes). On failure one error line names path: "cannot open: <why>" with errno kept
 * and FSDP_ERR_IO, or "is a FIFO, not a regular file" (directory, device, socket) and
 * FSDP_ERR_INVALID_PARAM. With quiet_missing, a path that does not exist is FSDP_ERR_NOT_FOUND,
 * not logged, for a caller to whom that is no error or who says it better. */
fsdp_status_t fsdp_fs_open_read(const char *path, int quiet_missing, int *fd_p, struct stat *st_p);

/* The same, as a stdio stream ("r") into *f_p. */
fsdp_status_t fsdp_fs_fopen_read(const char *path, int quiet_missing, FILE **f_p);

/* One piece of a file's contents, written in order. */
typedef struct fsdp_fs_chunk {
    const void *data;
    uint64_t len;
} fsdp_fs_chunk_t;

/* Writes chunks[0..n) to path atomically: a temporary "<path>.tmp.<pid>" in the same directory
 * (so the rename cannot cross filesystems), fsync, rename over path, then the directory synced
 * (fsdp_fs_sync_dir). On failure path is as it was, no temporary is left behind, and the one
 * error logged names path, the step that failed and why; FSDP_ERR_IO, or FSDP_ERR_NO_MEMORY. */
fsdp_status_t fsdp_fs_write_atomic(const char *path, const fsdp_fs_chunk_t *chunks, int n);

/* fsyncs directory dir, which makes the renames and creations in it durable. Filesystems that
 * cannot sync a directory answer EINVAL: that is no error, there is nothing to do. Logs and
 * returns FSDP_ERR_IO on any other failure. */
fsdp_status_t fsdp_fs_sync_dir(const char *dir);

#endif
