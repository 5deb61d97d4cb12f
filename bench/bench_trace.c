/* The cost of event tracing, measured against the same work without it in the same run.
 *
 *     bench_trace [--quick] [--steps N] [--world W]
 *
 * (--isa X is accepted and ignored, so that `make bench BENCH_FLAGS=...` can serve bench_gemm
 * too.)
 *
 * 1. emit: one rank thread emits N events of a FULL_SHARD-like mix; the baseline loop builds the
 *    same events with tracing off (fsdp_trace_emit returns at once). Reports ns per event on the
 *    rank thread, and the writer's rate: events committed per second from the first emit to the
 *    end of fsdp_trace_close.
 * 2. emit from many ranks: the same on W sim ranks at once (contention on the writer's queue).
 * 3. sqlite alone: the same rows inserted by a plain loop into a database the library set up,
 *    through the writer's statement shape and in transactions of a step's rows: what SQLite
 *    itself takes per row on this machine, the floor of any writer that stores a row per event.
 * 4. step: real data-mode training steps on the sim (world 4, FULL_SHARD, AdamW), with and
 *    without a trace attached: the main job's (README: gpt2-tiny, a global batch of 32
 *    sequences of 64 tokens), a medium MLP (256-1024-1024-1024-256, 64 rows) and a small one
 *    (64-256-256-256-64, 32 rows). Every event is the runtime's and the backend's own (hooks,
 *    allocations, frees, kernels, copies, collectives, records, waits, synchronizations) plus
 *    the step rows. In each run the measured steps alternate, traced and untraced (ABBA), the
 *    trace attached to every rank for the traced ones only. Tracing's cost is what the ranks'
 *    own CPU time (their thread clocks) gains in a traced step, building and handing over
 *    their events, plus the writer's: its thread's CPU time and the closing checkpoint, per
 *    traced step. Noise on a shared machine moves a run's figure either way, so of several
 *    runs the median is reported, with the range.
 *
 * The budget (tracing costs at most 5% of a data-mode step's CPU time) is judged on the main
 * job's step. The small MLP is a stress case: its step spends 10-20 us of CPU per event, and
 * SQLite's own insert of a row (part 3) is a tenth of that or more on this machine, so no writer
 * that stores one row per event fits 5% of it; the report gives the writer's cost per row
 * against SQLite's.
 *
 * CPU times come from the thread and process CPU clocks, so time spent descheduled on a busy
 * machine does not count; the writer's rate is wall-clock.
 */
#include <fsdp/fsdp.h>
#include <fsdp/gpt2.h>

#include "trace/trace_hidden.h"
#include "trace/trace_int.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define BENCH_BUDGET 0.05
#define MLP_LAYERS 4

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double thread_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double process_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char dir[256];

static void db_path(char *buf, size_t size, const char *name)
{
    snprintf(buf, size, "%s/%s", dir, name);
}

static void db_remove(const char *path)
{
    char buf[600];
    remove(path);
    snprintf(buf, sizeof(buf), "%s-wal", path);
    remove(buf);
    snprintf(buf, sizeof(buf), "%s-shm", path);
    remove(buf);
}

/* The i-th event of a FULL_SHARD-like sequence (what the hooks and backends emit). */
static void bench_event(int64_t i, double t, fsdp_trace_event_t *ev)
{
    static const struct {
        fsdp_event_kind_t kind;
        const char *name, *stream;
        int dtype;
    } mix[8] = {
        {FSDP_EV_HOOK, "pre_forward", NULL, -1},
        {FSDP_EV_ALLOC, "unsharded_param", "all_gather", -1},
        {FSDP_EV_COLLECTIVE, "all_gather", "all_gather", FSDP_DTYPE_BF16},
        {FSDP_EV_RECORD, "all_gather_done", "all_gather", -1},
        {FSDP_EV_WAIT, "all_gather_done", "compute", -1},
        {FSDP_EV_KERNEL, "gemm", "compute", FSDP_DTYPE_F32},
        {FSDP_EV_HOOK, "post_forward", NULL, -1},
        {FSDP_EV_FREE, "unsharded_param", "all_gather", -1},
    };
    static const char *const units[MLP_LAYERS] = {"layers.0", "layers.1", "layers.2", "layers.3"};
    int k = (int)(i % 8);

    fsdp_trace_event_init(ev, mix[k].kind, mix[k].name);
    ev->unit = units[(i / 8) % MLP_LAYERS];
    ev->stream = mix[k].stream;
    ev->group = mix[k].kind == FSDP_EV_COLLECTIVE ? "world" : NULL;
    ev->dtype = mix[k].dtype;
    ev->bytes = 65536 + (uint64_t)k * 512;
    ev->count = ev->bytes / 4;
    ev->host_time = t;
    ev->start = t + 1e-6;
    ev->end = t + 2e-6;
    ev->allocated = (uint64_t)i * 512;
    ev->reserved = 1u << 30;
}

