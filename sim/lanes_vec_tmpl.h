/* One instance of the vectorized host replay of the fused attention's rows (the loops
 * attention_fwd and attention_bwd of elem_vec.c's vector path), included after elem_vec_tmpl.h
 * with the same definitions (EV_W, EV_SUFFIX, EV_ATTR and the vector types and helpers of that
 * instance).
 *
 * The scalar replay (llama_bodies.h) runs the 32 lanes of a warp one after the other; here the
 * 32 lanes are FSDP_KB_LANES / EV_W vectors: row element e goes to lane e % 32, that is lane
 * (e % 32) % EV_W of vector (e % 32) / EV_W, and each lane adds its elements in index order, as
 * fsdp_kb_dot_walk does. The butterfly of fsdp_kb_lanes_sum_n adds whole vectors for the levels
 * of EV_W lanes or more and shuffled halves of vector 0 below (the lanes that no level reads end
 * with other values, which nothing reads). The accumulators of a row (head_dim elements) are
 * head_dim / EV_W vectors. The keys (queries for dk and dv) are taken EV_W at a time: their
 * scores are EV_W dot products (tdots: from keys transposed, a lane per key), their exps one
 * vector expf (the running maximum of the online softmax is followed key by key first, so each
 * lane's exp has the operands of the scalar body's), and they are added into the accumulators
 * one at a time, in order. Every lane thus does the scalar body's IEEE operations on the same
 * operands in the same order. The forward walks two query rows of a head together
 * (attn_fwd_rown), the backward's passes 1 and 2 run as one walk (attn_bwd_unit).
 *
 * NaNs: with NaN inputs, which of two NaN operands comes out may differ from the scalar body's
 * compiled order (elem_vec_tmpl.h). A NaN that reaches no output changes nothing, so a row is
 * computed into local vectors first, and a row whose outputs hold a NaN is computed again by the
 * scalar loop's one compiled copy (fsdp_sim_pass_range, the scalar path's), which then writes
 * it. The check takes f32 and bf16 rows whose head_dim is a multiple of 4; an instance of wider
 * vectors hands those that are no multiple of its EV_W to the 4 lanes' (EV_NARROWER). */

#define EV_NL (FSDP_KB_LANES / EV_W)       /* vectors of a row's 32 lanes */
#define EV_HV (FSDP_KB_ATTN_MAX_HD / EV_W) /* vectors of a row of head_dim at most */

/* The row of hd elements at p + o, as vectors. */
EV_INLINE void EV(row_ld)(vf *r, const void *p, fsdp_dtype_t dt, size_t o, size_t hd)
{
    for (size_t i = 0; i * EV_W < hd; i++)
        r[i] = EV(ld)(p, dt, o + i * EV_W);
}

/* A vector's lanes rearranged: clang's and gcc >= 12's __builtin_shufflevector, gcc's older
 * __builtin_shuffle (as sim/gemm.c's FSDP_GEMM_SHUF4). */
#ifndef FSDP_LANES_SHUF4
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#define FSDP_LANES_SHUF4(v, a, b, c, d) __builtin_shufflevector(v, v, a, b, c, d)
#define FSDP_LANES_SHUF8(v, a, b, c, d, e, f, g, h)                                                \
    __builtin_shufflevector(v, v, a, b, c, d, e, f, g, h)
#define FSDP_LANES_MIX4(v, w, a, b, c, d) __builtin_shufflevector(v, w, a, b, c, d)
#define FSDP_LANES_MIX8(v, w, a, b, c, d, e, f, g, h)                                              \
    __builtin_shufflevector(v, w, a, b, c, d, e, f, g, h)
#else
#define FSDP_LANES_SHUF4(v, a, b, c, d) __builtin_shuffle(v, (vi){a, b, c, d})
#define FSDP_LANES_SHUF8(v, a, b, c, d, e, f, g, h)                                                \
    __builtin_shuffle(v, (vi){a, b, c, d, e, f, g, h})
#define FSDP_LANES_MIX4(v, w, a, b, c, d) __builtin_shuffle(v, w, (vi){a, b, c, d})
#define FSDP_LANES_MIX8(v, w, a, b, c, d, e, f, g, h)                                              \
    __builtin_shuffle(v, w, (vi){a, b, c, d, e, f, g, h})
#endif
#endif

#ifndef EV_UNROLL
#if defined(__clang__)
#define EV_UNROLL _Pragma("unroll")
#else
#define EV_UNROLL _Pragma("GCC unroll 8")
#endif
#endif

/* v with lanes s .. 2 s - 1 moved down to lanes 0 .. s - 1 (the others: whatever) */
EV_INLINE vf EV(down)(vf v, int s)
{
#if EV_W == 8
    if (s == 4)
        return FSDP_LANES_SHUF8(v, 4, 5, 6, 7, 4, 5, 6, 7);
    if (s == 2)
        return FSDP_LANES_SHUF8(v, 2, 3, 2, 3, 6, 7, 6, 7);
    return FSDP_LANES_SHUF8(v, 1, 1, 3, 3, 5, 5, 7, 7);
#else
    if (s == 2)
        return FSDP_LANES_SHUF4(v, 2, 3, 2, 3);
    return FSDP_LANES_SHUF4(v, 1, 1, 3, 3);
#endif
}

/* fsdp_kb_lanes_sum_n of the 32 lanes in part, for a row of n elements */
EV_INLINE float EV(lanes_sum)(vf *part, size_t n)
{
    for (unsigned w = FSDP_KB_LANES / 2; w >= EV_W; w >>= 1)
        if (n > w)
            for (unsigned v = 0; v < w / EV_W; v++)
                part[v] = part[v] + part[v + w / EV_W];
    for (int w = EV_W / 2; w > 0; w >>= 1)
        if (n > (size_t)w)
            part[0] = part[0] + EV(down)(part[0], w);
    return part[0][0];
}

