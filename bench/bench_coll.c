/* NCCL collectives on the gpu backend, reported as nccl-tests reports them, next to the
 * simulator's prediction of the same collective from a cluster profile.
 *
 *     bench_coll [--quick] [--profile P]
 *
 * Ranks: one process per GPU when a launcher started several (torchrun, srun, mpirun: the
 * environment fsdp_launch_env reads, as fsdp-train --backend gpu), else every GPU this process
 * sees, one thread each. Sizes run from 8 B to 1 GiB by factors of 2 (--quick: factors of 4, to
 * 64 MiB), f32, sum, out of place (broadcast in place).
 *
 * Columns, as nccl-tests defines them (doc/PERFORMANCE.md of NVIDIA's nccl-tests):
 *   size   S: the bytes of the largest buffer: all-gather's output and reduce-scatter's input
 *          (count per rank x ranks), all-reduce's and broadcast's buffer;
 *   time   t: mean over ranks of each rank's host time over `iters` back-to-back calls on the
 *          compute stream, from a barrier to the stream's synchronization, divided by iters;
 *   algbw  S / t, GB/s (1e9 bytes);
 *   busbw  algbw x (n-1)/n for all-gather and reduce-scatter, x 2(n-1)/n for all-reduce, x 1
 *          for broadcast;
 *   sim    fsdp_sim_coll_time of the profile (docs/costs.md) for n ranks on the job's nodes and
 *          S bytes, and measured / sim.
 * After each collective, the model's error per band of sizes (< 64 KiB, 64 KiB-16 MiB,
 * > 16 MiB) as docs/costs.md reports it: the mean of |sim / measured - 1|, and the worst size.
 * Without the gpu backend or a device it says why and exits 0 (make bench goes on). */
#include "config.h"

#include <fsdp/fsdp.h>
#include <fsdp/gpu.h>
#include <fsdp/sim.h>

#include "bench_gpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WARMUP 5
#define ITERS 20

typedef struct bench {
    int quick;
    fsdp_sim_profile_t profile;
    int nnodes;
} bench_t;

static const fsdp_sim_coll_kind_t kinds[] = {FSDP_SIM_COLL_ALL_GATHER,
                                             FSDP_SIM_COLL_REDUCE_SCATTER,
                                             FSDP_SIM_COLL_ALL_REDUCE, FSDP_SIM_COLL_BROADCAST};

/* nccl-tests' busbw factor */
static double bus_factor(fsdp_sim_coll_kind_t kind, int n)
{
    switch (kind) {
    case FSDP_SIM_COLL_ALL_REDUCE:
        return 2.0 * (n - 1) / n;
    case FSDP_SIM_COLL_ALL_GATHER:
    case FSDP_SIM_COLL_REDUCE_SCATTER:
        return (double)(n - 1) / n;
    default:
        return 1.0;
    }
}

/* The bands of docs/costs.md: < 64 KiB, 64 KiB to 16 MiB, above. */
#define BANDS 3

typedef struct band_err {
    double sum[BANDS], worst[BANDS];
    int n[BANDS];
} band_err_t;

static void band_add(band_err_t *e, size_t bytes, double measured, double sim)
{
    int b = bytes < ((size_t)64 << 10) ? 0 : bytes <= ((size_t)16 << 20) ? 1 : 2;
    double err = measured > 0.0 ? sim / measured - 1.0 : 0.0;

    err = err < 0.0 ? -err : err;
    e->sum[b] += err;
    e->worst[b] = err > e->worst[b] ? err : e->worst[b];
    e->n[b]++;
}

static void band_print(const band_err_t *e, fsdp_sim_coll_kind_t kind)
{
    static const char *const names[BANDS] = {"< 64 KiB", "64 KiB-16 MiB", "> 16 MiB"};

    printf("%-15s model error", fsdp_sim_coll_name(kind));
    for (int b = 0; b < BANDS; b++) {
        if (e->n[b] > 0)
            printf("; %s: mean %.1f%%, worst %.1f%%", names[b], 100.0 * e->sum[b] / e->n[b],
                   100.0 * e->worst[b]);
    }
    printf("\n");
}

