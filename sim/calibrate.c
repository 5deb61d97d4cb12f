/* A cluster profile fitted to a trace (include/fsdp/calibrate.h says what and how), for
 * fsdp-trace calibrate. Reads the trace through the trace reader; prices nothing itself but
 * through the sim's cost functions (fsdp_sim_coll_time for the algorithm NCCL picks). */

#include "sim_hidden.h"
#include "trace/trace_hidden.h"

#include <fsdp/calibrate.h>

#include <fsdp/kernel.h>
#include <fsdp/log.h>
#include <fsdp/sim.h>
#include <fsdp/trace.h>
#include <fsdp/types.h>

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- least squares (modified Gram-Schmidt on unit-norm columns) -------------------------- */

int fsdp_calib_lsq(const double *x, const double *y, int rows, int cols, double *theta,
                   int *used)
{
    double *q = malloc((size_t)rows * (size_t)cols * sizeof(*q));
    double *r = calloc((size_t)cols * (size_t)cols, sizeof(*r));
    double *res = malloc((size_t)rows * sizeof(*res));
    double *scale = malloc((size_t)cols * sizeof(*scale));
    double *z = calloc((size_t)cols, sizeof(*z));
    int rank = 0;

    if (q == NULL || r == NULL || res == NULL || scale == NULL || z == NULL) {
        free(q), free(r), free(res), free(scale), free(z);
        return -1;
    }
    for (int j = 0; j < cols; j++) {
        double nn = 0.0;
        for (int i = 0; i < rows; i++) {
            q[(size_t)j * rows + i] = x[(size_t)i * cols + j];
            nn += x[(size_t)i * cols + j] * x[(size_t)i * cols + j];
        }
        scale[j] = sqrt(nn);
        used[j] = scale[j] > 0.0;
        theta[j] = 0.0;
        if (used[j])
            for (int i = 0; i < rows; i++)
                q[(size_t)j * rows + i] /= scale[j];
    }
    for (int i = 0; i < rows; i++)
        res[i] = y[i];
    for (int j = 0; j < cols; j++) {
        double *qj = q + (size_t)j * rows, nn = 0.0;
        if (!used[j])
            continue;
        for (int k = 0; k < j; k++) {
            double *qk = q + (size_t)k * rows, d = 0.0;
            if (!used[k])
                continue;
            for (int i = 0; i < rows; i++)
                d += qk[i] * qj[i];
            r[(size_t)k * cols + j] = d;
            for (int i = 0; i < rows; i++)
                qj[i] -= d * qk[i];
        }
        for (int i = 0; i < rows; i++)
            nn += qj[i] * qj[i];
        nn = sqrt(nn);
        if (nn < 1e-9) { /* dependent on earlier columns: not identified */
            used[j] = 0;
            continue;
        }
        r[(size_t)j * cols + j] = nn;
        for (int i = 0; i < rows; i++)
            qj[i] /= nn;
        for (int i = 0; i < rows; i++)
            z[j] += qj[i] * res[i];
        for (int i = 0; i < rows; i++)
            res[i] -= z[j] * qj[i];
        rank++;
    }
    for (int j = cols - 1; j >= 0; j--) {
        double v;
        if (!used[j])
            continue;
        v = z[j];
        for (int k = j + 1; k < cols; k++)
            if (used[k])
                v -= r[(size_t)j * cols + k] * theta[k];
        theta[j] = v / r[(size_t)j * cols + j];
    }
    for (int j = 0; j < cols; j++)
        if (used[j])
            theta[j] /= scale[j];
    free(q), free(r), free(res), free(scale), free(z);
    return rank;
}

/* ---- what the trace holds ------------------------------------------------------------------ */

typedef struct call {
    fsdp_sim_coll_kind_t kind;
    double nbytes;
    double dur; /* smallest over the ranks seen so far */
    int seen;
} call_t;

typedef struct group {
    char name[64];
    unsigned char *member; /* [world] */
    int *next;             /* [world]: the rank's next call index on the group */
    double *prev_end;      /* [world] */
    call_t *calls;
    int ncalls, cap;
    int size, nodes;
} group_t;

typedef struct kev {
    int kind; /* fsdp_kernel_kind_t, or -1 - copy kind */
    int dtype;
    double bytes, flops, dur;
} kev_t;

typedef struct calib {
    int world;
    group_t *groups;
    int ngroups;
    kev_t *k;
    int nk, capk;
    int skipped_bcast, oom;
    /* the run's profile priced kernels as eager op sequences (a simulated run): those kinds'
     * events are several kernels' time, not one's, and are left out of the fits */
    int eager;
    int skipped_eager;
} calib_t;

