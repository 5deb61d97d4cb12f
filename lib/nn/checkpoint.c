/* Checkpoints of a model and its optimizer: FULL (one file of plain names) and SHARDED (a file
 * per rank plus an index), with atomic commits. This file writes them, and holds what the
 * reader (checkpoint_load.c) shares with it (ckpt_int.h). */
#include <fsdp/checkpoint.h>
#include <fsdp/log.h>
#include <fsdp/safetensors.h>

#include "io/fs.h"
#include "nn/ckpt_int.h"
#include "nn/nn_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *fsdp_state_dict_type_name(fsdp_state_dict_type_t type)
{
    return type == FSDP_STATE_DICT_SHARDED ? "sharded"
           : type == FSDP_STATE_DICT_LOCAL ? "local"
                                           : "full";
}

int fsdp_state_dict_type_parse(const char *s, fsdp_state_dict_type_t *type_p)
{
    if (strcmp(s, "full") == 0)
        *type_p = FSDP_STATE_DICT_FULL;
    else if (strcmp(s, "sharded") == 0)
        *type_p = FSDP_STATE_DICT_SHARDED;
    else if (strcmp(s, "local") == 0)
        *type_p = FSDP_STATE_DICT_LOCAL;
    else
        return 0;
    return 1;
}

/* ---- small file-system helpers ---- */

