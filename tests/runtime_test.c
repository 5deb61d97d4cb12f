/* What the runtime's test programs share (runtime_test.h). */
#include "runtime_test.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

fsdp_test_failure_t failure;

fsdp_status_t launch_checked(const fsdp_sim_params_t *p, fsdp_rank_func_t func, void *arg)
{
    fsdp_status_t status = fsdp_sim_launch(p, func, arg, NULL);
    fsdp_test_failure_assert(&failure);
    return status;
}

fsdp_status_t run_ranks(int world, fsdp_rank_func_t func, void *arg)
{
    fsdp_sim_params_t p;
    fsdp_sim_params_init(&p);
    p.world_size = world;
    return launch_checked(&p, func, arg);
}

void launch_quiet(int world, fsdp_sim_mode_t mode, fsdp_rank_func_t func)
{
    fsdp_sim_params_t p;
    fsdp_log_level_t lvl = fsdp_log_level();
    fsdp_sim_params_init(&p);
    p.world_size = world;
    p.mode = mode;
    fsdp_log_set_level(FSDP_LOG_OFF);
    CU_ASSERT_EQUAL(launch_checked(&p, func, NULL), FSDP_OK);
    fsdp_log_set_level(lvl);
}

/* ---------------- collectives logged per rank ---------------- */

_Thread_local coll_t tl_log[MAX_LOG];
_Thread_local int tl_nlog;
_Thread_local counts_t tl_counts;
_Thread_local fsdp_dtype_t tl_ag_dtype, tl_rs_dtype, tl_ar_dtype;
static _Thread_local const fsdp_backend_ops_t *tl_inner;

static void log_coll(coll_kind_t kind, size_t n, const fsdp_group_t *g, fsdp_dtype_t dt,
                     fsdp_reduce_op_t op)
{
    static _Thread_local fsdp_dtype_t unused;
    fsdp_dtype_t *last = kind == C_AG   ? &tl_ag_dtype
                         : kind == C_RS ? &tl_rs_dtype
                         : kind == C_AR ? &tl_ar_dtype
                                        : &unused;

    tl_counts.all_gather += kind == C_AG;
    tl_counts.reduce_scatter += kind == C_RS;
    tl_counts.all_reduce += kind == C_AR;
    if (dt == FSDP_DTYPE_I32) /* the first iteration's forward-order check */
        return;
    *last = dt;
    if (tl_nlog < MAX_LOG)
        tl_log[tl_nlog++] = (coll_t){kind, n, g->size, dt, op};
}

static fsdp_status_t log_all_gather(fsdp_dev_t *dev, fsdp_group_t *g, const void *s, void *r,
                                    size_t n, fsdp_dtype_t dt, fsdp_stream_t *st)
{
    log_coll(C_AG, n, g, dt, FSDP_REDUCE_SUM);
    return tl_inner->all_gather(dev, g, s, r, n, dt, st);
}

static fsdp_status_t log_reduce_scatter(fsdp_dev_t *dev, fsdp_group_t *g, const void *s, void *r,
                                        size_t n, fsdp_dtype_t dt, fsdp_reduce_op_t op,
                                        fsdp_stream_t *st)
{
    log_coll(C_RS, n, g, dt, op);
    return tl_inner->reduce_scatter(dev, g, s, r, n, dt, op, st);
}

static fsdp_status_t log_all_reduce(fsdp_dev_t *dev, fsdp_group_t *g, const void *s, void *r,
                                    size_t n, fsdp_dtype_t dt, fsdp_reduce_op_t op,
                                    fsdp_stream_t *st)
{
    log_coll(C_AR, n, g, dt, op);
    return tl_inner->all_reduce(dev, g, s, r, n, dt, op, st);
}

static fsdp_status_t log_broadcast(fsdp_dev_t *dev, fsdp_group_t *g, void *buf, size_t n,
                                   fsdp_dtype_t dt, int root, fsdp_stream_t *st)
{
    log_coll(C_BC, n, g, dt, FSDP_REDUCE_SUM);
    return tl_inner->broadcast(dev, g, buf, n, dt, root, st);
}

