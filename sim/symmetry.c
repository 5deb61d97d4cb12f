/* Symmetric ranks: which ranks of an FSDP job run alike, so that shape mode simulates one of
 * each class (DESIGN.md, "Symmetric ranks").
 *
 * A rank's run depends on its rank only through its shards, its groups and where they lie. A
 * shard is group rank x's chunk [x S, (x + 1) S) of a unit's flat parameter (docs/runtime.md
 * section 4): what runs on it is its padding and the pieces of parameters it holds (the
 * optimizer launches one update per piece). Two group ranks whose every unit has the same
 * padding and the same pieces (size, place in the shard, and the kind of parameter: 1-d or
 * not, frozen, tied) run the same ops. Without hybrid sharding every group is the world, so
 * classes are the ranks with alike shards. With it the shard group is the node: classes are
 * products of the places in the node with alike shards and of runs of nodes (the last node
 * apart, and the last place, so that the representatives tell a split by node from a split by
 * place); each group of the default hybrid groups (a node, a place across the nodes) then holds
 * the same classes at the same group ranks as any other of its kind, and their representatives
 * all lie in the group of the first rank's representative. */
#include "sim.h"

#include <fsdp/log.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct piece {
    size_t n, at;
    int kind;
} piece_t;

/* Parameter i's piece in group rank x's shard of unit u over a group of g ranks. */
static piece_t unit_piece(fsdp_unit_t *u, int i, size_t s, int x)
{
    fsdp_param_info_t info;
    piece_t p = {0, 0, 0};
    size_t lo = (size_t)x * s, hi = lo + s, a, b;

    if (fsdp_unit_param_info(u, i, &info) != FSDP_OK)
        return p;
    a = info.offset > lo ? info.offset : lo;
    b = info.offset + info.numel < hi ? info.offset + info.numel : hi;
    if (a >= b)
        return p;
    p.n = b - a;
    p.at = a - lo;
    p.kind = (info.ndim <= 1) | (!info.requires_grad) << 1 | (info.tied_to >= 0) << 2;
    return p;
}

/* Unit u shards alike on group ranks x and y of a group of g. */
static int unit_alike(fsdp_unit_t *u, int g, int x, int y)
{
    size_t total = fsdp_unit_flat_numel(u), s = fsdp_shard_numel(total, g), nx, px, ny, py;

    fsdp_shard_extent(total, g, x, &nx, &px);
    fsdp_shard_extent(total, g, y, &ny, &py);
    if (nx != ny || px != py)
        return 0;
    for (int i = 0; i < fsdp_unit_num_params(u); i++) {
        piece_t a = unit_piece(u, i, s, x), b = unit_piece(u, i, s, y);
        if (a.n != b.n || a.at != b.at || a.kind != b.kind)
            return 0;
    }
    return 1;
}

static int shards(fsdp_strategy_t s)
{
    return s != FSDP_NO_SHARD;
}

static int hybrid(fsdp_strategy_t s)
{
    return s == FSDP_HYBRID_SHARD || s == FSDP_HYBRID_SHARD_ZERO2;
}

/* Every unit shards alike on group ranks x and y of a group of g. */
static int alike(fsdp_t *fs, int g, int x, int y)
{
    for (int i = 0; i < fsdp_num_units(fs); i++) {
        fsdp_unit_t *u = fsdp_unit_at(fs, i);
        if (fsdp_unit_has_params(u) && !unit_alike(u, g, x, y))
            return 0;
    }
    return 1;
}

/* A hash of group rank x's shards: ranks alike hash alike. */
static uint64_t shard_hash(fsdp_t *fs, int g, int x)
{
    uint64_t h = 1469598103934665603ULL;
#define MIX(v) (h = (h ^ (uint64_t)(v)) * 1099511628211ULL)
    for (int i = 0; i < fsdp_num_units(fs); i++) {
        fsdp_unit_t *u = fsdp_unit_at(fs, i);
        size_t total = fsdp_unit_flat_numel(u), s = fsdp_shard_numel(total, g), n, pad;
        if (!fsdp_unit_has_params(u))
            continue;
        fsdp_shard_extent(total, g, x, &n, &pad);
        MIX(n);
        MIX(pad);
        for (int j = 0; j < fsdp_unit_num_params(u); j++) {
            piece_t p = unit_piece(u, j, s, x);
            if (p.n != 0) {
                MIX(j);
                MIX(p.n);
                MIX(p.at);
                MIX(p.kind);
            }
        }
    }
#undef MIX
    return h;
}