/* out = a/b; FSDP_ERR_INVALID_PARAM when it does not fit. */
fsdp_status_t fsdp_ckpt_path_join(char *out, size_t len, const char *a, const char *b)
{
    int n = snprintf(out, len, "%s/%s", a, b);
    if (n < 0 || (size_t)n >= len) {
        fsdp_error("path too long: %s/%s", a, b);
        return FSDP_ERR_INVALID_PARAM;
    }
    return FSDP_OK;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static int rm_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? 0 : -1;
    return nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Removes dir's step-N.tmp directories: the unfinished saves of a killed run (the one run that
 * saves into dir at a time is this one, fsdp-train's lock says; its own saves are done). */
static void remove_stale_saves(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;

    if (d == NULL)
        return;
    while ((e = readdir(d)) != NULL) {
        const char *p = e->d_name;
        char path[PATH_MAX];
        size_t len = strlen(p);
        if (strncmp(p, "step-", 5) != 0 || len < 10 || strcmp(p + len - 4, ".tmp") != 0 ||
            strspn(p + 5, "0123456789") != len - 9)
            continue;
        if (fsdp_ckpt_path_join(path, sizeof(path), dir, p) != FSDP_OK)
            continue;
        if (rm_tree(path) == 0)
            fsdp_info("%s: removed, an unfinished save of a run that was stopped", path);
        else
            fsdp_warn("%s: cannot remove this unfinished save: %s", path, strerror(errno));
    }
    closedir(d);
}

/* Writes a small text file atomically (dir/name). */
static fsdp_status_t write_atomic(const char *dir, const char *name, const char *text)
{
    fsdp_fs_chunk_t chunk = {text, strlen(text)};
    char path[PATH_MAX];

    if (fsdp_ckpt_path_join(path, sizeof(path), dir, name) != FSDP_OK)
        return FSDP_ERR_INVALID_PARAM;
    return fsdp_fs_write_atomic(path, &chunk, 1);
}

/* ---- the parts of a unit that a checkpoint holds ---- */

fsdp_status_t fsdp_ckpt_get_bufs(fsdp_unit_t *u, fsdp_optim_t *opt, int allocate, unit_bufs_t *b)
{
    fsdp_optim_state_view_t view;
    fsdp_status_t status;

    memset(b, 0, sizeof(*b));
    b->n = 1;
    b->shard[0] = fsdp_unit_local_shard(u);
    if (opt == NULL)
        return FSDP_OK;
    status = fsdp_optim_unit_state_view(opt, u, allocate, &view);
    if (status != FSDP_OK)
        return status;
    b->step = view.step;
    b->has_buffer = view.has_buffer;
    for (int i = 0; i < view.nbuf && view.buf[i] != NULL; i++) {
        b->names[b->n] = view.names[i];
        b->shard[b->n++] = view.buf[i];
    }
    return FSDP_OK;
}

void fsdp_ckpt_tp(fsdp_t *fs, int *tp_p, int *rank_p)
{
    const fsdp_group_t *g = fsdp_tp_group(fs);

    *tp_p = g != NULL ? g->size : 1;
    if (rank_p != NULL)
        *rank_p = g != NULL ? g->rank : 0;
}

size_t fsdp_ckpt_whole_shape(const fsdp_param_info_t *pi, int tp, int64_t *shape)
{
    for (int d = 0; d < pi->ndim; d++)
        shape[d] = pi->shape[d];
    if (pi->tp_shard != 0 && pi->ndim > 0)
        shape[pi->tp_shard < 0 ? 0 : pi->ndim - 1] *= tp;
    return pi->tp_shard != 0 ? pi->numel * (size_t)tp : pi->numel;
}

size_t fsdp_ckpt_whole_index(const fsdp_param_info_t *pi, int tp, int t, size_t e)
{
    const size_t cols = pi->ndim > 1 ? (size_t)pi->shape[pi->ndim - 1] : pi->numel;

    return tp > 1 ? fsdp_nn_slice_index(e, pi->numel, cols, pi->tp_shard, tp, t) : e;
}

void fsdp_ckpt_tensor_name(char *out, size_t len, const char *param, const char *buf)
{
    if (buf == NULL)
        snprintf(out, len, "%s", param);
    else
        snprintf(out, len, "state.%s.%s", param, buf);
}

/* Every rank of the world agrees on success: a failure anywhere fails everywhere. */
fsdp_status_t fsdp_ckpt_agree(fsdp_t *fs, fsdp_status_t status)
{
    fsdp_dev_t *dev = fsdp_device(fs);
    fsdp_group_t *world = fsdp_dev_group_world(dev);
    int32_t mine = status != FSDP_OK, any = 0;
    void *d = NULL;
    fsdp_status_t st;

    if (dev->no_data)
        return status;
    st = fsdp_mem_alloc(fsdp_memory(fs), sizeof(int32_t), FSDP_MEM_TEMPORARY,
                        fsdp_compute_stream(fs), &d);
    if (st == FSDP_OK)
        st = fsdp_dev_memcpy_async(dev, d, &mine, sizeof(mine), fsdp_compute_stream(fs));
    if (st == FSDP_OK)
        st = fsdp_dev_all_reduce(dev, world, d, d, 1, FSDP_DTYPE_I32, FSDP_REDUCE_MAX,
                                 fsdp_compute_stream(fs));
    if (st == FSDP_OK)
        st = fsdp_dev_memcpy_async(dev, &any, d, sizeof(any), fsdp_compute_stream(fs));
    if (st == FSDP_OK)
        st = fsdp_dev_stream_synchronize(dev, fsdp_compute_stream(fs));
    fsdp_mem_free(fsdp_memory(fs), d);
    if (status != FSDP_OK)
        return status;
    if (st != FSDP_OK)
        return st;
    return any ? FSDP_ERR_RANK_FAILED : FSDP_OK;
}

/* ---- save ---- */

fsdp_status_t fsdp_ckpt_list_add(entry_list_t *l, const char *name, int ndim, const int64_t *shape,
                              float *data)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        void *e = realloc(l->e, sizeof(*l->e) * (size_t)cap);
        void *names = e ? realloc(l->names, sizeof(char *) * (size_t)cap) : NULL;
        void *datas = names ? realloc(l->data, sizeof(float *) * (size_t)cap) : NULL;
        void *shapes =
            datas ? realloc(l->shapes, sizeof(int64_t) * FSDP_MAX_DIMS * (size_t)cap) : NULL;
        if (e)
            l->e = e;
        if (names)
            l->names = names;
        if (datas)
            l->data = datas;
        if (shapes == NULL)
            return FSDP_ERR_NO_MEMORY;
        l->shapes = shapes;
        l->cap = cap;
    }
    l->names[l->n] = strdup(name);
    if (l->names[l->n] == NULL)
        return FSDP_ERR_NO_MEMORY;
    l->data[l->n] = data;
    memcpy(&l->shapes[FSDP_MAX_DIMS * l->n], shape, sizeof(int64_t) * (size_t)ndim);
    l->n++;
    return FSDP_OK;
}

