/* The launcher's environment (torchrun, Open MPI, Slurm, a single process; Slurm host lists)
 * and the rendezvous over loopback, with ranks as forked processes. */
#include "config.h"

#include "test_util.h"

#include <fsdp/gpu.h>
#include <fsdp/log.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BLOB_BYTES FSDP_GPU_UNIQUE_ID_BYTES

/* Every error line logged (and warnings, when capture_warnings is set), for checking what a
 * failure says. */
static char log_text[8192];
static int capture_warnings;

static void capture_log(fsdp_log_level_t level, const char *file, int line, const char *func,
                        const char *msg, void *arg)
{
    size_t len = strlen(log_text);

    if ((level <= FSDP_LOG_ERROR || (capture_warnings && level <= FSDP_LOG_WARN)) &&
        len + strlen(msg) + 2 < sizeof(log_text)) {
        memcpy(log_text + len, msg, strlen(msg));
        log_text[len + strlen(msg)] = '\n';
        log_text[len + strlen(msg) + 1] = '\0';
    }
}

static void capture_start(void)
{
    log_text[0] = '\0';
    fsdp_log_set_handler(capture_log, NULL);
}

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the environment ---- */

static const char *const launch_vars[] = {"RANK",
                                          "WORLD_SIZE",
                                          "LOCAL_RANK",
                                          "LOCAL_WORLD_SIZE",
                                          "MASTER_ADDR",
                                          "MASTER_PORT",
                                          "OMPI_COMM_WORLD_RANK",
                                          "OMPI_COMM_WORLD_SIZE",
                                          "OMPI_COMM_WORLD_LOCAL_RANK",
                                          "OMPI_COMM_WORLD_LOCAL_SIZE",
                                          "SLURM_PROCID",
                                          "SLURM_NTASKS",
                                          "SLURM_NPROCS",
                                          "SLURM_LOCALID",
                                          "SLURM_NTASKS_PER_NODE",
                                          "SLURM_TASKS_PER_NODE",
                                          "SLURM_NODEID",
                                          "SLURM_JOB_NODELIST",
                                          "SLURM_NODELIST",
                                          NULL};

static void clear_env(void)
{
    for (int i = 0; launch_vars[i] != NULL; i++)
        unsetenv(launch_vars[i]);
}

/* Sets "NAME=value" pairs, NULL-terminated. */
static void set_env(const char *const *pairs)
{
    clear_env();
    for (int i = 0; pairs[i] != NULL; i += 2)
        setenv(pairs[i], pairs[i + 1], 1);
}

static fsdp_launch_info_t launch_ok(const char *const *pairs)
{
    fsdp_launch_info_t info;

    set_env(pairs);
    memset(&info, 0, sizeof(info));
    CU_ASSERT_EQUAL(fsdp_launch_env(&info), FSDP_OK);
    clear_env();
    return info;
}

/* The environment is refused, the log names the variable (or says why), info is untouched. */
static void launch_bad(const char *const *pairs, const char *says)
{
    fsdp_launch_info_t info;

    set_env(pairs);
    memset(&info, 0x5a, sizeof(info));
    capture_start();
    CU_ASSERT_EQUAL(fsdp_launch_env(&info), FSDP_ERR_INVALID_PARAM);
    fsdp_log_set_handler(NULL, NULL);
    if (strstr(log_text, says) == NULL)
        fprintf(stderr, "expected \"%s\" in: %s\n", says, log_text);
    CU_ASSERT_PTR_NOT_NULL(strstr(log_text, says));
    CU_ASSERT_EQUAL(info.rank, 0x5a5a5a5a);
    clear_env();
}

static void test_env_single(void)
{
    const char *none[] = {NULL};
    const char *port[] = {"MASTER_PORT", "1234", NULL};
    fsdp_launch_info_t info = launch_ok(none);

    CU_ASSERT_STRING_EQUAL(info.launcher, "single");
    CU_ASSERT_EQUAL(info.rank, 0);
    CU_ASSERT_EQUAL(info.world_size, 1);
    CU_ASSERT_EQUAL(info.local_rank, 0);
    CU_ASSERT_EQUAL(info.local_size, 1);
    CU_ASSERT_STRING_EQUAL(info.master_addr, "127.0.0.1");
    CU_ASSERT_EQUAL(info.master_port, FSDP_LAUNCH_DEFAULT_PORT);
    info = launch_ok(port);
    CU_ASSERT_EQUAL(info.master_port, 1234);
}

