/*
 * moe.c — the Mixture-of-Experts layer of the model (model.moe_experts; core/README.md, Mixture
 * of Experts): in an MoE layer the MLP after ln2 becomes
 *
 *   logits = ln2·Wrᵀ (fp32)  →  router (moe_router.h): k experts and gates per token
 *   dispatch each token's row to its k experts over the ep group (moe_dispatch.h)
 *   each expert e, an MLP of the architecture's kind (model_arch.h: its tensors and activation),
 *   on the rows it received: GPT-2 ye = GELU(xe·W_upᵀ + b_up)·W_downᵀ + b_down, Llama
 *   ye = (silu(xe·W_gateᵀ)·xe·W_upᵀ)·W_downᵀ
 *   combine: y = Σ_j gate_j · ye(token, slot j), slot order;  out = mid + y
 *
 * Dropless: every (token, slot) is computed, so the layer's result does not depend on how the
 * tokens are spread over ranks. The router and the permutation run on the host (the routing
 * decisions and counts must reach the host before the variable all-to-all anyway); the experts'
 * GEMMs run on the backend, one expert's rows at a time.
 *
 * Tensor parallelism: every tp rank holds all of the layer's tokens (ln2 is the full sequence,
 * gathered under sequence parallelism) and computes the same routing; each expert's MLP is split
 * like the dense one (W_up by rows, W_down by columns), so ye and y are partial sums over the tp
 * group, reduced as the dense MLP's output is. b_down (where the MLP has one) is added by tp rank
 * 0 only. The router and
 * b_down are replicated: their gradients come out identical on every tp rank, and under
 * sequence parallelism (where the data-parallel layer sums replicated gradients over tp) only tp
 * rank 0 contributes them; the router's part of ∂L/∂ln2 is added by tp rank 0 alone, since
 * ∂L/∂ln2 is summed over the group.
 *
 * The balancing loss (moe_router.h, ct_router_aux_loss) is counted per sequence — T is a
 * sequence's tokens, its counts and summed probabilities those of the whole sequence (added over
 * the cp group) — and averaged over the step's sequences, like the language-model loss over its
 * tokens: the one unit that no layout changes (a micro-batch's tokens change with micro_batch,
 * and a global micro-batch's, micro_batch × dp sequences, with dp). It is part of the objective
 * and reported apart from the language-model loss (ct_model_moe_stats).
 */
#include "model_collectives.h"
#include "model_layer.h"
#include "moe_dispatch.h"
#include "moe_router.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* One MoE layer's state for one micro-batch: what its backward needs. Host buffers and backend
 * tensors grow to the largest step seen and are reused. */
typedef struct ct_moe_acts {
    int64_t N; /* tokens (B·T on this rank) */
    ct_moe_plan *plan;
    float aux_scale; /* a sequence's balancing loss's weight in the objective (0: not in it) */
    float dloss;     /* a token's weight in the objective (the z-loss's; 0: not in it) */
    int64_t *counts; /* (B, E) assignments per expert of each sequence (all of it, over cp) */
    size_t cap_counts;
    /* host, grown */
    float *logits, *probs, *gates, *dgates;
    int32_t *ids;
    size_t cap_logits, cap_probs, cap_gates, cap_dgates, cap_ids;
    /* backend, grown: router logits / its gradient (N, E); the experts' input rows (rows, C),
     * hidden before and after GELU (rows, Fe/tp), output rows (rows, C) and the combined
     * output (N, C); the gates and their gradients (N·k, f32); the experts' outputs back at their
     * tokens' ranks in send order (N·k, C), kept for the backward */
    ct_tensor *t_logits, *t_xe, *t_h, *t_g, *t_ye, *t_dh, *t_dg, *t_y, *t_gates, *t_dgates, *t_ys;
    ct_moe_scratch *scratch; /* the dispatch's buffers */
    /* the shared experts: hidden before and after the activation (N, ·), and their gradients */
    ct_tensor *t_sh, *t_sg, *t_sdh, *t_sdg;
} ct_moe_acts;

static void *grow_host(void *p, size_t *cap, size_t bytes) {
    if (bytes <= *cap) return p;
    free(p);
    *cap = bytes;
    return ct_xmalloc(bytes);
}

