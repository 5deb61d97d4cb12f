/* Ranks as fibers: what lets one laptop simulate a thousand ranks.
 *
 * With a thread per rank, every collective puts all but one rank to sleep and wakes them again:
 * a futex wake and a context switch per rank and round, tens of microseconds each on a
 * virtual machine, which dominates a shape-mode step of a large model. In fiber mode
 * (params.fibers) each rank is a fiber with its own stack, run by a few worker
 * threads from one ready queue; a rank that waits in a collective switches back to its worker
 * (a few hundred nanoseconds) and is queued again when the round ends. The rendezvous itself
 * (pg.c) is unchanged: the same world lock, the same rounds, the same results.
 *
 * A fiber's states, all under the world lock:
 *   READY     in the queue;
 *   RUNNING   on a worker;
 *   YIELDING  gave its worker up, context not saved yet (a wake now is remembered);
 *   PARKED    context saved, waiting for fsdp_sim_fiber_wake_locked;
 *   EXITED    its function returned.
 * A fiber is only resumed once PARKED, so a round that ends while a waiter is still switching
 * out cannot run it twice. Collective timeouts are fired by the launching thread, which scans
 * the parked fibers' deadlines a few times per timeout period.
 *
 * Sanitizers do not follow unannotated stack switches: builds with ASan or TSan run a thread
 * per rank instead (fsdp_sim_fibers_available() is 0).
 */
#include "sim.h"

#include <fsdp/log.h>

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FSDP_SIM_FIBERS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define FSDP_SIM_FIBERS 0
#else
#define FSDP_SIM_FIBERS 1
#endif
#else
#define FSDP_SIM_FIBERS 1
#endif

typedef enum {
    FIBER_READY,
    FIBER_RUNNING,
    FIBER_YIELDING,
    FIBER_PARKED,
    FIBER_EXITED
} fiber_state_t;

/* ---- context switch ----------------------------------------------------------------------
 *
 * On x86-64 a switch saves the callee-saved registers, MXCSR and the x87 control word on the
 * old stack and loads them from the new one: what a function call may not change, and nothing
 * else. glibc's swapcontext also saves and restores the signal mask, a system call per switch
 * (two per collective and rank); no fiber changes its mask, so that call is pure cost. Other
 * targets use ucontext, and so do builds for shadow stacks (-fcf-protection=return), whose
 * return addresses this switch does not keep. */
#if !FSDP_SIM_FIBERS
typedef struct fiber_ctx {
    void *unused;
} fiber_ctx_t;
#elif defined(__x86_64__) && defined(__ELF__) && !(defined(__CET__) && (__CET__ & 2))

typedef struct fiber_ctx {
    void *sp; /* the saved stack pointer while switched out */
} fiber_ctx_t;

/* void fsdp_sim_ctx_switch(void **save_sp, void *load_sp); the frame it leaves behind, from the
 * saved stack pointer up: MXCSR and the x87 control word (8 bytes), r15, r14, r13, r12, rbx,
 * rbp, the return address. A new fiber's frame returns into fsdp_sim_ctx_start, which calls
 * r12(r13). */
void fsdp_sim_ctx_switch(void **save_sp, void *load_sp);
void fsdp_sim_ctx_start(void);
__asm__(".text\n"
        ".globl fsdp_sim_ctx_switch\n"
        ".hidden fsdp_sim_ctx_switch\n"
        ".type fsdp_sim_ctx_switch,@function\n"
        "fsdp_sim_ctx_switch:\n"
        "    endbr64\n"
        "    pushq %rbp\n"
        "    pushq %rbx\n"
        "    pushq %r12\n"
        "    pushq %r13\n"
        "    pushq %r14\n"
        "    pushq %r15\n"
        "    subq $8, %rsp\n"
        "    stmxcsr (%rsp)\n"
        "    fnstcw 4(%rsp)\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    ldmxcsr (%rsp)\n"
        "    fldcw 4(%rsp)\n"
        "    addq $8, %rsp\n"
        "    popq %r15\n"
        "    popq %r14\n"
        "    popq %r13\n"
        "    popq %r12\n"
        "    popq %rbx\n"
        "    popq %rbp\n"
        "    ret\n"
        ".size fsdp_sim_ctx_switch, .-fsdp_sim_ctx_switch\n"
        ".globl fsdp_sim_ctx_start\n"
        ".hidden fsdp_sim_ctx_start\n"
        ".type fsdp_sim_ctx_start,@function\n"
        "fsdp_sim_ctx_start:\n"
        "    endbr64\n"
        "    movq %r13, %rdi\n"
        "    callq *%r12\n"
        "    ud2\n"
        ".size fsdp_sim_ctx_start, .-fsdp_sim_ctx_start\n");