static void test_env_torchrun(void)
{
    const char *full[] = {"RANK", "5", "WORLD_SIZE", "8", "LOCAL_RANK", "1", "LOCAL_WORLD_SIZE",
                          "4", "MASTER_ADDR", "node7", "MASTER_PORT", "29511",
                          /* torchrun wins over the Slurm variables it runs under */
                          "SLURM_PROCID", "0", "SLURM_NTASKS", "2", NULL};
    const char *one[] = {"RANK", "0", "WORLD_SIZE", "1", NULL};
    fsdp_launch_info_t info = launch_ok(full);

    CU_ASSERT_STRING_EQUAL(info.launcher, "torchrun");
    CU_ASSERT_EQUAL(info.rank, 5);
    CU_ASSERT_EQUAL(info.world_size, 8);
    CU_ASSERT_EQUAL(info.local_rank, 1);
    CU_ASSERT_EQUAL(info.local_size, 4);
    CU_ASSERT_STRING_EQUAL(info.master_addr, "node7");
    CU_ASSERT_EQUAL(info.master_port, 29511);
    info = launch_ok(one); /* a world of one needs no master */
    CU_ASSERT_EQUAL(info.world_size, 1);
    CU_ASSERT_EQUAL(info.local_size, 0);
    CU_ASSERT_STRING_EQUAL(info.master_addr, "127.0.0.1");
}

static void test_env_openmpi(void)
{
    const char *full[] = {"OMPI_COMM_WORLD_RANK",
                          "3",
                          "OMPI_COMM_WORLD_SIZE",
                          "4",
                          "OMPI_COMM_WORLD_LOCAL_RANK",
                          "1",
                          "OMPI_COMM_WORLD_LOCAL_SIZE",
                          "2",
                          "MASTER_ADDR",
                          "::1",
                          "MASTER_PORT",
                          "4000",
                          "SLURM_PROCID",
                          "1",
                          "SLURM_NTASKS",
                          "2",
                          NULL};
    fsdp_launch_info_t info = launch_ok(full);

    CU_ASSERT_STRING_EQUAL(info.launcher, "openmpi");
    CU_ASSERT_EQUAL(info.rank, 3);
    CU_ASSERT_EQUAL(info.world_size, 4);
    CU_ASSERT_EQUAL(info.local_rank, 1);
    CU_ASSERT_EQUAL(info.local_size, 2);
    CU_ASSERT_STRING_EQUAL(info.master_addr, "::1");
    CU_ASSERT_EQUAL(info.master_port, 4000);
}

static void test_env_slurm(void)
{
    const char *list[] = {"SLURM_PROCID",
                          "6",
                          "SLURM_NTASKS",
                          "7",
                          "SLURM_LOCALID",
                          "0",
                          "SLURM_TASKS_PER_NODE",
                          "2(x3),1",
                          "SLURM_NODEID",
                          "3",
                          "SLURM_JOB_NODELIST",
                          "node[3-5,7],gpu01",
                          NULL};
    const char *per[] = {"SLURM_PROCID",
                         "2",
                         "SLURM_NTASKS",
                         "8",
                         "SLURM_LOCALID",
                         "2",
                         "SLURM_NTASKS_PER_NODE",
                         "4",
                         "SLURM_TASKS_PER_NODE",
                         "4(x2)",
                         "SLURM_NODELIST",
                         "gpu[007-010]",
                         "MASTER_PORT",
                         "6000",
                         NULL};
    const char *first[] = {"SLURM_PROCID",
                           "1",
                           "SLURM_NTASKS",
                           "4",
                           "SLURM_LOCALID",
                           "1",
                           "SLURM_TASKS_PER_NODE",
                           "2(x2)",
                           "SLURM_JOB_NODELIST",
                           "a,b",
                           "MASTER_ADDR",
                           "10.0.0.1",
                           NULL};
    const char *alone[] = {"SLURM_PROCID", "0", "SLURM_NTASKS", "1", NULL};
    fsdp_launch_info_t info = launch_ok(list);

    CU_ASSERT_STRING_EQUAL(info.launcher, "slurm");
    CU_ASSERT_EQUAL(info.rank, 6);
    CU_ASSERT_EQUAL(info.world_size, 7);
    CU_ASSERT_EQUAL(info.local_rank, 0);
    CU_ASSERT_EQUAL(info.local_size, 1); /* node 3 of "2(x3),1" */
    CU_ASSERT_STRING_EQUAL(info.master_addr, "node3");
    CU_ASSERT_EQUAL(info.master_port, FSDP_LAUNCH_DEFAULT_PORT);

    info = launch_ok(per);
    CU_ASSERT_EQUAL(info.local_size, 4);
    CU_ASSERT_STRING_EQUAL(info.master_addr, "gpu007");
    CU_ASSERT_EQUAL(info.master_port, 6000);

    info = launch_ok(first); /* no SLURM_NODEID: the first count; MASTER_ADDR wins */
    CU_ASSERT_EQUAL(info.local_size, 2);
    CU_ASSERT_STRING_EQUAL(info.master_addr, "10.0.0.1");

    info = launch_ok(alone);
    CU_ASSERT_EQUAL(info.world_size, 1);
    CU_ASSERT_STRING_EQUAL(info.master_addr, "127.0.0.1");
}

