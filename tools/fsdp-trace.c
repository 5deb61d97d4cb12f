/* fsdp-trace: reads libfsdp event traces (SQLite). A thin main over lib/trace_*.c.
 *
 *   fsdp-trace summary DB [--run ID]
 *   fsdp-trace diff A B [--run-a ID] [--run-b ID]      exit 0 identical, 1 different, 2 error
 *   fsdp-trace export --chrome OUT.json DB [--run ID]
 *   fsdp-trace plot --svg OUT.svg DB [--run ID] [--ranks N] [--steps A-B | --time A-B]
 *   fsdp-trace calibrate DB [--run ID] [--base PROFILE] [--ranks-per-node N] > profile.json
 */
#include <fsdp/fsdp.h>
#include <fsdp/trace.h>

#include <fsdp/calibrate.h>

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define EXIT_DIFFERENT 1
#define EXIT_ERROR 2

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: fsdp-trace COMMAND ...\n"
        "  summary DB [--run ID]                  per rank: collectives, per-unit all-gather\n"
        "                                         and reduce-scatter sizes, steps, peak memory;\n"
        "                                         rank 0's time per op in its last step\n"
        "  diff A B [--run-a ID] [--run-b ID]     first structural divergence, then timing\n"
        "                                         and memory ratios (B / A); exit 0 when\n"
        "                                         identical, 1 when not, 2 on error; a\n"
        "                                         symmetric plan's ranks stand for their classes\n"
        "  export --chrome OUT.json DB [--run ID] Chrome trace JSON (Perfetto, chrome://tracing)\n"
        "  plot --svg OUT.svg DB [--run ID] [--ranks N] [--steps A-B | --time A-B]\n"
        "                                         memory by category and stream timelines of\n"
        "                                         ranks 0..N-1 (default 8), of steps A to B\n"
        "                                         (or one step: --steps A) or of the time from\n"
        "                                         A to B ms; default the whole run\n"
        "  calibrate DB [--run ID] [--base PROFILE] [--ranks-per-node N]\n"
        "                                         fit the cluster profile (collective latency\n"
        "                                         and bandwidth per link, kernel rates) to the\n"
        "                                         measured events; prints its JSON, the fit\n"
        "                                         report on stderr. PROFILE: a preset or JSON\n"
        "                                         file for what the trace does not constrain\n"
        "                                         (default " FSDP_SIM_DEFAULT_PROFILE
        "); N: default the run's config.\n"
        "                                         A symmetric plan's trace is refused\n"
        "A run ID defaults to the latest run of the file; 0 is the latest, -1 the one before.\n"
        "diff of one file without run ids compares the previous run with the latest.\n"
        "  --version, --help\n"
        "Environment:\n"
        "  FSDP_LOG_LEVEL   error | warn | info | debug | trace (default warn)\n");
}

static int parse_run(const char *opt, const char *s, int64_t *run_p)
{
    char *end;
    long long v;

    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0') {
        cli_error("%s '%s' is not a run id (an integer)", opt, s);
        return -1;
    }
    *run_p = (int64_t)v;
    return 0;
}

typedef struct args {
    const char *pos[2];
    int npos;
    const char *out;
    int64_t run, run_a, run_b;
    int ranks;
    fsdp_trace_plot_options_t plot;
} args_t;

/* "A-B" or "A" (B = A); times may be fractional. */
static int parse_range(const char *opt, const char *s, int integers, double *a_p, double *b_p)
{
    char *end;
    double a, b;

    errno = 0;
    a = strtod(s, &end);
    b = a;
    if (end != s && *end == '-') {
        const char *t = end + 1;
        b = strtod(t, &end);
        if (end == t)
            end = (char *)s;
    }
    if (errno != 0 || end == s || *end != '\0' || !(a >= 0) || !(b >= a) || b > 1e15 ||
        (integers && (a != floor(a) || b != floor(b)))) {
        cli_error("plot: %s '%s' is not a range A-B with 0 <= A <= B%s", opt, s,
                  integers ? " (whole steps)" : "");
        return -1;
    }
    *a_p = a;
    *b_p = b;
    return 0;
}

