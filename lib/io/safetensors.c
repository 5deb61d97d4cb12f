/* safetensors files: a strict reader that enforces every rule of docs/formats.md section 1, and an
 * atomic writer that follows the reference writer's layout (prepare() in tensor.rs).
 *
 * fsdp_st_open maps the file read-only instead of reading it: checkpoints are gigabytes, a
 * mapping costs no copy and no second resident image, pages load on first touch and the tensor
 * pointers stay valid until fsdp_st_close. The header is parsed straight from the mapping.
 */

#include <fsdp/safetensors.h>
#include <fsdp/types.h>

#include <fsdp/log.h>

#include "io/fs.h"
#include "io/io_hidden.h"
#include "kernels/convert.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The format stores little-endian data and tensor bytes are handed over as they lie. */
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__)
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "libfsdp safetensors support needs a little-endian host");
#define st_host_little_endian() 1
#else
static int st_host_little_endian(void)
{
    const uint16_t one = 1;
    unsigned char first;
    memcpy(&first, &one, 1);
    return first == 1;
}
#endif

/* enum Dtype of tensor.rs with bitsize(), in its declaration order. */
typedef struct st_dtype {
    const char *name;
    unsigned bits;
} st_dtype_t;

static const st_dtype_t st_dtypes[] = {
    {"BOOL", 8},        {"F4", 4},      {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"U8", 8},
    {"I8", 8},          {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8},
    {"F8_E5M2FNUZ", 8}, {"I16", 16},    {"U16", 16},    {"F16", 16},    {"BF16", 16},
    {"I32", 32},        {"U32", 32},    {"F32", 32},    {"C64", 64},    {"F64", 64},
    {"I64", 64},        {"U64", 64},
};
#define ST_NUM_DTYPES (sizeof(st_dtypes) / sizeof(st_dtypes[0]))

#define ST_META_KEY "__metadata__"
#define ST_SHAPE_STR_MAX (FSDP_ST_MAX_DIMS * 22 + 4)

struct fsdp_st_file {
    json_t *header; /* owns the tensor names and the metadata strings */
    json_t *meta;   /* __metadata__, borrowed from header; NULL if absent */
    void *map;      /* fsdp_st_open's mapping; NULL over a caller's buffer */
    size_t map_len;
    int ntensors;
    fsdp_st_tensor_t *tensors;        /* offset order */
    const fsdp_st_tensor_t **by_name; /* name order, for fsdp_st_find */
};

/* A tensor while the header is checked: its entry plus the offsets the public struct lacks. */
typedef struct st_slot {
    fsdp_st_tensor_t t;
    uint64_t begin, end;
} st_slot_t;

/* A tensor to write, with what the ordering and the offsets need. */
typedef struct st_wslot {
    const fsdp_st_entry_t *e;
    const char *dtype; /* the table's spelling */
    unsigned align;
    uint64_t nbytes, begin;
} st_wslot_t;

enum { ST_SIZE_OK, ST_SIZE_OVERFLOW, ST_SIZE_MISALIGNED };

static const st_dtype_t *st_dtype_lookup(const char *name)
{
    if (name == NULL)
        return NULL;
    for (size_t i = 0; i < ST_NUM_DTYPES; i++) {
        if (strcmp(name, st_dtypes[i].name) == 0)
            return &st_dtypes[i];
    }
    return NULL;
}

unsigned fsdp_st_dtype_bits(const char *dtype)
{
    const st_dtype_t *d = st_dtype_lookup(dtype);
    return d != NULL ? d->bits : 0;
}

/* Elements and bytes of a shape, as tensor.rs computes them: checked products, and a sub-byte
 * dtype must fill whole bytes (MisalignedSlice). *numel_p is set unless the count overflows. */
static int st_tensor_size(const int64_t *shape, int ndim, unsigned bits, uint64_t *numel_p,
                          uint64_t *nbytes_p)
{
    uint64_t numel = 1;

    for (int i = 0; i < ndim; i++) {
        uint64_t d = (uint64_t)shape[i];
        if (d != 0 && numel > UINT64_MAX / d)
            return ST_SIZE_OVERFLOW;
        numel *= d;
    }
    *numel_p = numel;
    if (numel > UINT64_MAX / bits)
        return ST_SIZE_OVERFLOW;
    if (numel * bits % 8 != 0)
        return ST_SIZE_MISALIGNED;
    *nbytes_p = numel * bits / 8;
    return ST_SIZE_OK;
}

