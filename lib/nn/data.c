/* Token data: text files as bytes, llm.c token shards, and the per-rank slice of every global
 * batch (include/fsdp/data.h). */
#include "config.h"

#include "io/fs.h"
#include "nn/nn_int.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fsdp/data.h>
#include <fsdp/log.h>
#include <fsdp/nn.h>

struct fsdp_tokens {
    fsdp_tokens_order_t order;
    size_t n;
    int width;                 /* bytes per token: 1 (text), 2 or 4 (uint16, uint32; LE) */
    const unsigned char *data; /* n * width bytes */
    unsigned char *owned;      /* malloc'd data, or NULL */
    void *map;                 /* mmap'd file, or NULL */
    size_t map_len;
    uint32_t max_id;
    char source[PATH_MAX + 32];
};

static fsdp_tokens_t *tokens_new(fsdp_tokens_order_t order, int width, const char *what,
                                 const char *path)
{
    fsdp_tokens_t *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    t->order = order;
    t->width = width;
    snprintf(t->source, sizeof(t->source), "%s %s", what, path);
    return t;
}

static void tokens_scan(fsdp_tokens_t *t)
{
    t->max_id = 0;
    for (size_t i = 0; i < t->n; i++) {
        uint32_t v = fsdp_tokens_at(t, i);
        if (v > t->max_id)
            t->max_id = v;
    }
}

void fsdp_tokens_close(fsdp_tokens_t *tokens)
{
    if (tokens == NULL)
        return;
    if (tokens->map != NULL)
        munmap(tokens->map, tokens->map_len);
    free(tokens->owned);
    free(tokens);
}

size_t fsdp_tokens_count(const fsdp_tokens_t *tokens)
{
    return tokens->n;
}

uint32_t fsdp_tokens_max_id(const fsdp_tokens_t *tokens)
{
    return tokens->max_id;
}

uint32_t fsdp_tokens_at(const fsdp_tokens_t *tokens, size_t i)
{
    const unsigned char *p = tokens->data + i * (size_t)tokens->width;
    if (tokens->width == 4)
        return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    return tokens->width == 1 ? p[0] : (uint32_t)p[0] | (uint32_t)p[1] << 8;
}

fsdp_tokens_order_t fsdp_tokens_order(const fsdp_tokens_t *tokens)
{
    return tokens->order;
}

const char *fsdp_tokens_source(const fsdp_tokens_t *tokens)
{
    return tokens != NULL ? tokens->source : "(none)";
}

fsdp_status_t fsdp_tokens_from_array(const uint16_t *ids, size_t n, fsdp_tokens_order_t order,
                                     const char *source, fsdp_tokens_t **tokens_p)
{
    fsdp_tokens_t *t = tokens_new(order, 2, "tokens", source ? source : "<array>");

    if (t == NULL || (t->owned = malloc(n > 0 ? 2 * n : 1)) == NULL) {
        fsdp_tokens_close(t);
        return FSDP_ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < n; i++) {
        t->owned[2 * i] = (unsigned char)(ids[i] & 0xff);
        t->owned[2 * i + 1] = (unsigned char)(ids[i] >> 8);
    }
    t->data = t->owned;
    t->n = n;
    tokens_scan(t);
    *tokens_p = t;
    return FSDP_OK;
}

/* Refuses, with one line, data of `bytes` (after `before` bytes of earlier files) past the
 * max_bytes it may take in host memory. */
static fsdp_status_t tokens_fit(const char *path, uint64_t bytes, size_t before, size_t max_bytes)
{
    if (bytes <= max_bytes && before <= max_bytes - bytes)
        return FSDP_OK;
    fsdp_error("%s: %" PRIu64 " bytes%s are more than the %zu bytes of host memory the token "
               "data may take (max_bytes; in fsdp-train what --host-memory, default 90%% of the "
               "memory available, leaves after the model); train on a smaller file or give more "
               "memory",
               path, bytes, before > 0 ? " after the files before it" : "", max_bytes);
    return FSDP_ERR_NO_MEMORY;
}

/* Appends file path, a regular file of at most max_bytes together with the *len bytes before
 * it, to *buf: the bytes its size gave at the open, no more (one that grows is not followed). */
static fsdp_status_t append_file(const char *path, size_t max_bytes, unsigned char **buf,
                                 size_t *len)
{
    struct stat st;
    unsigned char *nb;
    size_t size, got = 0;
    int fd;
    fsdp_status_t status = fsdp_fs_open_read(path, 0, &fd, &st);

    if (status != FSDP_OK)
        return status;
    status = tokens_fit(path, (uint64_t)st.st_size, *len, max_bytes);
    if (status != FSDP_OK)
        goto out;
    size = (size_t)st.st_size;
    nb = realloc(*buf, *len + size + 1);
    if (nb == NULL) {
        fsdp_error("%s: out of host memory for its %zu bytes", path, size);
        status = FSDP_ERR_NO_MEMORY;
        goto out;
    }
    *buf = nb;
    while (got < size) {
        ssize_t r = read(fd, nb + *len + got, size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            fsdp_error("%s: cannot read: %s", path, strerror(errno));
            status = FSDP_ERR_IO;
            goto out;
        }
        if (r == 0)
            break; /* it shrank: what is there */
        got += (size_t)r;
    }
    *len += got;
out:
    close(fd);
    return status;
}