static void ctx_switch(fiber_ctx_t *from, fiber_ctx_t *to)
{
    fsdp_sim_ctx_switch(&from->sp, to->sp);
}

/* A frame for fsdp_sim_ctx_switch to return into fsdp_sim_ctx_start at the top of the stack,
 * 16-byte aligned there as the ABI wants it before a call; entry(arg) must never return. */
static int ctx_make(fiber_ctx_t *ctx, char *stack, size_t size, void (*entry)(void *), void *arg)
{
    uintptr_t top = ((uintptr_t)stack + size) & ~(uintptr_t)15;
    uint64_t *frame = (uint64_t *)(top - 8 * sizeof(uint64_t));
    uint32_t mxcsr;
    uint16_t fpucw;

    __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
    __asm__ volatile("fnstcw %0" : "=m"(fpucw));
    frame[0] = (uint64_t)mxcsr | (uint64_t)fpucw << 32;
    frame[1] = 0;                          /* r15 */
    frame[2] = 0;                          /* r14 */
    frame[3] = (uint64_t)(uintptr_t)arg;   /* r13 */
    frame[4] = (uint64_t)(uintptr_t)entry; /* r12 */
    frame[5] = 0;                          /* rbx */
    frame[6] = 0;                          /* rbp: the end of the frame chain */
    frame[7] = (uint64_t)(uintptr_t)fsdp_sim_ctx_start;
    ctx->sp = frame;
    return 0;
}
#else
typedef struct fiber_ctx {
    ucontext_t uc;
} fiber_ctx_t;

static void ctx_switch(fiber_ctx_t *from, fiber_ctx_t *to)
{
    swapcontext(&from->uc, &to->uc);
}

/* makecontext passes ints: the entry's argument in two halves */
static void ctx_trampoline(unsigned fn_lo, unsigned fn_hi, unsigned lo, unsigned hi)
{
    void (*entry)(void *) = (void (*)(void *))(((uintptr_t)fn_hi << 32) | (uintptr_t)fn_lo);

    entry((void *)(((uintptr_t)hi << 32) | (uintptr_t)lo));
}

static int ctx_make(fiber_ctx_t *ctx, char *stack, size_t size, void (*entry)(void *), void *arg)
{
    uintptr_t p = (uintptr_t)arg, e = (uintptr_t)entry;

    if (getcontext(&ctx->uc) != 0)
        return -1;
    ctx->uc.uc_stack.ss_sp = stack;
    ctx->uc.uc_stack.ss_size = size;
    ctx->uc.uc_link = NULL;
    makecontext(&ctx->uc, (void (*)(void))ctx_trampoline, 4, (unsigned)(e & 0xffffffffu),
                (unsigned)(e >> 32), (unsigned)(p & 0xffffffffu), (unsigned)(p >> 32));
    return 0;
}
#endif

typedef struct fiber_worker {
    fiber_ctx_t ctx; /* the scheduling loop, while a fiber runs */
    pthread_t thread;
    fsdp_sim_sched_t *sched;
} fiber_worker_t;

struct fsdp_sim_fiber {
    fiber_ctx_t ctx;
    char *map; /* the stack's mapping, a guard page first */
    size_t map_size;
    fiber_state_t state;
    int wake_pending;
    fsdp_sim_fiber_t *next; /* in the ready queue */
    fiber_worker_t *worker; /* the one running it */
    fsdp_sim_dev_t *dev;
};

struct fsdp_sim_sched {
    fsdp_sim_world_t *world;
    fsdp_sim_fiber_calls_t calls;
    fsdp_sim_fiber_t *fibers; /* one per rank */
    fiber_worker_t *workers;
    int n_workers;
    fsdp_sim_fiber_t *head, *tail; /* the ready queue */
    int n_exited;
    pthread_cond_t work;  /* workers: a fiber is ready, or all have exited */
    pthread_cond_t watch; /* the launcher: all have exited */
};

