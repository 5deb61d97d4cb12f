/* One instance of the vectorized host replay of the row kernels, the column sums and the Llama
 * kernels' element passes (elem_vec.c's vector path: a loop per member, over rows, column blocks
 * or a pass's indices), included after lanes_vec_tmpl.h with the same definitions (EV_W,
 * EV_SUFFIX, EV_ATTR and the vector types and helpers of that instance).
 *
 * Rows (layernorm, softmax, cross-entropy, rmsnorm): the scalar replay (nn_bodies.h,
 * llama_bodies.h) walks a row once per pass, element c into the partial of lane c % 32; here the
 * 32 lanes are FSDP_KB_LANES / EV_W vectors and a pass walks the row a vector at a time, element
 * c into lane c % EV_W of vector (c % 32) / EV_W, so each lane adds its elements in index order,
 * as the scalar loop does. A row's last elements short of a vector are a partial vector whose
 * missing lanes add nothing to a partial: their terms are masked to +0 for a sum (a partial,
 * which starts at +0, is never -0, and x + +0 is x for every other x) and leave a maximum as it
 * is. The partials meet in the butterfly of lanes.h (lanes_vec_tmpl.h's lanes_sum, and
 * lanes_max below), and the row's scalars come from the bodies' own functions
 * (fsdp_kb_nn_row_reduced). The storing pass computes each element's output as the body does.
 *
 * Column sums (bias_grad, layernorm_bwd's weight and bias gradients, rmsnorm_bwd's weight
 * gradient): a block of 32 columns is 32 / EV_W vectors per row lane, row r added into row lane
 * r % 32 in row order, and the row lanes meet in the butterfly, vector by vector.
 *
 * Elements (swiglu, rope): EV_W consecutive indices a vector, as elem_vec_tmpl.h's loops.
 *
 * NaNs: as in elem_vec_tmpl.h, an input NaN could meet another NaN in an operation whose operand
 * order this copy and the scalar loop's compiled copy may choose differently. So a row (a column
 * block, a vector of elements) whose inputs hold a NaN is computed by the scalar loop's one
 * compiled copy instead (fsdp_sim_pass_range, fsdp_sim_rows_range, fsdp_sim_colsum_range); a
 * row's passes read every input before its storing pass writes (in place, y over x, included),
 * so the row is still whole when the NaN is found. The inputs shared by every row (weights,
 * biases, a launch's scalars) are checked once by the caller (elem_vec.c). Without NaN inputs
 * every NaN a row meets is the one default NaN, and the operands' order no longer matters. */

#define EV_NL (FSDP_KB_LANES / EV_W) /* vectors of a row's 32 lanes, or of a block's 32 columns */

/* lanes [0, cnt) set */
EV_INLINE vi EV(first)(size_t cnt)
{
    vi m;
    for (int j = 0; j < EV_W; j++)
        m[j] = (size_t)j < cnt ? -1 : 0;
    return m;
}

/* EV(ld) of cnt <= EV_W elements (the others 0) */
EV_INLINE vf EV(ldn)(const void *p, fsdp_dtype_t dt, size_t i, size_t cnt)
{
    vf v = EV(splat)(0.0f);
    if (cnt == EV_W)
        return EV(ld)(p, dt, i);
    for (size_t j = 0; j < cnt; j++)
        v[j] = fsdp_kb_load(p, dt, i + j);
    return v;
}

/* EV(st) of lanes [0, cnt) (fsdp_kb_store rounds as EV(st) does) */
EV_INLINE void EV(stn)(void *p, fsdp_dtype_t dt, size_t i, vf v, size_t cnt)
{
    if (cnt == EV_W) {
        EV(st)(p, dt, i, v);
        return;
    }
    for (size_t j = 0; j < cnt; j++)
        fsdp_kb_store(p, dt, i + j, v[j]);
}

/* fsdp_kb_round_to for f32 and bf16 */
EV_INLINE vf EV(rnd)(vf v, fsdp_dtype_t dt)
{
    if (dt == FSDP_DTYPE_BF16) {
        vu x = (vu)v;
        vi nan = (vi)(x & 0x7fffffffu) > 0x7f800000;
        vu r = ((x + (0x7fffu + ((x >> 16) & 1u))) >> 16) << 16;
        return (vf)EV(seli)(nan, (vi)(((x >> 16) | 0x0040u) << 16), (vi)r);
    }
    return v;
}

/* the partial of the lane of element c (a vector's first) += t, lanes [0, cnt) of it */
EV_INLINE void EV(sum_at)(vf *part, size_t c, size_t cnt, vf t)
{
    if (cnt < EV_W)
        t = EV(sel)(EV(first)(cnt), t, EV(splat)(0.0f));
    part[(c % FSDP_KB_LANES) / EV_W] += t;
}

/* the same for a maximum: m = t > m ? t : m, the scalar pass's comparison */
EV_INLINE void EV(max_at)(vf *part, size_t c, size_t cnt, vf t)
{
    vf *m = &part[(c % FSDP_KB_LANES) / EV_W];
    vi gt = t > *m;
    if (cnt < EV_W)
        gt &= EV(first)(cnt);
    *m = EV(sel)(gt, t, *m);
}