/* Reads paths[0..n) one after the other into t as its tokens, at most max_bytes in all; closes t
 * on failure. `name` says what t is in the message when there is nothing to read. */
static fsdp_status_t tokens_load(fsdp_tokens_t *t, const char *const *paths, size_t n,
                                 const char *name, size_t max_bytes, fsdp_tokens_t **tokens_p)
{
    fsdp_status_t status = FSDP_OK;

    for (size_t i = 0; i < n && status == FSDP_OK; i++)
        status = append_file(paths[i], max_bytes, &t->owned, &t->n);
    if (status == FSDP_OK && t->n == 0) {
        fsdp_error("%s: %s: no tokens to train on", name,
                   n == 1   ? "the file is empty"
                   : n == 0 ? "no files"
                            : "the files are empty");
        status = FSDP_ERR_INVALID_PARAM;
    }
    if (status != FSDP_OK) {
        fsdp_tokens_close(t);
        return status;
    }
    t->data = t->owned;
    tokens_scan(t);
    *tokens_p = t;
    return FSDP_OK;
}

fsdp_status_t fsdp_tokens_open_text(const char *path, size_t max_bytes, fsdp_tokens_t **tokens_p)
{
    fsdp_tokens_t *t = tokens_new(FSDP_TOKENS_RANDOM, 1, "text", path);

    if (t == NULL)
        return FSDP_ERR_NO_MEMORY;
    return tokens_load(t, &path, 1, path, max_bytes, tokens_p);
}

fsdp_status_t fsdp_tokens_open_texts(const char *const *paths, size_t n, const char *label,
                                     size_t max_bytes, fsdp_tokens_t **tokens_p)
{
    fsdp_tokens_t *t;

    if ((paths == NULL && n > 0) || label == NULL || tokens_p == NULL) {
        fsdp_error("fsdp_tokens_open_texts: needs n paths, a label and tokens_p");
        return FSDP_ERR_INVALID_PARAM;
    }
    t = tokens_new(FSDP_TOKENS_RANDOM, 1, "", "");
    if (t == NULL)
        return FSDP_ERR_NO_MEMORY;
    snprintf(t->source, sizeof(t->source), "%s", label);
    return tokens_load(t, paths, n, label, max_bytes, tokens_p);
}

/* ---- llm.c shards ---- */

static int32_t le32(const unsigned char *p)
{
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24);
}