/* ---- 1 and 2: raw emission -------------------------------------------------------------- */

typedef struct emit_arg {
    fsdp_trace_t *trace; /* NULL: the baseline */
    int64_t n;
    double t_rank; /* rank 0's thread CPU time, emit loop only */
} emit_arg_t;

static fsdp_status_t emit_rank(fsdp_dev_t *dev, void *arg)
{
    emit_arg_t *a = arg;
    fsdp_trace_event_t ev;
    double t0;

    if (a->trace != NULL && fsdp_trace_attach(a->trace, dev) != FSDP_OK)
        return FSDP_ERR_INTERNAL;
    t0 = thread_cpu();
    for (int64_t i = 0; i < a->n; i++) {
        bench_event(i, 1e-6 * (double)i, &ev);
        fsdp_trace_emit(dev, &ev);
        if (i % 4096 == 4095)
            fsdp_trace_step(dev, i / 4096, 0.0, 0.0, NULL);
    }
    if (dev->rank == 0)
        a->t_rank = thread_cpu() - t0;
    fsdp_trace_detach(dev);
    return FSDP_OK;
}

static int bench_emit(int world, int64_t n_per_rank)
{
    fsdp_sim_params_t p;
    emit_arg_t base = {NULL, n_per_rank, 0}, traced = {NULL, n_per_rank, 0};
    char path[512];
    double t0, c0, t_total, c_base, c_traced;
    double total = (double)n_per_rank * world;
    struct stat sb;

    fsdp_sim_params_init(&p);
    p.world_size = world;
    p.mode = FSDP_SIM_SHAPE;
    c0 = process_cpu();
    if (fsdp_sim_launch(&p, emit_rank, &base, NULL) != FSDP_OK)
        return -1;
    c_base = process_cpu() - c0;

    db_path(path, sizeof(path), "emit.db");
    db_remove(path);
    c0 = process_cpu();
    t0 = now();
    if (fsdp_trace_open(path, NULL, &traced.trace) != FSDP_OK)
        return -1;
    if (fsdp_sim_launch(&p, emit_rank, &traced, NULL) != FSDP_OK)
        return -1;
    if (fsdp_trace_close(traced.trace) != FSDP_OK)
        return -1;
    t_total = now() - t0;
    c_traced = process_cpu() - c0;
    stat(path, &sb);
    printf("emit, %4d rank%s, %" PRId64 " events: %6.1f ns/event on a rank thread (baseline loop "
           "%.1f); %.2f us/event of CPU in all (baseline %.2f); %.3f M events/s committed; "
           "%.0f B/event in the file\n",
           world, world == 1 ? " " : "s", (int64_t)total, 1e9 * traced.t_rank / (double)n_per_rank,
           1e9 * base.t_rank / (double)n_per_rank, 1e6 * c_traced / total, 1e6 * c_base / total,
           total / t_total / 1e6, (double)sb.st_size / total);
    db_remove(path);
    return 0;
}

/* ---- 3: SQLite's own cost of an event row ------------------------------------------------ */

/* What SQLite alone takes to store the rows the writer stores: the same events (the mix of
 * bench_event, four ranks in chunks of 256, their texts as fixed ids) inserted by a plain loop
 * into a database the library set up (its schema, WAL, pragmas), through the writer's own
 * statement (16 rows an INSERT) and one transaction per `per_commit` rows. CPU seconds per row, or a
 * negative value on an error. */
