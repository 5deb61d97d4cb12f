/* libfsdp: a cluster profile (include/fsdp/sim.h) fitted to the measured events of a trace (what
 * fsdp-trace calibrate runs), by least squares of each op's time against the sim's cost model
 * (sim/cost.c).
 *
 * What is fitted, from what:
 *  - collectives (all-gather, reduce-scatter, all-reduce), per NCCL (algorithm, protocol) that
 *    the current profile picks for each call (re-classified until the choice is stable): the
 *    per-call floor and the network's per-call floor (NCCL's base latency, once a call as
 *    the floor is, is kept), the per-step latency over NVLink (one-node groups), the per-step floor
 * of a multi-node ring (net_overhead_s), the per-step network latency (ring row; the tree row when
 *    a node holds one rank of the group), and for the Simple protocol the intra-node bus
 *    bandwidth and the NIC bandwidth. Regressors per call: 1, 1 across nodes, steps by link,
 *    bus bytes by link (nbytes x steps / nranks, divided by the NICs a node drives for the
 *    network, and by the share of the channels the call runs on).
 *    A call's time is end - max(start, the end of the rank's previous call on the group),
 *    the smallest over the group's ranks (the last rank to arrive waits for nobody).
 *  - kernels: the kernel latency and the HBM bandwidth from the memory line, t = latency +
 *    bytes / (HBM x memory efficiency), the lower envelope of the element-wise kinds (fitted
 *    again without the kernels above it until the set is stable). Kernels more than 1% above
 *    the line are compute-bound: those whose event records its FLOPs in `count` give the FLOP
 *    rate, t = latency + FLOPs / (peak x compute efficiency), of GEMMs per dtype (TF32 for f32
 *    when the base allows it) and of the element-wise kinds (the vector rate). The
 *    efficiencies stay the base's.
 *  - copies: the host-to-device and device-to-host bandwidths.
 * Everything else (and whatever the trace does not constrain) keeps the base's value. */
#ifndef FSDP_CALIBRATE_H
#define FSDP_CALIBRATE_H

#include <fsdp/api.h>

#include <fsdp/sim.h>
#include <fsdp/status.h>

#include <stdint.h>
#include <stdio.h>

typedef struct fsdp_calib_options {
    int64_t run;        /* as fsdp_trace_reader_find_run (0: the latest run) */
    int ranks_per_node; /* 0: the run's config "ranks_per_node", else the whole world on one node */
} fsdp_calib_options_t;

/* Fits *out from the trace at `path`, starting from *base; writes a short report to `report`
 * (may be NULL). FSDP_ERR_NOT_FOUND / FSDP_ERR_FORMAT from the reader; FSDP_ERR_INVALID_PARAM
 * when the fitted profile does not pass fsdp_sim_profile_check. */
FSDP_API fsdp_status_t fsdp_trace_calibrate(const char *path, const fsdp_calib_options_t *opts,
                                            const fsdp_sim_profile_t *base, fsdp_sim_profile_t *out,
                                            FILE *report);

#endif
