/* The sim backend never hangs: collectives whose calls differ, ranks on different groups, ranks
 * that finish, fail or arrive too late all make the collective fail on every rank, quickly,
 * with a message that names the ranks and their calls. Under the runtime such a failure is
 * still logged once, the runtime's context going to fsdp_last_error. Also: launch parameter
 * checks and the status fsdp_sim_launch returns.
 *
 * Rank functions record what happened in per-rank slots (no CUnit calls off the main thread). */
#include <fsdp/fsdp.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sim_hidden.h"
#include "test_util.h"

#define MAX_RANKS 64

typedef enum {
    SC_KIND,
    SC_COUNT,
    SC_DTYPE,
    SC_OP,
    SC_ROOT,
    SC_OTHER_GROUP,
    SC_FINISHED,
    SC_ERROR_RETURN,
    SC_RANK_FAIL,
    SC_RANK_FAIL_SELF,
    SC_TIMEOUT,
    SC_AFTER_ERROR,
    SC_LARGE,
    SC_EXIT_CODES
} scenario_t;

typedef struct ctx {
    scenario_t sc;
    fsdp_status_t st[MAX_RANKS];  /* status of the collective under test */
    fsdp_status_t st2[MAX_RANKS]; /* SC_AFTER_ERROR: the later calls */
    char msg[MAX_RANKS][4096];    /* fsdp_sim_last_error after it */
    double elapsed[MAX_RANKS];    /* wall seconds the collective took */
    int extra_ok[MAX_RANKS];
} ctx_t;

/* ---- log capture: expected errors are counted, not printed ----------------------------- */

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static int log_errors;
static char log_last[1024];

static void log_handler(fsdp_log_level_t level, const char *file, int line, const char *func,
                        const char *msg, void *arg)
{
    (void)file, (void)line, (void)func, (void)arg;
    pthread_mutex_lock(&log_lock);
    if (level == FSDP_LOG_ERROR) {
        log_errors++;
        snprintf(log_last, sizeof(log_last), "%s", msg);
    }
    pthread_mutex_unlock(&log_lock);
}

static int log_reset(void)
{
    int n;
    pthread_mutex_lock(&log_lock);
    n = log_errors;
    log_errors = 0;
    log_last[0] = '\0';
    pthread_mutex_unlock(&log_lock);
    return n;
}

static int log_count(void)
{
    int n;
    pthread_mutex_lock(&log_lock);
    n = log_errors;
    pthread_mutex_unlock(&log_lock);
    return n;
}

/* ---- the rank function ----------------------------------------------------------------- */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_s(double s)
{
    usleep((useconds_t)(s * 1e6));
}

/* Runs one collective, recording its status, message and duration in the rank's slots. */
#define TIMED(c, dev, call)                                                                        \
    do {                                                                                           \
        double t0_ = now();                                                                        \
        (c)->st[(dev)->rank] = (call);                                                             \
        (c)->elapsed[(dev)->rank] = now() - t0_;                                                   \
        snprintf((c)->msg[(dev)->rank], sizeof((c)->msg[0]), "%s",                                \
                 fsdp_sim_last_error(dev));                                                        \
    } while (0)

