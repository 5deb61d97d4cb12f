/* libfsdp: the sim backend.
 *
 * Ranks are threads of one process (or fibers on a few threads, params.fibers). Each has
 * virtual clocks priced by a cluster profile (below). A collective is a rendezvous of the
 * group's ranks: the last
 * to arrive checks that every call matches and computes the result in rank order, so results
 * never depend on thread timing. Mismatched calls, a rank that never arrives or a rank that has
 * failed make the collective return an error on every waiting rank, naming each rank's call;
 * the rendezvous never hangs (a deadlock is detected at once, anything else after the timeout).
 */
#ifndef FSDP_SIM_H
#define FSDP_SIM_H

#include <fsdp/api.h>

#include <fsdp/backend.h>
#include <fsdp/core.h>

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FSDP_SIM_DATA = 0, /* real buffers, real math */
    FSDP_SIM_SHAPE = 1 /* no buffers, bytes and time only */
} fsdp_sim_mode_t;

/* ---- the cluster profile: what the cost model knows about the hardware ----------------------
 *
 * Every number is in SI base units (seconds, bytes, bytes per second, FLOP per second); the
 * presets and the source of each of their numbers are in traces/profiles/README.md, and the
 * same presets as JSON in traces/profiles/<name>.json. A virtual clock only moves by what this
 * profile says (sim/cost.c): no wall-clock time ever enters it. */

/* NCCL's algorithms and protocols (src/graph/tuning.cc), as indexes of the tables below. */
typedef enum {
    FSDP_SIM_ALGO_RING = 0,
    FSDP_SIM_ALGO_TREE = 1,      /* all-reduce only */
    FSDP_SIM_ALGO_NVLS = 2,      /* NVLink SHARP all-reduce inside one node */
    FSDP_SIM_ALGO_NVLS_TREE = 3, /* NVLS inside nodes, a tree between them: all-reduce */
    FSDP_SIM_ALGO_PAT = 4,       /* all-gather and reduce-scatter, one rank per node (NCCL 2.23+) */
    FSDP_SIM_ALGO_COUNT
} fsdp_sim_algo_t;

typedef enum {
    FSDP_SIM_PROTO_LL = 0,
    FSDP_SIM_PROTO_LL128 = 1,
    FSDP_SIM_PROTO_SIMPLE = 2,
    FSDP_SIM_PROTO_COUNT
} fsdp_sim_proto_t;

/* Columns of NCCL's per-node-count tables: one node, two nodes, three or more. */
#define FSDP_SIM_NODE_CLASSES 3
/* The sequence lengths of gpu.attention_seq_efficiency: 512, 1024, ..., 16384 tokens (the lengths
 * of FlashAttention-2's benchmark figures) */
#define FSDP_SIM_ATTN_SEQ_POINTS 6
#define FSDP_SIM_ATTN_SEQ_MIN 512
/* treeCorrectionFactor: one entry per power of two of nBytes/64, from 64 B to 256 MiB. */
#define FSDP_SIM_TREE_SIZES 23