/* Elements per call for a size S (0: the size is too small for n ranks). */
static size_t coll_count(fsdp_sim_coll_kind_t kind, size_t size, int n)
{
    size_t es = sizeof(float);

    if (kind == FSDP_SIM_COLL_ALL_GATHER || kind == FSDP_SIM_COLL_REDUCE_SCATTER)
        return size / es / (size_t)n;
    return size / es;
}

static fsdp_status_t run_coll(fsdp_dev_t *dev, fsdp_sim_coll_kind_t kind, void *send, void *recv,
                              size_t count)
{
    fsdp_group_t *w = fsdp_dev_group_world(dev);

    switch (kind) {
    case FSDP_SIM_COLL_ALL_GATHER:
        return fsdp_dev_all_gather(dev, w, send, recv, count, FSDP_DTYPE_F32, NULL);
    case FSDP_SIM_COLL_REDUCE_SCATTER:
        return fsdp_dev_reduce_scatter(dev, w, send, recv, count, FSDP_DTYPE_F32, FSDP_REDUCE_SUM,
                                       NULL);
    case FSDP_SIM_COLL_ALL_REDUCE:
        return fsdp_dev_all_reduce(dev, w, send, recv, count, FSDP_DTYPE_F32, FSDP_REDUCE_SUM,
                                   NULL);
    default:
        return fsdp_dev_broadcast(dev, w, recv, count, FSDP_DTYPE_F32, 0, NULL);
    }
}

/* The mean over ranks of a host value, through the device. */
static fsdp_status_t rank_mean(fsdp_dev_t *dev, float *dbuf, double *value)
{
    float v = (float)*value;
    fsdp_status_t st;

    st = fsdp_dev_memcpy_async(dev, dbuf, &v, sizeof(v), NULL);
    if (st == FSDP_OK)
        st = fsdp_dev_all_reduce(dev, fsdp_dev_group_world(dev), dbuf, dbuf, 1, FSDP_DTYPE_F32,
                                 FSDP_REDUCE_AVG, NULL);
    if (st == FSDP_OK)
        st = fsdp_dev_memcpy_async(dev, &v, dbuf, sizeof(v), NULL);
    if (st == FSDP_OK)
        st = fsdp_dev_stream_synchronize(dev, NULL);
    *value = v;
    return st;
}

