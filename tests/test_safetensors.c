/* safetensors reader and writer: round trips, the writer's layout, one test per rule the strict
 * reader enforces (docs/formats.md section 1), I/O errors and the atomic write. */
#include <fsdp/fsdp.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/io_hidden.h"
#include "test_util.h"

#define LABEL "bad.safetensors"

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                    */

static int log_count;
static char log_last[1024];

static void capture_log(fsdp_log_level_t level, const char *file, int line, const char *func,
                        const char *msg, void *arg)
{
    if (level != FSDP_LOG_ERROR)
        return;
    log_count++;
    snprintf(log_last, sizeof(log_last), "%s", msg);
}

static void log_reset(void)
{
    log_count = 0;
    log_last[0] = '\0';
}

/* One error line was logged, it names `label` first and contains `needle` (if any). */
static int logged_once(const char *label, const char *needle)
{
    size_t n = strlen(label);
    int ok = log_count == 1 && strncmp(log_last, label, n) == 0 && log_last[n] == ':' &&
             (needle == NULL || strstr(log_last, needle) != NULL);
    if (!ok)
        fprintf(stderr, "\n    expected one error naming '%s' with '%s'; got %d, last: %s\n", label,
                needle != NULL ? needle : "", log_count, log_last);
    return ok;
}

/* A file image: N as given, `hlen` header bytes, then `data_len` bytes 0x5a. */
static unsigned char *image_raw(uint64_t n, const char *hdr, size_t hlen, size_t data_len,
                                size_t *len_p)
{
    unsigned char *buf = malloc(8 + hlen + data_len + 1);
    if (buf == NULL)
        abort();
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(n >> (8 * i));
    memcpy(buf + 8, hdr, hlen);
    memset(buf + 8 + hlen, 0x5a, data_len);
    *len_p = 8 + hlen + data_len;
    return buf;
}

static unsigned char *image(const char *hdr, size_t data_len, size_t *len_p)
{
    return image_raw(strlen(hdr), hdr, strlen(hdr), data_len, len_p);
}

static int expect_format_buf(const void *buf, size_t len, const char *needle)
{
    fsdp_st_file_t *file = NULL;
    fsdp_status_t status;

    log_reset();
    status = fsdp_st_open_buffer(buf, len, LABEL, &file);
    if (status != FSDP_ERR_FORMAT || file != NULL) {
        fprintf(stderr, "\n    expected FSDP_ERR_FORMAT, got %s\n", fsdp_status_name(status));
        fsdp_st_close(file);
        return 0;
    }
    return logged_once(LABEL, needle);
}

/* The header `hdr` (N = its length) followed by `data_len` bytes is rejected as malformed. */
static int expect_format(const char *hdr, size_t data_len, const char *needle)
{
    size_t len;
    unsigned char *buf = image(hdr, data_len, &len);
    int ok = expect_format_buf(buf, len, needle);
    if (!ok)
        fprintf(stderr, "    header: %s\n", hdr);
    free(buf);
    return ok;
}

static char *make_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    char tmpl[PATH_MAX];
    snprintf(tmpl, sizeof(tmpl), "%s/fsdp_st_XXXXXX", base != NULL ? base : "/tmp");
    if (mkdtemp(tmpl) == NULL) {
        perror("mkdtemp");
        abort();
    }
    return strdup(tmpl);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path);
}

static void remove_tmpdir(char *dir)
{
    chmod(dir, 0700);
    nftw(dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
    free(dir);
}

/* Names in `dir` (without . and ..), as "a,b," in readdir order; and whether one is a temp. */
static int dir_entries(const char *dir, int *has_tmp_p)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;

    *has_tmp_p = 0;
    if (d == NULL)
        return -1;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        n++;
        if (strstr(de->d_name, ".tmp.") != NULL)
            *has_tmp_p = 1;
    }
    closedir(d);
    return n;
}

static unsigned char *read_all(const char *path, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf;
    long len;

    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)len + 1);
    if (buf == NULL || fread(buf, 1, (size_t)len, f) != (size_t)len)
        abort();
    fclose(f);
    *len_p = (size_t)len;
    return buf;
}

static void write_bytes(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(buf, 1, len, f) != len || fclose(f) != 0)
        abort();
}

/* ------------------------------------------------------------------------------------------ */
/* Dtypes, round trips and the writer's layout                                                */

/* fsdp_st_check_finite: NaN and Inf refused in every floating dtype, integers not looked at */
static void test_check_finite(void)
{
    float f32[3] = {1.0f, 2.0f, 3.0f};
    double f64[2] = {0.5, 1e300};
    uint16_t half[2] = {0x3c00, 0x3c00}; /* 1.0 in F16 */
    int32_t ints[2] = {-1, 0x7fc00000};
    fsdp_st_tensor_t t = {.name = "w", .dtype = "F32", .ndim = 1, .numel = 3, .data = f32};

    CU_ASSERT_EQUAL(fsdp_st_check_finite(&t, "x"), FSDP_OK);
    fsdp_log_set_level(FSDP_LOG_OFF);
    f32[2] = NAN;
    CU_ASSERT_EQUAL(fsdp_st_check_finite(&t, "x"), FSDP_ERR_FORMAT);
    f32[2] = -INFINITY;
    CU_ASSERT_EQUAL(fsdp_st_check_finite(&t, "x"), FSDP_ERR_FORMAT);
    t = (fsdp_st_tensor_t){.name = "d", .dtype = "F64", .numel = 2, .data = f64};
    CU_ASSERT_EQUAL(fsdp_st_check_finite(&t, "x"), FSDP_OK);
    f64[1] = INFINITY;
    CU_ASSERT_EQUAL(fsdp_st_check_finite(&t, "x"), FSDP_ERR_FORMAT);
    t = (fsdp_st_tensor_t){.name = "h", .dtype = "F16", .numel = 2, .data = half};
    CU_ASSERT_EQUAL(fsdp_st_check_finite(&t, "x"), FSDP_OK);
    half[1] = 0x7c00; /* F16 Inf */
    CU_ASSERT_EQUAL(fsdp_st_check_finite(&t, "x"), FSDP_ERR_FORMAT);
    t.dtype = "BF16";
    half[1] = 0x7fc0; /* BF16 NaN */
    CU_ASSERT_EQUAL(fsdp_st_check_finite(&t, "x"), FSDP_ERR_FORMAT);
    t = (fsdp_st_tensor_t){.name = "i", .dtype = "I32", .numel = 2, .data = ints};
    CU_ASSERT_EQUAL(fsdp_st_check_finite(&t, "x"), FSDP_OK);
    fsdp_log_set_level(FSDP_LOG_WARN);
}