void fsdp_ckpt_list_finish(entry_list_t *l, int ndims[])
{
    for (int i = 0; i < l->n; i++) {
        l->e[i].name = l->names[i];
        l->e[i].dtype = "F32";
        l->e[i].ndim = ndims[i];
        l->e[i].shape = &l->shapes[FSDP_MAX_DIMS * i];
        l->e[i].data = l->data[i];
    }
}

void fsdp_ckpt_list_free(entry_list_t *l)
{
    for (int i = 0; i < l->n; i++) {
        free(l->names[i]);
        free(l->data[i]);
    }
    free(l->e);
    free(l->names);
    free(l->data);
    free(l->shapes);
}

/* Every module buffer, whole and in f32 (state dicts hold buffers in full precision). */
static fsdp_status_t add_module_buffers(fsdp_t *fs, entry_list_t *l)
{
    fsdp_status_t status = FSDP_OK;

    for (int i = 0; i < fsdp_num_units(fs) && status == FSDP_OK; i++) {
        fsdp_unit_t *u = fsdp_unit_at(fs, i);
        for (int j = 0; j < fsdp_unit_num_buffers(u) && status == FSDP_OK; j++) {
            fsdp_param_info_t bi;
            float *copy;
            fsdp_unit_buffer_info(u, j, &bi);
            copy = malloc(bi.numel * sizeof(float) + 1);
            if (copy == NULL)
                return FSDP_ERR_NO_MEMORY;
            status = fsdp_unit_get_buffer(u, j, copy);
            if (status == FSDP_OK)
                status = fsdp_ckpt_list_add(l, bi.name, bi.ndim, bi.shape, copy);
            if (status != FSDP_OK)
                free(copy);
        }
    }
    return status;
}

/* The dimension count of the list's module buffers (entries named as a buffer). */
static void module_buffer_dims(fsdp_t *fs, const entry_list_t *l, int *dims)
{
    for (int i = 0; i < fsdp_num_units(fs); i++) {
        fsdp_unit_t *u = fsdp_unit_at(fs, i);
        for (int j = 0; j < fsdp_unit_num_buffers(u); j++) {
            fsdp_param_info_t bi;
            fsdp_unit_buffer_info(u, j, &bi);
            for (int e = 0; e < l->n; e++) {
                if (strcmp(l->names[e], bi.name) == 0)
                    dims[e] = bi.ndim;
            }
        }
    }
}

/* FULL: gather every buffer (over dp, then over tp, whose slices rank 0 puts together); rank 0
 * writes model.safetensors and optimizer.safetensors. */
