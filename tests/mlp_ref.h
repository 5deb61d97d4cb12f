/* The MLP of the runtime tests (flat sizes 42, 48 and 21, not multiples of the world size),
 * its batch, a single-process reference written from the documented formulas (in double,
 * independent of the library), and the same training run by FSDP on simulated ranks, with each
 * rank's collectives counted. */
#ifndef FSDP_TEST_MLP_REF_H
#define FSDP_TEST_MLP_REF_H

#include <fsdp/fsdp.h>

#include "runtime_test.h"

#define NL 3
extern const int dims[NL + 1];
#define MAXB 12 /* global batch, divisible by 1, 2, 3, 4 */
#define MAXB_ALL 60 /* rows of the batch that ref_batch may take: divisible by 1 to 6 */
/* The global batch runs and the reference take: MAXB unless a test sets it (<= MAXB_ALL). */
extern int ref_batch;

#define MAX_MICRO 3

typedef struct run_cfg {
    fsdp_strategy_t strategy;
    fsdp_optim_config_t optim;
    int world;
    int steps;
    fsdp_backward_prefetch_t prefetch;
    int ranks_per_node; /* hybrid */
    int micro;          /* gradient-accumulation micro-batches per step (0 = 1) */
    int cpu_offload;
    int sync[MAX_MICRO];        /* per micro-batch: 1 sync, 0 no_sync (the last must sync) */
    double clip_max, clip_type; /* clip_grad_norm before each step when clip_max > 0 */
    int forward_prefetch, no_limiter;
    /* fully_shard: api fsdp2, with reshard_after_forward (FSDP_RESHARD_DEFAULT when 0 is
     * not asked for: raf_set) and the explicit prefetch lists */
    int fsdp2, raf_set, raf, explicit_fwd, explicit_bwd;
} run_cfg_t;

extern float xs[MAXB_ALL * 5], ys[MAXB_ALL * 3];

/* The batch, the same for every run. */
void make_batch(void);

/* torch.optim.AdamW and torch.optim.SGD, written from their documented formulas. */
void ref_update(const fsdp_optim_config_t *o, int step, double *p, const double *g, double *m,
                double *v, int n, int decay);

/* The total gradient norm of ref_train's last clipped step. */
extern double ref_last_norm;

/* Trains the reference from init (ordered as gather_all) for cfg's steps over the whole
 * batch; final_out receives the parameters. */
void ref_train(const run_cfg_t *cfg, const float *init, double *final_out);

typedef struct run_result {
    float init[512];
    float final_params[512];
    size_t total;
    counts_t fwd[8], bwd[8]; /* per rank, last iteration */
    size_t sharded_param_bytes[8], pinned_bytes[8];
    double last_norm;
    fsdp_strategy_t effective;
} run_result_t;

/* The full parameters of the MLP's layers, in order; total_p receives their number. */
fsdp_status_t gather_all(fsdp_mlp_t *mlp, float *out, size_t *total_p);

/* Trains the MLP with FSDP on cfg's ranks, each rank on its rows of the batch. */
void run_fsdp(const run_cfg_t *cfg, run_result_t *res);

/* run_fsdp, then ref_train from the same initial parameters: the largest difference of a
 * final parameter. */
double run_fsdp_against_ref(const run_cfg_t *cfg, run_result_t *res);

#endif
