/* The sim's rank launcher: one world of world_size ranks, each running the user's function
 * with its own fsdp_sim_dev_t on its own thread (or fiber, fiber.c). */
#include "sim.h"

#include <fsdp/log.h>

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


void fsdp_sim_params_init(fsdp_sim_params_t *params)
{
    if (params == NULL)
        return;
    memset(params, 0, sizeof(*params));
    params->world_size = 1;
    params->ranks_per_node = 0;
    params->timeout_s = 60.0;
    params->mode = FSDP_SIM_DATA;
    params->device_capacity = 0;
    /* a built-in preset cannot fail */
    fsdp_sim_profile_preset(FSDP_SIM_DEFAULT_PROFILE, &params->profile);
}

/* MemAvailable is free memory and what the kernel can reclaim (its page cache). */
size_t fsdp_sim_host_memory_default(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[128];
    double avail = -1.0;

    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        unsigned long long kib;
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
            avail = (double)kib * 1024.0;
            break;
        }
    }
    if (f != NULL)
        fclose(f);
    if (avail < 0.0) {
        long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        if (pages <= 0 || page <= 0)
            return SIZE_MAX;
        avail = (double)pages * (double)page;
    }
    avail *= 0.9;
    return avail >= (double)SIZE_MAX ? SIZE_MAX : (size_t)avail;
}

