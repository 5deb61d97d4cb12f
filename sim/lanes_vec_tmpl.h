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
 * scores are EV_W dot products, their exps one vector expf (the running maximum of the online
 * softmax is followed key by key first, so each lane's exp has the operands of the scalar
 * body's), and they are added into the accumulators one at a time, in order. Every lane thus
 * does the scalar body's IEEE operations on the same operands in the same order.
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
#define FSDP_LANES_SHUF8(v, a, b, c, d, e, f, g, h)                                               \
    __builtin_shufflevector(v, v, a, b, c, d, e, f, g, h)
#define FSDP_LANES_MIX4(v, w, a, b, c, d) __builtin_shufflevector(v, w, a, b, c, d)
#define FSDP_LANES_MIX8(v, w, a, b, c, d, e, f, g, h)                                             \
    __builtin_shufflevector(v, w, a, b, c, d, e, f, g, h)
#else
#define FSDP_LANES_SHUF4(v, a, b, c, d) __builtin_shuffle(v, (vi){a, b, c, d})
#define FSDP_LANES_SHUF8(v, a, b, c, d, e, f, g, h) __builtin_shuffle(v, (vi){a, b, c, d, e, f, g, h})
#define FSDP_LANES_MIX4(v, w, a, b, c, d) __builtin_shuffle(v, w, (vi){a, b, c, d})
#define FSDP_LANES_MIX8(v, w, a, b, c, d, e, f, g, h)                                             \
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

/* fsdp_kb_attention_fwd_row */
EV_ATTR static void EV(attn_fwd_row)(const fsdp_kernel_t *k, size_t r)
{
    const fsdp_dtype_t dt = k->u.attention_fwd.dtype;
    const size_t T = k->u.attention_fwd.seq, H = k->u.attention_fwd.heads;
    const size_t hd = k->u.attention_fwd.head_dim, nv = hd / EV_W;
    const size_t t = r % T, h = (r / T) % H, b = r / T / H;
    const size_t g = h / (H / k->u.attention_fwd.kv_heads);
    const size_t last = k->u.attention_fwd.causal ? t : T - 1;
    const float scale = k->u.attention_fwd.scale;
    vf q[EV_HV], acc[EV_HV];
    float m = -fsdp_kb_inff(), l = 0.0f, lse;

    EV(row_ld)(q, k->u.attention_fwd.q, dt, (b * T + t) * k->u.attention_fwd.ldq + h * hd, hd);
    for (size_t i = 0; i < nv; i++)
        acc[i] = EV(splat)(0.0f);
    for (size_t j0 = 0; j0 <= last; j0 += EV_W) {
        const unsigned nj = last - j0 < EV_W ? (unsigned)(last - j0 + 1) : EV_W;
        vf s = EV(dots)(q, k->u.attention_fwd.k, (b * T + j0) * k->u.attention_fwd.ldk + g * hd,
                        k->u.attention_fwd.ldk, nj, hd, dt) *
               scale;
        /* the running maximum after each key and before it; a key above the one before it is a
         * new maximum: what was summed is rescaled by corr */
        vf mnew = EV(run_max)(m, s), mprev = EV(after)(m, mnew), p, corr;
        unsigned grew = (unsigned)EV_ANY(s > mprev) & ((1u << nj) - 1u);
        m = mnew[nj - 1];
        p = EV(expf)(s - mnew);
        corr = EV(expf)(mprev - s);
        for (unsigned u = 0; u < nj; u++) {
            if (grew & (1u << u))
                l *= corr[u];
            l += p[u];
        }
        EV(acc_rows)
        (acc, p, k->u.attention_fwd.v, (b * T + j0) * k->u.attention_fwd.ldv + g * hd,
         k->u.attention_fwd.ldv, nj, nv, dt, grew, corr);
    }
    for (size_t i = 0; i < nv; i++)
        acc[i] = acc[i] / l;
    lse = m + fsdp_kb_logf(l);
    if (EV(any_nan)(acc, nv) || lse != lse) {
        fsdp_sim_pass_range(k, 0, r, r + 1);
        return;
    }
    EV(row_st)(k->u.attention_fwd.o, dt, (b * T + t) * k->u.attention_fwd.ldo + h * hd, acc, nv);
    if (k->u.attention_fwd.lse != NULL)
        k->u.attention_fwd.lse[r] = lse;
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

/* Rows [b, e) of a pass of a checked attention kernel that its check took (head_dim a multiple of
 * 4). The rows' accumulators are whole vectors of head_dim: an instance whose vectors do not
 * divide it hands the rows to the narrower instance, EV_NARROWER. */
EV_ATTR static void EV(attention_fwd)(const fsdp_kernel_t *k, const fsdp_ev_job_t *job, size_t b,
                                      size_t e)
{
#ifdef EV_NARROWER
    if (k->u.attention_fwd.head_dim % EV_W != 0) {
        EV_CAT(attention_fwd, EV_NARROWER)(k, job, b, e);
        return;
    }
#endif
    (void)job;
    for (size_t r = b; r < e; r++)
        EV(attn_fwd_row)(k, r);
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

#undef EV_NL
#undef EV_HV
/* the vector types and helpers stay defined for rows_vec_tmpl.h, which undefines them */