static fsdp_status_t rank_main(fsdp_dev_t *dev, void *arg)
{
    ctx_t *c = arg;
    fsdp_group_t *world = fsdp_dev_group_world(dev), *par = NULL;
    int r = dev->rank;
    float buf[64] = {0}, out[64 * MAX_RANKS];
    fsdp_status_t st;

    /* call #1 on the world succeeds everywhere (except where the scenario is about call #1) */
    if (c->sc != SC_TIMEOUT && c->sc != SC_FINISHED && c->sc != SC_ERROR_RETURN &&
        c->sc != SC_RANK_FAIL && c->sc != SC_RANK_FAIL_SELF && c->sc != SC_EXIT_CODES) {
        st = fsdp_dev_all_reduce(dev, world, buf, buf, 4, FSDP_DTYPE_F32, FSDP_REDUCE_SUM, NULL);
        if (st != FSDP_OK)
            return st;
    }

    switch (c->sc) {
    case SC_KIND:
        if (r == 1)
            TIMED(c, dev,
                  fsdp_dev_reduce_scatter(dev, world, out, buf, 2, FSDP_DTYPE_F32, FSDP_REDUCE_SUM,
                                          NULL));
        else
            TIMED(c, dev, fsdp_dev_all_gather(dev, world, buf, out, 8, FSDP_DTYPE_F32, NULL));
        break;
    case SC_COUNT:
        TIMED(c, dev,
              fsdp_dev_all_reduce(dev, world, buf, buf, r == 2 ? 5 : 4, FSDP_DTYPE_F32,
                                  FSDP_REDUCE_SUM, NULL));
        break;
    case SC_DTYPE:
        TIMED(c, dev,
              fsdp_dev_all_reduce(dev, world, buf, buf, 4,
                                  r == 3 ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32, FSDP_REDUCE_SUM,
                                  NULL));
        break;
    case SC_OP:
        TIMED(c, dev,
              fsdp_dev_all_reduce(dev, world, buf, buf, 4, FSDP_DTYPE_F32,
                                  r == 0 ? FSDP_REDUCE_MAX : FSDP_REDUCE_AVG, NULL));
        break;
    case SC_ROOT:
        TIMED(c, dev, fsdp_dev_broadcast(dev, world, buf, 4, FSDP_DTYPE_F32, r == 3 ? 1 : 0, NULL));
        break;
    case SC_OTHER_GROUP:
        st = fsdp_dev_group_split(dev, world, r % 2, r, &par);
        if (st != FSDP_OK)
            return st;
        TIMED(c, dev,
              fsdp_dev_all_reduce(dev, r == 1 ? par : world, buf, buf, 4, FSDP_DTYPE_F32,
                                  FSDP_REDUCE_SUM, NULL));
        fsdp_dev_group_destroy(dev, par);
        break;
    case SC_FINISHED:
        if (r == 2)
            return FSDP_OK; /* never arrives */
        TIMED(c, dev,
              fsdp_dev_all_reduce(dev, world, buf, buf, 4, FSDP_DTYPE_F32, FSDP_REDUCE_SUM, NULL));
        break;
    case SC_ERROR_RETURN:
        if (r == 2)
            return FSDP_ERR_IO;
        TIMED(c, dev,
              fsdp_dev_all_reduce(dev, world, buf, buf, 4, FSDP_DTYPE_F32, FSDP_REDUCE_SUM, NULL));
        break;
    case SC_RANK_FAIL:
        if (r == 3) {
            fsdp_sim_rank_fail(dev);
            sleep_s(0.2); /* still running: the others must not wait for it to return */
            return FSDP_OK;
        }
        TIMED(c, dev,
              fsdp_dev_all_reduce(dev, world, buf, buf, 4, FSDP_DTYPE_F32, FSDP_REDUCE_SUM, NULL));
        break;
    case SC_RANK_FAIL_SELF:
        if (r == 3)
            fsdp_sim_rank_fail(dev);
        TIMED(c, dev,
              fsdp_dev_all_reduce(dev, world, buf, buf, 4, FSDP_DTYPE_F32, FSDP_REDUCE_SUM, NULL));
        break;
    case SC_TIMEOUT:
        if (r == 1)
            sleep_s(3.0); /* outlasts the timeout even in slow sanitizer builds */
        TIMED(c, dev,
              fsdp_dev_all_reduce(dev, world, buf, buf, 4, FSDP_DTYPE_F32, FSDP_REDUCE_SUM, NULL));
        break;
    case SC_AFTER_ERROR: {
        float one = (float)r;
        st = fsdp_dev_group_split(dev, world, r % 2, r, &par);
        if (st != FSDP_OK)
            return st;
        /* a mismatch on the evens' group only */
        if (r % 2 == 0)
            TIMED(c, dev,
                  r == 0 ? fsdp_dev_all_gather(dev, par, buf, out, 4, FSDP_DTYPE_F32, NULL)
                         : fsdp_dev_all_reduce(dev, par, buf, buf, 4, FSDP_DTYPE_F32,
                                               FSDP_REDUCE_SUM, NULL));
        else
            TIMED(
                c, dev,
                fsdp_dev_all_reduce(dev, par, buf, buf, 4, FSDP_DTYPE_F32, FSDP_REDUCE_SUM, NULL));
        /* the world is unharmed */
        st = fsdp_dev_all_reduce(dev, world, &one, &one, 1, FSDP_DTYPE_F32, FSDP_REDUCE_SUM, NULL);
        c->extra_ok[r] = st == FSDP_OK && one == (float)(dev->world_size *
                                                         (dev->world_size - 1) / 2);
        /* the failed group stays failed, at once */
        c->st2[r] = fsdp_dev_barrier(dev, par);
        fsdp_dev_group_destroy(dev, par);
        break;
    }
    case SC_LARGE:
        TIMED(c, dev,
              r == 5 ? fsdp_dev_barrier(dev, world)
                     : fsdp_dev_all_reduce(dev, world, buf, buf, 4, FSDP_DTYPE_F32, FSDP_REDUCE_SUM,
                                           NULL));
        break;
    case SC_EXIT_CODES:
        return r == 1 ? FSDP_ERR_IO : r == 3 ? FSDP_ERR_FORMAT : FSDP_OK;
    }
    /* a rank whose collective failed fails, as a real trainer would */
    return c->st[r];
}