/* fsdp_kb_lane_max of the 32 lanes in part */
EV_INLINE float EV(lanes_max)(vf *part)
{
    for (unsigned w = FSDP_KB_LANES / 2; w >= EV_W; w >>= 1)
        for (unsigned v = 0; v < w / EV_W; v++)
            part[v] = EV(sel)(part[v + w / EV_W] > part[v], part[v + w / EV_W], part[v]);
    for (int w = EV_W / 2; w > 0; w >>= 1) {
        vf up = EV(down)(part[0], w);
        part[0] = EV(sel)(up > part[0], up, part[0]);
    }
    return part[0][0];
}

EV_INLINE void EV(zero)(vf *part, float v)
{
    for (unsigned i = 0; i < EV_NL; i++)
        part[i] = EV(splat)(v);
}

#define EV_CNT(n, c) ((n) - (c) < EV_W ? (n) - (c) : EV_W)

/* whether n elements at p + o hold a NaN (an old gradient that a row adds to) */
EV_INLINE int EV(has_nan)(const void *p, fsdp_dtype_t dt, size_t o, size_t n)
{
    vi m = (vi)EV(splat)(0.0f);
    for (size_t c = 0; c < n; c += EV_W) {
        vf v = EV(ldn)(p, dt, o + c, EV_CNT(n, c));
        m |= v != v;
    }
    return EV_ANY(m) != 0;
}

/* ---- the row kernels of nn_bodies.h: fsdp_kb_nn_row's passes ---- */

/* layernorm_fwd, row r (fsdp_kb_layernorm_fwd_pass) */
EV_ATTR static void EV(layernorm_fwd_row)(const fsdp_kernel_t *k, size_t r)
{
    const fsdp_dtype_t dt = k->u.layernorm_fwd.dtype;
    const size_t n = k->u.layernorm_fwd.cols, o = r * n;
    const void *x = k->u.layernorm_fwd.x;
    const void *w = k->u.layernorm_fwd.weight, *b = k->u.layernorm_fwd.bias;
    float st[FSDP_KB_ROW_STATE] = {0.0f, 0.0f, 0.0f};
    vf part[EV_NL], mean, rstd;
    vi nan = (vi)EV(splat)(0.0f);

    EV(zero)(part, 0.0f);
    for (size_t c = 0; c < n; c += EV_W) {
        vf xv = EV(ldn)(x, dt, o + c, EV_CNT(n, c));
        nan |= xv != xv;
        EV(sum_at)(part, c, EV_CNT(n, c), xv);
    }
    if (EV_ANY(nan)) {
        fsdp_sim_rows_range(k, 0.0f, r, r + 1);
        return;
    }
    st[0] = EV(lanes_sum)(part, FSDP_KB_LANES);
    fsdp_kb_nn_row_reduced(FSDP_K_LAYERNORM_FWD, k, 0, st);
    mean = EV(splat)(st[0]);
    EV(zero)(part, 0.0f);
    for (size_t c = 0; c < n; c += EV_W) {
        vf d = EV(ldn)(x, dt, o + c, EV_CNT(n, c)) - mean;
        EV(sum_at)(part, c, EV_CNT(n, c), d * d);
    }
    st[1] = EV(lanes_sum)(part, FSDP_KB_LANES);
    fsdp_kb_nn_row_reduced(FSDP_K_LAYERNORM_FWD, k, 1, st);
    rstd = EV(splat)(st[1]);
    for (size_t c = 0; c < n; c += EV_W) {
        const size_t cnt = EV_CNT(n, c);
        vf y = (EV(ldn)(x, dt, o + c, cnt) - mean) * rstd * EV(ldn)(w, dt, c, cnt) +
               EV(ldn)(b, dt, c, cnt);
        EV(stn)(k->u.layernorm_fwd.y, dt, o + c, y, cnt);
    }
    if (k->u.layernorm_fwd.mean != NULL)
        k->u.layernorm_fwd.mean[r] = st[0];
    if (k->u.layernorm_fwd.rstd != NULL)
        k->u.layernorm_fwd.rstd[r] = st[1];
}