static void test_hostlist(void)
{
    static const struct {
        const char *list;
        const char *hosts[8];
    } cases[] = {
        {"node[3-5,7],gpu01", {"node3", "node4", "node5", "node7", "gpu01", NULL}},
        {"gpu[008-011]", {"gpu008", "gpu009", "gpu010", "gpu011", NULL}},
        {"a,b,c", {"a", "b", "c", NULL}},
        {"single", {"single", NULL}},
        {"n[9-10]-ib", {"n9-ib", "n10-ib", NULL}},
        {"rack[1-2]-n[01-02]", {"rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02", NULL}},
        {"x[2],y[1-2,5]z", {"x2", "y1z", "y2z", "y5z", NULL}},
    };
    static const char *const bad[] = {"",         "node[3-", "node[5-3]",    "node]",  "node[a]",
                                      "node[1-2", "a,,b",    "node[[1]]",    "n[1]x]", "a,",
                                      "n[1,]",    "n[-2]",   "n[1234567890]"};
    char host[64];

    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        int n = 0;

        for (; cases[c].hosts[n] != NULL; n++) {
            CU_ASSERT_EQUAL_FATAL(fsdp_hostlist_get(cases[c].list, n, host, sizeof(host)), FSDP_OK);
            CU_ASSERT_STRING_EQUAL(host, cases[c].hosts[n]);
        }
        CU_ASSERT_EQUAL(fsdp_hostlist_get(cases[c].list, n, host, sizeof(host)),
                        FSDP_ERR_NOT_FOUND);
    }
    for (size_t b = 0; b < sizeof(bad) / sizeof(bad[0]); b++) {
        if (fsdp_hostlist_get(bad[b], 0, host, sizeof(host)) != FSDP_ERR_INVALID_PARAM)
            fprintf(stderr, "host list \"%s\" was accepted\n", bad[b]);
        CU_ASSERT_EQUAL(fsdp_hostlist_get(bad[b], 0, host, sizeof(host)), FSDP_ERR_INVALID_PARAM);
    }
    CU_ASSERT_EQUAL(fsdp_hostlist_get("node[100-101]", 0, host, 7), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT_EQUAL(fsdp_hostlist_get("node[100-101]", 0, host, 8), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_hostlist_get("node1", -1, host, sizeof(host)), FSDP_ERR_INVALID_PARAM);
}

static void test_env_malformed(void)
{
    const char *a[] = {"RANK", "abc", "WORLD_SIZE", "2", NULL};
    const char *b[] = {"RANK", "8",           "WORLD_SIZE", "8", "MASTER_ADDR",
                       "h",    "MASTER_PORT", "1",          NULL};
    const char *c[] = {"RANK", "1", "WORLD_SIZE", "2", NULL};
    const char *d[] = {"RANK", "1", NULL};
    const char *e[] = {"RANK", "1",           "WORLD_SIZE", "2", "MASTER_ADDR",
                       "h",    "MASTER_PORT", "70000",      NULL};
    const char *f[] = {
        "RANK", "1",           "WORLD_SIZE", "4",           "LOCAL_RANK", "2", "LOCAL_WORLD_SIZE",
        "2",    "MASTER_ADDR", "h",          "MASTER_PORT", "1",          NULL};
    const char *g[] = {"RANK", "0", "WORLD_SIZE", "0", NULL};
    const char *h[] = {"RANK", "-1", "WORLD_SIZE", "2", NULL};
    const char *i[] = {"RANK", " 1", "WORLD_SIZE", "2", NULL};
    const char *j[] = {"RANK", "1", "WORLD_SIZE", "2", "MASTER_ADDR", "h", NULL};
    const char *k[] = {"OMPI_COMM_WORLD_RANK",
                       "0",
                       "OMPI_COMM_WORLD_SIZE",
                       "2",
                       "OMPI_COMM_WORLD_LOCAL_RANK",
                       "0",
                       "MASTER_ADDR",
                       "h",
                       "MASTER_PORT",
                       "1",
                       NULL};
    const char *l[] = {"OMPI_COMM_WORLD_RANK",
                       "0",
                       "OMPI_COMM_WORLD_SIZE",
                       "2",
                       "OMPI_COMM_WORLD_LOCAL_RANK",
                       "0",
                       "OMPI_COMM_WORLD_LOCAL_SIZE",
                       "1",
                       NULL};
    const char *m[] = {"SLURM_PROCID", "0", "SLURM_NTASKS", "2", NULL};
    const char *n[] = {"SLURM_PROCID", "0", "SLURM_NTASKS", "2", "SLURM_JOB_NODELIST",
                       "node[1-",      NULL};
    const char *o[] = {"SLURM_PROCID", "0", NULL};
    const char *p[] = {"SLURM_PROCID",
                       "0",
                       "SLURM_NTASKS",
                       "2",
                       "SLURM_TASKS_PER_NODE",
                       "2(x",
                       "SLURM_JOB_NODELIST",
                       "n1",
                       NULL};
    const char *q[] = {"RANK", "0",           "WORLD_SIZE", "2",           "LOCAL_WORLD_SIZE",
                       "3",    "MASTER_ADDR", "h",          "MASTER_PORT", "1",
                       NULL};
    const char *r[] = {"RANK", "0", "WORLD_SIZE", "99999999999", NULL};
    const char *s[] = {"RANK", "0", "WORLD_SIZE", "1", "MASTER_ADDR", "", NULL};

    launch_bad(a, "RANK=\"abc\"");
    launch_bad(b, "rank 8 is not allowed with a world size of 8");
    launch_bad(c, "MASTER_ADDR is not set");
    launch_bad(d, "WORLD_SIZE is not set");
    launch_bad(e, "MASTER_PORT=\"70000\"");
    launch_bad(f, "local rank 2 is not allowed with a local size of 2");
    launch_bad(g, "WORLD_SIZE=\"0\"");
    launch_bad(h, "RANK=\"-1\"");
    launch_bad(i, "RANK=\" 1\"");
    launch_bad(j, "MASTER_PORT is not set");
    launch_bad(k, "OMPI_COMM_WORLD_LOCAL_SIZE is not set");
    launch_bad(l, "MASTER_ADDR is not set");
    launch_bad(m, "SLURM_JOB_NODELIST is not set");
    launch_bad(n, "SLURM_JOB_NODELIST=\"node[1-\"");
    launch_bad(o, "SLURM_NTASKS is not set");
    launch_bad(p, "SLURM_TASKS_PER_NODE=\"2(x\"");
    launch_bad(q, "local size 3 is not allowed with a world size of 2");
    launch_bad(r, "WORLD_SIZE=\"99999999999\"");
    launch_bad(s, "MASTER_ADDR=\"\"");
}

