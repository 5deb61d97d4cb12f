/* Reading checkpoints (checkpoint.c writes them): fsdp_checkpoint_load into a model and its
 * optimizer on any world size, and fsdp_checkpoint_consolidate into one safetensors file. */
#include <fsdp/checkpoint.h>
#include <fsdp/log.h>
#include <fsdp/safetensors.h>

#include "io/fs.h"
#include "io/io_hidden.h"
#include "nn/ckpt_int.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- load ---- */

typedef struct load_ctx {
    fsdp_t *fs;
    char dir[PATH_MAX];
    json_t *meta;
    int type;
    int old_world;
    int64_t step, optim_num_steps; /* checked by read_meta */
    fsdp_st_file_t **files;        /* per old rank (sharded) or [0] model, [1] optimizer (full) */
    int nfiles;
} load_ctx_t;

static fsdp_status_t open_file(load_ctx_t *lc, int index, const char *name, fsdp_st_file_t **f_p)
{
    char path[PATH_MAX];
    if (lc->files[index] == NULL) {
        fsdp_status_t status = fsdp_ckpt_path_join(path, sizeof(path), lc->dir, name);
        if (status == FSDP_OK)
            status = fsdp_st_open(path, &lc->files[index]);
        if (status != FSDP_OK)
            return status;
    }
    *f_p = lc->files[index];
    return FSDP_OK;
}

static fsdp_status_t bad_checkpoint(const load_ctx_t *lc, const char *what)
{
    fsdp_error("%s: %s", lc->dir, what);
    return FSDP_ERR_FORMAT;
}

/* Weights and optimizer state must be finite: a NaN would surface only as a NaN loss later. */
static fsdp_status_t finite_or_refuse(const load_ctx_t *lc, const char *name, const float *p,
                                      size_t n, size_t start)
{
    return fsdp_st_check_finite_f32(lc->dir, name, p, n, start);
}

/* The optimizer state's range beyond finiteness: AdamW's exp_avg_sq, a running mean of squared
 * gradients, is never negative, and a negative one turns the step's square root, then the loss,
 * into NaN. `buf` is the buffer's name (NULL for the parameter); p may be unaligned. */
static fsdp_status_t state_in_range(const load_ctx_t *lc, const char *name, const char *buf,
                                    const void *p, size_t n, size_t start)
{
    if (buf == NULL || strcmp(buf, "exp_avg_sq") != 0)
        return FSDP_OK;
    for (size_t i = 0; i < n; i++) {
        float v;
        memcpy(&v, (const char *)p + i * sizeof(float), sizeof(v));
        if (v < 0.0f) {
            fsdp_error("%s: tensor '%s' holds %g at element %zu: refused (exp_avg_sq, a mean of "
                       "squares, is never negative: a damaged file)",
                       lc->dir, name, (double)v, start + i);
            return FSDP_ERR_FORMAT;
        }
    }
    return FSDP_OK;
}

/* A step count beyond this is corruption. */
#define CKPT_STEP_MAX FSDP_OPTIM_STEP_MAX

/* obj.key as an integer in [min, max], or one line naming the file and the field. `field` is
 * the path to obj ("" at the top), e.g. "optimizer_steps.fc1.weight". */
static fsdp_status_t meta_int(const load_ctx_t *lc, json_t *obj, const char *field, const char *key,
                              int64_t min, int64_t max, int64_t *value_p)
{
    json_t *v = json_object_get(obj, key);
    const char *dot = field[0] != '\0' ? "." : "";

    if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max) {
        char got[64];

        if (v == NULL)
            snprintf(got, sizeof(got), "missing");
        else if (!json_is_integer(v))
            snprintf(got, sizeof(got), "not an integer");
        else
            snprintf(got, sizeof(got), "%lld", (long long)json_integer_value(v));
        fsdp_error("%s/checkpoint.json: %s%s%s is %s: expected an integer in [%lld, %lld]", lc->dir,
                   field, dot, key, got, (long long)min, (long long)max);
        return FSDP_ERR_FORMAT;
    }
    *value_p = json_integer_value(v);
    return FSDP_OK;
}

/* obj.key as a boolean, likewise. */
static fsdp_status_t meta_bool(const load_ctx_t *lc, json_t *obj, const char *field,
                               const char *key, int *value_p)
{
    json_t *v = json_object_get(obj, key);

    if (!json_is_boolean(v)) {
        fsdp_error("%s/checkpoint.json: %s.%s is %s: expected true or false", lc->dir, field, key,
                   v == NULL ? "missing" : "not a boolean");
        return FSDP_ERR_FORMAT;
    }
    *value_p = json_is_true(v);
    return FSDP_OK;
}

