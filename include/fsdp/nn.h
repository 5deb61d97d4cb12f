/* libfsdp: built-in models and optimizers, written only against backend kernels and the FSDP
 * hooks, so the same code trains on every backend. */
#ifndef FSDP_NN_H
#define FSDP_NN_H

#include <fsdp/api.h>

#include <fsdp/core.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- optimizers: PyTorch's update formulas on the sharded flat parameters ---- */

typedef enum { FSDP_OPTIM_SGD = 0, FSDP_OPTIM_ADAMW = 1 } fsdp_optim_kind_t;

typedef struct fsdp_optim_config {
    fsdp_optim_kind_t kind; /* FSDP_OPTIM_ADAMW */
    float lr;               /* 1e-3 */
    /* SGD (torch.optim.SGD) */
    float momentum;  /* 0 */
    float dampening; /* 0 */
    int nesterov;    /* 0; needs momentum > 0 and dampening == 0 */
    /* AdamW (torch.optim.AdamW) */
    float beta1, beta2; /* 0.9, 0.999 */
    float eps;          /* 1e-8 */
    /* both; default 0 for SGD and 1e-2 for AdamW, as torch */
    float weight_decay;
    int no_decay_1d; /* 0: decay every parameter; 1: exempt parameters with ndim <= 1 */
} fsdp_optim_config_t;

/* Defaults of torch.optim for the given kind. */
FSDP_API void fsdp_optim_config_init(fsdp_optim_config_t *cfg, fsdp_optim_kind_t kind);
/* Checks ranges (lr >= 0, 0 <= beta < 1, eps >= 0, nesterov rules...). */
FSDP_API fsdp_status_t fsdp_optim_config_check(const fsdp_optim_config_t *cfg);

typedef struct fsdp_optim fsdp_optim_t;

FSDP_API fsdp_status_t fsdp_optim_create(fsdp_t *fs, const fsdp_optim_config_t *cfg,
                                         fsdp_optim_t **opt_p);
FSDP_API void fsdp_optim_destroy(fsdp_optim_t *opt);
/* One step over every unit's sharded parameter with its sharded gradient; units without a
 * gradient are skipped, as torch skips parameters whose .grad is None. */
FSDP_API fsdp_status_t fsdp_optim_step(fsdp_optim_t *opt);

/* The optimizer state of one unit's shard, laid out as the shard (fsdp_unit_local_shard), for
 * state dicts and checkpoints. */
typedef struct fsdp_optim_state_view {
    int nbuf;             /* 2 (AdamW), 1 (SGD with momentum) or 0 */
    const char *names[2]; /* "exp_avg", "exp_avg_sq" / "momentum_buffer", torch's names */
    float *buf[2];        /* S floats each; NULL before the first step unless allocated */
    int64_t step;         /* steps this unit has taken */
    int has_buffer;       /* SGD: the momentum buffer holds a value */
} fsdp_optim_state_view_t;

/* The most steps a unit may have taken: counts stay exact as doubles and never wrap. */
#define FSDP_OPTIM_STEP_MAX (INT64_C(1) << 53)

/* ---- MLP: Linear/ReLU stack, MSE loss ---- */

#define FSDP_MLP_MAX_LAYERS 128

typedef struct fsdp_mlp fsdp_mlp_t;

/* dims[0] inputs, dims[nlayers] outputs; every Linear is its own unit ("layers.<i>") under a
 * parameter-less root. */
FSDP_API fsdp_status_t fsdp_mlp_create(fsdp_t *fs, const int *dims, int nlayers,
                                       fsdp_mlp_t **mlp_p);
FSDP_API void fsdp_mlp_destroy(fsdp_mlp_t *mlp);
/* Parses "mlp:16,32,4" or "16,32,4" into dims; returns the number of layers or -1. */
FSDP_API int fsdp_mlp_parse_spec(const char *spec, int *dims, int max_dims);
/* Parameters of the MLP of widths dims[0..nlayers]: each Linear's weight and bias. */
FSDP_API uint64_t fsdp_mlp_num_params(const int *dims, int nlayers);

FSDP_API fsdp_unit_t *fsdp_mlp_layer(fsdp_mlp_t *mlp, int layer);

/* nn.Linear's default init: weight and bias uniform in +-1/sqrt(in), from a deterministic
 * generator seeded with `seed`; identical on every rank. */
FSDP_API fsdp_status_t fsdp_mlp_init_params(fsdp_mlp_t *mlp, uint64_t seed);

/* Scales the loss that backward differentiates (1/K for K gradient-accumulation micro-batches,
 * so that their summed gradients equal one step over the concatenated batch). The loss the
 * forward reports stays the plain mean. Default 1. */
FSDP_API void fsdp_mlp_set_loss_scale(fsdp_mlp_t *mlp, float scale);

/* The phases of a model's step, for tools that account memory per phase (fsdp-plan). */
typedef enum { FSDP_PHASE_FORWARD = 0, FSDP_PHASE_BACKWARD = 1 } fsdp_phase_t;
typedef void (*fsdp_phase_func_t)(fsdp_phase_t phase, void *arg);
/* func (NULL: none, the default) is called on the rank's thread as each phase of
 * fsdp_mlp_forward_backward begins. */
FSDP_API void fsdp_mlp_set_phase_hook(fsdp_mlp_t *mlp, fsdp_phase_func_t func, void *arg);

/* One forward and backward over `batch` rows: x [batch, dims[0]] and y [batch, dims[L]] in
 * host memory. Runs every FSDP hook and the final callback; leaves the sharded gradients for
 * the optimizer. *loss_p: mean squared error over this rank's rows. */
FSDP_API fsdp_status_t fsdp_mlp_forward_backward(fsdp_mlp_t *mlp, const float *x, const float *y,
                                                 size_t batch, float *loss_p);

/* ---- deterministic random numbers (the same sequence everywhere) ---- */

typedef struct fsdp_rng {
    uint64_t state;
} fsdp_rng_t;

FSDP_API void fsdp_rng_seed(fsdp_rng_t *rng, uint64_t seed);
/* Uniform in [lo, hi). One fsdp_rng_next. */
FSDP_API float fsdp_rng_uniform(fsdp_rng_t *rng, float lo, float hi);
/* Standard normal (Box-Muller). Two fsdp_rng_next, always. */
FSDP_API float fsdp_rng_normal(fsdp_rng_t *rng);

#ifdef __cplusplus
}
#endif
#endif