static void test_dtype_bits(void)
{
    static const struct {
        const char *name;
        unsigned bits;
    } all[] = {
        {"BOOL", 8},        {"F4", 4},      {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"U8", 8},
        {"I8", 8},          {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8},
        {"F8_E5M2FNUZ", 8}, {"I16", 16},    {"U16", 16},    {"F16", 16},    {"BF16", 16},
        {"I32", 32},        {"U32", 32},    {"F32", 32},    {"C64", 64},    {"F64", 64},
        {"I64", 64},        {"U64", 64},
    };
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        CU_ASSERT_EQUAL(fsdp_st_dtype_bits(all[i].name), all[i].bits);
    CU_ASSERT_EQUAL(fsdp_st_dtype_bits("f32"), 0);
    CU_ASSERT_EQUAL(fsdp_st_dtype_bits("F128"), 0);
    CU_ASSERT_EQUAL(fsdp_st_dtype_bits(""), 0);
    CU_ASSERT_EQUAL(fsdp_st_dtype_bits(NULL), 0);
}

static void test_round_trip(void)
{
    static const float w[6] = {1, -2, 3.5f, 0, 1e-3f, -7};
    static const uint16_t bias[3] = {0x3f80, 0xbf80, 0x4000}; /* bf16 1, -1, 2 */
    static const uint16_t half[4] = {0x3c00, 0x4000, 0xc000, 0x7bff};
    static const int64_t ids[4] = {0, -1, INT64_MAX, INT64_MIN};
    static const float scale = 0.125f;
    static const uint8_t flags[3] = {1, 0, 1};
    static const int64_t s_w[] = {2, 3}, s_bias[] = {3}, s_half[] = {2, 2}, s_ids[] = {4},
                         s_empty[] = {0, 4}, s_flags[] = {3};
    const fsdp_st_entry_t entries[] = {
        {"layer.weight", "F32", 2, s_w, w}, {"layer.bias", "BF16", 1, s_bias, bias},
        {"half", "F16", 2, s_half, half},   {"ids", "I64", 1, s_ids, ids},
        {"scale", "F32", 0, NULL, &scale},  {"empty", "F32", 2, s_empty, NULL},
        {"flags", "U8", 1, s_flags, flags},
    };
    const int n = (int)(sizeof(entries) / sizeof(entries[0]));
    const char *meta[] = {"format", "pt", "step", "42"};
    char *dir = make_tmpdir(), path[PATH_MAX];
    const fsdp_st_tensor_t *t, *prev = NULL;
    fsdp_st_file_t *file = NULL;
    int has_tmp;

    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    CU_ASSERT_EQUAL_FATAL(fsdp_st_write(path, entries, n, meta, 2), FSDP_OK);
    CU_ASSERT_EQUAL(dir_entries(dir, &has_tmp), 1);
    CU_ASSERT_FALSE(has_tmp);
    CU_ASSERT_EQUAL_FATAL(fsdp_st_open(path, &file), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_st_num_tensors(file), n);

    for (int i = 0; i < n; i++) {
        const fsdp_st_entry_t *e = &entries[i];
        unsigned bits = fsdp_st_dtype_bits(e->dtype);
        uint64_t numel = 1;

        t = fsdp_st_find(file, e->name);
        CU_ASSERT_PTR_NOT_NULL_FATAL(t);
        CU_ASSERT_STRING_EQUAL(t->name, e->name);
        CU_ASSERT_STRING_EQUAL(t->dtype, e->dtype);
        CU_ASSERT_EQUAL(t->ndim, e->ndim);
        for (int d = 0; d < e->ndim; d++) {
            CU_ASSERT_EQUAL(t->shape[d], e->shape[d]);
            numel *= (uint64_t)e->shape[d];
        }
        CU_ASSERT_EQUAL(t->numel, numel);
        CU_ASSERT_EQUAL(t->nbytes, numel * bits / 8);
        if (t->nbytes > 0)
            CU_ASSERT_EQUAL(memcmp(t->data, e->data, t->nbytes), 0);
        /* the writer's order and 8-byte header keep every tensor aligned in the mapping */
        CU_ASSERT_EQUAL((uintptr_t)t->data % (bits / 8), 0);
    }
    CU_ASSERT_EQUAL(fsdp_st_find(file, "scale")->ndim, 0);
    CU_ASSERT_EQUAL(fsdp_st_find(file, "scale")->numel, 1);
    CU_ASSERT_EQUAL(fsdp_st_find(file, "empty")->nbytes, 0);

    /* offset order: each tensor starts where the previous ended */
    for (int i = 0; i < n; i++) {
        t = fsdp_st_tensor_at(file, i);
        CU_ASSERT_PTR_NOT_NULL_FATAL(t);
        if (prev != NULL)
            CU_ASSERT_PTR_EQUAL(t->data, (const char *)prev->data + prev->nbytes);
        prev = t;
    }
    CU_ASSERT_PTR_NULL(fsdp_st_tensor_at(file, -1));
    CU_ASSERT_PTR_NULL(fsdp_st_tensor_at(file, n));
    CU_ASSERT_PTR_NULL(fsdp_st_find(file, "missing"));
    CU_ASSERT_PTR_NULL(fsdp_st_find(file, NULL));
    CU_ASSERT_STRING_EQUAL(fsdp_st_metadata(file, "format"), "pt");
    CU_ASSERT_STRING_EQUAL(fsdp_st_metadata(file, "step"), "42");
    CU_ASSERT_PTR_NULL(fsdp_st_metadata(file, "missing"));
    fsdp_st_close(file);

    /* no tensors, no metadata */
    CU_ASSERT_EQUAL_FATAL(fsdp_st_write(path, NULL, 0, NULL, 0), FSDP_OK);
    CU_ASSERT_EQUAL_FATAL(fsdp_st_open(path, &file), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_st_num_tensors(file), 0);
    CU_ASSERT_PTR_NULL(fsdp_st_find(file, "layer.weight"));
    CU_ASSERT_PTR_NULL(fsdp_st_metadata(file, "format"));
    fsdp_st_close(file);

    /* NULL handles */
    fsdp_st_close(NULL);
    CU_ASSERT_EQUAL(fsdp_st_num_tensors(NULL), 0);
    CU_ASSERT_PTR_NULL(fsdp_st_tensor_at(NULL, 0));
    CU_ASSERT_PTR_NULL(fsdp_st_find(NULL, "x"));
    CU_ASSERT_PTR_NULL(fsdp_st_metadata(NULL, "x"));
    remove_tmpdir(dir);
}