static double bench_sqlite_floor(int64_t n, int per_commit)
{
    enum { ROWS = 16 };
    char path[512];
    fsdp_trace_t *t;
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    fsdp_trace_event_t ev;
    int64_t run;
    double c0, cpu = -1.0;
    int ok = 1;

    db_path(path, sizeof(path), "floor.db");
    db_remove(path);
    if (fsdp_trace_open(path, NULL, &t) != FSDP_OK)
        return -1.0;
    run = fsdp_trace_run_id(t);
    if (fsdp_trace_close(t) != FSDP_OK || fsdp_trace_db_open(path, 1, &db) != FSDP_OK)
        goto out;
    if (fsdp_trace_db_prepare_event_insert(db, ROWS, &st) != FSDP_OK)
        goto out;
    sqlite3_bind_int64(st, 1, run);
    c0 = process_cpu();
    for (int64_t i = 0; i < n && ok; i += ROWS) {
        if (i % per_commit == 0)
            ok &= fsdp_trace_db_exec(db, "BEGIN IMMEDIATE") == FSDP_OK;
        for (int r = 0; r < ROWS; r++) {
            int64_t j = i + r, rank = (j / 256) % 4, col = 2 + r * FSDP_TRACE_EVENT_NCOLS;
            int k = (int)(j % 8);
            bench_event(j, 1e-6 * (double)j, &ev);
            sqlite3_bind_int64(st, (int)col, rank);
            sqlite3_bind_int64(st, (int)col + 1, (j / 1024) * 256 + j % 256);
            sqlite3_bind_int64(st, (int)col + 2, 1 + ev.kind);
            sqlite3_bind_int64(st, (int)col + 3, 20 + k);
            sqlite3_bind_int64(st, (int)col + 4, 40 + (j / 8) % MLP_LAYERS);
            if (ev.stream != NULL)
                sqlite3_bind_int64(st, (int)col + 5, ev.stream[0] == 'a' ? 50 : 51);
            else
                sqlite3_bind_null(st, (int)col + 5);
            sqlite3_bind_double(st, (int)col + 6, ev.host_time);
            sqlite3_bind_double(st, (int)col + 7, ev.start);
            sqlite3_bind_double(st, (int)col + 8, ev.end);
            sqlite3_bind_int64(st, (int)col + 9, (sqlite3_int64)ev.bytes);
            sqlite3_bind_int64(st, (int)col + 10, (sqlite3_int64)ev.count);
            if (ev.dtype >= 0)
                sqlite3_bind_int64(st, (int)col + 11, 60 + ev.dtype);
            else
                sqlite3_bind_null(st, (int)col + 11);
            if (ev.group != NULL)
                sqlite3_bind_int64(st, (int)col + 12, 70);
            else
                sqlite3_bind_null(st, (int)col + 12);
            sqlite3_bind_int64(st, (int)col + 13, (sqlite3_int64)ev.allocated);
            sqlite3_bind_int64(st, (int)col + 14, (sqlite3_int64)ev.reserved);
        }
        ok &= sqlite3_step(st) == SQLITE_DONE;
        sqlite3_reset(st);
        if ((i + ROWS) % per_commit == 0 || i + ROWS >= n)
            ok &= fsdp_trace_db_exec(db, "COMMIT") == FSDP_OK;
    }
    if (ok)
        cpu = (process_cpu() - c0) / (double)n;
out:
    sqlite3_finalize(st);
    sqlite3_close(db);
    db_remove(path);
    return cpu;
}

/* ---- 4: real training steps ------------------------------------------------------------- */

typedef struct step_arg {
    fsdp_trace_t *trace;
    const fsdp_gpt2_config_t *gpt; /* the model: this GPT when set, else the MLP of dims */
    const int *dims;               /* MLP_LAYERS + 1 */
    size_t rows;                   /* MLP rows, or GPT sequences, per rank */
    int steps; /* measured, half of them traced */
    /* per rank (the sim runs 4): its thread's CPU seconds in the untraced [0] and traced [1]
     * steps */
    double cpu[2][4];
} step_arg_t;

/* Which measured steps are traced: ABBA order (0 and 3 of every 4), so that neither kind is
 * always the one after the other (the writer commits a traced step during the next one). */
static int step_traced(int s)
{
    return s % 4 == 0 || s % 4 == 3;
}