/* A unit's or parameter's optimizer step and buffer flag from optimizer_steps.<name>. */
static fsdp_status_t meta_opt_step(const load_ctx_t *lc, const char *name, int64_t *step_p,
                                   int *has_buffer_p)
{
    json_t *ps = json_object_get(json_object_get(lc->meta, "optimizer_steps"), name);
    char field[600];
    fsdp_status_t status;

    if (!json_is_object(ps)) {
        fsdp_error("%s/checkpoint.json: optimizer_steps has no entry for '%s': the checkpoint "
                   "was saved from another model or wrapping",
                   lc->dir, name);
        return FSDP_ERR_FORMAT;
    }
    snprintf(field, sizeof(field), "optimizer_steps.%s", name);
    status = meta_int(lc, ps, field, "step", 0, CKPT_STEP_MAX, step_p);
    if (status == FSDP_OK)
        status = meta_bool(lc, ps, field, "has_buffer", has_buffer_p);
    return status;
}

/* A piece of a sharded checkpoint, clipped to the range a read needs: elements [lo, hi) of the
 * flattened tensor, at data (element lo), from rank file `rank`. */
typedef struct piece {
    size_t lo, hi;
    const void *data;
    int rank;
} piece_t;

static int piece_cmp(const void *a, const void *b)
{
    const piece_t *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo ? 1 : x->hi < y->hi ? -1 : x->hi > y->hi;
}

/* The place of a piece named <name>@<offset> (a 1-d piece: its first element in the flattened
 * tensor) or <name>@<row>,<col> (a 2-d piece: its first row and column): decimal digits alone,
 * within a size_t each. Returns the count of numbers, 0 when malformed. */
static int piece_place(const char *s, size_t place[2])
{
    for (int k = 0; k < 2; k++) {
        char *end;
        unsigned long long v;
        if (*s < '0' || *s > '9')
            return 0;
        errno = 0;
        v = strtoull(s, &end, 10);
        if (errno != 0 || v > SIZE_MAX)
            return 0;
        place[k] = (size_t)v;
        if (*end == '\0')
            return k + 1;
        if (*end != ',' || k == 1)
            return 0;
        s = end + 1;
    }
    return 0;
}

/* Appends the run [lo, hi) at data from rank file r to *ps (np of cap). */
static fsdp_status_t add_run(piece_t **ps, int *np, int *cap, size_t lo, size_t hi,
                             const void *data, int r)
{
    if (*np == *cap) {
        int c = *cap ? 2 * *cap : 16;
        piece_t *grown = c > *cap ? realloc(*ps, sizeof(**ps) * (size_t)c) : NULL;
        if (grown == NULL)
            return FSDP_ERR_NO_MEMORY;
        *ps = grown;
        *cap = c;
    }
    (*ps)[(*np)++] = (piece_t){lo, hi, data, r};
    return FSDP_OK;
}

/* Every piece of the flattened tensor `name` (a parameter or `state.<param>.<buffer>`, numel
 * elements; cols its columns when it has two dimensions or more, its elements past dim 0, else
 * 0) in every rank file, clipped to [start, start + n) as runs of consecutive elements (a 2-d
 * piece is one run a row), sorted; refused, naming the tensor and the elements, unless they hold
 * each element of the range exactly once. A piece past the tensor's end is refused wherever it
 * lies. *pieces_p is the caller's to free. */