/* "[2, 3]", "[]" for a scalar. ST_SHAPE_STR_MAX holds FSDP_ST_MAX_DIMS 20-digit dims. */
static const char *st_shape_str(const int64_t *shape, int ndim, char *buf, size_t size)
{
    size_t used = 1;

    snprintf(buf, size, "[");
    for (int i = 0; i < ndim && used < size; i++) {
        int r = snprintf(buf + used, size - used, "%s%lld", i > 0 ? ", " : "", (long long)shape[i]);
        used += r > 0 ? (size_t)r : 0;
    }
    if (used < size)
        snprintf(buf + used, size - used, "]");
    return buf;
}

static uint64_t st_load_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void st_store_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* Strict UTF-8: no overlong forms, no surrogates, nothing past U+10FFFF (what jansson accepts). */
static int st_utf8_valid(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;

    while (*p != 0) {
        unsigned need;
        uint32_t cp, min;

        if (*p < 0x80) {
            p++;
            continue;
        }
        if (*p >= 0xc2 && *p <= 0xdf) {
            need = 1, cp = *p & 0x1fu, min = 0x80;
        } else if ((*p & 0xf0) == 0xe0) {
            need = 2, cp = *p & 0x0fu, min = 0x800;
        } else if (*p >= 0xf0 && *p <= 0xf4) {
            need = 3, cp = *p & 0x07u, min = 0x10000;
        } else {
            return 0;
        }
        for (unsigned i = 1; i <= need; i++) { /* stops at the NUL of a short string */
            if ((p[i] & 0xc0) != 0x80)
                return 0;
            cp = cp << 6 | (p[i] & 0x3fu);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        p += need + 1;
    }
    return 1;
}

static int st_json_uint(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return 0;
    *out = (uint64_t)json_integer_value(v);
    return 1;
}

/* ------------------------------------------------------------------------------------------ */
/* Reader                                                                                     */

static fsdp_status_t st_check_metadata(const char *label, json_t *meta)
{
    const char *key;
    json_t *value;

    if (!json_is_object(meta)) {
        fsdp_error("%s: __metadata__ is not an object mapping strings to strings", label);
        return FSDP_ERR_FORMAT;
    }
    json_object_foreach (meta, key, value) {
        if (!json_is_string(value)) {
            fsdp_error("%s: __metadata__ value of key '%s' is not a string", label, key);
            return FSDP_ERR_FORMAT;
        }
    }
    return FSDP_OK;
}

/* One tensor entry: exactly dtype, shape and data_offsets, consistent with each other. */
static fsdp_status_t st_parse_entry(const char *label, const char *name, json_t *entry,
                                    st_slot_t *slot)
{
    static const char *const fields[] = {"dtype", "shape", "data_offsets"};
    fsdp_st_tensor_t *t = &slot->t;
    char shape_str[ST_SHAPE_STR_MAX];
    const st_dtype_t *dtype;
    json_t *jdtype, *jshape, *joffs, *v;
    const char *field;
    size_t i;
    int rc;

    if (!json_is_object(entry)) {
        fsdp_error("%s: tensor '%s' is not an object of dtype, shape and data_offsets", label,
                   name);
        return FSDP_ERR_FORMAT;
    }
    json_object_foreach (entry, field, v) {
        if (strcmp(field, "dtype") != 0 && strcmp(field, "shape") != 0 &&
            strcmp(field, "data_offsets") != 0) {
            fsdp_error("%s: tensor '%s' has unknown field '%s' (allowed: dtype, shape, "
                       "data_offsets)",
                       label, name, field);
            return FSDP_ERR_FORMAT;
        }
    }
    for (i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        if (json_object_get(entry, fields[i]) == NULL) {
            fsdp_error("%s: tensor '%s' lacks field '%s'", label, name, fields[i]);
            return FSDP_ERR_FORMAT;
        }
    }
    jdtype = json_object_get(entry, "dtype");
    jshape = json_object_get(entry, "shape");
    joffs = json_object_get(entry, "data_offsets");

    dtype = json_is_string(jdtype) ? st_dtype_lookup(json_string_value(jdtype)) : NULL;
    if (dtype == NULL) {
        if (json_is_string(jdtype))
            fsdp_error("%s: tensor '%s' has unknown dtype '%s'", label, name,
                       json_string_value(jdtype));
        else
            fsdp_error("%s: tensor '%s' has a dtype that is not a string", label, name);
        return FSDP_ERR_FORMAT;
    }

    if (!json_is_array(jshape)) {
        fsdp_error("%s: tensor '%s' shape is not an array", label, name);
        return FSDP_ERR_FORMAT;
    }
    if (json_array_size(jshape) > FSDP_ST_MAX_DIMS) {
        fsdp_error("%s: tensor '%s' shape has %zu dimensions, more than the %d supported", label,
                   name, json_array_size(jshape), FSDP_ST_MAX_DIMS);
        return FSDP_ERR_FORMAT;
    }
    json_array_foreach (jshape, i, v) {
        uint64_t d;
        if (!st_json_uint(v, &d)) {
            fsdp_error("%s: tensor '%s' shape[%zu] is not a non-negative integer", label, name, i);
            return FSDP_ERR_FORMAT;
        }
        t->shape[i] = (int64_t)d;
    }
    t->ndim = (int)json_array_size(jshape);

    if (!json_is_array(joffs) || json_array_size(joffs) != 2 ||
        !st_json_uint(json_array_get(joffs, 0), &slot->begin) ||
        !st_json_uint(json_array_get(joffs, 1), &slot->end)) {
        fsdp_error("%s: tensor '%s' data_offsets is not [BEGIN, END] of two non-negative "
                   "integers",
                   label, name);
        return FSDP_ERR_FORMAT;
    }
    if (slot->end < slot->begin) {
        fsdp_error("%s: tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64 "] end before they "
                   "begin",
                   label, name, slot->begin, slot->end);
        return FSDP_ERR_FORMAT;
    }

    st_shape_str(t->shape, t->ndim, shape_str, sizeof(shape_str));
    rc = st_tensor_size(t->shape, t->ndim, dtype->bits, &t->numel, &t->nbytes);
    if (rc == ST_SIZE_OVERFLOW) {
        fsdp_error("%s: tensor '%s' shape %s of %s: the element or bit count overflows 64 bits",
                   label, name, shape_str, dtype->name);
        return FSDP_ERR_FORMAT;
    }
    if (rc == ST_SIZE_MISALIGNED) {
        fsdp_error("%s: tensor '%s' shape %s of %s is %" PRIu64 " bits, not a whole number of "
                   "bytes",
                   label, name, shape_str, dtype->name, t->numel * dtype->bits);
        return FSDP_ERR_FORMAT;
    }
    if (slot->end - slot->begin != t->nbytes) {
        fsdp_error("%s: tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64 "] span %" PRIu64
                   " bytes, shape %s of %s needs %" PRIu64,
                   label, name, slot->begin, slot->end, slot->end - slot->begin, shape_str,
                   dtype->name, t->nbytes);
        return FSDP_ERR_FORMAT;
    }
    t->name = name;
    t->dtype = dtype->name;
    return FSDP_OK;
}