static fsdp_status_t save_full(fsdp_t *fs, fsdp_optim_t *opt, const char *tmpdir, json_t *meta)
{
    int rank = fsdp_device(fs)->rank, tp;
    entry_list_t model = {0}, optim = {0};
    int *mdims = NULL, *odims = NULL;
    json_t *steps = json_object();
    fsdp_status_t status = FSDP_OK;

    fsdp_ckpt_tp(fs, &tp, NULL);
    for (int i = 0; i < fsdp_num_units(fs) && status == FSDP_OK; i++) {
        fsdp_unit_t *u = fsdp_unit_at(fs, i);
        const size_t n = fsdp_unit_flat_numel(u);
        unit_bufs_t b;
        float *full[3] = {NULL, NULL, NULL};
        if (!fsdp_unit_has_params(u))
            continue;
        status = fsdp_ckpt_get_bufs(u, opt, 0, &b);
        for (int k = 0; k < b.n && status == FSDP_OK; k++) {
            full[k] = malloc(fsdp_unit_flat_numel(u) * sizeof(float) + 1);
            status = full[k] ? fsdp_unit_gather_buffer(u, b.shard[k], full[k]) : FSDP_ERR_NO_MEMORY;
            if (status == FSDP_OK && tp > 1) { /* and every tp rank's slices, put together below */
                float *all = malloc((size_t)tp * n * sizeof(float) + 1);
                status = all != NULL ? fsdp_nn_tp_gather(fs, full[k], n, all) : FSDP_ERR_NO_MEMORY;
                free(full[k]);
                full[k] = all;
            }
        }
        for (int j = 0; j < fsdp_unit_num_params(u) && status == FSDP_OK && rank == 0; j++) {
            fsdp_param_info_t pi;
            fsdp_unit_param_info(u, j, &pi);
            if (pi.tied_to >= 0)
                continue; /* stored once, under the first name */
            for (int k = 0; k < b.n && status == FSDP_OK; k++) {
                char name[512];
                int64_t shape[FSDP_MAX_DIMS];
                float *copy = NULL;
                fsdp_ckpt_whole_shape(&pi, tp, shape);
                if (tp > 1) {
                    status = fsdp_nn_tp_assemble(&pi, full[k], n, tp, pi.tp_shard, &copy, shape);
                } else if ((copy = malloc(pi.numel * sizeof(float) + 1)) != NULL) {
                    memcpy(copy, full[k] + pi.offset, pi.numel * sizeof(float));
                } else {
                    status = FSDP_ERR_NO_MEMORY;
                }
                if (status != FSDP_OK)
                    break;
                fsdp_ckpt_tensor_name(name, sizeof(name), pi.name, b.names[k]);
                status = fsdp_ckpt_list_add(k == 0 ? &model : &optim, name, pi.ndim, shape, copy);
                if (status != FSDP_OK)
                    free(copy);
            }
            if (opt != NULL) {
                json_object_set_new(steps, pi.name,
                                    json_pack("{s:I, s:b}", "step", (json_int_t)b.step,
                                              "has_buffer", b.has_buffer));
            }
        }
        for (int k = 0; k < 3; k++)
            free(full[k]);
    }
    if (status == FSDP_OK && rank == 0)
        status = add_module_buffers(fs, &model);
    if (status == FSDP_OK && rank == 0) {
        char path[PATH_MAX];
        static const char *const pt[] = {"format", "pt"};
        mdims = calloc((size_t)model.n + 1, sizeof(int));
        odims = calloc((size_t)optim.n + 1, sizeof(int));
        if (mdims == NULL || odims == NULL)
            status = FSDP_ERR_NO_MEMORY;
        /* ndim from the shapes recorded: find each name's parameter again */
        for (int i = 0; i < fsdp_num_units(fs) && status == FSDP_OK; i++) {
            fsdp_unit_t *u = fsdp_unit_at(fs, i);
            for (int j = 0; j < fsdp_unit_num_params(u); j++) {
                fsdp_param_info_t pi;
                fsdp_unit_param_info(u, j, &pi);
                for (int e = 0; e < model.n; e++)
                    if (strcmp(model.names[e], pi.name) == 0)
                        mdims[e] = pi.ndim;
                for (int e = 0; e < optim.n; e++) {
                    size_t len = strlen(pi.name);
                    if (strncmp(optim.names[e] + 6, pi.name, len) == 0 &&
                        optim.names[e][6 + len] == '.')
                        odims[e] = pi.ndim;
                }
            }
        }
        if (status == FSDP_OK) {
            module_buffer_dims(fs, &model, mdims);
            fsdp_ckpt_list_finish(&model, mdims);
            status = fsdp_ckpt_path_join(path, sizeof(path), tmpdir, "model.safetensors");
            if (status == FSDP_OK)
                status = fsdp_st_write(path, model.e, model.n, pt, 1);
        }
        if (status == FSDP_OK && opt != NULL) {
            fsdp_ckpt_list_finish(&optim, odims);
            status = fsdp_ckpt_path_join(path, sizeof(path), tmpdir, "optimizer.safetensors");
            if (status == FSDP_OK)
                status = fsdp_st_write(path, optim.e, optim.n, pt, 1);
        }
    }
    json_object_set_new(meta, "optimizer_steps", steps);
    free(mdims);
    free(odims);
    fsdp_ckpt_list_free(&model);
    fsdp_ckpt_list_free(&optim);
    return status;
}

/* The pieces of one tensor of this rank (host copy `data` of parameter pi's shard, or of an
 * optimizer buffer of it, named `name`) into l, each named for its place in the whole tensor:
 * `<name>@<offset>` a 1-d run of the flattened whole tensor, `<name>@<row>,<col>` a 2-d block of
 * it. Without tensor parallelism, and for a tp slice of rows, the shard is one run; a tp slice
 * of columns is one 2-d block a column block (GPT-2's c_attn: q, k and v), or for a 1-d tensor
 * one run a block. Takes data (freed on failure). */