/* ---- the rendezvous, ranks as processes ---- */

#define ANY_STATUS 1 /* not a status: the child reports what it got */

static void fill_blob(unsigned char *blob, int port)
{
    for (int i = 0; i < BLOB_BYTES; i++)
        blob[i] = (unsigned char)(i * 7 + port);
}

/* A port nothing listens on now, from the kernel. */
static int free_port(int family)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    int fd = socket(family, SOCK_STREAM, 0), port = -1;

    memset(&ss, 0, sizeof(ss));
    ss.ss_family = (sa_family_t)family;
    if (family == AF_INET6)
        ((struct sockaddr_in6 *)&ss)->sin6_addr = in6addr_loopback;
    else
        ((struct sockaddr_in *)&ss)->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 &&
        bind(fd, (struct sockaddr *)&ss,
             family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in)) == 0 &&
        getsockname(fd, (struct sockaddr *)&ss, &len) == 0)
        port = ntohs(family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                        : ((struct sockaddr_in *)&ss)->sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

typedef struct {
    const char *addr;
    int port;
    int world_size;
    const char *token;
    double timeout_s;
} job_t;

/* Runs one rank in a child process. Exit status: 0 when it returned expect (with the right
 * blob on success, and says in its log); with expect ANY_STATUS, -status (what it got). */
static pid_t spawn(const job_t *job, int rank, int world_size, const char *token, int expect,
                   const char *says)
{
    pid_t pid;

    fflush(NULL);
    pid = fork();
    if (pid != 0)
        return pid;

    fsdp_launch_info_t info = {
        .launcher = "test", .rank = rank, .world_size = world_size, .master_port = job->port};
    unsigned char blob[BLOB_BYTES], want[BLOB_BYTES];
    fsdp_status_t status;
    int code;

    alarm(20); /* a hang fails the test instead of stalling it */
    snprintf(info.master_addr, sizeof(info.master_addr), "%s", job->addr);
    fill_blob(want, job->port);
    if (rank == 0)
        memcpy(blob, want, sizeof(blob));
    else
        memset(blob, 0, sizeof(blob));
    capture_start();
    status = fsdp_rendezvous(&info, token, job->timeout_s, blob, sizeof(blob));
    fsdp_log_set_handler(NULL, NULL);
    if (status == FSDP_OK && memcmp(blob, want, sizeof(blob)) != 0)
        code = 60;
    else if (status != FSDP_OK && says != NULL && strstr(log_text, says) == NULL)
        code = 50;
    else if (expect == ANY_STATUS)
        code = -(int)status;
    else
        code = status == (fsdp_status_t)expect ? 0 : 40 - (int)status;
    if (code != 0 && expect != ANY_STATUS)
        fprintf(stderr, "rank %d: %s, exit %d; log:\n%s", rank, fsdp_status_name(status), code,
                log_text);
    exit(code);
}

static int wait_code(pid_t pid)
{
    int st;

    if (waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1000 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

static job_t job_new(const char *token, double timeout_s)
{
    job_t job = {.addr = "127.0.0.1", .token = token, .timeout_s = timeout_s};

    job.port = free_port(AF_INET);
    CU_ASSERT_FATAL(job.port > 0);
    return job;
}

static void test_rdv_four_ranks(void)
{
    job_t job = job_new("s3cret", 10.0);
    pid_t pid[4];
    double t0 = now_s();

    /* the other ranks start first and retry until rank 0 is up */
    for (int r = 1; r < 4; r++)
        pid[r] = spawn(&job, r, 4, job.token, FSDP_OK, NULL);
    usleep(200 * 1000);
    pid[0] = spawn(&job, 0, 4, job.token, FSDP_OK, NULL);
    for (int r = 0; r < 4; r++)
        CU_ASSERT_EQUAL(wait_code(pid[r]), 0);
    CU_ASSERT(now_s() - t0 < 5.0);
}

static void test_rdv_no_token_world_one(void)
{
    job_t job = job_new(NULL, 10.0);
    pid_t p0 = spawn(&job, 0, 2, NULL, FSDP_OK, NULL);
    pid_t p1 = spawn(&job, 1, 2, "", FSDP_OK, NULL);
    fsdp_launch_info_t one = {
        .rank = 0, .world_size = 1, .master_addr = "127.0.0.1", .master_port = job.port};
    unsigned char blob[BLOB_BYTES] = {0};

    CU_ASSERT_EQUAL(wait_code(p0), 0);
    CU_ASSERT_EQUAL(wait_code(p1), 0);
    /* a world of one returns at once, without listening */
    CU_ASSERT_EQUAL(fsdp_rendezvous(&one, NULL, 1.0, blob, sizeof(blob)), FSDP_OK);
}

static void test_rdv_wrong_token(void)
{
    job_t job = job_new("s3cret", 10.0);
    pid_t p0 = spawn(&job, 0, 3, job.token, FSDP_OK, NULL);
    pid_t p1 = spawn(&job, 1, 3, job.token, FSDP_OK, NULL);
    pid_t p2;

    /* refused ones exit before the real rank 2 completes the job */
    CU_ASSERT_EQUAL(
        wait_code(spawn(&job, 2, 3, "s3cres", FSDP_ERR_INVALID_PARAM, "job token rejected")), 0);
    CU_ASSERT_EQUAL(
        wait_code(spawn(&job, 2, 3, "s3cret-longer", FSDP_ERR_INVALID_PARAM, "job token rejected")),
        0);
    CU_ASSERT_EQUAL(
        wait_code(spawn(&job, 1, 3, NULL, FSDP_ERR_INVALID_PARAM, "job token rejected")), 0);
    p2 = spawn(&job, 2, 3, job.token, FSDP_OK, NULL);
    CU_ASSERT_EQUAL(wait_code(p0), 0);
    CU_ASSERT_EQUAL(wait_code(p1), 0);
    CU_ASSERT_EQUAL(wait_code(p2), 0);
}

/* Connects to rank 0 (retrying while it starts), sends bytes, and reports whether rank 0 then
 * closed the connection (1) within 3 s. */
static int send_raw(int port, const void *bytes, size_t len, int linger)
{
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    double until = now_s() + 5.0;
    int fd = -1, closed = 0;
    char buf[64];

    while (now_s() < until) {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0)
            return -1;
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
            break;
        close(fd);
        fd = -1;
        usleep(20 * 1000);
    }
    if (fd < 0)
        return -1;
    if (send(fd, bytes, len, MSG_NOSIGNAL) == (ssize_t)len && linger) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};

        while (poll(&pfd, 1, 3000) == 1) {
            ssize_t n = recv(fd, buf, sizeof(buf), 0);

            if (n <= 0) {
                closed = 1;
                break;
            }
        }
    }
    close(fd);
    return linger ? closed : 1;
}

