/* What the checkpoint writer (checkpoint.c) and reader (checkpoint_load.c) share: the format's
 * name, the parts of a unit a checkpoint holds, the list of tensors of a file, and the small
 * helpers both call. Never installed. */
#ifndef FSDP_NN_CKPT_INT_H
#define FSDP_NN_CKPT_INT_H

#include "core/core_hidden.h"
#include "io/io_hidden.h"
#include "nn/nn_hidden.h"

#include <fsdp/checkpoint.h>
#include <fsdp/safetensors.h>

#include <stddef.h>
#include <stdint.h>

#define CKPT_FORMAT "libfsdp-checkpoint"
#define CKPT_VERSION 1

/* buffer 0 is the parameter shard; 1.. are the optimizer's state buffers */
typedef struct unit_bufs {
    int n;
    const char *names[3]; /* NULL for the parameter */
    float *shard[3];
    int64_t step;
    int has_buffer;
} unit_bufs_t;

typedef struct entry_list {
    fsdp_st_entry_t *e;
    int n, cap;
    char **names;
    float **data;
    int64_t *shapes; /* FSDP_MAX_DIMS per entry */
} entry_list_t;

/* out = a/b; FSDP_ERR_INVALID_PARAM (logged) when it does not fit. */
fsdp_status_t fsdp_ckpt_path_join(char *out, size_t len, const char *a, const char *b);
/* The unit's parameter shard and, with opt, the optimizer's state buffers (allocated when
 * `allocate`, for a load into a fresh optimizer). */
fsdp_status_t fsdp_ckpt_get_bufs(fsdp_unit_t *u, fsdp_optim_t *opt, int allocate,
                                 unit_bufs_t *b);
/* The tp group's size and this rank's index in it (rank_p may be NULL): 1 and 0 without tensor
 * parallelism. */
void fsdp_ckpt_tp(fsdp_t *fs, int *tp_p, int *rank_p);
/* The shape (into shape) and element count of the whole tensor of which a tp rank's parameter
 * pi is the slice pi->tp_shard says, over tp ranks. */
size_t fsdp_ckpt_whole_shape(const fsdp_param_info_t *pi, int tp, int64_t *shape);
/* Where element e of tp rank t's slice pi sits in the flattened whole tensor: increasing in e. */
size_t fsdp_ckpt_whole_index(const fsdp_param_info_t *pi, int tp, int t, size_t e);
/* A buffer's tensor name: the parameter's, or state.<param>.<buf> for an optimizer buffer. */
void fsdp_ckpt_tensor_name(char *out, size_t len, const char *param, const char *buf);
/* Every rank of the world agrees on success: a failure anywhere fails everywhere. */
fsdp_status_t fsdp_ckpt_agree(fsdp_t *fs, fsdp_status_t status);
/* Appends a tensor (the list owns data and a copy of name). */
fsdp_status_t fsdp_ckpt_list_add(entry_list_t *l, const char *name, int ndim, const int64_t *shape,
                                 float *data);
/* Fills the safetensors entries from the list, ndims[i] dimensions each. */
void fsdp_ckpt_list_finish(entry_list_t *l, int ndims[]);
void fsdp_ckpt_list_free(entry_list_t *l);

#endif