/* first[x]: the first of the g group ranks whose shards are alike with x's. */
static int classes(fsdp_t *fs, int g, int *first)
{
    size_t cap = 16;
    int *slot;
    uint64_t *key;

    while (cap < (size_t)g * 2)
        cap *= 2;
    slot = malloc(cap * sizeof(*slot));
    key = malloc(cap * sizeof(*key));
    if (slot == NULL || key == NULL) {
        free(slot);
        free(key);
        return -1;
    }
    memset(slot, 0xff, cap * sizeof(*slot));
    for (int x = 0; x < g; x++) {
        uint64_t h = shard_hash(fs, g, x);
        size_t i = (size_t)(h ^ (h >> 29)) & (cap - 1);
        while (slot[i] >= 0 && key[i] != h)
            i = (i + 1) & (cap - 1);
        if (slot[i] < 0) {
            slot[i] = x;
            key[i] = h;
        }
        /* a hash is a candidate: the class is what compares alike */
        first[x] = alike(fs, g, slot[i], x) ? slot[i] : x;
    }
    free(slot);
    free(key);
    return 0;
}

int fsdp_sim_symmetric_ranks(fsdp_t *fs, int world_size, int ranks_per_node,
                             fsdp_strategy_t strategy, int *represent)
{
    int per_node = ranks_per_node > 0 ? ranks_per_node : world_size, nodes, n = 0;
    int *first = NULL;

    if (fs == NULL || world_size < 1 || per_node < 1 || world_size % per_node != 0 ||
        represent == NULL || (unsigned)strategy >= FSDP_STRATEGY_COUNT) {
        fsdp_error("fsdp_sim_symmetric_ranks: invalid arguments (world %d, %d ranks per node)",
                   world_size, ranks_per_node);
        return -1;
    }
    nodes = world_size / per_node;
    if (!hybrid(strategy)) {
        /* one group, the world: the ranks with alike shards */
        if (!shards(strategy)) {
            for (int r = 0; r < world_size; r++)
                represent[r] = 0;
            return 1;
        }
        if (classes(fs, world_size, represent) != 0)
            goto err_no_memory;
    } else {
        first = malloc((size_t)per_node * sizeof(*first));
        if (first == NULL || classes(fs, per_node, first) != 0)
            goto err_no_memory;
        if (per_node > 1)
            first[per_node - 1] = per_node - 1;
        for (int r = 0; r < world_size; r++) {
            int node = r / per_node == nodes - 1 ? nodes - 1 : 0;
            represent[r] = node * per_node + first[r % per_node];
        }
        free(first);
    }
    for (int r = 0; r < world_size; r++)
        n += represent[r] == r;
    return n;

err_no_memory:
    free(first);
    fsdp_error("fsdp_sim_symmetric_ranks: out of host memory for %d ranks", world_size);
    return -1;
}

fsdp_status_t fsdp_sim_symmetry_check(fsdp_t *fs, const int *represent)
{
    fsdp_dev_t *dev = fsdp_device(fs);
    int me = dev->rank, world = dev->world_size, per_node = dev->local_size;
    int lo = me, hi = me, lo_place = me % per_node, hi_place = lo_place;

    if (represent == NULL || dev->stands_for <= 1)
        return FSDP_OK;
    for (int r = 0; r < world; r++) {
        if (represent[r] != me)
            continue;
        hi = r;
        lo_place = r % per_node < lo_place ? r % per_node : lo_place;
        hi_place = r % per_node > hi_place ? r % per_node : hi_place;
    }
    for (int i = 0; i < fsdp_num_units(fs); i++) {
        fsdp_unit_t *u = fsdp_unit_at(fs, i);
        fsdp_group_t *g = fsdp_unit_shard_group(u);
        int node_group;

        if (!fsdp_unit_has_params(u) || fsdp_unit_strategy(u) == FSDP_NO_SHARD || g == NULL)
            continue;
        node_group = g->size == per_node && g->ranks[0] % per_node == 0 &&
                     g->ranks[per_node - 1] == g->ranks[0] + per_node - 1;
        if (g->size != world && !node_group) {
            fsdp_error("rank %d: unit '%s' shards over group %s, which symmetric ranks cannot "
                       "follow",
                       me, fsdp_unit_name(u), g->name);
            return FSDP_ERR_UNSUPPORTED;
        }
        /* the pieces were compared rank by rank when the classes were made (from the same
         * layout); here the group must be the kind they were made for, and the ends of the
         * class, whose extents bound all between, alike */
        if (!unit_alike(u, g->size, g->size == world ? lo : lo % per_node,
                        g->size == world ? hi : hi_place) ||
            !unit_alike(u, g->size, g->rank, g->size == world ? lo : lo_place)) {
            fsdp_error("rank %d: unit '%s' shards differently on ranks it stands for; they "
                       "must run apart",
                       me, fsdp_unit_name(u));
            return FSDP_ERR_UNSUPPORTED;
        }
    }
    return FSDP_OK;
}