typedef struct fsdp_sim_gpu_profile {
    char model[64];
    size_t memory_bytes; /* device memory per GPU (the planner's capacity) */
    /* Dense peak FLOP/s of a GEMM by operand dtype (index fsdp_dtype_t; f32 on CUDA cores). */
    double matmul_flops_per_s[FSDP_DTYPE_COUNT];
    double tf32_flops_per_s; /* f32 GEMMs when allow_tf32 */
    int allow_tf32;          /* torch.backends.cuda.matmul.allow_tf32; 0 by default, as torch */
    double vector_flops_per_s; /* element-wise work (f32 CUDA cores); 0: FLOPs are free */
    double hbm_bytes_per_s;    /* device memory bandwidth; 0: memory traffic is free */
    double compute_efficiency; /* fraction of the vector FLOP/s an element-wise kernel reaches,
                                * (0, 1] */
    double memory_efficiency;  /* fraction of the memory bandwidth a kernel reaches, (0, 1] */
    /* Eager ops that PyTorch runs on its non-vectorized element-wise path (a broadcast
     * operand, a strided view, a dtype conversion) and softmax: elements per second at most,
     * whatever their bytes (docs/costs.md, "Eager element-wise ops"); 0: bytes alone */
    double strided_elements_per_s;
    /* Eager element-wise ops on PyTorch's vectorized path: the fraction of the memory bandwidth
     * they reach at a model's tensor sizes (docs/costs.md, "Eager element-wise ops"), (0, 1];
     * 0: memory_efficiency, the rate of a large copy */
    double elementwise_memory_efficiency;
    double kernel_latency_s;   /* fixed device time of every kernel and copy */
    /* GEMMs: the fraction of the matmul peak a GEMM reaches on whole tiles and full waves,
     * (0, 1]; its time is FLOPs / (peak x gemm_efficiency x quantization), the quantization of
     * its output's FSDP_SIM_GEMM_TILE_M x _N tiles on `sms` SMs (fsdp_sim_gemm_quantization) */
    double gemm_efficiency;
    /* ... times this on tensor cores (16-bit operands, or TF32) when a leading dimension of A,
     * B or C is not a multiple of 16 bytes: cuBLAS's kernels for such rows (the LM head's
     * [tokens, 50257] logits of GPT-2) reach this fraction of the aligned rate, (0, 1] */
    double gemm_unaligned_efficiency;
    /* Fused attention: the same for its matrix products, blocks of FSDP_SIM_ATTN_BLOCK queries
     * per (batch, head) spread over `sms` SMs */
    double attention_efficiency;
    /* ... by sequence length, where a source measures the kernel by length (the Triton
     * FlashAttention of 2023: docs/costs.md, "Fused attention"): [0] for head_dim 64 and below,
     * [1] above, at FSDP_SIM_ATTN_SEQ_MIN << i tokens; linear in log2(seq) between two points,
     * the nearer end's value outside them. All 0 (the presets but the -2023 ones):
     * attention_efficiency at every length. */
    double attention_seq_efficiency[2][FSDP_SIM_ATTN_SEQ_POINTS];
    int sms; /* streaming multiprocessors; 0: no tile or wave quantization */
} fsdp_sim_gpu_profile_t;

/* How the job runs the element-wise work between GEMMs (traces/profiles/README.md). */
typedef enum {
    /* each fused kernel of lib/kernels as one kernel (torch.compile, fused kernels, the gpu
     * backend): what a profile without a base uses */
    FSDP_SIM_OPS_FUSED = 0,
    /* each as the sequence of eager PyTorch ops HF's modeling_llama.py (or modeling_gpt2.py) and
     * autograd run (docs/costs.md, "Eager element-wise ops"), each op a kernel with its latency
     * and its launch: what the presets use */
    FSDP_SIM_OPS_EAGER = 1
} fsdp_sim_ops_t;

/* The output tile of the GEMM quantization model: 128 x 256, the largest CUTLASS/cuBLAS tile
 * of Ampere and Hopper bf16 GEMMs (docs/costs.md); the 256 side lies along the output's longer
 * dimension. Fused attention works on blocks of 128 queries (FlashAttention-2's kBlockM for
 * head_dim 128). */
#define FSDP_SIM_GEMM_TILE_M 128
#define FSDP_SIM_GEMM_TILE_N 256
#define FSDP_SIM_ATTN_BLOCK 128

typedef struct fsdp_sim_host_profile {
    double launch_overhead_s; /* host time of one kernel, copy or collective launch */
    double event_overhead_s;  /* host time of an event record or a stream wait */
    double launch_latency_s;  /* from the launch call to the earliest start on the device */
    double h2d_bytes_per_s;   /* host to device copies; 0: free */
    double d2h_bytes_per_s;   /* device to host (and host to host) copies; 0: free */
} fsdp_sim_host_profile_t;