static fsdp_status_t find_pieces(load_ctx_t *lc, const char *name, size_t numel, size_t cols,
                                 size_t start, size_t n, piece_t **pieces_p, int *npieces_p)
{
    piece_t *ps = NULL;
    int np = 0, cap = 0;
    size_t next = start, plen;
    char prefix[600], msg[900];
    fsdp_status_t status = FSDP_OK;

    snprintf(prefix, sizeof(prefix), "%s@", name);
    plen = strlen(prefix);
    for (int r = 0; r < lc->old_world && status == FSDP_OK; r++) {
        char fname[64];
        fsdp_st_file_t *f;
        snprintf(fname, sizeof(fname), "rank-%05d.safetensors", r);
        status = open_file(lc, r, fname, &f);
        for (int t = 0; status == FSDP_OK && t < fsdp_st_num_tensors(f); t++) {
            const fsdp_st_tensor_t *ten = fsdp_st_tensor_at(f, t);
            size_t place[2], cnt, lo, hi;
            int k;
            if (strncmp(ten->name, prefix, plen) != 0)
                continue;
            k = piece_place(ten->name + plen, place);
            if (k == 0 || k != ten->ndim || strcmp(ten->dtype, "F32") != 0) {
                snprintf(msg, sizeof(msg),
                         "%s: piece '%s' is not a 1-d F32 tensor named <name>@<offset> or a 2-d "
                         "one named <name>@<row>,<col>",
                         fname, ten->name);
                status = bad_checkpoint(lc, msg);
                break;
            }
            if (k == 2) { /* rows [r0, r0 + h) and columns [c0, c0 + w) */
                const size_t r0 = place[0], c0 = place[1], h = (size_t)ten->shape[0],
                             w = (size_t)ten->shape[1], rows = cols != 0 ? numel / cols : 0;
                size_t first, last;
                if (cols == 0 || r0 > rows || h > rows - r0 || c0 > cols || w > cols - c0) {
                    snprintf(msg, sizeof(msg),
                             "%s: piece '%s' holds rows [%zu, %zu + %zu) and columns [%zu, %zu + "
                             "%zu) of tensor '%s', which has %zu rows of %zu",
                             fname, ten->name, r0, r0, h, c0, c0, w, name, rows, cols);
                    status = bad_checkpoint(lc, msg);
                    break;
                }
                if (w == 0 || h == 0)
                    continue;
                /* only the rows that meet the range */
                first = start / cols > r0 ? start / cols : r0;
                last =
                    (start + n + cols - 1) / cols < r0 + h ? (start + n + cols - 1) / cols : r0 + h;
                for (size_t row = first; row < last && status == FSDP_OK; row++) {
                    const size_t off = row * cols + c0;
                    lo = off > start ? off : start;
                    hi = off + w < start + n ? off + w : start + n;
                    if (lo < hi)
                        status = add_run(&ps, &np, &cap, lo, hi,
                                         (const char *)ten->data +
                                             ((row - r0) * w + (lo - off)) * sizeof(float),
                                         r);
                }
                continue;
            }
            cnt = (size_t)ten->numel;
            if (place[0] > numel || cnt > numel - place[0]) {
                snprintf(msg, sizeof(msg),
                         "%s: piece '%s' holds elements [%zu, %zu + %zu) of tensor '%s', which "
                         "has %zu",
                         fname, ten->name, place[0], place[0], cnt, name, numel);
                status = bad_checkpoint(lc, msg);
                break;
            }
            lo = place[0] > start ? place[0] : start;
            hi = place[0] + cnt < start + n ? place[0] + cnt : start + n;
            if (lo < hi)
                status = add_run(&ps, &np, &cap, lo, hi,
                                 (const char *)ten->data + (lo - place[0]) * sizeof(float), r);
        }
    }
    if (status == FSDP_OK && np > 1)
        qsort(ps, (size_t)np, sizeof(*ps), piece_cmp);
    /* the pieces in order tile the range: each starts where the one before ended */
    for (int i = 0; i <= np && status == FSDP_OK; i++) {
        size_t lo = i < np ? ps[i].lo : start + n;
        if (lo > next) {
            snprintf(msg, sizeof(msg),
                     "tensor '%s': elements [%zu, %zu) are in no piece: each element must be in "
                     "exactly one",
                     name, next, lo);
            status = bad_checkpoint(lc, msg);
        } else if (lo < next) {
            snprintf(msg, sizeof(msg),
                     "tensor '%s': elements [%zu, %zu) are in two pieces (of "
                     "rank-%05d.safetensors and rank-%05d.safetensors): each element must be in "
                     "exactly one",
                     name, lo, next < ps[i].hi ? next : ps[i].hi, ps[i - 1].rank, ps[i].rank);
            status = bad_checkpoint(lc, msg);
        } else if (i < np) {
            next = ps[i].hi;
        }
    }
    if (status != FSDP_OK) {
        free(ps);
        return status;
    }
    *pieces_p = ps;
    *npieces_p = np;
    return FSDP_OK;
}

/* Elements [start, start + n) of the flattened tensor `name` (numel elements, cols as
 * find_pieces says) from a sharded checkpoint's pieces, into *data_p (allocated once the pieces
 * are known to hold each element exactly once; the caller frees it). */
static fsdp_status_t read_sharded_range(load_ctx_t *lc, const char *name, size_t numel, size_t cols,
                                        size_t start, size_t n, float **data_p)
{
    piece_t *ps = NULL;
    int np = 0;
    float *dst;
    fsdp_status_t status = find_pieces(lc, name, numel, cols, start, n, &ps, &np);

    if (status != FSDP_OK)
        return status;
    dst = malloc(n * sizeof(float) + 1);
    if (dst == NULL) {
        free(ps);
        return FSDP_ERR_NO_MEMORY;
    }
    for (int i = 0; i < np; i++)
        memcpy(dst + (ps[i].lo - start), ps[i].data, (ps[i].hi - ps[i].lo) * sizeof(float));
    free(ps);
    *data_p = dst;
    return FSDP_OK;
}