/* fsdp_kb_dot_lanes of the loaded row a and the row b at bo, hd elements */
EV_INLINE float EV(dot)(const vf *a, const void *b, size_t bo, size_t hd, fsdp_dtype_t dt)
{
    vf part[EV_NL];

    for (unsigned v = 0; v < EV_NL; v++)
        part[v] = EV(splat)(0.0f);
    for (size_t c = 0; c < hd; c += FSDP_KB_LANES)
        for (unsigned v = 0; v < EV_NL && c + v * EV_W < hd; v++)
            part[v] += a[c / EV_W + v] * EV(ld)(b, dt, bo + c + v * EV_W);
    return EV(lanes_sum)(part, hd);
}

/* The dot products of the loaded row a with nj <= EV_W rows of b at bo, bo + ld, ... (hd
 * elements each), as EV(dot) computes each: lane u of the result is row u's (0 past nj). Each
 * row's 32 lanes are summed to one vector by the levels of EV_W lanes or more, then the EV_W
 * rows' vectors meet in the levels below EV_W together, two rows' halves an addition: lane l of
 * a row still adds lane l + w to itself at level w, in the same order (a head_dim that is a
 * multiple of EV_W has more than EV_W / 2 elements, so lanes_sum runs every level below EV_W). */
EV_INLINE vf EV(dots)(const vf *a, const void *b, size_t bo, size_t ld, unsigned nj, size_t hd,
                      fsdp_dtype_t dt)
{
    vf p[EV_W];

    /* the loops over the constant counts unroll, so that the partials stay in registers */
    EV_UNROLL
    for (unsigned u = 0; u < EV_W; u++) {
        vf part[EV_NL];
        p[u] = EV(splat)(0.0f);
        if (u >= nj)
            continue;
        EV_UNROLL
        for (unsigned v = 0; v < EV_NL; v++) { /* lane vector v: elements v W, v W + 32, ... */
            vf sum = EV(splat)(0.0f);
            for (size_t c = v * EV_W; c < hd; c += FSDP_KB_LANES)
                sum += a[c / EV_W] * EV(ld)(b, dt, bo + u * ld + c);
            part[v] = sum;
        }
        EV_UNROLL
        for (unsigned w = FSDP_KB_LANES / 2; w >= EV_W; w >>= 1) {
            if (hd <= w)
                continue;
            EV_UNROLL
            for (unsigned v = 0; v < w / EV_W; v++)
                part[v] = part[v] + part[v + w / EV_W];
        }
        p[u] = part[0];
    }
#if EV_W == 8
    {
        /* level 4: rows 2i and 2i + 1 in one vector, lanes 0-3 and 4-7 */
        vf s01 = FSDP_LANES_MIX8(p[0], p[1], 0, 1, 2, 3, 8, 9, 10, 11) +
                 FSDP_LANES_MIX8(p[0], p[1], 4, 5, 6, 7, 12, 13, 14, 15);
        vf s23 = FSDP_LANES_MIX8(p[2], p[3], 0, 1, 2, 3, 8, 9, 10, 11) +
                 FSDP_LANES_MIX8(p[2], p[3], 4, 5, 6, 7, 12, 13, 14, 15);
        vf s45 = FSDP_LANES_MIX8(p[4], p[5], 0, 1, 2, 3, 8, 9, 10, 11) +
                 FSDP_LANES_MIX8(p[4], p[5], 4, 5, 6, 7, 12, 13, 14, 15);
        vf s67 = FSDP_LANES_MIX8(p[6], p[7], 0, 1, 2, 3, 8, 9, 10, 11) +
                 FSDP_LANES_MIX8(p[6], p[7], 4, 5, 6, 7, 12, 13, 14, 15);
        /* level 2: rows 0, 2, 1, 3 (and 4, 6, 5, 7) two lanes each */
        vf t0 = FSDP_LANES_MIX8(s01, s23, 0, 1, 8, 9, 4, 5, 12, 13) +
                FSDP_LANES_MIX8(s01, s23, 2, 3, 10, 11, 6, 7, 14, 15);
        vf t1 = FSDP_LANES_MIX8(s45, s67, 0, 1, 8, 9, 4, 5, 12, 13) +
                FSDP_LANES_MIX8(s45, s67, 2, 3, 10, 11, 6, 7, 14, 15);
        /* level 1: rows 0 .. 7 in order */
        return FSDP_LANES_MIX8(t0, t1, 0, 4, 2, 6, 8, 12, 10, 14) +
               FSDP_LANES_MIX8(t0, t1, 1, 5, 3, 7, 9, 13, 11, 15);
    }
#else
    {
        vf s01 = FSDP_LANES_MIX4(p[0], p[1], 0, 1, 4, 5) + FSDP_LANES_MIX4(p[0], p[1], 2, 3, 6, 7);
        vf s23 = FSDP_LANES_MIX4(p[2], p[3], 0, 1, 4, 5) + FSDP_LANES_MIX4(p[2], p[3], 2, 3, 6, 7);
        return FSDP_LANES_MIX4(s01, s23, 0, 2, 4, 6) + FSDP_LANES_MIX4(s01, s23, 1, 3, 5, 7);
    }
#endif
}

/* acc += p[u] * (the row at ro + u ld) for the nj rows u in order, fsdp_kb_acc_add's row by row;
 * with grew, acc is first rescaled by corr[u] at each row u whose bit is set (the online softmax's
 * new maxima). A vector of acc goes through all the rows before the next, in a register: each
 * element still takes the rows' terms in order. */
