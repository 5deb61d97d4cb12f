/* Symmetric ranks: which ranks of an FSDP job run alike, so that the sim's shape mode runs one
 * of each class and stands it for the others (DESIGN.md, "Symmetric ranks"). The classes follow
 * from the layout of the units, which is the core's; the sim is handed only their table
 * (fsdp_sim_params_t.represent).
 *
 * A rank's run depends on its rank only through its shards, its groups and where they lie.
 * Under FSDP1 a shard is group rank x's chunk [x S, (x + 1) S) of a unit's flat parameter
 * (docs/runtime.md section 4): what runs on it is its padding and the pieces of parameters it
 * holds (the optimizer launches one update per piece). Under FSDP2 (fully_shard, section 6)
 * every rank keeps the same padded slot of S rows of each parameter, S = ceil(d0 / W), and
 * all-gathers and reduce-scatters the same sizes; what differs is how many of the slot's rows
 * it owns (S, the rest of d0, or none), of which the optimizer updates the owned elements (one
 * update per parameter it owns rows of). Either way a piece is what a rank holds of a
 * parameter, and two group ranks whose every unit has the same padding and the same pieces
 * (size, place in the shard, and the kind of parameter: 1-d or not, frozen, tied) run the same
 * ops. Without hybrid sharding every group is the world, so classes are the ranks with alike
 * shards. With it the shard group is the node: classes are products of the places in the node
 * with alike shards and of runs of nodes (the last node apart, and the last place, so that the
 * representatives tell a split by node from a split by place); each group of the default hybrid
 * groups (a node, a place across the nodes) then holds the same classes at the same group ranks
 * as any other of its kind, and their representatives all lie in the group of the first rank's
 * representative.
 *
 * Under tensor parallelism (tp > 1, docs/runtime.md section 6) rank r = b span + j tp + t is its
 * tp index t, its place j in its shard group (the dp group of tp index t: the world's ranks of
 * that index, or under hybrid sharding the node's) and, under hybrid sharding, its node b. Its
 * shards depend on j alone: the tp models size every slice from tp alone and refuse a tp that
 * does not divide what they split (heads, kv heads, the FFN, the vocabulary), so each tp index
 * holds parameters of the same shapes and runs the same ops on sequence shards of T / tp rows;
 * which slice of the vocabulary or of the sequence it holds is data, and shape mode prices sizes.
 * Where its groups lie does not tell the tp indices apart either: a tp group is tp consecutive
 * ranks inside a node, and the dp group of any index holds per_node / tp ranks of every node (of
 * its node, under hybrid sharding), the replicate group one of every node; a collective is priced
 * by its group's size, its nodes and the node's ranks sharing the NICs (sim/cost.c), alike for
 * every group of a kind. So the classes are products of the shard group's classes (its ranks with
 * alike shards), of runs of tp indices and, under hybrid sharding, of runs of nodes. The last
 * place, the last tp index and the last node are set apart though alike, so that the simulated
 * ranks' colors tell the laws of the mesh's splits (sim/pg.c) apart: the tp groups (rank / tp)
 * from one group and from the nodes, the dp groups (rank % tp) from the places in the node.
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

/* One parameter of a unit laid out over a group of g: under FSDP1 its extent in the flat
 * parameter, under FSDP2 (per-parameter) its rows d0, the elements of a row and the rows of a
 * rank's slot, S = ceil(d0 / g); and its kind. */
typedef struct lparam {
    size_t off, numel;    /* FSDP1 */
    size_t rows, rest, s; /* FSDP2 */
    int kind;
} lparam_t;