typedef struct fsdp_sim_nccl_profile {
    unsigned algorithms; /* enabled: bit (1 << fsdp_sim_algo_t) */
    unsigned protocols;  /* enabled: bit (1 << fsdp_sim_proto_t) */
    int channels;        /* nChannels of the ring and tree graphs */
    /* Latencies of NCCL's model: base per call, and per step over NVLink (intra) or the
     * network (inter) [algorithm][protocol]. */
    double base_latency_s[FSDP_SIM_ALGO_COUNT][FSDP_SIM_PROTO_COUNT];
    double intra_latency_s[FSDP_SIM_ALGO_COUNT][FSDP_SIM_PROTO_COUNT];
    double inter_latency_s[FSDP_SIM_ALGO_COUNT][FSDP_SIM_PROTO_COUNT];
    double intra_bus_bytes_per_s; /* ring busBw inside a node (nChannels x bwIntra) */
    double nic_bytes_per_s;       /* one NIC */
    int nics_per_node;
    double net_overhead_s; /* getNetOverhead: floor of a multi-node ring step (x3 for Simple) */
    double net_latency_s;  /* the graph's latencyInter (twice for Simple) */
    /* Bandwidth caps by node class (0: no cap): llMaxBws, and per channel for ring LL128,
     * tree and tree LL128. */
    double ll_max_bytes_per_s[FSDP_SIM_NODE_CLASSES];
    double ring_ll128_channel_bytes_per_s[FSDP_SIM_NODE_CLASSES];
    double tree_channel_bytes_per_s[FSDP_SIM_NODE_CLASSES];
    double tree_ll128_channel_bytes_per_s[FSDP_SIM_NODE_CLASSES];
    double tree_correction[FSDP_SIM_PROTO_COUNT][FSDP_SIM_TREE_SIZES];
    double ring_plateau_factor;   /* multi-node ring Simple all-reduce latency factor */
    double nvls_bus_bytes_per_s;  /* NVLS all-reduce busBw on one node; 0: no NVLS */
    /* What NCCL's tuning model leaves out (docs/costs.md): it ranks algorithms, the time of a
     * call also holds these. */
    double call_floor_s; /* every call of 2+ ranks: host enqueue, kernel launch and start */
    double net_floor_s;  /* a call whose group spans nodes, on top: proxy progress, first
                          * network round trip */
    /* nt x threadThreshold [protocol]: below channels x this many bytes NCCL drops a ring or
     * tree channel (ring LL: x nranks), src/enqueue.cc topoGetAlgoInfo */
    double channel_bytes[FSDP_SIM_PROTO_COUNT];
    int nvls_channels; /* NVLS and NVLS-tree channels (no size-dependent drop) */
    double nvls_tree_channel_bytes_per_s[FSDP_SIM_NODE_CLASSES]; /* perChMaxNVLSTree */
    double pat_bandwidth_factor; /* PAT's busBw factor (0.75); 0: no PAT */
    /* SMs each channel of a running collective holds (NCCL runs a channel as one thread block,
     * which leaves no room on its SM for a GEMM's or fused attention's block): a GEMM or an
     * attention kernel that runs beside a collective of c channels runs on sms - c x this SMs
     * (docs/costs.md, "Collectives take SMs"). 1 in the presets; 0: collectives take none. */
    int sms_per_channel;
    /* HBM bytes a collective's kernel moves on a rank per byte it sends or receives over a link
     * (its bus bytes): the peer's write into the receive buffer, the read back from it, and the
     * user buffer read or written (NCCL's maintainers, NVIDIA/nccl issue 1428: "at least 2x ...
     * it can be 3x"). A memory-bound kernel beside it shares HBM with it (docs/costs.md, "...
     * and HBM bandwidth"). 3 in the presets; 0: collectives take no HBM bandwidth. */
    double hbm_traffic_factor;
    /* The NCCL whose tuning formulas apply, as NCCL_VERSION_CODE (2.18.5: 21805): before 2.19,
     * 2.21 and 2.23 some differ (docs/costs.md, "NCCL 2.18"); the tables above are the
     * profile's own. 0: NCCL 2.30's (the presets'). */
    int version;
} fsdp_sim_nccl_profile_t;

typedef struct fsdp_sim_profile {
    char name[64];
    /* The software the profile's measured constants come from ("PyTorch 2.11, CUDA 13.0, NCCL
     * 2.30"); "" where not stated. Descriptive: nothing is computed from it. */
    char stack[64];
    int nodes;         /* the cluster the planner lays ranks on */
    int gpus_per_node;
    fsdp_sim_gpu_profile_t gpu;
    fsdp_sim_host_profile_t host;
    fsdp_sim_nccl_profile_t nccl;
    fsdp_sim_ops_t ops; /* how element-wise work runs ("ops": "eager" or "fused") */
} fsdp_sim_profile_t;

/* The default profile of fsdp_sim_params_init: one 8xH100 SXM node. */
#define FSDP_SIM_DEFAULT_PROFILE "h100"

/* What tools take on the command line: a preset spec, or a JSON file (an argument that ends
 * in ".json" or names an existing file), either followed by ":nodes=N,gpus_per_node=G". */