EV_INLINE void EV(acc_rows)(vf *acc, vf p, const void *row, size_t ro, size_t ld, unsigned nj,
                            size_t nv, fsdp_dtype_t dt, unsigned grew, vf corr)
{
    if (grew == 0 && nj == EV_W) { /* the common case, without a branch */
        vf pu[EV_W];
        EV_UNROLL
        for (unsigned u = 0; u < EV_W; u++)
            pu[u] = EV(splat)(p[u]);
        for (size_t i = 0; i < nv; i++) {
            vf x = acc[i];
            EV_UNROLL
            for (unsigned u = 0; u < EV_W; u++)
                x += pu[u] * EV(ld)(row, dt, ro + u * ld + i * EV_W);
            acc[i] = x;
        }
        return;
    }
    for (size_t i = 0; i < nv; i++) {
        vf x = acc[i];
        for (unsigned u = 0; u < nj; u++) {
            if (grew & (1u << u))
                x *= corr[u];
            x += p[u] * EV(ld)(row, dt, ro + u * ld + i * EV_W);
        }
        acc[i] = x;
    }
}

/* whether a lane of r[0 .. nv) is a NaN */
EV_INLINE int EV(any_nan)(const vf *r, size_t nv)
{
    vi m = (vi)EV(splat)(0.0f);
    for (size_t i = 0; i < nv; i++)
        m |= r[i] != r[i];
    return EV_ANY(m) != 0;
}

EV_INLINE void EV(row_st)(void *p, fsdp_dtype_t dt, size_t o, const vf *r, size_t nv)
{
    for (size_t i = 0; i < nv; i++)
        EV(st)(p, dt, o + i * EV_W, r[i]);
}

/* v's lanes one up, lane 0 first (in front of lane 0) */
EV_INLINE vf EV(after)(float first, vf v)
{
    const vf f = EV(splat)(first);
#if EV_W == 8
    return FSDP_LANES_MIX8(f, v, 0, 8, 9, 10, 11, 12, 13, 14);
#else
    return FSDP_LANES_MIX4(f, v, 0, 4, 5, 6);
#endif
}

/* Lane u: the running maximum of the online softmax after key u, from m before key 0: keys that
 * are not above it leave it, as fsdp_kb_attention_fwd_row's `s > m`. That is the leftmost of the
 * largest of m, s[0 .. u] (a +0 after an equal -0 leaves the -0), whatever the grouping, so the
 * lanes' prefix is taken in log2(W) steps of pairs. (A NaN score, which this would group another
 * way, makes the row's lse a NaN: that row is computed again by the scalar loop.) */
EV_INLINE vf EV(run_max)(float m, vf s)
{
    const float ninf = -fsdp_kb_inff();
    for (int w = 1; w < EV_W; w <<= 1) {
        vf before = s; /* lane u: lane u - w, -inf below */
        for (int i = 0; i < w; i++)
            before = EV(after)(ninf, before);
        s = EV(sel)(s > before, s, before);
    }
    return EV(sel)(s > m, s, EV(splat)(m));
}

/* ---- scores of EV_W keys at a time, from keys transposed ----
 *
 * The forward's scores and the backward's scores and dout . v are computed EV_W keys at a time,
 * a vector lane per key, from K (and V) transposed into a workspace: each of the 32 lanes'
 * partials of fsdp_kb_dot_walk is a vector of those keys (lane l: q[l] k[l], then + q[l + 32]
 * k[l + 32], ... in order), and the partials meet in the butterfly of fsdp_kb_lanes_sum_n, lane
 * l + w into lane l at level w, for the lanes that hold elements (a lane past head_dim holds +0
 * there, and x + +0 is x but for x = -0). The body's partials start at +0, so never hold -0;
 * these start at the first product, which can be -0, and each sum is then the body's or -0 where
 * the body has +0 (x + y and +0 + y differ for x = -0 only in -0 + -0): the final + 0 gives the
 * body's bits. No shuffle is needed, and the butterfly's additions are whole vectors. */

/* Lane l's partial of the dot products of the f32 row a with EV_W keys of the transposed rows
 * bt (attn_tr's block of those keys: element e of key u at bt[e EV_W + u]): a[l] bt[l], +
 * a[l + 32] bt[l + 32], ... */
EV_INLINE vf EV(tleaf)(const float *a, const float *bt, size_t hd, unsigned l)
{
    vf p = EV(splat)(a[l]) * EV(ld)(bt, FSDP_DTYPE_F32, l * EV_W);
    for (size_t c = l + FSDP_KB_LANES; c < hd; c += FSDP_KB_LANES)
        p += EV(splat)(a[c]) * EV(ld)(bt, FSDP_DTYPE_F32, c * EV_W);
    return p;
}

/* fsdp_kb_dot_lanes of a with each of EV_W keys of bt: the butterfly as a tree, node (l, w)
 * being lane l after level w (leaves: w = 32); a lane l2 >= min(hd, 32) holds no element. The
 * tree's nodes are expressions, so the compiler keeps them in registers; hd is a constant of
 * each instance of the walk, so the absent lanes fold away. */
