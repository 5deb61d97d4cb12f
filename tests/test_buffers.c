/* Module buffers: broadcast from rank 0 under sync_module_states, never communicated in
 * training, cast to buffer_dtype, held in f32 by every state dict type; bad specs refused. */
#include <fsdp/checkpoint.h>
#include <fsdp/fsdp.h>
#include <fsdp/safetensors.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core_hidden.h"
#include "runtime_test.h"

#define BF_WORLD 4

typedef struct bf_ctx {
    int root_params; /* the root owns a parameter (has a handle) */
    fsdp_dtype_t buffer_dtype;
    char dirs[3][256];
    fsdp_dtype_t fwd_dtype[BF_WORLD][2][2]; /* per iteration, per buffer, inside forward */
    float fwd_vals[BF_WORLD][2][2][5];
    float got[BF_WORLD][2][5];       /* fsdp_unit_get_buffer after training */
    float loaded[BF_WORLD][3][2][5]; /* after zeroing and loading each checkpoint type */
    int bcast[BF_WORLD][2];          /* broadcasts of 4 and 5 elements at set time */
    int comm_of_buffers[BF_WORLD];   /* collectives of 4 or 5 elements during training */
    int file_ok[3];
} bf_ctx_t;

static const int bf_numel[2] = {4, 5};

/* Rank r's value of buffer k, element i: not representable in bf16 for i odd. */
static float bf_value(int r, int k, int i)
{
    return 1.0f + (float)(i + k) * 0x1p-9f + (float)r;
}

static void bf_read(void *p, fsdp_dtype_t dt, int n, float *out)
{
    for (int i = 0; i < n; i++)
        out[i] = dt == FSDP_DTYPE_F32 ? ((const float *)p)[i] : from_low(dt, ((uint16_t *)p)[i]);
}

static fsdp_status_t bf_rank(fsdp_dev_t *dev, void *arg)
{
    bf_ctx_t *bc = arg;
    fsdp_backend_ops_t wrapped;
    fsdp_buffer_spec_t bspec[2] = {{.name = "mask", .ndim = 2, .shape = {2, 2}},
                                   {.name = "a.running_mean", .ndim = 1, .shape = {5}}};
    fsdp_param_spec_t rspec = {
        .name = "root.w", .ndim = 1, .shape = {3}, .requires_grad = 1, .tied_to = -1};
    fsdp_param_spec_t aspec = {
        .name = "a.w", .ndim = 1, .shape = {6}, .requires_grad = 1, .tied_to = -1};
    fsdp_unit_options_t uo;
    fsdp_unit_t *u[2];
    fsdp_config_t fc;
    fsdp_t *fs;
    fsdp_status_t status;
    int r = dev->rank;

    wrap_ops(dev, &wrapped);
    fsdp_config_init(&fc);
    fc.sync_module_states = 1;
    fc.mixed_precision.param_dtype = FSDP_DTYPE_BF16;
    fc.mixed_precision.buffer_dtype = bc->buffer_dtype;
    status = fsdp_create(dev, &fc, &fs);
    if (status != FSDP_OK)
        return status;
    fsdp_unit_options_init(&uo);
    uo.buffers = &bspec[0];
    uo.nbuffers = 1;
    status = fsdp_unit_create_ex(fs, "root", NULL, &rspec, bc->root_params, &uo, &u[0]);
    uo.buffers = &bspec[1];
    if (status == FSDP_OK)
        status = fsdp_unit_create_ex(fs, "a", u[0], &aspec, 1, &uo, &u[1]);
    for (int k = 0; k < 2 && status == FSDP_OK; k++) {
        float v[5];
        for (int i = 0; i < bf_numel[k]; i++)
            v[i] = bf_value(r, k, i); /* rank 0's values win (sync_module_states) */
        status = fsdp_unit_set_buffer(u[k], 0, v);
    }
    for (int i = 0; i < tl_nlog; i++) {
        if (tl_log[i].kind == C_BC && (tl_log[i].n == 4 || tl_log[i].n == 5))
            bc->bcast[r][tl_log[i].n - 4]++;
    }
    tl_nlog = 0;
    for (int it = 0; it < 2 && status == FSDP_OK; it++) {
        status = fsdp_pre_forward(u[0]);
        if (status == FSDP_OK)
            status = fsdp_pre_forward(u[1]);
        for (int k = 0; k < 2 && status == FSDP_OK; k++) {
            fsdp_dtype_t dt;
            void *p = fsdp_unit_buffer(u[k], 0, &dt);
            bc->fwd_dtype[r][it][k] = dt;
            bf_read(p, dt, bf_numel[k], bc->fwd_vals[r][it][k]);
        }
        if (status == FSDP_OK)
            status = fsdp_post_forward(u[1]);
        if (status == FSDP_OK)
            status = fsdp_post_forward(u[0]);
        if (status == FSDP_OK)
            status = fsdp_pre_backward(u[0]);
        if (status == FSDP_OK)
            status = fsdp_pre_backward(u[1]);
        if (status == FSDP_OK)
            status = fsdp_post_backward(u[1]);
        if (status == FSDP_OK)
            status = fsdp_post_backward(u[0]);
        if (status == FSDP_OK)
            status = fsdp_final_callback(fs);
    }
    for (int i = 0; i < tl_nlog; i++)
        bc->comm_of_buffers[r] += tl_log[i].n == 4 || tl_log[i].n == 5;
    for (int k = 0; k < 2 && status == FSDP_OK; k++)
        status = fsdp_unit_get_buffer(u[k], 0, bc->got[r][k]);
    /* each state dict type holds the buffers and restores them */
    for (int t = 0; t < 3 && status == FSDP_OK; t++) {
        float zeros[5] = {0};
        status = fsdp_checkpoint_save(fs, NULL, bc->dirs[t], (fsdp_state_dict_type_t)t, 1);
        for (int k = 0; k < 2 && status == FSDP_OK; k++)
            status = fsdp_unit_set_buffer(u[k], 0, zeros);
        if (status == FSDP_OK)
            status = fsdp_checkpoint_load(fs, NULL, bc->dirs[t], NULL);
        for (int k = 0; k < 2 && status == FSDP_OK; k++)
            status = fsdp_unit_get_buffer(u[k], 0, bc->loaded[r][t][k]);
    }
    fsdp_destroy(fs);
    return status;
}