/* By data_offsets, as the reference sorts them; the name settles ties of empty tensors. */
static int st_slot_cmp(const void *a, const void *b)
{
    const st_slot_t *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return strcmp(x->t.name, y->t.name);
}

static int st_by_name_cmp(const void *a, const void *b)
{
    const fsdp_st_tensor_t *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

static int st_find_cmp(const void *key, const void *elem)
{
    const fsdp_st_tensor_t *const *t = elem;
    return strcmp(key, (*t)->name);
}

/* Sorted by offset, the tensors must tile the data buffer exactly: from 0, no hole, no
 * overlap, ending at its last byte. */
static fsdp_status_t st_check_layout(const char *label, const st_slot_t *slots, int n,
                                     size_t data_len)
{
    uint64_t pos = 0;

    for (int i = 0; i < n; i++) {
        const st_slot_t *s = &slots[i];
        if (s->begin == pos) {
            pos = s->end;
            continue;
        }
        if (i == 0)
            fsdp_error("%s: tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64 "] come first but "
                       "do not begin at 0",
                       label, s->t.name, s->begin, s->end);
        else if (s->begin < pos)
            fsdp_error("%s: tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64 "] overlap tensor "
                       "'%s', which ends at %" PRIu64,
                       label, s->t.name, s->begin, s->end, slots[i - 1].t.name, pos);
        else
            fsdp_error("%s: tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64 "] leave a hole "
                       "after tensor '%s', which ends at %" PRIu64,
                       label, s->t.name, s->begin, s->end, slots[i - 1].t.name, pos);
        return FSDP_ERR_FORMAT;
    }
    if (pos < data_len) {
        fsdp_error("%s: the tensors end at byte %" PRIu64 " of a %zu-byte data buffer; the "
                   "trailing bytes are not indexed",
                   label, pos, data_len);
        return FSDP_ERR_FORMAT;
    }
    if (pos > data_len) {
        fsdp_error("%s: the tensors end at byte %" PRIu64 " but the data buffer holds only %zu "
                   "bytes (truncated file?)",
                   label, pos, data_len);
        return FSDP_ERR_FORMAT;
    }
    return FSDP_OK;
}

