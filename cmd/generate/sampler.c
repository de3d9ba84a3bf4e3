/* sampler.c — text generation in any layout. See sampler.h. */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/model/ring_attention.h"
#include "core/rng.h"
#include "parallel/pipeline.h"

/* The stream of the sampler's uniforms in the counter-based RNG (apart from initialisation's). */
#define SAMPLE_RNG_STREAM 0x5a4d

static int cmp_float_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* An allgather of n host values a rank. A one-rank group bound to the model's stream would copy
 * through the backend (comm.c, local_copy), whose queued copy a host read must not race: on one
 * rank the gather is the values themselves. */
static void host_allgather(ct_comm *tp, const void *mine, void *all, int64_t n, ct_dtype dtype) {
    if (tp->size == 1)
        memcpy(all, mine, (size_t)n * ct_dtype_size(dtype));
    else
        ct_comm_allgather(tp, mine, all, n * tp->size, dtype);
}

/* The k-th largest logit of the whole vocabulary: each rank's k largest, gathered over tp. */
static float top_k_threshold(ct_comm *tp, const float *logits, int64_t n_valid, int64_t k) {
    float *mine = ct_xmalloc((size_t)CT_MAX(n_valid, k) * sizeof(float));
    memcpy(mine, logits, (size_t)n_valid * sizeof(float));
    for (int64_t i = n_valid; i < k; i++) mine[i] = -INFINITY;
    qsort(mine, (size_t)CT_MAX(n_valid, k), sizeof(float), cmp_float_desc);
    float *all = ct_xmalloc((size_t)(k * tp->size) * sizeof(float));
    host_allgather(tp, mine, all, k, CT_DTYPE_F32);
    qsort(all, (size_t)(k * tp->size), sizeof(float), cmp_float_desc);
    float thr = all[k - 1];
    free(mine);
    free(all);
    return thr;
}

int32_t ct_sample_draw(ct_comm *tp, const float *logits, int64_t n_valid, int64_t col_offset,
                       int64_t vocab_size, double u, const ct_sample_options *opt) {
    const double inv_temp = opt ? 1.0 / opt->temperature : 1.0;
    const int64_t top_k = opt ? opt->top_k : 0;
    /* With top-k, logits below the k-th largest are left out (ties with it stay in). */
    const float thr =
        top_k > 0 && top_k < vocab_size ? top_k_threshold(tp, logits, n_valid, top_k) : -INFINITY;
#define WEIGHT(i) (logits[i] >= thr ? exp(((double)logits[i] - max) * inv_temp) : 0.0)
    /* The max over the whole vocabulary (exact in any order). */
    float max = -INFINITY;
    for (int64_t i = 0; i < n_valid; i++) max = fmaxf(max, logits[i]);
    ct_comm_allreduce(tp, &max, 1, CT_DTYPE_F32, CT_REDUCE_MAX);
    /* Each rank's sum of exponentials; rank r's running sum starts from the sums of ranks < r,
     * so it continues the one-rank running sum. */
    double mine = 0.0;
    for (int64_t i = 0; i < n_valid; i++) mine += WEIGHT(i);
    double *sums = ct_xmalloc((size_t)tp->size * sizeof(double));
    host_allgather(tp, &mine, sums, 1, CT_DTYPE_F64);
    double before = 0.0, total = 0.0;
    for (int r = 0; r < tp->size; r++) {
        if (r < tp->rank) before += sums[r];
        total += sums[r];
    }
    free(sums);
    const double target = u * total;
    /* The first crossing wins (MIN over the ranks that see one); none at all (rounding at the
     * very end): the last real token. */
    int32_t token = INT32_MAX;
    double acc = before;
    if (before < target || tp->rank == 0) {
        for (int64_t i = 0; i < n_valid; i++) {
            acc += WEIGHT(i);
            if (acc >= target && logits[i] >= thr) {
                token = (int32_t)(col_offset + i);
                break;
            }
        }
    }
#undef WEIGHT
    ct_comm_allreduce(tp, &token, 1, CT_DTYPE_I32, CT_REDUCE_MIN);
    return token == INT32_MAX ? (int32_t)(vocab_size - 1) : token;
}

typedef struct sampler {
    ct_model *model;
    uint64_t seed;
    int32_t *ids;
    int64_t n;       /* tokens so far */
    int32_t *window; /* (T_seq): the last T_seq tokens, zero-padded */
    int64_t len;     /* real tokens in the window */
    /* context parallelism: this rank's positions of the window (T local), which cp rank holds
     * the window's last real position (it draws; the others receive) and at which local row */
    int32_t *local;
    int owner;
    int64_t last_row;
    float *row; /* (Vp/tp): this rank's logits at the window's last position */
    int64_t k;  /* which new token is being drawn */
    bool draws; /* this forward's last position is the one to draw from (decoding a prompt: not
                   before its last token) */
    int32_t drawn;
    const ct_sample_options *opt;
} sampler;

