/* Token data (lib/nn/data.c): the llm.c shard reader (header checks, llm.c's window walk with
 * its wrap-around, the split of every global batch across ranks), text files, the seeded
 * sampler, and the default corpus.
 */
#include <fsdp/fsdp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "corpus.h"
#include "nn/nn_hidden.h"
#include "test_util.h"

static char tmpdir[] = "/tmp/test_data.XXXXXX";

static void tmp_path(char *out, size_t len, const char *name)
{
    snprintf(out, len, "%s/%s", tmpdir, name);
}

static void put32(unsigned char *p, int32_t v)
{
    uint32_t u = (uint32_t)v;
    p[0] = (unsigned char)u, p[1] = (unsigned char)(u >> 8);
    p[2] = (unsigned char)(u >> 16), p[3] = (unsigned char)(u >> 24);
}

/* An llm.c shard of `ntok` tokens with a header that says magic, version and count, and `extra`
 * bytes added or removed at the end: uint32 tokens for magic 20240801 (token i = i * 7919 mod
 * 128256, Llama 3's vocabulary), else uint16 (token i = i * 7 mod 65536). */
static void write_shard(const char *path, int32_t magic, int32_t version, int32_t count,
                        size_t ntok, long extra)
{
    unsigned char header[1024] = {0};
    size_t width = magic == 20240801 ? 4 : 2;
    FILE *f = fopen(path, "wb");
    put32(header, magic);
    put32(header + 4, version);
    put32(header + 8, count);
    fwrite(header, 1, sizeof(header), f);
    for (size_t i = 0; i < ntok; i++) {
        unsigned char b[4];
        put32(b, width == 4 ? (int32_t)(i * 7919 % 128256) : (int32_t)(uint16_t)(i * 7));
        fwrite(b, 1, width, f);
    }
    for (long i = 0; i < extra; i++)
        fputc(0, f);
    fclose(f);
    if (extra < 0)
        CU_ASSERT(truncate(path, (off_t)(1024 + width * ntok) + extra) == 0);
}

static fsdp_status_t open_quiet(const char *path, fsdp_tokens_t **t)
{
    fsdp_status_t st;
    fsdp_log_set_level(FSDP_LOG_OFF);
    st = fsdp_tokens_open_llmc(path, SIZE_MAX, t);
    fsdp_log_set_level(FSDP_LOG_ERROR);
    return st;
}