int fsdp_sim_fibers_available(void)
{
    return FSDP_SIM_FIBERS;
}

#if FSDP_SIM_FIBERS

static void enqueue_locked(fsdp_sim_sched_t *s, fsdp_sim_fiber_t *f)
{
    f->state = FIBER_READY;
    f->next = NULL;
    if (s->tail != NULL)
        s->tail->next = f;
    else
        s->head = f;
    s->tail = f;
}

void fsdp_sim_fiber_wait_locked(fsdp_sim_dev_t *d, fsdp_sim_call_t *call)
{
    fsdp_sim_fiber_t *f = d->fiber;
    fsdp_sim_world_t *w = d->world;

    while (!call->done) {
        f->state = FIBER_YIELDING;
        pthread_mutex_unlock(&w->lock);
        /* f->worker is only written by the worker that resumes f, before it does */
        ctx_switch(&f->ctx, &f->worker->ctx);
        pthread_mutex_lock(&w->lock);
    }
}

void fsdp_sim_fiber_wake_locked(fsdp_sim_dev_t *d)
{
    fsdp_sim_fiber_t *f = d->fiber;
    fsdp_sim_sched_t *s = d->world->sched;

    if (f->state == FIBER_PARKED) {
        enqueue_locked(s, f);
        pthread_cond_signal(&s->work);
    } else if (f->state == FIBER_YIELDING) {
        f->wake_pending = 1; /* its worker queues it once it is parked */
    }
}

static void fiber_entry(void *arg)
{
    fsdp_sim_fiber_t *f = arg;
    fsdp_sim_world_t *w = f->dev->world;

    w->sched->calls.body(f->dev);
    pthread_mutex_lock(&w->lock);
    f->state = FIBER_EXITED;
    pthread_mutex_unlock(&w->lock);
    ctx_switch(&f->ctx, &f->worker->ctx); /* never comes back */
    abort();
}