static void fill_window(void *ctx, int mb, int32_t *tokens, int32_t *targets) {
    sampler *s = ctx;
    size_t bytes = (size_t)ct_model_seq_len(s->model) * sizeof(int32_t);
    memcpy(tokens, s->local, bytes);
    memcpy(targets, s->local, bytes); /* the loss is computed and ignored */
}

/* This rank's positions of the window (all of them without context parallelism), and where the
 * window's last real position is: the cp rank that holds it and its row there. */
static void place_window(sampler *s) {
    const ct_model_layout *l = ct_model_layout_of(s->model);
    const int64_t Tl = ct_model_seq_len(s->model);
    const int cp = CT_MAX(l->cp_size, 1);
    ct_cp_cut(cp, cp > 1 ? l->cp_rank : 0, l->cp_zigzag, Tl, s->window, s->local);
    ct_cp_owner(cp, l->cp_zigzag, Tl, s->len - 1, &s->owner, &s->last_row);
}

/* On the ranks holding the LM head (and, under context parallelism, the window's last real
 * position): draw from the logits there. */
static void draw(void *ctx, int mb, ct_acts *a) {
    sampler *s = ctx;
    const ct_model *m = s->model;
    const ct_model_layout *l = ct_model_layout_of(m);
    if (!s->draws) return;
    if (l->cp_size > 1 && l->cp_rank != s->owner) return; /* the owner's draw arrives later */
    const ct_param *wte = ct_model_head_weight(m);        /* this rank's rows of the vocabulary */
    int64_t Vl = wte->local_shape[0];
    ct_tensor *row = ct_tensor_view_1d(ct_acts_logits(a), s->last_row * Vl, Vl);
    ct_tensor_to_host_f32(s->row, row); /* the model dtype: bf16 logits widened */
    ct_tensor_free(row);
    double u = ct_rng_uniform(s->seed, SAMPLE_RNG_STREAM, (uint64_t)s->k);
    s->drawn = ct_sample_draw(ct_model_layout_of(m)->tp, s->row, wte->valid_rows, wte->tp_offset,
                              ct_model_vocab_size(m), u, s->opt);
}

/* One forward of the model as it stands (a window, or one decoded position): through every
 * stage on the forward-only schedule, or the one chunk list of this rank. */
static void forward(sampler *s, ct_pipeline *pipe, ct_acts *acts) {
    if (pipe) {
        ct_pipeline_run(pipe, false, 0.0f, fill_window, s);
    } else {
        ct_acts_set_batch(acts, -1, s->local, s->local); /* no loss kept */
        ct_model_forward(s->model, acts, 0.0f);
        draw(s, 0, acts);
    }
}

/* The activations of one sequence at the model's current length (a window, or one position
 * while decoding). Allocation failures are agreed on before any collective runs. */
static ct_status sequence_acts(sampler *s, ct_dp *dp, ct_pctx *pctx, ct_pipeline **pipe,
                               ct_acts **acts) {
    ct_status st = pctx->pp > 1
                       ? ct_pipeline_new(pipe, s->model, dp, pctx, CT_SCHEDULE_FORWARD_ONLY, 1, 1)
                       : ct_acts_new(acts, s->model, 1);
    st = ct_pctx_agree(pctx, st);
    if (*pipe) ct_pipeline_set_head_fn(*pipe, draw, s);
    return st;
}

/* The drawn token to every rank: the owner of the last position on the stage with the LM head
 * (the last one, or rank 0 when the chunks form a V) drew it. */
static void share_drawn(sampler *s, ct_pctx *pctx) {
    const int head = ct_model_layout_of(s->model)->v_shape ? 0 : pctx->pp - 1;
    if (pctx->cp > 1 && pctx->pp_rank == head)
        ct_comm_broadcast(pctx->cp_comm, &s->drawn, 1, CT_DTYPE_I32, s->owner);
    if (pctx->pp > 1) ct_comm_broadcast(pctx->pp_comm, &s->drawn, 1, CT_DTYPE_I32, head);
    s->ids[s->n++] = s->drawn;
}

/* Tokens while the whole text fits in seq_len, one position per forward against the key/value
 * cache (ct_model_decode_begin): the prompt's positions once each, then each new token's. Every
 * rank, of every cp group too, runs the row; rank 0 of cp passes the token on as without the
 * cache. Returns with s->k at the first token it did not draw. */
static ct_status sample_cached(sampler *s, ct_dp *dp, ct_pctx *pctx, int64_t n_new) {
    ct_model *m = s->model;
    const int64_t T = m->T_seq;
    if (s->n >= T || n_new == 0) return CT_OK; /* the window slides from the first token */
    ct_status st = ct_pctx_agree(pctx, ct_model_decode_begin(m));
    if (st != CT_OK) return st;
    ct_pipeline *pipe = NULL;
    ct_acts *acts = NULL;
    st = sequence_acts(s, dp, pctx, &pipe, &acts);
    s->owner = 0, s->last_row = 0;
    for (int64_t pos = 0; st == CT_OK && s->k < n_new && s->n <= T; s->k++) {
        for (; pos < s->n; pos++) { /* the positions not yet in the cache */
            ct_model_decode_at(m, pos);
            s->local[0] = s->ids[pos];
            s->draws = pos == s->n - 1;
            forward(s, pipe, acts);
        }
        share_drawn(s, pctx);
    }
    ct_pipeline_free(pipe);
    ct_acts_free(acts);
    ct_model_decode_end(m);
    return st;
}