static void test_rdv_malformed(void)
{
    job_t job = job_new("tok", 10.0);
    pid_t p0 = spawn(&job, 0, 2, job.token, FSDP_OK, NULL);
    const char garbage[] = "GET / HTTP/1.0\r\nHost: rank0\r\n\r\nxxxxxxxxxxxxxxxxxxxxxxxxxxxx";
    unsigned char big[24] = {'F', 'S', 'D', 'R', 0, 1, 0, 0,   0,    0,    0,    1,
                             0,   0,   0,   2,   0, 0, 0, 128, 0x7f, 0xff, 0xff, 0xff};
    unsigned char version[24] = {'F', 'S', 'D', 'R', 0, 9, 0, 0,   0, 0, 0, 1,
                                 0,   0,   0,   2,   0, 0, 0, 128, 0, 0, 0, 0};
    unsigned char half[10] = {'F', 'S', 'D', 'R', 0, 1, 0, 0, 0, 0};

    CU_ASSERT_EQUAL(send_raw(job.port, garbage, sizeof(garbage), 1), 1);
    CU_ASSERT_EQUAL(send_raw(job.port, big, sizeof(big), 1), 1); /* oversized token */
    CU_ASSERT_EQUAL(send_raw(job.port, version, sizeof(version), 1), 1);
    CU_ASSERT_EQUAL(send_raw(job.port, half, sizeof(half), 0), 1); /* gone mid-request */
    CU_ASSERT_EQUAL(send_raw(job.port, "", 0, 0), 1);              /* connect and leave */
    CU_ASSERT_EQUAL(wait_code(spawn(&job, 1, 2, job.token, FSDP_OK, NULL)), 0);
    CU_ASSERT_EQUAL(wait_code(p0), 0);
}

