/* Error recording: the message fsdp_last_error returns, and its line in the log. The bottom of
 * the core, with the hook context (hook_ctx.c): it calls no other core file. */
#include "core/core_int.h"

#include <stdarg.h>
#include <stdio.h>

/* Records the message and, with log, logs it as one line. */
static fsdp_status_t fail_v(fsdp_t *fs, fsdp_status_t status, int log, const char *fmt, va_list ap)
{
    vsnprintf(fs->last_error, sizeof(fs->last_error), fmt, ap);
    if (log)
        fsdp_error("%s", fs->last_error);
    return status;
}

fsdp_status_t fsdp_fail(fsdp_t *fs, fsdp_status_t status, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    status = fail_v(fs, status, 1, fmt, ap);
    va_end(ap);
    return status;
}

/* Whether the code below the core has logged an error it returned with this status. It logs
 * where it finds an error, once (a collective's mismatch or timeout once for all its ranks), but
 * two statuses come up without a line of this rank's: another rank's failure, and a host
 * allocation's, returned as it is. */
static int logged_below(fsdp_status_t status)
{
    return status != FSDP_ERR_RANK_FAILED && status != FSDP_ERR_NO_MEMORY;
}

fsdp_status_t fsdp_fail_below(fsdp_t *fs, fsdp_status_t status, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    status = fail_v(fs, status, !logged_below(status), fmt, ap);
    va_end(ap);
    return status;
}

const char *fsdp_last_error(const fsdp_t *fs)
{
    return fs ? fs->last_error : "";
}
