/* The launcher's environment: where this process sits in the job (torchrun, Open MPI, Slurm or
 * a single process), and Slurm's host-list syntax. Built with or without CUDA. */
#include "config.h"

#include <fsdp/gpu.h>
#include <fsdp/log.h>

#include <ctype.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A whole decimal number in [lo, hi]; nothing else (no sign, space or suffix). */
static int parse_int(const char *s, long lo, long hi, int *value_p)
{
    long v = 0;

    if (s == NULL || *s == '\0')
        return -1;
    for (const char *c = s; *c != '\0'; c++) {
        if (!isdigit((unsigned char)*c))
            return -1;
        v = v * 10 + (*c - '0');
        if (v > hi)
            return -1;
    }
    if (v < lo)
        return -1;
    *value_p = (int)v;
    return 0;
}

/* Reads variable name as an integer in [lo, hi]. Absent: *value_p = dflt when required is 0,
 * else an error. */
static fsdp_status_t env_int(const char *name, long lo, long hi, int required, int dflt,
                             int *value_p)
{
    const char *s = getenv(name);

    if (s == NULL) {
        if (required) {
            fsdp_error("%s is not set: the launcher must set it to a whole number in "
                       "[%ld, %ld]",
                       name, lo, hi);
            return FSDP_ERR_INVALID_PARAM;
        }
        *value_p = dflt;
        return FSDP_OK;
    }
    if (parse_int(s, lo, hi, value_p) != 0) {
        fsdp_error("%s=\"%s\" is not allowed: expected a whole number in [%ld, %ld]", name, s, lo,
                   hi);
        return FSDP_ERR_INVALID_PARAM;
    }
    return FSDP_OK;
}

static fsdp_status_t set_addr(fsdp_launch_info_t *info, const char *name, const char *addr)
{
    size_t len = strlen(addr);

    if (len == 0 || len >= sizeof(info->master_addr)) {
        fsdp_error("%s=\"%.64s\" is not allowed: expected a host name or address of 1 to %zu "
                   "characters",
                   name, addr, sizeof(info->master_addr) - 1);
        return FSDP_ERR_INVALID_PARAM;
    }
    memcpy(info->master_addr, addr, len + 1);
    return FSDP_OK;
}

/* MASTER_ADDR and MASTER_PORT; required (when the world has more than one rank) or defaults. */
static fsdp_status_t env_master(fsdp_launch_info_t *info, int required, const char *dflt_addr)
{
    const char *addr = getenv("MASTER_ADDR");
    fsdp_status_t status;

    if (addr == NULL) {
        if (required) {
            fsdp_error("MASTER_ADDR is not set: a %s job of %d ranks needs the host of rank 0 "
                       "in MASTER_ADDR and its port in MASTER_PORT",
                       info->launcher, info->world_size);
            return FSDP_ERR_INVALID_PARAM;
        }
        addr = dflt_addr;
    }
    status = set_addr(info, "MASTER_ADDR", addr);
    if (status != FSDP_OK)
        return status;
    return env_int("MASTER_PORT", 1, 65535, required, FSDP_LAUNCH_DEFAULT_PORT, &info->master_port);
}

/* This node's task count in SLURM_TASKS_PER_NODE ("2(x3),1": 2 tasks on each of 3 nodes, then
 * 1), node counted from 0; the first entry when node < 0. */
static int tasks_per_node(const char *s, int node, int *count_p)
{
    int seen = 0;

    while (*s != '\0') {
        long count = 0, repeat = 1;
        char *end;

        if (!isdigit((unsigned char)*s))
            return -1;
        count = strtol(s, &end, 10);
        s = end;
        if (strncmp(s, "(x", 2) == 0) {
            if (!isdigit((unsigned char)s[2]))
                return -1;
            repeat = strtol(s + 2, &end, 10);
            if (*end != ')' || repeat < 1)
                return -1;
            s = end + 1;
        }
        if (count < 1 || count > INT_MAX)
            return -1;
        if (node < 0 || node < seen + repeat) {
            *count_p = (int)count;
            return 0;
        }
        seen += (int)(repeat > INT_MAX - seen ? INT_MAX - seen : repeat);
        if (*s == ',')
            s++;
        else if (*s != '\0')
            return -1;
    }
    return -1;
}