/* Fills dst with elements [start, start + n) of tensor `name` (numel elements) of a full
 * checkpoint file. */
static fsdp_status_t read_full_range(load_ctx_t *lc, int file, size_t numel, const char *name,
                                     size_t start, size_t n, float *dst)
{
    fsdp_st_file_t *f;
    const fsdp_st_tensor_t *t;
    fsdp_status_t status;
    char msg[700];

    status = open_file(lc, file, file == 0 ? "model.safetensors" : "optimizer.safetensors", &f);
    if (status != FSDP_OK)
        return status;
    t = fsdp_st_find(f, name);
    if (t == NULL) {
        snprintf(msg, sizeof(msg), "no tensor '%s' in the checkpoint", name);
        return bad_checkpoint(lc, msg);
    }
    if (strcmp(t->dtype, "F32") != 0 || t->numel != numel) {
        snprintf(msg, sizeof(msg), "tensor '%s' is %s with %llu elements; F32 with %zu expected",
                 name, t->dtype, (unsigned long long)t->numel, numel);
        return bad_checkpoint(lc, msg);
    }
    memcpy(dst, (const float *)t->data + start, n * sizeof(float));
    return FSDP_OK;
}

/* This rank's shard of tensor `name` (parameter pi's, or its optimizer buffer `buf`): the
 * numel_in_shard elements from intra_start of pi, which under tensor parallelism is this tp
 * rank's slice of the whole tensor the checkpoint holds (pi->tp_shard). The whole tensor's
 * elements from the shard's first to its last are read, checked (finite, and in range for
 * `buf`) and the shard's picked from them: one run unless the slice is a block of columns.
 * Into *data_p, which the caller frees. */
static fsdp_status_t read_shard(load_ctx_t *lc, int file, const fsdp_param_info_t *pi,
                                const char *name, const char *buf, float **data_p)
{
    const size_t first = pi->intra_start, n = pi->numel_in_shard;
    int64_t shape[FSDP_MAX_DIMS];
    size_t numel, cols, lo, hi;
    float *range = NULL, *dst;
    int tp, t;
    fsdp_status_t status;

    fsdp_ckpt_tp(lc->fs, &tp, &t);
    numel = fsdp_ckpt_whole_shape(pi, tp, shape);
    cols = pi->ndim > 1 && shape[0] > 0 ? numel / (size_t)shape[0] : 0;
    lo = fsdp_ckpt_whole_index(pi, tp, t, first);
    hi = fsdp_ckpt_whole_index(pi, tp, t, first + n - 1) + 1;
    if (lc->type == FSDP_STATE_DICT_SHARDED) {
        status = read_sharded_range(lc, name, numel, cols, lo, hi - lo, &range);
    } else {
        range = malloc((hi - lo) * sizeof(float) + 1);
        status = range == NULL ? FSDP_ERR_NO_MEMORY
                               : read_full_range(lc, file, numel, name, lo, hi - lo, range);
    }
    if (status == FSDP_OK)
        status = finite_or_refuse(lc, name, range, hi - lo, lo);
    if (status == FSDP_OK)
        status = state_in_range(lc, name, buf, range, hi - lo, lo);
    if (status != FSDP_OK || hi - lo == n) {
        *data_p = status == FSDP_OK ? range : NULL;
        if (status != FSDP_OK)
            free(range);
        return status;
    }
    dst = malloc(n * sizeof(float) + 1);
    for (size_t e = 0; dst != NULL && e < n; e++)
        dst[e] = range[fsdp_ckpt_whole_index(pi, tp, t, first + e) - lo];
    free(range);
    *data_p = dst;
    return dst != NULL ? FSDP_OK : FSDP_ERR_NO_MEMORY;
}