static fsdp_status_t run(ctx_t *c, scenario_t sc, int world, double timeout,
                         fsdp_status_t *rank_status)
{
    fsdp_sim_params_t p;

    memset(c, 0, sizeof(*c));
    c->sc = sc;
    for (int r = 0; r < MAX_RANKS; r++)
        c->st[r] = c->st2[r] = (fsdp_status_t)12345;
    fsdp_sim_params_init(&p);
    p.world_size = world;
    p.timeout_s = timeout;
    log_reset();
    return fsdp_sim_launch(&p, rank_main, c, rank_status);
}

/* Every rank in [0, n) got `want`, quickly, with a message holding all the needles. */
static void expect_all(const ctx_t *c, int n, fsdp_status_t want, double max_s,
                       const char *const *needles)
{
    for (int r = 0; r < n; r++) {
        CU_ASSERT_EQUAL(c->st[r], want);
        CU_ASSERT(c->elapsed[r] < max_s);
        for (const char *const *s = needles; *s != NULL; s++) {
            if (strstr(c->msg[r], *s) == NULL) {
                fprintf(stderr, "\n  rank %d message lacks \"%s\": %s\n", r, *s, c->msg[r]);
                CU_FAIL("message lacks a needle");
            }
        }
    }
}

/* ---- mismatched calls on one group ----------------------------------------------------- */

static void test_kind(void)
{
    static const char *const needles[] = {
        "collective mismatch on group world (4 ranks) at call #2: ",
        "rank 0 all_gather(count=8, f32); rank 1 reduce_scatter(count=2, f32, sum); "
        "rank 2 all_gather(count=8, f32); rank 3 all_gather(count=8, f32)",
        NULL};
    fsdp_status_t rs[4];
    ctx_t *c = malloc(sizeof(*c));

    CU_ASSERT_EQUAL(run(c, SC_KIND, 4, 10.0, rs), FSDP_ERR_COLLECTIVE_MISMATCH);
    expect_all(c, 4, FSDP_ERR_COLLECTIVE_MISMATCH, 5.0, needles);
    for (int r = 0; r < 4; r++)
        CU_ASSERT_EQUAL(rs[r], FSDP_ERR_COLLECTIVE_MISMATCH);
    /* logged once, not once per rank */
    CU_ASSERT_EQUAL(log_count(), 1);
    free(c);
}

