/* Collectives of tensor-parallel groups, priced in closed form (docs/costs.md, "Groups inside a
 * node").
 *
 * Tensor parallelism all-gathers and reduce-scatters activations, and all-reduces a few small
 * tensors, over groups of 2, 4 or 8 consecutive ranks of one node, every layer. On the h100
 * preset such a group is priced on NVLink with NCCL's latencies and the per-call floor, which
 * the small messages of these calls are mostly made of; the same group across nodes pays the
 * network's. The all-reduce of a group of fewer than 8 ranks takes the NVLS bandwidth NCCL's own
 * model gives that many heads, and NVLS never wins an all-gather or reduce-scatter there, as in
 * NCCL's model. Last, a launch of 2 nodes of 8 ranks split into groups of consecutive ranks runs
 * each group's all-gather at the time of one node, and the groups of one rank in every tp (the
 * data-parallel dimension) at the time of 2 nodes sharing each node's NICs. */
#include <fsdp/fsdp.h>

#include <math.h>
#include <stdio.h>

#include "sim_hidden.h"
#include "test_util.h"

#define P2(e) ldexp(1.0, (e)) /* 2^e */
#define FLOOR_S 10.3e-6       /* h100's call_floor_s */
#define CHANNELS 32           /* h100's nccl.channels */

static void close_to(double got, double want, double rel)
{
    CU_ASSERT(fabs(got - want) <= rel * fabs(want));
    if (!(fabs(got - want) <= rel * fabs(want)))
        fprintf(stderr, "got %.12g, want %.12g\n", got, want);
}

static fsdp_sim_profile_t h100(void)
{
    fsdp_sim_profile_t p;

    CU_ASSERT_EQUAL_FATAL(fsdp_sim_profile_preset("h100", &p), FSDP_OK);
    return p;
}

/* The channels of a ring call, as NCCL drops them (docs/costs.md, "Channels by size"). */
static int ring_channels(double bytes, double per_channel)
{
    double c = floor(bytes / per_channel);

    return c >= CHANNELS ? CHANNELS : c < 1.0 ? 1 : (int)c;
}

/* All-gather and reduce-scatter of n = 2, 4, 8 ranks of one node: ring LL for a small
 * activation (16 KiB in all: 6.6 + (n - 1) x 0.6 us of NVLink latency after the 10.3 us floor,
 * min(141, 370 / 2) GB/s x n / (n - 1) on the channels that 4 KiB x n per channel leave), ring
 * Simple for a large one (256 MiB: 8.4 + (n - 1) x 3.4 us, 370 GB/s x n / (n - 1) on all 32). */
static void test_gather_in_node(void)
{
    fsdp_sim_profile_t p = h100();
    static const fsdp_sim_coll_kind_t kinds[2] = {FSDP_SIM_COLL_ALL_GATHER,
                                                  FSDP_SIM_COLL_REDUCE_SCATTER};
    double small = P2(14), large = P2(28);

    for (int k = 0; k < 2; k++) {
        for (int n = 2; n <= 8; n *= 2) {
            fsdp_sim_coll_cost_t cc;
            double t, lat, bw;
            int c;

            t = fsdp_sim_coll_time(&p, kinds[k], n, 1, small, &cc);
            lat = 6.6e-6 + (n - 1) * 0.6e-6;
            c = ring_channels(small, 4096.0 * n);
            bw = 141e9 * n / (n - 1) * c / CHANNELS;
            CU_ASSERT_EQUAL(cc.algo, FSDP_SIM_ALGO_RING);
            CU_ASSERT_EQUAL(cc.proto, FSDP_SIM_PROTO_LL);
            CU_ASSERT_EQUAL(cc.channels, c);
            close_to(cc.floor_s, FLOOR_S, 1e-12);
            close_to(cc.latency_s, lat, 1e-12);
            close_to(t, FLOOR_S + lat + small / bw, 1e-12);
            /* the floor and the latency are most of it: 18.4, 21.5 and 24.4 us */
            CU_ASSERT((FLOOR_S + lat) / t > 0.8);

            t = fsdp_sim_coll_time(&p, kinds[k], n, 1, large, &cc);
            lat = 8.4e-6 + (n - 1) * 3.4e-6;
            CU_ASSERT_EQUAL(cc.algo, FSDP_SIM_ALGO_RING);
            CU_ASSERT_EQUAL(cc.proto, FSDP_SIM_PROTO_SIMPLE);
            CU_ASSERT_EQUAL(cc.channels, CHANNELS);
            close_to(cc.latency_s, lat, 1e-12);
            close_to(t, FLOOR_S + lat + large / (370e9 * n / (n - 1)), 1e-12);
        }
    }
}