ct_status ct_sample_tokens(ct_model *m, ct_dp *dp, ct_pctx *pctx, const int32_t *prompt,
                           int64_t n_prompt, int64_t n_new, uint64_t seed,
                           const ct_sample_options *opt, int32_t **out, int64_t *n_out) {
    CT_ASSERT(n_prompt >= 1 && n_new >= 0);
    CT_ASSERT(!opt || (opt->temperature > 0 && opt->top_k >= 0));
    const int64_t T = m->T_seq; /* the window: a whole sequence, cut to cp ranks by place_window */
    sampler s = {.model = m, .seed = seed, .n = n_prompt, .opt = opt};
    s.ids = ct_xmalloc((size_t)(n_prompt + n_new) * sizeof(int32_t));
    memcpy(s.ids, prompt, (size_t)n_prompt * sizeof(int32_t));
    s.window = ct_xcalloc((size_t)T, sizeof(int32_t));
    s.local = ct_xcalloc((size_t)T, sizeof(int32_t));
    /* the last stage's slice of the vocabulary (a middle stage holds no head and draws nothing) */
    const ct_param *wte = ct_model_head_weight(m);
    s.row = ct_xmalloc((size_t)(wte ? wte->local_shape[0] : 1) * sizeof(float));

    ct_status st = opt && opt->full_windows ? CT_OK : sample_cached(&s, dp, pctx, n_new);
    /* Past seq_len (or without the cache): the window of the last T tokens, run whole for every
     * token, as its positions all moved. */
    ct_pipeline *pipe = NULL;
    ct_acts *acts = NULL;
    if (st == CT_OK && s.k < n_new) st = sequence_acts(&s, dp, pctx, &pipe, &acts);
    s.draws = true;
    for (; st == CT_OK && s.k < n_new; s.k++) {
        int64_t start = s.n > T ? s.n - T : 0;
        s.len = s.n - start;
        memset(s.window, 0, (size_t)T * sizeof(int32_t));
        memcpy(s.window, s.ids + start, (size_t)s.len * sizeof(int32_t));
        place_window(&s);
        forward(&s, pipe, acts);
        share_drawn(&s, pctx);
    }
    ct_pipeline_free(pipe);
    ct_acts_free(acts);
    free(s.window);
    free(s.local);
    free(s.row);
    if (st != CT_OK) {
        free(s.ids);
        return st;
    }
    *out = s.ids;
    *n_out = s.n;
    return CT_OK;
}

ct_status ct_sample_print(ct_model *m, ct_dp *dp, ct_pctx *pctx, const ct_tokenizer *tok,
                          const char *prompt_text, int64_t n_new, uint64_t seed,
                          const ct_sample_options *opt) {
    int32_t *prompt = NULL;
    size_t n_prompt =
        ct_tokenizer_encode(tok, (const uint8_t *)prompt_text, strlen(prompt_text), &prompt);
    /* a byte-level tokenizer beside a smaller vocabulary (prepare --byte-level --vocab-size N)
     * can give a token the model has no row for */
    for (size_t i = 0; i < n_prompt; i++) {
        if (prompt[i] < ct_model_vocab_size(m)) continue;
        ct_error(CT_ERR_INPUT,
                 "the prompt's token %d (number %zu of the prompt) is outside the "
                 "model's vocabulary of %lld",
                 prompt[i], i, (long long)ct_model_vocab_size(m));
        ct_hint("the model was trained on text without such bytes: leave them out of the prompt");
        free(prompt);
        return CT_ERR_INPUT;
    }
    if (n_prompt == 0) { /* start from a newline byte */
        prompt = realloc(prompt, sizeof(int32_t));
        CT_ASSERT(prompt != NULL);
        prompt[n_prompt++] = '\n';
    }
    int32_t *ids = NULL;
    int64_t n = 0;
    ct_status st =
        ct_sample_tokens(m, dp, pctx, prompt, (int64_t)n_prompt, n_new, seed, opt, &ids, &n);
    free(prompt);
    if (st != CT_OK) return st;
    if (pctx->world_rank == 0) {
        size_t n_bytes = 0;
        uint8_t *text = ct_tokenizer_decode(tok, ids, (size_t)n, &n_bytes);
        printf("---- sample (%lld tokens) ----\n", (long long)n_new);
        fwrite(text, 1, n_bytes, stdout);
        printf("\n-----------------------------\n");
        free(text);
    }
    free(ids);
    return CT_OK;
}
