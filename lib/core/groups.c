/* Hybrid sharding's default groups: shard within a node, replicate across nodes. */
#include "core/core_int.h"

/* PyTorch's default hybrid groups: shard within a node, replicate across nodes over the ranks
 * that share a local rank. Collective over the world. */
fsdp_status_t fsdp_groups_make_hybrid(fsdp_t *fs, fsdp_group_t **pg_p, fsdp_group_t **replicate_p)
{
    fsdp_dev_t *dev = fs->dev;
    fsdp_group_t *world = fsdp_dev_group_world(dev);
    int per_node = fs->cfg.ranks_per_node > 0 ? fs->cfg.ranks_per_node : dev->local_size;
    fsdp_status_t status;

    if (per_node < 1 || world->size % per_node != 0) {
        fsdp_error("rank %d: ranks per node %d must divide the world size %d", dev->rank, per_node,
                   world->size);
        return FSDP_ERR_INVALID_PARAM;
    }
    status = fsdp_dev_group_split(dev, world, world->rank / per_node, world->rank, pg_p);
    if (status == FSDP_OK)
        status = fsdp_dev_group_split(dev, world, world->rank % per_node, world->rank, replicate_p);
    if (status != FSDP_OK) {
        fsdp_error("rank %d: cannot make the hybrid shard and replicate groups: %s", dev->rank,
                   fsdp_status_string(status));
        if (*pg_p != NULL)
            fsdp_dev_group_destroy(dev, *pg_p);
        *pg_p = NULL;
    }
    return status;
}

/* torchtitan's mesh ["dp_shard", "tp"]: tp groups of consecutive ranks (inside a node, where
 * NVLink carries their activations' collectives), dp groups of the ranks with the same tp index.
 * Collective over the world. */
fsdp_status_t fsdp_groups_make_tp(fsdp_t *fs, fsdp_group_t **dp_p, fsdp_group_t **tp_p)
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
    status = fsdp_dev_group_split(dev, world, world->rank / tp, world->rank, tp_p);
    if (status == FSDP_OK)
        status = fsdp_dev_group_split(dev, world, world->rank % tp, world->rank, dp_p);
    if (status != FSDP_OK) {
        fsdp_error("rank %d: cannot make the tp and dp groups: %s", dev->rank,
                   fsdp_status_string(status));
        if (*tp_p != NULL)
            fsdp_dev_group_destroy(dev, *tp_p);
        *tp_p = NULL;
    }
    return status;
}