static int kernel_kind(const char *name)
{
    for (int i = 0; i < FSDP_K_COUNT; i++)
        if (strcmp(fsdp_kernel_name((fsdp_kernel_kind_t)i), name) == 0)
            return i;
    return -100;
}

static group_t *find_group(calib_t *c, const char *name)
{
    group_t *g;

    for (int i = 0; i < c->ngroups; i++)
        if (strcmp(c->groups[i].name, name) == 0)
            return &c->groups[i];
    g = realloc(c->groups, (size_t)(c->ngroups + 1) * sizeof(*g));
    if (g == NULL)
        return NULL;
    c->groups = g;
    g = &c->groups[c->ngroups];
    memset(g, 0, sizeof(*g));
    snprintf(g->name, sizeof(g->name), "%s", name);
    g->member = calloc((size_t)c->world, 1);
    g->next = calloc((size_t)c->world, sizeof(int));
    g->prev_end = calloc((size_t)c->world, sizeof(double));
    if (g->member == NULL || g->next == NULL || g->prev_end == NULL) {
        free(g->member), free(g->next), free(g->prev_end);
        return NULL;
    }
    c->ngroups++;
    return g;
}

static int on_event(void *arg, int rank, uint64_t seq, const fsdp_trace_event_t *ev)
{
    calib_t *c = arg;
    double dur = ev->end - ev->start;

    (void)seq;
    if (rank < 0 || rank >= c->world)
        return 0;
    if (ev->kind == FSDP_EV_COLLECTIVE && ev->group != NULL) {
        fsdp_sim_coll_kind_t kind;
        group_t *g;
        call_t *call;
        double start;
        int idx;
        if (strcmp(ev->name, "all_gather") == 0)
            kind = FSDP_SIM_COLL_ALL_GATHER;
        else if (strcmp(ev->name, "reduce_scatter") == 0)
            kind = FSDP_SIM_COLL_REDUCE_SCATTER;
        else if (strcmp(ev->name, "all_reduce") == 0)
            kind = FSDP_SIM_COLL_ALL_REDUCE;
        else if (strcmp(ev->name, "broadcast") == 0)
            kind = FSDP_SIM_COLL_BROADCAST;
        else
            return 0; /* barriers: host-side, no bytes */
        g = find_group(c, ev->group);
        if (g == NULL) {
            c->oom = 1;
            return 1;
        }
        g->member[rank] = 1;
        idx = g->next[rank]++;
        /* NCCL runs a communicator's calls one at a time */
        start = ev->start > g->prev_end[rank] ? ev->start : g->prev_end[rank];
        g->prev_end[rank] = ev->end;
        if (idx >= g->cap) {
            int cap = g->cap ? 2 * g->cap : 64;
            while (cap <= idx)
                cap *= 2;
            call = realloc(g->calls, (size_t)cap * sizeof(*call));
            if (call == NULL) {
                c->oom = 1;
                return 1;
            }
            memset(call + g->cap, 0, (size_t)(cap - g->cap) * sizeof(*call));
            g->calls = call;
            g->cap = cap;
        }
        if (idx >= g->ncalls)
            g->ncalls = idx + 1;
        call = &g->calls[idx];
        if (!call->seen || ev->end - start < call->dur)
            call->dur = ev->end - start;
        call->kind = kind;
        call->nbytes = (double)ev->bytes;
        call->seen = 1;
        return 0;
    }
    if (ev->kind == FSDP_EV_KERNEL || ev->kind == FSDP_EV_COPY) {
        kev_t *k;
        int kind;
        if (ev->kind == FSDP_EV_KERNEL) {
            kind = kernel_kind(ev->name);
            if (kind < 0)
                return 0;
            if (c->eager && fsdp_sim_kind_eager((fsdp_kernel_kind_t)kind)) {
                c->skipped_eager++;
                return 0;
            }
        } else if (strcmp(ev->name, "h2d") == 0) {
            kind = -1 - FSDP_SIM_COPY_H2D;
        } else if (strcmp(ev->name, "d2h") == 0) {
            kind = -1 - FSDP_SIM_COPY_D2H;
        } else if (strcmp(ev->name, "d2d") == 0) {
            kind = -1 - FSDP_SIM_COPY_D2D;
        } else {
            return 0;
        }
        if (c->nk == c->capk) {
            int cap = c->capk ? 2 * c->capk : 1024;
            k = realloc(c->k, (size_t)cap * sizeof(*k));
            if (k == NULL) {
                c->oom = 1;
                return 1;
            }
            c->k = k;
            c->capk = cap;
        }
        k = &c->k[c->nk++];
        k->kind = kind;
        k->dtype = ev->dtype;
        k->bytes = (double)ev->bytes;
        /* a kernel's count, where its emitter records it, is its FLOPs */
        k->flops = ev->kind == FSDP_EV_KERNEL ? (double)ev->count : 0.0;
        k->dur = dur;
    }
    return 0;
}