/* The same 8-rank all-gather with its ranks on 2 nodes (4 a node, each with its own NIC):
 * one of the 7 ring steps crosses the network (2.7 us LL, 14 us Simple, the NVLink steps raised
 * to the 1 us network overhead, x 3 for Simple), and the bus is the 4 NICs' 188 GB/s; LL is
 * capped by the 2-node llMaxBw, 39 GB/s. */
static void test_gather_across_nodes(void)
{
    fsdp_sim_profile_t p = h100();
    fsdp_sim_coll_cost_t cc;
    double small = P2(14), large = P2(28), t, lat, in_node;

    in_node = fsdp_sim_coll_time(&p, FSDP_SIM_COLL_ALL_GATHER, 8, 1, small, NULL);
    t = fsdp_sim_coll_time(&p, FSDP_SIM_COLL_ALL_GATHER, 8, 2, small, &cc);
    lat = 6.6e-6 + 6 * 1.0e-6 + 2.7e-6;
    CU_ASSERT_EQUAL(cc.algo, FSDP_SIM_ALGO_RING);
    CU_ASSERT_EQUAL(cc.proto, FSDP_SIM_PROTO_LL);
    CU_ASSERT_EQUAL(cc.channels, 1);
    close_to(cc.latency_s, lat, 1e-12);
    close_to(t, FLOOR_S + lat + small / (39e9 * 8 / 7 / CHANNELS), 1e-12);
    CU_ASSERT(t > 1.5 * in_node); /* 37.4 us against 24.4 */

    in_node = fsdp_sim_coll_time(&p, FSDP_SIM_COLL_ALL_GATHER, 8, 1, large, NULL);
    t = fsdp_sim_coll_time(&p, FSDP_SIM_COLL_ALL_GATHER, 8, 2, large, &cc);
    lat = 8.4e-6 + 6 * 3.4e-6 + 14e-6;
    CU_ASSERT_EQUAL(cc.proto, FSDP_SIM_PROTO_SIMPLE);
    close_to(cc.latency_s, lat, 1e-12);
    close_to(t, FLOOR_S + lat + large / (4 * 47e9 * 8 / 7), 1e-12);
    CU_ASSERT(t > 1.9 * in_node); /* half of NVLink's bandwidth */

    /* 2 ranks on 2 nodes: the ring's one network step at the tree's latency (one rank a node),
     * one NIC */
    t = fsdp_sim_coll_time(&p, FSDP_SIM_COLL_ALL_GATHER, 2, 2, large, &cc);
    CU_ASSERT_EQUAL(cc.algo, FSDP_SIM_ALGO_RING);
    close_to(t, FLOOR_S + 8.4e-6 + 14e-6 + large / (47e9 * 2), 1e-12);
}

/* NCCL's NVLS heads inside a node: 8 ranks run at 40 GB/s a head, 4 and 2 at 60 (the fastest
 * of Hopper's speeds whose n + 1 shares fit a GPU's 370 GB/s); NVLS all-reduce busBw is 2 x 0.85
 * x speed x (n - 1), 476 / 306 / 102 GB/s, so 8 ranks keep the measured 480 and 4 and 2 ranks
 * take 480 x 180 / 280 and 480 x 60 / 280. Below the ring's 370, NCCL, and the model, run their
 * all-reduces as rings; 8 ranks run NVLS from a few MiB on. */