static fsdp_status_t sim_params_check(const fsdp_sim_params_t *p, fsdp_rank_func_t func)
{
    if (p == NULL) {
        fsdp_error("fsdp_sim_launch: params is NULL; set them up with fsdp_sim_params_init()");
        return FSDP_ERR_INVALID_PARAM;
    }
    if (func == NULL) {
        fsdp_error("fsdp_sim_launch: the rank function is NULL");
        return FSDP_ERR_INVALID_PARAM;
    }
    if (p->world_size < 1 || p->world_size > FSDP_MAX_WORLD) {
        fsdp_error("fsdp_sim_launch: world_size %d is invalid: it must be in [1, %d]",
                   p->world_size, FSDP_MAX_WORLD);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (p->ranks_per_node < 0 ||
        (p->ranks_per_node > 0 && p->world_size % p->ranks_per_node != 0)) {
        fsdp_error("fsdp_sim_launch: ranks_per_node %d must divide world_size %d (0 means "
                   "one node of world_size ranks)", p->ranks_per_node, p->world_size);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (p->fibers != 0 && p->fibers != 1) {
        fsdp_error("fsdp_sim_launch: fibers %d is invalid: 0 (a thread per rank) or 1", p->fibers);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (p->threads < 0) {
        fsdp_error("fsdp_sim_launch: threads %d is invalid: 0 (one per online CPU) or more",
                   p->threads);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (p->workers < 0) {
        fsdp_error("fsdp_sim_launch: workers %d is invalid: 0 (one per online CPU) or more",
                   p->workers);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (!(p->timeout_s > 0.0) || !isfinite(p->timeout_s)) {
        fsdp_error("fsdp_sim_launch: timeout_s %g is invalid: it must be a finite number of "
                   "seconds greater than 0", p->timeout_s);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (p->mode != FSDP_SIM_DATA && p->mode != FSDP_SIM_SHAPE) {
        fsdp_error("fsdp_sim_launch: mode %d is invalid: use FSDP_SIM_DATA (0) or "
                   "FSDP_SIM_SHAPE (1)", (int)p->mode);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (p->holds != NULL && fsdp_sim_holds_world(p->holds) != p->world_size) {
        fsdp_error("fsdp_sim_launch: the holds book is for a world of %d ranks, not %d; make "
                   "one per job with fsdp_sim_holds_create(world_size)",
                   fsdp_sim_holds_world(p->holds), p->world_size);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (p->tp_size < 0 ||
        (p->tp_size > 1 &&
         (p->ranks_per_node > 0 ? p->ranks_per_node : p->world_size) % p->tp_size != 0)) {
        fsdp_error("fsdp_sim_launch: tp_size %d is invalid: 0 or 1 (none), or a divisor of the "
                   "ranks per node",
                   p->tp_size);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (p->represent != NULL) {
        if (p->mode != FSDP_SIM_SHAPE) {
            fsdp_error("fsdp_sim_launch: symmetric ranks (represent) need shape mode: in data "
                       "mode every rank has its own values");
            return FSDP_ERR_INVALID_PARAM;
        }
        for (int r = 0; r < p->world_size; r++) {
            int q = p->represent[r];
            if (q < 0 || q >= p->world_size || p->represent[q] != q) {
                fsdp_error("fsdp_sim_launch: represent[%d] = %d is not a rank that represents "
                           "itself (0..%d with represent[q] == q)",
                           r, q, p->world_size - 1);
                return FSDP_ERR_INVALID_PARAM;
            }
        }
    }
    /* logs which field is wrong */
    return fsdp_sim_profile_check(&p->profile);
}

static fsdp_status_t sim_dev_init(fsdp_sim_world_t *world, int slot, int rank, int stands_for)
{
    fsdp_sim_dev_t *dev = &world->devs[slot];
    int size = world->params.world_size;
    int per_node = world->params.ranks_per_node;
    /* Each rank's shape-mode addresses come from its own slice of the address space, so fake
     * pointers are unique across the world too. */
    uintptr_t span = (UINTPTR_MAX / 2) / ((uintptr_t)size + 1) / 4096 * 4096;
    pthread_condattr_t attr;
    int rc;

    dev->super.ops = fsdp_sim_backend();
    dev->super.rank = rank;
    dev->super.world_size = size;
    dev->super.local_rank = rank % per_node;
    dev->super.local_size = per_node;
    dev->super.no_data = world->params.mode == FSDP_SIM_SHAPE;
    dev->super.stands_for = stands_for;
    dev->super.represent = world->params.represent;
    dev->world = world;
    dev->profile = &world->params.profile;
    if (world->params.holds != NULL)
        dev->prior = fsdp_sim_holds_prior(world->params.holds, rank, &dev->n_prior);
    dev->compute.dev = dev;
    dev->compute.super.id = 0;
    dev->compute.super.priority = 0;
    strcpy(dev->compute.super.name, "compute");
    dev->next_stream_id = 1;
    dev->shape_next = span * ((uintptr_t)rank + 1);
    dev->shape_end = dev->shape_next + span;
    dev->status = FSDP_OK;
    dev->phase = FSDP_SIM_RANK_RUNNING;
    dev->pack_cache.held = &world->host_held;
    dev->pack_cache.limit = world->params.host_memory;
    dev->pack_cache.max_rows = FSDP_SIM_PACK_CACHE_ROWS;
    dev->pack_cache.min_launches = FSDP_SIM_PACK_CACHE_LAUNCHES;
    dev->pack_cache.off = world->params.no_pack_cache || world->params.mode != FSDP_SIM_DATA;
    /* the world's threads shared among its ranks, in data mode */
    dev->threads = 1;
    if (world->params.mode == FSDP_SIM_DATA && world->params.threads > world->n_devs)
        dev->threads = world->params.threads / world->n_devs +
                       (slot < world->params.threads % world->n_devs ? 1 : 0);

    /* Timeouts are wall-clock intervals: a monotonic clock keeps them immune to clock steps. */
    rc = pthread_condattr_init(&attr);
    if (rc == 0) {
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        rc = pthread_cond_init(&dev->cond, &attr);
        pthread_condattr_destroy(&attr);
    }
    if (rc != 0) {
        fsdp_error("rank %d: cannot create a condition variable: %s", rank, strerror(rc));
        return FSDP_ERR_NO_MEMORY;
    }
    return FSDP_OK;
}

static void sim_world_destroy(fsdp_sim_world_t *world, int n_devs)
{
    fsdp_sim_pg_cleanup(world);
    for (int r = 0; r < n_devs; r++) {
        pthread_cond_destroy(&world->devs[r].cond);
        free(world->devs[r].last_error);
        fsdp_sim_acct_cleanup(&world->devs[r]);
    }
    pthread_mutex_destroy(&world->lock);
    free(world->devs);
    free(world->slot);
    free(world);
}

static fsdp_status_t sim_world_create(const fsdp_sim_params_t *params, fsdp_rank_func_t func,
                                      void *arg, fsdp_sim_world_t **world_p)
{
    fsdp_sim_world_t *world;
    fsdp_status_t status;
    int size = params->world_size;
    int *counts = NULL;
    int r, n = 0;

    world = calloc(1, sizeof(*world));
    if (world == NULL)
        goto err_no_memory;
    world->params = *params;
    if (world->params.ranks_per_node == 0)
        world->params.ranks_per_node = size;
    if (world->params.workers == 0 || world->params.threads == 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        int online = cpus > 0 ? (int)(cpus < 1024 ? cpus : 1024) : 1;
        if (world->params.workers == 0)
            world->params.workers = online;
        if (world->params.threads == 0)
            world->params.threads = online;
    }
    if (world->params.host_memory == 0 && world->params.mode == FSDP_SIM_DATA)
        world->params.host_memory = fsdp_sim_host_memory_default();
    world->n_devs = size;
    if (params->represent != NULL) {
        /* the ranks that run, and how many each stands for */
        world->slot = malloc((size_t)size * sizeof(*world->slot));
        counts = calloc((size_t)size, sizeof(*counts));
        if (world->slot == NULL || counts == NULL)
            goto err_free_world;
        world->n_devs = 0;
        for (r = 0; r < size; r++) {
            world->slot[r] = params->represent[r] == r ? world->n_devs++ : -1;
            counts[params->represent[r]]++;
        }
    }
    if (world->params.workers > world->n_devs)
        world->params.workers = world->n_devs;
    if (world->params.fibers && !fsdp_sim_fibers_available()) {
        fsdp_info("fsdp_sim_launch: fibers are not available in this build (sanitizers); "
                  "running one thread per rank");
        world->params.fibers = 0;
    }
    world->func = func;
    world->arg = arg;
    world->n_running = world->n_devs;
    world->devs = calloc((size_t)world->n_devs, sizeof(*world->devs));
    if (world->devs == NULL)
        goto err_free_world;
    if (pthread_mutex_init(&world->lock, NULL) != 0)
        goto err_free_devs;
    for (n = 0, r = 0; r < size; r++) {
        if (world->slot != NULL && world->slot[r] < 0)
            continue;
        status = sim_dev_init(world, n, r, counts != NULL ? counts[r] : 1);
        if (status != FSDP_OK)
            goto err_destroy_devs;
        n++;
    }
    free(counts);
    status = fsdp_sim_pg_init(world);
    if (status != FSDP_OK)
        goto err_destroy_devs_all;
    *world_p = world;
    return FSDP_OK;

err_destroy_devs_all:
    counts = NULL;
err_destroy_devs: /* sim_dev_init and fsdp_sim_pg_init have logged why */
    free(counts);
    for (int i = 0; i < n; i++)
        pthread_cond_destroy(&world->devs[i].cond);
    pthread_mutex_destroy(&world->lock);
    free(world->devs);
    free(world->slot);
    free(world);
    return status;
err_free_devs:
    free(world->devs);
err_free_world:
    free(counts);
    free(world->slot);
    free(world);
err_no_memory:
    fsdp_error("fsdp_sim_launch: out of host memory setting up %d ranks", size);
    return FSDP_ERR_NO_MEMORY;
}

static void *sim_rank_main(void *arg)
{
    fsdp_sim_rank_body(arg);
    return NULL;
}

/* One thread per rank. */
static void sim_run_threads(fsdp_sim_world_t *world)
{
    int size = world->n_devs, started = 0, rc;
    pthread_attr_t attr;

    rc = pthread_attr_init(&attr);
    if (rc == 0) {
        rc = pthread_attr_setstacksize(&attr, fsdp_sim_stack_size(size));
        for (; rc == 0 && started < size; started++) {
            rc = pthread_create(&world->devs[started].thread, &attr, sim_rank_main,
                                &world->devs[started]);
            if (rc != 0)
                break;
        }
        pthread_attr_destroy(&attr);
    }
    if (started < size) {
        /* The ranks already running must not wait forever for ranks that will never come:
         * those count as failed, which fails their collectives at once. */
        fsdp_error("fsdp_sim_launch: cannot start the thread of rank %d of %d: %s; ranks %d.. "
                   "are treated as failed", started, size, strerror(rc), started);
        for (int r = started; r < size; r++) {
            world->devs[r].status = rc == EAGAIN ? FSDP_ERR_NO_MEMORY : FSDP_ERR_INTERNAL;
            fsdp_sim_pg_rank_exit(&world->devs[r], 1);
        }
    }
    for (int r = 0; r < started; r++)
        pthread_join(world->devs[r].thread, NULL);
}

fsdp_status_t fsdp_sim_launch(const fsdp_sim_params_t *params, fsdp_rank_func_t func, void *arg,
                              fsdp_status_t *rank_status)
{
    fsdp_sim_world_t *world;
    fsdp_status_t status, result = FSDP_OK;
    int size;

    status = sim_params_check(params, func);
    if (status != FSDP_OK)
        return status;
    size = params->world_size;
    /* the last run's holds become this run's prior, before any rank reads them */
    if (params->holds != NULL)
        fsdp_sim_holds_begin(params->holds);
    status = sim_world_create(params, func, arg, &world);
    if (status != FSDP_OK)
        return status;

    if (world->params.fibers)
        fsdp_debug("fsdp_sim_launch: %d rank%s as fibers on %d worker thread%s", world->n_devs,
                   world->n_devs > 1 ? "s" : "", world->params.workers,
                   world->params.workers > 1 ? "s" : "");
    else
        fsdp_debug("fsdp_sim_launch: %d rank%s, a thread each, with at most %d kernel thread%s "
                   "each", world->n_devs, world->n_devs > 1 ? "s" : "", world->devs[0].threads,
                   world->devs[0].threads > 1 ? "s" : "");
    if (world->params.fibers) {
        static const fsdp_sim_fiber_calls_t calls = {fsdp_sim_rank_body,
                                                     fsdp_sim_comm_timeout_locked};
        status = fsdp_sim_fibers_run(world, &calls);
        if (status != FSDP_OK) {
            sim_world_destroy(world, world->n_devs);
            return status;
        }
    } else {
        sim_run_threads(world);
    }

    for (int r = 0; r < size; r++) {
        fsdp_sim_dev_t *dev = fsdp_sim_world_dev(
            world, world->params.represent != NULL ? world->params.represent[r] : r);
        status = dev->status;
        /* fsdp_sim_rank_fail() stands for a crash: the rank failed whatever it returned. */
        if (status == FSDP_OK && dev->failed)
            status = FSDP_ERR_RANK_FAILED;
        if (rank_status != NULL)
            rank_status[r] = status;
        if (result == FSDP_OK)
            result = status;
    }
    sim_world_destroy(world, world->n_devs);
    return result;
}

void fsdp_sim_rank_fail(fsdp_dev_t *dev)
{
    fsdp_sim_dev_t *sdev = fsdp_sim_dev(dev);

    if (sdev == NULL) {
        fsdp_error("fsdp_sim_rank_fail: dev is not a rank of the sim backend");
        return;
    }
    fsdp_sim_pg_rank_fail(sdev);
}