/* layernorm_bwd's input gradient, row r (fsdp_kb_layernorm_bwd_pass) */
EV_ATTR static void EV(layernorm_bwd_row)(const fsdp_kernel_t *k, size_t r)
{
    const fsdp_dtype_t dt = k->u.layernorm_bwd.dtype;
    const size_t n = k->u.layernorm_bwd.cols, o = r * n;
    const void *x = k->u.layernorm_bwd.x, *dy = k->u.layernorm_bwd.dy;
    const void *w = k->u.layernorm_bwd.weight;
    const float mean_s = k->u.layernorm_bwd.mean[r], rstd_s = k->u.layernorm_bwd.rstd[r];
    const vf mean = EV(splat)(mean_s), rstd = EV(splat)(rstd_s);
    void *dx = k->u.layernorm_bwd.dx;
    float st[FSDP_KB_ROW_STATE] = {0.0f, 0.0f, 0.0f};
    vf pg[EV_NL], pgx[EV_NL], sg, sgx;
    vi nan = (vi)EV(splat)(0.0f);

    /* passes 0 and 1 read the same elements into their own partials: one walk */
    EV(zero)(pg, 0.0f);
    EV(zero)(pgx, 0.0f);
    for (size_t c = 0; c < n; c += EV_W) {
        const size_t cnt = EV_CNT(n, c);
        vf dv = EV(ldn)(dy, dt, o + c, cnt), xv = EV(ldn)(x, dt, o + c, cnt);
        vf g = dv * EV(ldn)(w, dt, c, cnt);
        nan |= (dv != dv) | (xv != xv);
        EV(sum_at)(pg, c, cnt, g);
        EV(sum_at)(pgx, c, cnt, g * ((xv - mean) * rstd));
    }
    if (EV_ANY(nan) || mean_s != mean_s || rstd_s != rstd_s ||
        (k->u.layernorm_bwd.accumulate && EV(has_nan)(dx, dt, o, n))) {
        fsdp_sim_rows_range(k, 0.0f, r, r + 1);
        return;
    }
    st[0] = EV(lanes_sum)(pg, FSDP_KB_LANES);
    fsdp_kb_nn_row_reduced(FSDP_K_LAYERNORM_BWD, k, 0, st);
    st[1] = EV(lanes_sum)(pgx, FSDP_KB_LANES);
    fsdp_kb_nn_row_reduced(FSDP_K_LAYERNORM_BWD, k, 1, st);
    sg = EV(splat)(st[0]);
    sgx = EV(splat)(st[1]);
    for (size_t c = 0; c < n; c += EV_W) {
        const size_t cnt = EV_CNT(n, c);
        vf xhat = (EV(ldn)(x, dt, o + c, cnt) - mean) * rstd;
        vf d = (EV(ldn)(dy, dt, o + c, cnt) * EV(ldn)(w, dt, c, cnt) - sg - xhat * sgx) * rstd;
        if (k->u.layernorm_bwd.accumulate)
            d = EV(ldn)(dx, dt, o + c, cnt) + EV(rnd)(d, dt);
        EV(stn)(dx, dt, o + c, d, cnt);
    }
}

/* fsdp_kb_softmax_scaled */
EV_INLINE vf EV(softmax_scaled)(vf x, float scale, int by_div, float div, fsdp_dtype_t dt)
{
    return EV(rnd)(by_div ? x / div : x * scale, dt);
}

/* softmax_fwd, row r (fsdp_kb_softmax_fwd_pass) */
EV_ATTR static void EV(softmax_fwd_row)(const fsdp_kernel_t *k, size_t r)
{
    const fsdp_dtype_t dt = k->u.softmax_fwd.dtype;
    const size_t n = k->u.softmax_fwd.cols, o = r * n;
    const size_t valid = k->u.softmax_fwd.causal ? r % n + 1 : n;
    const void *x = k->u.softmax_fwd.x;
    const float s = k->u.softmax_fwd.scale;
    const int by_div = k->u.softmax_fwd.divisor != 0.0f;
    const float dv = fsdp_kb_round_to(k->u.softmax_fwd.divisor, dt);
    void *y = k->u.softmax_fwd.y;
    vf part[EV_NL], m, sum;
    vi nan = (vi)EV(splat)(0.0f);

    EV(zero)(part, -fsdp_kb_inff());
    for (size_t j = 0; j < valid; j += EV_W) {
        vf xv = EV(ldn)(x, dt, o + j, EV_CNT(valid, j));
        nan |= xv != xv;
        EV(max_at)(part, j, EV_CNT(valid, j), EV(softmax_scaled)(xv, s, by_div, dv, dt));
    }
    if (EV_ANY(nan)) {
        fsdp_sim_rows_range(k, 0.0f, r, r + 1);
        return;
    }
    m = EV(splat)(EV(lanes_max)(part));
    EV(zero)(part, 0.0f);
    for (size_t j = 0; j < valid; j += EV_W) {
        const size_t cnt = EV_CNT(valid, j);
        vf e = EV(expf)(EV(softmax_scaled)(EV(ldn)(x, dt, o + j, cnt), s, by_div, dv, dt) - m);
        EV(sum_at)(part, j, cnt, e);
        if (dt == FSDP_DTYPE_F32)
            EV(stn)(y, dt, o + j, e, cnt);
    }
    sum = EV(splat)(EV(lanes_sum)(part, FSDP_KB_LANES));
    for (size_t j = 0; j < valid; j += EV_W) {
        const size_t cnt = EV_CNT(valid, j);
        vf e =
            dt == FSDP_DTYPE_F32
                ? EV(ldn)(y, dt, o + j, cnt)
                : EV(expf)(EV(softmax_scaled)(EV(ldn)(x, dt, o + j, cnt), s, by_div, dv, dt) - m);
        EV(stn)(y, dt, o + j, e / sum, cnt);
    }
    for (size_t j = valid; j < n; j++)
        fsdp_kb_store(y, dt, o + j, 0.0f);
}