static fsdp_status_t add_pieces(entry_list_t *l, const fsdp_param_info_t *pi, int tp, int t,
                                const char *name, float *data)
{
    const size_t first = pi->intra_start, n = pi->numel_in_shard;
    char pname[600];
    fsdp_status_t status = FSDP_OK;

    if (tp > 1 && pi->tp_shard > 0 && pi->ndim == 2) {
        const size_t c = (size_t)pi->shape[1], w = c / (size_t)pi->tp_shard, rows = n / c;
        int64_t shape[2] = {(int64_t)rows, (int64_t)w};
        for (int blk = 0; blk < pi->tp_shard && status == FSDP_OK; blk++) {
            const size_t at = fsdp_ckpt_whole_index(pi, tp, t, first + (size_t)blk * w);
            const size_t cols = c * (size_t)tp;
            float *piece = malloc(rows * w * sizeof(float) + 1);
            if (piece == NULL) {
                status = FSDP_ERR_NO_MEMORY;
                break;
            }
            for (size_t r = 0; r < rows; r++)
                memcpy(piece + r * w, data + r * c + (size_t)blk * w, w * sizeof(float));
            snprintf(pname, sizeof(pname), "%s@%zu,%zu", name, at / cols, at % cols);
            status = fsdp_ckpt_list_add(l, pname, 2, shape, piece);
            if (status != FSDP_OK)
                free(piece);
        }
        free(data);
        return status;
    }
    for (size_t e = 0, run; e < n && status == FSDP_OK; e += run) {
        const size_t at = fsdp_ckpt_whole_index(pi, tp, t, first + e);
        int64_t len;
        float *piece;
        for (run = 1; e + run < n && fsdp_ckpt_whole_index(pi, tp, t, first + e + run) == at + run;)
            run++;
        len = (int64_t)run;
        if (e == 0 && run == n) { /* the whole shard: no copy */
            piece = data;
            data = NULL;
        } else if ((piece = malloc(run * sizeof(float) + 1)) != NULL) {
            memcpy(piece, data + e, run * sizeof(float));
        } else {
            status = FSDP_ERR_NO_MEMORY;
            break;
        }
        snprintf(pname, sizeof(pname), "%s@%zu", name, at);
        status = fsdp_ckpt_list_add(l, pname, 1, &len, piece);
        if (status != FSDP_OK)
            free(piece);
    }
    free(data);
    return status;
}

/* Whether this rank writes unit u's pieces: each element of a tensor is in exactly one piece, so
 * of the ranks that hold the same shard the first writes it (torch's DCP writes a replicated
 * tensor once too): under hybrid sharding the first replica, under NO_SHARD the first rank. */
static int first_holder(fsdp_unit_t *u)
{
    const fsdp_group_t *rep = fsdp_unit_replicate_group(u), *pg = fsdp_unit_shard_group(u);

    if (rep != NULL && rep->rank != 0)
        return 0;
    return fsdp_unit_strategy(u) != FSDP_NO_SHARD || pg == NULL || pg->rank == 0;
}

/* SHARDED: every rank writes the pieces of its shard, of the ranks holding the same shard the
 * first (first_holder); under tensor parallelism a replicated parameter's by the first tp rank. */