/* A buffer is in a file as F32 with its shape and the values in `want`. */
static int file_has_buffer(const char *path, const char *name, int ndim, const int64_t *shape,
                           const float *want, int n)
{
    fsdp_st_file_t *f;
    const fsdp_st_tensor_t *t;
    int ok;

    if (fsdp_st_open(path, &f) != FSDP_OK)
        return 0;
    t = fsdp_st_find(f, name);
    ok = t != NULL && strcmp(t->dtype, "F32") == 0 && t->ndim == ndim && (int)t->numel == n;
    for (int d = 0; ok && d < ndim; d++)
        ok = t->shape[d] == shape[d];
    for (int i = 0; ok && i < n; i++) {
        float v;
        memcpy(&v, (const char *)t->data + sizeof(float) * (size_t)i, sizeof(v));
        ok = v == want[i];
    }
    fsdp_st_close(f);
    return ok;
}

/* Buffers: broadcast from rank 0 under sync_module_states, never communicated in training,
 * cast to buffer_dtype at lazy init (back to f32 at every forward of a root without
 * parameters), and held in f32 by FULL, SHARDED and LOCAL state dicts, which restore them. */
static void test_buffers(void)
{
    static const struct {
        int root_params;
        fsdp_dtype_t buffer_dtype;
    } cases[] = {
        {1, FSDP_DTYPE_BF16},
        {0, FSDP_DTYPE_BF16},
        {1, FSDP_DTYPE_UNSET},
    };
    static const int64_t shapes[2][2] = {{2, 2}, {5, 0}};
    static const char *const names[2] = {"mask", "a.running_mean"};
    fsdp_sim_params_t p;

    fsdp_sim_params_init(&p);
    p.world_size = BF_WORLD;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        bf_ctx_t *bc = calloc(1, sizeof(*bc));
        char base[] = "/tmp/fsdp-test-buffers-XXXXXX";
        int low = cases[c].buffer_dtype != FSDP_DTYPE_UNSET, rounded_differs = 0;

        CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(base));
        for (int t = 0; t < 3; t++)
            snprintf(bc->dirs[t], sizeof(bc->dirs[t]), "%s/%d", base, t);
        bc->root_params = cases[c].root_params;
        bc->buffer_dtype = cases[c].buffer_dtype;
        CU_ASSERT_EQUAL_FATAL(fsdp_sim_launch(&p, bf_rank, bc, NULL), FSDP_OK);
        for (int r = 0; r < BF_WORLD; r++) {
            CU_ASSERT_EQUAL(bc->bcast[r][0], 1);
            CU_ASSERT_EQUAL(bc->bcast[r][1], 1);
            CU_ASSERT_EQUAL(bc->comm_of_buffers[r], 0);
            for (int k = 0; k < 2; k++) {
                /* the computation's dtype: buffer_dtype, unless the root has no parameters */
                fsdp_dtype_t want_dt =
                    low && cases[c].root_params ? cases[c].buffer_dtype : FSDP_DTYPE_F32;
                for (int it = 0; it < 2; it++)
                    CU_ASSERT_EQUAL(bc->fwd_dtype[r][it][k], want_dt);
                for (int i = 0; i < bf_numel[k]; i++) {
                    float v = bf_value(0, k, i);
                    /* the lazy-init cast rounds the values for good */
                    float want = low ? round_to(cases[c].buffer_dtype, v) : v;
                    rounded_differs |= want != v;
                    for (int it = 0; it < 2; it++)
                        CU_ASSERT_EQUAL(bc->fwd_vals[r][it][k][i], want);
                    CU_ASSERT_EQUAL(bc->got[r][k][i], want);
                    for (int t = 0; t < 3; t++)
                        CU_ASSERT_EQUAL(bc->loaded[r][t][k][i], want);
                }
            }
        }
        CU_ASSERT_EQUAL(rounded_differs, low);
        /* FULL: model.safetensors; SHARDED: rank 0's file; LOCAL: every rank's file */
        for (int k = 0; k < 2; k++) {
            float want[5];
            char path[512];
            for (int i = 0; i < bf_numel[k]; i++)
                want[i] = bc->got[0][k][i];
            snprintf(path, sizeof(path), "%s/step-00000001/model.safetensors", bc->dirs[0]);
            CU_ASSERT(file_has_buffer(path, names[k], 2 - k, shapes[k], want, bf_numel[k]));
            snprintf(path, sizeof(path), "%s/step-00000001/rank-00000.safetensors", bc->dirs[1]);
            CU_ASSERT(file_has_buffer(path, names[k], 2 - k, shapes[k], want, bf_numel[k]));
            snprintf(path, sizeof(path), "%s/step-00000001/rank-00001.safetensors", bc->dirs[1]);
            CU_ASSERT(!file_has_buffer(path, names[k], 2 - k, shapes[k], want, bf_numel[k]));
            for (int r = 0; r < BF_WORLD; r++) {
                snprintf(path, sizeof(path), "%s/step-00000001/rank-%05d.safetensors", bc->dirs[2],
                         r);
                CU_ASSERT(file_has_buffer(path, names[k], 2 - k, shapes[k], want, bf_numel[k]));
            }
        }
        remove_tree(base);
        free(bc);
    }
}