static void lparam_of(const fsdp_param_info_t *info, int g, lparam_t *q)
{
    q->off = info->offset;
    q->numel = info->numel;
    q->rows = info->ndim >= 1 ? (size_t)info->shape[0] : info->numel;
    q->rest = 1;
    for (int d = 1; d < info->ndim; d++)
        q->rest *= (size_t)info->shape[d];
    q->s = fsdp_shard_numel(q->rows, g);
    q->kind = param_kind(info);
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

/* Parameter q's piece on group rank x of a group of g: under FSDP1 in its shard of s elements
 * of the flat parameter; under FSDP2 (pp) the elements of the rows x owns, rows [x S,
 * min((x + 1) S, d0)) as the core lays them out (fsdp_pgroup_layout), at the parameter's slot,
 * which is the same on every rank. */
static piece_t lparam_piece(const lparam_t *q, int pp, int g, size_t s, int x)
{
    piece_t p = {0, 0, 0};
    size_t own, pad;

    if (!pp)
        return piece_at(q->off, q->numel, q->kind, s, x);
    fsdp_shard_extent(q->rows, g, x, &own, &pad);
    if (own * q->rest == 0)
        return p;
    p.n = own * q->rest;
    p.kind = q->kind;
    return p;
}

/* Unit u (of an fs of api pp) shards alike on group ranks x and y of a group of g. */
static int unit_alike(fsdp_unit_t *u, int pp, int g, int x, int y)
{
    size_t total = pp ? 0 : fsdp_unit_flat_numel(u), s = fsdp_shard_numel(total, g), nx, px, ny, py;

    fsdp_shard_extent(total, g, x, &nx, &px);
    fsdp_shard_extent(total, g, y, &ny, &py);
    if (nx != ny || px != py)
        return 0;
    for (int i = 0; i < fsdp_unit_num_params(u); i++) {
        fsdp_param_info_t info;
        lparam_t q;
        piece_t a, b;

        if (fsdp_unit_param_info(u, i, &info) != FSDP_OK)
            return 0;
        lparam_of(&info, g, &q);
        a = lparam_piece(&q, pp, g, s, x);
        b = lparam_piece(&q, pp, g, s, y);
        if (a.n != b.n || a.at != b.at || a.kind != b.kind)
            return 0;
    }
    return 1;
}

/* FSDP2: this rank holds of each parameter of unit u, group rank x of a group of g, what the
 * classes assumed (lparam_piece): fsdp_pgroup_layout laid it out so. */
static int unit_laid_out(fsdp_unit_t *u, int g, int x)
{
    for (int i = 0; i < fsdp_unit_num_params(u); i++) {
        fsdp_param_info_t info;
        lparam_t q;
        piece_t p;

        if (fsdp_unit_param_info(u, i, &info) != FSDP_OK)
            return 0;
        lparam_of(&info, g, &q);
        p = lparam_piece(&q, 1, g, 0, x);
        if (info.numel_in_shard != p.n || (info.in_shard != 0) != (p.n != 0))
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

/* One unit's layout over a group, read once: under FSDP1 its flat size and shard size, under
 * FSDP2 (pp) none (every rank's padded slots are alike, its padding follows from its pieces);
 * and each parameter's (lparam_t). */
typedef struct layout {
    size_t total, s;
    int n, pp;
    lparam_t *p;
} layout_t;

static void layouts_free(layout_t *l, int n)
{
    for (int i = 0; i < n && l != NULL; i++)
        free(l[i].p);
    free(l);
}

/* The layouts of the units with parameters over a group of g, into *l_p; their number, or -1
 * out of memory. */
static int layouts(fsdp_t *fs, int g, layout_t **l_p)
{
    int nu = fsdp_num_units(fs), n = 0, pp = fsdp_api(fs) == FSDP_API_FSDP2;
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
        y->total = pp ? 0 : fsdp_unit_flat_numel(u);
        y->s = fsdp_shard_numel(y->total, g);
        y->n = np;
        y->pp = pp;
        y->p = calloc(np > 0 ? (size_t)np : 1, sizeof(*y->p));
        if (y->p == NULL) {
            layouts_free(l, n);
            return -1;
        }
        for (int j = 0; j < np; j++) {
            fsdp_param_info_t info;
            if (fsdp_unit_param_info(u, j, &info) != FSDP_OK) {
                memset(&info, 0, sizeof(info));
                info.tied_to = -1;
            }
            lparam_of(&info, g, &y->p[j]);
        }
    }
    *l_p = l;
    return n;
}

/* Parameter j's piece on group rank x of a group of g, of the unit laid out as y. */
static piece_t layout_piece(const layout_t *y, int j, int g, int x)
{
    return lparam_piece(&y->p[j], y->pp, g, y->s, x);
}

/* Group ranks x and y shard alike in every unit (unit_alike, from the layouts). */
static int layouts_alike(const layout_t *l, int nl, int g, int x, int y)
{
    for (int i = 0; i < nl; i++) {
        size_t nx, px, ny, py;

        fsdp_shard_extent(l[i].total, g, x, &nx, &px);
        fsdp_shard_extent(l[i].total, g, y, &ny, &py);
        if (nx != ny || px != py)
            return 0;
        for (int j = 0; j < l[i].n; j++) {
            piece_t a = layout_piece(&l[i], j, g, x), b = layout_piece(&l[i], j, g, y);
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
            piece_t p = layout_piece(&l[i], j, g, x);
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
 * from 0, at most 2 per boundary plus 1); their number. Under FSDP1 a boundary of a unit is
 * where a parameter starts or ends in its flat parameter, or where the flat parameter ends. The
 * rank whose shard holds a boundary b is cut from its neighbours: b / s and b / s + 1 start
 * runs. Every other rank of a run then holds no boundary, nor does the run's whole span
 * [first s, (last + 1) s), which so lies within one parameter (or past the end, or in none) in
 * each unit: every rank of the run holds a whole shard of the same parameters (the same pieces,
 * at 0, of the same kinds), or all the same padding. Under FSDP2 a parameter's boundary is the
 * end of its rows d0, in slots of s = S rows: the ranks before d0 / S own S rows, rank d0 / S
 * the rest (maybe none) and the ranks after it none, so the same two cuts leave runs whose ranks
 * own as many rows of every parameter. Runs of one rank are alike trivially. */
static int cuts(const layout_t *l, int nl, int g, int *cut)
{
    int n = 0;

#define CUT(b, s)                                                                                  \
    do {                                                                                           \
        size_t r_ = (b) / (s);                                                                     \
        if (r_ < (size_t)g)                                                                        \
            cut[n++] = (int)r_;                                                                    \
        if (r_ + 1 < (size_t)g)                                                                    \
            cut[n++] = (int)r_ + 1;                                                                \
    } while (0)
    cut[n++] = 0;
    for (int i = 0; i < nl; i++) {
        for (int j = 0; j < l[i].n && l[i].pp; j++) {
            if (l[i].p[j].s != 0) /* else no rows: every rank alike */
                CUT(l[i].p[j].rows, l[i].p[j].s);
        }
        if (l[i].pp || l[i].s == 0) /* an empty flat parameter: every rank alike */
            continue;
        CUT(l[i].total, l[i].s);
        for (int j = 0; j < l[i].n; j++) {
            CUT(l[i].p[j].off, l[i].s);
            CUT(l[i].p[j].off + l[i].p[j].numel, l[i].s);
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
    fsdp_group_t *tpg = fs != NULL ? fsdp_tp_group(fs) : NULL;
    int per_node = ranks_per_node > 0 ? ranks_per_node : world_size, nodes, n = 0;
    int tp = tpg != NULL && tpg->size > 1 ? tpg->size : 1, span, g, hyb = hybrid(strategy);
    int *first = NULL;

    if (fs == NULL || world_size < 1 || per_node < 1 || world_size % per_node != 0 ||
        per_node % tp != 0 || represent == NULL || (unsigned)strategy >= FSDP_STRATEGY_COUNT) {
        fsdp_error("fsdp_symmetric_ranks: invalid arguments (world %d, %d ranks per node, tp %d)",
                   world_size, ranks_per_node, tp);
        return -1;
    }
    nodes = world_size / per_node;
    /* rank r = b span + j tp + t: in block b (under hybrid sharding its node, else the world),
     * group rank j of the shard group of g ranks (the world, the node, or their ranks of tp
     * index t under tensor parallelism), tp index t */
    span = hyb ? per_node : world_size;
    g = span / tp;
    first = malloc((size_t)g * sizeof(*first));
    if (first == NULL)
        goto err_no_memory;
    if (!shards(strategy)) {
        for (int j = 0; j < g; j++)
            first[j] = 0;
    } else if (classes(fs, g, first) != 0) {
        goto err_no_memory;
    }
    /* The last group rank, the last node and the last tp index apart, though alike, so that the
     * simulated ranks tell the laws of the groups apart (sim/pg.c): a split by node from one by
     * place, and under tp the tp groups and dp groups from one group and from the nodes. */
    if ((hyb || tp > 1) && g > 1)
        first[g - 1] = g - 1;
    for (int r = 0; r < world_size; r++) {
        int b = hyb && r / span == nodes - 1 ? nodes - 1 : 0, t = r % tp;
        represent[r] = b * span + first[r % span / tp] * tp + (t == tp - 1 ? t : 0);
    }
    free(first);
    for (int r = 0; r < world_size; r++)
        n += represent[r] == r;
    return n;

err_no_memory:
    free(first);
    fsdp_error("fsdp_symmetric_ranks: out of host memory for %d ranks", world_size);
    return -1;
}

/* Whether g is of a kind symmetric ranks follow: one rank, the world, a node, or under tensor
 * parallelism the dp group of a tp index in either (ranks[k] = ranks[0] + k stride with ranks[0] <
 * stride within a span, the world or a node, of g->size x stride ranks); then a world rank r's
 * place in its group of that kind is r % span / stride. */
static int group_kind(const fsdp_group_t *g, int world, int per_node, int tp, int *stride_p,
                      int *span_p)
{
    int stride = g->size > 1 ? g->ranks[1] - g->ranks[0] : 1, span = g->size * stride;

    if (g->size > 1 && ((stride != 1 && stride != tp) || (span != world && span != per_node) ||
                        g->ranks[0] % span >= stride))
        return 0; /* (a group of one: every rank's place is 0) */
    for (int k = 0; k < g->size; k++)
        if (g->ranks[k] != g->ranks[0] + k * stride)
            return 0;
    *stride_p = stride;
    *span_p = span;
    return 1;
}

fsdp_status_t fsdp_symmetry_check(fsdp_t *fs, const int *represent)
{
    fsdp_dev_t *dev = fsdp_device(fs);
    fsdp_group_t *tpg = fsdp_tp_group(fs), *last = NULL;
    int me = dev->rank, world = dev->world_size, per_node = dev->local_size;
    int tp = tpg != NULL ? tpg->size : 1, pp = fsdp_api(fs) == FSDP_API_FSDP2;
    int stride = 1, span = world, lo = 0, hi = 0;

    if (represent == NULL || dev->stands_for <= 1)
        return FSDP_OK;
    for (int i = 0; i < fsdp_num_units(fs); i++) {
        fsdp_unit_t *u = fsdp_unit_at(fs, i);
        fsdp_group_t *g = fsdp_unit_shard_group(u);

        if (!fsdp_unit_has_params(u) || fsdp_unit_strategy(u) == FSDP_NO_SHARD || g == NULL)
            continue;
        if (g != last && !group_kind(g, world, per_node, tp, &stride, &span)) {
            fsdp_error("rank %d: unit '%s' shards over group %s, which symmetric ranks cannot "
                       "follow",
                       me, fsdp_unit_name(u), g->name);
            return FSDP_ERR_UNSUPPORTED;
        }
        if (g != last) { /* the group ranks of the ranks this one stands for, lo to hi */
            lo = hi = me % span / stride;
            for (int r = 0; r < world; r++) {
                int x = represent[r] == me ? r % span / stride : lo;
                lo = x < lo ? x : lo;
                hi = x > hi ? x : hi;
            }
            last = g;
        }
        /* the pieces were compared rank by rank when the classes were made (from the same
         * layout); here the group must be the kind they were made for, and the ends of the
         * class's group ranks, whose extents bound all between (under FSDP2 the rows a rank
         * owns fall with its group rank), alike; under FSDP2 this rank must also own the rows
         * they assumed */
        if (!unit_alike(u, pp, g->size, lo, hi) || !unit_alike(u, pp, g->size, g->rank, lo) ||
            (pp && !unit_laid_out(u, g->size, g->rank))) {
            fsdp_error("rank %d: unit '%s' shards differently on ranks it stands for; they "
                       "must run apart",
                       me, fsdp_unit_name(u));
            return FSDP_ERR_UNSUPPORTED;
        }
    }
    return FSDP_OK;
}