/* 1 when the run was simulated with a profile whose ops are eager (prof: the run row's
 * profile, NULL when it holds none; a hardware run's is not what the backend priced with). */
static int run_eager(const fsdp_trace_run_row_t *row, const fsdp_sim_profile_t *prof)
{
    return row->backend != NULL && strcmp(row->backend, "sim") == 0 && prof != NULL &&
           prof->ops == FSDP_SIM_OPS_EAGER;
}

/* "ranks_per_node": N in the run's config JSON; 0 when absent. */
static int config_ranks_per_node(const char *json)
{
    const char *p = json != NULL ? strstr(json, "\"ranks_per_node\"") : NULL;

    if (p == NULL)
        return 0;
    p += strlen("\"ranks_per_node\"");
    while (*p == ' ' || *p == ':' || *p == '\t' || *p == '\n')
        p++;
    return (int)strtol(p, NULL, 10);
}

/* The run's GPUs per node: its profile's (prof, the topology a simulated run had) when the run
 * row holds one, else the config's ranks_per_node (hybrid sharding's node); 0 when neither
 * says. */
static int run_ranks_per_node(const fsdp_trace_run_row_t *row, const fsdp_sim_profile_t *prof)
{
    if (prof != NULL && prof->gpus_per_node > 0)
        return prof->gpus_per_node;
    return config_ranks_per_node(row->config_json);
}

/* ---- kernels and copies ---------------------------------------------------------------------- */

static double median_abs_rel(double *e, int n)
{
    /* insertion sort: reports only */
    for (int i = 1; i < n; i++) {
        double v = e[i];
        int j = i - 1;
        while (j >= 0 && e[j] > v) {
            e[j + 1] = e[j];
            j--;
        }
        e[j + 1] = v;
    }
    return n > 0 ? e[n / 2] : 0.0;
}

/* A kernel above the memory line by more than this is compute-bound. */
#define CALIB_ABOVE_LINE 0.01

/* The FLOP rate r of the kernels `match` selects that sit above the memory line: t - latency
 * = FLOPs / r, by least squares through the origin. 0 when none records FLOPs. */
static double fit_flop_rate(const calib_t *c, int kind, int dtype, double lat, double inv_bw,
                            int *n_p)
{
    double sxy = 0.0, sxx = 0.0;
    int m = 0;

    for (int i = 0; i < c->nk; i++) {
        const kev_t *k = &c->k[i];
        if (k->flops <= 0.0 || (kind == FSDP_K_GEMM) != (k->kind == FSDP_K_GEMM) ||
            k->kind < 0 || (dtype >= 0 && k->dtype != dtype))
            continue;
        if (k->dur <= (lat + k->bytes * inv_bw) * (1.0 + CALIB_ABOVE_LINE))
            continue; /* on the memory line: the FLOPs do not set its time */
        sxy += k->flops * (k->dur - lat);
        sxx += k->flops * k->flops;
        m++;
    }
    *n_p = m;
    return m > 0 && sxy > 0.0 ? sxx / sxy : 0.0;
}