static void test_count_dtype_op_root(void)
{
    static const char *const count[] = {"at call #2",
                                        "rank 1 all_reduce(count=4, f32, sum); "
                                        "rank 2 all_reduce(count=5, f32, sum)",
                                        NULL};
    static const char *const dtype[] = {"rank 3 all_reduce(count=4, bf16, sum)", NULL};
    static const char *const op[] = {"rank 0 all_reduce(count=4, f32, max); "
                                     "rank 1 all_reduce(count=4, f32, avg)",
                                     NULL};
    static const char *const root[] = {"rank 2 broadcast(count=4, f32, root=0); "
                                       "rank 3 broadcast(count=4, f32, root=1)",
                                       NULL};
    ctx_t *c = malloc(sizeof(*c));

    CU_ASSERT_EQUAL(run(c, SC_COUNT, 4, 10.0, NULL), FSDP_ERR_COLLECTIVE_MISMATCH);
    expect_all(c, 4, FSDP_ERR_COLLECTIVE_MISMATCH, 5.0, count);
    CU_ASSERT_EQUAL(run(c, SC_DTYPE, 4, 10.0, NULL), FSDP_ERR_COLLECTIVE_MISMATCH);
    expect_all(c, 4, FSDP_ERR_COLLECTIVE_MISMATCH, 5.0, dtype);
    CU_ASSERT_EQUAL(run(c, SC_OP, 4, 10.0, NULL), FSDP_ERR_COLLECTIVE_MISMATCH);
    expect_all(c, 4, FSDP_ERR_COLLECTIVE_MISMATCH, 5.0, op);
    CU_ASSERT_EQUAL(run(c, SC_ROOT, 4, 10.0, NULL), FSDP_ERR_COLLECTIVE_MISMATCH);
    expect_all(c, 4, FSDP_ERR_COLLECTIVE_MISMATCH, 5.0, root);
    CU_ASSERT_EQUAL(log_count(), 1);
    free(c);
}

/* 64 ranks: the message lists runs of ranks as ranges, and is the same on every rank. */
static void test_large_message(void)
{
    static const char *const needles[] = {
        "collective mismatch on group world (64 ranks) at call #2: "
        "ranks 0-4 all_reduce(count=4, f32, sum); rank 5 barrier(); "
        "ranks 6-63 all_reduce(count=4, f32, sum)",
        NULL};
    ctx_t *c = malloc(sizeof(*c));

    CU_ASSERT_EQUAL(run(c, SC_LARGE, 64, 10.0, NULL), FSDP_ERR_COLLECTIVE_MISMATCH);
    expect_all(c, 64, FSDP_ERR_COLLECTIVE_MISMATCH, 5.0, needles);
    for (int r = 1; r < 64; r++)
        CU_ASSERT_STRING_EQUAL(c->msg[r], c->msg[0]);
    free(c);
}

/* ---- ranks that can never meet --------------------------------------------------------- */

static void test_other_group(void)
{
    /* rank 1 waits on its parity group for rank 3, which waits on the world for rank 1 */
    static const char *const needles[] = {
        "collective deadlock",
        "rank 0 all_reduce(count=4, f32, sum) on group world (call #3); "
        "rank 1 all_reduce(count=4, f32, sum) on group world/split(1) (call #1); "
        "rank 2 all_reduce(count=4, f32, sum) on group world (call #3); "
        "rank 3 all_reduce(count=4, f32, sum) on group world (call #3)",
        NULL};
    ctx_t *c = malloc(sizeof(*c));

    CU_ASSERT_EQUAL(run(c, SC_OTHER_GROUP, 4, 10.0, NULL), FSDP_ERR_COLLECTIVE_MISMATCH);
    expect_all(c, 4, FSDP_ERR_COLLECTIVE_MISMATCH, 5.0, needles);
    CU_ASSERT_EQUAL(log_count(), 1);
    free(c);
}

static void test_finished(void)
{
    static const char *const needles[] = {
        "collective mismatch on group world (4 ranks) at call #1: ", "rank 2 finished", NULL};
    fsdp_status_t rs[4];
    ctx_t *c = malloc(sizeof(*c));

    CU_ASSERT_EQUAL(run(c, SC_FINISHED, 4, 10.0, rs), FSDP_ERR_COLLECTIVE_MISMATCH);
    expect_all(c, 2, FSDP_ERR_COLLECTIVE_MISMATCH, 5.0, needles);
    CU_ASSERT_EQUAL(c->st[3], FSDP_ERR_COLLECTIVE_MISMATCH);
    CU_ASSERT(strstr(c->msg[3], "rank 2 finished") != NULL);
    CU_ASSERT_EQUAL(rs[2], FSDP_OK);
    CU_ASSERT_EQUAL(rs[0], FSDP_ERR_COLLECTIVE_MISMATCH);
    free(c);
}