/* A (rows, cols) view of *buf, which is first grown to hold it; free the view. */
static ct_tensor *grown_view(ct_model *m, ct_tensor **buf, ct_dtype dt, int64_t rows,
                             int64_t cols) {
    int64_t n = CT_MAX(1, rows * cols);
    if (!*buf || (*buf)->numel < n || (*buf)->dtype != dt) {
        ct_tensor_free(*buf);
        *buf = ct_tensor_new_1d(m->be, dt, n, CT_MEM_ACTS);
        CT_ASSERTF(*buf, "out of memory for the MoE layer's %lld x %lld rows", (long long)rows,
                   (long long)cols);
    }
    return ct_tensor_view_2d(*buf, 0, rows, cols);
}

void ct_moe_acts_free(struct ct_moe_acts *ma) {
    if (!ma) return;
    ct_moe_plan_free(ma->plan);
    ct_moe_scratch_free(ma->scratch);
    free(ma->counts);
    free(ma->logits), free(ma->probs), free(ma->gates), free(ma->dgates), free(ma->ids);
    ct_tensor *ts[] = {ma->t_logits, ma->t_xe,  ma->t_h,     ma->t_g,      ma->t_ye,
                       ma->t_dh,     ma->t_dg,  ma->t_y,     ma->t_sh,     ma->t_sg,
                       ma->t_sdh,    ma->t_sdg, ma->t_gates, ma->t_dgates, ma->t_ys};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) ct_tensor_free(ts[i]);
    free(ma);
}

