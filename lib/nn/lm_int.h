/* What the language models (GPT-2, Llama) share, so that gpt2*.c and llama*.c hold only what is
 * particular to each: the model on one rank behind lm.h, a root unit and one unit per layer made
 * from HF's module tree by a wrap policy, with per-layer checkpointing and a loss scale, whose
 * family's own functions lm.h's call (lm_units.c); and one training step's scaffolding, the order
 * of its hooks, allocations and frees, around the model's own kernels (lm.c). */
#ifndef FSDP_NN_LM_INT_H
#define FSDP_NN_LM_INT_H

#include <fsdp/core.h>
#include <fsdp/lm.h>
#include <fsdp/wrap.h>

#include "nn/nn_int.h"

/* ---- specs (spec.c) ---- */

/* A key of a family's spec and the config field it sets: an int (decimal digits), a float or a
 * double (finite in the field's own type: 1e300 is no float), each in [lo, hi]; or a choice,
 * the int index of its value among choices (NULL-terminated). */
typedef enum {
    FSDP_NN_SPEC_INT,
    FSDP_NN_SPEC_FLOAT,
    FSDP_NN_SPEC_DOUBLE,
    FSDP_NN_SPEC_CHOICE
} fsdp_nn_spec_type_t;

typedef struct fsdp_nn_spec_key {
    const char *name;
    fsdp_nn_spec_type_t type;
    size_t offset; /* of the field in the config */
    double lo, hi;
    const char *const *choices;
} fsdp_nn_spec_key_t;

/* Sets cfg's fields from what follows the first ':' of spec ("llama:layers=2,eps=1e-6"): one
 * or more key=value of keys[0..nkeys) (nkeys <= 32), comma-separated, each key at most once.
 * Anything else (an empty spec or item,
 * an unknown or repeated key, a value outside its range or type) is FSDP_ERR_INVALID_PARAM,
 * logged naming the spec, the key and what is allowed (form: the spec's full form); cfg may
 * then be partly written. */
fsdp_status_t fsdp_nn_spec_parse(const char *spec, const char *form, const fsdp_nn_spec_key_t *keys,
                                 int nkeys, void *cfg);

/* ---- the model on one rank (lm_units.c) ---- */

typedef struct fsdp_lm_tree fsdp_lm_tree_t;

/* What a family (GPT-2, Llama) does its own way behind lm.h's functions. */
typedef struct fsdp_lm_family {
    const char *name;      /* "gpt2", "llama": what its log lines start with */
    const char *layer;     /* "block", "layer": what they call a layer unit */
    const char *wrap_type; /* HF's class of a layer, which ModuleWrapPolicy wraps */
    size_t size;           /* bytes of the family's model, whose first member is the fsdp_lm_t */
    int max_checkpoint;    /* the highest FSDP_LM_CKPT_* policy it has; above it runs FULL */
    /* HF's module tree of a configuration, in room of fsdp_lm_tree_alloc's */
    fsdp_status_t (*build)(fsdp_lm_tree_t *t, const void *cfg);
    fsdp_status_t (*init_params)(fsdp_lm_t *lm, uint64_t seed);
    fsdp_status_t (*forward_backward)(fsdp_lm_t *lm, const int32_t *inputs, const int32_t *targets,
                                      size_t batch, size_t seq, float *loss_p);
    /* weights of this family (checked), opened for a shape it checks against the model's */
    fsdp_status_t (*load_weights)(fsdp_lm_t *lm, const fsdp_lm_weights_t *weights);
    fsdp_status_t (*save_weights)(fsdp_lm_t *lm, const char *path);
} fsdp_lm_family_t;

/* The first member of struct fsdp_gpt2 and struct fsdp_llama, which fsdp_lm_destroy frees. */
struct fsdp_lm {
    const fsdp_lm_family_t *family;
    fsdp_t *fs;
    int n_layer;
    fsdp_unit_t *root;    /* the embedding, the final norm and the LM head */
    fsdp_unit_t **layers; /* n_layer */
    int *checkpoint;      /* per layer: its FSDP_LM_CKPT_* policy */
    float loss_scale;
};