/* Parses what follows the command. `out_opt` ("--chrome", "--svg") takes the output file. */
static int parse_args(int argc, char **argv, const char *cmd, const char *out_opt, int max_pos,
                      args_t *a)
{
    memset(a, 0, sizeof(*a));
    fsdp_trace_plot_options_init(&a->plot);
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        int has_value = i + 1 < argc;
        if (strcmp(arg, "--run") == 0 && has_value && strcmp(cmd, "diff") != 0) {
            if (parse_run(arg, argv[++i], &a->run) != 0)
                return -1;
        } else if (strcmp(arg, "--run-a") == 0 && has_value && strcmp(cmd, "diff") == 0) {
            if (parse_run(arg, argv[++i], &a->run_a) != 0)
                return -1;
        } else if (strcmp(arg, "--run-b") == 0 && has_value && strcmp(cmd, "diff") == 0) {
            if (parse_run(arg, argv[++i], &a->run_b) != 0)
                return -1;
        } else if (out_opt != NULL && strcmp(arg, out_opt) == 0 && has_value) {
            a->out = argv[++i];
        } else if (strcmp(arg, "--ranks") == 0 && has_value && strcmp(cmd, "plot") == 0) {
            a->ranks = atoi(argv[++i]);
            if (a->ranks <= 0) {
                cli_error("--ranks '%s' must be a positive number", argv[i]);
                return -1;
            }
            a->plot.max_ranks = a->ranks;
        } else if (strcmp(arg, "--steps") == 0 && has_value && strcmp(cmd, "plot") == 0) {
            double first, last;
            if (parse_range(arg, argv[++i], 1, &first, &last) != 0)
                return -1;
            a->plot.first_step = (int64_t)first;
            a->plot.last_step = (int64_t)last;
        } else if (strcmp(arg, "--time") == 0 && has_value && strcmp(cmd, "plot") == 0) {
            double start, end;
            if (parse_range(arg, argv[++i], 0, &start, &end) != 0)
                return -1;
            if (end == start) {
                cli_error("plot: --time '%s' is empty: give A-B ms with A < B", argv[i]);
                return -1;
            }
            a->plot.start_time = start * 1e-3;
            a->plot.end_time = end * 1e-3;
        } else if (arg[0] == '-' && arg[1] != '\0') {
            cli_error("%s: unknown option or missing value: '%s' (try --help)", cmd, arg);
            return -1;
        } else if (a->npos < max_pos) {
            a->pos[a->npos++] = arg;
        } else {
            cli_error("%s: unexpected argument '%s' (try --help)", cmd, arg);
            return -1;
        }
    }
    if (a->npos != max_pos) {
        cli_error("%s: expected %s (try --help)", cmd,
                  max_pos == 2 ? "two trace databases" : "a trace database");
        return -1;
    }
    if (a->plot.first_step >= 0 && a->plot.end_time > 0) {
        cli_error("plot: --steps or --time, not both");
        return -1;
    }
    if (out_opt != NULL && a->out == NULL) {
        cli_error("%s: %s OUT is required", cmd, out_opt);
        return -1;
    }
    return 0;
}

/* Library errors are logged by the library (at the default level, "warn", errors show). */
static int fail(const char *cmd, fsdp_status_t status)
{
    if (fsdp_log_level() < FSDP_LOG_ERROR)
        cli_error("%s: %s", cmd, fsdp_status_string(status));
    return EXIT_ERROR;
}