static void *worker_main(void *arg)
{
    fiber_worker_t *wk = arg;
    fsdp_sim_sched_t *s = wk->sched;
    fsdp_sim_world_t *w = s->world;
    int size = w->n_devs;

    pthread_mutex_lock(&w->lock);
    for (;;) {
        fsdp_sim_fiber_t *f = s->head;
        if (f == NULL) {
            if (s->n_exited == size)
                break;
            pthread_cond_wait(&s->work, &w->lock);
            continue;
        }
        s->head = f->next;
        if (s->head == NULL)
            s->tail = NULL;
        f->state = FIBER_RUNNING;
        f->worker = wk;
        pthread_mutex_unlock(&w->lock);
        ctx_switch(&wk->ctx, &f->ctx);
        pthread_mutex_lock(&w->lock);
        if (f->state == FIBER_EXITED) {
            if (++s->n_exited == size) {
                pthread_cond_broadcast(&s->work);
                pthread_cond_signal(&s->watch);
            }
            continue;
        }
        /* it yielded: its context is saved, it may be resumed from now on */
        f->state = FIBER_PARKED;
        if (f->wake_pending) {
            f->wake_pending = 0;
            enqueue_locked(s, f);
        }
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

static int timespec_before(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

/* The launcher's watch: fails the rounds of parked fibers whose deadline has passed. */
static void watch_timeouts_locked(fsdp_sim_sched_t *s)
{
    fsdp_sim_world_t *w = s->world;
    double period = w->params.timeout_s / 8.0;
    struct timespec until;

    if (period < 0.01)
        period = 0.01;
    if (period > 1.0)
        period = 1.0;
    while (s->n_exited < w->n_devs) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        until = now;
        until.tv_nsec += (long)(period * 1e9);
        while (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        if (pthread_cond_timedwait(&s->watch, &w->lock, &until) != ETIMEDOUT)
            continue;
        clock_gettime(CLOCK_MONOTONIC, &now);
        for (int r = 0; r < w->n_devs; r++) {
            fsdp_sim_dev_t *d = &w->devs[r];
            if (d->phase == FSDP_SIM_RANK_BLOCKED && d->fiber->state == FIBER_PARKED &&
                d->waiting != NULL && !d->waiting->done && timespec_before(&d->deadline, &now))
                s->calls.timeout_locked(d->waiting_comm);
        }
    }
}

static void sched_free(fsdp_sim_sched_t *s)
{
    for (int r = 0; r < s->world->n_devs; r++) {
        if (s->fibers[r].map != NULL)
            munmap(s->fibers[r].map, s->fibers[r].map_size);
    }
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->watch);
    free(s->fibers);
    free(s->workers);
    free(s);
}

/* A fiber's stack: a guard page below it, reserved lazily (only touched pages cost memory). */
static int fiber_setup(fsdp_sim_fiber_t *f, size_t stack)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    void *map;

    f->map_size = stack + page;
    map = mmap(NULL, f->map_size, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (map == MAP_FAILED)
        return -1;
    f->map = map;
    if (mprotect(f->map, page, PROT_NONE) != 0)
        return -1;
    return ctx_make(&f->ctx, f->map + page, stack, fiber_entry, f);
}

fsdp_status_t fsdp_sim_fibers_run(fsdp_sim_world_t *w, const fsdp_sim_fiber_calls_t *calls)
{
    int size = w->n_devs, n = w->params.workers;
    size_t stack = fsdp_sim_stack_size(size);
    pthread_condattr_t attr;
    fsdp_sim_sched_t *s;
    int started = 0;

    s = calloc(1, sizeof(*s));
    if (s == NULL)
        goto err_no_memory;
    s->world = w;
    s->calls = *calls;
    s->fibers = calloc((size_t)size, sizeof(*s->fibers));
    s->workers = calloc((size_t)n, sizeof(*s->workers));
    if (s->fibers == NULL || s->workers == NULL || pthread_condattr_init(&attr) != 0) {
        free(s->fibers);
        free(s->workers);
        free(s);
        goto err_no_memory;
    }
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&s->watch, &attr);
    pthread_condattr_destroy(&attr);
    pthread_cond_init(&s->work, NULL);
    for (int r = 0; r < size; r++) {
        fsdp_sim_fiber_t *f = &s->fibers[r];
        f->dev = &w->devs[r];
        w->devs[r].fiber = f;
        if (fiber_setup(f, stack) != 0) {
            fsdp_error("fsdp_sim_launch: cannot make the fiber of rank %d of %d: %s", r, size,
                       strerror(errno));
            sched_free(s);
            return FSDP_ERR_NO_MEMORY;
        }
        enqueue_locked(s, f); /* no worker runs yet */
    }
    w->sched = s;

    pthread_mutex_lock(&w->lock);
    for (; started < n; started++) {
        s->workers[started].sched = s;
        if (pthread_create(&s->workers[started].thread, NULL, worker_main, &s->workers[started]) !=
            0)
            break;
    }
    if (started == 0) {
        pthread_mutex_unlock(&w->lock);
        fsdp_error("fsdp_sim_launch: cannot start a worker thread for %d fibers", size);
        w->sched = NULL;
        sched_free(s);
        return FSDP_ERR_NO_MEMORY;
    }
    watch_timeouts_locked(s);
    pthread_mutex_unlock(&w->lock);
    for (int i = 0; i < started; i++)
        pthread_join(s->workers[i].thread, NULL);
    w->sched = NULL;
    sched_free(s);
    return FSDP_OK;

err_no_memory:
    fsdp_error("fsdp_sim_launch: out of host memory setting up %d fibers", size);
    return FSDP_ERR_NO_MEMORY;
}

#else /* !FSDP_SIM_FIBERS */

void fsdp_sim_fiber_wait_locked(fsdp_sim_dev_t *d, fsdp_sim_call_t *call)
{
    (void)d, (void)call;
}

void fsdp_sim_fiber_wake_locked(fsdp_sim_dev_t *d)
{
    (void)d;
}

fsdp_status_t fsdp_sim_fibers_run(fsdp_sim_world_t *w, const fsdp_sim_fiber_calls_t *calls)
{
    (void)w, (void)calls;
    return FSDP_ERR_UNSUPPORTED;
}

#endif