/* softmax_bwd, row r (fsdp_kb_softmax_bwd_pass) */
EV_ATTR static void EV(softmax_bwd_row)(const fsdp_kernel_t *k, size_t r)
{
    const fsdp_dtype_t dt = k->u.softmax_bwd.dtype;
    const size_t n = k->u.softmax_bwd.cols, o = r * n;
    const size_t valid = k->u.softmax_bwd.causal ? r % n + 1 : n;
    const void *y = k->u.softmax_bwd.y, *dy = k->u.softmax_bwd.dy;
    const float s = k->u.softmax_bwd.scale;
    const int by_div = k->u.softmax_bwd.divisor != 0.0f;
    const float dv = fsdp_kb_round_to(k->u.softmax_bwd.divisor, dt);
    void *dx = k->u.softmax_bwd.dx;
    vf part[EV_NL], dot;
    vi nan = (vi)EV(splat)(0.0f);

    EV(zero)(part, 0.0f);
    for (size_t j = 0; j < valid; j += EV_W) {
        const size_t cnt = EV_CNT(valid, j);
        vf yv = EV(ldn)(y, dt, o + j, cnt), dyv = EV(ldn)(dy, dt, o + j, cnt);
        nan |= (yv != yv) | (dyv != dyv);
        EV(sum_at)(part, j, cnt, yv * dyv);
    }
    if (EV_ANY(nan)) {
        fsdp_sim_rows_range(k, 0.0f, r, r + 1);
        return;
    }
    dot = EV(splat)(EV(lanes_sum)(part, FSDP_KB_LANES));
    for (size_t j = 0; j < valid; j += EV_W) {
        const size_t cnt = EV_CNT(valid, j);
        vf g = EV(rnd)(EV(ldn)(y, dt, o + j, cnt) * (EV(ldn)(dy, dt, o + j, cnt) - dot), dt);
        EV(stn)(dx, dt, o + j, by_div ? g / dv : s * g, cnt);
    }
    for (size_t j = valid; j < n; j++)
        fsdp_kb_store(dx, dt, o + j, 0.0f);
}

/* cross_entropy, row r (fsdp_kb_cross_entropy_pass); inv_denom = 1 / denom */
EV_ATTR static void EV(cross_entropy_row)(const fsdp_kernel_t *k, float inv_denom, size_t r)
{
    const fsdp_dtype_t dt = k->u.cross_entropy.dtype;
    const size_t v = k->u.cross_entropy.vocab, o = r * v;
    const void *lg = k->u.cross_entropy.logits;
    void *d = k->u.cross_entropy.dlogits;
    const int32_t t = k->u.cross_entropy.targets[r];
    float st[FSDP_KB_ROW_STATE] = {0.0f, 0.0f, 0.0f};
    vf part[EV_NL], m, sum;
    vi nan = (vi)EV(splat)(0.0f);

    if (t < 0 || (size_t)t >= v) { /* a row of one value */
        fsdp_sim_rows_range(k, inv_denom, r, r + 1);
        return;
    }
    st[2] = fsdp_kb_load(lg, dt, o + (size_t)t);
    EV(zero)(part, -fsdp_kb_inff());
    for (size_t j = 0; j < v; j += EV_W) {
        vf l = EV(ldn)(lg, dt, o + j, EV_CNT(v, j));
        nan |= l != l;
        EV(max_at)(part, j, EV_CNT(v, j), l);
    }
    if (EV_ANY(nan)) {
        fsdp_sim_rows_range(k, inv_denom, r, r + 1);
        return;
    }
    st[0] = EV(lanes_max)(part);
    m = EV(splat)(st[0]);
    EV(zero)(part, 0.0f);
    for (size_t j = 0; j < v; j += EV_W) {
        const size_t cnt = EV_CNT(v, j);
        vf e = EV(expf)(EV(ldn)(lg, dt, o + j, cnt) - m);
        EV(sum_at)(part, j, cnt, e);
        if (d != NULL && dt == FSDP_DTYPE_F32)
            EV(stn)(d, dt, o + j, e, cnt);
    }
    st[1] = EV(lanes_sum)(part, FSDP_KB_LANES);
    sum = EV(splat)(st[1]);
    k->u.cross_entropy.losses[r] = (st[0] + fsdp_kb_logf(st[1])) - st[2];
    for (size_t j = 0; d != NULL && j < v; j += EV_W) {
        const size_t cnt = EV_CNT(v, j);
        vf e = dt == FSDP_DTYPE_F32 ? EV(ldn)(d, dt, o + j, cnt)
                                    : EV(expf)(EV(ldn)(lg, dt, o + j, cnt) - m);
        vf p = e / sum, g = p * inv_denom;
        if ((size_t)t >= j && (size_t)t < j + cnt)
            g[t - j] = (p[t - j] - 1.0f) * inv_denom;
        EV(stn)(d, dt, o + j, g, cnt);
    }
}

/* cross_entropy's stages 1 to 3, row r (fsdp_kb_cross_entropy_vp_pass): stage 1 the maximum and
 * the target's logit, stage 2 the sum of exps, stage 3 the loss and dlogits from the reduced
 * stats. Stage 1 only compares and loads, so its bits do not depend on NaNs and no row falls
 * back; stage 2 and 3 hand a row whose logits or stats hold a NaN to the scalar loop (stage 3
 * before it writes: dlogits may be the logits). */
