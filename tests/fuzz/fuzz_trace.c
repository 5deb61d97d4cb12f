/* libFuzzer: the trace readers on a valid database (FUZZ_TRACE_DB: a training run, then a
 * symmetric plan whose ranks stand for classes) with one cell changed. The input names the
 * table, the column (and the run to read), the row and the new value (an integer, a real, a
 * text, a blob or NULL); summary, diff, export, plot and calibrate then read that run. */
#include <fsdp/calibrate.h>
#include <fsdp/log.h>
#include <fsdp/sim.h>
#include <fsdp/trace.h>

#include "sim/sim_hidden.h"     /* fsdp_sim_profile_preset */
#include "trace/trace_hidden.h" /* fsdp_trace_plot_svg */

#include <sqlite3.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const tables[] = {"runs", "event_rows", "steps", "strings", "ranks"};
static const char *const keys[] = {"rowid", "(run, rank, seq)", "(run, rank, step)", "id",
                                   "(run, rank)"};
#define NTABLES 5
#define NRUNS 2 /* the seed's runs: the readers read run 1 + (column byte / columns) % NRUNS */
static char cols[NTABLES][40][40];
static int ncols[NTABLES];
static unsigned char *seed;
static size_t seed_len;
static char work[64], out[80];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *path = getenv("FUZZ_TRACE_DB");
    FILE *f = path != NULL ? fopen(path, "rb") : NULL;
    sqlite3 *db;

    (void)argc, (void)argv;
    fsdp_log_set_level(FSDP_LOG_OFF);
    if (f == NULL) {
        fprintf(stderr, "fuzz_trace: set FUZZ_TRACE_DB to a trace database\n");
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    seed_len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    seed = malloc(seed_len);
    if (seed == NULL || fread(seed, 1, seed_len, f) != seed_len)
        exit(1);
    fclose(f);
    snprintf(work, sizeof(work), "/tmp/fuzz_trace.%d.db", (int)getpid());
    snprintf(out, sizeof(out), "/tmp/fuzz_trace.%d.out", (int)getpid());
    if (sqlite3_open(path, &db) != SQLITE_OK)
        exit(1);
    for (int t = 0; t < NTABLES; t++) {
        char sql[80];
        sqlite3_stmt *st;

        snprintf(sql, sizeof(sql), "PRAGMA table_info(%s)", tables[t]);
        if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
            exit(1);
        while (sqlite3_step(st) == SQLITE_ROW && ncols[t] < 40)
            snprintf(cols[t][ncols[t]++], 40, "%s", (const char *)sqlite3_column_text(st, 1));
        sqlite3_finalize(st);
    }
    sqlite3_close(db);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    FILE *f = fopen(work, "wb");
    sqlite3 *db;
    sqlite3_stmt *st = NULL;
    char sql[400];
    int t, c, run;
    fsdp_calib_options_t calib = {0};
    fsdp_trace_diff_t res;
    fsdp_sim_profile_t base, fitted;

    if (f == NULL || size < 4) {
        if (f != NULL)
            fclose(f);
        return 0;
    }
    fwrite(seed, 1, seed_len, f);
    fclose(f);
    t = data[0] % NTABLES;
    c = data[1] % ncols[t];
    run = 1 + data[1] / ncols[t] % NRUNS;
    calib.run = run;
    snprintf(sql, sizeof(sql),
             "UPDATE %s SET %s = ?1 WHERE %s = (SELECT %s FROM %s LIMIT 1 OFFSET ?2)", tables[t],
             cols[t][c], keys[t],
             t == 1   ? "run, rank, seq"
             : t == 2 ? "run, rank, step"
             : t == 4 ? "run, rank"
                      : keys[t],
             tables[t]);
    if (sqlite3_open(work, &db) != SQLITE_OK || sqlite3_prepare_v2(db, sql, -1, &st, NULL) != 0) {
        sqlite3_close(db);
        return 0;
    }
    sqlite3_bind_int(st, 2, data[2]);
    data += 4, size -= 4;
    switch (data[-1] % 5) {
    case 0: {
        int64_t v = 0;
        memcpy(&v, data, size < 8 ? size : 8);
        sqlite3_bind_int64(st, 1, v);
        break;
    }
    case 1: {
        double v = 0;
        memcpy(&v, data, size < 8 ? size : 8);
        sqlite3_bind_double(st, 1, v);
        break;
    }
    case 2:
        sqlite3_bind_text(st, 1, (const char *)data, (int)size, SQLITE_TRANSIENT);
        break;
    case 3:
        sqlite3_bind_blob(st, 1, data, (int)size, SQLITE_TRANSIENT);
        break;
    default:
        sqlite3_bind_null(st, 1);
    }
    sqlite3_step(st);
    sqlite3_finalize(st);
    sqlite3_close(db);

    f = fopen("/dev/null", "w");
    (void)fsdp_trace_summary(work, run, f);
    fclose(f);
    (void)fsdp_trace_diff(work, run, work, run, NULL, &res);
    (void)fsdp_trace_export_chrome(work, run, out);
    (void)fsdp_trace_plot_svg(work, run, 2, out);
    if (fsdp_sim_profile_preset("h100", &base) == FSDP_OK)
        (void)fsdp_trace_calibrate(work, &calib, &base, &fitted, NULL);
    unlink(out);
    return 0;
}