FSDP_API fsdp_status_t fsdp_sim_profile_from_arg(const char *arg, fsdp_sim_profile_t *profile_p);
/* The profile as JSON text that fsdp_sim_profile_parse reads back to the same values (for a
 * trace's run row). Free it with free(); NULL when out of memory. */
FSDP_API char *fsdp_sim_profile_to_json(const fsdp_sim_profile_t *profile);

/* Dense peak FLOP/s of a GEMM in dtype under this profile (tf32 when allowed, for f32). */
FSDP_API double fsdp_sim_profile_matmul_flops(const fsdp_sim_profile_t *profile,
                                              fsdp_dtype_t dtype);

/* ---- the cost model, for tools and tests (sim/cost.c) ---- */

/* The sim's collectives. */
typedef enum {
    FSDP_SIM_COLL_ALL_GATHER,
    FSDP_SIM_COLL_REDUCE_SCATTER,
    FSDP_SIM_COLL_ALL_REDUCE,
    FSDP_SIM_COLL_BROADCAST,
    FSDP_SIM_COLL_BARRIER,
    FSDP_SIM_COLL_SPLIT
} fsdp_sim_coll_kind_t;

/* "all_gather", ...; "invalid" otherwise. Never NULL. */
FSDP_API const char *fsdp_sim_coll_name(fsdp_sim_coll_kind_t kind);

/* How NCCL would run a collective, and how long it takes. */
typedef struct fsdp_sim_coll_cost {
    fsdp_sim_algo_t algo;
    fsdp_sim_proto_t proto;
    double latency_s;         /* lat x latCount, corrections included */
    double algo_bytes_per_s;  /* algorithm bandwidth on the channels the call runs on */
    double time_s;            /* floor_s + latency_s + bytes / algo_bytes_per_s */
    double floor_s;           /* call_floor_s, plus net_floor_s across nodes */
    int channels;             /* channels the call runs on (ring and tree: fewer for small sizes) */
} fsdp_sim_coll_cost_t;

/* The fastest enabled (algorithm, protocol) by NCCL's tuning model (ncclTopoGetAlgoTime, all
 * channels, no floor) for a collective over nranks ranks on nnodes nodes moving nbytes as NCCL
 * counts them (the full buffer for all-gather and reduce-scatter), and its time: the floor, the
 * latency and the bytes over the bandwidth of the channels NCCL runs it on (docs/costs.md).
 * nranks == 1 costs a device copy of nbytes. Returns time_s; *cost_p (may be NULL) gets the
 * choice. */
FSDP_API double fsdp_sim_coll_time(const fsdp_sim_profile_t *profile, fsdp_sim_coll_kind_t kind,
                                   int nranks, int nnodes, double nbytes,
                                   fsdp_sim_coll_cost_t *cost_p);

typedef enum {
    FSDP_SIM_COPY_H2D = 0,
    FSDP_SIM_COPY_D2H = 1,
    FSDP_SIM_COPY_D2D = 2,
    FSDP_SIM_COPY_H2H = 3,
    FSDP_SIM_COPY_COUNT
} fsdp_sim_copy_kind_t;

/* A book of the SMs each rank's collectives held over a run, in the order the rank issued them,
 * kept for the next run of the same job (fsdp_sim_params_t.holds). A kernel is priced when it is
 * issued, so a GEMM issued before a collective that overlaps it would run on the whole GPU (FSDP's
 * forward issues the next unit's all-gather after the kernels it overlaps); a run given the book
 * of an earlier run of the job also prices each GEMM and attention kernel with the holds of the
 * collectives the rank has not issued yet, as they ran then, moved by how much later the rank's
 * last issued collective started than it did then. Run the job until its times settle
 * (fsdp-plan runs until the step time changes by less than a part in 10^4, six runs at most).
 * A rank whose collectives differ from the earlier run's (kind, count, dtype, group size) stops
 * using them at the first difference. */
typedef struct fsdp_sim_holds fsdp_sim_holds_t;

/* A book for a world of world_size ranks, empty; NULL when out of memory or world_size < 1. */
FSDP_API fsdp_sim_holds_t *fsdp_sim_holds_create(int world_size);
/* Accepts NULL. */
FSDP_API void fsdp_sim_holds_destroy(fsdp_sim_holds_t *holds);
/* Makes the next run with the book price its kernels as the last run did (with the same
 * earlier holds), so that it repeats the last run exactly: to trace a run already made.
 * Accepts NULL. */