/* The first member of a family's opened checkpoint. It names the family rather than pointing to
 * its table, so that the file which reads checkpoints need not name the file that holds the
 * table, which calls it. */
struct fsdp_lm_weights {
    const char *family; /* the family's name */
    void (*close)(fsdp_lm_weights_t *weights);
};

/* Makes a model of `family` on fs: a zeroed model of family->size bytes with n_layer layers, the
 * units that ModuleWrapPolicy({family->wrap_type}) cuts from the tree family->build(cfg) makes (a
 * root and one per layer), checkpointing off, a loss scale of 1. The family fills in the rest of
 * its model. On failure nothing is left but units, which belong to fs and go with it. */
fsdp_status_t fsdp_lm_create(fsdp_t *fs, const fsdp_lm_family_t *family, int n_layer,
                             const void *cfg, fsdp_lm_t **lm_p);
/* A host buffer of as many floats as the largest parameter of the root and of layer 0 (the
 * layers are alike), for writing parameters one at a time; NULL when out of memory. */
float *fsdp_lm_param_buffer(fsdp_lm_t *lm);
/* lm when it is of the family named `family`; else NULL, and an error logged that `what` needs
 * that family. */
fsdp_lm_t *fsdp_lm_of_family(fsdp_lm_t *lm, const char *family, const char *what);

/* HF's module tree in named_modules order, with each module's own parameters: module m holds
 * params [first[m], first[m] + count[m]). The models build it, naming their parameters as HF
 * does, and the wrap policy cuts it into units. */
#define FSDP_LM_NAME_LEN 96

struct fsdp_lm_tree {
    fsdp_module_desc_t *mods;
    char (*mnames)[FSDP_LM_NAME_LEN];
    int *first, *count;
    fsdp_param_spec_t *params; /* names point into pnames */
    char (*pnames)[FSDP_LM_NAME_LEN];
    int nmods, nparams;
};

/* Room for nmods modules and nparams parameters; on failure nothing is left allocated. */
fsdp_status_t fsdp_lm_tree_alloc(fsdp_lm_tree_t *t, int nmods, int nparams);
void fsdp_lm_tree_free(fsdp_lm_tree_t *t);
/* Adds module `name` of `type` under `parent` (-1: none) and returns its index; the parameters
 * added next, until the next module, are its own. */
int fsdp_lm_tree_module(fsdp_lm_tree_t *t, const char *name, const char *type, int parent);
/* Adds a trainable parameter of that shape to the last module and returns the buffer
 * (FSDP_LM_NAME_LEN bytes) its name is to be written to. */
char *fsdp_lm_tree_param(fsdp_lm_tree_t *t, int ndim, const int64_t shape[2]);

/* ---- one forward and backward (lm.c) ---- */

/* The buffers every step has, on the device; the models' run states begin with it and add their
 * own. Saved tensors are FSDP_MEM_ACTIVATION, gradients of activations FSDP_MEM_TEMPORARY. */
typedef struct fsdp_lm_run {
    fsdp_lm_t *lm;
    fsdp_dev_t *dev;
    fsdp_stream_t *s;
    fsdp_mem_t *mem;
    size_t B, T, BT, width, V; /* rows, tokens per row, B T, the residual stream's, vocab */
    fsdp_dtype_t dt;           /* the compute dtype: weights, activations, their gradients */
    size_t es;                 /* its element size */
    int32_t *tokens, *targets; /* [BT] */
    void **resid;              /* [L + 1]: the input of layer l, then the last output */
    void *acts;                /* [L] of the model's per-layer activations */
    void *nf;                  /* the final norm's output [BT, width] */
    float *meanf, *rstdf;      /* its statistics [BT] (meanf: LayerNorm only) */
    void *logits;              /* [BT, V], then their gradient */
    float *losses, *loss;      /* [BT] per row, and the loss */
    void *dres;                /* the gradient of the residual stream, walked down the layers */
    void *tmp[5];              /* a layer's backward scratch */
    /* Tensor parallelism (lm_tp.c): the tp group (NULL: none; then rows = BT, tp = 1, v0 = 0,
     * vl = V). The residual stream, the norms and their gradients are sequence shards, torch's
     * Shard(1) of [B, T, width]: this rank's rows [tp_rank T / tp, (tp_rank + 1) T / tp) of
     * every sequence, rows = BT / tp of them; resid, nf, dres and the final norm's statistics
     * hold them. The embedding and the LM head hold vocabulary rows [v0, v0 + vl). */
    fsdp_group_t *tpg;
    size_t tp, tp_rank, rows, v0, vl;
    int32_t *ltokens; /* [BT] the tokens as rows of this rank's vocabulary, -1 outside */
    void *nff;        /* the final norm's output all-gathered [BT, width], kept for the head */
} fsdp_lm_run_t;