static void test_rdv_missing_rank(void)
{
    job_t job = job_new(NULL, 1.0);
    double t0 = now_s();
    /* rank 1 starts after rank 0, so that rank 0 times out first and tells it (were rank 1
     * first to give up, it would leave, and rank 0 would count it missing too) */
    pid_t p0 = spawn(&job, 0, 4, NULL, FSDP_ERR_TIMEOUT, "missing ranks: ");
    pid_t p1 = (usleep(50 * 1000), spawn(&job, 1, 4, NULL, FSDP_ERR_TIMEOUT, "timed out"));

    CU_ASSERT_EQUAL(wait_code(p0), 0);
    CU_ASSERT_EQUAL(wait_code(p1), 0);
    CU_ASSERT(now_s() - t0 < 3.0);
    /* nobody up at all: a rank gives up at its own timeout */
    job = job_new(NULL, 0.5);
    CU_ASSERT_EQUAL(wait_code(spawn(&job, 1, 2, NULL, FSDP_ERR_TIMEOUT, "could not be reached")),
                    0);
}

static void test_rdv_duplicate_rank(void)
{
    job_t job = job_new(NULL, 10.0);
    pid_t p0 = spawn(&job, 0, 3, NULL, FSDP_OK, NULL);
    pid_t a = spawn(&job, 1, 3, NULL, ANY_STATUS, "rank 1 already joined");
    pid_t b = spawn(&job, 1, 3, NULL, ANY_STATUS, "rank 1 already joined");
    pid_t first = -1, second;
    int st, code;

    /* whichever rank 1 joined second is refused, and exits while the other still waits */
    for (int i = 0; i < 500 && first < 0; i++) {
        if (waitpid(a, &st, WNOHANG) == a)
            first = a;
        else if (waitpid(b, &st, WNOHANG) == b)
            first = b;
        else
            usleep(10 * 1000);
    }
    CU_ASSERT_FATAL(first > 0);
    code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    CU_ASSERT_EQUAL(code, -FSDP_ERR_INVALID_PARAM);
    second = first == a ? b : a;
    CU_ASSERT_EQUAL(wait_code(spawn(&job, 2, 3, NULL, FSDP_OK, NULL)), 0);
    CU_ASSERT_EQUAL(wait_code(second), 0);
    CU_ASSERT_EQUAL(wait_code(p0), 0);
}

static void test_rdv_wrong_world(void)
{
    job_t job = job_new(NULL, 10.0);
    pid_t p0 = spawn(&job, 0, 3, NULL, FSDP_OK, NULL);
    pid_t p1 = spawn(&job, 1, 3, NULL, FSDP_OK, NULL);

    CU_ASSERT_EQUAL(wait_code(spawn(&job, 2, 4, NULL, FSDP_ERR_INVALID_PARAM,
                                    "world size 4 does not match the server's 3")),
                    0);
    CU_ASSERT_EQUAL(wait_code(spawn(&job, 3, 4, NULL, FSDP_ERR_INVALID_PARAM,
                                    "world size 4 does not match the server's 3")),
                    0);
    CU_ASSERT_EQUAL(wait_code(spawn(&job, 2, 3, NULL, FSDP_OK, NULL)), 0);
    CU_ASSERT_EQUAL(wait_code(p0), 0);
    CU_ASSERT_EQUAL(wait_code(p1), 0);
}

static void test_rdv_ipv6(void)
{
    job_t job = {.addr = "::1", .timeout_s = 10.0};

    job.port = free_port(AF_INET6);
    if (job.port <= 0) {
        fprintf(stderr, "no IPv6 loopback here: skipped\n");
        return;
    }
    pid_t p0 = spawn(&job, 0, 2, NULL, FSDP_OK, NULL);
    CU_ASSERT_EQUAL(wait_code(spawn(&job, 1, 2, NULL, FSDP_OK, NULL)), 0);
    CU_ASSERT_EQUAL(wait_code(p0), 0);
}

/* Opens idle connections to port, a first burst of burst and then one every 2 ms, up to 500,
 * and holds them all until killed. */
