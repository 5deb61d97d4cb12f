/* One configuration of fsdp-plan's job, simulated (plan.h): the real training step of every
 * rank (or of one rank per class of ranks that run alike) in shape mode, run again with the SMs
 * its collectives held until the step time settles, and summed up over the ranks. */
#include "plan.h"

#include <fsdp/trace.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

const char *const plan_phase_names[N_PHASES] = {"setup", "forward", "backward", "optimizer"};

typedef struct plan_run {
    const plan_args_t *a;
    fsdp_config_t cfg;
    rank_result_t *res;   /* per rank */
    fsdp_trace_t *trace;  /* --trace, or NULL */
    const int *represent; /* symmetric ranks, or NULL */
    /* not NULL: build the model, derive the classes of symmetric ranks of a world of
     * classes_world into classes + rank x classes_world (from the layout of its units) and
     * their number into n_classes[rank], stop */
    int *classes, classes_world, classes_per_node, *n_classes;
} plan_run_t;

static int *classes;           /* the classes of the last run, a->world entries */
static int64_t last_trace_run; /* the trace's run of the last simulated run (--trace, --plot) */

/* Folds the phase's peaks into the rank's and starts the next phase's. */
static void phase_end(fsdp_mem_t *mem, rank_result_t *r, int phase)
{
    fsdp_mem_stats_t st;

    fsdp_mem_get_stats(mem, &st);
    if (st.peak_allocated > r->phase_alloc[phase])
        r->phase_alloc[phase] = st.peak_allocated;
    if (st.peak_reserved > r->phase_reserved[phase])
        r->phase_reserved[phase] = st.peak_reserved;
    if (st.peak_allocated > r->peak_alloc) {
        r->peak_alloc = st.peak_allocated;
        memcpy(r->at_peak, st.at_peak_by_category, sizeof(r->at_peak));
    }
    if (st.peak_reserved > r->peak_reserved)
        r->peak_reserved = st.peak_reserved;
    fsdp_mem_reset_peaks(mem);
}

typedef struct phase_ctx {
    fsdp_mem_t *mem;
    rank_result_t *r;
    int cur;
} phase_ctx_t;

static void phase_begin(fsdp_phase_t phase, void *arg)
{
    phase_ctx_t *p = arg;
    phase_end(p->mem, p->r, p->cur);
    p->cur = phase == FSDP_PHASE_BACKWARD ? PH_BACKWARD : PH_FORWARD;
}

static fsdp_status_t plan_rank(fsdp_dev_t *dev, void *arg)
{
    plan_run_t *run = arg;
    const plan_args_t *a = run->a;
    rank_result_t *r = &run->res[dev->rank];
    fsdp_optim_config_t oc;
    fsdp_optim_t *opt = NULL;
    phase_ctx_t pc;
    void *model = NULL;
    fsdp_t *fs = NULL;
    fsdp_mem_t *mem;
    fsdp_status_t st;

    st = run->trace != NULL ? fsdp_trace_attach(run->trace, dev) : FSDP_OK;
    if (st == FSDP_OK)
        st = fsdp_create(dev, &run->cfg, &fs);
    if (st != FSDP_OK) {
        fsdp_trace_detach(dev);
        return r->status = st;
    }
    mem = fsdp_memory(fs);
    pc.mem = mem;
    pc.r = r;
    pc.cur = PH_SETUP;
    fsdp_optim_config_init(&oc, a->optim);
    st = a->model->ops->create(fs, &a->mcfg, &model);
    if (st == FSDP_OK) {
        if (a->model->ops->phase_hook != NULL)
            a->model->ops->phase_hook(model, phase_begin, &pc);
        /* a divergence the classes missed fails the run here, before any step */
        st = fsdp_symmetry_check(fs, run->represent);
        if (st == FSDP_OK && run->classes != NULL) {
            run->n_classes[dev->rank] = fsdp_symmetric_ranks(
                fs, run->classes_world, run->classes_per_node, run->cfg.strategy,
                run->classes + (size_t)dev->rank * (size_t)run->classes_world);
            a->model->ops->destroy(model);
            fsdp_destroy(fs);
            return r->status = st;
        }
        if (st == FSDP_OK)
            st = fsdp_optim_create(fs, &oc, &opt);
    }
    for (int step = 0; step < a->steps && st == FSDP_OK; step++) {
        double t0;
        /* what came before (setup, or the last step's optimizer) ends */
        phase_begin(FSDP_PHASE_FORWARD, &pc);
        fsdp_sim_time_reset(dev);
        t0 = fsdp_dev_host_time(dev);
        /* gradient accumulation, as fsdp-train's loop: the first micro-batches under no_sync
         * (fsdp2: gradient sync off), the last syncs. fsdp-train scales the loss by 1 / K, a
         * scalar of the loss kernel: no bytes and no time, and a plan has no loss to scale. */
        for (int k = 0; k < a->grad_accum && st == FSDP_OK; k++) {
            st = fsdp_set_sync_gradients(fs, k == a->grad_accum - 1);
            if (st == FSDP_OK)
                st = a->model->ops->step(model, a->local_batch, a->mcfg.seq);
        }
        if (st != FSDP_OK)
            break;
        phase_end(mem, r, pc.cur);
        pc.cur = PH_OPTIM;
        st = fsdp_optim_step(opt);
        fsdp_zero_grad(fs);
        if (st == FSDP_OK)
            st = fsdp_dev_stream_synchronize(dev, NULL);
        if (st == FSDP_OK)
            st = fsdp_sim_time_stats(dev, &r->ts);
        r->step_time = fsdp_dev_host_time(dev) - t0;
        if (st == FSDP_OK && run->trace != NULL) {
            fsdp_mem_stats_t ms;
            fsdp_mem_get_stats(mem, &ms);
            fsdp_trace_step(dev, step + 1, 0.0, r->step_time, &ms);
        }
    }
    if (st == FSDP_OK)
        phase_end(mem, r, pc.cur);
    if (opt != NULL)
        fsdp_optim_destroy(opt);
    if (model != NULL)
        a->model->ops->destroy(model);
    fsdp_destroy(fs);
    fsdp_trace_detach(dev);
    return r->status = st;
}

