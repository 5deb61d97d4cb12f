/* A growable string (strbuf.h). */
#include "base/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fsdp_strbuf_printf(fsdp_strbuf_t *b, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (b->failed)
        return;
    for (;;) {
        size_t room = b->cap - b->len;
        va_start(ap, fmt);
        n = vsnprintf(b->s != NULL ? b->s + b->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = 1;
            return;
        }
        if ((size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap < 256 ? 256 : b->cap;
        while (cap - b->len <= (size_t)n)
            cap *= 2;
        char *s = realloc(b->s, cap);
        if (s == NULL) {
            b->failed = 1;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

void fsdp_strbuf_reset(fsdp_strbuf_t *b)
{
    b->len = 0;
    if (b->s != NULL)
        b->s[0] = '\0';
}

void fsdp_strbuf_free(fsdp_strbuf_t *b)
{
    free(b->s);
    memset(b, 0, sizeof(*b));
}