static void test_all_reduce_in_node(void)
{
    fsdp_sim_profile_t p = h100(), nvls_only = p;
    static const double nvls_bus[9] = {
        [2] = 480e9 * 60 / 280, [4] = 480e9 * 180 / 280, [8] = 480e9};
    double s = P2(26);

    nvls_only.nccl.algorithms = 1u << FSDP_SIM_ALGO_NVLS;
    for (int n = 2; n <= 8; n *= 2) {
        fsdp_sim_coll_cost_t cc;
        double t;

        t = fsdp_sim_coll_time(&nvls_only, FSDP_SIM_COLL_ALL_REDUCE, n, 1, s, &cc);
        CU_ASSERT_EQUAL(cc.algo, FSDP_SIM_ALGO_NVLS);
        CU_ASSERT_EQUAL(cc.channels, 16);
        close_to(cc.algo_bytes_per_s, nvls_bus[n] * n / (2.0 * (n - 1)), 1e-12);
        close_to(t, FLOOR_S + 25e-6 + s / (nvls_bus[n] * n / (2.0 * (n - 1))), 1e-12);

        t = fsdp_sim_coll_time(&p, FSDP_SIM_COLL_ALL_REDUCE, n, 1, s, &cc);
        if (n < 8) {
            CU_ASSERT_EQUAL(cc.algo, FSDP_SIM_ALGO_RING);
            CU_ASSERT_EQUAL(cc.proto, FSDP_SIM_PROTO_SIMPLE);
            close_to(t, FLOOR_S + 8.4e-6 + 2 * (n - 1) * 3.4e-6 + s / (370e9 * n / (2.0 * (n - 1))),
                     1e-12);
        } else {
            CU_ASSERT_EQUAL(cc.algo, FSDP_SIM_ALGO_NVLS);
            close_to(t, FLOOR_S + 25e-6 + s / (480e9 * 8 / 14), 1e-12);
        }
    }
    /* a TP group's small all-reduce (a norm's statistics, a loss): ring LL, one channel */
    {
        fsdp_sim_coll_cost_t cc;
        double t = fsdp_sim_coll_time(&p, FSDP_SIM_COLL_ALL_REDUCE, 4, 1, 4096.0, &cc);
        CU_ASSERT_EQUAL(cc.proto, FSDP_SIM_PROTO_LL);
        close_to(t, FLOOR_S + 6.6e-6 + 6 * 0.6e-6 + 4096.0 / (141e9 * 4 / 6 / CHANNELS), 1e-12);
    }
}

/* NCCL (2.19 on) also tunes NVLS for all-gather and reduce-scatter inside a node, with busBw =
 * heads x speed x 0.85 x (heads - 1) / heads x (n - 1) / n, left unconverted, and 25 us of
 * latency: 208 GB/s on 8 H100s, 115 on 4, 25.5 on 2, against the ring's 370 x n / (n - 1). The
 * model has no NVLS candidate for them; this checks that the ring it picks is faster, in NCCL's
 * tuning time, than NVLS at every size from 1 KiB to 1 GiB, so NCCL would not pick NVLS either. */
static void test_no_nvls_gather(void)
{
    fsdp_sim_profile_t p = h100();
    static const double head[9] = {[2] = 60e9, [4] = 60e9, [8] = 40e9};

    for (int n = 2; n <= 8; n *= 2) {
        double nvls_bw = head[n] * 0.85 * (n - 1) * (n - 1) / n;
        for (int e = 10; e <= 30; e++) {
            fsdp_sim_coll_cost_t cc;
            double s = P2(e), tuned;
            fsdp_sim_coll_time(&p, FSDP_SIM_COLL_REDUCE_SCATTER, n, 1, s, &cc);
            CU_ASSERT_EQUAL(cc.algo, FSDP_SIM_ALGO_RING);
            tuned = cc.latency_s + s / (cc.algo_bytes_per_s * CHANNELS / cc.channels);
            CU_ASSERT(tuned < 25e-6 + s / nvls_bw);
        }
    }
}

