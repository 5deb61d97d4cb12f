/* The book of the SMs each rank's collectives held over a run, kept for the next run of the same
 * job (fsdp_sim_params_t.holds): per rank, what the last run recorded (the prior, read by the
 * pricing of this run's kernels) and what this run records. Each rank's thread touches only its
 * own rank's records; the launch swaps them before any rank runs.
 */
#include "sim.h"

#include <stdlib.h>
#include <string.h>

typedef struct hold_list {
    fsdp_sim_hold_rec_t *v;
    size_t n, cap;
} hold_list_t;

struct fsdp_sim_holds {
    int world_size;
    hold_list_t *prior, *current; /* world_size each */
};

fsdp_sim_holds_t *fsdp_sim_holds_create(int world_size)
{
    fsdp_sim_holds_t *h;

    if (world_size < 1)
        return NULL;
    h = calloc(1, sizeof(*h));
    if (h == NULL)
        return NULL;
    h->world_size = world_size;
    h->prior = calloc((size_t)world_size, sizeof(*h->prior));
    h->current = calloc((size_t)world_size, sizeof(*h->current));
    if (h->prior == NULL || h->current == NULL) {
        fsdp_sim_holds_destroy(h);
        return NULL;
    }
    return h;
}

void fsdp_sim_holds_destroy(fsdp_sim_holds_t *h)
{
    if (h == NULL)
        return;
    for (int r = 0; r < h->world_size; r++) {
        if (h->prior != NULL)
            free(h->prior[r].v);
        if (h->current != NULL)
            free(h->current[r].v);
    }
    free(h->prior);
    free(h->current);
    free(h);
}

size_t fsdp_sim_holds_count(const fsdp_sim_holds_t *h, int rank)
{
    if (h == NULL || rank < 0 || rank >= h->world_size)
        return 0;
    /* between launches the last run's records are the current ones */
    return h->current[rank].n;
}

int fsdp_sim_holds_world(const fsdp_sim_holds_t *h)
{
    return h->world_size;
}

void fsdp_sim_holds_begin(fsdp_sim_holds_t *h)
{
    hold_list_t *t = h->prior;

    h->prior = h->current;
    h->current = t;
    for (int r = 0; r < h->world_size; r++)
        h->current[r].n = 0;
}

void fsdp_sim_holds_repeat(fsdp_sim_holds_t *h)
{
    hold_list_t *t;

    if (h == NULL)
        return;
    /* the next launch swaps them back: its prior is the last run's prior */
    t = h->prior;
    h->prior = h->current;
    h->current = t;
}

const fsdp_sim_hold_rec_t *fsdp_sim_holds_prior(const fsdp_sim_holds_t *h, int rank, size_t *n_p)
{
    *n_p = h->prior[rank].n;
    return h->prior[rank].n > 0 ? h->prior[rank].v : NULL;
}

int fsdp_sim_holds_record(fsdp_sim_holds_t *h, int rank, const fsdp_sim_hold_rec_t *rec)
{
    hold_list_t *l = &h->current[rank];

    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 256;
        fsdp_sim_hold_rec_t *v = realloc(l->v, cap * sizeof(*v));
        if (v == NULL)
            return -1;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = *rec;
    return 0;
}