/* LOCAL: the unit's flat shards from this rank's own file; the same world and sharding only. */
static fsdp_status_t load_unit_local(load_ctx_t *lc, fsdp_unit_t *u, fsdp_optim_t *opt)
{
    fsdp_t *fs = lc->fs;
    fsdp_dev_t *dev = fsdp_device(fs);
    json_t *ui = json_object_get(json_object_get(lc->meta, "units"), fsdp_unit_name(u));
    size_t n = fsdp_unit_shard_numel(u);
    char fname[64], base[400], msg[600];
    fsdp_st_file_t *f;
    unit_bufs_t b;
    fsdp_status_t status;
    int64_t step = 0;
    int has_buffer = 0;

    const char *api = json_string_value(json_object_get(lc->meta, "api"));

    /* a flat shard of FSDP1 and fully_shard's per-parameter rows are laid out differently,
     * even where their sizes agree */
    if (strcmp(api != NULL ? api : "fsdp1", fsdp_api_name(fsdp_api(fs))) != 0) {
        snprintf(msg, sizeof(msg),
                 "a local checkpoint saved under api %s loads only under the same api, not %s: "
                 "load a sharded or full checkpoint instead, which both read",
                 api != NULL ? api : "fsdp1", fsdp_api_name(fsdp_api(fs)));
        return bad_checkpoint(lc, msg);
    }
    if (lc->old_world != dev->world_size || !json_is_object(ui) ||
        (size_t)json_integer_value(json_object_get(ui, "shard_numel")) != n) {
        snprintf(msg, sizeof(msg),
                 "a local checkpoint (saved on %d ranks) loads only into the same world size and "
                 "sharding; unit '%s' differs: load a sharded or full checkpoint instead",
                 lc->old_world, fsdp_unit_name(u));
        return bad_checkpoint(lc, msg);
    }
    if (opt != NULL) {
        status = meta_opt_step(lc, fsdp_unit_name(u), &step, &has_buffer);
        if (status != FSDP_OK)
            return status;
    }
    snprintf(fname, sizeof(fname), "rank-%05d.safetensors", dev->rank);
    status = open_file(lc, dev->rank, fname, &f);
    if (status == FSDP_OK)
        status = fsdp_ckpt_get_bufs(u, opt, opt != NULL, &b);
    snprintf(base, sizeof(base), "%s.flat_param", fsdp_unit_name(u));
    for (int k = 0; k < b.n && status == FSDP_OK; k++) {
        char name[512];
        const fsdp_st_tensor_t *t;
        fsdp_ckpt_tensor_name(name, sizeof(name), base, b.names[k]);
        t = fsdp_st_find(f, name);
        if (t == NULL || strcmp(t->dtype, "F32") != 0 || t->numel != n) {
            snprintf(msg, sizeof(msg), "tensor '%s' missing, or not %zu F32 elements", name, n);
            return bad_checkpoint(lc, msg);
        }
        snprintf(msg, sizeof(msg), "%s/%s", lc->dir, fname);
        if (fsdp_st_check_finite(t, msg) != FSDP_OK)
            return FSDP_ERR_FORMAT;
        status = state_in_range(lc, name, b.names[k], t->data, n, 0);
        if (status == FSDP_OK)
            status = fsdp_dev_memcpy_async(dev, b.shard[k], t->data, n * sizeof(float),
                                       fsdp_compute_stream(fs));
        if (status == FSDP_OK)
            status = fsdp_dev_stream_synchronize(dev, fsdp_compute_stream(fs));
    }
    if (status == FSDP_OK && opt != NULL)
        status = fsdp_optim_set_unit_step(opt, u, step, has_buffer);
    return status;
}

static fsdp_status_t load_unit(load_ctx_t *lc, fsdp_unit_t *u, fsdp_optim_t *opt)
{
    fsdp_t *fs = lc->fs;
    fsdp_dev_t *dev = fsdp_device(fs);
    unit_bufs_t b;
    fsdp_status_t status;
    int64_t step = 0;
    int has_buffer = 0, have_step = 0;

    if (lc->type == FSDP_STATE_DICT_LOCAL)
        return load_unit_local(lc, u, opt);
    status = fsdp_ckpt_get_bufs(u, opt, opt != NULL, &b);
    for (int j = 0; j < fsdp_unit_num_params(u) && status == FSDP_OK; j++) {
        fsdp_param_info_t pi;
        fsdp_unit_param_info(u, j, &pi);
        if (pi.tied_to >= 0)
            continue;
        if (opt != NULL) {
            status = meta_opt_step(lc, pi.name, &step, &has_buffer);
            if (status != FSDP_OK)
                return status;
            have_step = 1;
        }
        if (!pi.in_shard || pi.numel_in_shard == 0)
            continue;
        for (int k = 0; k < b.n && status == FSDP_OK; k++) {
            char name[512];
            float *tmp = NULL;
            fsdp_ckpt_tensor_name(name, sizeof(name), pi.name, b.names[k]);
            status = read_shard(lc, k == 0 ? 0 : 1, &pi, name, b.names[k], &tmp);
            if (status == FSDP_OK)
                status = fsdp_dev_memcpy_async(dev, b.shard[k] + pi.offset_in_shard, tmp,
                                               pi.numel_in_shard * sizeof(float),
                                               fsdp_compute_stream(fs));
            if (status == FSDP_OK)
                status = fsdp_dev_stream_synchronize(dev, fsdp_compute_stream(fs));
            free(tmp);
        }
    }
    if (status == FSDP_OK && opt != NULL && have_step)
        status = fsdp_optim_set_unit_step(opt, u, step, has_buffer);
    return status;
}