static int fit_kernels(calib_t *c, fsdp_sim_profile_t *p, FILE *rep)
{
    fsdp_sim_gpu_profile_t *gpu = &p->gpu;
    double *x = malloc((size_t)(c->nk + 1) * 2 * sizeof(*x));
    double *y = malloc((size_t)(c->nk + 1) * sizeof(*y));
    unsigned char *keep = malloc((size_t)c->nk + 1);
    double theta[2], lat = gpu->kernel_latency_s, inv_bw = 0.0, rate;
    int used[2], n = 0, nfit;

    if (x == NULL || y == NULL || keep == NULL) {
        free(x), free(y), free(keep);
        return -1;
    }
    /* The memory line: t = latency + bytes / (HBM x efficiency), the lower envelope of the
     * element-wise kinds. Compute-bound kernels sit above it, so the line is fitted again to
     * the kernels not above the previous one until the set is stable. */
    for (int i = 0; i < c->nk; i++)
        keep[i] = c->k[i].kind >= 0 && c->k[i].kind != FSDP_K_GEMM && c->k[i].bytes > 0.0;
    for (int pass = 0; pass < 8; pass++) {
        int changed = 0;
        n = 0;
        for (int i = 0; i < c->nk; i++) {
            if (!keep[i])
                continue;
            x[2 * n] = 1.0;
            x[2 * n + 1] = c->k[i].bytes;
            y[n++] = c->k[i].dur;
        }
        if (n < 2 || fsdp_calib_lsq(x, y, n, 2, theta, used) < 0 || !used[1] || theta[1] <= 0.0)
            break;
        lat = used[0] && theta[0] >= 0.0 ? theta[0] : lat;
        inv_bw = theta[1];
        for (int i = 0; i < c->nk; i++) {
            const kev_t *k = &c->k[i];
            int on_line;
            if (k->kind < 0 || k->kind == FSDP_K_GEMM || k->bytes <= 0.0)
                continue;
            on_line = k->dur <= (lat + k->bytes * inv_bw) * (1.0 + CALIB_ABOVE_LINE);
            changed += on_line != keep[i];
            keep[i] = (unsigned char)on_line;
        }
        if (changed == 0)
            break;
    }
    if (inv_bw > 0.0) {
        gpu->kernel_latency_s = lat;
        gpu->hbm_bytes_per_s = 1.0 / (inv_bw * gpu->memory_efficiency);
        if (rep != NULL)
            fprintf(rep, "kernels: latency %.4g s, HBM %.4g B/s (x efficiency %.3g: %.4g B/s)"
                         " from %d memory-bound kernels\n",
                    lat, gpu->hbm_bytes_per_s, gpu->memory_efficiency, 1.0 / inv_bw, n);
        /* per kind, the effective bandwidth with the common latency */
        for (int kind = 0; kind < FSDP_K_COUNT && rep != NULL; kind++) {
            double sxy = 0.0, sxx = 0.0;
            int m = 0;
            for (int i = 0; i < c->nk; i++) {
                if (c->k[i].kind != kind || !keep[i])
                    continue;
                sxy += c->k[i].bytes * (c->k[i].dur - lat);
                sxx += c->k[i].bytes * c->k[i].bytes;
                m++;
            }
            if (m > 0 && sxy > 0.0)
                fprintf(rep, "  %-16s %6d events, %.4g B/s effective\n",
                        fsdp_kernel_name((fsdp_kernel_kind_t)kind), m, sxx / sxy);
        }
    } else {
        /* no line: the base's one classifies the kernels below */
        if (gpu->hbm_bytes_per_s > 0.0)
            inv_bw = 1.0 / (gpu->hbm_bytes_per_s * gpu->memory_efficiency);
        if (rep != NULL)
            fprintf(rep, "kernels: no memory-bound kernels with bytes; latency and HBM kept\n");
    }
    /* Kernels above the line whose events record their FLOPs (count) give the FLOP rate:
     * t - latency = FLOPs / (peak x efficiency). Element-wise kinds run at the vector rate
     * (compute_efficiency), GEMMs at the matmul rate of their dtype (gemm_efficiency; an event
     * has no shape, so the tile and wave quantization of a profile with sms > 0 is folded into
     * the fitted peak as an average). */
    rate = fit_flop_rate(c, -1, -1, lat, inv_bw, &nfit);
    if (rate > 0.0) {
        gpu->vector_flops_per_s = rate / gpu->compute_efficiency;
        if (rep != NULL)
            fprintf(rep, "vector: %.4g FLOP/s peak from %d compute-bound element-wise kernels\n",
                    gpu->vector_flops_per_s, nfit);
    }
    for (int dt = 0; dt < FSDP_DTYPE_COUNT; dt++) {
        rate = fit_flop_rate(c, FSDP_K_GEMM, dt, lat, inv_bw, &nfit);
        if (rate <= 0.0)
            continue;
        rate /= gpu->gemm_efficiency;
        if (dt == FSDP_DTYPE_F32 && gpu->allow_tf32)
            gpu->tf32_flops_per_s = rate;
        else
            gpu->matmul_flops_per_s[dt] = rate;
        if (rep != NULL)
            fprintf(rep, "gemm %s%s: %.4g FLOP/s peak from %d compute-bound GEMMs\n",
                    fsdp_dtype_name((fsdp_dtype_t)dt),
                    dt == FSDP_DTYPE_F32 && gpu->allow_tf32 ? " (tf32)" : "", rate, nfit);
    }
    /* copies over PCIe: t - latency = bytes / bandwidth */
    for (int ck = FSDP_SIM_COPY_H2D; ck <= FSDP_SIM_COPY_D2H; ck++) {
        double sxy = 0.0, sxx = 0.0;
        int m = 0;
        for (int i = 0; i < c->nk; i++) {
            if (c->k[i].kind != -1 - ck || c->k[i].bytes <= 0.0)
                continue;
            sxy += c->k[i].bytes * (c->k[i].dur - gpu->kernel_latency_s);
            sxx += c->k[i].bytes * c->k[i].bytes;
            m++;
        }
        if (m > 0 && sxy > 0.0) {
            double bw = sxx / sxy;
            if (ck == FSDP_SIM_COPY_H2D)
                p->host.h2d_bytes_per_s = bw;
            else
                p->host.d2h_bytes_per_s = bw;
            if (rep != NULL)
                fprintf(rep, "copies %s: %.4g B/s from %d copies\n",
                        fsdp_sim_copy_name((fsdp_sim_copy_kind_t)ck), bw, m);
        }
    }
    free(x), free(y), free(keep);
    return 0;
}