EV_INLINE vf EV(tdots)(const float *a, const float *bt, size_t hd)
{
    const size_t nl = hd < FSDP_KB_LANES ? hd : FSDP_KB_LANES;
    const vf mz = EV(splat)(-0.0f); /* x + -0 is x for every x: an absent lane's term */

#define EV_JOIN_(x, l2, y) ((x) + ((l2) < nl ? (y) : mz))
#define EV_N32_(l) EV(tleaf)(a, bt, hd, (l))
#define EV_N16_(l) EV_JOIN_(EV_N32_(l), (l) + 16, EV_N32_((l) + 16))
#define EV_N8_(l) EV_JOIN_(EV_N16_(l), (l) + 8, EV_N16_((l) + 8))
#define EV_N4_(l) EV_JOIN_(EV_N8_(l), (l) + 4, EV_N8_((l) + 4))
#define EV_N2_(l) EV_JOIN_(EV_N4_(l), (l) + 2, EV_N4_((l) + 2))
    return EV_JOIN_(EV_N2_(0u), 1u, EV_N2_(1u)) + 0.0f;
#undef EV_N2_
#undef EV_N4_
#undef EV_N8_
#undef EV_N16_
#undef EV_N32_
#undef EV_JOIN_
}

/* The hd elements of rows 0 .. T - 1 (at (b T + j) ld + o) of src transposed into dst by blocks
 * of EV_W rows, a block's hd x EV_W floats in a row (what tdots reads, at dst + j0 hd): element e
 * of row j at dst[j / EV_W hd EV_W + e EV_W + j % EV_W], the rows T .. tp - 1 zeros. */
EV_INLINE void EV(attn_tr)(float *dst, const void *src, fsdp_dtype_t dt, size_t ld, size_t b,
                           size_t o, size_t T, size_t tp, size_t hd)
{
    for (size_t j = 0; j < tp; j++)
        for (size_t e = 0; e < hd; e++)
            dst[j / EV_W * hd * EV_W + e * EV_W + j % EV_W] =
                j < T ? fsdp_kb_load(src, dt, (b * T + j) * ld + o + e) : 0.0f;
}

/* l += p[u] for the nj keys u in order, rescaled first by corr[u] at each key whose bit is set in
 * grew (fsdp_kb_attention_fwd_row's running sum) */
EV_INLINE float EV(run_sum)(float l, vf p, unsigned nj, unsigned grew, vf corr)
{
    if (grew == 0 && nj == EV_W) {
        EV_UNROLL
        for (unsigned u = 0; u < EV_W; u++)
            l += p[u];
        return l;
    }
    for (unsigned u = 0; u < nj; u++) {
        if (grew & (1u << u))
            l *= corr[u];
        l += p[u];
    }
    return l;
}

/* acc_rows of two rows' accumulators over the same nj = EV_W rows at ro, neither rescaled: each
 * row of v loaded once for both, each accumulator taking its terms in order */
EV_INLINE void EV(acc_rows2)(vf *acc0, vf *acc1, vf p0, vf p1, const void *row, size_t ro,
                             size_t ld, size_t nv, fsdp_dtype_t dt)
{
    vf pu0[EV_W], pu1[EV_W];

    EV_UNROLL
    for (unsigned u = 0; u < EV_W; u++) {
        pu0[u] = EV(splat)(p0[u]);
        pu1[u] = EV(splat)(p1[u]);
    }
    for (size_t i = 0; i < nv; i++) {
        vf x0 = acc0[i], x1 = acc1[i];
        EV_UNROLL
        for (unsigned u = 0; u < EV_W; u++) {
            const vf y = EV(ld)(row, dt, ro + u * ld + i * EV_W);
            x0 += pu0[u] * y;
            x1 += pu1[u] * y;
        }
        acc0[i] = x0;
        acc1[i] = x1;
    }
}

/* fsdp_kb_attention_fwd_row of n (1 or 2, a constant) query rows r, r + 1 of one batch row and
 * head, their keys transposed at kt (attn_tr); hd and dt the kernel's, constants of each
 * instance. Two rows walk their keys together, so that their running maxima, sums and
 * accumulators, each a chain of one key after another, interleave; each row still does its own
 * operations in its order, and the later row's one more key (causal) comes last. */