/* log Σ_e exp(x_e) in double. */
static double logsumexp(const float *x, int64_t n) {
    double mx = x[0], sum = 0.0;
    for (int64_t i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    for (int64_t i = 0; i < n; i++) sum += exp(x[i] - mx);
    return mx + log(sum);
}

static ct_router_kind router_kind(const ct_model *m) {
    switch (m->mc.moe_router) {
    case CT_MOE_SOFTMAX_TOPK: return CT_ROUTER_SOFTMAX_TOPK;
    case CT_MOE_SIGMOID: return CT_ROUTER_SIGMOID;
    default: return CT_ROUTER_TOPK_SOFTMAX;
    }
}

/* An MLP (a routed expert, or the shared experts) is named by the MLP fields of a
 * ct_layer_params (w_gate, w_up, b_up, w_down, b_down): those its architecture registers
 * (model_arch.h, mlp_tensors), the others NULL. */

/* Expert j of layer l (j local): ct_model_expert_tensors consecutive registry entries, bound to
 * the MLP fields as the architecture's table says. */
static ct_layer_params expert_mlp(const ct_model *m, int l, int j) {
    const ct_model_arch *arch = m->arch;
    const ct_param *p = m->layers[l].moe_experts + arch->n_mlp_tensors * j;
    CT_ASSERT(p->layer == l &&
              p->expert == m->layout.ep_rank * (int)(m->mc.moe_experts / m->layout.ep_size) + j);
    ct_layer_params w = {0};
    for (int k = 0; k < arch->n_mlp_tensors; k++)
        *(const ct_param **)((char *)&w + arch->mlp_tensors[k].field) = &p[k];
    return w;
}

/* n MLPs at once (the routed experts that received rows, or the shared experts: n = 1), MLP i
 * on rows x[i]: h the hidden before the activation (GPT-2: x·W_upᵀ + b_up; Llama: gate|up =
 * x·Wguᵀ, twice as wide), g after it (GELU; silu(gate)·up), and y = g·W_downᵀ (+ b_down on tp
 * rank 0: once over the tp group) — written into y, or with `accumulate` added to it (the shared
 * experts' output onto the routed ones'). Each projection of all n MLPs is one grouped GEMM
 * (ct_gemm_grouped: one cuBLAS call on CUDA, a loop on the CPU); the bias and activation ops run
 * per MLP. Every MLP's arithmetic is that of one MLP alone: bias_init, then the GEMM accumulating
 * onto it, as ct_gemm_bias(_gelu) compose it. */
static void mlps_forward(ct_model *m, int n, const ct_layer_params *w, ct_tensor *const *x,
                         ct_tensor *const *h, ct_tensor *const *g, ct_tensor *const *y,
                         bool accumulate) {
    if (n == 0) return;
    const ct_tensor **W = ct_xmalloc((size_t)n * sizeof *W);
    ct_tensor **own = ct_xcalloc((size_t)n, sizeof *own);
    const bool up_bias = w[0].b_up != NULL; /* h starts at b_up, the GEMM accumulates onto it */
    const bool bias = w[0].b_down != NULL && m->layout.tp_rank == 0;
    for (int i = 0; i < n; i++) {
        W[i] = own[i] = ct_model_mlp_up_weight(m, &w[i], false);
        if (up_bias) ct_bias_init(h[i], w[i].b_up->value, NULL);
    }
    ct_gemm_grouped(n, h, (const ct_tensor *const *)x, W, false, true, 1.0f, up_bias ? 1.0f : 0.0f);
    for (int i = 0; i < n; i++) {
        m->arch->act.fwd(g[i], h[i]);
        W[i] = w[i].w_down->value;
        if (bias && accumulate)
            ct_bias_add(y[i], w[i].b_down->value);
        else if (bias)
            ct_bias_init(y[i], w[i].b_down->value, NULL);
    }
    ct_model_poll(m);
    ct_gemm_grouped(n, y, (const ct_tensor *const *)g, W, false, true, 1.0f,
                    accumulate || bias ? 1.0f : 0.0f);
    ct_model_poll(m);
    for (int i = 0; i < n; i++) ct_tensor_free(own[i]);
    free(own);
    free(W);
}

/* Their backward from dy[i]: parameter gradients accumulated (b_down's only where
 * `replicated_grads`), dg (rows, width/tp) and dh (h's shape) scratch, and ∂L/∂x written into
 * dx[i] (which may be dy[i] itself: every read of dy comes first) or with `accumulate` added to
 * it. Grouped like the forward; every MLP's arithmetic is that of one MLP alone. */
static void mlps_backward(ct_model *m, int n, const ct_layer_params *w, ct_tensor *const *dy,
                          ct_tensor *const *x, ct_tensor *const *h, ct_tensor *const *g,
                          ct_tensor *const *dg, ct_tensor *const *dh, ct_tensor *const *dx,
                          bool accumulate, bool replicated_grads) {
    if (n == 0) return;
    const ct_tensor **W = ct_xmalloc((size_t)n * sizeof *W);
    ct_tensor **dW = ct_xmalloc((size_t)n * sizeof *dW);
    ct_tensor **own = ct_xcalloc((size_t)(2 * n), sizeof *own);
    const ct_tensor *const *cdy = (const ct_tensor *const *)dy;
    for (int i = 0; i < n; i++) W[i] = w[i].w_down->value, dW[i] = w[i].w_down->grad;
    ct_gemm_grouped(n, dg, cdy, W, false, false, 1.0f, 0.0f); /* dg = dy·W_down */
    ct_model_weight_grads_grouped(m, n, dW, cdy, (const ct_tensor *const *)g, false);
    for (int i = 0; i < n; i++) {
        if (w[i].b_down && replicated_grads) ct_bias_grad(w[i].b_down->grad, dy[i]);
        /* dh, and b_up's gradient where the MLP has one */
        m->arch->act.bwd(dh[i], w[i].b_up ? w[i].b_up->grad : NULL, h[i], dg[i]);
        W[i] = own[i] = ct_model_mlp_up_weight(m, &w[i], false);
        dW[i] = own[n + i] = ct_model_mlp_up_weight(m, &w[i], true);
    }
    ct_model_poll(m);
    const ct_tensor *const *cdh = (const ct_tensor *const *)dh;
    ct_gemm_grouped(n, dx, cdh, W, false, false, 1.0f, accumulate ? 1.0f : 0.0f); /* dh·W_up */
    ct_model_weight_grads_grouped(m, n, dW, cdh, (const ct_tensor *const *)x, false);
    ct_model_poll(m);
    for (int i = 0; i < 2 * n; i++) ct_tensor_free(own[i]);
    free(own), free(W), free(dW);
}

/* The routed experts of layer l that received rows in plan: their parameters, and views of their
 * rows of the expert-major buffers (one array per buffer, NULL-free; free with experts_free). */
typedef struct experts {
    int n;
    ct_layer_params *w;
    int64_t *r0, *rows; /* each one's first row and rows */
} experts;

static experts experts_with_rows(const ct_model *m, int l, const ct_moe_plan *plan) {
    const int El = (int)(m->mc.moe_experts / m->layout.ep_size);
    experts e = {.w = ct_xcalloc((size_t)El, sizeof(ct_layer_params)),
                 .r0 = ct_xcalloc((size_t)El, sizeof(int64_t)),
                 .rows = ct_xcalloc((size_t)El, sizeof(int64_t))};
    for (int j = 0; j < El; j++) {
        const int64_t n = ct_moe_plan_expert_rows(plan, j);
        if (!n) continue;
        e.w[e.n] = expert_mlp(m, l, j);
        e.r0[e.n] = ct_moe_plan_expert_offset(plan, j);
        e.rows[e.n++] = n;
    }
    return e;
}

/* Each expert's rows of buf ((rows, width), expert-major). */
static ct_tensor **expert_views(const experts *e, const ct_tensor *buf) {
    const int64_t width = ct_tensor_cols(buf);
    ct_tensor **v = ct_xcalloc((size_t)CT_MAX(e->n, 1), sizeof *v);
    for (int i = 0; i < e->n; i++)
        v[i] = ct_tensor_view_2d(buf, e->r0[i] * width, e->rows[i], width);
    return v;
}

static void views_free(ct_tensor **v, int n) {
    for (int i = 0; i < n; i++) ct_tensor_free(v[i]);
    free(v);
}

static void experts_free(experts *e) {
    free(e->w), free(e->r0), free(e->rows);
}

/* The index of layer l among this rank's MoE layers (for the step's statistics). */
static int moe_index(const ct_model *m, int l) {
    int n = 0;
    for (int c = 0; c < m->layout.n_chunks; c++)
        for (int i = 0; i < m->layout.chunks[c].n_layers; i++) {
            int k = m->layout.chunks[c].first_layer + i;
            if (k == l) return n;
            n += ct_moe_layer(&m->mc, k);
        }
    CT_ASSERTF(false, "layer %d is not on this rank", l);
    return -1;
}

/* The balancing loss of layer l's routing in ma, per sequence (its T: the sequence's tokens,
 * whatever the layout): assignments and probabilities summed per expert over each sequence's
 * rows, then over the cp group, which holds the rest of every sequence; the weights of the
 * balancing and z-losses in the objective, and, in a training forward, the step's statistics. */
static void balance_stats(ct_model *m, int l, const ct_acts *a, ct_moe_acts *ma) {
    const int64_t E = m->mc.moe_experts, k = m->mc.moe_top_k, N = ma->N;
    const int64_t B = a->B, Tl = m->T, Ts = m->T_seq;
    CT_ASSERT(N == B * Tl);
    double *stat = ct_xcalloc((size_t)(2 * B * E), sizeof *stat);
    for (int64_t t = 0; t < N; t++) {
        double *st = stat + t / Tl * 2 * E;
        for (int64_t j = 0; j < k; j++) st[ma->ids[t * k + j]] += 1.0;
        for (int64_t e = 0; e < E; e++) st[E + e] += ma->probs[t * E + e];
    }
    const bool aux = m->mc.moe_aux_alpha > 0 && a->dloss != 0.0f;
    if (aux && m->layout.cp_size > 1)
        ct_comm_allreduce(m->layout.cp, stat, 2 * B * E, CT_DTYPE_F64, CT_REDUCE_SUM);
    ma->counts = grow_host(ma->counts, &ma->cap_counts, (size_t)(B * E) * sizeof *ma->counts);
    for (int64_t b = 0; b < B; b++)
        for (int64_t e = 0; e < E; e++) ma->counts[b * E + e] = (int64_t)stat[b * 2 * E + e];
    /* Each sequence's loss weighs 1 / (sequences of the step) in the objective, as its tokens'
     * language-model losses weigh dloss = 1 / (tokens of the step) each. */
    ma->aux_scale = aux ? a->dloss * (float)Ts : 0.0f;
    ma->dloss = m->mc.moe_z_alpha > 0 ? a->dloss : 0.0f;
    if (a->dloss != 0.0f && !m->recomputing) {
        /* a training forward (not the backward's rebuild): the step's statistics */
        for (int64_t t = 0; t < N && ma->dloss != 0.0f; t++) {
            const double z = logsumexp(ma->logits + t * E, E);
            m->moe_z_sum += m->mc.moe_z_alpha * z * z * (double)a->dloss;
        }
        int idx = moe_index(m, l);
        for (int64_t b = 0; b < B && aux; b++)
            m->moe_aux_sum += ct_router_aux_loss(ma->counts + b * E, stat + b * 2 * E + E, Ts,
                                                 (int)E, (int)k, m->mc.moe_aux_alpha) *
                              (double)ma->aux_scale;
        for (int64_t e = 0; e < E; e++)
            m->moe_counts[idx * E + e] += ct_moe_plan_sent_to(ma->plan, (int)e);
    }
    free(stat);
}

static void moe_forward(ct_model *m, int l, ct_acts *a, ct_tensor *out) {
    const ct_layer_params *p = &m->layers[l];
    ct_layer_acts *la = &a->layers[l];
    if (!la->moe) la->moe = ct_xcalloc(1, sizeof *la->moe);
    ct_moe_acts *ma = la->moe;
    const int64_t C = m->C, E = m->mc.moe_experts, k = m->mc.moe_top_k;
    const int64_t N = ct_tensor_rows(la->ln2), Fl = p->moe_experts->local_shape[0];
    ma->N = N;

    /* The router: logits in fp32 on the backend, choices on the host. */
    ct_tensor *logits = grown_view(m, &ma->t_logits, CT_DTYPE_F32, N, E);
    ct_gemm(logits, la->ln2, p->moe_router->value, false, true, 1.0f, 0.0f);
    ma->logits = grow_host(ma->logits, &ma->cap_logits, (size_t)(N * E) * sizeof(float));
    ma->probs = grow_host(ma->probs, &ma->cap_probs, (size_t)(N * E) * sizeof(float));
    ct_tensor_to_host(ma->logits, logits); /* (waits for the backend: the routing's clock starts) */
    ct_tensor_free(logits);
    double t0 = ct_now();
    ma->gates = grow_host(ma->gates, &ma->cap_gates, (size_t)(N * k) * sizeof(float));
    ma->ids = grow_host(ma->ids, &ma->cap_ids, (size_t)(N * k) * sizeof(int32_t));
    ct_router_fwd(router_kind(m), ma->logits, m->moe_bias + moe_index(m, l) * E, N, (int)E, (int)k,
                  ma->probs, ma->ids, ma->gates);
    ct_moe_plan_free(ma->plan);
    ma->plan = ct_moe_plan_new(m->layout.ep, ma->ids, N, (int)k, (int)E);

    balance_stats(m, l, a, ma);

    /* The experts' parameters are read from here to the combine (a unit of their own). */
    ct_model_unit_begin(m, m->expert_unit[l], CT_PASS_FORWARD);

    /* Dispatch: each (token, slot)'s row to its expert's rank, grouped by local expert. */
    const int64_t rows = ct_moe_plan_rows(ma->plan);
    if (!ma->scratch) ma->scratch = ct_moe_scratch_new(m->be);
    ct_tensor *xe = grown_view(m, &ma->t_xe, m->dtype, rows, C);
    ct_tensor *ye = grown_view(m, &ma->t_ye, m->dtype, rows, C);
    const int64_t Hl = m->arch->act.hidden * Fl; /* the hidden before the activation */
    ct_tensor *h = grown_view(m, &ma->t_h, m->dtype, rows, Hl);
    ct_tensor *g = grown_view(m, &ma->t_g, m->dtype, rows, Fl);
    ct_moe_dispatch(ma->plan, ma->scratch, la->ln2, xe);

    const bool timed = a->dloss != 0.0f; /* training (the step's clock), not evaluation */
    if (timed) m->moe_route_seconds += ct_now() - t0;
    t0 = ct_now();
    /* The experts, each over the rows it received: every projection one grouped GEMM. */
    experts ex = experts_with_rows(m, l, ma->plan);
    ct_tensor **xv = expert_views(&ex, xe), **hv = expert_views(&ex, h),
              **gv = expert_views(&ex, g);
    ct_tensor **yv = expert_views(&ex, ye);
    mlps_forward(m, ex.n, ex.w, xv, hv, gv, yv, false);
    views_free(xv, ex.n), views_free(hv, ex.n), views_free(gv, ex.n), views_free(yv, ex.n);
    experts_free(&ex);

    /* Combine: the rows back to their tokens, gate-weighted, slot order. */
    ct_model_unit_end(m, m->expert_unit[l], CT_PASS_FORWARD);
    if (timed) {
        m->moe_expert_seconds += ct_now() - t0;
        /* 2 FLOPs a multiply-add; GPT-2's up and down, Llama's gate, up and down */
        m->moe_expert_flops +=
            2.0 * (double)m->arch->act.matmuls * (double)rows * (double)C * (double)Fl;
    }
    t0 = ct_now();
    ct_tensor *gates = grown_view(m, &ma->t_gates, CT_DTYPE_F32, N * k, 1);
    ct_tensor *ys = grown_view(m, &ma->t_ys, m->dtype, N * k, C);
    ct_tensor *y = grown_view(m, &ma->t_y, m->dtype, N, C);
    ct_tensor_from_host(gates, ma->gates);
    ct_moe_combine(ma->plan, ma->scratch, ye, gates, ys, y);
    ct_tensor_free(xe), ct_tensor_free(ye), ct_tensor_free(h), ct_tensor_free(g);
    ct_tensor_free(gates), ct_tensor_free(ys);

    /* out = mid + y, y summed over the tp group (reduce-scattered under sequence parallelism) */
    if (p->w_down) { /* the shared experts, on every token */
        const int64_t Fs = p->w_down->local_shape[1], Hs = m->arch->act.hidden * Fs;
        ct_tensor *sh = grown_view(m, &ma->t_sh, m->dtype, N, Hs);
        ct_tensor *sg = grown_view(m, &ma->t_sg, m->dtype, N, Fs);
        const ct_layer_params *w = p; /* the shared experts: the layer's MLP fields */
        ct_tensor *x = (ct_tensor *)la->ln2;
        mlps_forward(m, 1, w, &x, &sh, &sg, &y, true);
        ct_tensor_free(sh), ct_tensor_free(sg);
    }
    if (m->layout.sequence_parallel && m->layout.tp_size > 1) {
        ct_model_seq_reduce_scatter(m, out, y);
    } else {
        ct_model_tp_allreduce(m, y, CT_REDUCE_SUM);
        ct_tensor_copy(out, y);
    }
    ct_axpy(out, la->mid, 1.0f);
    ct_tensor_free(y);
    if (timed) m->moe_route_seconds += ct_now() - t0;
}

static ct_tensor *moe_backward(ct_model *m, int l, ct_acts *a, ct_grad_scratch *s) {
    const ct_layer_params *p = &m->layers[l];
    ct_layer_acts *la = &a->layers[l];
    ct_moe_acts *ma = la->moe;
    CT_ASSERTF(ma && ma->plan, "layer %d: MoE backward without its forward", l);
    const int64_t C = m->C, E = m->mc.moe_experts, k = m->mc.moe_top_k, N = ma->N;
    const int64_t Fl = p->moe_experts->local_shape[0], rows = ct_moe_plan_rows(ma->plan);
    const bool tp0 = m->layout.tp_rank == 0;
    /* replicated gradients: every tp rank's are the same; summed over tp under SP */
    const bool replicated_grads = tp0 || !m->layout.sequence_parallel;

    /* Combine's backward: dgates (partial over tp: ys is) and the experts' output gradients. */
    const ct_tensor *dy = ct_model_dres_full(m, s);
    double t0 = ct_now();
    ct_tensor *gates = grown_view(m, &ma->t_gates, CT_DTYPE_F32, N * k, 1);
    ct_tensor *ys = grown_view(m, &ma->t_ys, m->dtype, N * k, C);
    ct_tensor *dgates_t = grown_view(m, &ma->t_dgates, CT_DTYPE_F32, N * k, 1);
    ct_tensor *dye = grown_view(m, &ma->t_ye, m->dtype, rows, C);
    ct_moe_combine_bwd(ma->plan, ma->scratch, dy, ys, gates, dgates_t, dye);
    ma->dgates = grow_host(ma->dgates, &ma->cap_dgates, (size_t)CT_MAX(1, N * k) * sizeof(float));
    float *dgates = ma->dgates;
    ct_tensor_to_host(dgates, dgates_t);
    ct_tensor_free(gates), ct_tensor_free(ys), ct_tensor_free(dgates_t);
    if (m->layout.tp_size > 1)
        ct_comm_allreduce(m->layout.tp, dgates, N * k, CT_DTYPE_F32, CT_REDUCE_SUM);

    /* The experts' backward; dye's rows become dxe's. Their unit's gradients are complete
     * after it (every rank runs it, also one whose experts received no rows). */
    ct_model_unit_begin(m, m->expert_unit[l], CT_PASS_BACKWARD);
    ct_tensor *xe = grown_view(m, &ma->t_xe, m->dtype, rows, C);
    const int64_t Hl = m->arch->act.hidden * Fl;
    ct_tensor *h = grown_view(m, &ma->t_h, m->dtype, rows, Hl);
    ct_tensor *g = grown_view(m, &ma->t_g, m->dtype, rows, Fl);
    ct_tensor *dh = grown_view(m, &ma->t_dh, m->dtype, rows, Hl);
    ct_tensor *dg = grown_view(m, &ma->t_dg, m->dtype, rows, Fl);
    m->moe_route_seconds += ct_now() - t0;
    t0 = ct_now();
    experts ex = experts_with_rows(m, l, ma->plan); /* dxe over dye */
    ct_tensor **dyv = expert_views(&ex, dye), **xv = expert_views(&ex, xe);
    ct_tensor **hv = expert_views(&ex, h), **gv = expert_views(&ex, g);
    ct_tensor **dhv = expert_views(&ex, dh), **dgv = expert_views(&ex, dg);
    mlps_backward(m, ex.n, ex.w, dyv, xv, hv, gv, dgv, dhv, dyv, false, replicated_grads);
    views_free(dyv, ex.n), views_free(xv, ex.n), views_free(hv, ex.n), views_free(gv, ex.n);
    views_free(dhv, ex.n), views_free(dgv, ex.n);
    experts_free(&ex);
    ct_model_unit_end(m, m->expert_unit[l], CT_PASS_BACKWARD);
    m->moe_expert_seconds += ct_now() - t0;
    m->moe_expert_flops +=
        4.0 * (double)m->arch->act.matmuls * (double)rows * (double)C * (double)Fl;
    t0 = ct_now();
    ct_tensor_free(xe), ct_tensor_free(h), ct_tensor_free(g);
    ct_tensor_free(dh), ct_tensor_free(dg);

    /* Dispatch's backward: each token's k row gradients summed (partial over tp). */
    ct_moe_dispatch_bwd(ma->plan, ma->scratch, dye, s->dln);
    ct_tensor_free(dye);
    if (p->w_down) { /* the shared experts' backward, into dln */
        const int64_t Fs = p->w_down->local_shape[1], Hs = m->arch->act.hidden * Fs;
        ct_tensor *sh = grown_view(m, &ma->t_sh, m->dtype, N, Hs);
        ct_tensor *sg = grown_view(m, &ma->t_sg, m->dtype, N, Fs);
        ct_tensor *sdh = grown_view(m, &ma->t_sdh, m->dtype, N, Hs);
        ct_tensor *sdg = grown_view(m, &ma->t_sdg, m->dtype, N, Fs);
        const ct_layer_params *w = p; /* the shared experts: the layer's MLP fields */
        ct_tensor *dyc = (ct_tensor *)dy, *x = (ct_tensor *)la->ln2;
        mlps_backward(m, 1, w, &dyc, &x, &sh, &sg, &sdg, &sdh, &s->dln, true, replicated_grads);
        ct_tensor_free(sh), ct_tensor_free(sg), ct_tensor_free(sdh), ct_tensor_free(sdg);
    }

    /* The router's backward, through the gates and the balancing loss. */
    float *dlogits = ct_xmalloc((size_t)(N * E) * sizeof *dlogits);
    ct_router_bwd(router_kind(m), ma->logits, ma->ids, dgates, N, (int)E, (int)k, dlogits);
    if (ma->aux_scale != 0.0f) /* the balancing loss, sequence by sequence */
        for (int64_t b = 0; b < N / m->T; b++)
            ct_router_aux_bwd(router_kind(m), ma->logits + b * m->T * E, ma->counts + b * E,
                              m->T_seq, m->T, (int)E, (int)k, m->mc.moe_aux_alpha, ma->aux_scale,
                              dlogits + b * m->T * E);
    if (ma->dloss != 0.0f) /* the z-loss: α_z·z² a token, z = logsumexp(logits) */
        for (int64_t t = 0; t < N; t++) {
            const float *zl = ma->logits + t * E;
            const double z = logsumexp(zl, E), c = 2.0 * m->mc.moe_z_alpha * z * ma->dloss;
            for (int64_t e = 0; e < E; e++) dlogits[t * E + e] += (float)(c * exp(zl[e] - z));
        }
    ct_tensor *dl = grown_view(m, &ma->t_y, m->dtype, N, E);
    ct_tensor_from_host_f32(dl, dlogits);
    free(dlogits);
    m->moe_route_seconds += ct_now() - t0;
    if (tp0) ct_gemm(s->dln, dl, p->moe_router->value, false, false, 1.0f, 1.0f);
    if (replicated_grads) ct_gemm(p->moe_router->grad, dl, la->ln2, true, false, 1.0f, 1.0f);
    ct_tensor_free(dl);
    return ct_model_dln_reduced(m, s);
}

void ct_model_moe_timing(ct_model *m, double *route_s, double *expert_s, double *expert_flops) {
    *route_s = m->moe_route_seconds, *expert_s = m->moe_expert_seconds;
    *expert_flops = m->moe_expert_flops;
    m->moe_route_seconds = m->moe_expert_seconds = m->moe_expert_flops = 0.0;
}

/* Global layer l's place among the model's MoE layers. */
static int64_t moe_global_index(const ct_model *m, int l) {
    return (l + 1) / m->mc.moe_every - 1;
}

void ct_model_moe_stats(ct_model *m, double *aux, double *z, int64_t *counts) {
    const int64_t E = m->mc.moe_experts;
    *aux = m->moe_aux_sum, *z = m->moe_z_sum;
    m->moe_z_sum = 0;
    memset(counts, 0, (size_t)(ct_moe_layer_count(&m->mc) * E) * sizeof *counts);
    for (int l = 0; l < m->mc.n_layer; l++)
        if (m->layers[l].moe_router)
            memcpy(counts + moe_global_index(m, l) * E, m->moe_counts + moe_index(m, l) * E,
                   (size_t)E * sizeof *counts);
    m->moe_aux_sum = 0;
    memset(m->moe_counts, 0, (size_t)(m->n_moe_layers * E) * sizeof *m->moe_counts);
}

void ct_model_moe_update_bias(ct_model *m, const int64_t *counts) {
    const int64_t E = m->mc.moe_experts;
    for (int l = 0; l < m->mc.n_layer; l++)
        if (m->layers[l].moe_router)
            ct_router_bias_update(counts + moe_global_index(m, l) * E, (int)E,
                                  (float)m->mc.moe_bias_rate, ct_model_moe_bias(m, l));
}

float *ct_model_moe_bias(ct_model *m, int l) {
    if (l < 0 || l >= m->mc.n_layer || !m->layers[l].moe_router) return NULL;
    return m->moe_bias + moe_index(m, l) * m->mc.moe_experts;
}

uint64_t ct_model_moe_routing_digest(const ct_acts *a) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a over every MoE layer's expert choices */
    for (int l = 0; l < a->n_layers; l++) {
        const ct_moe_acts *ma = a->layers[l].moe;
        if (!ma || !ma->plan) continue;
        const int64_t n = ma->N * a->model->mc.moe_top_k;
        for (int64_t i = 0; i < n; i++) h = (h ^ (uint64_t)(uint32_t)ma->ids[i]) * 1099511628211ull;
    }
    return h;
}

