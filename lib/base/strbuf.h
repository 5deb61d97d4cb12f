/* A growable string, formatted into piece by piece: the trace tools build a report in it before
 * printing it. Not thread-safe; a zeroed fsdp_strbuf_t is an empty one. */
#ifndef FSDP_BASE_STRBUF_H
#define FSDP_BASE_STRBUF_H

#include <stddef.h>

typedef struct fsdp_strbuf {
    char *s;
    size_t len, cap;
    int failed; /* an allocation failed: the text is truncated */
} fsdp_strbuf_t;

void fsdp_strbuf_printf(fsdp_strbuf_t *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void fsdp_strbuf_reset(fsdp_strbuf_t *b);
void fsdp_strbuf_free(fsdp_strbuf_t *b);

#endif
