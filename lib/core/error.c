/* Error recording: the message fsdp_last_error returns, and its line in the log. The bottom of
 * the core, with the hook context (hook_ctx.c): it calls no other core file. */
#include "core/core_int.h"

#include <stdarg.h>
#include <stdio.h>

fsdp_status_t fsdp_fail(fsdp_t *fs, fsdp_status_t status, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(fs->last_error, sizeof(fs->last_error), fmt, ap);
    va_end(ap);
    fsdp_error("%s", fs->last_error);
    return status;
}

const char *fsdp_last_error(const fsdp_t *fs)
{
    return fs ? fs->last_error : "";
}