static void test_error_return(void)
{
    static const char *const needles[] = {"rank failure on group world (4 ranks) at call #1",
                                          "rank 2 failed", NULL};
    fsdp_status_t rs[4];
    ctx_t *c = malloc(sizeof(*c));

    CU_ASSERT_EQUAL(run(c, SC_ERROR_RETURN, 4, 10.0, rs), FSDP_ERR_RANK_FAILED);
    expect_all(c, 2, FSDP_ERR_RANK_FAILED, 5.0, needles);
    CU_ASSERT_EQUAL(c->st[3], FSDP_ERR_RANK_FAILED);
    CU_ASSERT(strstr(c->msg[3], "rank 2 failed") != NULL);
    CU_ASSERT_EQUAL(rs[2], FSDP_ERR_IO);
    CU_ASSERT_EQUAL(rs[3], FSDP_ERR_RANK_FAILED);
    free(c);
}

static void test_rank_fail(void)
{
    static const char *const needles[] = {"rank failure on group world (4 ranks) at call #1",
                                          "rank 3 failed", NULL};
    fsdp_status_t rs[4];
    ctx_t *c = malloc(sizeof(*c));

    CU_ASSERT_EQUAL(run(c, SC_RANK_FAIL, 4, 10.0, rs), FSDP_ERR_RANK_FAILED);
    expect_all(c, 3, FSDP_ERR_RANK_FAILED, 5.0, needles);
    /* fsdp_sim_rank_fail stands for a crash: the rank failed though it returned OK */
    CU_ASSERT_EQUAL(rs[3], FSDP_ERR_RANK_FAILED);

    /* a failed rank that calls a collective fails it too, on every rank */
    CU_ASSERT_EQUAL(run(c, SC_RANK_FAIL_SELF, 4, 10.0, rs), FSDP_ERR_RANK_FAILED);
    for (int r = 0; r < 4; r++) {
        CU_ASSERT_EQUAL(c->st[r], FSDP_ERR_RANK_FAILED);
        CU_ASSERT(strstr(c->msg[r], "rank 3 failed") != NULL);
        CU_ASSERT(c->elapsed[r] < 5.0);
    }
    free(c);
}

static void test_timeout(void)
{
    static const char *const needles[] = {
        "collective timeout after 0.3 s on group world (4 ranks) at call #1: ",
        "rank 0 all_reduce(count=4, f32, sum); rank 1 did not arrive (running); "
        "rank 2 all_reduce(count=4, f32, sum); rank 3 all_reduce(count=4, f32, sum)",
        NULL};
    ctx_t *c = malloc(sizeof(*c));
    double t0 = now();

    CU_ASSERT_EQUAL(run(c, SC_TIMEOUT, 4, 0.3, NULL), FSDP_ERR_TIMEOUT);
    CU_ASSERT(now() - t0 < 5.0);
    expect_all(c, 4, FSDP_ERR_TIMEOUT, 5.0, needles);
    double longest = 0.0;
    for (int r = 0; r < 4; r++) {
        if (r == 1) {
            CU_ASSERT(c->elapsed[r] < 1.0); /* the late rank learns of it at once */
        } else {
            /* the timeout runs from the first arrival; later arrivals wait less */
            longest = c->elapsed[r] > longest ? c->elapsed[r] : longest;
            CU_ASSERT(c->elapsed[r] < 2.5); /* before the late rank wakes up */
        }
    }
    CU_ASSERT(longest >= 0.29);
    CU_ASSERT_EQUAL(log_count(), 1);
    free(c);
}

static void test_after_error(void)
{
    static const char *const needles[] = {
        "collective mismatch on group world/split(0) (2 ranks) at call #1: "
        "rank 0 all_gather(count=4, f32); rank 2 all_reduce(count=4, f32, sum)",
        NULL};
    ctx_t *c = malloc(sizeof(*c));
    fsdp_status_t rs[4];

    /* the evens fail and return their error; the odds and the world call go through */
    run(c, SC_AFTER_ERROR, 4, 10.0, rs);
    CU_ASSERT_EQUAL(c->st[0], FSDP_ERR_COLLECTIVE_MISMATCH);
    CU_ASSERT_EQUAL(c->st[2], FSDP_ERR_COLLECTIVE_MISMATCH);
    CU_ASSERT(strstr(c->msg[0], needles[0]) != NULL);
    CU_ASSERT(strstr(c->msg[2], needles[0]) != NULL);
    CU_ASSERT_EQUAL(c->st[1], FSDP_OK);
    CU_ASSERT_EQUAL(c->st[3], FSDP_OK);
    for (int r = 0; r < 4; r++)
        CU_ASSERT(c->extra_ok[r]);
    CU_ASSERT_EQUAL(c->st2[0], FSDP_ERR_COLLECTIVE_MISMATCH);
    CU_ASSERT_EQUAL(c->st2[2], FSDP_ERR_COLLECTIVE_MISMATCH);
    CU_ASSERT_EQUAL(c->st2[1], FSDP_OK);
    CU_ASSERT_EQUAL(c->st2[3], FSDP_OK);
    CU_ASSERT_EQUAL(rs[1], FSDP_OK);
    CU_ASSERT_EQUAL(rs[0], FSDP_ERR_COLLECTIVE_MISMATCH);
    free(c);
}

