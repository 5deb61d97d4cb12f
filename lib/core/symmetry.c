/* Symmetric ranks: which ranks of an FSDP job run alike, so that the sim's shape mode runs one
 * of each class and stands it for the others (DESIGN.md, "Symmetric ranks"). The classes follow
 * from the layout of the units, which is the core's; the sim is handed only their table
 * (fsdp_sim_params_t.represent).
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
 * all lie in the group of the first rank's representative.
 *
 * The classes are derived without visiting every rank (cuts): the ranks whose shard holds a
 * boundary of a unit, and the ranks just after them, cut the group into runs whose ranks hold
 * alike shards by construction, and only each run's first rank is compared; the cost is in the
 * parameters, not in the ranks, apart from writing each rank's class. */
#include <fsdp/backend.h>
#include <fsdp/core.h>

#include "core/core_hidden.h"
#include <fsdp/log.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct piece {
    size_t n, at;
    int kind;
} piece_t;

/* What of a parameter's kind changes the ops run on its pieces: 1-d or not, frozen, tied. */
static int param_kind(const fsdp_param_info_t *info)
{
    return (info->ndim <= 1) | (!info->requires_grad) << 1 | (info->tied_to >= 0) << 2;
}

/* The piece of a parameter of kind, at [off, off + numel) of the flat parameter, in group rank
 * x's shard [x s, (x + 1) s); none (n == 0) when they do not meet. */
static piece_t piece_at(size_t off, size_t numel, int kind, size_t s, int x)
{
    piece_t p = {0, 0, 0};
    size_t lo = (size_t)x * s, hi = lo + s, a, b;

    a = off > lo ? off : lo;
    b = off + numel < hi ? off + numel : hi;
    if (a >= b)
        return p;
    p.n = b - a;
    p.at = a - lo;
    p.kind = kind;
    return p;
}