FSDP_API void fsdp_sim_holds_repeat(fsdp_sim_holds_t *holds);

typedef struct fsdp_sim_params {
    int world_size;         /* >= 1; default 1 */
    int ranks_per_node;     /* 0 (default) = world_size; must divide world_size. Collectives
                             * of a group on one node use NVLink, others the network */
    double timeout_s;       /* collective timeout in (wall) seconds; default 60 */
    fsdp_sim_mode_t mode;   /* default FSDP_SIM_DATA */
    size_t device_capacity; /* bytes of device memory per rank; 0 (default) = unlimited */
    fsdp_sim_profile_t profile; /* what op costs come from; default FSDP_SIM_DEFAULT_PROFILE */
    /* How ranks run. 0 (default): one thread per rank. 1: fibers (ucontext) on `workers`
     * threads, so that a collective's rendezvous costs a user-level switch per rank instead of
     * a futex wake and a context switch: what planning thousands of ranks needs. Rank code
     * must then not rely on thread-local storage. Builds with ASan or TSan run threads
     * instead. Results and virtual times are the same either way. */
    int fibers;
    int workers; /* fiber mode: worker threads; 0 (default) = the online CPUs */
    /* Symmetric ranks, shape mode only. NULL (default): every rank runs. Else world_size
     * entries: represent[r] is the rank whose run stands for rank r's (represent[q] == q for
     * each rank q that runs). Only the ranks that stand for others run; each collective is
     * still priced with its group's full size and nodes, and starts when the last simulated
     * member of the group is ready. The caller vouches that the ranks a rank stands for would
     * run alike (fsdp_symmetric_ranks in the core derives such classes from the units of a
     * job, and fsdp_symmetry_check checks them on each rank; DESIGN.md, "Symmetric ranks");
     * the launch checks what it can: every group a split makes must hold, at each group rank,
     * a rank of the same class as the group of its first member's representative, and hold
     * the representatives of its classes. A split of
     * anything but the world, or whose colors follow no single law of the rank (one color, the
     * node, the rank in the node; with tp_size the laws of its mesh) or whose keys are not the
     * rank or one value, fails with FSDP_ERR_UNSUPPORTED: run without symmetry then. */
    const int *represent;
    /* Symmetric ranks under tensor parallelism: the tp groups' size, which must divide
     * ranks_per_node; 0 or 1 (default): none. A split's colors may then also follow the laws of
     * the dp x tp mesh (lib/core/groups.c): rank / tp_size (a tp group of consecutive ranks),
     * rank % tp_size (the dp group of a tp index) and, under hybrid sharding, rank /
     * ranks_per_node x tp_size + rank % tp_size (the node's ranks of a tp index). */
    int tp_size;
    /* Data mode: the CPU threads the world's kernels may use; 0 (default) = the online CPUs.
     * When the world has fewer ranks than that, each rank gets threads / world_size of them
     * (the first threads % world_size ranks one more) and splits its GEMMs and large
     * element-wise kernels across them, each over a fixed part of the output with no sum
     * across parts: results are the same bits whatever the count. 1: every rank computes on
     * its own thread alone. The extra threads are started at a rank's first such kernel and
     * end with the rank. */
    int threads;
    /* NULL (default): none. Else a book of world_size ranks (fsdp_sim_holds_create): the run
     * prices its GEMMs and attention kernels with the holds the book's last run recorded for the
     * collectives each rank has not issued yet, and records its own for the next run. */
    fsdp_sim_holds_t *holds;
    /* Data mode: the host bytes that the world's device and pinned segments may hold, all
     * ranks together (every simulated rank's memory is this machine's). 0 (default): 90% of
     * the memory available at launch (MemAvailable of /proc/meminfo, else the free physical
     * pages); SIZE_MAX: no bound. A segment past it fails with FSDP_ERR_NO_MEMORY and one line
     * naming the rank, the request and the bound, before any memory is touched: a model too
     * large for the machine is an error, not the kernel's out-of-memory kill. */
    size_t host_memory;
    /* Data mode: 0 (default) lets a rank keep the one GEMM operand that its launches name
     * unchanged (kernel.h's gemm b_version: the LM head's weight over the micro-batches of an
     * accumulated step) packed between launches, within half of host_memory; 1 packs it at
     * every launch. The results are the same bits either way. */
    int no_pack_cache;
} fsdp_sim_params_t;