EV_INLINE void EV(attn_fwd_rown)(const fsdp_kernel_t *k, size_t r, unsigned n, const float *kt,
                                 size_t hd, fsdp_dtype_t dt)
{
    const size_t T = k->u.attention_fwd.seq, H = k->u.attention_fwd.heads;
    const size_t nv = hd / EV_W, ldv = k->u.attention_fwd.ldv;
    const size_t t = r % T, h = (r / T) % H, b = r / T / H;
    const size_t g = h / (H / k->u.attention_fwd.kv_heads);
    const float scale = k->u.attention_fwd.scale;
    float qf[2][FSDP_KB_ATTN_MAX_HD], m[2], l[2];
    size_t last[2];
    vf acc[2][EV_HV];

    for (unsigned x = 0; x < n; x++) {
        vf q[EV_HV];
        EV(row_ld)
        (q, k->u.attention_fwd.q, dt, (b * T + t + x) * k->u.attention_fwd.ldq + h * hd, hd);
        for (size_t i = 0; i < nv; i++) {
            memcpy(qf[x] + i * EV_W, &q[i], sizeof(vf));
            acc[x][i] = EV(splat)(0.0f);
        }
        m[x] = -fsdp_kb_inff();
        l[x] = 0.0f;
        last[x] = k->u.attention_fwd.causal ? t + x : T - 1;
    }
    for (size_t j0 = 0; j0 <= last[n - 1]; j0 += EV_W) {
        const size_t vo = (b * T + j0) * ldv + g * hd;
        unsigned nj[2] = {0, 0}, grew[2] = {0, 0};
        vf p[2], corr[2];
        for (unsigned x = 0; x < n; x++) {
            vf s, mnew, mprev;
            if (j0 > last[x])
                continue;
            nj[x] = last[x] - j0 < EV_W ? (unsigned)(last[x] - j0 + 1) : EV_W;
            s = EV(tdots)(qf[x], kt + j0 * hd, hd) * scale;
            /* the running maximum after each key and before it; a key above the one before it
             * is a new maximum: what was summed is rescaled by corr (the lanes past nj are other
             * keys', or padding's, which nothing takes) */
            mnew = EV(run_max)(m[x], s);
            mprev = EV(after)(m[x], mnew);
            grew[x] = (unsigned)EV_ANY(s > mprev) & ((1u << nj[x]) - 1u);
            m[x] = mnew[nj[x] - 1];
            p[x] = EV(expf)(s - mnew);
            corr[x] = grew[x] != 0 ? EV(expf)(mprev - s) : p[x]; /* read at new maxima only */
            l[x] = EV(run_sum)(l[x], p[x], nj[x], grew[x], corr[x]);
        }
        if (n == 2 && nj[0] == EV_W && nj[1] == EV_W && (grew[0] | grew[1]) == 0) {
            EV(acc_rows2)(acc[0], acc[1], p[0], p[1], k->u.attention_fwd.v, vo, ldv, nv, dt);
            continue;
        }
        for (unsigned x = 0; x < n; x++)
            if (nj[x] > 0)
                EV(acc_rows)
        (acc[x], p[x], k->u.attention_fwd.v, vo, ldv, nj[x], nv, dt, grew[x], corr[x]);
    }
    for (unsigned x = 0; x < n; x++) {
        const float lse = m[x] + fsdp_kb_logf(l[x]);
        for (size_t i = 0; i < nv; i++)
            acc[x][i] = acc[x][i] / l[x];
        if (EV(any_nan)(acc[x], nv) || lse != lse) {
            fsdp_sim_pass_range(k, 0, r + x, r + x + 1);
            continue;
        }
        EV(row_st)
        (k->u.attention_fwd.o, dt, (b * T + t + x) * k->u.attention_fwd.ldo + h * hd, acc[x], nv);
        if (k->u.attention_fwd.lse != NULL)
            k->u.attention_fwd.lse[r + x] = lse;
    }
}

/* Whether this instance's rows of head_dim hd go in pairs: where that was faster (bench_elem), not
 * SSE2's rows past head_dim 32, whose two rows' accumulators outgrow its registers */
#define EV_PAIRS(hd) (EV_W == 8 || (hd) <= 32)

/* Rows [r0, r1) of attention_fwd, the keys of each kv head transposed into kt as its rows come,
 * two rows of a head at a time where pairs (attention_fwd: the rows' outputs apart from the
 * inputs of the other rows, so that a row may read them after the row before it wrote). */
EV_INLINE void EV(attn_fwd_rows)(const fsdp_kernel_t *k, size_t r0, size_t r1, float *kt, size_t hd,
                                 fsdp_dtype_t dt, int pairs)
{
    const size_t T = k->u.attention_fwd.seq, H = k->u.attention_fwd.heads;
    const size_t K = k->u.attention_fwd.kv_heads, tp = (T + EV_W - 1) / EV_W * EV_W;
    size_t have = SIZE_MAX; /* the batch row and kv head in kt */

    for (size_t r = r0; r < r1;) {
        const size_t b = r / T / H, g = (r / T) % H / (H / K);
        if (b * K + g != have) {
            EV(attn_tr)(kt, k->u.attention_fwd.k, dt, k->u.attention_fwd.ldk, b, g * hd, T, tp, hd);
            have = b * K + g;
        }
        if (pairs && EV_PAIRS(hd) && r + 1 < r1 && (r + 1) % T != 0) { /* the same head */
            EV(attn_fwd_rown)(k, r, 2, kt, hd, dt);
            r += 2;
        } else {
            EV(attn_fwd_rown)(k, r, 1, kt, hd, dt);
            r++;
        }
    }
}

/* fsdp_kb_attention_delta_row */
EV_ATTR static void EV(attn_delta_row)(const fsdp_kernel_t *k, size_t r)
{
    const size_t T = k->u.attention_bwd.seq, H = k->u.attention_bwd.heads;
    const size_t hd = k->u.attention_bwd.head_dim;
    const size_t t = r % T, h = (r / T) % H, b = r / T / H;
    const size_t oo = (b * T + t) * k->u.attention_bwd.ldo + h * hd;
    vf dout[EV_HV];
    float d;

    EV(row_ld)(dout, k->u.attention_bwd.dout, k->u.attention_bwd.dtype, oo, hd);
    d = EV(dot)(dout, k->u.attention_bwd.o, oo, hd, k->u.attention_bwd.dtype);
    if (d != d)
        fsdp_sim_pass_range(k, 0, r, r + 1);
    else
        k->u.attention_bwd.delta[r] = d;
}