static fsdp_status_t save_sharded(fsdp_t *fs, fsdp_optim_t *opt, const char *tmpdir, json_t *meta)
{
    fsdp_dev_t *dev = fsdp_device(fs);
    entry_list_t pieces = {0};
    int *dims = NULL, tp, trank;
    json_t *params = json_object(), *steps = json_object();
    fsdp_status_t status = FSDP_OK;

    fsdp_ckpt_tp(fs, &tp, &trank);
    for (int i = 0; i < fsdp_num_units(fs) && status == FSDP_OK; i++) {
        fsdp_unit_t *u = fsdp_unit_at(fs, i);
        unit_bufs_t b;
        if (!fsdp_unit_has_params(u))
            continue;
        status = fsdp_ckpt_get_bufs(u, opt, 0, &b);
        for (int j = 0; j < fsdp_unit_num_params(u) && status == FSDP_OK; j++) {
            fsdp_param_info_t pi;
            int64_t whole[FSDP_MAX_DIMS];
            size_t numel;
            json_t *shape = json_array();
            fsdp_unit_param_info(u, j, &pi);
            if (pi.tied_to >= 0) {
                json_decref(shape);
                continue;
            }
            numel = fsdp_ckpt_whole_shape(&pi, tp, whole);
            for (int d = 0; d < pi.ndim; d++)
                json_array_append_new(shape, json_integer(whole[d]));
            json_object_set_new(
                params, pi.name,
                json_pack("{s:o, s:I}", "shape", shape, "numel", (json_int_t)numel));
            if (opt != NULL)
                json_object_set_new(steps, pi.name,
                                    json_pack("{s:I, s:b}", "step", (json_int_t)b.step,
                                              "has_buffer", b.has_buffer));
            if (!pi.in_shard || pi.numel_in_shard == 0 || (pi.tp_shard == 0 && trank != 0) ||
                !first_holder(u))
                continue;
            for (int k = 0; k < b.n && status == FSDP_OK; k++) {
                char name[512];
                float *copy = malloc(pi.numel_in_shard * sizeof(float));
                if (copy == NULL) {
                    status = FSDP_ERR_NO_MEMORY;
                    break;
                }
                status = fsdp_dev_memcpy_async(dev, copy, b.shard[k] + pi.offset_in_shard,
                                               pi.numel_in_shard * sizeof(float),
                                               fsdp_compute_stream(fs));
                if (status == FSDP_OK)
                    status = fsdp_dev_stream_synchronize(dev, fsdp_compute_stream(fs));
                fsdp_ckpt_tensor_name(name, sizeof(name), pi.name, b.names[k]);
                if (status == FSDP_OK)
                    status = add_pieces(&pieces, &pi, tp, trank, name, copy);
                else
                    free(copy);
            }
        }
    }
    /* buffers are not sharded: rank 0's file holds them whole */
    if (status == FSDP_OK && dev->rank == 0)
        status = add_module_buffers(fs, &pieces);
    if (status == FSDP_OK) {
        char path[PATH_MAX], fname[64];
        dims = calloc((size_t)pieces.n + 1, sizeof(int));
        if (dims == NULL) {
            status = FSDP_ERR_NO_MEMORY;
        } else {
            /* a piece's name says its dimensions: <name>@<row>,<col> is 2-d */
            for (int e = 0; e < pieces.n; e++) {
                const char *at = strrchr(pieces.names[e], '@');
                dims[e] = at != NULL && strchr(at, ',') != NULL ? 2 : 1;
            }
            module_buffer_dims(fs, &pieces, dims);
            fsdp_ckpt_list_finish(&pieces, dims);
            snprintf(fname, sizeof(fname), "rank-%05d.safetensors", dev->rank);
            status = fsdp_ckpt_path_join(path, sizeof(path), tmpdir, fname);
            if (status == FSDP_OK)
                status = fsdp_st_write(path, pieces.e, pieces.n, NULL, 0);
        }
    }
    json_object_set_new(meta, "params", params);
    json_object_set_new(meta, "optimizer_steps", steps);
    free(dims);
    fsdp_ckpt_list_free(&pieces);
    return status;
}

