/* What the runtime's test programs share: the record of the ranks' failed checks and launches
 * that assert it, a log of the collectives each rank issues, the hooks of a short model's
 * iteration, dtype rounding, and directory helpers. */
#ifndef FSDP_TEST_RUNTIME_H
#define FSDP_TEST_RUNTIME_H

#include <fsdp/fsdp.h>
#include <stddef.h>
#include <stdint.h>

#include "test_util.h"

/* Rank functions record their failed checks here (FSDP_RANK_CHECK and the like). */
extern fsdp_test_failure_t failure;

/* Runs func on the ranks of p, asserts the ranks' checks, and returns the launch's status. */
fsdp_status_t launch_checked(const fsdp_sim_params_t *p, fsdp_rank_func_t func, void *arg);

/* launch_checked on `world` ranks; the launch's status. */
fsdp_status_t run_ranks(int world, fsdp_rank_func_t func, void *arg);

/* launch_checked with logging off, asserting FSDP_OK: the refusals func provokes are
 * expected. */
void launch_quiet(int world, fsdp_sim_mode_t mode, fsdp_rank_func_t func);

/* ---------------- collectives logged per rank ---------------- */

typedef enum { C_AG = 0, C_RS = 1, C_AR = 2, C_BC = 3 } coll_kind_t;

typedef struct coll {
    coll_kind_t kind;
    size_t n; /* elements each rank sends (all-gather, broadcast) or receives (rs) */
    int group_size;
    fsdp_dtype_t dtype;
    fsdp_reduce_op_t op; /* reductions */
} coll_t;

#define MAX_LOG 256

typedef struct counts {
    int all_gather, reduce_scatter, all_reduce;
} counts_t;

/* This rank's collectives since wrap_ops or the caller's reset: the log leaves out the first
 * iteration's forward-order check (i32 all-gathers), the counts take every collective; the
 * dtypes are the last of each kind's, the order check's left out. */
extern _Thread_local coll_t tl_log[MAX_LOG];
extern _Thread_local int tl_nlog;
extern _Thread_local counts_t tl_counts;
extern _Thread_local fsdp_dtype_t tl_ag_dtype, tl_rs_dtype, tl_ar_dtype;

/* Interposes the logging collectives on this rank's ops table (the backend is just a table)
 * and clears the log, the counts and the dtypes. */
void wrap_ops(fsdp_dev_t *dev, fsdp_backend_ops_t *wrapped);

/* Collectives of the log with this kind, size and group size. */
int count_colls(const coll_t *log, int nlog, coll_kind_t kind, size_t n, int group_size);

/* ---------------- a root and its child a through one iteration ---------------- */

/* The forward of a root and its child a, then the pre-backward hooks of both. */
fsdp_status_t forward_to_backward(fsdp_unit_t *root, fsdp_unit_t *a);

/* The post-backward hooks of a and its root, then the final callback. */
fsdp_status_t finish_backward(fsdp_t *fs, fsdp_unit_t *root, fsdp_unit_t *a);

/* ---------------- low-precision values ---------------- */

/* x rounded to dt (bf16, f16; f32 unchanged). */
float round_to(fsdp_dtype_t dt, float x);
/* x in the 16-bit dtype dt, and back. */
uint16_t to_low(fsdp_dtype_t dt, float x);
float from_low(fsdp_dtype_t dt, uint16_t x);

/* ---------------- directories ---------------- */

/* 1 when some regular file under dir contains `needle`. */
int tree_contains(const char *dir, const char *needle);
/* Removes dir and everything under it. */
void remove_tree(const char *dir);

#endif