static fsdp_status_t bf_refused_rank(fsdp_dev_t *dev, void *arg)
{
    fsdp_param_spec_t spec = {
        .name = "w", .ndim = 1, .shape = {4}, .requires_grad = 1, .tied_to = -1};
    fsdp_buffer_spec_t bs[2] = {{.name = "w", .ndim = 1, .shape = {2}},
                                {.name = "b", .ndim = 5, .shape = {1}}};
    fsdp_unit_options_t uo;
    fsdp_unit_t *u;
    fsdp_t *fs;
    int ok;

    (void)arg;
    if (fsdp_create(dev, NULL, &fs) != FSDP_OK)
        return FSDP_ERR_INTERNAL;
    fsdp_unit_options_init(&uo);
    uo.buffers = &bs[0];
    uo.nbuffers = 1;
    ok = fsdp_unit_create_ex(fs, "root", NULL, &spec, 1, &uo, &u) == FSDP_ERR_INVALID_PARAM &&
         strstr(fsdp_last_error(fs), "already used") != NULL;
    uo.buffers = &bs[1];
    ok = ok && fsdp_unit_create_ex(fs, "root", NULL, &spec, 1, &uo, &u) == FSDP_ERR_INVALID_PARAM &&
         strstr(fsdp_last_error(fs), "0 to 4") != NULL;
    ok = ok && fsdp_num_units(fs) == 0;
    /* names are unique across units too, whatever each is: parameter, ignored one or buffer */
    {
        fsdp_param_spec_t keep = {
            .name = "k", .ndim = 1, .shape = {3}, .requires_grad = 1, .tied_to = -1, .ignored = 1};
        fsdp_param_spec_t rp[2] = {spec, keep};
        fsdp_buffer_spec_t mb = {.name = "m", .ndim = 1, .shape = {2}};
        fsdp_param_spec_t kid = spec;
        fsdp_unit_t *root;
        uo.buffers = &mb;
        uo.nbuffers = 1;
        rp[0].name = "v";
        ok = ok && fsdp_unit_create_ex(fs, "root", NULL, rp, 2, &uo, &root) == FSDP_OK;
        fsdp_unit_options_init(&uo);
        for (int c = 0; c < 3 && ok; c++) {
            kid.name = c == 0 ? "m" : c == 1 ? "k" : "v"; /* root's buffer, ignored, parameter */
            ok = fsdp_unit_create_ex(fs, "kid", root, &kid, 1, &uo, &u) == FSDP_ERR_INVALID_PARAM &&
                 strstr(fsdp_last_error(fs), "already used") != NULL;
        }
        bs[0].name = "k"; /* a buffer named as root's ignored parameter */
        uo.buffers = &bs[0];
        uo.nbuffers = 1;
        kid.name = "fresh";
        ok = ok &&
             fsdp_unit_create_ex(fs, "kid", root, &kid, 1, &uo, &u) == FSDP_ERR_INVALID_PARAM &&
             strstr(fsdp_last_error(fs), "already used") != NULL;
        ok = ok && fsdp_num_units(fs) == 1;
    }
    fsdp_destroy(fs);
    return ok ? FSDP_OK : FSDP_ERR_INTERNAL;
}

static void test_buffers_refused(void)
{
    CU_ASSERT_EQUAL(run_ranks(2, bf_refused_rank, NULL), FSDP_OK);
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"buffers", test_buffers},
        {"buffers_refused", test_buffers_refused},
        {NULL, NULL},
    };
    return fsdp_test_run("buffers", tests);
}