/* The module buffers, whole, from model.safetensors (FULL), rank 0's file (SHARDED) or this
 * rank's own file (LOCAL). */
static fsdp_status_t load_module_buffers(load_ctx_t *lc)
{
    fsdp_t *fs = lc->fs;
    int rank = fsdp_device(fs)->rank;
    int index = lc->type == FSDP_STATE_DICT_LOCAL ? rank : 0;
    char fname[64], msg[700];
    fsdp_status_t status = FSDP_OK;

    if (lc->type == FSDP_STATE_DICT_FULL)
        snprintf(fname, sizeof(fname), "model.safetensors");
    else
        snprintf(fname, sizeof(fname), "rank-%05d.safetensors", index);
    for (int i = 0; i < fsdp_num_units(fs) && status == FSDP_OK; i++) {
        fsdp_unit_t *u = fsdp_unit_at(fs, i);
        for (int j = 0; j < fsdp_unit_num_buffers(u) && status == FSDP_OK; j++) {
            fsdp_param_info_t bi;
            const fsdp_st_tensor_t *t;
            fsdp_st_file_t *f;
            fsdp_unit_buffer_info(u, j, &bi);
            if (index >= lc->nfiles)
                return bad_checkpoint(lc, "a local checkpoint of fewer ranks holds no buffers "
                                          "for this rank");
            status = open_file(lc, index, fname, &f);
            if (status != FSDP_OK)
                return status;
            t = fsdp_st_find(f, bi.name);
            if (t == NULL || strcmp(t->dtype, "F32") != 0 || t->numel != bi.numel) {
                snprintf(msg, sizeof(msg),
                         "buffer '%s' missing from %s, or not %zu F32 "
                         "elements",
                         bi.name, fname, bi.numel);
                return bad_checkpoint(lc, msg);
            }
            snprintf(msg, sizeof(msg), "%s/%s", lc->dir, fname);
            if (fsdp_st_check_finite(t, msg) != FSDP_OK)
                return FSDP_ERR_FORMAT;
            status = fsdp_unit_set_buffer(u, j, t->data);
        }
    }
    return status;
}

static fsdp_status_t read_meta(load_ctx_t *lc, const char *dir)
{
    char path[PATH_MAX], sub[128];
    json_error_t err;
    fsdp_status_t status;
    int64_t v = 0;
    FILE *f;
    json_t *t;

    if (fsdp_ckpt_path_join(path, sizeof(path), dir, "latest") != FSDP_OK)
        return FSDP_ERR_INVALID_PARAM;
    status = fsdp_fs_fopen_read(path, 1, &f);
    if (status == FSDP_ERR_NOT_FOUND)
        fsdp_error("%s: no checkpoint here (cannot read %s: %s)", dir, path, strerror(ENOENT));
    if (status != FSDP_OK)
        return status;
    if (fgets(sub, sizeof(sub), f) == NULL)
        sub[0] = '\0';
    fclose(f);
    sub[strcspn(sub, "\r\n")] = '\0';
    if (sub[0] == '\0' || strchr(sub, '/') != NULL || strcmp(sub, "..") == 0) {
        fsdp_error("%s: malformed latest file", path);
        return FSDP_ERR_FORMAT;
    }
    if (fsdp_ckpt_path_join(lc->dir, sizeof(lc->dir), dir, sub) != FSDP_OK ||
        fsdp_ckpt_path_join(path, sizeof(path), lc->dir, "checkpoint.json") != FSDP_OK)
        return FSDP_ERR_INVALID_PARAM;
    status = fsdp_fs_fopen_read(path, 0, &f);
    if (status != FSDP_OK)
        return status;
    lc->meta = json_loadf(f, JSON_REJECT_DUPLICATES, &err);
    fclose(f);
    if (lc->meta == NULL) {
        fsdp_error("%s: %s (line %d)", path, err.text, err.line);
        return FSDP_ERR_FORMAT;
    }
    t = json_object_get(lc->meta, "format");
    if (!json_is_string(t) || strcmp(json_string_value(t), CKPT_FORMAT) != 0 ||
        json_integer_value(json_object_get(lc->meta, "version")) != CKPT_VERSION)
        return bad_checkpoint(lc, "checkpoint.json is not a libfsdp checkpoint of version 1");
    t = json_object_get(lc->meta, "type");
    if (!json_is_string(t) ||
        !fsdp_state_dict_type_parse(json_string_value(t), (fsdp_state_dict_type_t *)&lc->type))
        return bad_checkpoint(lc, "checkpoint.json has no type full, sharded or local");
    status = meta_int(lc, lc->meta, "", "world_size", 1, 1 << 20, &v);
    lc->old_world = (int)v;
    if (status == FSDP_OK)
        status = meta_int(lc, lc->meta, "", "step", 0, CKPT_STEP_MAX, &lc->step);
    if (status == FSDP_OK && json_object_get(lc->meta, "optimizer") != NULL)
        status = meta_int(lc, lc->meta, "", "optimizer_num_steps", 0, CKPT_STEP_MAX,
                          &lc->optim_num_steps);
    return status;
}

