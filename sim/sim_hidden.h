/* The sim backend, hidden: the cost model's pieces, profiles and counters that the tests and
 * benchmarks check.
 *
 * libfsdp.so exports only the user API of include/fsdp/ (DESIGN.md, "Layers"); these functions are
 * declared here instead, for the rest of the library and for the tests and benchmarks that link
 * the library's parts statically (FSDP_INTERNAL_LIBS in common.am). */
#ifndef FSDP_SIM_HIDDEN_H
#define FSDP_SIM_HIDDEN_H

#include <fsdp/calibrate.h>
#include <fsdp/sim.h>

/* ---- from <fsdp/calibrate.h> ---- */

/* Least squares (exposed for its tests): theta minimizing |X theta - y| for X of rows x cols
 * (row-major). Columns that are zero or linear combinations of earlier ones are not identified:
 * used[j] = 0 and theta[j] = 0. Returns the number of identified columns, -1 when out of memory. */
int fsdp_calib_lsq(const double *x, const double *y, int rows, int cols, double *theta, int *used);

/* ---- from <fsdp/sim.h> ---- */

/* "ring", "tree", "nvls", "nvls_tree", "pat" / "ll", "ll128", "simple"; "invalid" otherwise.
 * Never NULL. */
const char *fsdp_sim_algo_name(fsdp_sim_algo_t algo);
const char *fsdp_sim_proto_name(fsdp_sim_proto_t proto);

/* A built-in preset: "h100" (8x H100 SXM5 80GB per node, DGX H100) or "a100" (8x A100 SXM4
 * 80GB per node, DGX A100), optionally with a shape, "h100:nodes=4" or
 * "a100:nodes=2,gpus_per_node=4". An unknown name or option is FSDP_ERR_INVALID_PARAM,
 * logged with what is allowed. */
fsdp_status_t fsdp_sim_profile_preset(const char *spec, fsdp_sim_profile_t *profile_p);

/* The presets, comma-separated ("h100, a100"). Never NULL. */
const char *fsdp_sim_profile_presets(void);

/* A profile from JSON text or a file (the layout of traces/profiles/h100.json). A "base"
 * member names a preset to start from; otherwise every required number must be present.
 * Malformed JSON is FSDP_ERR_FORMAT (with line and column); an unknown member, a wrong type or
 * a value out of range is FSDP_ERR_INVALID_PARAM naming the member; a missing file
 * FSDP_ERR_NOT_FOUND, one that cannot be read FSDP_ERR_IO, and what is not a regular file (a
 * FIFO is not waited on) FSDP_ERR_INVALID_PARAM. Nothing is written to *profile_p unless the
 * result is FSDP_OK. */
fsdp_status_t fsdp_sim_profile_parse(const char *json, fsdp_sim_profile_t *profile_p);
fsdp_status_t fsdp_sim_profile_load(const char *path, fsdp_sim_profile_t *profile_p);

/* Checks every field's range; FSDP_ERR_INVALID_PARAM, logged, naming the first bad one. */
fsdp_status_t fsdp_sim_profile_check(const fsdp_sim_profile_t *profile);

/* The same when each node holds node_ranks ranks that run groups like this one at the same time
 * (hybrid sharding's replicate groups: one rank per node each, as many groups as a node has
 * ranks): they share the node's NICs, so a group with k ranks on a node has k / node_ranks of
 * its nics_per_node NICs when that is less than k NICs (docs/costs.md, "Tree and ring across
 * nodes"). node_ranks <= nranks / nnodes is fsdp_sim_coll_time: the group has the node alone. */
double fsdp_sim_coll_time_shared(const fsdp_sim_profile_t *profile, fsdp_sim_coll_kind_t kind,
                                 int nranks, int nnodes, int node_ranks, double nbytes,
                                 fsdp_sim_coll_cost_t *cost_p);

/* A kernel's device time. GEMMs: FLOPs / (peak x gemm_efficiency x quantization); fused
 * attention likewise with attention_efficiency (or its table by sequence length); other kernels: max(FLOPs / (vector peak x
 * compute_efficiency), bytes / (bandwidth x memory_efficiency)); each plus the kernel latency.
 * Under FSDP_SIM_OPS_EAGER a fused element-wise kernel costs the sum of its eager ops, each
 * with its own latency. */
