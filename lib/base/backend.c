/* Checks on backend ops tables and on the arguments of the collectives before a slot is called,
 * and helpers built only from the slots. */
#include <fsdp/backend.h>
#include <fsdp/log.h>

#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The slot list covers the struct: after `size` and `name`, the slots and nothing else. */
#define FSDP_COUNT_SLOT_(slot) +1
_Static_assert(sizeof(fsdp_backend_ops_t) ==
                   offsetof(fsdp_backend_ops_t, segment_alloc) +
                       (0 FSDP_BACKEND_SLOTS(FSDP_COUNT_SLOT_)) * sizeof(void (*)(void)),
               "fsdp_backend_ops_t has a slot that FSDP_BACKEND_SLOTS does not list");
#undef FSDP_COUNT_SLOT_

fsdp_status_t fsdp_backend_check(const fsdp_backend_ops_t *ops)
{
    if (ops == NULL) {
        fsdp_error("backend ops table is NULL");
        return FSDP_ERR_INVALID_PARAM;
    }
    if (ops->size != sizeof(*ops)) {
        fsdp_error("backend '%s' was built with an ops table of %zu bytes, this library expects "
                   "%zu", ops->name ? ops->name : "?", ops->size, sizeof(*ops));
        return FSDP_ERR_INVALID_PARAM;
    }
#define FSDP_CHECK_SLOT_(slot)                                                                     \
    if (ops->slot == NULL) {                                                                       \
        fsdp_error("backend '%s' leaves slot '%s' of its ops table NULL",                          \
                   ops->name ? ops->name : "?", #slot);                                            \
        return FSDP_ERR_INVALID_PARAM;                                                             \
    }
    FSDP_BACKEND_SLOTS(FSDP_CHECK_SLOT_)
#undef FSDP_CHECK_SLOT_
    return FSDP_OK;
}

static const char *coll_name(fsdp_coll_kind_t kind)
{
    static const char *const names[] = {"all_gather", "reduce_scatter", "all_reduce",
                                        "broadcast",  "barrier",        "group_split"};
    return (unsigned)kind < sizeof(names) / sizeof(names[0]) ? names[kind] : "collective";
}

fsdp_status_t fsdp_dev_coll_check(const fsdp_dev_t *dev, fsdp_coll_kind_t kind,
                                  const fsdp_group_t *group, int null_buf, size_t count,
                                  fsdp_dtype_t dtype, fsdp_reduce_op_t op, int root)
{
    const char *name = coll_name(kind);
    size_t es = fsdp_dtype_size(dtype);

    if (group == NULL) {
        fsdp_error("rank %d: %s: the group is NULL; pass one of this rank's groups", dev->rank,
                   name);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (kind == FSDP_COLL_GROUP_SPLIT && null_buf) {
        fsdp_error("rank %d: group_split: group_p is NULL", dev->rank);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (kind == FSDP_COLL_BARRIER || kind == FSDP_COLL_GROUP_SPLIT)
        return FSDP_OK;
    if (es == 0) {
        fsdp_error("rank %d: %s on group %s: dtype %d is not one of f32, bf16, f16, i32", dev->rank,
                   name, group->name, (int)dtype);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (kind == FSDP_COLL_REDUCE_SCATTER || kind == FSDP_COLL_ALL_REDUCE) {
        if ((int)op < 0 || op >= FSDP_REDUCE_COUNT) {
            fsdp_error("rank %d: %s on group %s: reduce op %d is not sum, avg or max", dev->rank,
                       name, group->name, (int)op);
            return FSDP_ERR_INVALID_PARAM;
        }
        if (op == FSDP_REDUCE_AVG && dtype == FSDP_DTYPE_I32) {
            fsdp_error("rank %d: %s on group %s: avg needs a floating-point dtype, not i32",
                       dev->rank, name, group->name);
            return FSDP_ERR_INVALID_PARAM;
        }
    }
    if (kind == FSDP_COLL_BROADCAST && (root < 0 || root >= group->size)) {
        fsdp_error("rank %d: broadcast on group %s: root %d is not a group rank in [0, %d)",
                   dev->rank, group->name, root, group->size);
        return FSDP_ERR_INVALID_PARAM;
    }
    /* The largest buffer (all_gather's recv, reduce_scatter's send) is count * size elements. */
    if (count > SIZE_MAX / es / (size_t)group->size) {
        fsdp_error("rank %d: %s on group %s: count %zu overflows a buffer size", dev->rank, name,
                   group->name, count);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (count > 0 && !dev->no_data && null_buf) {
        fsdp_error("rank %d: %s on group %s: NULL buffer for count %zu", dev->rank, name,
                   group->name, count);
        return FSDP_ERR_INVALID_PARAM;
    }
    return FSDP_OK;
}

fsdp_status_t fsdp_stream_wait_stream(fsdp_dev_t *dev, fsdp_stream_t *waiter, fsdp_stream_t *waitee)
{
    fsdp_event_t *ev;
    fsdp_status_t status;

    if (waiter == waitee)
        return FSDP_OK;
    status = fsdp_dev_event_create(dev, &ev);
    if (status != FSDP_OK)
        return status;
    status = fsdp_dev_event_record(dev, ev, waitee);
    if (status == FSDP_OK)
        status = fsdp_dev_stream_wait_event(dev, waiter, ev);
    fsdp_dev_event_destroy(dev, ev);
    return status;
}

void fsdp_group_split_name(char name[FSDP_GROUP_NAME_SIZE], const char *parent, unsigned round,
                           int color)
{
    char full[FSDP_GROUP_NAME_SIZE + 64];
    uint64_t h = 14695981039346656037ull; /* FNV-1a, 64 bits */
    int n;

    if (round <= 1)
        n = snprintf(full, sizeof(full), "%s/split(%d)", parent, color);
    else
        n = snprintf(full, sizeof(full), "%s/split%u(%d)", parent, round, color);
    if (n >= 0 && (size_t)n < FSDP_GROUP_NAME_SIZE) {
        memcpy(name, full, (size_t)n + 1);
        return;
    }
    /* too long for the field (a parent name is at most FSDP_GROUP_NAME_SIZE - 1 bytes, so
     * `full` held all of it) */
    for (const unsigned char *p = (const unsigned char *)full; *p != '\0'; p++) {
        h ^= *p;
        h *= 1099511628211ull;
    }
    snprintf(name, FSDP_GROUP_NAME_SIZE, "g:%016" PRIx64, h);
}