/* fsdp_kb_attention_dq_row */
EV_ATTR static void EV(attn_dq_row)(const fsdp_kernel_t *k, size_t r)
{
    const fsdp_dtype_t dt = k->u.attention_bwd.dtype;
    const size_t T = k->u.attention_bwd.seq, H = k->u.attention_bwd.heads;
    const size_t hd = k->u.attention_bwd.head_dim, nv = hd / EV_W;
    const size_t t = r % T, h = (r / T) % H, b = r / T / H;
    const size_t g = h / (H / k->u.attention_bwd.kv_heads);
    const size_t last = k->u.attention_bwd.causal ? t : T - 1;
    const float lse = k->u.attention_bwd.lse[r], delta = k->u.attention_bwd.delta[r];
    vf q[EV_HV], dout[EV_HV], acc[EV_HV];

    EV(row_ld)(q, k->u.attention_bwd.q, dt, (b * T + t) * k->u.attention_bwd.ldq + h * hd, hd);
    EV(row_ld)
    (dout, k->u.attention_bwd.dout, dt, (b * T + t) * k->u.attention_bwd.ldo + h * hd, hd);
    for (size_t i = 0; i < nv; i++)
        acc[i] = EV(splat)(0.0f);
    for (size_t j0 = 0; j0 <= last; j0 += EV_W) {
        const unsigned nj = last - j0 < EV_W ? (unsigned)(last - j0 + 1) : EV_W;
        vf s = EV(dots)(q, k->u.attention_bwd.k, (b * T + j0) * k->u.attention_bwd.ldk + g * hd,
                        k->u.attention_bwd.ldk, nj, hd, dt) *
               k->u.attention_bwd.scale;
        vf dp = EV(dots)(dout, k->u.attention_bwd.v, (b * T + j0) * k->u.attention_bwd.ldv + g * hd,
                         k->u.attention_bwd.ldv, nj, hd, dt);
        vf ds = EV(expf)(s - lse) * (dp - delta);
        EV(acc_rows)
        (acc, ds, k->u.attention_bwd.k, (b * T + j0) * k->u.attention_bwd.ldk + g * hd,
         k->u.attention_bwd.ldk, nj, nv, dt, 0, ds);
    }
    for (size_t i = 0; i < nv; i++)
        acc[i] = acc[i] * k->u.attention_bwd.scale;
    if (EV(any_nan)(acc, nv))
        fsdp_sim_pass_range(k, 1, r, r + 1);
    else
        EV(row_st)
    (k->u.attention_bwd.dq, dt, (b * T + t) * k->u.attention_bwd.ldq + h * hd, acc, nv);
}

/* fsdp_kb_attention_dkv_row */
EV_ATTR static void EV(attn_dkv_row)(const fsdp_kernel_t *k, size_t r)
{
    const fsdp_dtype_t dt = k->u.attention_bwd.dtype;
    const size_t T = k->u.attention_bwd.seq, H = k->u.attention_bwd.heads;
    const size_t K = k->u.attention_bwd.kv_heads, hd = k->u.attention_bwd.head_dim;
    const size_t nv = hd / EV_W;
    const size_t j = r % T, g = (r / T) % K, b = r / T / K, group = H / K;
    const size_t ko = (b * T + j) * k->u.attention_bwd.ldk + g * hd;
    const size_t vo = (b * T + j) * k->u.attention_bwd.ldv + g * hd;
    vf kr[EV_HV], vr[EV_HV], dk[EV_HV], dv[EV_HV];

    EV(row_ld)(kr, k->u.attention_bwd.k, dt, ko, hd);
    EV(row_ld)(vr, k->u.attention_bwd.v, dt, vo, hd);
    for (size_t i = 0; i < nv; i++)
        dk[i] = dv[i] = EV(splat)(0.0f);
    for (size_t h = g * group; h < (g + 1) * group; h++) {
        for (size_t t0 = k->u.attention_bwd.causal ? j : 0; t0 < T; t0 += EV_W) {
            const unsigned nt = T - t0 < EV_W ? (unsigned)(T - t0) : EV_W;
            vf s =
                EV(dots)(kr, k->u.attention_bwd.q, (b * T + t0) * k->u.attention_bwd.ldq + h * hd,
                         k->u.attention_bwd.ldq, nt, hd, dt) *
                k->u.attention_bwd.scale;
            vf dp = EV(dots)(vr, k->u.attention_bwd.dout,
                             (b * T + t0) * k->u.attention_bwd.ldo + h * hd, k->u.attention_bwd.ldo,
                             nt, hd, dt);
            vf lse = EV(splat)(0.0f), delta = lse, p, ds;
            for (unsigned u = 0; u < nt; u++) {
                const size_t rq = (b * H + h) * T + t0 + u;
                lse[u] = k->u.attention_bwd.lse[rq];
                delta[u] = k->u.attention_bwd.delta[rq];
            }
            p = EV(expf)(s - lse);
            ds = p * (dp - delta);
            EV(acc_rows)
            (dv, p, k->u.attention_bwd.dout, (b * T + t0) * k->u.attention_bwd.ldo + h * hd,
             k->u.attention_bwd.ldo, nt, nv, dt, 0, p);
            EV(acc_rows)
            (dk, ds, k->u.attention_bwd.q, (b * T + t0) * k->u.attention_bwd.ldq + h * hd,
             k->u.attention_bwd.ldq, nt, nv, dt, 0, ds);
        }
    }
    for (size_t i = 0; i < nv; i++) {
        dk[i] = dk[i] * k->u.attention_bwd.scale;
        dv[i] = dv[i] * 1.0f;
    }
    if (EV(any_nan)(dk, nv) || EV(any_nan)(dv, nv)) {
        fsdp_sim_pass_range(k, 2, r, r + 1);
        return;
    }
    EV(row_st)(k->u.attention_bwd.dk, dt, ko, dk, nv);
    EV(row_st)(k->u.attention_bwd.dv, dt, vo, dv, nv);
}

/* ---- the backward's passes 1 and 2 in one walk (fsdp_sim_attn_bwd_units) ----
 *
 * A unit is a batch row b and a kv head g: the dq rows of g's query heads and the dk and dv rows
 * of g's keys. Each (query, key) pair's score, probability and ds are computed once, and go into
 * dq of the query and dk and dv of the key together. Each output still takes its terms in the
 * bodies' order: dq[t] the keys in order (the key tiles in order, within one in order), dk[j] and
 * dv[j] the heads of the group in order, then the queries in order (query tiles in order, within
 * one in order), in f32 accumulators of the unit's keys (the workspace).
 * The scores and dout . v are those of tdots. */