static void test_writer_layout(void)
{
    static const float b[1] = {1.0f}, a2[2] = {2.0f, 3.0f};
    static const uint16_t a[2] = {0x1122, 0x3344};
    static const int64_t c = 0x0102030405060708;
    static const uint8_t d[3] = {0xd1, 0xd2, 0xd3}, f4[2] = {0x21, 0x43};
    static const int64_t s1[] = {1}, s2[] = {2}, s3[] = {3}, s4[] = {4};
    /* given out of order: the writer sorts by descending alignment, then by name */
    const fsdp_st_entry_t entries[] = {
        {"b", "F32", 1, s1, b},    {"a", "BF16", 1, s2, a},  {"d", "U8", 1, s3, d},
        {"c", "I64", 0, NULL, &c}, {"a2", "F32", 1, s2, a2}, {"e", "F4", 1, s4, f4},
    };
    const fsdp_st_entry_t one = {"x", "U8", 1, s1, d};
    const char *meta[] = {"format", "pt"};
    const char *expect = "{\"__metadata__\":{\"format\":\"pt\"},"
                         "\"c\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},"
                         "\"a2\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
                         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[16,20]},"
                         "\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[20,24]},"
                         "\"d\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[24,27]},"
                         "\"e\":{\"dtype\":\"F4\",\"shape\":[4],\"data_offsets\":[27,29]}}";
    const char *expect_nometa = "{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
    char *dir = make_tmpdir(), path[PATH_MAX];
    size_t len, elen = strlen(expect), n;
    unsigned char *buf, *data;

    snprintf(path, sizeof(path), "%s/layout.safetensors", dir);
    CU_ASSERT_EQUAL_FATAL(fsdp_st_write(path, entries, 6, meta, 1), FSDP_OK);
    buf = read_all(path, &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(buf);
    n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | buf[i];
    CU_ASSERT_EQUAL(n % 8, 0);
    CU_ASSERT_EQUAL(n, (elen + 7) / 8 * 8);
    CU_ASSERT_EQUAL(len, 8 + n + 29);
    CU_ASSERT_EQUAL(memcmp(buf + 8, expect, elen), 0);
    for (size_t i = elen; i < n; i++)
        CU_ASSERT_EQUAL(buf[8 + i], ' ');
    data = buf + 8 + n;
    CU_ASSERT_EQUAL(memcmp(data + 0, &c, 8), 0);
    CU_ASSERT_EQUAL(memcmp(data + 8, a2, 8), 0);
    CU_ASSERT_EQUAL(memcmp(data + 16, b, 4), 0);
    CU_ASSERT_EQUAL(memcmp(data + 20, a, 4), 0);
    CU_ASSERT_EQUAL(memcmp(data + 24, d, 3), 0);
    CU_ASSERT_EQUAL(memcmp(data + 27, f4, 2), 0);
    free(buf);

    /* without metadata there is no __metadata__ key; 53 header bytes pad to 56 */
    CU_ASSERT_EQUAL_FATAL(fsdp_st_write(path, &one, 1, NULL, 0), FSDP_OK);
    buf = read_all(path, &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(buf);
    CU_ASSERT_EQUAL(strlen(expect_nometa), 53);
    CU_ASSERT_EQUAL(buf[0], 56);
    CU_ASSERT_EQUAL(memcmp(buf + 8, expect_nometa, 53), 0);
    CU_ASSERT_EQUAL(memcmp(buf + 8 + 53, "   ", 3), 0);
    CU_ASSERT_EQUAL(len, 8 + 56 + 1);
    free(buf);
    remove_tmpdir(dir);
}

/* What a strict reader must still accept. */
static void test_accept_edge_cases(void)
{
    fsdp_st_file_t *file = NULL;
    const fsdp_st_tensor_t *t;
    unsigned char *buf;
    size_t len;
    const char *hdr;

    /* empty header, unpadded (N = 2) */
    buf = image("{}", 0, &len);
    CU_ASSERT_EQUAL(fsdp_st_open_buffer(buf, len, "x", &file), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_st_num_tensors(file), 0);
    fsdp_st_close(file);
    free(buf);

    /* metadata only, space padding, JSON whitespace inside */
    buf = image("{ \"__metadata__\" : { \"format\" : \"pt\", \"\xc3\xa9t\xc3\xa9\": \"\" } }    ",
                0, &len);
    CU_ASSERT_EQUAL_FATAL(fsdp_st_open_buffer(buf, len, "x", &file), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_st_num_tensors(file), 0);
    CU_ASSERT_STRING_EQUAL(fsdp_st_metadata(file, "format"), "pt");
    CU_ASSERT_STRING_EQUAL(fsdp_st_metadata(file, "\xc3\xa9t\xc3\xa9"), "");
    fsdp_st_close(file);
    free(buf);

    /* any key and field order; zero-sized tensors at the start and the end; a scalar; sub-byte
     * dtypes that fill whole bytes; 8 dimensions; an unaligned header length (N = 443) */
    hdr = "{\"z\":{\"data_offsets\":[0,4],\"shape\":[],\"dtype\":\"F32\"},"
          "\"tail\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[15,15]},"
          "\"head\":{\"dtype\":\"F64\",\"shape\":[3,0],\"data_offsets\":[0,0]},"
          "\"f4\":{\"dtype\":\"F4\",\"shape\":[4],\"data_offsets\":[4,6]},"
          "\"f6\":{\"dtype\":\"F6_E2M3\",\"shape\":[2,2],\"data_offsets\":[6,9]},"
          "\"b\":{\"dtype\":\"BOOL\",\"shape\":[1,1,1,1,1,1,1,2],\"data_offsets\":[9,11]},"
          "\"\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[11,15]}}";
    buf = image(hdr, 15, &len);
    CU_ASSERT_EQUAL_FATAL(fsdp_st_open_buffer(buf, len, "x", &file), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_st_num_tensors(file), 7);
    {
        static const char *const order[] = {"head", "z", "f4", "f6", "b", "", "tail"};
        static const uint64_t begin[] = {0, 0, 4, 6, 9, 11, 15};
        for (int i = 0; i < 7; i++) {
            t = fsdp_st_tensor_at(file, i);
            CU_ASSERT_STRING_EQUAL(t->name, order[i]);
            CU_ASSERT_PTR_EQUAL(t->data, buf + 8 + strlen(hdr) + begin[i]);
            CU_ASSERT_PTR_EQUAL(fsdp_st_find(file, order[i]), t);
        }
    }
    t = fsdp_st_find(file, "z");
    CU_ASSERT(t->ndim == 0 && t->numel == 1 && t->nbytes == 4);
    t = fsdp_st_find(file, "f6");
    CU_ASSERT(t->numel == 4 && t->nbytes == 3);
    t = fsdp_st_find(file, "b");
    CU_ASSERT(t->ndim == 8 && t->shape[7] == 2 && t->nbytes == 2);
    t = fsdp_st_find(file, "head");
    CU_ASSERT(t->ndim == 2 && t->numel == 0 && t->nbytes == 0);
    fsdp_st_close(file);
    free(buf);

    /* a NULL label still works */
    buf = image("{}", 0, &len);
    CU_ASSERT_EQUAL(fsdp_st_open_buffer(buf, len, NULL, &file), FSDP_OK);
    fsdp_st_close(file);
    free(buf);
}

/* ------------------------------------------------------------------------------------------ */
/* One test per rule of the strict reader                                                     */

static void test_reject_short_file(void)
{
    static const unsigned char seven[7] = {2};
    CU_ASSERT(expect_format_buf(NULL, 0, "file is 0 bytes, shorter than the 8-byte"));
    CU_ASSERT(expect_format_buf(seven, 7, "file is 7 bytes"));
}

static void test_reject_header_too_long(void)
{
    size_t len;
    unsigned char *buf = image_raw(100000001, "{}", 2, 64, &len);
    CU_ASSERT(expect_format_buf(buf, len, "header length 100000001 exceeds the limit"));
    free(buf);
    buf = image_raw(UINT64_MAX, "{}", 2, 0, &len);
    CU_ASSERT(expect_format_buf(buf, len, "header length 18446744073709551615 exceeds"));
    free(buf);
    /* the limit itself is allowed; this one then fails only for lack of bytes */
    buf = image_raw(100000000, "{}", 2, 0, &len);
    CU_ASSERT(expect_format_buf(buf, len, "runs past the end"));
    free(buf);
}

static void test_reject_header_past_end(void)
{
    size_t len;
    unsigned char *buf = image_raw(11, "{}        ", 10, 0, &len);
    CU_ASSERT(
        expect_format_buf(buf, len, "header length 11 runs past the end of the 18-byte file"));
    free(buf);
}

static void test_reject_not_brace(void)
{
    CU_ASSERT(expect_format(" {}", 0, "does not begin with '{'"));
    CU_ASSERT(expect_format("\n{}", 0, "does not begin with '{'"));
    CU_ASSERT(expect_format("[]", 0, "does not begin with '{'"));
    CU_ASSERT(expect_format("", 0, "does not begin with '{'"));
    CU_ASSERT(expect_format("        ", 0, "does not begin with '{'"));
    CU_ASSERT(expect_format("\xef\xbb\xbf{}", 0, "does not begin with '{'")); /* a BOM */
}

static void test_reject_invalid_json(void)
{
    CU_ASSERT(expect_format("{\"a\":", 0, "not valid UTF-8 JSON"));
    CU_ASSERT(expect_format("{'a':1}", 0, "not valid UTF-8 JSON"));
    CU_ASSERT(expect_format("{} x", 0, "not valid UTF-8 JSON"));
    CU_ASSERT(expect_format("{}}", 0, "not valid UTF-8 JSON"));
    CU_ASSERT(expect_format("{\"a\":1,}", 0, "not valid UTF-8 JSON"));
    /* only spaces may pad the header, not other JSON whitespace */
    CU_ASSERT(expect_format("{}\n", 0, "other than space padding"));
    CU_ASSERT(expect_format("{}\t  ", 0, "other than space padding"));
    /* a NUL inside the header */
    {
        size_t len;
        unsigned char *buf = image_raw(4, "{}\0 ", 4, 0, &len);
        CU_ASSERT(expect_format_buf(buf, len, "not valid UTF-8 JSON"));
        free(buf);
    }
}

static void test_reject_invalid_utf8(void)
{
    const char *tail = ":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}";
    static const char *const names[] = {
        "\xff",             /* never valid */
        "\xc0\xaf",         /* overlong '/' */
        "\xed\xa0\x80",     /* UTF-16 surrogate */
        "a\xe2\x82",        /* truncated sequence */
        "\xf4\x90\x80\x80", /* past U+10FFFF */
    };
    char hdr[256];
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        snprintf(hdr, sizeof(hdr), "{\"%s\"%s", names[i], tail);
        CU_ASSERT(expect_format(hdr, 0, "not valid UTF-8 JSON"));
    }
    CU_ASSERT(expect_format("{\"__metadata__\":{\"k\":\"\xc3\"}}", 0, "not valid UTF-8 JSON"));
    CU_ASSERT(expect_format("{\"__metadata__\":{\"k\":\"\\ud800\"}}", 0, "not valid UTF-8 JSON"));
}