/* ---- collectives -------------------------------------------------------------------------- */

/* Columns in the order they are identified: when calls cannot tell them apart (one group,
 * one kind), the later ones keep the current profile's values. */
enum {
    C_INTRA,      /* intra_latency_s[ring][proto]: steps of one-node groups */
    C_NET_INTRA,  /* max(intra, net_overhead x k): NVLink steps of multi-node rings */
    C_INTER,      /* inter_latency_s[ring][proto] + net_latency x k */
    C_INTER_TREE, /* inter_latency_s[tree][proto] + net_latency x k: one rank per node */
    C_BW_INTRA,   /* 1 / intra_bus_bytes_per_s */
    C_BW_NIC,     /* 1 / nic_bytes_per_s */
    C_FLOOR,      /* call_floor_s: every call */
    C_NET_FLOOR,  /* net_floor_s: calls across nodes */
    C_NCOLS
};

static const char *const col_names[C_NCOLS] = {"NVLink step latency",  "multi-node NVLink step",
                                               "network step latency", "network step (1 rank/node)",
                                               "NVLink bus bandwidth", "NIC bandwidth",
                                               "call floor",           "network call floor"};

/* The current profile's value of each column (what an unidentified column keeps). */
static void ring_prior(const fsdp_sim_profile_t *p, int proto, double *v)
{
    const fsdp_sim_nccl_profile_t *nc = &p->nccl;
    double kovh = proto == FSDP_SIM_PROTO_SIMPLE ? 3.0 : 1.0;
    double klat = proto == FSDP_SIM_PROTO_SIMPLE ? 2.0 : 1.0;
    double intra = nc->intra_latency_s[FSDP_SIM_ALGO_RING][proto];

    v[C_FLOOR] = nc->call_floor_s;
    v[C_NET_FLOOR] = nc->net_floor_s;
    v[C_INTRA] = intra;
    v[C_NET_INTRA] = intra > kovh * nc->net_overhead_s ? intra : kovh * nc->net_overhead_s;
    v[C_INTER] = nc->inter_latency_s[FSDP_SIM_ALGO_RING][proto] + klat * nc->net_latency_s;
    v[C_INTER_TREE] = nc->inter_latency_s[FSDP_SIM_ALGO_TREE][proto] + klat * nc->net_latency_s;
    v[C_BW_INTRA] = nc->intra_bus_bytes_per_s > 0.0 ? 1.0 / nc->intra_bus_bytes_per_s : 0.0;
    v[C_BW_NIC] = nc->nic_bytes_per_s > 0.0 ? 1.0 / nc->nic_bytes_per_s : 0.0;
}

/* The regressors of one ring call on `channels` of the profile's channels, and in *known_p
 * what NCCL's base latency (a tuning constant, kept) adds; 0 when the call is not a ring one we
 * model. The base and the call floor are both once per call: the floor is fitted, the base
 * kept. */
static int ring_row(const fsdp_sim_profile_t *p, int proto, fsdp_sim_coll_kind_t kind, int n,
                    int nodes, double nbytes, int channels, double *row, double *known_p)
{
    const fsdp_sim_nccl_profile_t *nc = &p->nccl;
    int all_reduce = kind == FSDP_SIM_COLL_ALL_REDUCE, ppn = n / nodes;
    int nsteps = all_reduce ? 2 * (n - 1) : n - 1, ninter = all_reduce ? 2 * (nodes - 1)
                                                                       : nodes - 1;
    double f = 1.0, pf = proto == FSDP_SIM_PROTO_LL      ? 0.5
                         : proto == FSDP_SIM_PROTO_LL128 ? 0.92
                                                         : 1.0;
    double bus_bytes = nbytes * nsteps / n / pf;

    if (kind == FSDP_SIM_COLL_BROADCAST)
        return 0;
    /* a call on fewer channels runs at their share of the bus */
    if (channels > 0 && channels < nc->channels)
        bus_bytes *= (double)nc->channels / channels;
    memset(row, 0, C_NCOLS * sizeof(*row));
    if (proto == FSDP_SIM_PROTO_SIMPLE && nodes > 1 && all_reduce &&
        nbytes / ((double)nc->channels * n) >= 64.0)
        f = nc->ring_plateau_factor;
    *known_p = f * nc->base_latency_s[FSDP_SIM_ALGO_RING][proto];
    row[C_FLOOR] = 1.0;
    if (nodes == 1) {
        row[C_INTRA] = f * nsteps;
        row[C_BW_INTRA] = bus_bytes;
    } else {
        row[C_NET_FLOOR] = 1.0;
        row[C_NET_INTRA] = f * (nsteps - ninter);
        row[ppn == 1 ? C_INTER_TREE : C_INTER] = f * ninter;
        row[C_BW_NIC] = bus_bytes / (nc->nics_per_node < ppn ? nc->nics_per_node : ppn);
    }
    return 1;
}

