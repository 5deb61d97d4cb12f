/* libfsdp: the sim backend.
 *
 * Ranks are threads of one process. A collective is a rendezvous of the group's ranks: the last
 * to arrive checks that every call matches and computes the result in rank order, so results
 * never depend on thread timing. Mismatched calls, a rank that never arrives or a rank that has
 * failed make the collective return an error on every waiting rank, naming each rank's call;
 * the rendezvous never hangs (a deadlock is detected at once, anything else after the timeout).
 */
#ifndef FSDP_SIM_H
#define FSDP_SIM_H

#include <fsdp/backend.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FSDP_SIM_DATA = 0, /* real buffers, real math */
    FSDP_SIM_SHAPE = 1 /* no buffers, bytes and time only */
} fsdp_sim_mode_t;

typedef struct fsdp_sim_params {
    int world_size;         /* >= 1; default 1 */
    int ranks_per_node;     /* 0 (default) = world_size; must divide world_size */
    double timeout_s;       /* collective timeout in (wall) seconds; default 60 */
    fsdp_sim_mode_t mode;   /* default FSDP_SIM_DATA */
    size_t device_capacity; /* bytes of device memory per rank; 0 (default) = unlimited */
} fsdp_sim_params_t;

void fsdp_sim_params_init(fsdp_sim_params_t *params);

/* The work of one rank. `dev` is the rank's own backend context. */
typedef fsdp_status_t (*fsdp_rank_func_t)(fsdp_dev_t *dev, void *arg);

/* Runs `func` on world_size threads and waits for all of them. A rank whose function returns
 * an error is marked failed: collectives that wait for it fail at once. Returns FSDP_OK when all
 * ranks succeeded, else the status of the lowest failing rank. If rank_status is not NULL it
 * receives each rank's status (world_size entries). */
fsdp_status_t fsdp_sim_launch(const fsdp_sim_params_t *params, fsdp_rank_func_t func, void *arg,
                              fsdp_status_t *rank_status);

/* The sim ops table (for code that wants to wrap or inspect it). */
const fsdp_backend_ops_t *fsdp_sim_backend(void);

/* The message of the last error this rank's backend reported ("" if none). Valid until the
 * next failing call on the same rank. */
const char *fsdp_sim_last_error(fsdp_dev_t *dev);

/* Marks this rank failed (as if its function had returned an error): peers waiting in a
 * collective with it return FSDP_ERR_RANK_FAILED. */
void fsdp_sim_rank_fail(fsdp_dev_t *dev);

/* 1 when the dev belongs to the sim backend. */
int fsdp_dev_is_sim(const fsdp_dev_t *dev);

#ifdef __cplusplus
}
#endif
#endif