fsdp_dtype_t plan_compute_dtype(const fsdp_config_t *cfg)
{
    fsdp_dtype_t dt = cfg->mixed_precision.param_dtype;
    return dt == FSDP_DTYPE_BF16 || dt == FSDP_DTYPE_F16 ? dt : FSDP_DTYPE_F32;
}

/* The classes of symmetric ranks for cfg into represent; the number of ranks to simulate, or
 * the world when symmetry is off or does not pay. */
static int plan_symmetry(const plan_args_t *a, const fsdp_config_t *cfg, int *represent)
{
    /* One rank builds the model: the layout of its units is every rank's. Under tensor
     * parallelism a tp group does, a rank of each tp index: the models size their slices from
     * tp alone (they refuse a tp that does not divide what they split), and each derives the
     * classes from its own layout, which must agree. */
    const int tp = cfg->tp_size > 1 ? cfg->tp_size : 1;
    plan_args_t one = *a;
    rank_result_t *r1 = NULL;
    int *n_classes = NULL, *tables = represent, n = a->world;
    fsdp_sim_params_t sp;
    plan_run_t run = {.a = &one, .cfg = *cfg};

    if (!a->symmetry || a->world == 1)
        return a->world;
    r1 = calloc((size_t)tp, sizeof(*r1));
    n_classes = calloc((size_t)tp, sizeof(*n_classes));
    if (tp > 1)
        tables = malloc((size_t)tp * (size_t)a->world * sizeof(*tables));
    if (r1 == NULL || n_classes == NULL || tables == NULL)
        goto out;
    one.world = one.per_node = tp;
    run.res = r1;
    run.classes = tables;
    run.n_classes = n_classes;
    run.cfg.device_capacity = 0;
    run.classes_world = a->world;
    run.classes_per_node = a->per_node;
    fsdp_sim_params_init(&sp);
    sp.world_size = sp.ranks_per_node = tp;
    sp.mode = FSDP_SIM_SHAPE;
    sp.profile = a->profile;
    if (fsdp_sim_launch(&sp, plan_rank, &run, NULL) == FSDP_OK && n_classes[0] >= 1) {
        n = n_classes[0];
        for (int t = 1; t < tp && n < a->world; t++) {
            if (n_classes[t] != n || memcmp(tables, tables + (size_t)t * (size_t)a->world,
                                            (size_t)a->world * sizeof(*tables)) != 0)
                n = a->world; /* run every rank */
        }
    }
    if (tables != represent && n < a->world)
        memcpy(represent, tables, (size_t)a->world * sizeof(*tables));
out:
    if (tables != represent)
        free(tables);
    free(n_classes);
    free(r1);
    return n;
}

/* One simulation of the job; holds: the book of the runs before (NULL: none); traced: write the
 * trace (--trace). */
