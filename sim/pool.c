/* A rank's worker threads for data mode (sim_kernels.h).
 *
 * A job is `nparts` calls fn(arg, part); the caller and the workers take parts in index order
 * from one counter under the pool's lock, so which thread runs a part depends on timing, but
 * what a part computes does not: the callers split their work by a partition fixed by the
 * shapes, with no sum across parts, and the results are the same bits whoever runs them.
 *
 * Synchronization is one mutex and two condition variables: workers sleep on `start` until the
 * job number changes; the caller sleeps on `done` until every part of its job has returned. A
 * worker that wakes late finds no part left and sleeps again; it never touches a job's
 * arguments outside the lock, except through the part it took, which the caller waits for.
 */
#include "config.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include <fsdp/log.h>

#include "sim_kernels.h"

struct fsdp_sim_pool {
    int threads;         /* the caller and threads - 1 workers */
    pthread_t *workers;  /* threads - 1 */
    int started;         /* workers running */
    pthread_mutex_t lock;
    pthread_cond_t start; /* a new job, or stop */
    pthread_cond_t done;  /* the last part of the job returned */
    /* the job, under lock */
    uint64_t job;        /* number of the current job */
    fsdp_sim_pool_fn_t fn;
    void *arg;
    size_t nparts, next, finished;
    int stop;
};

/* Takes and runs parts of the current job until none is left; called and returns with the
 * lock held. */
static void pool_work_locked(fsdp_sim_pool_t *pool)
{
    while (pool->next < pool->nparts) {
        size_t part = pool->next++;
        fsdp_sim_pool_fn_t fn = pool->fn;
        void *arg = pool->arg;

        pthread_mutex_unlock(&pool->lock);
        fn(arg, part);
        pthread_mutex_lock(&pool->lock);
        if (++pool->finished == pool->nparts)
            pthread_cond_signal(&pool->done);
    }
}

static void *pool_worker(void *p)
{
    fsdp_sim_pool_t *pool = p;
    uint64_t seen = 0;

    pthread_mutex_lock(&pool->lock);
    for (;;) {
        while (!pool->stop && pool->job == seen)
            pthread_cond_wait(&pool->start, &pool->lock);
        if (pool->stop)
            break;
        seen = pool->job;
        pool_work_locked(pool);
    }
    pthread_mutex_unlock(&pool->lock);
    return NULL;
}

fsdp_sim_pool_t *fsdp_sim_pool_create(int threads)
{
    fsdp_sim_pool_t *pool;

    if (threads <= 1)
        return NULL;
    pool = calloc(1, sizeof(*pool));
    if (pool == NULL)
        return NULL;
    pool->workers = calloc((size_t)threads - 1, sizeof(*pool->workers));
    if (pool->workers == NULL || pthread_mutex_init(&pool->lock, NULL) != 0) {
        free(pool->workers);
        free(pool);
        return NULL;
    }
    if (pthread_cond_init(&pool->start, NULL) != 0) {
        pthread_mutex_destroy(&pool->lock);
        free(pool->workers);
        free(pool);
        return NULL;
    }
    if (pthread_cond_init(&pool->done, NULL) != 0) {
        pthread_cond_destroy(&pool->start);
        pthread_mutex_destroy(&pool->lock);
        free(pool->workers);
        free(pool);
        return NULL;
    }
    for (; pool->started < threads - 1; pool->started++)
        if (pthread_create(&pool->workers[pool->started], NULL, pool_worker, pool) != 0)
            break;
    pool->threads = pool->started + 1;
    if (pool->started < threads - 1)
        fsdp_info("sim: started %d of %d worker threads", pool->started, threads - 1);
    return pool;
}

void fsdp_sim_pool_destroy(fsdp_sim_pool_t *pool)
{
    if (pool == NULL)
        return;
    pthread_mutex_lock(&pool->lock);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->start);
    pthread_mutex_unlock(&pool->lock);
    for (int i = 0; i < pool->started; i++)
        pthread_join(pool->workers[i], NULL);
    pthread_cond_destroy(&pool->done);
    pthread_cond_destroy(&pool->start);
    pthread_mutex_destroy(&pool->lock);
    free(pool->workers);
    free(pool);
}

int fsdp_sim_pool_threads(const fsdp_sim_pool_t *pool)
{
    return pool == NULL ? 1 : pool->threads;
}

void fsdp_sim_pool_run(fsdp_sim_pool_t *pool, size_t nparts, fsdp_sim_pool_fn_t fn, void *arg)
{
    if (pool == NULL || pool->threads <= 1 || nparts <= 1) {
        for (size_t i = 0; i < nparts; i++)
            fn(arg, i);
        return;
    }
    pthread_mutex_lock(&pool->lock);
    pool->fn = fn;
    pool->arg = arg;
    pool->nparts = nparts;
    pool->next = 0;
    pool->finished = 0;
    pool->job++;
    pthread_cond_broadcast(&pool->start);
    pool_work_locked(pool);
    while (pool->finished < pool->nparts)
        pthread_cond_wait(&pool->done, &pool->lock);
    pthread_mutex_unlock(&pool->lock);
}