EV_ATTR static void EV(cross_entropy_vp_row)(const fsdp_kernel_t *k, float inv_denom, size_t r)
{
    const fsdp_dtype_t dt = k->u.cross_entropy.dtype;
    const size_t v = k->u.cross_entropy.vocab, o = r * v, rows = k->u.cross_entropy.rows;
    const int32_t t = k->u.cross_entropy.targets[r];
    const size_t tc = fsdp_kb_cross_entropy_vp_col(k, t);
    const void *lg = k->u.cross_entropy.logits;
    void *d = k->u.cross_entropy.dlogits;
    float *stats = k->u.cross_entropy.stats;
    vf part[EV_NL], m;
    vi nan = (vi)EV(splat)(0.0f);

    if (k->u.cross_entropy.stage == 1) {
        const float tl = tc < v ? fsdp_kb_load(lg, dt, o + tc) : 0.0f;
        EV(zero)(part, -fsdp_kb_inff());
        for (size_t j = 0; j < v; j += EV_W)
            EV(max_at)(part, j, EV_CNT(v, j), EV(ldn)(lg, dt, o + j, EV_CNT(v, j)));
        stats[r] = EV(lanes_max)(part);
        stats[2 * rows + r] = tl;
        return;
    }
    m = EV(splat)(stats[r]);
    if (k->u.cross_entropy.stage == 2) {
        EV(zero)(part, 0.0f);
        for (size_t j = 0; j < v; j += EV_W) {
            const size_t cnt = EV_CNT(v, j);
            vf l = EV(ldn)(lg, dt, o + j, cnt);
            nan |= l != l;
            EV(sum_at)(part, j, cnt, EV(expf)(l - m));
        }
        if (EV_ANY(nan) || stats[r] != stats[r]) {
            fsdp_sim_rows_range(k, inv_denom, r, r + 1);
            return;
        }
        stats[rows + r] = EV(lanes_sum)(part, FSDP_KB_LANES);
        return;
    }
    if (t < 0) { /* ignored: zeros, whatever the logits */
        k->u.cross_entropy.losses[r] = 0.0f;
        for (size_t j = 0; d != NULL && j < v; j += EV_W)
            EV(stn)(d, dt, o + j, EV(splat)(0.0f), EV_CNT(v, j));
        return;
    }
    {
        const float gmax = stats[r], sum_s = stats[rows + r], tl = stats[2 * rows + r];
        const vf sum = EV(splat)(sum_s);
        if (gmax != gmax || sum_s != sum_s || tl != tl ||
            (d != NULL && EV(has_nan)(lg, dt, o, v))) {
            fsdp_sim_rows_range(k, inv_denom, r, r + 1);
            return;
        }
        k->u.cross_entropy.losses[r] = (gmax + fsdp_kb_logf(sum_s)) - tl;
        for (size_t j = 0; d != NULL && j < v; j += EV_W) {
            const size_t cnt = EV_CNT(v, j);
            vf p = EV(expf)(EV(ldn)(lg, dt, o + j, cnt) - m) / sum, g = p * inv_denom;
            if (tc >= j && tc < j + cnt)
                g[tc - j] = (p[tc - j] - 1.0f) * inv_denom;
            EV(stn)(d, dt, o + j, g, cnt);
        }
    }
}

/* The loops of a kind of rows over rows [b, e) of a checked descriptor that its check took
 * (fsdp_kb_nn_rows_range, fsdp_kb_llama_host_pass): its row function, row by row */
