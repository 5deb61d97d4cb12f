/* torch.optim.AdamW and torch.optim.SGD over FSDP's sharded flat parameters.
 *
 * As PyTorch FSDP with use_orig_params=False, the optimizer sees one flat parameter per unit:
 * this rank's shard of S elements, with its sharded gradient. The state (exp_avg and
 * exp_avg_sq, or momentum_buffer) is one S-element tensor per unit shard, allocated on the
 * first step the unit has a gradient, zero-filled, and tagged as optimizer state. The update
 * runs per original parameter over the part of it this rank holds, so that per-parameter
 * options (no weight decay for biases and norms) apply; padding is left alone.
 *
 * Every update is a kernel launch (kernel.h) on the compute stream: the formulas are the
 * shared bodies of lib/kernels/, and the per-step scalars (bias corrections, step size) are
 * computed from the descriptor in double by the backend, as torch does in Python.
 */
#include "config.h"

#include "nn/nn_int.h"

#include <stdlib.h>
#include <string.h>

#include <fsdp/log.h>
#include <fsdp/nn.h>

typedef struct fsdp_optim_unit {
    float *state0;  /* exp_avg (AdamW) or momentum_buffer (SGD with momentum) */
    float *state1;  /* exp_avg_sq (AdamW) */
    size_t numel;   /* S of the unit when the state was allocated */
    int64_t step;   /* steps this unit took (torch keeps one per parameter) */
    int has_buffer; /* SGD: the momentum buffer holds a value (torch: not None) */
    int on_host;    /* CPU offload: the state lives in pinned host memory, as the shard does */
} fsdp_optim_unit_t;

struct fsdp_optim {
    fsdp_t *fs;
    fsdp_optim_config_t cfg;
    fsdp_optim_unit_t *units; /* by unit index (fsdp_unit_at) */
    int nunits;
    int64_t num_steps;
};

void fsdp_optim_config_init(fsdp_optim_config_t *cfg, fsdp_optim_kind_t kind)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->kind = kind;
    cfg->lr = 1e-3f; /* torch.optim.SGD has no default lr; AdamW's */
    cfg->momentum = 0.0f;
    cfg->dampening = 0.0f;
    cfg->nesterov = 0;
    cfg->beta1 = 0.9f;
    cfg->beta2 = 0.999f;
    cfg->eps = 1e-8f;
    cfg->weight_decay = kind == FSDP_OPTIM_ADAMW ? 1e-2f : 0.0f;
    cfg->no_decay_1d = 0;
}