/* Parameter i's piece in group rank x's shard of unit u, of s elements. */
static piece_t unit_piece(fsdp_unit_t *u, int i, size_t s, int x)
{
    fsdp_param_info_t info;
    piece_t p = {0, 0, 0};

    if (fsdp_unit_param_info(u, i, &info) != FSDP_OK)
        return p;
    return piece_at(info.offset, info.numel, param_kind(&info), s, x);
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

/* One unit's layout, read once: its flat size and shard size over the group, and each
 * parameter's extent and kind in the flat parameter. */
typedef struct layout {
    size_t total, s;
    int n;
    size_t *off, *numel;
    int *kind;
} layout_t;

static void layouts_free(layout_t *l, int n)
{
    for (int i = 0; i < n && l != NULL; i++) {
        free(l[i].off);
        free(l[i].numel);
        free(l[i].kind);
    }
    free(l);
}

/* The layouts of the units with parameters over a group of g, into *l_p; their number, or -1
 * out of memory. */
static int layouts(fsdp_t *fs, int g, layout_t **l_p)
{
    int nu = fsdp_num_units(fs), n = 0;
    layout_t *l = calloc(nu > 0 ? (size_t)nu : 1, sizeof(*l));

    if (l == NULL)
        return -1;
    for (int i = 0; i < nu; i++) {
        fsdp_unit_t *u = fsdp_unit_at(fs, i);
        layout_t *y = &l[n];
        int np = fsdp_unit_num_params(u);

        if (!fsdp_unit_has_params(u))
            continue;
        n++;
        y->total = fsdp_unit_flat_numel(u);
        y->s = fsdp_shard_numel(y->total, g);
        y->n = np;
        y->off = malloc((np > 0 ? (size_t)np : 1) * sizeof(*y->off));
        y->numel = malloc((np > 0 ? (size_t)np : 1) * sizeof(*y->numel));
        y->kind = malloc((np > 0 ? (size_t)np : 1) * sizeof(*y->kind));
        if (y->off == NULL || y->numel == NULL || y->kind == NULL) {
            layouts_free(l, n);
            return -1;
        }
        for (int j = 0; j < np; j++) {
            fsdp_param_info_t info;
            if (fsdp_unit_param_info(u, j, &info) != FSDP_OK) {
                memset(&info, 0, sizeof(info));
                info.tied_to = -1;
            }
            y->off[j] = info.offset;
            y->numel[j] = info.numel;
            y->kind[j] = param_kind(&info);
        }
    }
    *l_p = l;
    return n;
}

/* Parameter j's piece in group rank x's shard of the unit laid out as y (unit_piece). */
static piece_t layout_piece(const layout_t *y, int j, int x)
{
    return piece_at(y->off[j], y->numel[j], y->kind[j], y->s, x);
}

/* Group ranks x and y shard alike in every unit (alike, from the layouts). */
static int layouts_alike(const layout_t *l, int nl, int g, int x, int y)
{
    for (int i = 0; i < nl; i++) {
        size_t nx, px, ny, py;

        fsdp_shard_extent(l[i].total, g, x, &nx, &px);
        fsdp_shard_extent(l[i].total, g, y, &ny, &py);
        if (nx != ny || px != py)
            return 0;
        for (int j = 0; j < l[i].n; j++) {
            piece_t a = layout_piece(&l[i], j, x), b = layout_piece(&l[i], j, y);
            if (a.n != b.n || a.at != b.at || a.kind != b.kind)
                return 0;
        }
    }
    return 1;
}

/* A hash of group rank x's shards: ranks alike hash alike. */
static uint64_t layouts_hash(const layout_t *l, int nl, int g, int x)
{
    uint64_t h = 1469598103934665603ULL;
#define MIX(v) (h = (h ^ (uint64_t)(v)) * 1099511628211ULL)
    for (int i = 0; i < nl; i++) {
        size_t n, pad;
        fsdp_shard_extent(l[i].total, g, x, &n, &pad);
        MIX(n);
        MIX(pad);
        for (int j = 0; j < l[i].n; j++) {
            piece_t p = layout_piece(&l[i], j, x);
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

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* The cuts of the group ranks 0..g-1 into runs that shard alike, into cut (sorted, distinct,
 * from 0, at most 2 per boundary plus 1); their number. A boundary of a unit is where a
 * parameter starts or ends in its flat parameter, or where the flat parameter ends. The rank
 * whose shard holds a boundary b is cut from its neighbours: b / s and b / s + 1 start runs.
 * Every other rank of a run then holds no boundary, nor does the run's whole span
 * [first s, (last + 1) s), which so lies within one parameter (or past the end, or in
 * none) in each unit: every rank of the run holds a whole shard of the same parameters (the
 * same pieces, at 0, of the same kinds), or all the same padding. Runs of one rank are alike
 * trivially. */
static int cuts(const layout_t *l, int nl, int g, int *cut)
{
    int n = 0;

#define CUT(b)                                                                                     \
    do {                                                                                           \
        size_t r_ = (b) / l[i].s;                                                                  \
        if (r_ < (size_t)g)                                                                        \
            cut[n++] = (int)r_;                                                                    \
        if (r_ + 1 < (size_t)g)                                                                    \
            cut[n++] = (int)r_ + 1;                                                                \
    } while (0)
    cut[n++] = 0;
    for (int i = 0; i < nl; i++) {
        if (l[i].s == 0) /* an empty flat parameter: every rank alike */
            continue;
        CUT(l[i].total);
        for (int j = 0; j < l[i].n; j++) {
            CUT(l[i].off[j]);
            CUT(l[i].off[j] + l[i].numel[j]);
        }
    }
#undef CUT
    qsort(cut, (size_t)n, sizeof(*cut), cmp_int);
    int m = 0;
    for (int k = 0; k < n; k++)
        if (m == 0 || cut[k] != cut[m - 1])
            cut[m++] = cut[k];
    return m;
}

/* first[x]: the first of the g group ranks whose shards are alike with x's. The ranks are cut
 * into runs alike by construction (cuts), so only the first rank of each run is compared, and
 * the rest are filled in: no rank is visited but to write its class. */
static int classes(fsdp_t *fs, int g, int *first)
{
    layout_t *l = NULL;
    int nl = layouts(fs, g, &l), ncut = 0, nbound = 1, *cut = NULL, *slot = NULL;
    uint64_t *key = NULL;
    size_t cap = 16;

    if (nl < 0)
        return -1;
    for (int i = 0; i < nl; i++)
        nbound += 2 * l[i].n + 1;
    cut = malloc((size_t)nbound * 2 * sizeof(*cut));
    if (cut == NULL)
        goto err;
    ncut = cuts(l, nl, g, cut);
    while (cap < (size_t)ncut * 2)
        cap *= 2;
    slot = malloc(cap * sizeof(*slot));
    key = malloc(cap * sizeof(*key));
    if (slot == NULL || key == NULL)
        goto err;
    memset(slot, 0xff, cap * sizeof(*slot));
    for (int k = 0; k < ncut; k++) {
        int x = cut[k], end = k + 1 < ncut ? cut[k + 1] : g, rep;
        uint64_t h = layouts_hash(l, nl, g, x);
        size_t i = (size_t)(h ^ (h >> 29)) & (cap - 1);

        /* the classes so far with this hash, in the order found: the first alike is x's */
        while (slot[i] >= 0 && !(key[i] == h && layouts_alike(l, nl, g, slot[i], x)))
            i = (i + 1) & (cap - 1);
        if (slot[i] < 0) {
            slot[i] = x;
            key[i] = h;
        }
        rep = slot[i];
        for (int y = x; y < end; y++)
            first[y] = rep;
    }
    free(slot);
    free(key);
    free(cut);
    layouts_free(l, nl);
    return 0;

err:
    free(slot);
    free(key);
    free(cut);
    layouts_free(l, nl);
    return -1;
}

int fsdp_symmetric_ranks(fsdp_t *fs, int world_size, int ranks_per_node, fsdp_strategy_t strategy,
                         int *represent)
{
    int per_node = ranks_per_node > 0 ? ranks_per_node : world_size, nodes, n = 0;
    int *first = NULL;

    if (fs == NULL || world_size < 1 || per_node < 1 || world_size % per_node != 0 ||
        represent == NULL || (unsigned)strategy >= FSDP_STRATEGY_COUNT) {
        fsdp_error("fsdp_symmetric_ranks: invalid arguments (world %d, %d ranks per node)",
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
    fsdp_error("fsdp_symmetric_ranks: out of host memory for %d ranks", world_size);
    return -1;
}

fsdp_status_t fsdp_symmetry_check(fsdp_t *fs, const int *represent)
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