static fsdp_status_t st_parse_header(const unsigned char *buf, size_t len, const char *label,
                                     json_t **root_p, size_t *header_len_p)
{
    const unsigned char *hdr = buf + 8;
    json_error_t jerr;
    uint64_t n;
    size_t hlen;
    json_t *root;

    if (len < 8) {
        fsdp_error("%s: file is %zu bytes, shorter than the 8-byte header length", label, len);
        return FSDP_ERR_FORMAT;
    }
    n = st_load_le64(buf);
    if (n > FSDP_ST_MAX_HEADER) {
        fsdp_error("%s: header length %" PRIu64 " exceeds the limit of %llu bytes", label, n,
                   FSDP_ST_MAX_HEADER);
        return FSDP_ERR_FORMAT;
    }
    if (n > len - 8) {
        fsdp_error("%s: header length %" PRIu64 " runs past the end of the %zu-byte file", label, n,
                   len);
        return FSDP_ERR_FORMAT;
    }
    hlen = (size_t)n;
    while (hlen > 0 && hdr[hlen - 1] == ' ') /* the padding the format allows */
        hlen--;
    if (hlen == 0 || hdr[0] != '{') {
        fsdp_error("%s: header does not begin with '{'", label);
        return FSDP_ERR_FORMAT;
    }
    root = json_loadb((const char *)hdr, hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
#if JANSSON_VERSION_HEX >= 0x020b00
        if (json_error_code(&jerr) == json_error_out_of_memory) {
            fsdp_error("%s: out of memory parsing the %zu-byte header", label, hlen);
            return FSDP_ERR_NO_MEMORY;
        }
#endif
        fsdp_error("%s: header is not valid UTF-8 JSON: %s (header byte %d)", label, jerr.text,
                   jerr.position);
        return FSDP_ERR_FORMAT;
    }
    /* jansson also skips trailing tabs and newlines; the format allows only spaces. */
    if (!json_is_object(root) || hdr[hlen - 1] != '}') {
        fsdp_error("%s: header has bytes other than space padding after its closing '}'", label);
        json_decref(root);
        return FSDP_ERR_FORMAT;
    }
    *root_p = root;
    *header_len_p = (size_t)n;
    return FSDP_OK;
}

static fsdp_status_t st_parse(const unsigned char *buf, size_t len, const char *label,
                              fsdp_st_file_t **file_p)
{
    fsdp_st_file_t *file;
    fsdp_status_t status;
    const unsigned char *data;
    st_slot_t *slots;
    size_t header_len, count, data_len;
    const char *key;
    json_t *root, *value;
    int n = 0;

    status = st_parse_header(buf, len, label, &root, &header_len);
    if (status != FSDP_OK)
        return status;
    data = buf + 8 + header_len;
    data_len = len - 8 - header_len;

    file = calloc(1, sizeof(*file));
    if (file == NULL) {
        fsdp_error("%s: out of memory", label);
        status = FSDP_ERR_NO_MEMORY;
        goto err_free_root;
    }
    file->header = root;
    file->meta = json_object_get(root, ST_META_KEY);
    if (file->meta != NULL) {
        status = st_check_metadata(label, file->meta);
        if (status != FSDP_OK)
            goto err_free_file;
    }

    count = json_object_size(root) - (file->meta != NULL);
    if (count > INT_MAX) { /* cannot happen below the 100 MB header limit; keeps int safe */
        fsdp_error("%s: header lists %zu tensors, more than %d", label, count, INT_MAX);
        status = FSDP_ERR_FORMAT;
        goto err_free_file;
    }
    slots = calloc(count + 1, sizeof(*slots));
    file->tensors = calloc(count + 1, sizeof(*file->tensors));
    file->by_name = calloc(count + 1, sizeof(*file->by_name));
    if (slots == NULL || file->tensors == NULL || file->by_name == NULL) {
        fsdp_error("%s: out of memory for %zu tensors", label, count);
        status = FSDP_ERR_NO_MEMORY;
        goto err_free_slots;
    }
    json_object_foreach (root, key, value) {
        if (strcmp(key, ST_META_KEY) == 0)
            continue;
        status = st_parse_entry(label, key, value, &slots[n]);
        if (status != FSDP_OK)
            goto err_free_slots;
        n++;
    }

    qsort(slots, (size_t)n, sizeof(*slots), st_slot_cmp);
    status = st_check_layout(label, slots, n, data_len);
    if (status != FSDP_OK)
        goto err_free_slots;

    for (int i = 0; i < n; i++) {
        file->tensors[i] = slots[i].t;
        file->tensors[i].data = data + slots[i].begin;
        file->by_name[i] = &file->tensors[i];
    }
    qsort(file->by_name, (size_t)n, sizeof(*file->by_name), st_by_name_cmp);
    file->ntensors = n;
    free(slots);
    *file_p = file;
    return FSDP_OK;

err_free_slots:
    free(slots);
    free(file->by_name);
    free(file->tensors);
err_free_file:
    free(file);
err_free_root:
    json_decref(root);
    return status;
}