/* The model's part of a step, called in the order the step's comments give. */
typedef struct fsdp_lm_ops {
    size_t layer_acts; /* bytes of one layer's entry of acts */
    int norm_mean;     /* 1: the final norm keeps its rows' mean as well (LayerNorm) */
    int root_params;   /* parameters of the root unit, at most FSDP_LM_MAX_ROOT_PARAMS */
    /* once the batch is on the device, before the forward (NULL: nothing to do) */
    fsdp_status_t (*prepare)(fsdp_lm_run_t *r);
    fsdp_status_t (*embed_fwd)(fsdp_lm_run_t *r); /* resid[0] from the tokens */
    /* layer l's forward from resid[l], keeping its activations, and resid[l + 1] */
    fsdp_status_t (*layer_fwd)(fsdp_lm_run_t *r, int l);
    void (*layer_forget)(fsdp_lm_run_t *r, int l); /* frees what its backward recomputes */
    fsdp_status_t (*norm_fwd)(fsdp_lm_run_t *r);   /* nf and its statistics from resid[L] */
    fsdp_status_t (*head_fwd)(fsdp_lm_run_t *r);   /* logits from nf */
    /* NULL, or the memory of the loss as eager PyTorch computes it: at the end of the forward
     * (after head_fwd: what the loss keeps; it may free the logits) and at the start of the
     * backward (before the cross-entropy kernel: the logits' gradient into logits) */
    fsdp_status_t (*loss_fwd)(fsdp_lm_run_t *r);
    fsdp_status_t (*loss_bwd)(fsdp_lm_run_t *r);
    /* from the logits' gradient: the head's weight gradient into g, nf's gradient into dnf */
    fsdp_status_t (*head_bwd)(fsdp_lm_run_t *r, void **g, void *dnf);
    /* the final norm's backward: its weight gradients, and dres (written, not added to) */
    fsdp_status_t (*norm_bwd)(fsdp_lm_run_t *r, void **g, const void *dnf);
    /* after layer l's pre-backward hook: recomputes what it did not keep (forward's hooks are not
     * re-run); then its backward turns dres into the gradient of its input */
    fsdp_status_t (*layer_recompute)(fsdp_lm_run_t *r, int l);
    fsdp_status_t (*layer_bwd)(fsdp_lm_run_t *r, int l);
    void (*layer_free)(fsdp_lm_run_t *r, int l);            /* frees all its activations */
    fsdp_status_t (*embed_bwd)(fsdp_lm_run_t *r, void **g); /* from dres into the root's */
    void (*cleanup)(fsdp_lm_run_t *r); /* frees the model's own buffers (NULL: none) */
} fsdp_lm_ops_t;

#define FSDP_LM_MAX_ROOT_PARAMS 4

/* Checks a batch on the host: batch x seq within the model's longest sequence max_seq
 * (`seq_what` says what sets it), buffers of per_token elements per token (the largest of
 * them) within 2^60 bytes, NULL inputs and targets only in shape mode, tokens within the
 * vocabulary, some target counted. *count_p gets the number of targets to predict. */
