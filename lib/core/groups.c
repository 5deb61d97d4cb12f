/* The groups fsdp_create makes from the world: hybrid sharding's (shard within a node, replicate
 * across nodes) and tensor parallelism's 2-D mesh (tp within a node, dp across). */
#include "core/core_int.h"

/* Splits the world by world rank / n into *major_p (consecutive ranks) and by world rank % n into
 * *minor_p (the ranks of one place in every run of n); on failure logs that it cannot make
 * `what` and leaves neither. */
static fsdp_status_t split_world(fsdp_dev_t *dev, int n, fsdp_group_t **major_p,
                                 fsdp_group_t **minor_p, const char *what)
{
    fsdp_group_t *world = fsdp_dev_group_world(dev);
    fsdp_status_t status = fsdp_dev_group_split(dev, world, world->rank / n, world->rank, major_p);

    if (status == FSDP_OK)
        status = fsdp_dev_group_split(dev, world, world->rank % n, world->rank, minor_p);
    if (status != FSDP_OK) {
        fsdp_error("rank %d: cannot make the %s: %s", dev->rank, what, fsdp_status_string(status));
        if (*major_p != NULL)
            fsdp_dev_group_destroy(dev, *major_p);
        *major_p = NULL;
    }
    return status;
}

/* PyTorch's default hybrid groups: shard within a node, replicate across nodes over the ranks
 * that share a local rank. Collective over the world. */
fsdp_status_t fsdp_groups_make_hybrid(fsdp_t *fs, fsdp_group_t **pg_p, fsdp_group_t **replicate_p)
{
    fsdp_dev_t *dev = fs->dev;
    fsdp_group_t *world = fsdp_dev_group_world(dev);
    int per_node = fs->cfg.ranks_per_node > 0 ? fs->cfg.ranks_per_node : dev->local_size;

    if (per_node < 1 || world->size % per_node != 0) {
        fsdp_error("rank %d: ranks per node %d must divide the world size %d", dev->rank, per_node,
                   world->size);
        return FSDP_ERR_INVALID_PARAM;
    }
    return split_world(dev, per_node, pg_p, replicate_p, "hybrid shard and replicate groups");
}

/* torchtitan's mesh ["dp_shard", "tp"]: tp groups of consecutive ranks (inside a node, where
 * NVLink carries their activations' collectives), dp groups of the ranks with the same tp index;
 * with replicate_p, ["dp_replicate", "dp_shard", "tp"]: the shard group is the ranks of this
 * node with this tp index, the replicate group those of every node with this local rank.
 * Collective over the world. */
fsdp_status_t fsdp_groups_make_tp(fsdp_t *fs, fsdp_group_t **dp_p, fsdp_group_t **tp_p,
                                  fsdp_group_t **replicate_p)
{
    fsdp_dev_t *dev = fs->dev;
    fsdp_group_t *world = fsdp_dev_group_world(dev);
    const int tp = fs->cfg.tp_size;
    int per_node = fs->cfg.ranks_per_node > 0 ? fs->cfg.ranks_per_node : dev->local_size;
    fsdp_status_t status;

    if (per_node < 1 || world->size % per_node != 0 || per_node % tp != 0) {
        fsdp_error("rank %d: tp %d must divide the ranks per node %d, which must divide the world "
                   "size %d",
                   dev->rank, tp, per_node, world->size);
        return FSDP_ERR_INVALID_PARAM;
    }
    *dp_p = *tp_p = NULL;
    if (replicate_p == NULL)
        return split_world(dev, tp, tp_p, dp_p, "tp and dp groups");
    *replicate_p = NULL;
    status = fsdp_dev_group_split(dev, world, world->rank / tp, world->rank, tp_p);
    if (status == FSDP_OK) /* this node's ranks of this tp index */
        status = fsdp_dev_group_split(dev, world, world->rank / per_node * tp + world->rank % tp,
                                      world->rank, dp_p);
    if (status == FSDP_OK)
        status = fsdp_dev_group_split(dev, world, world->rank % per_node, world->rank, replicate_p);
    if (status != FSDP_OK) {
        fsdp_error("rank %d: cannot make the tp, shard and replicate groups: %s", dev->rank,
                   fsdp_status_string(status));
        if (*tp_p != NULL)
            fsdp_dev_group_destroy(dev, *tp_p);
        if (*dp_p != NULL)
            fsdp_dev_group_destroy(dev, *dp_p);
        *tp_p = *dp_p = NULL;
    }
    return status;
}