fsdp_status_t fsdp_tokens_open_llmc(const char *path, size_t max_bytes, fsdp_tokens_t **tokens_p)
{
    fsdp_tokens_t *t;
    struct stat st;
    const unsigned char *h;
    int32_t magic, version, count;
    int width, want_version, fd;
    fsdp_status_t status = fsdp_fs_open_read(path, 0, &fd, &st);

    if (status != FSDP_OK)
        return status;
    status = tokens_fit(path, (uint64_t)st.st_size, 0, max_bytes); /* mapped, read by the scan */
    if (status != FSDP_OK) {
        close(fd);
        return status;
    }
    if (st.st_size < FSDP_LLMC_HEADER_BYTES) {
        fsdp_error("%s: %lld bytes is shorter than the %d-byte header of an llm.c token file", path,
                   (long long)st.st_size, FSDP_LLMC_HEADER_BYTES);
        close(fd);
        return FSDP_ERR_FORMAT;
    }
    t = tokens_new(FSDP_TOKENS_SEQUENTIAL, 2, "llm.c shard", path);
    if (t == NULL) {
        close(fd);
        return FSDP_ERR_NO_MEMORY;
    }
    t->map_len = (size_t)st.st_size;
    t->map = mmap(NULL, t->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (t->map == MAP_FAILED) {
        t->map = NULL;
        fsdp_error("%s: cannot map: %s", path, strerror(errno));
        fsdp_tokens_close(t);
        return FSDP_ERR_IO;
    }
    h = t->map;
    magic = le32(h);
    version = le32(h + 4);
    count = le32(h + 8);
    if (magic != FSDP_LLMC_MAGIC && magic != FSDP_LLMC_MAGIC_U32) {
        fsdp_error("%s: magic %d is neither llm.c's %d (uint16 tokens, GPT-2) nor %d (uint32 "
                   "tokens, Llama 3)",
                   path, (int)magic, FSDP_LLMC_MAGIC, FSDP_LLMC_MAGIC_U32);
        fsdp_tokens_close(t);
        return FSDP_ERR_FORMAT;
    }
    width = magic == FSDP_LLMC_MAGIC ? 2 : 4;
    want_version = magic == FSDP_LLMC_MAGIC ? FSDP_LLMC_VERSION : FSDP_LLMC_VERSION_U32;
    if (version != want_version) {
        fsdp_error("%s: version %d of the token file is not %d, which magic %d has", path,
                   (int)version, want_version, (int)magic);
        fsdp_tokens_close(t);
        return FSDP_ERR_FORMAT;
    }
    if (count <= 0 ||
        (uint64_t)st.st_size != FSDP_LLMC_HEADER_BYTES + (uint64_t)width * (uint64_t)count) {
        fsdp_error("%s: the header counts %d tokens of %d bytes, so the file should be %llu "
                   "bytes, but it is %lld",
                   path, (int)count, width,
                   (unsigned long long)(FSDP_LLMC_HEADER_BYTES + (uint64_t)width * (uint64_t)count),
                   (long long)st.st_size);
        fsdp_tokens_close(t);
        return FSDP_ERR_FORMAT;
    }
    t->data = h + FSDP_LLMC_HEADER_BYTES;
    t->width = width;
    t->n = (size_t)count;
    tokens_scan(t);
    *tokens_p = t;
    return FSDP_OK;
}

/* ---- batches ---- */

fsdp_status_t fsdp_tokens_check_spec(const fsdp_tokens_t *tokens, const fsdp_batch_spec_t *spec)
{
    size_t need;

    if (spec->world < 1 || spec->rank < 0 || spec->rank >= spec->world || spec->batch == 0 ||
        spec->seq == 0 || spec->batch % (size_t)spec->world != 0) {
        fsdp_error("%s: a global batch of %zu rows of %zu tokens cannot be split over %d ranks "
                   "(rank %d): the rows must be a positive multiple of the world",
                   tokens->source, spec->batch, spec->seq, spec->world, spec->rank);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (spec->seq > SIZE_MAX / 2 / spec->batch) {
        fsdp_error("%s: a global batch of %zu x %zu tokens is too large", tokens->source,
                   spec->batch, spec->seq);
        return FSDP_ERR_INVALID_PARAM;
    }
    need = tokens->order == FSDP_TOKENS_SEQUENTIAL ? spec->batch * spec->seq + 1 : spec->seq + 1;
    if (tokens->n < need) {
        fsdp_error("%s: %zu tokens are too few for %s of %zu x %zu (needs %zu)", tokens->source,
                   tokens->n, tokens->order == FSDP_TOKENS_SEQUENTIAL ? "a global batch" : "a row",
                   spec->batch, spec->seq, need);
        return FSDP_ERR_INVALID_PARAM;
    }
    return FSDP_OK;
}

size_t fsdp_tokens_window(const fsdp_tokens_t *tokens, size_t batch, size_t seq, int64_t step)
{
    size_t bt = batch * seq, windows = bt > 0 && tokens->n > 0 ? (tokens->n - 1) / bt : 0;
    if (windows == 0 || step < 0) /* no whole window (fsdp_tokens_check_spec refuses it) */
        return 0;
    return (size_t)((uint64_t)step % (uint64_t)windows) * bt;
}

/* RANDOM order: the start of global row b of batch `step`, uniform over the full windows. */
static size_t random_start(const fsdp_tokens_t *tokens, const fsdp_batch_spec_t *spec, int64_t step,
                           size_t b)
{
    fsdp_rng_t rng;
    uint64_t span = (uint64_t)(tokens->n - spec->seq); /* starts 0 .. n - T - 1 */
    fsdp_rng_seed(&rng, spec->seed ^ ((uint64_t)step * UINT64_C(0xd1b54a32d192ed03)) ^
                            ((uint64_t)b * UINT64_C(0x8cb92ba72f3d8dd7)));
    return (size_t)(fsdp_rng_next(&rng) % span);
}

fsdp_status_t fsdp_tokens_batch(const fsdp_tokens_t *tokens, const fsdp_batch_spec_t *spec,
                                int64_t step, int32_t *inputs, int32_t *targets)
{
    size_t rows = spec->batch / (size_t)(spec->world > 0 ? spec->world : 1);
    size_t first = (size_t)spec->rank * rows, T = spec->seq;
    fsdp_status_t status = fsdp_tokens_check_spec(tokens, spec);

    if (status != FSDP_OK)
        return status;
    if (step < 0) {
        fsdp_error("%s: batch step %lld is negative", tokens->source, (long long)step);
        return FSDP_ERR_INVALID_PARAM;
    }
    for (size_t i = 0; i < rows; i++) {
        size_t b = first + i, start;
        if (tokens->order == FSDP_TOKENS_SEQUENTIAL)
            start = fsdp_tokens_window(tokens, spec->batch, T, step) + b * T;
        else
            start = random_start(tokens, spec, step, b);
        for (size_t j = 0; j < T; j++) {
            inputs[i * T + j] = (int32_t)fsdp_tokens_at(tokens, start + j);
            targets[i * T + j] = (int32_t)fsdp_tokens_at(tokens, start + j + 1);
        }
    }
    return FSDP_OK;
}
