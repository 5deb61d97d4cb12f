/* An exclusive lock held by one run on what it writes (a checkpoint directory, a trace), so that
 * a second run is refused at once instead of mixing its files with the first's (never
 * installed). */
#ifndef FSDP_LIB_IO_LOCK_H
#define FSDP_LIB_IO_LOCK_H

#include <fsdp/status.h>

typedef struct fsdp_lock fsdp_lock_t;

/* fsdp_lock_take's flags */
enum {
    /* a lock file that cannot be created (a read-only or full directory) is no error: *lock_p
     * is NULL, and the caller's own open of what it guards says why that fails */
    FSDP_LOCK_IF_WRITABLE = 1,
};

/* Takes an exclusive flock on the lock file `path` (created if missing), which then holds this
 * process's pid and host name. Held by another process: FSDP_ERR_INVALID_PARAM at once, without
 * waiting, and one error line naming `what` (e.g. "checkpoint directory 'ckpt'") and the
 * holder's pid. A lock file that cannot be created or locked: FSDP_ERR_IO and a line, unless
 * flags say otherwise. The kernel drops the lock when its holder dies, so a killed run's lock
 * file is no obstacle. *lock_p is set on success only. */
fsdp_status_t fsdp_lock_take(const char *path, const char *what, int flags, fsdp_lock_t **lock_p);

/* Removes the lock file and drops the lock; NULL is a no-op. */
void fsdp_lock_release(fsdp_lock_t *lock);

#endif