static fsdp_status_t bench_rank(fsdp_dev_t *dev, const bench_t *b)
{
    const int n = dev->world_size;
    const size_t max = b->quick ? (size_t)64 << 20 : (size_t)1 << 30;
    const size_t factor = b->quick ? 4 : 2;
    void *send = NULL, *recv = NULL;
    float *dbuf = NULL;
    fsdp_status_t st;

    st = fsdp_dev_segment_alloc(dev, FSDP_MEMKIND_DEVICE, max, &send);
    if (st == FSDP_OK)
        st = fsdp_dev_segment_alloc(dev, FSDP_MEMKIND_DEVICE, max, &recv);
    if (st == FSDP_OK)
        st = fsdp_dev_segment_alloc(dev, FSDP_MEMKIND_DEVICE, sizeof(float), (void **)&dbuf);
    if (st == FSDP_OK && dev->rank == 0)
        printf("%d rank%s on %d node%s; simulated: profile %s\n"
               "%-15s %12s %12s %10s %10s %10s %10s %8s\n",
               n, n > 1 ? "s" : "", b->nnodes, b->nnodes > 1 ? "s" : "", b->profile.name,
               "collective", "size(B)", "count", "time(us)", "algbw", "busbw", "sim(us)",
               "meas/sim");
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]) && st == FSDP_OK; k++) {
        band_err_t err;
        memset(&err, 0, sizeof(err));
        for (size_t size = 8; size <= max && st == FSDP_OK; size *= factor) {
            size_t count = coll_count(kinds[k], size, n);
            size_t bytes = kinds[k] == FSDP_SIM_COLL_ALL_GATHER ||
                                   kinds[k] == FSDP_SIM_COLL_REDUCE_SCATTER
                               ? count * sizeof(float) * (size_t)n
                               : count * sizeof(float);
            double t0, t, sim, algbw;

            if (count == 0)
                continue;
            for (int i = 0; i < WARMUP && st == FSDP_OK; i++)
                st = run_coll(dev, kinds[k], send, recv, count);
            if (st == FSDP_OK)
                st = fsdp_dev_stream_synchronize(dev, NULL);
            if (st == FSDP_OK)
                st = fsdp_dev_barrier(dev, fsdp_dev_group_world(dev));
            t0 = fsdp_dev_host_time(dev);
            for (int i = 0; i < ITERS && st == FSDP_OK; i++)
                st = run_coll(dev, kinds[k], send, recv, count);
            if (st == FSDP_OK)
                st = fsdp_dev_stream_synchronize(dev, NULL);
            t = (fsdp_dev_host_time(dev) - t0) / ITERS;
            if (st == FSDP_OK)
                st = rank_mean(dev, dbuf, &t);
            if (st != FSDP_OK || dev->rank != 0)
                continue;
            sim = fsdp_sim_coll_time(&b->profile, kinds[k], n, b->nnodes, (double)bytes, NULL);
            algbw = (double)bytes / t / 1e9;
            printf("%-15s %12zu %12zu %10.2f %10.3f %10.3f %10.2f %8.3f\n",
                   fsdp_sim_coll_name(kinds[k]), bytes, count, t * 1e6, algbw,
                   algbw * bus_factor(kinds[k], n), sim * 1e6, sim > 0 ? t / sim : 0.0);
            band_add(&err, bytes, t, sim);
            fflush(stdout);
        }
        if (st == FSDP_OK && dev->rank == 0 && n > 1)
            band_print(&err, kinds[k]);
    }
    /* one rank has no link: NCCL copies in place or locally, and its time is the call's host
     * and launch cost (8-12 us measured on an H200), which the multi-GPU model does not cover */
    if (st == FSDP_OK && dev->rank == 0 && n == 1)
        printf("one rank: no model error is reported; a second GPU gives the multi-GPU cases\n");
    fsdp_dev_segment_free(dev, FSDP_MEMKIND_DEVICE, dbuf);
    fsdp_dev_segment_free(dev, FSDP_MEMKIND_DEVICE, recv);
    fsdp_dev_segment_free(dev, FSDP_MEMKIND_DEVICE, send);
    return st;
}

static fsdp_status_t rank_main(fsdp_dev_t *dev, void *arg)
{
    return bench_rank(dev, arg);
}

int main(int argc, char **argv)
{
    bench_gpu_args_t args;
    fsdp_launch_info_t info;
    fsdp_dev_t *dev = NULL;
    fsdp_status_t st;
    bench_t b;
    int rc = bench_gpu_setup("bench_coll", argc, argv, &args);

    if (rc >= 0)
        return rc;
    memset(&b, 0, sizeof(b));
    b.quick = args.quick;
    b.profile = args.profile;
    info = args.info;
    if (info.world_size == 1) {
        b.nnodes = 1;
        return fsdp_gpu_launch_local(fsdp_gpu_device_count(), 600.0, rank_main, &b) == FSDP_OK
                   ? 0
                   : 1;
    }
    b.nnodes = info.local_size > 0 ? (info.world_size + info.local_size - 1) / info.local_size : 1;
    st = fsdp_gpu_init_launched(&info, 600.0, &dev);
    if (st == FSDP_OK)
        st = bench_rank(dev, &b);
    fsdp_gpu_finalize(dev);
    return st == FSDP_OK ? 0 : 1;
}