#define EV_TILE 64 /* queries and keys of a tile (a multiple of EV_W) */

/* The workspace of a unit, in floats: K and V transposed (head_dim x the keys padded to EV_W),
 * the dk and dv accumulators (keys x head_dim), a query tile's dq accumulators. */
static inline size_t EV(attn_ws)(size_t T, size_t hd)
{
    const size_t tp = (T + EV_W - 1) / EV_W * EV_W;
    return 2 * hd * tp + 2 * T * hd + EV_TILE * hd;
}

/* The accumulators of nv vectors at acc, scaled by f, stored as row r of pass `pass` (the dq
 * row's or, with acc2, the dk row's and the dv row's at o and o2), or that row computed again by
 * the scalar loop if one holds a NaN. */
EV_INLINE void EV(attn_put)(const fsdp_kernel_t *k, int pass, size_t r, void *out, size_t o,
                            float *acc, float f, void *out2, size_t o2, float *acc2, size_t nv)
{
    const fsdp_dtype_t dt = k->u.attention_bwd.dtype;
    vf x[EV_HV], y[EV_HV];

    for (size_t i = 0; i < nv; i++) {
        x[i] = EV(ld)(acc, FSDP_DTYPE_F32, i * EV_W) * f;
        if (acc2 != NULL)
            y[i] = EV(ld)(acc2, FSDP_DTYPE_F32, i * EV_W) * 1.0f;
    }
    if (EV(any_nan)(x, nv) || (acc2 != NULL && EV(any_nan)(y, nv))) {
        fsdp_sim_pass_range(k, pass, r, r + 1);
        return;
    }
    EV(row_st)(out, dt, o, x, nv);
    if (acc2 != NULL)
        EV(row_st)(out2, dt, o2, y, nv);
}

/* Unit u of a checked attention_bwd kernel whose delta pass has run, on the workspace ws. */
EV_INLINE void EV(attn_bwd_unit)(const fsdp_kernel_t *k, size_t u, float *ws, size_t hd)
{
    const fsdp_dtype_t dt = k->u.attention_bwd.dtype;
    const size_t T = k->u.attention_bwd.seq, H = k->u.attention_bwd.heads;
    const size_t K = k->u.attention_bwd.kv_heads, group = H / K, nv = hd / EV_W;
    const size_t b = u / K, g = u % K, tp = (T + EV_W - 1) / EV_W * EV_W;
    const size_t ldq = k->u.attention_bwd.ldq, ldk = k->u.attention_bwd.ldk;
    const size_t ldv = k->u.attention_bwd.ldv, ldo = k->u.attention_bwd.ldo;
    const float scale = k->u.attention_bwd.scale;
    float *kt = ws, *vt = kt + hd * tp, *dk = vt + hd * tp, *dv = dk + T * hd, *dq = dv + T * hd;

    EV(attn_tr)(kt, k->u.attention_bwd.k, dt, ldk, b, g * hd, T, tp, hd);
    EV(attn_tr)(vt, k->u.attention_bwd.v, dt, ldv, b, g * hd, T, tp, hd);
    memset(dk, 0, 2 * T * hd * sizeof(float));
    for (size_t h = g * group; h < (g + 1) * group; h++) {
        for (size_t t0 = 0; t0 < T; t0 += EV_TILE) {
            const size_t t1 = T - t0 < EV_TILE ? T : t0 + EV_TILE;
            const size_t jn = k->u.attention_bwd.causal ? t1 : T;
            memset(dq, 0, (t1 - t0) * hd * sizeof(float));
            for (size_t j0 = 0; j0 < jn; j0 += EV_TILE) {
                const size_t j1 = jn - j0 < EV_TILE ? jn : j0 + EV_TILE;
                for (size_t t = k->u.attention_bwd.causal && j0 > t0 ? j0 : t0; t < t1; t++) {
                    const size_t r = (b * H + h) * T + t;
                    const size_t qo = (b * T + t) * ldq + h * hd, oo = (b * T + t) * ldo + h * hd;
                    const size_t jend = k->u.attention_bwd.causal && t + 1 < j1 ? t + 1 : j1;
                    const float lse = k->u.attention_bwd.lse[r];
                    const float delta = k->u.attention_bwd.delta[r];
                    float qf[FSDP_KB_ATTN_MAX_HD], of[FSDP_KB_ATTN_MAX_HD];
                    vf q[EV_HV], dout[EV_HV], acc[EV_HV];

                    EV(row_ld)(q, k->u.attention_bwd.q, dt, qo, hd);
                    EV(row_ld)(dout, k->u.attention_bwd.dout, dt, oo, hd);
                    for (size_t i = 0; i < nv; i++) {
                        memcpy(qf + i * EV_W, &q[i], sizeof(vf));
                        memcpy(of + i * EV_W, &dout[i], sizeof(vf));
                        acc[i] = EV(ld)(dq, FSDP_DTYPE_F32, (t - t0) * hd + i * EV_W);
                    }
                    for (size_t jb = j0; jb < jend; jb += EV_W) {
                        const unsigned nj = jend - jb < EV_W ? (unsigned)(jend - jb) : EV_W;
                        vf s = EV(tdots)(qf, kt + jb * hd, hd) * scale;
                        vf dp = EV(tdots)(of, vt + jb * hd, hd);
                        vf p = EV(expf)(s - lse);
                        vf ds = p * (dp - delta);
                        for (unsigned x = 0; x < nj; x++) {
                            const size_t j = jb + x, ko = (b * T + j) * ldk + g * hd;
                            const vf dsx = EV(splat)(ds[x]), px = EV(splat)(p[x]);
                            float *dkj = dk + j * hd, *dvj = dv + j * hd;
                            for (size_t i = 0; i < nv; i++) {
                                vf a = EV(ld)(dkj, FSDP_DTYPE_F32, i * EV_W) + dsx * q[i];
                                vf c = EV(ld)(dvj, FSDP_DTYPE_F32, i * EV_W) + px * dout[i];
                                acc[i] += dsx * EV(ld)(k->u.attention_bwd.k, dt, ko + i * EV_W);
                                EV(st)(dkj, FSDP_DTYPE_F32, i * EV_W, a);
                                EV(st)(dvj, FSDP_DTYPE_F32, i * EV_W, c);
                            }
                        }
                    }
                    for (size_t i = 0; i < nv; i++)
                        EV(st)(dq, FSDP_DTYPE_F32, (t - t0) * hd + i * EV_W, acc[i]);
                }
            }
            for (size_t t = t0; t < t1; t++)
                EV(attn_put)
            (k, 1, (b * H + h) * T + t, k->u.attention_bwd.dq, (b * T + t) * ldq + h * hd,
             dq + (t - t0) * hd, scale, NULL, 0, NULL, nv);
        }
    }
    for (size_t j = 0; j < T; j++)
        EV(attn_put)
    (k, 2, u * T + j, k->u.attention_bwd.dk, (b * T + j) * ldk + g * hd, dk + j * hd, scale,
     k->u.attention_bwd.dv, (b * T + j) * ldv + g * hd, dv + j * hd, nv);
}