double fsdp_sim_kernel_time(const fsdp_sim_profile_t *profile, const fsdp_kernel_t *k);

/* The same with only `sms` of the GPU's SMs free for it (1 <= sms <= gpu.sms; the rest held by
 * collectives): a GEMM's or fused attention's peak scales by sms / gpu.sms and its wave
 * quantization counts `sms` SMs; other kernels, bound by memory, keep their time. */
double fsdp_sim_kernel_time_on(const fsdp_sim_profile_t *profile, const fsdp_kernel_t *k, int sms);

/* The kernels k is launched as: 1, or its eager ops' count under FSDP_SIM_OPS_EAGER (the host
 * pays a launch for each). */
int fsdp_sim_kernel_launches(const fsdp_sim_profile_t *profile, const fsdp_kernel_t *k);

/* 1 when FSDP_SIM_OPS_EAGER prices kernels of this kind as a sequence of eager ops (for some
 * descriptors or all), 0 when always as one kernel. */
int fsdp_sim_kind_eager(fsdp_kernel_kind_t kind);

/* The tile and wave quantization of an m x n GEMM output (batch products) on `sms` SMs, in
 * (0, 1]: (m n / padded tiles' area) x (tiles / (waves x sms)), with FSDP_SIM_GEMM_TILE_M x
 * _N tiles, the longer side along the longer dimension (NVIDIA's "Matrix Multiplication
 * Background User's Guide"); an output with fewer such tiles than SMs takes the largest of
 * 128 x 128, 64 x 128 and 64 x 64 that fills them, else 64 x 64, as cuBLAS's heuristics pick
 * smaller tiles for small outputs. 1 when sms <= 0. */
double fsdp_sim_gemm_quantization(double m, double n, double batch, int sms);

/* The same for fused attention: batch x heads x ceil(seq / FSDP_SIM_ATTN_BLOCK) blocks on
 * `sms` SMs, the last block of a sequence padded. */
double fsdp_sim_attention_quantization(double batch, double heads, double seq, int sms);

/* The bytes that the eager ops of k read and write together, and their count (1 and
 * fsdp_kernel_cost's bytes for a kernel priced as one). */
double fsdp_sim_eager_bytes(const fsdp_kernel_t *k, int *ops_p);

/* "h2d", "d2h", "d2d", "h2h". Never NULL. */
const char *fsdp_sim_copy_name(fsdp_sim_copy_kind_t kind);

/* A copy: over PCIe for h2d/d2h, read and write of HBM for d2d; plus the kernel latency. */
double fsdp_sim_copy_time(const fsdp_sim_profile_t *profile, fsdp_sim_copy_kind_t kind,
                          double bytes);

/* The holds rank recorded in the last run with the book (0 for a rank that did not run). */
size_t fsdp_sim_holds_count(const fsdp_sim_holds_t *holds, int rank);

/* The sim ops table (for code that wants to wrap or inspect it). */
const fsdp_backend_ops_t *fsdp_sim_backend(void);

/* Marks this rank failed (as if its function had returned an error): peers waiting in a
 * collective with it return FSDP_ERR_RANK_FAILED. */
void fsdp_sim_rank_fail(fsdp_dev_t *dev);

/* 1 when the dev belongs to the sim backend. */
int fsdp_dev_is_sim(const fsdp_dev_t *dev);

/* The time at which the work issued so far on a stream (NULL: the compute stream) ends. */
double fsdp_sim_stream_time(fsdp_dev_t *dev, fsdp_stream_t *stream);

/* The latest of the host clock and every stream's clock: when everything issued so far ends. */
double fsdp_sim_device_time(fsdp_dev_t *dev);

/* The cluster profile the rank's world runs with. */
const fsdp_sim_profile_t *fsdp_sim_rank_profile(fsdp_dev_t *dev);

/* Data mode: how many of this rank's GEMMs read a kept packed operand (no_pack_cache), and how
 * many times one was packed, since the launch. Zeros for any other device. */
void fsdp_sim_pack_cache_stats(fsdp_dev_t *dev, uint64_t *hits_p, uint64_t *packs_p);

#endif