/* ---- under the runtime ----------------------------------------------------------------- */

/* A unit's all-gather that fails below the runtime: rank 1's unit is larger than rank 0's (a
 * mismatch), or, with a device capacity, no rank's device holds the unsharded parameter. */
typedef struct runtime_ctx {
    size_t capacity;
    fsdp_status_t st[2];
    char msg[2][512]; /* fsdp_last_error */
} runtime_ctx_t;

static fsdp_status_t runtime_rank(fsdp_dev_t *dev, void *arg)
{
    runtime_ctx_t *c = arg;
    fsdp_param_spec_t spec = {.name = "a.w", .ndim = 1, .requires_grad = 1, .tied_to = -1};
    fsdp_unit_t *root, *a;
    fsdp_config_t cfg;
    fsdp_t *fs;
    fsdp_status_t st;

    spec.shape[0] = c->capacity != 0 ? 1 << 20 : dev->rank == 1 ? 64 : 32;
    fsdp_config_init(&cfg);
    cfg.device_capacity = c->capacity;
    st = fsdp_create(dev, &cfg, &fs);
    if (st != FSDP_OK)
        return st;
    st = fsdp_unit_create(fs, "root", NULL, NULL, 0, &root);
    if (st == FSDP_OK)
        st = fsdp_unit_create(fs, "a", root, &spec, 1, &a);
    if (st == FSDP_OK)
        st = fsdp_pre_forward(root);
    if (st == FSDP_OK)
        st = fsdp_pre_forward(a);
    c->st[dev->rank] = st;
    snprintf(c->msg[dev->rank], sizeof(c->msg[0]), "%s", fsdp_last_error(fs));
    fsdp_destroy(fs);
    return FSDP_OK;
}

static void test_runtime_logged_once(void)
{
    runtime_ctx_t c = {0};
    fsdp_sim_params_t p;

    fsdp_sim_params_init(&p);
    p.world_size = 2;
    p.timeout_s = 10.0;
    /* the mismatch: the backend's line for both ranks, and no other */
    log_reset();
    CU_ASSERT_EQUAL(fsdp_sim_launch(&p, runtime_rank, &c, NULL), FSDP_OK);
    CU_ASSERT_EQUAL(log_count(), 1);
    for (int r = 0; r < 2; r++) {
        CU_ASSERT_EQUAL(c.st[r], FSDP_ERR_COLLECTIVE_MISMATCH);
        CU_ASSERT(strstr(c.msg[r], "unit 'a': all-gather failed") != NULL);
    }
    /* out of device memory: the allocator's line on each rank, and no other */
    memset(&c, 0, sizeof(c));
    c.capacity = 30 << 20;
    log_reset();
    CU_ASSERT_EQUAL(fsdp_sim_launch(&p, runtime_rank, &c, NULL), FSDP_OK);
    CU_ASSERT_EQUAL(log_count(), 2);
    pthread_mutex_lock(&log_lock);
    CU_ASSERT(strstr(log_last, "out of device memory") != NULL);
    pthread_mutex_unlock(&log_lock);
    for (int r = 0; r < 2; r++) {
        CU_ASSERT_EQUAL(c.st[r], FSDP_ERR_OUT_OF_MEMORY);
        CU_ASSERT(strstr(c.msg[r], "unit 'a': cannot allocate its unsharded parameter") != NULL);
    }
}

/* ---- the launcher ---------------------------------------------------------------------- */