/* The head_dims of Llama's and GPT-2's models are instances of their own, so that the scores'
 * trees fold; the others share one. */
#define EV_BY_HD_(hd, call)                                                                        \
    switch (hd) {                                                                                  \
    case 16:                                                                                       \
        call(16);                                                                                  \
        break;                                                                                     \
    case 32:                                                                                       \
        call(32);                                                                                  \
        break;                                                                                     \
    case 48:                                                                                       \
        call(48);                                                                                  \
        break;                                                                                     \
    case 64:                                                                                       \
        call(64);                                                                                  \
        break;                                                                                     \
    case 128:                                                                                      \
        call(128);                                                                                 \
        break;                                                                                     \
    default:                                                                                       \
        call(hd);                                                                                  \
        break;                                                                                     \
    }

/* Units [u0, u1) of a checked attention_bwd kernel that fsdp_sim_attn_bwd_units takes; returns
 * 0, having written nothing, where the workspace cannot be had. */
EV_ATTR static int EV(fsdp_ev_attn_bwd_units)(const fsdp_kernel_t *k, size_t u0, size_t u1)
{
    const size_t hd = k->u.attention_bwd.head_dim;
    float *ws = malloc(EV(attn_ws)(k->u.attention_bwd.seq, hd) * sizeof(float));

    if (ws == NULL)
        return 0;
    for (size_t u = u0; u < u1; u++) {
#define EV_UNIT_(n) EV(attn_bwd_unit)(k, u, ws, n)
        EV_BY_HD_(hd, EV_UNIT_)
#undef EV_UNIT_
    }
    free(ws);
    return 1;
}

/* Rows [b, e) of a pass of a checked attention kernel that its check took (head_dim a multiple of
 * 4). The rows' accumulators are whole vectors of head_dim: an instance whose vectors do not
 * divide it hands the rows to the narrower instance, EV_NARROWER. The forward's rows take their
 * keys transposed into a workspace; by the scalar loop where it cannot be had. */
EV_ATTR static void EV(attention_fwd)(const fsdp_kernel_t *k, const fsdp_ev_job_t *job, size_t b,
                                      size_t e)
{
    const size_t T = k->u.attention_fwd.seq, hd = k->u.attention_fwd.head_dim;
    float *kt;
    int pairs;

#ifdef EV_NARROWER
    if (hd % EV_W != 0) {
        EV_CAT(attention_fwd, EV_NARROWER)(k, job, b, e);
        return;
    }
#endif
    (void)job;
    pairs = fsdp_ev_attn_fwd_pairs(k);
    kt = malloc((T + EV_W - 1) / EV_W * EV_W * hd * sizeof(float));
    if (kt == NULL) {
        fsdp_sim_pass_range(k, 0, b, e);
        return;
    }
#define EV_ROWS_(n)                                                                                \
    (k->u.attention_fwd.dtype == FSDP_DTYPE_F32                                                    \
         ? EV(attn_fwd_rows)(k, b, e, kt, n, FSDP_DTYPE_F32, pairs)                                \
         : EV(attn_fwd_rows)(k, b, e, kt, n, FSDP_DTYPE_BF16, pairs))
    EV_BY_HD_(hd, EV_ROWS_)
#undef EV_ROWS_
    free(kt);
}

/* pass 0, the rows' deltas; 1, the query gradients; 2, the key and value gradients */
EV_ATTR static void EV(attention_bwd)(const fsdp_kernel_t *k, const fsdp_ev_job_t *job, size_t b,
                                      size_t e)
{
#ifdef EV_NARROWER
    if (k->u.attention_bwd.head_dim % EV_W != 0) {
        EV_CAT(attention_bwd, EV_NARROWER)(k, job, b, e);
        return;
    }
#endif
    for (size_t r = b; r < e; r++) {
        if (job->pass == 0)
            EV(attn_delta_row)(k, r);
        else if (job->pass == 1)
            EV(attn_dq_row)(k, r);
        else
            EV(attn_dkv_row)(k, r);
    }
}

#undef EV_BY_HD_
#undef EV_PAIRS
#undef EV_NL
#undef EV_TILE
#undef EV_HV
/* the vector types and helpers stay defined for rows_vec_tmpl.h, which undefines them */