size_t ct_model_moe_acts_bytes(const ct_model *m, int64_t B) {
    const int64_t C = m->C, E = m->mc.moe_experts, k = m->mc.moe_top_k, tp = m->layout.tp_size;
    const int64_t Fe = (m->mc.moe_d_ff ? m->mc.moe_d_ff : m->F) / tp, N = B * m->T;
    const int64_t Hl = m->arch->act.hidden * Fe, Fs = m->mc.moe_shared * Fe;
    const int64_t Hs = m->arch->act.hidden * Fs, rows = N * k; /* rows: uniform routing */
    const size_t dt = ct_dtype_size(m->dtype);
    /* the router's logits (f32); the experts' input and output rows, hidden before and after
     * the activation and their gradients; the combined output; the shared experts' hidden; the
     * outputs back in send order (ys) and the dispatch's rows in flight (send, arrived); the
     * gates, their gradients and the gates in send order (f32); the index arrays (i32) */
    const int64_t A = N * k;
    const size_t layer = (size_t)(N * E) * 4 +
                         dt * (size_t)(rows * (2 * C + 2 * Hl + 2 * Fe) + N * C +
                                       N * 2 * (Hs + Fs) + A * C + (A + rows) * C) +
                         (size_t)(3 * A) * 4 + (size_t)(4 * A + 2 * rows) * 4;
    return (size_t)m->n_moe_layers * layer;
}

const ct_model_mlp ct_model_moe_mlp = {.forward = moe_forward, .backward = moe_backward};