static summary_t run_once(const plan_args_t *a, const fsdp_config_t *cfg, size_t capacity,
                          rank_result_t *res, fsdp_sim_holds_t *holds, int traced)
{
    fsdp_sim_params_t sp;
    plan_run_t run = {.a = a, .cfg = *cfg, .res = res};
    summary_t s;
    double peak = fsdp_sim_profile_matmul_flops(&a->profile, plan_compute_dtype(cfg));
    int slow = 0;

    memset(&s, 0, sizeof(s));
    memset(res, 0, sizeof(*res) * (size_t)a->world);
    run.cfg.device_capacity = capacity;
    if (classes == NULL)
        classes = malloc((size_t)a->world * sizeof(*classes));
    s.simulated = classes != NULL ? plan_symmetry(a, cfg, classes) : a->world;
    if (s.simulated > 0 && s.simulated < a->world)
        run.represent = classes;
    else
        s.simulated = a->world;
    fsdp_sim_params_init(&sp);
    sp.world_size = a->world;
    sp.ranks_per_node = a->per_node;
    sp.mode = FSDP_SIM_SHAPE;
    sp.fibers = 1; /* thousands of ranks on a few cores */
    sp.timeout_s = a->timeout_s;
    sp.profile = a->profile;
    sp.holds = holds;
    if (traced && a->trace_path != NULL) {
        fsdp_trace_run_info_t info;
        fsdp_sim_profile_t topo = a->profile; /* the profile with the simulated topology */
        char *profile_json;
        fsdp_status_t st;
        topo.gpus_per_node = a->per_node;
        topo.nodes = a->world / a->per_node;
        profile_json = fsdp_sim_profile_to_json(&topo);
        if (profile_json == NULL)
            cli_die("out of host memory");
        memset(&info, 0, sizeof(info));
        info.backend = "sim (shape mode)";
        info.world_size = a->world;
        info.strategy = fsdp_strategy_name(cfg->strategy);
        info.profile_json = profile_json;
        info.command_line = a->command_line;
        st = fsdp_trace_open(a->trace_path, &info, &run.trace);
        free(profile_json);
        if (st != FSDP_OK)
            cli_die("cannot write the trace to %s (see the message above)", a->trace_path);
        last_trace_run = fsdp_trace_run_id(run.trace);
    }
    sp.represent = run.represent;
    sp.tp_size = cfg->tp_size;
    s.status = fsdp_sim_launch(&sp, plan_rank, &run, NULL);
    if (fsdp_trace_close(run.trace) != FSDP_OK && s.status == FSDP_OK)
        s.status = FSDP_ERR_IO;
    if (run.represent != NULL && s.status == FSDP_ERR_UNSUPPORTED) {
        /* the classes diverged (logged): every rank apart */
        plan_args_t all = *a;
        all.symmetry = 0;
        return run_once(&all, cfg, capacity, res, holds, traced);
    }
    for (int r = 0; r < a->world && run.represent != NULL; r++) {
        if (run.represent[r] != r) /* the rank's run is its representative's */
            res[r] = res[run.represent[r]];
    }
    for (int r = 0; r < a->world; r++) {
        if (res[r].status == FSDP_ERR_OUT_OF_MEMORY)
            s.oom = 1;
        if (res[r].step_time > res[slow].step_time)
            slow = r;
        if (res[r].peak_alloc > s.peak_alloc)
            s.peak_alloc = res[r].peak_alloc;
        if (res[r].peak_reserved > s.peak_reserved)
            s.peak_reserved = res[r].peak_reserved;
    }
    s.step_time = res[slow].step_time;
    s.exposed = res[slow].ts.exposed_comm_s;
    s.compute = res[slow].ts.compute_s;
    s.sm_held = res[slow].ts.sm_held_s;
    s.hbm_held = res[slow].ts.hbm_held_s;
    s.mfu = s.step_time > 0 && peak > 0 ? res[slow].ts.gemm_flops / (s.step_time * peak) : 0.0;
    return s;
}

/* A kernel is priced when it is issued, so a collective issued after the kernels it overlaps
 * (FSDP's forward all-gathers) would leave them all the SMs: the job runs again with the SMs its
 * collectives held in the run before (fsdp_sim_holds_t) until its step time changes by less
 * than a part in 10^4, up to PLAN_RUNS runs (each run moves it by a tenth to a fifth of what
 * the run before moved it); --trace traces the last run again, repeated exactly. */
#define PLAN_RUNS 6

static summary_t run_plan(const plan_args_t *a, const fsdp_config_t *cfg, size_t capacity,
                          rank_result_t *res)
{
    fsdp_sim_holds_t *holds = fsdp_sim_holds_create(a->world);
    summary_t s;
    double last = 0.0, change = 0.0;
    int runs = 0;

    for (int i = 0; i < PLAN_RUNS; i++) {
        s = run_once(a, cfg, capacity, res, holds, holds == NULL && a->trace_path != NULL);
        runs++;
        if (i > 0)
            change = s.step_time > 0.0 ? fabs(s.step_time - last) / s.step_time : 0.0;
        if (holds == NULL || s.status != FSDP_OK || s.oom || (i > 0 && change <= 1e-4))
            break;
        last = s.step_time;
    }
    /* the trace is of the last run, repeated: the same figures as without --trace */
    if (holds != NULL && a->trace_path != NULL) {
        fsdp_sim_holds_repeat(holds);
        s = run_once(a, cfg, capacity, res, holds, 1);
    }
    fsdp_sim_holds_destroy(holds);
    s.runs = runs;
    s.last_change = change;
    return s;
}

summary_t plan_config(const plan_args_t *a, const fsdp_config_t *cfg, rank_result_t *res, int quiet)
{
    summary_t s;

    cli_log_quiet(1); /* out of memory is an answer here, not an error to print */
    s = run_plan(a, cfg, a->capacity, res);
    if (s.oom && !quiet) {
        s = run_plan(a, cfg, 0, res);
        s.oom = 1;
    }
    cli_log_quiet(0);
    if (s.status != FSDP_OK && !quiet) {
        /* say why, with the messages on */
        run_plan(a, cfg, 0, res);
    }
    return s;
}

int64_t plan_last_trace_run(void)
{
    return last_trace_run;
}

void plan_run_cleanup(void)
{
    free(classes);
    classes = NULL;
}