fsdp_status_t fsdp_checkpoint_load(fsdp_t *fs, fsdp_optim_t *opt, const char *dir, int64_t *step_p)
{
    load_ctx_t lc;
    fsdp_status_t status;

    memset(&lc, 0, sizeof(lc));
    lc.fs = fs;
    status = dir ? read_meta(&lc, dir) : FSDP_ERR_INVALID_PARAM;
    if (status == FSDP_OK && lc.type == FSDP_STATE_DICT_LOCAL) {
        /* a local checkpoint's shards are of tp slices: they load only into the same slices;
         * full and sharded ones hold whole tensors, which load at any tp */
        json_t *tp = json_object_get(lc.meta, "tp");
        int saved = json_is_integer(tp) ? (int)json_integer_value(tp) : 1, now;
        fsdp_ckpt_tp(fs, &now, NULL);
        if (saved != now) {
            char msg[200];
            snprintf(msg, sizeof(msg),
                     "a local checkpoint saved at tensor parallelism tp %d loads only at the same "
                     "tp, not %d: save a sharded or full checkpoint instead, which load at any tp",
                     saved, now);
            status = bad_checkpoint(&lc, msg);
        }
    }
    if (status == FSDP_OK && opt != NULL && !json_is_string(json_object_get(lc.meta, "optimizer")))
        status = bad_checkpoint(&lc, "saved without optimizer state; load it without one");
    if (status == FSDP_OK && opt != NULL &&
        strcmp(json_string_value(json_object_get(lc.meta, "optimizer")),
               fsdp_optim_config(opt)->kind == FSDP_OPTIM_ADAMW ? "adamw" : "sgd") != 0)
        status = bad_checkpoint(&lc, "the optimizer differs from the one saved");
    if (status == FSDP_OK) {
        lc.nfiles = lc.type == FSDP_STATE_DICT_FULL ? 2 : lc.old_world;
        lc.files = calloc((size_t)lc.nfiles, sizeof(*lc.files));
        if (lc.files == NULL)
            status = FSDP_ERR_NO_MEMORY;
    }
    for (int i = 0; i < fsdp_num_units(fs) && status == FSDP_OK; i++) {
        fsdp_unit_t *u = fsdp_unit_at(fs, i);
        if (fsdp_unit_has_params(u))
            status = load_unit(&lc, u, opt);
    }
    if (status == FSDP_OK)
        status = load_module_buffers(&lc);
    if (status == FSDP_OK && opt != NULL)
        fsdp_optim_set_num_steps(opt, lc.optim_num_steps);
    if (status == FSDP_OK && step_p != NULL)
        *step_p = lc.step;
    for (int i = 0; lc.files && i < lc.nfiles; i++)
        fsdp_st_close(lc.files[i]);
    free(lc.files);
    json_decref(lc.meta);
    return fsdp_ckpt_agree(fs, status);
}

/* ---- consolidate ---- */

/* A copy of a whole F32 tensor of a checkpoint file into the list. */
static fsdp_status_t list_add_copy(entry_list_t *l, int *ndims, const fsdp_st_tensor_t *t)
{
    float *copy = malloc(t->nbytes + 1);
    fsdp_status_t status;

    if (copy == NULL)
        return FSDP_ERR_NO_MEMORY;
    memcpy(copy, t->data, t->nbytes);
    ndims[l->n] = t->ndim;
    status = fsdp_ckpt_list_add(l, t->name, t->ndim, t->shape, copy);
    if (status != FSDP_OK)
        free(copy);
    return status;
}

/* SHARDED: every parameter of checkpoint.json from its pieces, then rank 0's module buffers
 * (its tensors with no @offset). */