void wrap_ops(fsdp_dev_t *dev, fsdp_backend_ops_t *wrapped)
{
    tl_inner = dev->ops;
    *wrapped = *dev->ops;
    wrapped->all_gather = log_all_gather;
    wrapped->reduce_scatter = log_reduce_scatter;
    wrapped->all_reduce = log_all_reduce;
    wrapped->broadcast = log_broadcast;
    dev->ops = wrapped;
    tl_nlog = 0;
    memset(&tl_counts, 0, sizeof(tl_counts));
    tl_ag_dtype = tl_rs_dtype = tl_ar_dtype = FSDP_DTYPE_UNSET;
}

int count_colls(const coll_t *log, int nlog, coll_kind_t kind, size_t n, int group_size)
{
    int c = 0;
    for (int i = 0; i < nlog; i++)
        c += log[i].kind == kind && log[i].n == n && log[i].group_size == group_size;
    return c;
}

/* ---------------- a root and its child a through one iteration ---------------- */

fsdp_status_t forward_to_backward(fsdp_unit_t *root, fsdp_unit_t *a)
{
    fsdp_status_t status = fsdp_pre_forward(root);
    if (status == FSDP_OK)
        status = fsdp_pre_forward(a);
    if (status == FSDP_OK)
        status = fsdp_post_forward(a);
    if (status == FSDP_OK)
        status = fsdp_post_forward(root);
    if (status == FSDP_OK)
        status = fsdp_pre_backward(root);
    if (status == FSDP_OK)
        status = fsdp_pre_backward(a);
    return status;
}

fsdp_status_t finish_backward(fsdp_t *fs, fsdp_unit_t *root, fsdp_unit_t *a)
{
    fsdp_status_t status = fsdp_post_backward(a);
    if (status == FSDP_OK)
        status = fsdp_post_backward(root);
    if (status == FSDP_OK)
        status = fsdp_final_callback(fs);
    return status;
}

/* ---------------- low-precision values ---------------- */

float round_to(fsdp_dtype_t dt, float x)
{
    if (dt == FSDP_DTYPE_BF16)
        return fsdp_bf16_to_f32(fsdp_f32_to_bf16(x));
    if (dt == FSDP_DTYPE_F16)
        return fsdp_f16_to_f32(fsdp_f32_to_f16(x));
    return x;
}

uint16_t to_low(fsdp_dtype_t dt, float x)
{
    return dt == FSDP_DTYPE_BF16 ? fsdp_f32_to_bf16(x) : fsdp_f32_to_f16(x);
}

float from_low(fsdp_dtype_t dt, uint16_t x)
{
    return dt == FSDP_DTYPE_BF16 ? fsdp_bf16_to_f32(x) : fsdp_f16_to_f32(x);
}

/* ---------------- directories ---------------- */

int tree_contains(const char *dir, const char *needle)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int found = 0;

    if (d == NULL)
        return 0;
    while (!found && (de = readdir(d)) != NULL) {
        char path[512];
        struct stat st;
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        if (stat(path, &st) != 0)
            continue;
        if (S_ISDIR(st.st_mode)) {
            found = tree_contains(path, needle);
        } else if (S_ISREG(st.st_mode)) {
            FILE *f = fopen(path, "rb");
            char *buf = malloc((size_t)st.st_size + 1);
            size_t n = f && buf ? fread(buf, 1, (size_t)st.st_size, f) : 0;
            for (size_t i = 0; i + strlen(needle) <= n && !found; i++)
                found = memcmp(buf + i, needle, strlen(needle)) == 0;
            free(buf);
            if (f)
                fclose(f);
        }
    }
    closedir(d);
    return found;
}

void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;

    if (d == NULL)
        return;
    while ((de = readdir(d)) != NULL) {
        char path[512];
        struct stat st;
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
            remove_tree(path);
        else
            unlink(path);
    }
    closedir(d);
    rmdir(dir);
}