/* LOCAL: every rank writes its flat shards as they are. */
static fsdp_status_t save_local(fsdp_t *fs, fsdp_optim_t *opt, const char *tmpdir, json_t *meta)
{
    fsdp_dev_t *dev = fsdp_device(fs);
    entry_list_t flat = {0};
    int *dims = NULL;
    json_t *units = json_object(), *steps = json_object();
    fsdp_status_t status = FSDP_OK;

    for (int i = 0; i < fsdp_num_units(fs) && status == FSDP_OK; i++) {
        fsdp_unit_t *u = fsdp_unit_at(fs, i);
        size_t n = fsdp_unit_shard_numel(u);
        int64_t len = (int64_t)n;
        unit_bufs_t b;
        char base[400];
        if (!fsdp_unit_has_params(u))
            continue;
        status = fsdp_ckpt_get_bufs(u, opt, 0, &b);
        snprintf(base, sizeof(base), "%s.flat_param", fsdp_unit_name(u));
        json_object_set_new(units, fsdp_unit_name(u),
                            json_pack("{s:I}", "shard_numel", (json_int_t)n));
        if (opt != NULL)
            json_object_set_new(
                steps, fsdp_unit_name(u),
                json_pack("{s:I, s:b}", "step", (json_int_t)b.step, "has_buffer", b.has_buffer));
        for (int k = 0; k < b.n && status == FSDP_OK; k++) {
            char name[512];
            float *copy = malloc(n * sizeof(float) + 1);
            if (copy == NULL) {
                status = FSDP_ERR_NO_MEMORY;
                break;
            }
            status = fsdp_dev_memcpy_async(dev, copy, b.shard[k], n * sizeof(float),
                                           fsdp_compute_stream(fs));
            if (status == FSDP_OK)
                status = fsdp_dev_stream_synchronize(dev, fsdp_compute_stream(fs));
            fsdp_ckpt_tensor_name(name, sizeof(name), base, b.names[k]);
            if (status == FSDP_OK)
                status = fsdp_ckpt_list_add(&flat, name, 1, &len, copy);
            if (status != FSDP_OK)
                free(copy);
        }
    }
    /* every rank's own buffers, as PyTorch's local state dict holds them */
    if (status == FSDP_OK)
        status = add_module_buffers(fs, &flat);
    if (status == FSDP_OK) {
        char path[PATH_MAX], fname[64];
        dims = calloc((size_t)flat.n + 1, sizeof(int));
        if (dims == NULL) {
            status = FSDP_ERR_NO_MEMORY;
        } else {
            for (int e = 0; e < flat.n; e++)
                dims[e] = 1;
            module_buffer_dims(fs, &flat, dims);
            fsdp_ckpt_list_finish(&flat, dims);
            snprintf(fname, sizeof(fname), "rank-%05d.safetensors", dev->rank);
            status = fsdp_ckpt_path_join(path, sizeof(path), tmpdir, fname);
            if (status == FSDP_OK)
                status = fsdp_st_write(path, flat.e, flat.n, NULL, 0);
        }
    }
    json_object_set_new(meta, "units", units);
    json_object_set_new(meta, "optimizer_steps", steps);
    free(dims);
    fsdp_ckpt_list_free(&flat);
    return status;
}

/* After a failed save (every rank done with it): removes what it wrote, so a full disk is not
 * left fuller, and says what the directory still holds. */
static void save_failed(const char *dir, const char *tmpdir, int64_t step)
{
    char path[PATH_MAX], latest[80] = "";
    FILE *f;

    if (rm_tree(tmpdir) != 0)
        fsdp_warn("%s: cannot remove the failed save: %s", tmpdir, strerror(errno));
    if (fsdp_ckpt_path_join(path, sizeof(path), dir, "latest") == FSDP_OK &&
        fsdp_fs_fopen_read(path, 1, &f) == FSDP_OK) {
        if (fgets(latest, sizeof(latest), f) == NULL)
            latest[0] = '\0';
        latest[strcspn(latest, "\n")] = '\0';
        fclose(f);
    }
    if (latest[0] != '\0')
        fsdp_error("%s: the checkpoint of step %lld is not saved; latest is still %s", dir,
                   (long long)step, latest);
    else
        fsdp_error("%s: the checkpoint of step %lld is not saved; the directory holds none", dir,
                   (long long)step);
}