fsdp_status_t fsdp_st_open_buffer(const void *buf, size_t len, const char *label,
                                  fsdp_st_file_t **file_p)
{
    static const unsigned char empty[1];

    if (label == NULL)
        label = "<buffer>";
    if (file_p == NULL || (buf == NULL && len > 0)) {
        fsdp_error("%s: fsdp_st_open_buffer needs file_p and, when len > 0, a buffer", label);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (!st_host_little_endian()) {
        fsdp_error("%s: safetensors needs a little-endian host", label);
        return FSDP_ERR_UNSUPPORTED;
    }
    return st_parse(buf != NULL ? buf : empty, len, label, file_p);
}

fsdp_status_t fsdp_st_open(const char *path, fsdp_st_file_t **file_p)
{
    static const unsigned char empty[1];
    fsdp_st_file_t *file;
    fsdp_status_t status;
    struct stat st;
    void *map = NULL;
    size_t len;
    int fd;

    if (path == NULL || file_p == NULL) {
        fsdp_error("fsdp_st_open: path and file_p must not be NULL");
        return FSDP_ERR_INVALID_PARAM;
    }
    if (!st_host_little_endian()) {
        fsdp_error("%s: safetensors needs a little-endian host", path);
        return FSDP_ERR_UNSUPPORTED;
    }
    status = fsdp_fs_open_read(path, 0, &fd, &st);
    if (status != FSDP_OK)
        return FSDP_ERR_IO; /* what is not a regular file too, as documented */
    if ((uintmax_t)st.st_size > SIZE_MAX) {
        fsdp_error("%s: %jd bytes do not fit in the address space", path, (intmax_t)st.st_size);
        status = FSDP_ERR_NO_MEMORY;
        goto err_close;
    }
    len = (size_t)st.st_size;
    if (len > 0) { /* mmap rejects a 0-byte length; an empty file is rejected by st_parse */
        map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            map = NULL;
            status = errno == ENOMEM ? FSDP_ERR_NO_MEMORY : FSDP_ERR_IO;
            fsdp_error("%s: cannot map %zu bytes: %s", path, len, strerror(errno));
            goto err_close;
        }
    }
    status = st_parse(map != NULL ? map : empty, len, path, &file);
    if (status != FSDP_OK)
        goto err_unmap;
    close(fd); /* the mapping outlives the descriptor */
    file->map = map;
    file->map_len = len;
    *file_p = file;
    return FSDP_OK;

err_unmap:
    if (map != NULL)
        munmap(map, len);
err_close:
    close(fd);
    return status;
}

void fsdp_st_close(fsdp_st_file_t *file)
{
    if (file == NULL)
        return;
    free(file->by_name);
    free(file->tensors);
    json_decref(file->header);
    if (file->map != NULL)
        munmap(file->map, file->map_len);
    free(file);
}

int fsdp_st_num_tensors(const fsdp_st_file_t *file)
{
    return file != NULL ? file->ntensors : 0;
}

const fsdp_st_tensor_t *fsdp_st_tensor_at(const fsdp_st_file_t *file, int index)
{
    if (file == NULL || index < 0 || index >= file->ntensors)
        return NULL;
    return &file->tensors[index];
}

const fsdp_st_tensor_t *fsdp_st_find(const fsdp_st_file_t *file, const char *name)
{
    const fsdp_st_tensor_t *const *hit;

    if (file == NULL || name == NULL || file->ntensors == 0)
        return NULL;
    hit = bsearch(name, file->by_name, (size_t)file->ntensors, sizeof(*file->by_name), st_find_cmp);
    return hit != NULL ? *hit : NULL;
}