#define EV_ROWS_LOOP(m)                                                                            \
    EV_ATTR static void EV(m)(const fsdp_kernel_t *k, const fsdp_ev_job_t *job, size_t b,          \
                              size_t e)                                                            \
    {                                                                                              \
        (void)job;                                                                                 \
        for (size_t r = b; r < e; r++)                                                             \
            EV(m##_row)(k, r);                                                                     \
    }

EV_ROWS_LOOP(layernorm_fwd)
EV_ROWS_LOOP(softmax_fwd)
EV_ROWS_LOOP(softmax_bwd)

EV_ATTR static void EV(cross_entropy)(const fsdp_kernel_t *k, const fsdp_ev_job_t *job, size_t b,
                                      size_t e)
{
    for (size_t r = b; r < e; r++) {
        if (k->u.cross_entropy.stage != 0)
            EV(cross_entropy_vp_row)(k, job->ce_scale, r);
        else
            EV(cross_entropy_row)(k, job->ce_scale, r);
    }
}

/* ---- column sums: fsdp_kb_colsum_block, fsdp_kb_rmsnorm_bwd_cols ---- */

/* part[y][v] summed over the row lanes y in the butterfly of fsdp_kb_lane_tree, into part[0] */
EV_INLINE void EV(cols_tree)(vf (*part)[EV_NL])
{
    for (unsigned w = FSDP_KB_ROW_LANES / 2; w > 0; w >>= 1)
        for (unsigned y = 0; y < w; y++)
            for (unsigned v = 0; v < EV_NL; v++)
                part[y][v] = part[y][v] + part[y + w][v];
}

/* Column block b of bias_grad or layernorm_bwd (fsdp_kb_colsum_block). */
EV_ATTR static void EV(colsum_block)(const fsdp_kernel_t *k, size_t b)
{
    const int ln = k->kind == FSDP_K_LAYERNORM_BWD;
    const size_t cols = fsdp_kb_colsum_cols(k), rows = fsdp_kb_colsum_rows(k);
    const size_t c0 = b * FSDP_KB_LANES;
    const size_t nc = cols - c0 < FSDP_KB_LANES ? cols - c0 : FSDP_KB_LANES;
    const size_t nv = (nc + EV_W - 1) / EV_W;
    const fsdp_dtype_t dt = ln ? k->u.layernorm_bwd.dtype : k->u.bias_grad.dy_dtype;
    const void *dy = ln ? k->u.layernorm_bwd.dy : k->u.bias_grad.dy;
    vf part[FSDP_KB_COL_SUMS][FSDP_KB_ROW_LANES][EV_NL];
    vi nan = (vi)EV(splat)(0.0f);
    int bad = 0;

    for (unsigned q = 0; q < FSDP_KB_COL_SUMS; q++)
        for (unsigned y = 0; y < FSDP_KB_ROW_LANES; y++)
            EV(zero)(part[q][y], 0.0f);
    for (size_t r = 0; r < rows; r++) {
        const unsigned y = (unsigned)(r % FSDP_KB_ROW_LANES);
        const size_t o = r * cols + c0;
        if (ln) {
            const float mean_s = k->u.layernorm_bwd.mean[r], rstd_s = k->u.layernorm_bwd.rstd[r];
            const vf mean = EV(splat)(mean_s), rstd = EV(splat)(rstd_s);
            bad |= mean_s != mean_s || rstd_s != rstd_s;
            for (size_t v = 0; v < nv; v++) {
                const size_t cnt = EV_CNT(nc, v * EV_W);
                vf g = EV(ldn)(dy, dt, o + v * EV_W, cnt);
                vf xv = EV(ldn)(k->u.layernorm_bwd.x, dt, o + v * EV_W, cnt);
                nan |= (g != g) | (xv != xv);
                part[0][y][v] = part[0][y][v] + g * ((xv - mean) * rstd);
                part[1][y][v] = part[1][y][v] + g;
            }
        } else {
            for (size_t v = 0; v < nv; v++) {
                vf g = EV(ldn)(dy, dt, o + v * EV_W, EV_CNT(nc, v * EV_W));
                nan |= g != g;
                part[0][y][v] = part[0][y][v] + g;
            }
        }
    }
    if (ln) {
        const fsdp_dtype_t gdt = k->u.layernorm_bwd.dtype;
        bad |= (k->u.layernorm_bwd.dweight != NULL &&
                EV(has_nan)(k->u.layernorm_bwd.dweight, gdt, c0, nc)) ||
               (k->u.layernorm_bwd.dbias != NULL &&
                EV(has_nan)(k->u.layernorm_bwd.dbias, gdt, c0, nc));
    } else {
        bad |= EV(has_nan)(k->u.bias_grad.dbias, k->u.bias_grad.dbias_dtype, c0, nc);
    }
    if (bad || EV_ANY(nan)) {
        fsdp_sim_colsum_range(k, b, b + 1);
        return;
    }
    EV(cols_tree)(part[0]);
    if (ln)
        EV(cols_tree)(part[1]);
    for (size_t v = 0; v < nv; v++) {
        const size_t c = c0 + v * EV_W, cnt = EV_CNT(nc, v * EV_W);
        if (!ln) {
            const fsdp_dtype_t gdt = k->u.bias_grad.dbias_dtype;
            void *db = k->u.bias_grad.dbias;
            EV(stn)(db, gdt, c, EV(ldn)(db, gdt, c, cnt) + EV(rnd)(part[0][0][v], gdt), cnt);
            continue;
        }
        void *dw = k->u.layernorm_bwd.dweight, *db = k->u.layernorm_bwd.dbias;
        if (dw != NULL)
            EV(stn)(dw, dt, c, EV(ldn)(dw, dt, c, cnt) + EV(rnd)(part[0][0][v], dt), cnt);
        if (db != NULL)
            EV(stn)(db, dt, c, EV(ldn)(db, dt, c, cnt) + EV(rnd)(part[1][0][v], dt), cnt);
    }
}

/* bias_grad, column blocks [b, e) */
EV_ATTR static void EV(bias_grad)(const fsdp_kernel_t *k, const fsdp_ev_job_t *job, size_t b,
                                  size_t e)
{
    (void)job;
    for (size_t blk = b; blk < e; blk++)
        EV(colsum_block)(k, blk);
}

/* layernorm_bwd, column blocks [b, e) of its weight and bias gradients or rows [b, e) of its
 * input gradient */
EV_ATTR static void EV(layernorm_bwd)(const fsdp_kernel_t *k, const fsdp_ev_job_t *job, size_t b,
                                      size_t e)
{
    for (size_t i = b; i < e; i++) {
        if (job->what == FSDP_EV_COLS)
            EV(colsum_block)(k, i);
        else
            EV(layernorm_bwd_row)(k, i);
    }
}

/* rmsnorm_bwd pass 0, column block blk (fsdp_kb_rmsnorm_bwd_cols): the rows in order, row r into
 * row lane r % 32, which gives each row lane's rows in the order of the body's loop over them */
EV_ATTR static void EV(rmsnorm_bwd_cols)(const fsdp_kernel_t *k, size_t blk)
{
    const fsdp_dtype_t dt = k->u.rmsnorm_bwd.dtype;
    const size_t n = k->u.rmsnorm_bwd.cols, rows = k->u.rmsnorm_bwd.rows;
    const size_t c0 = blk * FSDP_KB_LANES;
    const size_t nc = n - c0 < FSDP_KB_LANES ? n - c0 : FSDP_KB_LANES;
    const size_t nv = (nc + EV_W - 1) / EV_W;
    void *dw = k->u.rmsnorm_bwd.dweight;
    vf part[FSDP_KB_ROW_LANES][EV_NL];
    vi nan = (vi)EV(splat)(0.0f);
    int bad = 0;

    for (unsigned y = 0; y < FSDP_KB_ROW_LANES; y++)
        EV(zero)(part[y], 0.0f);
    for (size_t r = 0; r < rows; r++) {
        const unsigned y = (unsigned)(r % FSDP_KB_ROW_LANES);
        const size_t o = r * n + c0;
        const float rs = k->u.rmsnorm_bwd.rstd[r];
        bad |= rs != rs;
        for (size_t v = 0; v < nv; v++) {
            const size_t cnt = EV_CNT(nc, v * EV_W);
            vf g = EV(ldn)(k->u.rmsnorm_bwd.dy, dt, o + v * EV_W, cnt);
            vf xv = EV(ldn)(k->u.rmsnorm_bwd.x, dt, o + v * EV_W, cnt);
            nan |= (g != g) | (xv != xv);
            part[y][v] += g * EV(rnd)(xv * rs, dt);
        }
    }
    if (bad || EV_ANY(nan) || EV(has_nan)(dw, dt, c0, nc)) {
        fsdp_sim_pass_range(k, 0, blk, blk + 1);
        return;
    }
    EV(cols_tree)(part);
    for (size_t v = 0; v < nv; v++) {
        const size_t c = c0 + v * EV_W, cnt = EV_CNT(nc, v * EV_W);
        EV(stn)(dw, dt, c, EV(ldn)(dw, dt, c, cnt) + part[0][v], cnt);
    }
}

/* ---- the Llama kernels' rows and elements but attention's ---- */

/* rmsnorm_fwd, row r (fsdp_kb_rmsnorm_fwd_row) */
EV_ATTR static void EV(rmsnorm_fwd_row)(const fsdp_kernel_t *k, size_t r)
{
    const fsdp_dtype_t dt = k->u.rmsnorm_fwd.dtype;
    const size_t n = k->u.rmsnorm_fwd.cols, o = r * n;
    const void *x = k->u.rmsnorm_fwd.x, *w = k->u.rmsnorm_fwd.weight;
    vf part[EV_NL], rv;
    vi nan = (vi)EV(splat)(0.0f);
    float rstd;

    EV(zero)(part, 0.0f);
    for (size_t c = 0; c < n; c += EV_W) {
        vf xv = EV(ldn)(x, dt, o + c, EV_CNT(n, c));
        nan |= xv != xv;
        EV(sum_at)(part, c, EV_CNT(n, c), xv * xv);
    }
    if (EV_ANY(nan)) {
        fsdp_sim_pass_range(k, 0, r, r + 1);
        return;
    }
    rstd = 1.0f / sqrtf(EV(lanes_sum)(part, n) / (float)n + k->u.rmsnorm_fwd.eps);
    rv = EV(splat)(rstd);
    for (size_t c = 0; c < n; c += EV_W) {
        const size_t cnt = EV_CNT(n, c);
        EV(stn)
        (k->u.rmsnorm_fwd.y, dt, o + c,
         EV(rnd)(EV(ldn)(x, dt, o + c, cnt) * rv, dt) * EV(ldn)(w, dt, c, cnt), cnt);
    }
    if (k->u.rmsnorm_fwd.rstd != NULL)
        k->u.rmsnorm_fwd.rstd[r] = rstd;
}

/* rmsnorm_bwd pass 1, row r (fsdp_kb_rmsnorm_bwd_row) */
EV_ATTR static void EV(rmsnorm_bwd_row)(const fsdp_kernel_t *k, size_t r)
{
    const fsdp_dtype_t dt = k->u.rmsnorm_bwd.dtype;
    const size_t n = k->u.rmsnorm_bwd.cols, o = r * n;
    const void *x = k->u.rmsnorm_bwd.x, *dy = k->u.rmsnorm_bwd.dy, *w = k->u.rmsnorm_bwd.weight;
    const float rstd_s = k->u.rmsnorm_bwd.rstd[r];
    const vf rstd = EV(splat)(rstd_s);
    void *dx = k->u.rmsnorm_bwd.dx;
    vf part[EV_NL], dot;
    vi nan = (vi)EV(splat)(0.0f);

    EV(zero)(part, 0.0f);
    for (size_t c = 0; c < n; c += EV_W) {
        const size_t cnt = EV_CNT(n, c);
        vf dv = EV(ldn)(dy, dt, o + c, cnt), xv = EV(ldn)(x, dt, o + c, cnt);
        vf g = EV(rnd)(dv * EV(ldn)(w, dt, c, cnt), dt);
        nan |= (dv != dv) | (xv != xv);
        EV(sum_at)(part, c, cnt, g * (xv * rstd));
    }
    if (EV_ANY(nan) || rstd_s != rstd_s ||
        (k->u.rmsnorm_bwd.accumulate && EV(has_nan)(dx, dt, o, n))) {
        fsdp_sim_pass_range(k, 1, r, r + 1);
        return;
    }
    dot = EV(splat)(EV(lanes_sum)(part, n) / (float)n);
    for (size_t c = 0; c < n; c += EV_W) {
        const size_t cnt = EV_CNT(n, c);
        vf xv = EV(ldn)(x, dt, o + c, cnt);
        vf g = EV(rnd)(EV(ldn)(dy, dt, o + c, cnt) * EV(ldn)(w, dt, c, cnt), dt);
        vf d = (g - (xv * rstd) * dot) * rstd;
        if (k->u.rmsnorm_bwd.accumulate)
            d = EV(ldn)(dx, dt, o + c, cnt) + EV(rnd)(d, dt);
        EV(stn)(dx, dt, o + c, d, cnt);
    }
}

/* fsdp_kb_silu */
EV_INLINE vf EV(silu)(vf g)
{
    return g / (1.0f + EV(expf)(-g));
}

/* swiglu_fwd, elements [b, e) (fsdp_kb_swiglu_fwd_at) */
EV_ATTR static void EV(swiglu_fwd)(const fsdp_kernel_t *k, const fsdp_ev_job_t *job, size_t b,
                                   size_t e)
{
    const fsdp_dtype_t dt = k->u.swiglu_fwd.dtype;
    size_t i = b;

    (void)job;
    for (; i + EV_W <= e; i += EV_W) {
        vf g = EV(ld)(k->u.swiglu_fwd.gate, dt, i), u = EV(ld)(k->u.swiglu_fwd.up, dt, i);
        if (EV_ANY((g != g) | (u != u)))
            fsdp_sim_pass_range(k, 0, i, i + EV_W);
        else
            EV(st)(k->u.swiglu_fwd.y, dt, i, EV(rnd)(EV(silu)(g), dt) * u);
    }
    if (i < e)
        fsdp_sim_pass_range(k, 0, i, e);
}

/* swiglu_bwd, elements [b, e) (fsdp_kb_swiglu_bwd_at) */
EV_ATTR static void EV(swiglu_bwd)(const fsdp_kernel_t *k, const fsdp_ev_job_t *job, size_t b,
                                   size_t e)
{
    const fsdp_dtype_t dt = k->u.swiglu_bwd.dtype;
    size_t i = b;

    (void)job;
    for (; i + EV_W <= e; i += EV_W) {
        vf g = EV(ld)(k->u.swiglu_bwd.gate, dt, i), u = EV(ld)(k->u.swiglu_bwd.up, dt, i);
        vf dy = EV(ld)(k->u.swiglu_bwd.dy, dt, i), sig, dh;
        if (EV_ANY((g != g) | (u != u) | (dy != dy))) {
            fsdp_sim_pass_range(k, 0, i, i + EV_W);
            continue;
        }
        sig = 1.0f / (1.0f + EV(expf)(-g));
        dh = EV(rnd)(dy * u, dt);
        EV(st)(k->u.swiglu_bwd.dup, dt, i, dy * EV(rnd)(EV(silu)(g), dt));
        EV(st)(k->u.swiglu_bwd.dgate, dt, i, dh * (sig * (1.0f + g * (1.0f - sig))));
    }
    if (i < e)
        fsdp_sim_pass_range(k, 0, i, e);
}

/* rope_fwd or rope_bwd, rotation pairs [b, e) (fsdp_kb_rope_at): EV_W pairs of one head at a
 * time, the others one by one */
EV_ATTR static void EV(rope)(const fsdp_kernel_t *k, const fsdp_ev_job_t *job, size_t b, size_t e)
{
    const fsdp_dtype_t dt = k->u.rope.dtype;
    const size_t half = k->u.rope.head_dim / 2, per_row = k->u.rope.heads * half;
    const int backward = k->kind == FSDP_K_ROPE_BWD;

    (void)job;
    for (size_t i = b; i < e;) {
        const size_t r = i / per_row, h = (i - r * per_row) / half, j = i - r * per_row - h * half;
        const size_t p = (r % k->u.rope.seq) * half + j;
        const size_t e1 = r * k->u.rope.ld + h * k->u.rope.head_dim + j, e2 = e1 + half;
        vf c, s, x1, x2, y1, y2;
        if (j + EV_W > half || i + EV_W > e) {
            fsdp_sim_pass_range(k, 0, i, i + 1);
            i++;
            continue;
        }
        c = EV(ld)(k->u.rope.cos, FSDP_DTYPE_F32, p);
        s = EV(ld)(k->u.rope.sin, FSDP_DTYPE_F32, p);
        x1 = EV(ld)(k->u.rope.x, dt, e1);
        x2 = EV(ld)(k->u.rope.x, dt, e2);
        if (EV_ANY((c != c) | (s != s) | (x1 != x1) | (x2 != x2))) {
            fsdp_sim_pass_range(k, 0, i, i + EV_W);
            i += EV_W;
            continue;
        }
        c = EV(rnd)(c, dt);
        s = EV(rnd)(s, dt);
        if (!backward) {
            y1 = EV(rnd)(x1 * c, dt) - EV(rnd)(x2 * s, dt);
            y2 = EV(rnd)(x2 * c, dt) + EV(rnd)(x1 * s, dt);
        } else {
            y1 = EV(rnd)(x1 * c, dt) + EV(rnd)(x2 * s, dt);
            y2 = EV(rnd)(x2 * c, dt) - EV(rnd)(x1 * s, dt);
        }
        EV(st)(k->u.rope.y, dt, e1, y1);
        EV(st)(k->u.rope.y, dt, e2, y2);
        i += EV_W;
    }
}

EV_ROWS_LOOP(rmsnorm_fwd)

/* rmsnorm_bwd, pass 0's column blocks [b, e) or pass 1's rows [b, e) */
EV_ATTR static void EV(rmsnorm_bwd)(const fsdp_kernel_t *k, const fsdp_ev_job_t *job, size_t b,
                                    size_t e)
{
    for (size_t i = b; i < e; i++) {
        if (job->pass == 0)
            EV(rmsnorm_bwd_cols)(k, i);
        else
            EV(rmsnorm_bwd_row)(k, i);
    }
}

#undef EV_ROWS_LOOP
#undef EV_CNT
#undef EV_NL
#undef EV_INLINE
#undef vf
#undef vi
#undef vu
#undef vh
#undef EV
#undef EV_CAT
#undef EV_CAT2