typedef struct ccall {
    fsdp_sim_coll_kind_t kind;
    int n, nodes;
    double nbytes, dur;
    int cls;      /* algo * FSDP_SIM_PROTO_COUNT + proto */
    int channels; /* the channels the call runs on */
} ccall_t;

static void fit_ring_class(const ccall_t *cc, int ncc, int proto, const fsdp_sim_profile_t *cur,
                           fsdp_sim_profile_t *p, FILE *rep, double *x, double *y, int *floor_calls)
{
    fsdp_sim_nccl_profile_t *nc = &p->nccl;
    const double kovh = proto == FSDP_SIM_PROTO_SIMPLE ? 3.0 : 1.0;
    const double klat = proto == FSDP_SIM_PROTO_SIMPLE ? 2.0 : 1.0;
    double theta[C_NCOLS];
    int used[C_NCOLS], n = 0, cls = FSDP_SIM_ALGO_RING * FSDP_SIM_PROTO_COUNT + proto;

    for (int i = 0; i < ncc; i++) {
        double known;
        if (cc[i].cls != cls)
            continue;
        if (ring_row(cur, proto, cc[i].kind, cc[i].n, cc[i].nodes, cc[i].nbytes, cc[i].channels,
                     x + (size_t)n * C_NCOLS, &known))
            y[n++] = cc[i].dur - known;
    }
    if (n == 0)
        return;
    if (fsdp_calib_lsq(x, y, n, C_NCOLS, theta, used) < 0)
        return;
    /* columns the calls cannot identify keep their values: fit the others to what is left */
    {
        double prior[C_NCOLS];
        int again = 0;
        ring_prior(cur, proto, prior);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < C_NCOLS; j++)
                if (!used[j] && x[(size_t)i * C_NCOLS + j] != 0.0) {
                    y[i] -= x[(size_t)i * C_NCOLS + j] * prior[j];
                    x[(size_t)i * C_NCOLS + j] = 0.0;
                    again = 1;
                }
        if (again && fsdp_calib_lsq(x, y, n, C_NCOLS, theta, used) < 0)
            return;
    }
    if (rep != NULL)
        fprintf(rep, "collectives ring/%s: %d calls\n",
                fsdp_sim_proto_name((fsdp_sim_proto_t)proto), n);
    for (int j = 0; j < C_NCOLS; j++) {
        if (rep == NULL)
            break;
        if (used[j])
            fprintf(rep, "  %-28s %.5g %s\n", col_names[j],
                    (j == C_BW_INTRA || j == C_BW_NIC) ? (theta[j] > 0.0 ? 1.0 / theta[j] : 0.0) : theta[j],
                    (j == C_BW_INTRA || j == C_BW_NIC) ? "B/s" : "s");
        else
            fprintf(rep, "  %-28s not identified (kept)\n", col_names[j]);
    }
    /* the floors are one per profile: the class with the most calls sets them */
    if (n > *floor_calls) {
        if (used[C_FLOOR] && theta[C_FLOOR] >= 0.0)
            nc->call_floor_s = theta[C_FLOOR];
        if (used[C_NET_FLOOR] && theta[C_NET_FLOOR] >= 0.0)
            nc->net_floor_s = theta[C_NET_FLOOR];
        *floor_calls = n;
    }
    if (used[C_INTRA] && theta[C_INTRA] >= 0.0)
        nc->intra_latency_s[FSDP_SIM_ALGO_RING][proto] = theta[C_INTRA];
    if (used[C_NET_INTRA] && theta[C_NET_INTRA] >= 0.0) {
        double intra = nc->intra_latency_s[FSDP_SIM_ALGO_RING][proto];
        if (!used[C_INTRA])
            nc->intra_latency_s[FSDP_SIM_ALGO_RING][proto] = intra = theta[C_NET_INTRA];
        /* the floor binds when multi-node steps are slower than NVLink ones */
        if (theta[C_NET_INTRA] > intra * (1.0 + 1e-6))
            nc->net_overhead_s = theta[C_NET_INTRA] / kovh;
        else if (nc->net_overhead_s * kovh > intra)
            nc->net_overhead_s = intra / kovh;
    }
    if (used[C_INTER]) {
        double v = theta[C_INTER] - nc->net_latency_s * klat;
        nc->inter_latency_s[FSDP_SIM_ALGO_RING][proto] = v > 0.0 ? v : 0.0;
    }
    if (used[C_INTER_TREE]) {
        double v = theta[C_INTER_TREE] - nc->net_latency_s * klat;
        nc->inter_latency_s[FSDP_SIM_ALGO_TREE][proto] = v > 0.0 ? v : 0.0;
    }
    /* bandwidths: LL and LL128 run under caps of their own; only Simple's is the link's */
    if (proto == FSDP_SIM_PROTO_SIMPLE) {
        if (used[C_BW_INTRA] && theta[C_BW_INTRA] > 0.0)
            nc->intra_bus_bytes_per_s = 1.0 / theta[C_BW_INTRA];
        if (used[C_BW_NIC] && theta[C_BW_NIC] > 0.0)
            nc->nic_bytes_per_s = 1.0 / theta[C_BW_NIC];
    }
}