/* A launch of 2 nodes of 8 ranks: groups of tp consecutive ranks (the tensor-parallel groups)
 * and groups of the ranks of one index in every tp group (the data-parallel groups), each
 * all-gathering 1 MiB a rank on a stream of its own. */
typedef struct {
    int tp;
    double tp_time[16], dp_time[16];
} mesh_arg_t;

static fsdp_status_t gather_time(fsdp_dev_t *dev, fsdp_group_t *g, double *time_p)
{
    const fsdp_sim_profile_t *p = fsdp_sim_rank_profile(dev);
    fsdp_stream_t *s = NULL;
    fsdp_status_t st;
    double ready;

    st = fsdp_dev_stream_create(dev, "coll", 0, &s);
    if (st != FSDP_OK)
        return st;
    ready = fsdp_dev_host_time(dev) + p->host.launch_latency_s;
    st = fsdp_dev_all_gather(dev, g, NULL, NULL, (size_t)1 << 18, FSDP_DTYPE_F32, s);
    *time_p = fsdp_sim_stream_time(dev, s) - ready;
    fsdp_dev_stream_destroy(dev, s);
    return st;
}

static fsdp_status_t mesh_rank(fsdp_dev_t *dev, void *arg)
{
    mesh_arg_t *m = arg;
    fsdp_group_t *world = fsdp_dev_group_world(dev), *tp = NULL, *dp = NULL;
    int r = dev->rank;
    fsdp_status_t st;

    st = fsdp_dev_group_split(dev, world, r / m->tp, r, &tp);
    if (st == FSDP_OK)
        st = fsdp_dev_group_split(dev, world, r % m->tp, r, &dp);
    if (st == FSDP_OK)
        st = gather_time(dev, tp, &m->tp_time[r]);
    if (st == FSDP_OK)
        st = gather_time(dev, dp, &m->dp_time[r]);
    fsdp_dev_group_destroy(dev, dp);
    fsdp_dev_group_destroy(dev, tp);
    return st;
}

static void test_mesh_groups(void)
{
    for (int tp = 2; tp <= 8; tp *= 2) {
        fsdp_sim_params_t p;
        mesh_arg_t m = {.tp = tp};
        double want_tp, want_dp, bytes = 4.0 * (1 << 18);

        fsdp_sim_params_init(&p);
        p.world_size = 16;
        p.ranks_per_node = 8;
        p.mode = FSDP_SIM_SHAPE;
        p.profile = h100();
        CU_ASSERT_EQUAL_FATAL(fsdp_sim_launch(&p, mesh_rank, &m, NULL), FSDP_OK);
        /* a tp group is one node's; a dp group of 16 / tp ranks spans both, 8 / tp on each,
         * and shares each node's NICs with the node's other tp - 1 dp groups */
        want_tp = fsdp_sim_coll_time(&p.profile, FSDP_SIM_COLL_ALL_GATHER, tp, 1, tp * bytes, NULL);
        want_dp = fsdp_sim_coll_time_shared(&p.profile, FSDP_SIM_COLL_ALL_GATHER, 16 / tp, 2, 8,
                                            16 / tp * bytes, NULL);
        for (int r = 0; r < 16; r++) {
            close_to(m.tp_time[r], want_tp, 1e-12);
            close_to(m.dp_time[r], want_dp, 1e-12);
        }
    }
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"all-gather and reduce-scatter of 2, 4, 8 ranks of a node", test_gather_in_node},
        {"the same across nodes: the network's latency and NICs", test_gather_across_nodes},
        {"all-reduce of 2, 4, 8 ranks: NVLS by NCCL's heads", test_all_reduce_in_node},
        {"no NVLS all-gather or reduce-scatter inside a node", test_no_nvls_gather},
        {"a dp x tp mesh: tp groups in a node, dp groups across", test_mesh_groups},
        {NULL, NULL},
    };

    return fsdp_test_run("tensor-parallel collectives", tests);
}