fsdp_status_t fsdp_lm_check_batch(const fsdp_lm_t *lm, int max_seq, const char *seq_what, int vocab,
                                  double per_token, const int32_t *inputs, const int32_t *targets,
                                  size_t batch, size_t seq, size_t *count_p);
/* Zeroes r and fills its shapes and the compute dtype, which every unit must share (else
 * FSDP_ERR_INVALID_PARAM, logged). */
fsdp_status_t fsdp_lm_run_init(fsdp_lm_run_t *r, fsdp_lm_t *lm, size_t batch, size_t seq,
                               size_t width, size_t vocab);
/* The step: the batch to the device, the forward inside the root's hooks, the loss (mean over
 * the count targets, divided by the loss scale for backward) and the backward through every
 * unit, the final callback; *loss_p gets the loss. Frees every buffer of r. */
fsdp_status_t fsdp_lm_run_step(fsdp_lm_run_t *r, const fsdp_lm_ops_t *ops, const int32_t *inputs,
                               const int32_t *targets, size_t count, float *loss_p);

/* Kernel launches and buffers of a run, for the models' own code. */
static inline fsdp_status_t fsdp_lm_launch(fsdp_lm_run_t *r, const fsdp_kernel_t *k)
{
    return fsdp_dev_kernel(r->dev, r->s, k);
}

/* n elements of the compute dtype */
static inline fsdp_status_t fsdp_lm_alloc(fsdp_lm_run_t *r, size_t n, fsdp_mem_category_t cat,
                                          void **p)
{
    return fsdp_mem_alloc(r->mem, n * r->es, cat, r->s, p);
}

/* n floats */
static inline fsdp_status_t fsdp_lm_alloc_f(fsdp_lm_run_t *r, size_t n, fsdp_mem_category_t cat,
                                            float **p)
{
    return fsdp_mem_alloc(r->mem, n * sizeof(float), cat, r->s, (void **)p);
}

/* frees a buffer of the run and forgets it */
#define FSDP_LM_FREE(r, p) (fsdp_mem_free((r)->mem, (p)), (p) = NULL)

/* ---- tensor parallelism's collectives (lm_tp.c), on the compute stream, traced with the unit
 * and the hook whose code issues them ---- */

/* Fills r's tensor-parallel fields from the model's fsdp_t: the group, rows and the vocabulary
 * slice; with tp > 1 refuses a seq that tp does not divide, naming both. */
fsdp_status_t fsdp_lm_tp_init(fsdp_lm_run_t *r);
/* Sequence parallelism's all-gather (Shard(1) -> Replicate): full [BT, cols] from every tp
 * rank's local [rows, cols]; the gathered [tp, B, T / tp, cols] is permuted into [B, T, cols]
 * by tp chunk copies, as torch's all_gather along dim 1 copies its chunks into place. */
fsdp_status_t fsdp_lm_sp_gather(fsdp_lm_run_t *r, const void *local, void *full, size_t cols);
/* Its reduce-scatter (Partial -> Shard(1)): local [rows, cols] = this rank's rows of the sum
 * over tp of full [BT, cols]; full is first permuted into [tp, B, T / tp, cols] by chunk
 * copies (torch's cat of the chunks along dim 1), then reduce-scattered. */
fsdp_status_t fsdp_lm_sp_scatter(fsdp_lm_run_t *r, const void *full, void *local, size_t cols);
/* Shard(-1) -> Replicate of the logits: full [BT, vl tp] from every rank's [BT, vl]. */
fsdp_status_t fsdp_lm_tp_gather_cols(fsdp_lm_run_t *r, const void *local, void *full);

/* The embedding of the run's tokens into resid[0]: the rows of wte, plus those of wpe (the
 * positions) unless NULL. */
fsdp_status_t fsdp_lm_embed_fwd(fsdp_lm_run_t *r, const void *wte, const void *wpe);
/* Its backward from dres: the token rows into dwte, the positions' into dwpe unless NULL. */
fsdp_status_t fsdp_lm_embed_bwd(fsdp_lm_run_t *r, void *dwte, void *dwpe);

#endif