static pid_t spawn_flood(int port, int burst)
{
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    pid_t pid;

    fflush(NULL);
    pid = fork();
    if (pid != 0)
        return pid;
    alarm(20);
    for (int n = 0;; n++) {
        int fd = n < 500 ? socket(AF_INET, SOCK_STREAM, 0) : -1;

        if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)
            close(fd);
        if (n >= burst)
            usleep(2000);
    }
}

/* A flood of idle connections from a peer without the token delays a rank by a fraction of a
 * second at most: before the fix, 70 held connections timed it out. */
static void test_rdv_flood(void)
{
    job_t job = job_new("s3cret", 10.0);
    pid_t p0 = spawn(&job, 0, 3, job.token, FSDP_OK, NULL);
    pid_t flood = spawn_flood(job.port, 200);
    double t0;

    usleep(300 * 1000); /* the flood fills rank 0's table several times over */
    t0 = now_s();
    pid_t p1 = spawn(&job, 1, 3, job.token, FSDP_OK, NULL);
    pid_t p2 = spawn(&job, 2, 3, job.token, FSDP_OK, NULL);
    CU_ASSERT_EQUAL(wait_code(p1), 0);
    CU_ASSERT_EQUAL(wait_code(p2), 0);
    CU_ASSERT_EQUAL(wait_code(p0), 0);
    if (now_s() - t0 >= 1.0)
        fprintf(stderr, "the ranks joined in %.3f s under the flood\n", now_s() - t0);
    CU_ASSERT(now_s() - t0 < 1.0);
    kill(flood, SIGKILL);
    (void)wait_code(flood);
}

/* A peer that sends request after request with a wrong token is named a few times in rank 0's
 * log, then counted in one line: before, each request was a line (23,361 in 1.5 s). */
static void test_rdv_wrong_token_flood(void)
{
    enum { FLOOD = 100 };
    job_t job = job_new("s3cret", 10.0);
    /* rank 1 of 2, a blob of BLOB_BYTES, a 6-byte token that is not the job's */
    unsigned char req[30] = {'F', 'S', 'D', 'R', 0, 1, 0, 0, 0, 0,   0,   1,   0,   0,   0,
                             2,   0,   0,   0,   0, 0, 0, 0, 6, 's', '3', 'c', 'r', 'e', 's'};
    fsdp_launch_info_t info = {.rank = 0, .world_size = 2, .master_addr = "127.0.0.1"};
    unsigned char blob[BLOB_BYTES];
    const char *p;
    int refused = 0;
    pid_t peer;

    req[16] = (unsigned char)(BLOB_BYTES >> 24), req[17] = (unsigned char)(BLOB_BYTES >> 16);
    req[18] = (unsigned char)(BLOB_BYTES >> 8), req[19] = (unsigned char)BLOB_BYTES;
    info.master_port = job.port;
    fill_blob(blob, job.port);
    fflush(NULL);
    peer = fork();
    if (peer == 0) {
        /* each refused (rank 0 answers and closes), then the true rank 1 joins */
        fsdp_launch_info_t one = info;
        unsigned char got[BLOB_BYTES] = {0};
        alarm(20);
        fsdp_log_set_level(FSDP_LOG_OFF);
        for (int i = 0; i < FLOOD; i++)
            if (send_raw(job.port, req, sizeof(req), 1) != 1)
                exit(2);
        one.rank = 1;
        exit(fsdp_rendezvous(&one, job.token, 10.0, got, sizeof(got)) == FSDP_OK &&
                     memcmp(got, blob, sizeof(got)) == 0
                 ? 0
                 : 3);
    }
    CU_ASSERT_FATAL(peer > 0);
    capture_warnings = 1;
    capture_start();
    CU_ASSERT_EQUAL(fsdp_rendezvous(&info, job.token, 10.0, blob, sizeof(blob)), FSDP_OK);
    CU_ASSERT_EQUAL(wait_code(peer), 0);
    fsdp_log_set_handler(NULL, NULL);
    capture_warnings = 0;
    for (p = log_text; (p = strstr(p, "refused rank 1 from")) != NULL; p++)
        refused++;
    if (refused > 8)
        fprintf(stderr, "\n  %d refusals logged of %d", refused, FLOOD);
    CU_ASSERT(refused >= 1 && refused <= 8);
    CU_ASSERT_PTR_NOT_NULL(strstr(log_text, "further refusals are counted, not logged"));
    CU_ASSERT_PTR_NOT_NULL(strstr(log_text, "refused 100 requests in all"));
}