static fsdp_status_t env_slurm(fsdp_launch_info_t *info)
{
    const char *s, *nodelist;
    int node = -1;
    fsdp_status_t status;

    info->launcher = "slurm";
    status = env_int("SLURM_PROCID", 0, INT_MAX - 1, 1, 0, &info->rank);
    if (status == FSDP_OK)
        status = env_int(getenv("SLURM_NTASKS") == NULL && getenv("SLURM_NPROCS") != NULL
                             ? "SLURM_NPROCS"
                             : "SLURM_NTASKS",
                         1, INT_MAX, 1, 1, &info->world_size);
    if (status == FSDP_OK)
        status = env_int("SLURM_LOCALID", 0, INT_MAX - 1, 0, 0, &info->local_rank);
    if (status == FSDP_OK && getenv("SLURM_NTASKS_PER_NODE") != NULL)
        status = env_int("SLURM_NTASKS_PER_NODE", 1, INT_MAX, 1, 0, &info->local_size);
    else if (status == FSDP_OK && (s = getenv("SLURM_TASKS_PER_NODE")) != NULL) {
        if (getenv("SLURM_NODEID") != NULL)
            status = env_int("SLURM_NODEID", 0, INT_MAX - 1, 1, 0, &node);
        if (status == FSDP_OK && tasks_per_node(s, node, &info->local_size) != 0) {
            fsdp_error("SLURM_TASKS_PER_NODE=\"%s\" is not allowed: expected counts such as "
                       "\"4\" or \"2(x3),1\" covering SLURM_NODEID",
                       s);
            status = FSDP_ERR_INVALID_PARAM;
        }
    }
    if (status != FSDP_OK)
        return status;

    if (getenv("MASTER_ADDR") != NULL)
        return env_master(info, 0, NULL);
    nodelist = getenv("SLURM_JOB_NODELIST");
    if (nodelist == NULL)
        nodelist = getenv("SLURM_NODELIST");
    if (nodelist == NULL) {
        if (info->world_size > 1) {
            fsdp_error("SLURM_JOB_NODELIST is not set: a slurm job of %d ranks needs it, or "
                       "MASTER_ADDR, to find rank 0",
                       info->world_size);
            return FSDP_ERR_INVALID_PARAM;
        }
        return env_master(info, 0, "127.0.0.1");
    }
    status = fsdp_hostlist_get(nodelist, 0, info->master_addr, sizeof(info->master_addr));
    if (status != FSDP_OK) {
        fsdp_error("SLURM_JOB_NODELIST=\"%.128s\" is not allowed: expected a host list such "
                   "as \"node[3-5,7],gpu01\"",
                   nodelist);
        return FSDP_ERR_INVALID_PARAM;
    }
    return env_int("MASTER_PORT", 1, 65535, 0, FSDP_LAUNCH_DEFAULT_PORT, &info->master_port);
}