static fsdp_status_t rank_nop(fsdp_dev_t *dev, void *arg)
{
    (void)dev, (void)arg;
    return FSDP_OK;
}

static void expect_invalid(const fsdp_sim_params_t *p, fsdp_rank_func_t func, const char *what)
{
    log_reset();
    CU_ASSERT_EQUAL(fsdp_sim_launch(p, func, NULL, NULL), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT_EQUAL(log_count(), 1);
    pthread_mutex_lock(&log_lock);
    if (strstr(log_last, what) == NULL) {
        fprintf(stderr, "\n  error lacks \"%s\": %s\n", what, log_last);
        CU_FAIL("launch error message");
    }
    pthread_mutex_unlock(&log_lock);
}

static void test_launch_params(void)
{
    fsdp_sim_params_t p;

    fsdp_sim_params_init(&p);
    CU_ASSERT_EQUAL(p.world_size, 1);
    CU_ASSERT_EQUAL(p.ranks_per_node, 0);
    CU_ASSERT_EQUAL(p.timeout_s, 60.0);
    CU_ASSERT_EQUAL(p.mode, FSDP_SIM_DATA);
    CU_ASSERT_EQUAL(p.device_capacity, 0);
    CU_ASSERT_EQUAL(fsdp_sim_launch(&p, rank_nop, NULL, NULL), FSDP_OK);

    expect_invalid(NULL, rank_nop, "fsdp_sim_params_init");
    expect_invalid(&p, NULL, "function is NULL");
    p.world_size = 0;
    expect_invalid(&p, rank_nop, "world_size 0 is invalid: it must be in [1, 1048576]");
    p.world_size = -3;
    expect_invalid(&p, rank_nop, "world_size -3");
    p.world_size = FSDP_MAX_WORLD + 1;
    expect_invalid(&p, rank_nop, "world_size 1048577 is invalid");
    p.world_size = 4;
    p.ranks_per_node = 3;
    expect_invalid(&p, rank_nop, "ranks_per_node 3 must divide world_size 4");
    p.ranks_per_node = -1;
    expect_invalid(&p, rank_nop, "ranks_per_node -1 must divide");
    p.ranks_per_node = 2;
    p.timeout_s = 0.0;
    expect_invalid(&p, rank_nop, "timeout_s 0 is invalid");
    p.timeout_s = -1.0;
    expect_invalid(&p, rank_nop, "greater than 0");
    p.timeout_s = NAN;
    expect_invalid(&p, rank_nop, "timeout_s nan");
    p.timeout_s = 1.0;
    p.mode = (fsdp_sim_mode_t)5;
    expect_invalid(&p, rank_nop, "mode 5 is invalid");
    p.mode = FSDP_SIM_SHAPE;
    CU_ASSERT_EQUAL(fsdp_sim_launch(&p, rank_nop, NULL, NULL), FSDP_OK);
}

static void test_exit_codes(void)
{
    fsdp_status_t rs[4];
    ctx_t *c = malloc(sizeof(*c));

    /* the lowest failing rank's status, and each rank's own */
    CU_ASSERT_EQUAL(run(c, SC_EXIT_CODES, 4, 10.0, rs), FSDP_ERR_IO);
    CU_ASSERT_EQUAL(rs[0], FSDP_OK);
    CU_ASSERT_EQUAL(rs[1], FSDP_ERR_IO);
    CU_ASSERT_EQUAL(rs[2], FSDP_OK);
    CU_ASSERT_EQUAL(rs[3], FSDP_ERR_FORMAT);
    free(c);
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"kind", test_kind},
        {"count_dtype_op_root", test_count_dtype_op_root},
        {"large_message", test_large_message},
        {"other_group", test_other_group},
        {"finished", test_finished},
        {"error_return", test_error_return},
        {"rank_fail", test_rank_fail},
        {"timeout", test_timeout},
        {"after_error", test_after_error},
        {"runtime_logged_once", test_runtime_logged_once},
        {"launch_params", test_launch_params},
        {"exit_codes", test_exit_codes},
        {NULL, NULL},
    };
    int rc;

    fsdp_log_set_handler(log_handler, NULL);
    rc = fsdp_test_run("mismatch", tests);
    fsdp_log_set_handler(NULL, NULL);
    return rc;
}
