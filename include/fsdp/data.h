/* libfsdp: token data for language-model training.
 *
 * A token source is a read-only array of token ids that any number of rank threads share:
 * the bytes of text files (byte-level tokens, ids < 256), or an llm.c token shard
 * (docs/formats.md section 3). A global batch is B rows of T tokens (inputs) and the same
 * shifted by one (targets); rank r of W takes rows r B/W .. (r + 1) B/W - 1, so the ranks
 * together see exactly the global batch.
 *
 * Two orders:
 *  - RANDOM (text): row b of global batch `step` is the window at a position drawn from a
 *    generator seeded with (seed, step, b): deterministic, the same for any world size, and
 *    any step can be read directly (resuming needs no state).
 *  - SEQUENTIAL (llm.c): global batch `step` is the B*T + 1 tokens from position step*B*T,
 *    wrapping back to 0 when that window would pass the end (llm.c's loader); row b's inputs
 *    are tokens b*T .. b*T + T - 1 of the window and its targets the next T.
 */
#ifndef FSDP_DATA_H
#define FSDP_DATA_H

#include <fsdp/api.h>

#include <fsdp/status.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FSDP_LLMC_MAGIC 20240520 /* llm.c's uint16 token shards (GPT-2) */
#define FSDP_LLMC_VERSION 1
#define FSDP_LLMC_MAGIC_U32 20240801 /* its uint32 token shards (Llama 3's 128,256 ids) */
#define FSDP_LLMC_VERSION_U32 7
#define FSDP_LLMC_HEADER_BYTES 1024 /* 256 int32 */

typedef enum { FSDP_TOKENS_RANDOM = 0, FSDP_TOKENS_SEQUENTIAL = 1 } fsdp_tokens_order_t;

typedef struct fsdp_tokens fsdp_tokens_t;

/* The readers of token files read regular files only: a directory, a FIFO, a device or a socket
 * is FSDP_ERR_INVALID_PARAM at once, never read (a FIFO would block, /dev/zero never end). Each
 * takes at most max_bytes of host memory (SIZE_MAX: no bound): a larger file is refused by its
 * size, before any of it is read, with FSDP_ERR_NO_MEMORY, logged with the size and the bound. */

/* Byte-level tokens of a file (token i = byte i), RANDOM order. An empty file is
 * FSDP_ERR_INVALID_PARAM, an unreadable one FSDP_ERR_IO, logged with the path. */
FSDP_API fsdp_status_t fsdp_tokens_open_text(const char *path, size_t max_bytes,
                                             fsdp_tokens_t **tokens_p);

/* Byte-level tokens of the files paths[0..n), concatenated in that order, at most max_bytes in
 * all, RANDOM order; fsdp_tokens_source() says label. An unreadable file is FSDP_ERR_IO, logged
 * with its path; no bytes at all FSDP_ERR_INVALID_PARAM, logged with the label. */
FSDP_API fsdp_status_t fsdp_tokens_open_texts(const char *const *paths, size_t n, const char *label,
                                              size_t max_bytes, fsdp_tokens_t **tokens_p);

/* An llm.c shard as dev/data/data_common.py's write_datafile writes it: a header of 256
 * little-endian int32 (magic, version, the token count), then the tokens: magic 20240520 and
 * version 1, uint16 (GPT-2's vocabulary), or magic 20240801 and version 7, uint32 (Llama 3's);
 * SEQUENTIAL order. The file is mapped, and counts whole against max_bytes (opening reads it all
 * once). A bad magic, version or count (the file must be exactly 1024 + 2 or 4 times count
 * bytes) is FSDP_ERR_FORMAT, logged with what was found. */
FSDP_API fsdp_status_t fsdp_tokens_open_llmc(const char *path, size_t max_bytes,
                                             fsdp_tokens_t **tokens_p);

/* Tokens from memory (copied), in either order; `source` names them in messages. */
FSDP_API fsdp_status_t fsdp_tokens_from_array(const uint16_t *ids, size_t n,
                                              fsdp_tokens_order_t order, const char *source,
                                              fsdp_tokens_t **tokens_p);

/* Accepts NULL. */
FSDP_API void fsdp_tokens_close(fsdp_tokens_t *tokens);

FSDP_API size_t fsdp_tokens_count(const fsdp_tokens_t *tokens);
/* The largest id (0 when empty): a model needs a vocabulary above it. */
FSDP_API uint32_t fsdp_tokens_max_id(const fsdp_tokens_t *tokens);
/* What the tokens are, for a log line: "llm.c shard x.bin", "text y.txt", ... Never NULL. */
FSDP_API const char *fsdp_tokens_source(const fsdp_tokens_t *tokens);

typedef struct fsdp_batch_spec {
    size_t batch; /* global rows B, a multiple of world */
    size_t seq;   /* tokens per row T */
    int rank;     /* this rank, in [0, world) */
    int world;
    uint64_t seed; /* RANDOM order */
} fsdp_batch_spec_t;

/* Checks that global batches of this shape can be read (rows divisible by the world, at least
 * B*T + 1 tokens for SEQUENTIAL order and T + 1 for RANDOM), logging what is wrong. */
FSDP_API fsdp_status_t fsdp_tokens_check_spec(const fsdp_tokens_t *tokens,
                                              const fsdp_batch_spec_t *spec);

/* This rank's rows of global batch `step` (>= 0): inputs and targets, [B/W, T] each. */
FSDP_API fsdp_status_t fsdp_tokens_batch(const fsdp_tokens_t *tokens, const fsdp_batch_spec_t *spec,
                                         int64_t step, int32_t *inputs, int32_t *targets);

#ifdef __cplusplus
}
#endif
#endif