static int fit_collectives(calib_t *c, int per_node, fsdp_sim_profile_t *p, FILE *rep)
{
    ccall_t *cc;
    double *x, *y, *err;
    int ncc = 0, total = 0, other = 0;

    for (int g = 0; g < c->ngroups; g++)
        total += c->groups[g].ncalls;
    cc = malloc((size_t)(total + 1) * sizeof(*cc));
    x = malloc((size_t)(total + 1) * C_NCOLS * sizeof(*x));
    y = malloc((size_t)(total + 1) * sizeof(*y));
    err = malloc((size_t)(total + 1) * sizeof(*err));
    if (cc == NULL || x == NULL || y == NULL || err == NULL) {
        free(cc), free(x), free(y), free(err);
        return -1;
    }
    for (int gi = 0; gi < c->ngroups; gi++) {
        group_t *g = &c->groups[gi];
        int last_node = -1;
        g->size = g->nodes = 0;
        for (int r = 0; r < c->world; r++) {
            if (!g->member[r])
                continue;
            g->size++;
            if (r / per_node != last_node)
                g->nodes++;
            last_node = r / per_node;
        }
        for (int k = 0; k < g->ncalls; k++) {
            const call_t *call = &g->calls[k];
            if (!call->seen || g->size < 2)
                continue;
            if (call->kind == FSDP_SIM_COLL_BROADCAST) {
                c->skipped_bcast++;
                continue;
            }
            cc[ncc].kind = call->kind;
            cc[ncc].n = g->size;
            cc[ncc].nodes = g->nodes;
            cc[ncc].nbytes = call->nbytes;
            cc[ncc].dur = call->dur;
            cc[ncc].cls = -1;
            cc[ncc].channels = 0;
            ncc++;
        }
    }
    /* classify by what the current profile picks, fit, until the choice is stable */
    for (int iter = 0; iter < 5; iter++) {
        fsdp_sim_profile_t cur = *p;
        int changed = 0;
        for (int i = 0; i < ncc; i++) {
            fsdp_sim_coll_cost_t cost;
            int cls;
            fsdp_sim_coll_time(&cur, cc[i].kind, cc[i].n, cc[i].nodes, cc[i].nbytes, &cost);
            cls = (int)cost.algo * FSDP_SIM_PROTO_COUNT + (int)cost.proto;
            changed += cls != cc[i].cls || cost.channels != cc[i].channels;
            cc[i].cls = cls;
            cc[i].channels = cost.channels;
        }
        if (!changed && iter > 0)
            break;
        if (rep != NULL)
            fprintf(rep, "-- collective fit, pass %d (%d calls re-classified)\n", iter + 1,
                    changed);
        for (int pr = 0, floor_calls = 0; pr < FSDP_SIM_PROTO_COUNT; pr++)
            fit_ring_class(cc, ncc, pr, &cur, p, rep, x, y, &floor_calls);
    }
    for (int i = 0; i < ncc; i++)
        other += cc[i].cls / FSDP_SIM_PROTO_COUNT != FSDP_SIM_ALGO_RING;
    if (rep != NULL) {
        int m = 0;
        double worst = 0.0;
        for (int i = 0; i < ncc; i++) {
            double t = fsdp_sim_coll_time(p, cc[i].kind, cc[i].n, cc[i].nodes, cc[i].nbytes,
                                          NULL);
            if (cc[i].dur > 0.0) {
                err[m] = fabs(t - cc[i].dur) / cc[i].dur;
                worst = err[m] > worst ? err[m] : worst;
                m++;
            }
        }
        fprintf(rep,
                "collectives: %d calls in %d groups (%d tree/nvls/pat calls kept at the base's "
                "numbers, %d broadcasts skipped); model error median %.3g%%, max %.3g%%\n",
                ncc, c->ngroups, other, c->skipped_bcast, 100.0 * median_abs_rel(err, m),
                100.0 * worst);
    }
    free(cc), free(x), free(y), free(err);
    return 0;
}