static int calibrate(int argc, char **argv)
{
    fsdp_calib_options_t opts = {0, 0};
    const char *db = NULL, *base_arg = FSDP_SIM_DEFAULT_PROFILE;
    fsdp_sim_profile_t base, fitted;
    fsdp_status_t status;
    char *json;

    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        int has_value = i + 1 < argc;
        if (strcmp(arg, "--run") == 0 && has_value) {
            if (parse_run(arg, argv[++i], &opts.run) != 0)
                return EXIT_ERROR;
        } else if (strcmp(arg, "--base") == 0 && has_value) {
            base_arg = argv[++i];
        } else if (strcmp(arg, "--ranks-per-node") == 0 && has_value) {
            opts.ranks_per_node = atoi(argv[++i]);
            if (opts.ranks_per_node <= 0) {
                cli_error("calibrate: --ranks-per-node '%s' must be a positive number", argv[i]);
                return EXIT_ERROR;
            }
        } else if (arg[0] == '-' && arg[1] != '\0') {
            cli_error("calibrate: unknown option or missing value: '%s' (try --help)", arg);
            return EXIT_ERROR;
        } else if (db == NULL) {
            db = arg;
        } else {
            cli_error("calibrate: unexpected argument '%s' (try --help)", arg);
            return EXIT_ERROR;
        }
    }
    if (db == NULL) {
        cli_error("calibrate: expected a trace database (try --help)");
        return EXIT_ERROR;
    }
    status = fsdp_sim_profile_from_arg(base_arg, &base);
    if (status == FSDP_OK)
        status = fsdp_trace_calibrate(db, &opts, &base, &fitted, stderr);
    if (status != FSDP_OK)
        return fail("calibrate", status);
    json = fsdp_sim_profile_to_json(&fitted);
    if (json == NULL)
        return fail("calibrate", FSDP_ERR_OUT_OF_MEMORY);
    fputs(json, stdout);
    if (json[0] != '\0' && json[strlen(json) - 1] != '\n')
        fputc('\n', stdout);
    free(json);
    return 0;
}

int main(int argc, char **argv)
{
    const char *cmd;
    fsdp_status_t status;
    args_t a;

    cli_init("fsdp-trace"); /* the library's errors as the tool's own: one line each */
    if (argc < 2) {
        usage(stderr);
        return EXIT_ERROR;
    }
    cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0) {
        if (argc > 2) {
            cli_error("unexpected argument '%s' after --version", argv[2]);
            return EXIT_ERROR;
        }
        printf("fsdp-trace %s (trace schema %d)\n", fsdp_version_string(),
               FSDP_TRACE_SCHEMA_VERSION);
        return 0;
    }
    if (strcmp(cmd, "summary") == 0) {
        if (parse_args(argc, argv, cmd, NULL, 1, &a) != 0)
            return EXIT_ERROR;
        status = fsdp_trace_summary(a.pos[0], a.run, stdout);
        return status == FSDP_OK ? 0 : fail(cmd, status);
    }
    if (strcmp(cmd, "diff") == 0) {
        fsdp_trace_diff_t res;
        if (parse_args(argc, argv, cmd, NULL, 2, &a) != 0)
            return EXIT_ERROR;
        status = fsdp_trace_diff(a.pos[0], a.run_a, a.pos[1], a.run_b, stdout, &res);
        if (status != FSDP_OK)
            return fail(cmd, status);
        return res.what == FSDP_TRACE_DIV_NONE ? 0 : EXIT_DIFFERENT;
    }
    if (strcmp(cmd, "export") == 0) {
        if (parse_args(argc, argv, cmd, "--chrome", 1, &a) != 0)
            return EXIT_ERROR;
        status = fsdp_trace_export_chrome(a.pos[0], a.run, a.out);
        return status == FSDP_OK ? 0 : fail(cmd, status);
    }
    if (strcmp(cmd, "plot") == 0) {
        if (parse_args(argc, argv, cmd, "--svg", 1, &a) != 0)
            return EXIT_ERROR;
        status = fsdp_trace_plot_svg_ex(a.pos[0], a.run, &a.plot, a.out);
        return status == FSDP_OK ? 0 : fail(cmd, status);
    }
    if (strcmp(cmd, "calibrate") == 0)
        return calibrate(argc, argv);
    cli_error("unknown command '%s': use summary, diff, export, plot or calibrate (try --help)",
              cmd);
    return EXIT_ERROR;
}