fsdp_status_t fsdp_st_read_f32(const fsdp_st_tensor_t *t, uint64_t start, uint64_t n, float *out)
{
    unsigned bits = fsdp_st_dtype_bits(t->dtype);
    int f32 = strcmp(t->dtype, "F32") == 0, bf16 = strcmp(t->dtype, "BF16") == 0;
    const unsigned char *p;

    if ((!f32 && !bf16 && strcmp(t->dtype, "F16") != 0) || start > t->numel ||
        n > t->numel - start) {
        fsdp_error("tensor '%s' (%s, %" PRIu64 " elements): cannot read elements %" PRIu64
                   " to %" PRIu64 " as f32 (F32, BF16 or F16 only)",
                   t->name, t->dtype, t->numel, start, start + n);
        return FSDP_ERR_INVALID_PARAM;
    }
    p = (const unsigned char *)t->data + start * (bits / 8);
    for (uint64_t i = 0; i < n; i++) { /* little-endian, any alignment */
        if (f32) {
            out[i] = fsdp_kb_bits_f32((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                                      (uint32_t)p[3] << 24);
            p += 4;
        } else {
            uint16_t h = (uint16_t)(p[0] | p[1] << 8);
            out[i] = bf16 ? fsdp_kb_bf16_to_f32(h) : fsdp_kb_f16_to_f32(h);
            p += 2;
        }
    }
    return FSDP_OK;
}

/* The one line that refuses a weight that is not finite. */
static fsdp_status_t st_refuse_nonfinite(const char *label, const char *name, double v, uint64_t i)
{
    fsdp_error("%s: tensor '%s' holds %s at element %" PRIu64 ": refused (a diverged run's save, "
               "or a damaged file)",
               label != NULL ? label : "<buffer>", name, isnan(v) ? "NaN" : "Inf", i);
    return FSDP_ERR_FORMAT;
}

fsdp_status_t fsdp_st_check_finite_f32(const char *label, const char *name, const float *p,
                                       uint64_t n, uint64_t first)
{
    for (uint64_t i = 0; i < n; i++)
        if (!isfinite(p[i]))
            return st_refuse_nonfinite(label, name, p[i], first + i);
    return FSDP_OK;
}

fsdp_status_t fsdp_st_check_finite(const fsdp_st_tensor_t *t, const char *label)
{
    enum { CHUNK = 1024 };
    float buf[CHUNK];

    if (strcmp(t->dtype, "F64") == 0) { /* no reader widens F64, and narrowing could overflow */
        for (uint64_t i = 0; i < t->numel; i++) {
            double v;
            memcpy(&v, (const unsigned char *)t->data + 8 * i, 8);
            if (!isfinite(v))
                return st_refuse_nonfinite(label, t->name, v, i);
        }
        return FSDP_OK;
    }
    if (strcmp(t->dtype, "F32") != 0 && strcmp(t->dtype, "F16") != 0 &&
        strcmp(t->dtype, "BF16") != 0)
        return FSDP_OK;
    for (uint64_t i = 0; i < t->numel; i += CHUNK) {
        uint64_t n = t->numel - i < CHUNK ? t->numel - i : CHUNK;
        fsdp_status_t status = fsdp_st_read_f32(t, i, n, buf);
        if (status == FSDP_OK)
            status = fsdp_st_check_finite_f32(label, t->name, buf, n, i);
        if (status != FSDP_OK)
            return status;
    }
    return FSDP_OK;
}

const char *fsdp_st_metadata(const fsdp_st_file_t *file, const char *key)
{
    if (file == NULL || file->meta == NULL || key == NULL)
        return NULL;
    return json_string_value(json_object_get(file->meta, key));
}

/* ------------------------------------------------------------------------------------------ */
/* Writer                                                                                     */

/* Descending alignment, then name: every tensor then starts aligned to its element size. */
static int st_wslot_cmp(const void *a, const void *b)
{
    const st_wslot_t *x = a, *y = b;
    if (x->align != y->align)
        return x->align > y->align ? -1 : 1;
    return strcmp(x->e->name, y->e->name);
}

static int st_str_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first string that occurs twice, or NULL; sorts `strs` in place. */
static const char *st_first_duplicate(const char **strs, size_t n)
{
    qsort(strs, n, sizeof(*strs), st_str_cmp);
    for (size_t i = 1; i < n; i++) {
        if (strcmp(strs[i - 1], strs[i]) == 0)
            return strs[i];
    }
    return NULL;
}

static const char *st_dtype_list(char *buf, size_t size)
{
    size_t used = 0;

    buf[0] = '\0';
    for (size_t i = 0; i < ST_NUM_DTYPES && used < size; i++) {
        int r = snprintf(buf + used, size - used, "%s%s", i > 0 ? ", " : "", st_dtypes[i].name);
        if (r < 0)
            break;
        used += (size_t)r;
    }
    return buf;
}

static fsdp_status_t st_check_entry(const char *path, const fsdp_st_entry_t *e, int i,
                                    st_wslot_t *slot)
{
    char shape_str[ST_SHAPE_STR_MAX], list[256];
    const st_dtype_t *dtype;
    uint64_t numel;
    int rc;

    if (e->name == NULL || e->name[0] == '\0') {
        fsdp_error("%s: entry %d has no name; tensor names must be non-empty", path, i);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (strcmp(e->name, ST_META_KEY) == 0) {
        fsdp_error("%s: entry %d is named '%s', which the format reserves for metadata", path, i,
                   ST_META_KEY);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (!st_utf8_valid(e->name)) {
        fsdp_error("%s: entry %d has a name that is not valid UTF-8", path, i);
        return FSDP_ERR_INVALID_PARAM;
    }
    dtype = st_dtype_lookup(e->dtype);
    if (dtype == NULL) {
        fsdp_error("%s: tensor '%s' has dtype '%s'; allowed: %s", path, e->name,
                   e->dtype != NULL ? e->dtype : "(null)", st_dtype_list(list, sizeof(list)));
        return FSDP_ERR_INVALID_PARAM;
    }
    if (e->ndim < 0 || e->ndim > FSDP_ST_MAX_DIMS) {
        fsdp_error("%s: tensor '%s' has %d dimensions; 0 to %d are allowed", path, e->name, e->ndim,
                   FSDP_ST_MAX_DIMS);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (e->ndim > 0 && e->shape == NULL) {
        fsdp_error("%s: tensor '%s' has %d dimensions but no shape", path, e->name, e->ndim);
        return FSDP_ERR_INVALID_PARAM;
    }
    for (int d = 0; d < e->ndim; d++) {
        if (e->shape[d] < 0) {
            fsdp_error("%s: tensor '%s' has negative dimension %lld", path, e->name,
                       (long long)e->shape[d]);
            return FSDP_ERR_INVALID_PARAM;
        }
    }
    rc = st_tensor_size(e->shape, e->ndim, dtype->bits, &numel, &slot->nbytes);
    if (rc != ST_SIZE_OK) {
        st_shape_str(e->shape, e->ndim, shape_str, sizeof(shape_str));
        if (rc == ST_SIZE_OVERFLOW)
            fsdp_error("%s: tensor '%s' shape %s of %s: the element or bit count overflows 64 "
                       "bits",
                       path, e->name, shape_str, dtype->name);
        else
            fsdp_error("%s: tensor '%s' shape %s of %s is not a whole number of bytes", path,
                       e->name, shape_str, dtype->name);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (slot->nbytes > 0 && e->data == NULL) {
        fsdp_error("%s: tensor '%s' has %" PRIu64 " bytes but no data", path, e->name,
                   slot->nbytes);
        return FSDP_ERR_INVALID_PARAM;
    }
    slot->e = e;
    slot->dtype = dtype->name;
    slot->align = dtype->bits >= 8 ? dtype->bits / 8 : 1;
    return FSDP_OK;
}

/* Everything about the inputs, before any file is touched; sorts and places the tensors. */
static fsdp_status_t st_check_inputs(const char *path, const fsdp_st_entry_t *entries, int n,
                                     const char *const *meta, int nmeta, st_wslot_t *slots)
{
    fsdp_status_t status;
    const char **strs, *dup;
    uint64_t pos = 0;
    int i;

    for (i = 0; i < n; i++) {
        status = st_check_entry(path, &entries[i], i, &slots[i]);
        if (status != FSDP_OK)
            return status;
    }
    for (i = 0; i < 2 * nmeta; i++) {
        if (meta[i] == NULL || !st_utf8_valid(meta[i])) {
            fsdp_error("%s: metadata %s %d is %s; keys and values must be UTF-8 strings", path,
                       i % 2 ? "value" : "key", i / 2, meta[i] == NULL ? "NULL" : "not UTF-8");
            return FSDP_ERR_INVALID_PARAM;
        }
    }

    strs = malloc(sizeof(*strs) * ((size_t)(n > nmeta ? n : nmeta) + 1));
    if (strs == NULL) {
        fsdp_error("%s: out of memory", path);
        return FSDP_ERR_NO_MEMORY;
    }
    for (i = 0; i < n; i++)
        strs[i] = entries[i].name;
    dup = st_first_duplicate(strs, (size_t)n);
    if (dup != NULL) {
        fsdp_error("%s: two tensors are named '%s'; names must be unique", path, dup);
        status = FSDP_ERR_INVALID_PARAM;
        goto err_free_strs;
    }
    for (i = 0; i < nmeta; i++)
        strs[i] = meta[2 * i];
    dup = st_first_duplicate(strs, (size_t)nmeta);
    if (dup != NULL) {
        fsdp_error("%s: metadata key '%s' appears twice; keys must be unique", path, dup);
        status = FSDP_ERR_INVALID_PARAM;
        goto err_free_strs;
    }
    free(strs);

    qsort(slots, (size_t)n, sizeof(*slots), st_wslot_cmp);
    for (i = 0; i < n; i++) {
        if (slots[i].nbytes > (uint64_t)INT64_MAX - pos) { /* offsets are JSON integers */
            fsdp_error("%s: the tensors total more than 2^63 bytes", path);
            return FSDP_ERR_INVALID_PARAM;
        }
        slots[i].begin = pos;
        pos += slots[i].nbytes;
    }
    return FSDP_OK;

err_free_strs:
    free(strs);
    return status;
}

/* The 8-byte length and the JSON header, padded with spaces to a multiple of 8 bytes. */
static fsdp_status_t st_build_header(const char *path, const st_wslot_t *slots, int n,
                                     const char *const *meta, int nmeta, unsigned char **buf_p,
                                     size_t *len_p)
{
    fsdp_status_t status = FSDP_ERR_NO_MEMORY;
    unsigned char *buf;
    json_t *root, *jmeta, *shape;
    size_t text_len, padded;
    char *text;

    root = json_object();
    if (root == NULL)
        goto err_nomem;
    if (nmeta > 0) { /* first, as the reference writes it */
        jmeta = json_object();
        if (json_object_set_new(root, ST_META_KEY, jmeta) != 0)
            goto err_free_root;
        for (int i = 0; i < nmeta; i++) {
            if (json_object_set_new(jmeta, meta[2 * i], json_string(meta[2 * i + 1])) != 0)
                goto err_free_root;
        }
    }
    for (int i = 0; i < n; i++) {
        const st_wslot_t *s = &slots[i];
        shape = json_array();
        if (shape == NULL)
            goto err_free_root;
        for (int d = 0; d < s->e->ndim; d++) {
            if (json_array_append_new(shape, json_integer((json_int_t)s->e->shape[d])) != 0) {
                json_decref(shape);
                goto err_free_root;
            }
        }
        /* "o" hands `shape` over, on failure too */
        if (json_object_set_new(root, s->e->name,
                                json_pack("{s:s, s:o, s:[I, I]}", "dtype", s->dtype, "shape", shape,
                                          "data_offsets", (json_int_t)s->begin,
                                          (json_int_t)(s->begin + s->nbytes))) != 0)
            goto err_free_root;
    }
    text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (text == NULL)
        goto err_free_root;
    text_len = strlen(text);
    padded = (text_len + 7) & ~(size_t)7;
    buf = malloc(8 + padded);
    if (buf == NULL)
        goto err_free_text;
    st_store_le64(buf, padded);
    memcpy(buf + 8, text, text_len);
    memset(buf + 8 + text_len, ' ', padded - text_len);
    free(text);
    json_decref(root);
    *buf_p = buf;
    *len_p = 8 + padded;
    return FSDP_OK;

err_free_text:
    free(text);
err_free_root:
    json_decref(root);
err_nomem:
    fsdp_error("%s: out of memory building the header", path);
    return status;
}

fsdp_status_t fsdp_st_write(const char *path, const fsdp_st_entry_t *entries, int n,
                            const char *const *meta, int nmeta)
{
    fsdp_status_t status;
    unsigned char *header;
    size_t header_len;
    st_wslot_t *slots;
    fsdp_fs_chunk_t *chunks;

    if (path == NULL || path[0] == '\0' || n < 0 || (n > 0 && entries == NULL) || nmeta < 0 ||
        (nmeta > 0 && meta == NULL) || nmeta > INT_MAX / 2) {
        fsdp_error("fsdp_st_write: needs a path, n >= 0 entries and nmeta >= 0 key/value pairs "
                   "(got path %s, n %d, nmeta %d)",
                   path != NULL ? path : "NULL", n, nmeta);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (!st_host_little_endian()) {
        fsdp_error("%s: safetensors needs a little-endian host", path);
        return FSDP_ERR_UNSUPPORTED;
    }
    slots = calloc((size_t)n + 1, sizeof(*slots));
    if (slots == NULL) {
        fsdp_error("%s: out of memory for %d tensors", path, n);
        return FSDP_ERR_NO_MEMORY;
    }
    status = st_check_inputs(path, entries, n, meta, nmeta, slots);
    if (status != FSDP_OK)
        goto err_free_slots;
    status = st_build_header(path, slots, n, meta, nmeta, &header, &header_len);
    if (status != FSDP_OK)
        goto err_free_slots;

    chunks = malloc(((size_t)n + 1) * sizeof(*chunks));
    if (chunks == NULL) {
        fsdp_error("%s: out of memory", path);
        status = FSDP_ERR_NO_MEMORY;
        goto err_free_header;
    }
    chunks[0].data = header;
    chunks[0].len = header_len;
    for (int i = 0; i < n; i++) {
        chunks[i + 1].data = slots[i].e->data;
        chunks[i + 1].len = slots[i].nbytes;
    }
    status = fsdp_fs_write_atomic(path, chunks, n + 1);
    free(chunks);
err_free_header:
    free(header);
err_free_slots:
    free(slots);
    return status;
}