static void test_reject_duplicate_key(void)
{
    CU_ASSERT(expect_format("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                            "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                            2, "duplicate"));
    CU_ASSERT(expect_format("{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],"
                            "\"data_offsets\":[0,1]}}",
                            1, "duplicate"));
    CU_ASSERT(expect_format("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, "duplicate"));
    CU_ASSERT(expect_format("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "duplicate"));
}

static void test_reject_metadata_not_strings(void)
{
    CU_ASSERT(expect_format("{\"__metadata__\":{\"format\":\"pt\",\"step\":1}}", 0,
                            "__metadata__ value of key 'step' is not a string"));
    CU_ASSERT(expect_format("{\"__metadata__\":{\"k\":null}}", 0, "key 'k' is not a string"));
    CU_ASSERT(expect_format("{\"__metadata__\":{\"k\":true}}", 0, "key 'k' is not a string"));
    CU_ASSERT(expect_format("{\"__metadata__\":{\"k\":{\"x\":\"y\"}}}", 0, "not a string"));
    CU_ASSERT(expect_format("{\"__metadata__\":{\"k\":[\"x\"]}}", 0, "not a string"));
    CU_ASSERT(expect_format("{\"__metadata__\":[\"x\"]}", 0, "__metadata__ is not an object"));
    CU_ASSERT(expect_format("{\"__metadata__\":\"pt\"}", 0, "__metadata__ is not an object"));
}

static void test_reject_unknown_dtype(void)
{
    CU_ASSERT(expect_format("{\"w\":{\"dtype\":\"F128\",\"shape\":[1],\"data_offsets\":[0,16]}}",
                            16, "tensor 'w' has unknown dtype 'F128'"));
    CU_ASSERT(expect_format("{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                            "unknown dtype 'f32'"));
    CU_ASSERT(expect_format("{\"w\":{\"dtype\":\"\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                            "unknown dtype ''"));
    CU_ASSERT(expect_format("{\"w\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                            "tensor 'w' has a dtype that is not a string"));
}

static void test_reject_bad_shape(void)
{
    static const struct {
        const char *shape, *needle;
    } cases[] = {
        {"[-1]", "shape[0] is not a non-negative integer"},
        {"[2,-3]", "shape[1] is not a non-negative integer"},
        {"[2.0]", "shape[0] is not a non-negative integer"},
        {"[1.5]", "shape[0] is not a non-negative integer"},
        {"[1e0]", "shape[0] is not a non-negative integer"},
        {"[\"2\"]", "shape[0] is not a non-negative integer"},
        {"[null]", "shape[0] is not a non-negative integer"},
        {"[[2]]", "shape[0] is not a non-negative integer"},
        {"2", "shape is not an array"},
        {"null", "shape is not an array"},
        {"[1,1,1,1,1,1,1,1,1]", "shape has 9 dimensions, more than the 8 supported"},
    };
    char hdr[256];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(hdr, sizeof(hdr),
                 "{\"t\":{\"dtype\":\"F32\",\"shape\":%s,\"data_offsets\":[0,4]}}", cases[i].shape);
        CU_ASSERT(expect_format(hdr, 4, cases[i].needle));
    }
}

static void test_reject_bad_data_offsets(void)
{
    static const char *const offs[] = {
        "[0]", "[0,4,8]", "[-4,0]", "[0,4.0]", "[0,\"4\"]", "\"0,4\"", "{}", "null", "[]",
    };
    char hdr[256];
    for (size_t i = 0; i < sizeof(offs) / sizeof(offs[0]); i++) {
        snprintf(hdr, sizeof(hdr), "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":%s}}",
                 offs[i]);
        CU_ASSERT(expect_format(hdr, 4, "tensor 't' data_offsets is not [BEGIN, END]"));
    }
}

static void test_reject_offsets_not_at_zero(void)
{
    CU_ASSERT(expect_format("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
                            "tensor 'a' data_offsets [4, 8] come first but do not begin at 0"));
}

static void test_reject_hole(void)
{
    CU_ASSERT(expect_format("{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]},"
                            "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                            12,
                            "tensor 'b' data_offsets [8, 12] leave a hole after tensor 'a', "
                            "which ends at 4"));
}

static void test_reject_overlap(void)
{
    CU_ASSERT(expect_format("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                            "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                            12, "tensor 'b' data_offsets [4, 12] overlap tensor 'a'"));
    /* the same bytes claimed twice */
    CU_ASSERT(expect_format("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                            "\"b\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                            4, "tensor 'b' data_offsets [0, 4] overlap tensor 'a'"));
}

static void test_reject_end_before_begin(void)
{
    CU_ASSERT(expect_format("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8,
                            "tensor 'a' data_offsets [8, 4] end before they begin"));
}

static void test_reject_size_mismatch(void)
{
    CU_ASSERT(expect_format("{\"x\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}",
                            12, NULL));
    CU_ASSERT_STRING_EQUAL(log_last, LABEL ": tensor 'x' data_offsets [0, 12] span 12 bytes, "
                                           "shape [2, 2] of F32 needs 16");
    CU_ASSERT(expect_format("{\"s\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[0,0]}}", 0,
                            "span 0 bytes, shape [] of BF16 needs 2"));
    CU_ASSERT(expect_format("{\"e\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[0,4]}}", 4,
                            "span 4 bytes, shape [0, 3] of F32 needs 0"));
    /* sub-byte dtypes must fill whole bytes (MisalignedSlice) */
    CU_ASSERT(expect_format("{\"q\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2,
                            "tensor 'q' shape [3] of F4 is 12 bits, not a whole number of bytes"));
    CU_ASSERT(expect_format("{\"q\":{\"dtype\":\"F6_E3M2\",\"shape\":[],\"data_offsets\":[0,1]}}",
                            1, "is 6 bits, not a whole number of bytes"));
}

static void test_reject_shape_overflow(void)
{
    /* 2^32 * 2^32 elements: the element count overflows */
    CU_ASSERT(expect_format("{\"o\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],"
                            "\"data_offsets\":[0,0]}}",
                            0,
                            "tensor 'o' shape [4294967296, 4294967296] of U8: the element or "
                            "bit count overflows 64 bits"));
    /* 2^61 elements fit, 2^61 * 32 bits do not */
    CU_ASSERT(expect_format("{\"o\":{\"dtype\":\"F32\",\"shape\":[2305843009213693952],"
                            "\"data_offsets\":[0,0]}}",
                            0, "overflows 64 bits"));
    /* a huge product that wraps to a small number must not pass as a small tensor */
    CU_ASSERT(expect_format("{\"o\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,2],"
                            "\"data_offsets\":[0,0]}}",
                            0, "overflows 64 bits"));
    /* beyond what a 64-bit integer holds is already invalid JSON for us */
    CU_ASSERT(expect_format("{\"o\":{\"dtype\":\"U8\",\"shape\":[18446744073709551616],"
                            "\"data_offsets\":[0,0]}}",
                            0, "not valid UTF-8 JSON"));
}

static void test_reject_trailing_bytes(void)
{
    CU_ASSERT(expect_format("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8,
                            "the tensors end at byte 4 of a 8-byte data buffer; the trailing "
                            "bytes are not indexed"));
    CU_ASSERT(expect_format("{}", 1, "not indexed"));
    CU_ASSERT(expect_format("{\"__metadata__\":{\"format\":\"pt\"}}", 3, "not indexed"));
}

static void test_reject_truncated_buffer(void)
{
    CU_ASSERT(expect_format("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 5,
                            "the tensors end at byte 8 but the data buffer holds only 5 bytes"));
}

static void test_reject_extra_field(void)
{
    CU_ASSERT(expect_format("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],"
                            "\"extra\":1}}",
                            4,
                            "tensor 'a' has unknown field 'extra' (allowed: dtype, shape, "
                            "data_offsets)"));
    /* the old README's name for data_offsets */
    CU_ASSERT(expect_format("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"offsets\":[0,4]}}", 4,
                            "unknown field 'offsets'"));
    CU_ASSERT(expect_format("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4,
                            "tensor 'a' lacks field 'shape'"));
    CU_ASSERT(expect_format("{\"a\":{}}", 0, "tensor 'a' lacks field 'dtype'"));
    CU_ASSERT(expect_format("{\"a\":[\"F32\",[1],[0,4]]}", 4, "tensor 'a' is not an object"));
    CU_ASSERT(expect_format("{\"a\":null}", 0, "tensor 'a' is not an object"));
}

/* ------------------------------------------------------------------------------------------ */
/* Files: I/O errors and the atomic write                                                     */

static void test_open_errors(void)
{
    char *dir = make_tmpdir(), path[PATH_MAX], msg[PATH_MAX + 64];
    fsdp_st_file_t *file = NULL;

    snprintf(path, sizeof(path), "%s/missing.safetensors", dir);
    log_reset();
    CU_ASSERT_EQUAL(fsdp_st_open(path, &file), FSDP_ERR_IO);
    CU_ASSERT_PTR_NULL(file);
    snprintf(msg, sizeof(msg), "cannot open: %s", strerror(ENOENT));
    CU_ASSERT(logged_once(path, msg));

    log_reset();
    CU_ASSERT_EQUAL(fsdp_st_open(dir, &file), FSDP_ERR_IO);
    CU_ASSERT_PTR_NULL(file);
    CU_ASSERT(logged_once(dir, "is a directory, not a regular file"));

    snprintf(path, sizeof(path), "%s/fifo.safetensors", dir);
    CU_ASSERT_EQUAL_FATAL(mkfifo(path, 0600), 0);
    log_reset();
    CU_ASSERT_EQUAL(fsdp_st_open(path, &file), FSDP_ERR_IO);
    CU_ASSERT(logged_once(path, "is a FIFO, not a regular file"));

    /* an empty file breaks rule 1 (at least 8 bytes): malformed, not an I/O error */
    snprintf(path, sizeof(path), "%s/empty.safetensors", dir);
    write_bytes(path, "", 0);
    log_reset();
    CU_ASSERT_EQUAL(fsdp_st_open(path, &file), FSDP_ERR_FORMAT);
    CU_ASSERT_PTR_NULL(file);
    CU_ASSERT(logged_once(path, "file is 0 bytes"));

    /* a real file names itself and the tensor */
    {
        size_t len;
        unsigned char *buf =
            image("{\"h.0.w\":{\"dtype\":\"Q8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, &len);
        snprintf(path, sizeof(path), "%s/dtype.safetensors", dir);
        write_bytes(path, buf, len);
        free(buf);
        log_reset();
        CU_ASSERT_EQUAL(fsdp_st_open(path, &file), FSDP_ERR_FORMAT);
        CU_ASSERT(logged_once(path, "tensor 'h.0.w' has unknown dtype 'Q8'"));
    }

    log_reset();
    CU_ASSERT_EQUAL(fsdp_st_open(NULL, &file), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT_EQUAL(fsdp_st_open(path, NULL), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT_EQUAL(fsdp_st_open_buffer(NULL, 8, "x", &file), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT_EQUAL(log_count, 3);
    remove_tmpdir(dir);
}

static void test_open_truncated(void)
{
    static const float v[16] = {1, 2, 3};
    static const int64_t shape[] = {4, 4};
    const fsdp_st_entry_t e = {"w", "F32", 2, shape, v};
    char *dir = make_tmpdir(), path[PATH_MAX];
    fsdp_st_file_t *file = NULL;
    struct stat st;

    snprintf(path, sizeof(path), "%s/t.safetensors", dir);
    CU_ASSERT_EQUAL_FATAL(fsdp_st_write(path, &e, 1, NULL, 0), FSDP_OK);
    CU_ASSERT_EQUAL_FATAL(stat(path, &st), 0);

    CU_ASSERT_EQUAL_FATAL(truncate(path, st.st_size - 3), 0); /* inside the data */
    log_reset();
    CU_ASSERT_EQUAL(fsdp_st_open(path, &file), FSDP_ERR_FORMAT);
    CU_ASSERT_PTR_NULL(file);
    CU_ASSERT(logged_once(path, "the data buffer holds only 61 bytes"));

    CU_ASSERT_EQUAL_FATAL(truncate(path, 20), 0); /* inside the header */
    log_reset();
    CU_ASSERT_EQUAL(fsdp_st_open(path, &file), FSDP_ERR_FORMAT);
    CU_ASSERT(logged_once(path, "runs past the end of the 20-byte file"));

    CU_ASSERT_EQUAL_FATAL(truncate(path, 5), 0); /* inside the length */
    log_reset();
    CU_ASSERT_EQUAL(fsdp_st_open(path, &file), FSDP_ERR_FORMAT);
    CU_ASSERT(logged_once(path, "file is 5 bytes"));
    remove_tmpdir(dir);
}

static void test_writer_invalid_params(void)
{
    static const float v[4] = {0};
    static const int64_t s1[] = {1}, s3[] = {3}, sneg[] = {2, -1},
                         sbig[] = {4294967296, 4294967296};
    static const struct {
        fsdp_st_entry_t e;
        const char *needle;
    } bad[] = {
        {{"", "F32", 1, s1, v}, "has no name"},
        {{NULL, "F32", 1, s1, v}, "has no name"},
        {{"__metadata__", "F32", 1, s1, v}, "reserves for metadata"},
        {{"w\xff", "F32", 1, s1, v}, "not valid UTF-8"},
        {{"w", "F128", 1, s1, v}, "tensor 'w' has dtype 'F128'; allowed: BOOL, F4,"},
        {{"w", "f32", 1, s1, v}, "has dtype 'f32'"},
        {{"w", NULL, 1, s1, v}, "has dtype '(null)'"},
        {{"w", "F32", -1, s1, v}, "has -1 dimensions; 0 to 8 are allowed"},
        {{"w", "F32", 9, s1, v}, "has 9 dimensions"},
        {{"w", "F32", 1, NULL, v}, "has 1 dimensions but no shape"},
        {{"w", "F32", 2, sneg, v}, "negative dimension -1"},
        {{"w", "U8", 2, sbig, v}, "overflows 64 bits"},
        {{"w", "F4", 1, s3, v}, "shape [3] of F4 is not a whole number of bytes"},
        {{"w", "F32", 1, s1, NULL}, "has 4 bytes but no data"},
    };
    const fsdp_st_entry_t good = {"ok", "F32", 1, s1, v};
    const fsdp_st_entry_t dup[] = {{"w", "F32", 1, s1, v}, good, {"w", "U8", 1, s1, v}};
    const char *dup_meta[] = {"k", "1", "j", "2", "k", "3"};
    const char *null_meta[] = {"k", NULL};
    const char *bad_meta[] = {"k", "\xc3("};
    char *dir = make_tmpdir(), path[PATH_MAX];
    int has_tmp;

    snprintf(path, sizeof(path), "%s/w.safetensors", dir);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const fsdp_st_entry_t two[2] = {good, bad[i].e};
        log_reset();
        CU_ASSERT_EQUAL(fsdp_st_write(path, two, 2, NULL, 0), FSDP_ERR_INVALID_PARAM);
        CU_ASSERT(logged_once(path, bad[i].needle));
    }
    log_reset();
    CU_ASSERT_EQUAL(fsdp_st_write(path, dup, 3, NULL, 0), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT(logged_once(path, "two tensors are named 'w'"));
    log_reset();
    CU_ASSERT_EQUAL(fsdp_st_write(path, &good, 1, dup_meta, 3), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT(logged_once(path, "metadata key 'k' appears twice"));
    log_reset();
    CU_ASSERT_EQUAL(fsdp_st_write(path, &good, 1, null_meta, 1), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT(logged_once(path, "metadata value 0 is NULL"));
    log_reset();
    CU_ASSERT_EQUAL(fsdp_st_write(path, &good, 1, bad_meta, 1), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT(logged_once(path, "not UTF-8"));

    log_reset();
    CU_ASSERT_EQUAL(fsdp_st_write(NULL, &good, 1, NULL, 0), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT_EQUAL(fsdp_st_write(path, &good, -1, NULL, 0), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT_EQUAL(fsdp_st_write(path, NULL, 1, NULL, 0), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT_EQUAL(fsdp_st_write(path, &good, 1, NULL, 1), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT_EQUAL(fsdp_st_write(path, &good, 1, dup_meta, -1), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT_EQUAL(log_count, 5);

    /* nothing was created, not even a temporary file */
    CU_ASSERT_EQUAL(dir_entries(dir, &has_tmp), 0);
    remove_tmpdir(dir);
}

/* A failed write leaves the previous file byte for byte and no temporary file behind. */
static void test_atomic_write(void)
{
    static const float v1[4] = {1, 2, 3, 4};
    static const int64_t s4[] = {4}, sbig[] = {1 << 20};
    const fsdp_st_entry_t old = {"w", "F32", 1, s4, v1};
    const char *meta[] = {"version", "1"};
    char *dir = make_tmpdir(), path[PATH_MAX], sub[PATH_MAX];
    unsigned char *before, *after;
    size_t before_len, after_len;
    fsdp_st_file_t *file = NULL;
    struct rlimit saved, lim;
    void (*saved_sig)(int);
    float *big;
    int has_tmp;

    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    CU_ASSERT_EQUAL_FATAL(fsdp_st_write(path, &old, 1, meta, 1), FSDP_OK);
    before = read_all(path, &before_len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(before);

    /* 1. an invalid entry: rejected before any file is touched */
    {
        const fsdp_st_entry_t bad[2] = {old, {"x", "F99", 1, s4, v1}};
        log_reset();
        CU_ASSERT_EQUAL(fsdp_st_write(path, bad, 2, NULL, 0), FSDP_ERR_INVALID_PARAM);
        CU_ASSERT(logged_once(path, "has dtype 'F99'"));
    }
    after = read_all(path, &after_len);
    CU_ASSERT(after_len == before_len && memcmp(before, after, before_len) == 0);
    free(after);
    CU_ASSERT_EQUAL(dir_entries(dir, &has_tmp), 1);
    CU_ASSERT_FALSE(has_tmp);

    /* 2. the write itself fails half way: a 4 MiB tensor under a 256 KiB file-size limit */
    big = calloc(1 << 20, sizeof(float));
    CU_ASSERT_PTR_NOT_NULL_FATAL(big);
    CU_ASSERT_EQUAL_FATAL(getrlimit(RLIMIT_FSIZE, &saved), 0);
    lim = saved;
    lim.rlim_cur = 256 << 10;
    saved_sig = signal(SIGXFSZ, SIG_IGN);
    CU_ASSERT_EQUAL_FATAL(setrlimit(RLIMIT_FSIZE, &lim), 0);
    log_reset();
    {
        const fsdp_st_entry_t e = {"w", "F32", 1, sbig, big};
        fsdp_status_t status = fsdp_st_write(path, &e, 1, NULL, 0);
        setrlimit(RLIMIT_FSIZE, &saved);
        signal(SIGXFSZ, saved_sig);
        CU_ASSERT_EQUAL(status, FSDP_ERR_IO);
    }
    CU_ASSERT(logged_once(path, strerror(EFBIG)));
    free(big);
    after = read_all(path, &after_len);
    CU_ASSERT(after_len == before_len && memcmp(before, after, before_len) == 0);
    free(after);
    CU_ASSERT_EQUAL(dir_entries(dir, &has_tmp), 1);
    CU_ASSERT_FALSE(has_tmp);

    /* 3. an unwritable directory (root ignores the mode bits, so only as another user) */
    if (geteuid() != 0) {
        CU_ASSERT_EQUAL_FATAL(chmod(dir, 0500), 0);
        log_reset();
        CU_ASSERT_EQUAL(fsdp_st_write(path, &old, 1, NULL, 0), FSDP_ERR_IO);
        CU_ASSERT(logged_once(path, strerror(EACCES)));
        CU_ASSERT_EQUAL(chmod(dir, 0700), 0);
        after = read_all(path, &after_len);
        CU_ASSERT(after_len == before_len && memcmp(before, after, before_len) == 0);
        free(after);
    }

    /* 4. the last step fails: the target is a non-empty directory, rename refuses */
    snprintf(sub, sizeof(sub), "%s/dir.safetensors", dir);
    CU_ASSERT_EQUAL_FATAL(mkdir(sub, 0700), 0);
    {
        char inner[PATH_MAX + 16];
        snprintf(inner, sizeof(inner), "%s/keep", sub);
        write_bytes(inner, "x", 1);
    }
    log_reset();
    CU_ASSERT_EQUAL(fsdp_st_write(sub, &old, 1, NULL, 0), FSDP_ERR_IO);
    CU_ASSERT(logged_once(sub, "cannot rename"));
    CU_ASSERT_EQUAL(dir_entries(dir, &has_tmp), 2);
    CU_ASSERT_FALSE(has_tmp);

    /* 5. no such directory; a parent that is a file */
    snprintf(sub, sizeof(sub), "%s/nodir/model.safetensors", dir);
    log_reset();
    CU_ASSERT_EQUAL(fsdp_st_write(sub, &old, 1, NULL, 0), FSDP_ERR_IO);
    CU_ASSERT(logged_once(sub, strerror(ENOENT)));
    snprintf(sub, sizeof(sub), "%s/model.safetensors/x", dir);
    log_reset();
    CU_ASSERT_EQUAL(fsdp_st_write(sub, &old, 1, NULL, 0), FSDP_ERR_IO);
    CU_ASSERT(logged_once(sub, strerror(ENOTDIR)));

    /* 6. a successful write replaces the file */
    {
        static const uint16_t v2[2] = {7, 8};
        static const int64_t s2[] = {2};
        const fsdp_st_entry_t e = {"w2", "BF16", 1, s2, v2};
        const char *meta2[] = {"version", "2"};
        CU_ASSERT_EQUAL(fsdp_st_write(path, &e, 1, meta2, 1), FSDP_OK);
        CU_ASSERT_EQUAL_FATAL(fsdp_st_open(path, &file), FSDP_OK);
        CU_ASSERT_EQUAL(fsdp_st_num_tensors(file), 1);
        CU_ASSERT_PTR_NULL(fsdp_st_find(file, "w"));
        CU_ASSERT_PTR_NOT_NULL(fsdp_st_find(file, "w2"));
        CU_ASSERT_STRING_EQUAL(fsdp_st_metadata(file, "version"), "2");
        fsdp_st_close(file);
    }
    CU_ASSERT_EQUAL(dir_entries(dir, &has_tmp), 2);
    CU_ASSERT_FALSE(has_tmp);

    /* 7. a relative path (the directory to sync is ".") */
    {
        char cwd[PATH_MAX];
        CU_ASSERT_PTR_NOT_NULL_FATAL(getcwd(cwd, sizeof(cwd)));
        CU_ASSERT_EQUAL_FATAL(chdir(dir), 0);
        CU_ASSERT_EQUAL(fsdp_st_write("rel.safetensors", &old, 1, NULL, 0), FSDP_OK);
        CU_ASSERT_EQUAL(chdir(cwd), 0);
        CU_ASSERT_EQUAL(dir_entries(dir, &has_tmp), 3);
        CU_ASSERT_FALSE(has_tmp);
    }
    free(before);
    remove_tmpdir(dir);
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"dtype_bits", test_dtype_bits},
        {"NaN and Inf found in every floating dtype", test_check_finite},
        {"round_trip", test_round_trip},
        {"writer_layout", test_writer_layout},
        {"accept_edge_cases", test_accept_edge_cases},
        {"reject_short_file", test_reject_short_file},
        {"reject_header_too_long", test_reject_header_too_long},
        {"reject_header_past_end", test_reject_header_past_end},
        {"reject_not_brace", test_reject_not_brace},
        {"reject_invalid_json", test_reject_invalid_json},
        {"reject_invalid_utf8", test_reject_invalid_utf8},
        {"reject_duplicate_key", test_reject_duplicate_key},
        {"reject_metadata_not_strings", test_reject_metadata_not_strings},
        {"reject_unknown_dtype", test_reject_unknown_dtype},
        {"reject_bad_shape", test_reject_bad_shape},
        {"reject_bad_data_offsets", test_reject_bad_data_offsets},
        {"reject_offsets_not_at_zero", test_reject_offsets_not_at_zero},
        {"reject_hole", test_reject_hole},
        {"reject_overlap", test_reject_overlap},
        {"reject_end_before_begin", test_reject_end_before_begin},
        {"reject_size_mismatch", test_reject_size_mismatch},
        {"reject_shape_overflow", test_reject_shape_overflow},
        {"reject_trailing_bytes", test_reject_trailing_bytes},
        {"reject_truncated_buffer", test_reject_truncated_buffer},
        {"reject_extra_field", test_reject_extra_field},
        {"open_errors", test_open_errors},
        {"open_truncated", test_open_truncated},
        {"writer_invalid_params", test_writer_invalid_params},
        {"atomic_write", test_atomic_write},
        {NULL, NULL},
    };
    fsdp_log_set_handler(capture_log, NULL);
    return fsdp_test_run("safetensors", tests);
}