fsdp_status_t fsdp_checkpoint_save(fsdp_t *fs, fsdp_optim_t *opt, const char *dir,
                                   fsdp_state_dict_type_t type, int64_t step)
{
    fsdp_dev_t *dev = fsdp_device(fs);
    fsdp_group_t *world = fsdp_dev_group_world(dev);
    char sub[64], tmpdir[PATH_MAX], final[PATH_MAX];
    json_t *meta = json_object();
    fsdp_status_t status = FSDP_OK;

    if (dir == NULL || step < 0 ||
        (type != FSDP_STATE_DICT_FULL && type != FSDP_STATE_DICT_SHARDED &&
         type != FSDP_STATE_DICT_LOCAL)) {
        fsdp_error("checkpoint save: a directory, a step >= 0 and a type full or sharded are "
                   "required");
        json_decref(meta);
        return FSDP_ERR_INVALID_PARAM;
    }
    snprintf(sub, sizeof(sub), "step-%08lld", (long long)step);
    status = fsdp_ckpt_path_join(final, sizeof(final), dir, sub);
    if (status == FSDP_OK && strlen(final) + 5 > sizeof(tmpdir))
        status = FSDP_ERR_INVALID_PARAM;
    if (status != FSDP_OK) {
        json_decref(meta);
        return status;
    }
    memcpy(tmpdir, final, strlen(final));
    strcpy(tmpdir + strlen(final), ".tmp");
    if (dev->rank == 0) {
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            fsdp_error("%s: cannot create the checkpoint directory: %s", dir, strerror(errno));
            status = FSDP_ERR_IO;
        }
        if (status == FSDP_OK)
            remove_stale_saves(dir);
        if (status == FSDP_OK && (rm_tree(tmpdir) != 0 || mkdir(tmpdir, 0755) != 0)) {
            fsdp_error("%s: cannot create: %s", tmpdir, strerror(errno));
            status = FSDP_ERR_IO;
        }
    }
    status = fsdp_ckpt_agree(fs, status); /* the directory exists for everybody */
    if (status == FSDP_OK)
        status = type == FSDP_STATE_DICT_FULL    ? save_full(fs, opt, tmpdir, meta)
                 : type == FSDP_STATE_DICT_LOCAL ? save_local(fs, opt, tmpdir, meta)
                                                 : save_sharded(fs, opt, tmpdir, meta);
    status = fsdp_ckpt_agree(fs, status); /* every rank's files are written */
    if (status == FSDP_OK && dev->rank == 0) {
        char *text;
        /* test hook: die between writing the files and committing them */
        const char *crash = getenv("FSDP_TEST_CRASH_IN_CHECKPOINT_SAVE");
        if (crash != NULL && crash[0] == '1')
            raise(SIGKILL);
        json_object_set_new(meta, "format", json_string(CKPT_FORMAT));
        json_object_set_new(meta, "version", json_integer(CKPT_VERSION));
        json_object_set_new(meta, "type", json_string(fsdp_state_dict_type_name(type)));
        json_object_set_new(meta, "step", json_integer(step));
        json_object_set_new(meta, "world_size", json_integer(world->size));
        if (fsdp_tp_group(fs) != NULL)
            json_object_set_new(meta, "tp", json_integer(fsdp_tp_group(fs)->size));
        json_object_set_new(meta, "strategy", json_string(fsdp_strategy_name(fsdp_strategy(fs))));
        if (fsdp_api(fs) != FSDP_API_FSDP1) /* absent: fsdp1, as every checkpoint before */
            json_object_set_new(meta, "api", json_string(fsdp_api_name(fsdp_api(fs))));
        if (opt != NULL) {
            const fsdp_optim_config_t *oc = fsdp_optim_config(opt);
            json_object_set_new(meta, "optimizer",
                                json_string(oc->kind == FSDP_OPTIM_ADAMW ? "adamw" : "sgd"));
            json_object_set_new(meta, "optimizer_num_steps",
                                json_integer(fsdp_optim_num_steps(opt)));
        }
        text = json_dumps(meta, JSON_INDENT(1) | JSON_SORT_KEYS);
        status = text ? write_atomic(tmpdir, "checkpoint.json", text) : FSDP_ERR_NO_MEMORY;
        free(text);
        if (status == FSDP_OK && rm_tree(final) != 0)
            status = FSDP_ERR_IO;
        if (status == FSDP_OK && rename(tmpdir, final) != 0) {
            fsdp_error("%s: cannot rename to %s: %s", tmpdir, final, strerror(errno));
            status = FSDP_ERR_IO;
        }
        if (status == FSDP_OK) {
            char latest[80];
            snprintf(latest, sizeof(latest), "%s\n", sub);
            status = fsdp_fs_sync_dir(dir);
            if (status == FSDP_OK)
                status = write_atomic(dir, "latest", latest);
        }
    }
    json_decref(meta);
    status = fsdp_ckpt_agree(fs, status);
    if (status != FSDP_OK && dev->rank == 0)
        save_failed(dir, tmpdir, step);
    return status;
}