static fsdp_status_t step_rank(fsdp_dev_t *dev, void *arg)
{
    step_arg_t *a = arg;
    const int *dims = a->dims;
    const size_t rows = a->rows;
    fsdp_config_t cfg;
    fsdp_optim_config_t ocfg;
    fsdp_t *fs = NULL;
    fsdp_mlp_t *mlp = NULL;
    fsdp_lm_t *gpt = NULL;
    int32_t *tokens = NULL;
    const size_t seq = a->gpt != NULL ? (size_t)a->gpt->n_positions : 0;
    fsdp_optim_t *opt = NULL;
    float *x = NULL, *y = NULL, loss;
    fsdp_status_t status;
    fsdp_mem_stats_t mem;

    if (a->gpt != NULL) {
        /* rows + 1 sequences of tokens: the targets are the inputs shifted by one */
        tokens = malloc((rows * seq + 1) * sizeof(*tokens));
        if (tokens == NULL) {
            status = FSDP_ERR_NO_MEMORY;
            goto out;
        }
        for (size_t i = 0; i <= rows * seq; i++)
            tokens[i] = (int32_t)((i * 31 + (size_t)dev->rank * 7) % (size_t)a->gpt->vocab_size);
    } else {
        x = malloc(rows * dims[0] * sizeof(float));
        y = malloc(rows * dims[MLP_LAYERS] * sizeof(float));
        if (x == NULL || y == NULL) {
            status = FSDP_ERR_NO_MEMORY;
            goto out;
        }
        for (size_t i = 0; i < rows * dims[0]; i++)
            x[i] = (float)((i * 7 + (size_t)dev->rank) % 13) / 13.0f - 0.5f;
        for (size_t i = 0; i < rows * dims[MLP_LAYERS]; i++)
            y[i] = (float)((i * 5) % 11) / 11.0f;
    }
    fsdp_config_init(&cfg);
    status = fsdp_create(dev, &cfg, &fs);
    if (status == FSDP_OK && a->gpt != NULL)
        status = fsdp_gpt2_create(fs, a->gpt, &gpt);
    else if (status == FSDP_OK)
        status = fsdp_mlp_create(fs, dims, MLP_LAYERS, &mlp);
    if (status == FSDP_OK)
        status = gpt != NULL ? fsdp_lm_init_params(gpt, 1) : fsdp_mlp_init_params(mlp, 1);
    fsdp_optim_config_init(&ocfg, FSDP_OPTIM_ADAMW);
    if (status == FSDP_OK)
        status = fsdp_optim_create(fs, &ocfg, &opt);
    /* one step untimed and untraced (lazy init), then the measured ones, the traced ones with
     * the trace attached and their step rows */
    for (int s = -1; s < a->steps && status == FSDP_OK; s++) {
        int traced = s >= 0 && step_traced(s);
        double c0;
        if (traced)
            status = fsdp_trace_attach(a->trace, dev);
        c0 = thread_cpu();
        if (status == FSDP_OK && gpt != NULL)
            status = fsdp_lm_forward_backward(gpt, tokens, tokens + 1, rows, seq, &loss);
        else if (status == FSDP_OK)
            status = fsdp_mlp_forward_backward(mlp, x, y, rows, &loss);
        if (status == FSDP_OK)
            status = fsdp_optim_step(opt);
        fsdp_zero_grad(fs);
        if (status == FSDP_OK)
            status = fsdp_dev_stream_synchronize(dev, fsdp_compute_stream(fs));
        if (traced) {
            fsdp_mem_get_stats(fsdp_memory(fs), &mem);
            fsdp_trace_step(dev, s, loss, 0.0, &mem);
            fsdp_trace_detach(dev);
        }
        if (s >= 0)
            a->cpu[traced][dev->rank] += thread_cpu() - c0;
    }
out:
    fsdp_optim_destroy(opt);
    fsdp_lm_destroy(gpt);
    fsdp_mlp_destroy(mlp);
    fsdp_destroy(fs);
    free(tokens);
    free(x);
    free(y);
    return status;
}

/* Events per step on rank 0: the difference of seq_end between the first and last step rows. */
typedef struct seq_span {
    uint64_t first, last;
    int64_t n;
} seq_span_t;

static int seq_span_row(void *arg, const fsdp_trace_step_row_t *row)
{
    seq_span_t *s = arg;
    if (s->n++ == 0)
        s->first = row->seq_end;
    s->last = row->seq_end;
    return 0;
}

typedef struct step_cost {
    double cpu_base, cpu_traced, writer; /* seconds per step: the ranks', and the writer's */
    double events;                       /* per rank and step */
} step_cost_t;

/* Tracing's cost over an untraced step's: the ranks' extra CPU time and the writer's. */
static double step_share(const step_cost_t *c)
{
    return (c->cpu_traced - c->cpu_base + c->writer) / c->cpu_base;
}

static int share_cmp(const void *a, const void *b)
{
    double x = step_share(a), y = step_share(b);
    return (x > y) - (x < y);
}