static fsdp_status_t consolidate_sharded(load_ctx_t *lc, entry_list_t *l, int *ndims)
{
    json_t *params = json_object_get(lc->meta, "params"), *p;
    fsdp_st_file_t *f0;
    fsdp_status_t status;
    const char *name;

    if (!json_is_object(params))
        return bad_checkpoint(lc, "checkpoint.json has no params");
    json_object_foreach (params, name, p) {
        json_t *shape = json_object_get(p, "shape"), *jn = json_object_get(p, "numel");
        int64_t dims[FSDP_MAX_DIMS];
        size_t numel = 0, n = 1;
        int ndim = (int)json_array_size(shape), bad = !json_is_integer(jn);
        float *full = NULL;
        if (!json_is_array(shape) || ndim > FSDP_MAX_DIMS)
            return bad_checkpoint(lc, "a parameter of checkpoint.json has no valid shape");
        for (int d = 0; d < ndim; d++) {
            json_t *jd = json_array_get(shape, (size_t)d);
            dims[d] = json_integer_value(jd);
            bad |= !json_is_integer(jd) || dims[d] < 0 ||
                   __builtin_mul_overflow(n, (size_t)dims[d], &n);
        }
        if (!bad && json_integer_value(jn) >= 0)
            numel = (size_t)json_integer_value(jn);
        if (bad || json_integer_value(jn) < 0 || n != numel)
            return bad_checkpoint(lc, "a parameter's numel is not the product of its shape");
        /* the pieces are checked before the tensor is allocated: a damaged numel costs nothing */
        status = read_sharded_range(lc, name, numel,
                                    ndim > 1 && dims[0] > 0 ? numel / (size_t)dims[0] : 0, 0, numel,
                                    &full);
        ndims[l->n] = ndim;
        if (status == FSDP_OK)
            status = fsdp_ckpt_list_add(l, name, ndim, dims, full);
        if (status != FSDP_OK) {
            free(full);
            return status;
        }
    }
    status = open_file(lc, 0, "rank-00000.safetensors", &f0);
    for (int t = 0; t < fsdp_st_num_tensors(f0) && status == FSDP_OK; t++) {
        const fsdp_st_tensor_t *ten = fsdp_st_tensor_at(f0, t);
        if (strchr(ten->name, '@') == NULL)
            status = list_add_copy(l, ndims, ten);
    }
    return status;
}

fsdp_status_t fsdp_checkpoint_consolidate(const char *dir, const char *out_path, int64_t *step_p)
{
    static const char *const pt[] = {"format", "pt"};
    entry_list_t l = {0};
    int *ndims = NULL;
    load_ctx_t lc;
    fsdp_status_t status;

    memset(&lc, 0, sizeof(lc));
    if (dir == NULL || out_path == NULL) {
        fsdp_error("consolidate: a checkpoint directory and an output file are needed");
        return FSDP_ERR_INVALID_PARAM;
    }
    status = read_meta(&lc, dir);
    if (status == FSDP_OK && lc.type == FSDP_STATE_DICT_LOCAL)
        status = bad_checkpoint(&lc, "a local checkpoint holds flat shards without parameter "
                                     "names; only a full or sharded one consolidates");
    if (status == FSDP_OK) {
        lc.nfiles = lc.type == FSDP_STATE_DICT_FULL ? 2 : lc.old_world;
        lc.files = calloc((size_t)lc.nfiles, sizeof(*lc.files));
        if (lc.files == NULL)
            status = FSDP_ERR_NO_MEMORY;
    }
    if (status == FSDP_OK && lc.type == FSDP_STATE_DICT_FULL) {
        fsdp_st_file_t *f;
        status = open_file(&lc, 0, "model.safetensors", &f);
        if (status == FSDP_OK) {
            ndims = calloc((size_t)fsdp_st_num_tensors(f) + 1, sizeof(int));
            status = ndims != NULL ? FSDP_OK : FSDP_ERR_NO_MEMORY;
        }
        for (int t = 0; status == FSDP_OK && t < fsdp_st_num_tensors(f); t++)
            status = list_add_copy(&l, ndims, fsdp_st_tensor_at(f, t));
    } else if (status == FSDP_OK) {
        fsdp_st_file_t *f0;
        size_t n = json_object_size(json_object_get(lc.meta, "params"));
        status = open_file(&lc, 0, "rank-00000.safetensors", &f0);
        if (status == FSDP_OK) {
            ndims = calloc(n + (size_t)fsdp_st_num_tensors(f0) + 1, sizeof(int));
            status = ndims != NULL ? FSDP_OK : FSDP_ERR_NO_MEMORY;
        }
        if (status == FSDP_OK)
            status = consolidate_sharded(&lc, &l, ndims);
    }
    if (status == FSDP_OK) {
        fsdp_ckpt_list_finish(&l, ndims);
        status = fsdp_st_write(out_path, l.e, l.n, pt, 1);
    }
    if (status == FSDP_OK && step_p != NULL)
        *step_p = json_integer_value(json_object_get(lc.meta, "step"));
    if (status == FSDP_ERR_NO_MEMORY)
        fsdp_error("consolidate: out of host memory");
    free(ndims);
    fsdp_ckpt_list_free(&l);
    for (int i = 0; lc.files && i < lc.nfiles; i++)
        fsdp_st_close(lc.files[i]);
    free(lc.files);
    json_decref(lc.meta);
    return status;
}
