/* The library's file-system helpers (never installed): a file written atomically, and a
 * directory synced so that a rename in it survives a crash.
 */
#ifndef FSDP_LIB_IO_FS_H
#define FSDP_LIB_IO_FS_H

#include <fsdp/status.h>

#include <stdint.h>

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