/* Runs of `steps` steps on 4 ranks, alternately untraced and traced (step_traced); `what`
 * names the model. In each run the ranks' own CPU time (thread clocks) per untraced and per
 * traced step, and the writer's per traced step; *cost gets the run of the median share. */
static int bench_steps(const char *what, const fsdp_gpt2_config_t *gpt, const int *dims,
                       size_t rows, int steps, int reps, double floor_row, step_cost_t *cost)
{
    fsdp_sim_params_t p;
    char path[512];
    seq_span_t span = {0, 0, 0};
    double commits = 0.0, lo, hi;
    step_cost_t runs[16];
    int n_traced = 0;

    if (reps > 16)
        reps = 16;

    for (int s = 0; s < steps; s++)
        n_traced += step_traced(s);
    fsdp_sim_params_init(&p);
    p.world_size = 4;
    db_path(path, sizeof(path), "steps.db");
    db_remove(path);
    memset(cost, 0, sizeof(*cost));
    for (int r = 0; r < reps; r++) {
        step_arg_t a;
        fsdp_trace_reader_t *reader;
        fsdp_trace_stats_t st;
        double base = 0.0, traced = 0.0, c_close;
        int64_t run;

        memset(&a, 0, sizeof(a));
        a.gpt = gpt;
        a.dims = dims;
        a.rows = rows;
        a.steps = steps;
        if (fsdp_trace_open(path, NULL, &a.trace) != FSDP_OK)
            return -1;
        run = fsdp_trace_run_id(a.trace);
        if (fsdp_sim_launch(&p, step_rank, &a, NULL) != FSDP_OK ||
            fsdp_trace_flush(a.trace) != FSDP_OK) /* the writer's work counts in full */
            return -1;
        fsdp_trace_get_stats(a.trace, &st);
        /* closing checkpoints the WAL into the database (what a long run's writer does every
         * 1000 pages): its cost is the writer's too */
        c_close = thread_cpu();
        if (fsdp_trace_close(a.trace) != FSDP_OK)
            return -1;
        c_close = thread_cpu() - c_close;
        for (int k = 0; k < 4; k++) {
            base += a.cpu[0][k] / (steps - n_traced);
            traced += a.cpu[1][k] / n_traced;
        }
        runs[r].cpu_base = base;
        runs[r].cpu_traced = traced;
        runs[r].writer = (st.writer_cpu_s + c_close) / n_traced;
        commits = (double)st.commits / n_traced;
        if (r == 0 && fsdp_trace_reader_open(path, &reader) == FSDP_OK) {
            fsdp_trace_reader_steps(reader, run, 0, seq_span_row, &span);
            fsdp_trace_reader_close(reader);
        }
    }
    /* the run of the median share: noise moves a run's share either way */
    qsort(runs, (size_t)reps, sizeof(*runs), share_cmp);
    *cost = runs[reps / 2];
    lo = step_share(&runs[0]);
    hi = step_share(&runs[reps - 1]);
    /* the consecutive step rows of a rank are one traced step apart in its sequence numbers */
    cost->events = span.n > 1 ? (double)(span.last - span.first) / (double)(span.n - 1) : 0.0;
    printf("step, %s, full_shard, adamw, world 4, data mode, %.0f events per rank and step "
           "(%.2f us of CPU per event untraced):\n",
           what, cost->events, cost->events > 0 ? 1e6 * cost->cpu_base / (4.0 * cost->events) : 0.0);
    printf("  ranks' cpu %.3f ms/step untraced, %.3f traced (%+.2f%%); the writer %.3f ms per "
           "traced step (its thread, %.1f commits, and the closing checkpoint)\n",
           cost->cpu_base * 1e3, cost->cpu_traced * 1e3,
           100.0 * (cost->cpu_traced / cost->cpu_base - 1.0), cost->writer * 1e3, commits);
    printf("  tracing's share of the step's CPU time: %.2f%% (writer %.2f%%, ranks %+.2f%%; the "
           "median of %d runs of %d steps, half traced, which ranged %.2f%% to %.2f%%); SQLite's "
           "own insert of the step's rows alone would be %.2f%%\n",
           100.0 * step_share(cost), 100.0 * cost->writer / cost->cpu_base,
           100.0 * (cost->cpu_traced / cost->cpu_base - 1.0), reps, steps, 100.0 * lo, 100.0 * hi,
           100.0 * floor_row * 4.0 * cost->events / cost->cpu_base);
    db_remove(path);
    return 0;
}