FSDP_API void fsdp_sim_params_init(fsdp_sim_params_t *params);
/* What host_memory 0 resolves to now: 90% of MemAvailable (/proc/meminfo), else of the free
 * physical pages; SIZE_MAX when neither is known. */
FSDP_API size_t fsdp_sim_host_memory_default(void);

/* The work of one rank. `dev` is the rank's own backend context. */
typedef fsdp_status_t (*fsdp_rank_func_t)(fsdp_dev_t *dev, void *arg);

/* Runs `func` on world_size ranks and waits for all of them. A rank whose function returns
 * an error is marked failed: collectives that wait for it fail at once. Returns FSDP_OK when all
 * ranks succeeded, else the status of the lowest failing rank. If rank_status is not NULL it
 * receives each rank's status (world_size entries). */
FSDP_API fsdp_status_t fsdp_sim_launch(const fsdp_sim_params_t *params, fsdp_rank_func_t func,
                                       void *arg, fsdp_status_t *rank_status);

/* The message of the last error this rank's backend reported ("" if none). Valid until the
 * next failing call on the same rank. */
FSDP_API const char *fsdp_sim_last_error(fsdp_dev_t *dev);

/* ---- virtual time: per-rank queries for the runtime and tools ----
 *
 * A rank has a host clock (fsdp_backend_ops_t.host_time) and a clock per stream: an op issued
 * at host time h starts at max(h + launch latency, its stream's clock, the events the stream
 * waits for), or for a collective at the latest such time over its group and after the
 * previous collective of the same communicator (NCCL runs them one at a time, in call order);
 * it ends after its cost. Issuing advances the host clock by the launch overhead; a host that
 * synchronizes jumps to the event's or stream's time. All of it is deterministic. Call the
 * functions below from the rank itself (its function); they return 0, NULL or
 * FSDP_ERR_INVALID_PARAM for a dev that is not a sim rank. */

/* What a rank's device did, since the rank started or since fsdp_sim_time_reset. Busy times
 * are sums of op durations; a collective's duration runs from when its stream was ready for it
 * (NCCL's kernel is launched and waits for its peers) to its end. */
typedef struct fsdp_sim_time_stats {
    double host_time;   /* the host clock now */
    double device_time; /* fsdp_sim_device_time now */
    double kernel_s;    /* kernels on any stream */
    double gemm_s;      /* of which GEMMs (and fused attention) */
    double copy_s[FSDP_SIM_COPY_COUNT];
    double coll_s[FSDP_SIM_COLL_SPLIT + 1]; /* by fsdp_sim_coll_kind_t */
    double compute_s;      /* union of the compute stream's kernel and copy intervals */
    double comm_s;         /* union of the collective intervals, any stream */
    double exposed_comm_s; /* comm_s not overlapped by compute_s */
    double flops;          /* of every kernel */
    double gemm_flops;     /* of the GEMMs and fused attention (what MFU counts) */
    double coll_bytes;     /* as NCCL counts them */
    uint64_t n_kernels, n_copies, n_colls;
    /* what GEMMs and fused attention lost to the SMs that collectives held beside them (their
     * time less their time on the whole GPU; part of kernel_s and gemm_s) */
    double sm_held_s;
    /* what memory-bound kernels lost to the HBM bandwidth of collectives beside them (part of
     * kernel_s) */
    double hbm_held_s;
} fsdp_sim_time_stats_t;

FSDP_API fsdp_status_t fsdp_sim_time_stats(fsdp_dev_t *dev, fsdp_sim_time_stats_t *stats_p);
/* Starts a new accounting window (e.g. at a step boundary): later stats count only ops
 * issued from now on. The clocks are not touched. */
FSDP_API void fsdp_sim_time_reset(fsdp_dev_t *dev);

/* Runs one kernel (kernel.h) on host memory, synchronously, on the calling thread: the sim's
 * data-mode kernels (the element and row bodies the gpu backend launches, and the host GEMM),
 * with no device or rank. A malformed descriptor (unknown kind, invalid dtype, NULL pointer
 * with n > 0, leading dimension too small, ...) returns FSDP_ERR_INVALID_PARAM and logs one
 * error line; nothing is written then. */
FSDP_API fsdp_status_t fsdp_sim_kernel_exec(const fsdp_kernel_t *k);

#ifdef __cplusplus
}
#endif
#endif