/* A rank 0 that reads the request, answers len bytes of the 16 and closes. */
static pid_t spawn_short_server(int port, size_t len)
{
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int one = 1, lfd = socket(AF_INET, SOCK_STREAM, 0);
    pid_t pid;

    CU_ASSERT_FATAL(lfd >= 0);
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    CU_ASSERT_FATAL(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(lfd, 4) == 0);
    fflush(NULL);
    pid = fork();
    if (pid != 0) {
        close(lfd);
        return pid;
    }
    /* the magic, and the first bytes of code 0: what a true answer starts with */
    unsigned char ans[16] = {'F', 'S', 'D', 'R', 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    unsigned char req[64];
    int fd;

    alarm(10);
    fd = accept(lfd, NULL, NULL);
    if (fd < 0 || recv(fd, req, 24, MSG_WAITALL) != 24 ||
        send(fd, ans, len, MSG_NOSIGNAL) != (ssize_t)len)
        exit(1);
    close(fd);
    exit(0);
}

static void test_rdv_short_answer(void)
{
    static const size_t lens[] = {1, 4, 8, 15};

    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        job_t job = job_new(NULL, 5.0);
        pid_t srv = spawn_short_server(job.port, lens[i]);

        CU_ASSERT_EQUAL(
            wait_code(spawn(&job, 1, 2, NULL, FSDP_ERR_BACKEND, "short answer from rank 0")), 0);
        CU_ASSERT_EQUAL(wait_code(srv), 0);
    }
}

/* Without a token on an address other hosts reach, rank 0 says so, once per process. */
static void test_rdv_no_token_warning(void)
{
    fsdp_launch_info_t info = {.rank = 0, .world_size = 2, .master_addr = "0.0.0.0"};
    unsigned char blob[BLOB_BYTES] = {0};

    info.master_port = free_port(AF_INET);
    capture_warnings = 1;
    capture_start();
    CU_ASSERT_EQUAL(fsdp_rendezvous(&info, NULL, 0.05, blob, sizeof(blob)), FSDP_ERR_TIMEOUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(log_text, "no job token is set"));
    capture_start();
    CU_ASSERT_EQUAL(fsdp_rendezvous(&info, "", 0.05, blob, sizeof(blob)), FSDP_ERR_TIMEOUT);
    CU_ASSERT_PTR_NULL(strstr(log_text, "no job token is set"));
    fsdp_log_set_handler(NULL, NULL);
    capture_warnings = 0;
}

static void test_rdv_bad_args(void)
{
    fsdp_launch_info_t info = {
        .rank = 1, .world_size = 2, .master_addr = "127.0.0.1", .master_port = 1};
    unsigned char blob[FSDP_RENDEZVOUS_BLOB_MAX + 1];
    char token[FSDP_RENDEZVOUS_TOKEN_MAX + 2];

    memset(token, 'x', sizeof(token) - 1);
    token[sizeof(token) - 1] = '\0';
    fsdp_log_set_level(FSDP_LOG_OFF);
    CU_ASSERT_EQUAL(fsdp_rendezvous(&info, NULL, 0.0, blob, 16), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT_EQUAL(fsdp_rendezvous(&info, NULL, -1.0, blob, 16), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT_EQUAL(fsdp_rendezvous(&info, NULL, 1.0, blob, 0), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT_EQUAL(fsdp_rendezvous(&info, NULL, 1.0, blob, sizeof(blob)), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT_EQUAL(fsdp_rendezvous(&info, NULL, 1.0, NULL, 16), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT_EQUAL(fsdp_rendezvous(&info, token, 1.0, blob, 16), FSDP_ERR_INVALID_PARAM);
    info.rank = 2;
    CU_ASSERT_EQUAL(fsdp_rendezvous(&info, NULL, 1.0, blob, 16), FSDP_ERR_INVALID_PARAM);
    info.rank = 1;
    info.master_port = 0;
    CU_ASSERT_EQUAL(fsdp_rendezvous(&info, NULL, 1.0, blob, 16), FSDP_ERR_INVALID_PARAM);
    fsdp_log_set_level(FSDP_LOG_WARN);
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"env_single", test_env_single},
        {"env_torchrun", test_env_torchrun},
        {"env_openmpi", test_env_openmpi},
        {"env_slurm", test_env_slurm},
        {"hostlist", test_hostlist},
        {"env_malformed", test_env_malformed},
        {"rdv_four_ranks", test_rdv_four_ranks},
        {"rdv_no_token_world_one", test_rdv_no_token_world_one},
        {"rdv_wrong_token", test_rdv_wrong_token},
        {"rdv_malformed", test_rdv_malformed},
        {"rdv_missing_rank", test_rdv_missing_rank},
        {"rdv_duplicate_rank", test_rdv_duplicate_rank},
        {"rdv_wrong_world", test_rdv_wrong_world},
        {"rdv_ipv6", test_rdv_ipv6},
        {"rdv_flood", test_rdv_flood},
        {"rdv_wrong_token_flood", test_rdv_wrong_token_flood},
        {"rdv_short_answer", test_rdv_short_answer},
        {"rdv_no_token_warning", test_rdv_no_token_warning},
        {"rdv_bad_args", test_rdv_bad_args},
        {NULL, NULL},
    };

    signal(SIGPIPE, SIG_IGN);
    return fsdp_test_run("rendezvous", tests);
}