int main(int argc, char **argv)
{
    static const int small[MLP_LAYERS + 1] = {64, 256, 256, 256, 64};
    static const int medium[MLP_LAYERS + 1] = {256, 1024, 1024, 1024, 256};
    int quick = 0, steps = 20, world = 64, rc = 0, ok;
    const char *tmp = getenv("TMPDIR");
    const fsdp_gpt2_preset_t *gpt;
    step_cost_t main_job, mlp_medium, mlp_small;
    double floor_row;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
            steps = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--world") == 0 && i + 1 < argc) {
            world = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--isa") == 0 && i + 1 < argc) {
            i++; /* bench_gemm's */
        } else {
            fprintf(stderr, "usage: bench_trace [--quick] [--steps N] [--world W]\n");
            return 2;
        }
    }
    if (steps < 2 || world < 1) {
        fprintf(stderr, "bench_trace: --steps must be at least 2 (half are traced) and --world "
                        "at least 1\n");
        return 2;
    }
    snprintf(dir, sizeof(dir), "%s/bench_trace.XXXXXX", tmp != NULL ? tmp : "/tmp");
    if (mkdtemp(dir) == NULL) {
        perror("bench_trace: mkdtemp");
        return 1;
    }
    gpt = fsdp_gpt2_preset_find("gpt2-tiny");
    if (gpt == NULL) {
        fprintf(stderr, "bench_trace: the gpt2-tiny preset is missing\n");
        rc = 1;
        goto out;
    }
    if (bench_emit(1, quick ? 200000 : 2000000) != 0 ||
        bench_emit(world, quick ? 2000 : 20000) != 0) {
        fprintf(stderr, "bench_trace: a run failed\n");
        rc = 1;
        goto out;
    }
    /* the least disturbed of a few runs */
    floor_row = -1.0;
    for (int r = 0; r < (quick ? 1 : 3); r++) {
        double f = bench_sqlite_floor(98304, 768);
        if (f < 0.0) {
            floor_row = f;
            break;
        }
        floor_row = r == 0 || f < floor_row ? f : floor_row;
    }
    if (floor_row < 0.0) {
        fprintf(stderr, "bench_trace: the plain SQLite loop failed\n");
        rc = 1;
        goto out;
    }
    printf("sqlite alone: %.2f us of CPU per event row (the same rows, statements and 768-row "
           "transactions, no library)\n",
           1e6 * floor_row);
    /* the main job's step (README: gpt2-tiny, a global batch of 32 sequences on 4 ranks), then
     * a medium and a small MLP */
    if (bench_steps("gpt2-tiny, 8 sequences of 64 tokens", &gpt->cfg, NULL, 8, quick ? 4 : 24,
                    quick ? 1 : 5, floor_row, &main_job) != 0 ||
        bench_steps("mlp 256-1024-1024-1024-256, 64 rows", NULL, medium, 64, quick ? 4 : 8,
                    quick ? 1 : 5, floor_row, &mlp_medium) != 0 ||
        bench_steps("mlp 64-256-256-256-64, 32 rows", NULL, small, 32, quick ? 8 : steps,
                    quick ? 3 : 5, floor_row, &mlp_small) != 0) {
        fprintf(stderr, "bench_trace: a run failed\n");
        rc = 1;
        goto out;
    }
    /* The writer's CPU time is measured directly; the ranks' side is the difference of their
     * thread clocks between traced and untraced steps of one run. */
    ok = step_share(&main_job) <= BENCH_BUDGET;
    printf("budget %.0f%% of a data-mode step's CPU time, on the main job's step: %s (%.2f%%; "
           "the medium MLP's: %.2f%%)\n",
           100.0 * BENCH_BUDGET,
           quick ? "not judged (--quick: one short run, too noisy)" : ok ? "ok" : "OVER",
           100.0 * step_share(&main_job),
           100.0 * step_share(&mlp_medium));
    printf("  the small MLP's step, %.2f us of simulation per event, is a stress case: tracing "
           "takes %.2f%% of it, SQLite's own inserts alone %.2f%%; the writer costs "
           "%.2fx SQLite alone per row\n",
           1e6 * mlp_small.cpu_base / (4.0 * mlp_small.events), 100.0 * step_share(&mlp_small),
           100.0 * floor_row * 4.0 * mlp_small.events / mlp_small.cpu_base,
           mlp_small.writer / (4.0 * mlp_small.events) / floor_row);
out:
    rmdir(dir);
    return rc;
}