/* Ranges as torch's ValueErrors; comparisons are written so that NaN fails them. */
fsdp_status_t fsdp_optim_config_check(const fsdp_optim_config_t *cfg)
{
    if (cfg == NULL) {
        fsdp_error("optimizer config is NULL");
        return FSDP_ERR_INVALID_PARAM;
    }
    if (cfg->kind != FSDP_OPTIM_SGD && cfg->kind != FSDP_OPTIM_ADAMW) {
        fsdp_error("invalid optimizer kind: %d (sgd %d or adamw %d)", (int)cfg->kind,
                   (int)FSDP_OPTIM_SGD, (int)FSDP_OPTIM_ADAMW);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (!(cfg->lr >= 0.0f)) {
        fsdp_error("invalid learning rate: %g", (double)cfg->lr);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (!(cfg->weight_decay >= 0.0f)) {
        fsdp_error("invalid weight_decay value: %g", (double)cfg->weight_decay);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (cfg->kind == FSDP_OPTIM_SGD) {
        if (!(cfg->momentum >= 0.0f)) {
            fsdp_error("invalid momentum value: %g", (double)cfg->momentum);
            return FSDP_ERR_INVALID_PARAM;
        }
        if (cfg->dampening != cfg->dampening) {
            fsdp_error("invalid dampening value: %g", (double)cfg->dampening);
            return FSDP_ERR_INVALID_PARAM;
        }
        if (cfg->nesterov && (cfg->momentum <= 0.0f || cfg->dampening != 0.0f)) {
            fsdp_error("nesterov momentum requires a momentum and zero dampening (momentum %g, "
                       "dampening %g)",
                       (double)cfg->momentum, (double)cfg->dampening);
            return FSDP_ERR_INVALID_PARAM;
        }
    } else {
        if (!(cfg->eps >= 0.0f)) {
            fsdp_error("invalid epsilon value: %g", (double)cfg->eps);
            return FSDP_ERR_INVALID_PARAM;
        }
        if (!(cfg->beta1 >= 0.0f && cfg->beta1 < 1.0f)) {
            fsdp_error("invalid beta parameter at index 0: %g (allowed: [0, 1))",
                       (double)cfg->beta1);
            return FSDP_ERR_INVALID_PARAM;
        }
        if (!(cfg->beta2 >= 0.0f && cfg->beta2 < 1.0f)) {
            fsdp_error("invalid beta parameter at index 1: %g (allowed: [0, 1))",
                       (double)cfg->beta2);
            return FSDP_ERR_INVALID_PARAM;
        }
    }
    return FSDP_OK;
}

fsdp_status_t fsdp_optim_create(fsdp_t *fs, const fsdp_optim_config_t *cfg, fsdp_optim_t **opt_p)
{
    fsdp_optim_config_t defaults;
    fsdp_optim_t *opt;
    fsdp_status_t status;

    if (fs == NULL || opt_p == NULL) {
        fsdp_error("optimizer: %s is NULL", fs == NULL ? "fs" : "opt_p");
        return FSDP_ERR_INVALID_PARAM;
    }
    if (cfg == NULL) { /* torch.optim.AdamW() */
        fsdp_optim_config_init(&defaults, FSDP_OPTIM_ADAMW);
        cfg = &defaults;
    }
    status = fsdp_optim_config_check(cfg);
    if (status != FSDP_OK)
        return status;
    opt = calloc(1, sizeof(*opt));
    if (opt == NULL) {
        fsdp_error("optimizer: out of host memory");
        return FSDP_ERR_NO_MEMORY;
    }
    opt->fs = fs;
    opt->cfg = *cfg;
    *opt_p = opt;
    return FSDP_OK;
}

static void fsdp_optim_state_free(fsdp_optim_t *opt, fsdp_optim_unit_t *st, float *p)
{
    fsdp_dev_t *dev = fsdp_device(opt->fs);
    if (p == NULL)
        return;
    if (st->on_host)
        fsdp_dev_segment_free(dev, FSDP_MEMKIND_HOST_PINNED, p);
    else
        fsdp_mem_free(fsdp_memory(opt->fs), p);
}

void fsdp_optim_destroy(fsdp_optim_t *opt)
{
    if (opt == NULL)
        return;
    for (int i = 0; i < opt->nunits; i++) {
        fsdp_optim_state_free(opt, &opt->units[i], opt->units[i].state0);
        fsdp_optim_state_free(opt, &opt->units[i], opt->units[i].state1);
    }
    free(opt->units);
    free(opt);
}

int64_t fsdp_optim_num_steps(const fsdp_optim_t *opt)
{
    return opt != NULL ? opt->num_steps : 0;
}

static fsdp_status_t fsdp_optim_launch(fsdp_optim_t *opt, const fsdp_kernel_t *k)
{
    fsdp_dev_t *dev = fsdp_device(opt->fs);
    return fsdp_dev_kernel(dev, fsdp_compute_stream(opt->fs), k);
}

/* One zero-filled S-element state tensor, beside the shard it updates (device, or pinned host
 * memory under CPU offload, where the optimizer steps on the host). */
static fsdp_status_t fsdp_optim_state_alloc(fsdp_optim_t *opt, fsdp_optim_unit_t *st, size_t numel,
                                            float **state_p)
{
    fsdp_kernel_t k = {.kind = FSDP_K_FILL};
    fsdp_dev_t *dev = fsdp_device(opt->fs);
    void *p = NULL;
    fsdp_status_t status;

    if (st->on_host)
        status = fsdp_dev_segment_alloc(dev, FSDP_MEMKIND_HOST_PINNED, numel * sizeof(float), &p);
    else
        status = fsdp_mem_alloc(fsdp_memory(opt->fs), numel * sizeof(float),
                                FSDP_MEM_OPTIMIZER_STATE, fsdp_compute_stream(opt->fs), &p);
    if (status != FSDP_OK)
        return status;
    k.u.fill.x = p;
    k.u.fill.dtype = FSDP_DTYPE_F32;
    k.u.fill.n = numel;
    k.u.fill.value = 0.0;
    status = fsdp_optim_launch(opt, &k);
    if (status != FSDP_OK) {
        fsdp_optim_state_free(opt, st, p);
        return status;
    }
    *state_p = p;
    return FSDP_OK;
}

/* Makes room for units created since the last step. */
static fsdp_status_t fsdp_optim_grow(fsdp_optim_t *opt, int nunits)
{
    fsdp_optim_unit_t *units;

    if (nunits <= opt->nunits)
        return FSDP_OK;
    units = realloc(opt->units, (size_t)nunits * sizeof(*units));
    if (units == NULL) {
        fsdp_error("optimizer: out of host memory for %d units", nunits);
        return FSDP_ERR_NO_MEMORY;
    }
    memset(units + opt->nunits, 0, (size_t)(nunits - opt->nunits) * sizeof(*units));
    opt->units = units;
    opt->nunits = nunits;
    return FSDP_OK;
}

static fsdp_status_t fsdp_optim_unit_state(fsdp_optim_t *opt, fsdp_unit_t *u, fsdp_optim_unit_t *st,
                                           size_t numel)
{
    fsdp_status_t status;
    int adamw = opt->cfg.kind == FSDP_OPTIM_ADAMW;

    if (st->numel == numel || (!adamw && opt->cfg.momentum == 0.0f))
        return FSDP_OK;
    if (st->numel != 0) { /* the shard was resized: start over, as a fresh torch parameter */
        fsdp_error("optimizer: shard of a unit changed from %zu to %zu elements", st->numel, numel);
        return FSDP_ERR_STATE;
    }
    st->on_host = fsdp_unit_offloaded(u);
    status = fsdp_optim_state_alloc(opt, st, numel, &st->state0);
    if (status != FSDP_OK)
        return status;
    if (adamw) {
        status = fsdp_optim_state_alloc(opt, st, numel, &st->state1);
        if (status != FSDP_OK) {
            fsdp_optim_state_free(opt, st, st->state0);
            st->state0 = NULL;
            return status;
        }
    }
    st->numel = numel;
    return FSDP_OK;
}

/* The update of elements [off, off + n) of a unit's shard, weight decay wd. */
static fsdp_status_t fsdp_optim_update(fsdp_optim_t *opt, fsdp_optim_unit_t *st, float *param,
                                       const float *grad, size_t off, size_t n, float wd)
{
    const fsdp_optim_config_t *cfg = &opt->cfg;
    fsdp_kernel_t k;

    memset(&k, 0, sizeof(k));
    if (cfg->kind == FSDP_OPTIM_ADAMW) {
        k.kind = FSDP_K_ADAMW;
        k.u.adamw.param = param + off;
        k.u.adamw.grad = grad + off;
        k.u.adamw.exp_avg = st->state0 + off;
        k.u.adamw.exp_avg_sq = st->state1 + off;
        k.u.adamw.n = n;
        k.u.adamw.lr = cfg->lr;
        k.u.adamw.beta1 = cfg->beta1;
        k.u.adamw.beta2 = cfg->beta2;
        k.u.adamw.eps = cfg->eps;
        k.u.adamw.weight_decay = wd;
        k.u.adamw.step = st->step;
    } else {
        k.kind = FSDP_K_SGD;
        k.u.sgd.param = param + off;
        k.u.sgd.grad = grad + off;
        k.u.sgd.momentum_buf = st->state0 != NULL ? st->state0 + off : NULL;
        k.u.sgd.n = n;
        k.u.sgd.lr = cfg->lr;
        k.u.sgd.momentum = cfg->momentum;
        k.u.sgd.dampening = cfg->dampening;
        k.u.sgd.weight_decay = wd;
        k.u.sgd.nesterov = cfg->nesterov;
        k.u.sgd.first_step = !st->has_buffer;
    }
    return fsdp_optim_launch(opt, &k);
}

static fsdp_status_t fsdp_optim_step_unit(fsdp_optim_t *opt, fsdp_unit_t *u, fsdp_optim_unit_t *st)
{
    float *param = fsdp_unit_local_shard(u), *grad = fsdp_unit_sharded_grad(u), *up = NULL;
    int nparams = fsdp_unit_num_params(u);
    fsdp_status_t status;

    status = fsdp_optim_unit_state(opt, u, st, fsdp_unit_shard_numel(u));
    if (status == FSDP_OK && grad == NULL) {
        /* keep_low_precision_grads: the update reads the gradient upcast to f32, as torch's
         * optimizers compute in the parameter's dtype */
        fsdp_kernel_t k = {.kind = FSDP_K_CAST};
        size_t n = fsdp_unit_shard_numel(u);
        k.u.cast.src = fsdp_unit_sharded_grad_data(u, &k.u.cast.src_dtype);
        k.u.cast.dst_dtype = FSDP_DTYPE_F32;
        k.u.cast.n = n;
        status = fsdp_mem_alloc(fsdp_memory(opt->fs), n * sizeof(float), FSDP_MEM_TEMPORARY,
                                fsdp_compute_stream(opt->fs), (void **)&up);
        k.u.cast.dst = up;
        if (status == FSDP_OK)
            status = fsdp_optim_launch(opt, &k);
        grad = up;
    }
    if (status != FSDP_OK) {
        fsdp_mem_free(fsdp_memory(opt->fs), up);
        return status;
    }
    st->step++;
    for (int i = 0; i < nparams; i++) {
        fsdp_param_info_t info;
        float wd = opt->cfg.weight_decay;

        status = fsdp_unit_param_info(u, i, &info);
        if (status != FSDP_OK)
            break;
        /* a tied parameter shares its storage: the first one updates it once */
        if (info.tied_to >= 0 || !info.in_shard || info.numel_in_shard == 0 || !info.requires_grad)
            continue; /* frozen parameters have no gradient: torch skips them */
        if (opt->cfg.no_decay_1d && info.ndim <= 1)
            wd = 0.0f;
        status =
            fsdp_optim_update(opt, st, param, grad, info.offset_in_shard, info.numel_in_shard, wd);
        if (status != FSDP_OK)
            break;
    }
    fsdp_mem_free(fsdp_memory(opt->fs), up); /* read on the compute stream it was made on */
    if (status != FSDP_OK)
        return status;
    st->has_buffer = st->state0 != NULL;
    return FSDP_OK;
}

fsdp_status_t fsdp_optim_step(fsdp_optim_t *opt)
{
    fsdp_status_t status;
    int nunits;

    if (opt == NULL) {
        fsdp_error("optimizer is NULL");
        return FSDP_ERR_INVALID_PARAM;
    }
    nunits = fsdp_num_units(opt->fs);
    status = fsdp_optim_grow(opt, nunits);
    if (status != FSDP_OK)
        return status;
    for (int i = 0; i < nunits; i++) {
        fsdp_unit_t *u = fsdp_unit_at(opt->fs, i);
        /* torch skips a parameter whose .grad is None, and its step does not advance */
        if (u == NULL || !fsdp_unit_has_params(u) || fsdp_unit_sharded_grad_data(u, NULL) == NULL)
            continue;
        status = fsdp_optim_step_unit(opt, u, &opt->units[i]);
        if (status != FSDP_OK)
            return status;
    }
    opt->num_steps++;
    return FSDP_OK;
}

static int fsdp_optim_unit_index(fsdp_optim_t *opt, fsdp_unit_t *u)
{
    for (int i = 0; i < fsdp_num_units(opt->fs); i++) {
        if (fsdp_unit_at(opt->fs, i) == u)
            return i;
    }
    return -1;
}

fsdp_status_t fsdp_optim_unit_state_view(fsdp_optim_t *opt, fsdp_unit_t *u, int allocate,
                                         fsdp_optim_state_view_t *view_p)
{
    int adamw = opt->cfg.kind == FSDP_OPTIM_ADAMW;
    int index = fsdp_optim_unit_index(opt, u);
    fsdp_optim_unit_t *st;
    fsdp_status_t status;

    if (index < 0 || !fsdp_unit_has_params(u)) {
        fsdp_error("optimizer: unit '%s' has no parameters of this model", fsdp_unit_name(u));
        return FSDP_ERR_INVALID_PARAM;
    }
    status = fsdp_optim_grow(opt, fsdp_num_units(opt->fs));
    if (status != FSDP_OK)
        return status;
    st = &opt->units[index];
    if (allocate) {
        status = fsdp_optim_unit_state(opt, u, st, fsdp_unit_shard_numel(u));
        if (status != FSDP_OK)
            return status;
    }
    memset(view_p, 0, sizeof(*view_p));
    view_p->step = st->step;
    view_p->has_buffer = st->has_buffer;
    if (adamw) {
        view_p->nbuf = 2;
        view_p->names[0] = "exp_avg";
        view_p->names[1] = "exp_avg_sq";
    } else if (opt->cfg.momentum != 0.0f) {
        view_p->nbuf = 1;
        view_p->names[0] = "momentum_buffer";
    }
    view_p->buf[0] = st->state0;
    view_p->buf[1] = st->state1;
    return FSDP_OK;
}

fsdp_status_t fsdp_optim_set_unit_step(fsdp_optim_t *opt, fsdp_unit_t *u, int64_t step,
                                       int has_buffer)
{
    int index = fsdp_optim_unit_index(opt, u);
    fsdp_status_t status;

    if (index < 0) {
        fsdp_error("optimizer: unit '%s' is not one of this optimizer's", fsdp_unit_name(u));
        return FSDP_ERR_INVALID_PARAM;
    }
    if (step < 0 || step > FSDP_OPTIM_STEP_MAX) {
        fsdp_error("optimizer: step %lld of unit '%s' is out of range [0, 2^53]", (long long)step,
                   fsdp_unit_name(u));
        return FSDP_ERR_INVALID_PARAM;
    }
    status = fsdp_optim_grow(opt, fsdp_num_units(opt->fs));
    if (status != FSDP_OK)
        return status;
    opt->units[index].step = step;
    opt->units[index].has_buffer = has_buffer && opt->units[index].state0 != NULL;
    return FSDP_OK;
}

void fsdp_optim_set_num_steps(fsdp_optim_t *opt, int64_t steps)
{
    opt->num_steps = steps;
}

const fsdp_optim_config_t *fsdp_optim_config(const fsdp_optim_t *opt)
{
    return &opt->cfg;
}