fsdp_status_t fsdp_launch_env(fsdp_launch_info_t *info_p)
{
    fsdp_launch_info_t info;
    fsdp_status_t status;

    memset(&info, 0, sizeof(info));
    if (getenv("RANK") != NULL) {
        info.launcher = "torchrun";
        status = env_int("RANK", 0, INT_MAX - 1, 1, 0, &info.rank);
        if (status == FSDP_OK)
            status = env_int("WORLD_SIZE", 1, INT_MAX, 1, 1, &info.world_size);
        if (status == FSDP_OK)
            status = env_int("LOCAL_RANK", 0, INT_MAX - 1, 0, info.rank, &info.local_rank);
        if (status == FSDP_OK)
            status = env_int("LOCAL_WORLD_SIZE", 1, INT_MAX, 0, 0, &info.local_size);
        if (status == FSDP_OK)
            status = env_master(&info, info.world_size > 1, "127.0.0.1");
    } else if (getenv("OMPI_COMM_WORLD_RANK") != NULL) {
        info.launcher = "openmpi";
        status = env_int("OMPI_COMM_WORLD_RANK", 0, INT_MAX - 1, 1, 0, &info.rank);
        if (status == FSDP_OK)
            status = env_int("OMPI_COMM_WORLD_SIZE", 1, INT_MAX, 1, 1, &info.world_size);
        if (status == FSDP_OK)
            status = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0, INT_MAX - 1, 1, 0, &info.local_rank);
        if (status == FSDP_OK)
            status = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1, INT_MAX, 1, 0, &info.local_size);
        if (status == FSDP_OK)
            status = env_master(&info, info.world_size > 1, "127.0.0.1");
    } else if (getenv("SLURM_PROCID") != NULL) {
        status = env_slurm(&info);
    } else {
        info.launcher = "single";
        info.world_size = 1;
        info.local_size = 1;
        status = env_master(&info, 0, "127.0.0.1");
    }
    if (status != FSDP_OK)
        return status;

    if (info.rank >= info.world_size) {
        fsdp_error("%s rank %d is not allowed with a world size of %d: expected 0 <= rank < %d",
                   info.launcher, info.rank, info.world_size, info.world_size);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (info.local_size > info.world_size) {
        fsdp_error("%s local size %d is not allowed with a world size of %d: expected at most "
                   "the world size",
                   info.launcher, info.local_size, info.world_size);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (info.local_size > 0 && info.local_rank >= info.local_size) {
        fsdp_error("%s local rank %d is not allowed with a local size of %d: expected 0 <= "
                   "local rank < local size",
                   info.launcher, info.local_rank, info.local_size);
        return FSDP_ERR_INVALID_PARAM;
    }
    *info_p = info;
    return FSDP_OK;
}

/* ---- Slurm host lists ---- */

typedef struct {
    int target;  /* host number wanted */
    int seen;    /* hosts produced so far */
    char *host;  /* output */
    size_t size; /* its size */
    int overflow;
} hostlist_walk_t;

/* Parses a decimal number of at most 9 digits at *s, keeping its width (for zero padding). */
static int range_number(const char **s, long *value_p, int *width_p)
{
    const char *p = *s;
    long v = 0;
    int width = 0;

    while (isdigit((unsigned char)*p) && width < 10) {
        v = v * 10 + (*p - '0');
        p++;
        width++;
    }
    if (width == 0 || width > 9)
        return -1;
    *value_p = v;
    *width_p = width;
    *s = p;
    return 0;
}

/* Produces the hosts of the name pattern [pat, end) with buf[0..len) before it, stopping at
 * walk->target. 1: found, 0: not yet, -1: malformed. */
static int hostlist_expand(const char *pat, const char *end, char *buf, size_t len, size_t cap,
                           hostlist_walk_t *walk)
{
    const char *open = memchr(pat, '[', (size_t)(end - pat));
    const char *close, *p;
    size_t plen;

    if (open == NULL) {
        plen = (size_t)(end - pat);
        if (memchr(pat, ']', plen) != NULL)
            return -1;
        if (walk->seen++ != walk->target)
            return 0;
        if (len + plen + 1 > walk->size) {
            walk->overflow = 1;
            return -1;
        }
        memcpy(walk->host, buf, len);
        memcpy(walk->host + len, pat, plen);
        walk->host[len + plen] = '\0';
        return 1;
    }
    plen = (size_t)(open - pat);
    close = memchr(open, ']', (size_t)(end - open));
    if (close == NULL || memchr(pat, ']', plen) != NULL || len + plen >= cap)
        return -1;
    memcpy(buf + len, pat, plen);
    len += plen;
    p = open + 1;
    for (;;) {
        long lo, hi;
        int width, hi_width, rc;

        if (range_number(&p, &lo, &width) != 0)
            return -1;
        hi = lo;
        if (*p == '-') {
            p++;
            if (range_number(&p, &hi, &hi_width) != 0 || hi < lo)
                return -1;
        }
        if (*p != ',' && p != close)
            return -1;
        for (long v = lo; v <= hi; v++) {
            int n = snprintf(buf + len, cap - len, "%0*ld", width, v);

            if (n < 0 || (size_t)n >= cap - len)
                return -1;
            rc = hostlist_expand(close + 1, end, buf, len + (size_t)n, cap, walk);
            if (rc != 0)
                return rc;
        }
        if (p == close)
            return 0;
        p++;
    }
}

/* The whole list's syntax, without expanding it: non-empty comma-separated names whose bracket
 * groups hold non-empty comma-separated ranges "N" or "N-M" (N <= M). */
static int hostlist_valid(const char *p)
{
    for (;;) {
        const char *name = p;

        while (*p != '\0' && *p != ',') {
            if (*p == ']')
                return 0;
            if (*p++ != '[')
                continue;
            for (;;) {
                long lo, hi;
                int width;

                if (range_number(&p, &lo, &width) != 0)
                    return 0;
                if (*p == '-') {
                    p++;
                    if (range_number(&p, &hi, &width) != 0 || hi < lo)
                        return 0;
                }
                if (*p == ']')
                    break;
                if (*p++ != ',')
                    return 0;
            }
            p++;
        }
        if (p == name)
            return 0;
        if (*p == '\0')
            return 1;
        p++;
    }
}

fsdp_status_t fsdp_hostlist_get(const char *list, int index, char *host, size_t size)
{
    hostlist_walk_t walk = {.target = index, .seen = 0, .host = host, .size = size};
    char buf[FSDP_LAUNCH_ADDR_MAX];
    const char *item = list;

    if (list == NULL || host == NULL || size == 0 || index < 0 || !hostlist_valid(list))
        return FSDP_ERR_INVALID_PARAM;
    while (*item != '\0') {
        const char *end = item;
        int depth = 0, rc;

        /* an item ends at a comma outside brackets */
        while (*end != '\0' && (*end != ',' || depth > 0)) {
            if (*end == '[' && ++depth > 1)
                return FSDP_ERR_INVALID_PARAM;
            if (*end == ']' && --depth < 0)
                return FSDP_ERR_INVALID_PARAM;
            end++;
        }
        if (depth != 0 || end == item)
            return FSDP_ERR_INVALID_PARAM;
        rc = hostlist_expand(item, end, buf, 0, sizeof(buf), &walk);
        if (rc < 0)
            return FSDP_ERR_INVALID_PARAM;
        if (rc > 0)
            return FSDP_OK;
        item = *end == ',' ? end + 1 : end;
        if (*end == ',' && *item == '\0')
            return FSDP_ERR_INVALID_PARAM;
    }
    return FSDP_ERR_NOT_FOUND;
}

fsdp_status_t fsdp_gpu_init_launched(const fsdp_launch_info_t *info, double timeout_s,
                                     fsdp_dev_t **dev_p)
{
    fsdp_gpu_params_t p;
    fsdp_status_t status;

    if (info == NULL || dev_p == NULL) {
        fsdp_error("fsdp_gpu_init_launched: %s is NULL", info == NULL ? "info" : "dev_p");
        return FSDP_ERR_INVALID_PARAM;
    }
    fsdp_gpu_params_init(&p);
    p.rank = info->rank;
    p.world_size = info->world_size;
    p.local_rank = info->local_rank;
    p.local_size = info->local_size;
    p.timeout_s = timeout_s;
    if (p.world_size > 1) {
        if (p.rank == 0) {
            status = fsdp_gpu_unique_id(&p.unique_id);
            if (status != FSDP_OK)
                return status;
        }
        status = fsdp_rendezvous(info, getenv("FSDP_JOB_TOKEN"), timeout_s, p.unique_id.bytes,
                                 sizeof(p.unique_id.bytes));
        if (status != FSDP_OK)
            return status;
    }
    return fsdp_gpu_init(&p, dev_p);
}

typedef struct local_rank {
    int rank, world;
    double timeout_s;
    const fsdp_gpu_unique_id_t *uid;
    fsdp_status_t (*func)(fsdp_dev_t *dev, void *arg);
    void *arg;
    fsdp_status_t status;
} local_rank_t;

static void *local_rank_main(void *arg)
{
    local_rank_t *r = arg;
    fsdp_gpu_params_t p;
    fsdp_dev_t *dev = NULL;

    fsdp_gpu_params_init(&p);
    p.rank = p.local_rank = p.device = r->rank;
    p.world_size = p.local_size = r->world;
    p.timeout_s = r->timeout_s;
    p.unique_id = *r->uid;
    r->status = fsdp_gpu_init(&p, &dev);
    if (r->status == FSDP_OK)
        r->status = r->func(dev, r->arg);
    fsdp_gpu_finalize(dev);
    return NULL;
}

fsdp_status_t fsdp_gpu_launch_local(int world, double timeout_s,
                                    fsdp_status_t (*func)(fsdp_dev_t *dev, void *arg), void *arg)
{
    fsdp_gpu_unique_id_t uid;
    local_rank_t *ranks;
    pthread_t *tids;
    fsdp_status_t status;
    int ndev = fsdp_gpu_device_count(), started = 0;

    if (func == NULL || world < 1 || world > ndev) {
        fsdp_error("fsdp_gpu_launch_local: %s (world %d; this process sees %d device%s)",
                   func == NULL ? "func is NULL" : "one device per rank is needed", world, ndev,
                   ndev == 1 ? "" : "s");
        return func == NULL || ndev > 0 ? FSDP_ERR_INVALID_PARAM : FSDP_ERR_NO_DEVICE;
    }
    status = fsdp_gpu_unique_id(&uid);
    if (status != FSDP_OK)
        return status;
    ranks = calloc((size_t)world, sizeof(*ranks));
    tids = calloc((size_t)world, sizeof(*tids));
    if (ranks == NULL || tids == NULL) {
        free(ranks);
        free(tids);
        return FSDP_ERR_NO_MEMORY;
    }
    for (; started < world; started++) {
        local_rank_t *r = &ranks[started];
        r->rank = started;
        r->world = world;
        r->timeout_s = timeout_s;
        r->uid = &uid;
        r->func = func;
        r->arg = arg;
        if (pthread_create(&tids[started], NULL, local_rank_main, r) != 0) {
            /* the ranks started time out waiting for this one at init */
            fsdp_error("fsdp_gpu_launch_local: cannot start the thread of rank %d", started);
            status = FSDP_ERR_NO_MEMORY;
            break;
        }
    }
    for (int i = 0; i < started; i++) {
        pthread_join(tids[i], NULL);
        if (status == FSDP_OK)
            status = ranks[i].status;
    }
    free(ranks);
    free(tids);
    return status;
}