/* A trace of a symmetric plan holds one simulated rank per class of ranks that run alike. Its
 * kernels could be weighed by the ranks each stands for, but not its collectives: a call's
 * time is the smallest over its group's ranks and is priced by the group's size and nodes,
 * and the ranks a simulated rank stands for are in other groups of the same name pattern
 * (rank 5's node is world/split(1) where its representative's is world/split(0)), which no
 * rank traced. Such a run is refused, by name. */
static fsdp_status_t refuse_symmetric(fsdp_trace_reader_t *r, int64_t run, const char *path,
                                      int world)
{
    int *rep = malloc((size_t)world * sizeof(*rep)), traced = 0, standing = 0;
    fsdp_status_t st;

    if (rep == NULL) {
        fsdp_error("calibrate: out of host memory for %d ranks", world);
        return FSDP_ERR_NO_MEMORY;
    }
    st = fsdp_trace_reader_represent(r, run, rep, &traced);
    for (int x = 0; st == FSDP_OK && x < world; x++)
        standing += rep[x] >= 0 && rep[x] != x;
    free(rep);
    if (st == FSDP_OK && standing > 0) {
        fsdp_error("calibrate: run %" PRId64 " of %s is a symmetric plan: its %d simulated ranks "
                   "stand for %d more, whose collectives' groups it does not hold, so neither the "
                   "groups' sizes nor their calls' times can be read from it; calibrate a trace of "
                   "every rank (fsdp-plan --no-symmetry)",
                   run, path, traced, standing);
        return FSDP_ERR_UNSUPPORTED;
    }
    return st;
}

fsdp_status_t fsdp_trace_calibrate(const char *path, const fsdp_calib_options_t *opts,
                                   const fsdp_sim_profile_t *base, fsdp_sim_profile_t *out,
                                   FILE *report)
{
    fsdp_trace_reader_t *r = NULL;
    fsdp_trace_run_row_t row;
    fsdp_sim_profile_t p = *base, run_prof;
    const fsdp_sim_profile_t *rp = NULL; /* the run row's profile, parsed once */
    calib_t c;
    int64_t run;
    int per_node;
    fsdp_status_t st;

    memset(&c, 0, sizeof(c));
    st = fsdp_trace_reader_open(path, &r);
    if (st != FSDP_OK)
        return st;
    st = fsdp_trace_reader_find_run(r, opts != NULL ? opts->run : 0, &run);
    if (st == FSDP_OK)
        st = fsdp_trace_reader_run(r, run, &row);
    if (st != FSDP_OK)
        goto done;
    c.world = row.world_size > 0 ? row.world_size : 1;
    st = refuse_symmetric(r, run, path, c.world);
    if (st != FSDP_OK)
        goto done;
    if (row.profile_json != NULL && fsdp_sim_profile_parse(row.profile_json, &run_prof) == FSDP_OK)
        rp = &run_prof;
    per_node = opts != NULL && opts->ranks_per_node > 0 ? opts->ranks_per_node
                                                        : run_ranks_per_node(&row, rp);
    if (per_node <= 0 || per_node > c.world)
        per_node = c.world;
    c.eager = run_eager(&row, rp);
    st = fsdp_trace_reader_events(r, run, -1, on_event, &c);
    if (st == FSDP_OK && c.oom)
        st = FSDP_ERR_OUT_OF_MEMORY;
    if (st != FSDP_OK)
        goto done;
    if (report != NULL)
        fprintf(report, "calibrate: run %" PRId64 " of %s, %s backend, %d ranks, %d per node; "
                        "base profile %s\n",
                run, path, row.backend != NULL ? row.backend : "?", c.world, per_node,
                base->name);
    if (report != NULL && c.skipped_eager > 0)
        fprintf(report, "calibrate: %d kernel events left out: the run priced their kinds as "
                        "eager op sequences (its profile's ops), not one kernel each\n",
                c.skipped_eager);
    snprintf(p.name, sizeof(p.name), "%.50s-calibrated", base->name);
    p.gpus_per_node = per_node;
    p.nodes = (c.world + per_node - 1) / per_node;
    if (fit_kernels(&c, &p, report) != 0 || fit_collectives(&c, per_node, &p, report) != 0) {
        st = FSDP_ERR_OUT_OF_MEMORY;
        goto done;
    }
    st = fsdp_sim_profile_check(&p);
    if (st == FSDP_OK)
        *out = p;
done:
    for (int g = 0; g < c.ngroups; g++) {
        free(c.groups[g].member), free(c.groups[g].next), free(c.groups[g].prev_end);
        free(c.groups[g].calls);
    }
    free(c.groups);
    free(c.k);
    fsdp_trace_reader_close(r);
    return st;
}