static void test_llmc_header(void)
{
    char path[256];
    fsdp_tokens_t *t = NULL;

    tmp_path(path, sizeof(path), "ok.bin");
    write_shard(path, 20240520, 1, 1000, 1000, 0);
    CU_ASSERT_EQUAL_FATAL(fsdp_tokens_open_llmc(path, SIZE_MAX, &t), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_tokens_count(t), 1000);
    CU_ASSERT_EQUAL(fsdp_tokens_order(t), FSDP_TOKENS_SEQUENTIAL);
    CU_ASSERT_EQUAL(fsdp_tokens_at(t, 999), (uint32_t)((999 * 7) & 0xffff));
    CU_ASSERT_EQUAL(fsdp_tokens_max_id(t), 6993);
    CU_ASSERT(strstr(fsdp_tokens_source(t), "ok.bin") != NULL);
    fsdp_tokens_close(t);

    tmp_path(path, sizeof(path), "bad.bin");
    write_shard(path, 20240521, 1, 1000, 1000, 0); /* magic */
    CU_ASSERT_EQUAL(open_quiet(path, &t), FSDP_ERR_FORMAT);
    write_shard(path, 20240801, 1, 1000, 1000, 0); /* uint32 tokens are version 7 */
    CU_ASSERT_EQUAL(open_quiet(path, &t), FSDP_ERR_FORMAT);
    write_shard(path, 20240801, 7, 2000, 1000, 0); /* 2000 uint16 would fill it, not uint32 */
    CU_ASSERT_EQUAL(open_quiet(path, &t), FSDP_ERR_FORMAT);
    write_shard(path, 20240520, 2, 1000, 1000, 0); /* version */
    CU_ASSERT_EQUAL(open_quiet(path, &t), FSDP_ERR_FORMAT);
    write_shard(path, 20240520, 1, 1001, 1000, 0); /* count above the file */
    CU_ASSERT_EQUAL(open_quiet(path, &t), FSDP_ERR_FORMAT);
    write_shard(path, 20240520, 1, 1000, 1000, 2); /* trailing bytes */
    CU_ASSERT_EQUAL(open_quiet(path, &t), FSDP_ERR_FORMAT);
    write_shard(path, 20240520, 1, 0, 0, 0); /* no tokens */
    CU_ASSERT_EQUAL(open_quiet(path, &t), FSDP_ERR_FORMAT);
    write_shard(path, 20240520, 1, -5, 0, 0);
    CU_ASSERT_EQUAL(open_quiet(path, &t), FSDP_ERR_FORMAT);
    write_shard(path, 20240520, 1, 1000, 0, -100); /* shorter than the header */
    CU_ASSERT_EQUAL(open_quiet(path, &t), FSDP_ERR_FORMAT);
    tmp_path(path, sizeof(path), "missing.bin");
    CU_ASSERT_EQUAL(open_quiet(path, &t), FSDP_ERR_IO);
    /* a FIFO is refused at once (not read, which would block), and so is a directory */
    tmp_path(path, sizeof(path), "fifo.bin");
    CU_ASSERT_FATAL(mkfifo(path, 0600) == 0);
    CU_ASSERT_EQUAL(open_quiet(path, &t), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT_EQUAL(open_quiet(tmpdir, &t), FSDP_ERR_INVALID_PARAM);
}

/* Llama 3's shards: uint32 tokens beyond uint16's range, read the same way */
static void test_llmc_uint32(void)
{
    enum { N = 5000, B = 4, T = 16, W = 2 };
    char path[256];
    fsdp_tokens_t *t = NULL;
    int32_t in[B / W * T], tg[B / W * T];

    tmp_path(path, sizeof(path), "llama3.bin");
    write_shard(path, 20240801, 7, N, N, 0);
    CU_ASSERT_EQUAL_FATAL(fsdp_tokens_open_llmc(path, SIZE_MAX, &t), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_tokens_count(t), N);
    CU_ASSERT_EQUAL(fsdp_tokens_order(t), FSDP_TOKENS_SEQUENTIAL);
    CU_ASSERT_EQUAL(fsdp_tokens_at(t, 4999), (uint32_t)(4999 * 7919 % 128256));
    CU_ASSERT_EQUAL(fsdp_tokens_max_id(t), 128249); /* above uint16, below 128,256 */
    for (int64_t step = 0; step < 3; step++) {
        for (int r = 0; r < W; r++) {
            fsdp_batch_spec_t spec = {B, T, r, W, 0};
            size_t base = fsdp_tokens_window(t, B, T, step) + (size_t)r * (B / W) * T;
            CU_ASSERT_EQUAL_FATAL(fsdp_tokens_batch(t, &spec, step, in, tg), FSDP_OK);
            for (size_t i = 0; i < (size_t)(B / W * T); i++) {
                CU_ASSERT_EQUAL(in[i], (int32_t)((base + i) * 7919 % 128256));
                CU_ASSERT_EQUAL(tg[i], (int32_t)((base + i + 1) * 7919 % 128256));
            }
        }
    }
    fsdp_tokens_close(t);
}

/* llm.c's walk: batch i starts at i*B*T, back to 0 when B*T + 1 tokens would pass the end */
static void test_llmc_windows(void)
{
    enum { N = 1000, B = 4, T = 10 };
    char path[256];
    fsdp_tokens_t *t = NULL;
    size_t pos = 0;

    tmp_path(path, sizeof(path), "w.bin");
    write_shard(path, 20240520, 1, N, N, 0);
    CU_ASSERT_EQUAL_FATAL(fsdp_tokens_open_llmc(path, SIZE_MAX, &t), FSDP_OK);
    for (int64_t step = 0; step < 100; step++) {
        CU_ASSERT_EQUAL(fsdp_tokens_window(t, B, T, step), pos);
        CU_ASSERT(pos + B * T + 1 <= N);
        pos += B * T;
        if (pos + B * T + 1 > N)
            pos = 0;
    }
    /* 24 windows fit in 1000 tokens: the 24th (step 23) ends at 961, step 24 starts over */
    CU_ASSERT_EQUAL(fsdp_tokens_window(t, B, T, 23), 920);
    CU_ASSERT_EQUAL(fsdp_tokens_window(t, B, T, 24), 0);
    /* exactly B*T + 1 tokens: every batch is the whole file */
    fsdp_tokens_close(t);
    write_shard(path, 20240520, 1, B * T + 1, B * T + 1, 0);
    CU_ASSERT_EQUAL_FATAL(fsdp_tokens_open_llmc(path, SIZE_MAX, &t), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_tokens_window(t, B, T, 5), 0);
    fsdp_tokens_close(t);
}

/* rank r's rows are global rows r B/W .. (r + 1) B/W - 1; row b's inputs are window tokens
 * b T .. b T + T - 1 and its targets the same shifted by one */
static void test_llmc_ranks(void)
{
    enum { N = 1000, B = 4, T = 10 };
    char path[256];
    fsdp_tokens_t *t = NULL;
    int32_t in[B * T], tg[B * T];

    tmp_path(path, sizeof(path), "r.bin");
    write_shard(path, 20240520, 1, N, N, 0);
    CU_ASSERT_EQUAL_FATAL(fsdp_tokens_open_llmc(path, SIZE_MAX, &t), FSDP_OK);
    for (int world = 1; world <= 4; world *= 2) {
        int rows = B / world;
        for (int rank = 0; rank < world; rank++) {
            for (int64_t step = 22; step < 26; step++) { /* across the wrap */
                fsdp_batch_spec_t spec = {B, T, rank, world, 0};
                size_t w = fsdp_tokens_window(t, B, T, step);
                CU_ASSERT_EQUAL_FATAL(fsdp_tokens_batch(t, &spec, step, in, tg), FSDP_OK);
                for (int i = 0; i < rows; i++) {
                    size_t b = (size_t)(rank * rows + i);
                    for (int j = 0; j < T; j++) {
                        CU_ASSERT_EQUAL(in[i * T + j], (int32_t)fsdp_tokens_at(t, w + b * T + j));
                        CU_ASSERT_EQUAL(tg[i * T + j],
                                        (int32_t)fsdp_tokens_at(t, w + b * T + j + 1));
                    }
                }
            }
        }
    }
    /* the rows must split evenly, and a global batch must fit */
    fsdp_batch_spec_t bad = {B, T, 0, 3, 0};
    fsdp_log_set_level(FSDP_LOG_OFF);
    CU_ASSERT_EQUAL(fsdp_tokens_batch(t, &bad, 0, in, tg), FSDP_ERR_INVALID_PARAM);
    fsdp_batch_spec_t big = {4, 250, 0, 1, 0};
    CU_ASSERT_EQUAL(fsdp_tokens_check_spec(t, &big), FSDP_ERR_INVALID_PARAM);
    fsdp_log_set_level(FSDP_LOG_ERROR);
    fsdp_tokens_close(t);
}

/* RANDOM order: seeded and stateless, every rank's rows are its part of the same global batch,
 * and the windows are real windows of the text */
static void test_random_sampler(void)
{
    enum { B = 8, T = 16 };
    char path[256];
    FILE *f;
    fsdp_tokens_t *t = NULL;
    int32_t all[B * T], allt[B * T], part[B * T], partt[B * T], again[B * T], other[B * T];

    tmp_path(path, sizeof(path), "text.txt");
    f = fopen(path, "wb");
    for (int i = 0; i < 3000; i++)
        fputc(32 + (i * 31 + i / 7) % 95, f);
    fclose(f);
    CU_ASSERT_EQUAL_FATAL(fsdp_tokens_open_text(path, SIZE_MAX, &t), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_tokens_count(t), 3000);
    CU_ASSERT_EQUAL(fsdp_tokens_order(t), FSDP_TOKENS_RANDOM);
    CU_ASSERT(fsdp_tokens_max_id(t) < 256);

    fsdp_batch_spec_t one = {B, T, 0, 1, 42};
    CU_ASSERT_EQUAL_FATAL(fsdp_tokens_batch(t, &one, 7, all, allt), FSDP_OK);
    CU_ASSERT_EQUAL_FATAL(fsdp_tokens_batch(t, &one, 7, again, part), FSDP_OK);
    CU_ASSERT(memcmp(all, again, sizeof(all)) == 0);
    CU_ASSERT_EQUAL_FATAL(fsdp_tokens_batch(t, &one, 8, other, part), FSDP_OK);
    CU_ASSERT(memcmp(all, other, sizeof(all)) != 0);
    one.seed = 43;
    CU_ASSERT_EQUAL_FATAL(fsdp_tokens_batch(t, &one, 7, other, part), FSDP_OK);
    CU_ASSERT(memcmp(all, other, sizeof(all)) != 0);
    for (int world = 2; world <= 8; world *= 2) {
        int rows = B / world;
        for (int rank = 0; rank < world; rank++) {
            fsdp_batch_spec_t spec = {B, T, rank, world, 42};
            CU_ASSERT_EQUAL_FATAL(fsdp_tokens_batch(t, &spec, 7, part, partt), FSDP_OK);
            CU_ASSERT(memcmp(part, all + rank * rows * T, sizeof(int32_t) * rows * T) == 0);
            CU_ASSERT(memcmp(partt, allt + rank * rows * T, sizeof(int32_t) * rows * T) == 0);
        }
    }
    for (int b = 0; b < B; b++) { /* a window: targets are the inputs shifted by one */
        for (int j = 0; j + 1 < T; j++)
            CU_ASSERT_EQUAL(allt[b * T + j], all[b * T + j + 1]);
    }
    fsdp_tokens_close(t);

    /* an empty file is refused */
    f = fopen(path, "wb");
    fclose(f);
    fsdp_log_set_level(FSDP_LOG_OFF);
    CU_ASSERT_EQUAL(fsdp_tokens_open_text(path, SIZE_MAX, &t), FSDP_ERR_INVALID_PARAM);
    tmp_path(path, sizeof(path), "none.txt");
    CU_ASSERT_EQUAL(fsdp_tokens_open_text(path, SIZE_MAX, &t), FSDP_ERR_IO);
    fsdp_log_set_level(FSDP_LOG_ERROR);
}

/* several text files, as one source in the order given, under the caller's label */
static void test_texts(void)
{
    char a[256], b[256], none[256];
    const char *paths[3];
    fsdp_tokens_t *t = NULL;
    FILE *f;

    tmp_path(a, sizeof(a), "a.txt");
    tmp_path(b, sizeof(b), "b.txt");
    tmp_path(none, sizeof(none), "none.txt");
    f = fopen(a, "wb");
    fputs("abc", f);
    fclose(f);
    f = fopen(b, "wb");
    fputs("de", f);
    fclose(f);
    paths[0] = b;
    paths[1] = a;
    paths[2] = b;
    CU_ASSERT_EQUAL_FATAL(fsdp_tokens_open_texts(paths, 3, "three files", SIZE_MAX, &t), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_tokens_count(t), 7);
    for (size_t i = 0; i < 7; i++)
        CU_ASSERT_EQUAL(fsdp_tokens_at(t, i), (uint32_t) "deabcde"[i]);
    CU_ASSERT_STRING_EQUAL(fsdp_tokens_source(t), "three files");
    CU_ASSERT_EQUAL(fsdp_tokens_order(t), FSDP_TOKENS_RANDOM);
    CU_ASSERT_EQUAL(fsdp_tokens_max_id(t), (uint32_t)'e');
    fsdp_tokens_close(t);

    fsdp_log_set_level(FSDP_LOG_OFF);
    CU_ASSERT_EQUAL(fsdp_tokens_open_texts(paths, 0, "nothing", SIZE_MAX, &t),
                    FSDP_ERR_INVALID_PARAM);
    paths[1] = none;
    CU_ASSERT_EQUAL(fsdp_tokens_open_texts(paths, 2, "a missing file", SIZE_MAX, &t), FSDP_ERR_IO);
    fsdp_log_set_level(FSDP_LOG_ERROR);
    remove(a);
    remove(b);
}

/* Only regular files are read, and no more than max_bytes: a FIFO (which would block), a device
 * (/dev/zero never ends) and a directory are refused at once; a file past the bound by its size,
 * before it is read. */
static void test_files_only(void)
{
    char fifo[256], a[256], b[256], shard[256];
    const char *paths[2];
    fsdp_tokens_t *t = NULL;
    FILE *f;

    tmp_path(fifo, sizeof(fifo), "fifo.txt");
    tmp_path(a, sizeof(a), "a100.txt");
    tmp_path(b, sizeof(b), "b60.txt");
    tmp_path(shard, sizeof(shard), "bound.bin");
    CU_ASSERT_FATAL(mkfifo(fifo, 0600) == 0);
    f = fopen(a, "wb");
    for (int i = 0; i < 100; i++)
        fputc('a' + i % 26, f);
    fclose(f);
    f = fopen(b, "wb");
    for (int i = 0; i < 60; i++)
        fputc('b', f);
    fclose(f);
    fsdp_log_set_level(FSDP_LOG_OFF);
    alarm(10); /* a blocking open would hang: fail instead */
    CU_ASSERT_EQUAL(fsdp_tokens_open_text(fifo, SIZE_MAX, &t), FSDP_ERR_INVALID_PARAM);
    alarm(0);
    CU_ASSERT_EQUAL(fsdp_tokens_open_text("/dev/null", SIZE_MAX, &t), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT_EQUAL(fsdp_tokens_open_text(tmpdir, SIZE_MAX, &t), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT_EQUAL(fsdp_tokens_open_text(a, 99, &t), FSDP_ERR_NO_MEMORY);
    paths[0] = a;
    paths[1] = b;
    CU_ASSERT_EQUAL(fsdp_tokens_open_texts(paths, 2, "both", 159, &t), FSDP_ERR_NO_MEMORY);
    write_shard(shard, 20240520, 1, 100, 100, 0);
    CU_ASSERT_EQUAL(fsdp_tokens_open_llmc(shard, 1024 + 199, &t), FSDP_ERR_NO_MEMORY);
    fsdp_log_set_level(FSDP_LOG_ERROR);
    CU_ASSERT_PTR_NULL(t);

    /* exactly the bound is read */
    CU_ASSERT_EQUAL_FATAL(fsdp_tokens_open_text(a, 100, &t), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_tokens_count(t), 100);
    fsdp_tokens_close(t);
    CU_ASSERT_EQUAL_FATAL(fsdp_tokens_open_texts(paths, 2, "both", 160, &t), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_tokens_count(t), 160);
    CU_ASSERT_EQUAL(fsdp_tokens_at(t, 159), (uint32_t)'b');
    fsdp_tokens_close(t);
    CU_ASSERT_EQUAL_FATAL(fsdp_tokens_open_llmc(shard, 1024 + 200, &t), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_tokens_count(t), 100);
    fsdp_tokens_close(t);
    remove(fifo);
    remove(a);
    remove(b);
    remove(shard);
}

/* the default corpus is the project's own sources, found from the build */
static void test_default_corpus(void)
{
    fsdp_tokens_t *t = NULL, *u = NULL;

    CU_ASSERT_EQUAL_FATAL(corpus_open_default(NULL, &t), FSDP_OK);
    CU_ASSERT(fsdp_tokens_count(t) > 100000);
    CU_ASSERT(fsdp_tokens_max_id(t) < 256);
    CU_ASSERT(strstr(fsdp_tokens_source(t), "libfsdp sources") != NULL);
    /* from argv[0] too: the tests run in tests/, below the tree */
    CU_ASSERT_EQUAL_FATAL(corpus_open_default("./test_data", &u), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_tokens_count(t), fsdp_tokens_count(u));
    fsdp_tokens_close(t);
    fsdp_tokens_close(u);
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"llm.c header: magic, version, count and size checked", test_llmc_header},
        {"llm.c's uint32 shards (Llama 3): tokens and batches", test_llmc_uint32},
        {"llm.c windows: i*B*T, wrapping before the end", test_llmc_windows},
        {"llm.c rows: each rank its slice, inputs and shifted targets", test_llmc_ranks},
        {"seeded sampler: deterministic, one global batch split across ranks", test_random_sampler},
        {"text files concatenated under a label", test_texts},
        {"only regular files, within max_bytes: FIFO, device, directory, too large refused",
         test_files_only},
        {"default corpus found and read", test_default_corpus},
        {NULL, NULL},
    };
    int rc;
    char cmd[64];

    if (mkdtemp(tmpdir) == NULL)
        return 99;
    rc = fsdp_test_run("data", tests);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    if (system(cmd) != 0 && rc == 0)
        rc = 99;
    return rc;
}
