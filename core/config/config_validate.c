/*
 * config_validate.c — consistency between keys (divisibility, the rank grid, the batch, the
 * schedule) and the derived values, for a job of a given world size. Each key's own range is
 * checked again here (a caller may fill the struct without the loader).
 */
#include "config_internal.h"

#include "core/backend/backend.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- divisors -------------------------------------------------------------------------------- */

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The divisors of n (n >= 1) in increasing order; returns how many (at most cap). */
static int divisors(int64_t n, int64_t *out, int cap) {
    int count = 0;
    for (int64_t i = 1; i * i <= n && count < cap; i++) {
        if (n % i) continue;
        out[count++] = i;
        if (i != n / i && count < cap) out[count++] = n / i;
    }
    qsort(out, (size_t)count, sizeof *out, cmp_i64);
    return count;
}

/* "1, 2, 4, 8" — the first few divisors of n that `keep` accepts (NULL: all). */
static void list_divisors(int64_t n, bool (*keep)(int64_t d, const void *arg), const void *arg,
                          char *buf, size_t cap) {
    int64_t d[2048];
    int count = divisors(n, d, 2048), shown_count = 0;
    buf[0] = '\0';
    for (int i = 0; i < count; i++) {
        if (keep && !keep(d[i], arg)) continue;
        if (shown_count == 12) {
            append(buf, cap, ", ...");
            break;
        }
        append(buf, cap, "%s%lld", shown_count ? ", " : "", (long long)d[i]);
        shown_count++;
    }
    if (!shown_count) snprintf(buf, cap, "none");
}

/* ---- validation ------------------------------------------------------------------------------ */

typedef struct tp_limits {
    int64_t n_head, n_kv_head, d_ff, vocab_padded, seq_len; /* seq_len 0: no SP constraint */
} tp_limits;

static bool tp_fits(int64_t tp, const void *arg) {
    const tp_limits *l = arg;
    return l->n_head % tp == 0 && l->n_kv_head % tp == 0 && l->d_ff % tp == 0 &&
           l->vocab_padded % tp == 0 && (l->seq_len == 0 || l->seq_len % tp == 0);
}

static ct_status tp_error(const tp_limits *l) {
    char list[256];
    int64_t g = ct_gcd64(ct_gcd64(l->n_head, l->n_kv_head), ct_gcd64(l->d_ff, l->vocab_padded));
    if (l->seq_len) g = ct_gcd64(g, l->seq_len);
    list_divisors(g, tp_fits, l, list, sizeof list);
    return with_hint(CT_ERR_INPUT,
                     "tp must divide n_head, n_kv_head, d_ff and the padded vocabulary%s; valid "
                     "parallel.tp for this model: %s",
                     l->seq_len ? " (and seq_len, with sequence_parallel)" : "", list);
}

/* "4,4,4,4": the even split that an example in a hint can show (empty when it would not fit). */
static void even_split(int64_t n_layer, int64_t chunks, char *buf, size_t cap) {
    buf[0] = '\0';
    if (chunks > 32 || chunks > n_layer) return;
    for (int64_t c = 0; c < chunks; c++)
        append(buf, cap, "%s%lld", c ? "," : "",
               (long long)(n_layer / chunks + (c < n_layer % chunks)));
}

static ct_status check_pp_layers(const ct_config *cfg, int64_t chunks) {
    const char *s = cfg->parallel.pp_layers;
    int64_t n_layer = cfg->model.n_layer, count = 0, sum = 0;
    char example[256], show[80];
    even_split(n_layer, chunks, example, sizeof example);
    shown(s, strlen(s), show, sizeof show);
    for (const char *p = s;;) {
        while (isspace((unsigned char)*p)) p++;
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || v <= 0 || errno == ERANGE)
            return with_hint(
                ct_error(CT_ERR_INPUT,
                         "parallel.pp_layers='%s': entry %lld is not a positive integer", show,
                         (long long)count + 1),
                "give one positive layer count per pipeline chunk, comma-separated%s%s%s",
                example[0] ? ", e.g. \"" : "", example, example[0] ? "\"" : "");
        count++;
        /* Saturate: a huge entry must still read as "does not sum to n_layer", not wrap. */
        sum = (v > n_layer || sum > n_layer) ? n_layer + 1 : sum + v;
        p = end;
        while (isspace((unsigned char)*p)) p++;
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p == '\0') break;
        return with_hint(
            ct_error(CT_ERR_INPUT, "parallel.pp_layers='%s': unexpected '%c'", show, *p),
            "give layer counts separated by commas%s%s%s", example[0] ? ", e.g. \"" : "", example,
            example[0] ? "\"" : "");
    }
    if (count != chunks)
        return with_hint(
            ct_error(CT_ERR_INPUT,
                     "parallel.pp_layers='%s' has %lld entries, but parallel.pp=%lld x "
                     "parallel.virtual_stages=%lld = %lld pipeline chunks",
                     show, (long long)count, (long long)cfg->parallel.pp,
                     (long long)cfg->parallel.virtual_stages, (long long)chunks),
            "give one layer count per chunk%s%s%s", example[0] ? ", e.g. \"" : "", example,
            example[0] ? "\"" : "");
    if (sum != n_layer)
        return with_hint(ct_error(CT_ERR_INPUT,
                                  "parallel.pp_layers='%s' does not sum to model.n_layer=%lld",
                                  show, (long long)n_layer),
                         "the layer counts must add up to n_layer%s%s%s",
                         example[0] ? ", e.g. \"" : "", example, example[0] ? "\"" : "");
    return CT_OK;
}

typedef struct mb_limits {
    int64_t per_rank; /* global_batch / dp */
    int64_t pp;       /* grad_accum must be a multiple of this (1: no constraint) */
} mb_limits;

static bool mb_fits(int64_t mb, const void *arg) {
    const mb_limits *l = arg;
    return l->per_rank % mb == 0 && (l->per_rank / mb) % l->pp == 0;
}

/*
 * train.micro_batch: auto. The largest divisor B of the per-rank batch whose B·seq_len stays
 * within CT_AUTO_MICRO_BATCH_TOKENS (activation memory grows with B·T; 8192 tokens is a few MiB
 * per layer at d_model 256 and keeps GEMMs large). With a pipeline, more microbatches shrink the
 * bubble (p−1)/(m+p−1): B is the largest that still leaves m >= 4·pp microbatches when the batch
 * allows it (then the bubble (p−1)/(5p−1) stays below 20% for any p), and the interleaved
 * schedule's m % pp == 0 always holds. Nothing fits (interleaved with too small a batch): 1, which
 * the checks after it explain.
 */
#define CT_AUTO_MICRO_BATCH_TOKENS 8192

static int64_t auto_micro_batch(int64_t per_rank, int64_t seq_len, int64_t pp, bool interleaved) {
    int64_t d[2048];
    int n = divisors(per_rank, d, 2048);
    const int64_t cap = CT_MAX(1, CT_AUTO_MICRO_BATCH_TOKENS / seq_len);
    const int64_t want_m = pp > 1 ? CT_MIN(4 * pp, per_rank) : 1;
    int64_t best = 0, best_any = 0;
    for (int i = 0; i < n; i++) { /* increasing: the last one accepted is the largest */
        int64_t B = d[i], m = per_rank / B;
        if (B > cap || (interleaved && m % pp)) continue;
        best_any = B;
        if (m >= want_m) best = B;
    }
    return best ? best : best_any ? best_any : 1;
}

int64_t ct_llama_ffn_dim(int64_t d_model, double ffn_dim_multiplier, int64_t multiple_of) {
    CT_ASSERTF(d_model > 0 && multiple_of > 0, "llama ffn: d_model %lld, multiple_of %lld",
               (long long)d_model, (long long)multiple_of);
    int64_t h = 2 * 4 * d_model / 3;
    if (ffn_dim_multiplier > 0) h = (int64_t)(ffn_dim_multiplier * (double)h);
    return (h + multiple_of - 1) / multiple_of * multiple_of;
}

/* Parameters of the model (see config.h: n_params). The table's upper bounds keep every product
 * below 2^62. */
static int64_t model_params(const ct_model_config *m, const ct_derived_config *d) {
    int64_t C = m->d_model, kv = d->n_kv_head * d->head_dim, F = d->d_ff;
    const int64_t head = m->tie_embeddings ? 0 : d->vocab_padded * C; /* an untied lm_head */
    /* An MoE layer: the router (E, C) and E experts of width moe_d_ff instead of the MLP. */
    const int64_t Fe = d->moe_d_ff, E = m->moe_experts;
    const int64_t n_moe = ct_moe_layer_count(m);
    if (m->arch == CT_ARCH_LLAMA)
        return head + d->vocab_padded * C +
               m->n_layer * (2 * C                /* two RMSNorm weights */
                             + C * C + 2 * kv * C /* q, k, v */
                             + C * C              /* attention out */
                             + 3 * F * C)         /* gate, up, down */
               +
               n_moe * (E * C + (E + m->moe_shared) * 3 * Fe * C - 3 * F * C) /* router, experts */
               + C;                                                           /* final norm */
    int64_t layer = 2 * C                  /* ln1 weight + bias */
                    + (C * C + C)          /* q */
                    + 2 * (kv * C + kv)    /* k, v (n_kv_head heads) */
                    + (C * C + C)          /* attention out */
                    + 2 * C                /* ln2 */
                    + (F * C + F)          /* MLP up */
                    + (C * F + C);         /* MLP down */
    const int64_t Fs = m->moe_shared * Fe; /* the shared experts' MLP */
    int64_t moe = layer - (F * C + F) - (C * F + C) + E * C + E * ((Fe * C + Fe) + (C * Fe + C)) +
                  (Fs ? (Fs * C + Fs) + (C * Fs + C) : 0);
    return head + d->vocab_padded * C /* wte (the LM head when tied) */
           + m->seq_len * C           /* wpe */
           + (m->n_layer - n_moe) * layer + n_moe * moe + 2 * C /* final LN */;
}

/* Checks each key against its own constraints (type, range, allowed values). */
static ct_status check_keys(const ct_config *cfg) {
    /* Per-key constraints again: a caller may have filled the struct without the loader. */
    for (int i = 0; i < N_KEYS; i++) {
        const config_key *k = &config_keys[i];
        if (k->type == KEY_STRING && !memchr((const char *)cfg + k->offset, '\0', k->size))
            return with_hint(
                ct_error(CT_ERR_INPUT, "%s.%s is not NUL-terminated", k->section, k->name),
                "this is a bug in the caller that filled the config");
        key_value v = key_load(cfg, k);
        CT_TRY(key_check(k, &v, ""));
    }
    return CT_OK;
}

/* Resolves train.precision (auto: bf16 where the backend that will run multiplies bf16
 * natively, ct_backend_native_bf16) and checks grad_reduce_dtype against it. */
static ct_status resolve_precision(const ct_config *cfg, ct_derived_config *d) {
    const ct_parallel_config *p = &cfg->parallel;
    const ct_train_config *t = &cfg->train;
    ct_precision precision = t->precision;
    char precision_why[96];
    snprintf(precision_why, sizeof precision_why, "train.precision: %s",
             precision_names[t->precision]);
    if (precision == CT_PRECISION_AUTO) {
        char how[80];
        bool native = ct_backend_native_bf16(cfg->runtime_backend, how, sizeof how);
        precision = native ? CT_PRECISION_BF16 : CT_PRECISION_FP32;
        snprintf(precision_why, sizeof precision_why, "auto: %s", how);
    }
    /* Reducing fp32 gradients in bf16 would only lose precision and break the equality of
     * layouts (core/README.md, Determinism); bf16 reduction is an option of bf16 training. */
    if (p->grad_reduce_dtype == CT_PRECISION_BF16 && precision != CT_PRECISION_BF16)
        return with_hint(ct_error(CT_ERR_INPUT,
                                  "parallel.grad_reduce_dtype=bf16 needs bf16 training, but "
                                  "train.precision is fp32 (%s)",
                                  precision_why),
                         "fp32 training reduces gradients in fp32: remove "
                         "parallel.grad_reduce_dtype or set it to fp32");

    d->precision = precision;
    snprintf(d->precision_why, sizeof d->precision_why, "%s", precision_why);
    return CT_OK;
}

/* Derives vocab_padded, n_kv_head, d_ff and head_dim; checks that the heads divide evenly. */
static ct_status check_model(const ct_model_config *m, ct_derived_config *d) {
    char list[256];
    d->vocab_padded = (m->vocab_size + m->vocab_pad - 1) / m->vocab_pad * m->vocab_pad;
    d->n_kv_head = m->n_kv_head ? m->n_kv_head : m->n_head;
    d->d_ff = m->d_ff ? m->d_ff
              : m->arch == CT_ARCH_LLAMA
                  ? ct_llama_ffn_dim(m->d_model, m->ffn_dim_multiplier, m->multiple_of)
                  : 4 * m->d_model;

    /* The model on its own. */
    if (m->d_model % m->n_head) {
        list_divisors(m->d_model, NULL, NULL, list, sizeof list);
        return with_hint(ct_error(CT_ERR_INPUT,
                                  "model.d_model=%lld is not divisible by model.n_head=%lld",
                                  (long long)m->d_model, (long long)m->n_head),
                         "head_dim = d_model / n_head must be a whole number; n_head values that "
                         "divide %lld: %s",
                         (long long)m->d_model, list);
    }
    d->head_dim = m->d_model / m->n_head;
    if (m->arch == CT_ARCH_LLAMA && d->head_dim % 2)
        return with_hint(ct_error(CT_ERR_INPUT,
                                  "model.arch=llama needs an even head_dim (rotary pairs), but "
                                  "d_model=%lld / n_head=%lld = %lld",
                                  (long long)m->d_model, (long long)m->n_head,
                                  (long long)d->head_dim),
                         "choose d_model and n_head so that d_model / n_head is even");
    if (m->rope_scaling_factor > 0 && m->rope_high_freq_factor <= m->rope_low_freq_factor)
        return with_hint(ct_error(CT_ERR_INPUT,
                                  "model.rope_high_freq_factor=%g is not above "
                                  "model.rope_low_freq_factor=%g",
                                  m->rope_high_freq_factor, m->rope_low_freq_factor),
                         "RoPE scaling blends the wavelengths between original_max_pos / high "
                         "and original_max_pos / low (Llama 3.1: high 4, low 1)");
    if (d->n_kv_head > m->n_head || m->n_head % d->n_kv_head) {
        list_divisors(m->n_head, NULL, NULL, list, sizeof list);
        return with_hint(ct_error(CT_ERR_INPUT,
                                  "model.n_kv_head=%lld does not divide model.n_head=%lld",
                                  (long long)d->n_kv_head, (long long)m->n_head),
                         "each key/value head serves n_head / n_kv_head query heads; use one of "
                         "%s (0 = n_head)",
                         list);
    }
    return CT_OK;
}

/* Checks that parallel.tp divides every tensor-parallel dimension of the model. */
static ct_status check_tp(const ct_config *cfg, const ct_derived_config *d) {
    const ct_model_config *m = &cfg->model;
    const ct_parallel_config *p = &cfg->parallel;
    /* The model against the tensor-parallel degree: each rank owns whole heads, a slice of the
     * MLP and of the padded vocabulary. */
    tp_limits tl = {m->n_head, d->n_kv_head, d->d_ff, d->vocab_padded,
                    p->sequence_parallel ? m->seq_len : 0};
    long long tp = (long long)p->tp;
    if (m->n_head % p->tp) {
        ct_error(CT_ERR_INPUT, "parallel.tp=%lld does not divide model.n_head=%lld", tp,
                 (long long)m->n_head);
        return tp_error(&tl);
    }
    if (d->n_kv_head % p->tp) {
        ct_error(CT_ERR_INPUT,
                 "parallel.tp=%lld does not divide the key/value heads (model.n_kv_head=%lld)", tp,
                 (long long)d->n_kv_head);
        return tp_error(&tl);
    }
    if (d->d_ff % p->tp) {
        ct_error(CT_ERR_INPUT, "parallel.tp=%lld does not divide the MLP width (model.d_ff=%lld)",
                 tp, (long long)d->d_ff);
        return tp_error(&tl);
    }
    if (d->vocab_padded % p->tp) {
        ct_error(
            CT_ERR_INPUT,
            "parallel.tp=%lld does not divide the padded vocabulary %lld (model.vocab_size=%lld "
            "rounded up to a multiple of model.vocab_pad=%lld)",
            tp, (long long)d->vocab_padded, (long long)m->vocab_size, (long long)m->vocab_pad);
        return tp_error(&tl);
    }
    if (p->sequence_parallel && m->seq_len % p->tp) {
        ct_error(
            CT_ERR_INPUT,
            "parallel.sequence_parallel needs model.seq_len=%lld divisible by parallel.tp=%lld",
            (long long)m->seq_len, tp);
        return tp_error(&tl);
    }
    return CT_OK;
}

/* Checks the pipeline schedule and the split of the layers over its chunks. */
static ct_status check_pipeline(const ct_config *cfg) {
    const ct_model_config *m = &cfg->model;
    const ct_parallel_config *p = &cfg->parallel;
    char list[256];

    /* The layers against the pipeline. */
    int64_t v = p->virtual_stages, chunks = p->pp * v;
    if (p->schedule == CT_SCHEDULE_ZBV && v != 2)
        return with_hint(ct_error(CT_ERR_INPUT,
                                  "parallel.schedule=zbv runs 2 chunks a rank in a V (got "
                                  "parallel.virtual_stages=%lld)",
                                  (long long)v),
                         "set parallel.virtual_stages: 2");
    if (p->schedule == CT_SCHEDULE_ZBH1 && v > 1)
        return with_hint(ct_error(CT_ERR_INPUT,
                                  "parallel.schedule=zbh1 runs one chunk a rank (got "
                                  "parallel.virtual_stages=%lld)",
                                  (long long)v),
                         "set parallel.virtual_stages: 1");
    if (p->schedule == CT_SCHEDULE_INTERLEAVED && v < 2)
        return with_hint(
            ct_error(CT_ERR_INPUT,
                     "parallel.schedule=interleaved needs parallel.virtual_stages >= 2 "
                     "(got %lld)",
                     (long long)v),
            "set parallel.virtual_stages: 2 (or more), or use parallel.schedule: 1f1b");
    if (p->schedule == CT_SCHEDULE_INTERLEAVED && p->pp < 2)
        return with_hint(
            ct_error(CT_ERR_INPUT,
                     "parallel.schedule=interleaved needs parallel.pp >= 2 (got %lld)",
                     (long long)p->pp),
            "interleaving spreads chunks over pipeline ranks: use parallel.pp: 2 or more, or "
            "parallel.schedule: 1f1b with parallel.virtual_stages: 1");
    if (p->schedule != CT_SCHEDULE_INTERLEAVED && p->schedule != CT_SCHEDULE_ZBV && v > 1)
        return with_hint(
            ct_error(CT_ERR_INPUT,
                     "parallel.virtual_stages=%lld needs parallel.schedule=interleaved "
                     "(got %s)",
                     (long long)v, schedule_names[p->schedule]),
            "only the interleaved and zbv schedules run several chunks per rank: set "
            "parallel.schedule: interleaved or parallel.virtual_stages: 1");
    if (m->n_layer < chunks)
        return with_hint(ct_error(CT_ERR_INPUT,
                                  "model.n_layer=%lld is fewer than the %lld pipeline chunks "
                                  "(parallel.pp=%lld x parallel.virtual_stages=%lld)",
                                  (long long)m->n_layer, (long long)chunks, (long long)p->pp,
                                  (long long)v),
                         "every chunk needs at least one layer: lower parallel.pp or "
                         "parallel.virtual_stages");
    if (p->pp_layers[0]) {
        CT_TRY(check_pp_layers(cfg, chunks));
    } else if (m->n_layer % chunks) {
        char example[256];
        even_split(m->n_layer, chunks, example, sizeof example);
        list_divisors(m->n_layer, NULL, NULL, list, sizeof list);
        return with_hint(
            ct_error(CT_ERR_INPUT,
                     "model.n_layer=%lld does not split evenly over parallel.pp=%lld x "
                     "parallel.virtual_stages=%lld = %lld pipeline chunks",
                     (long long)m->n_layer, (long long)p->pp, (long long)v, (long long)chunks),
            "use pp * virtual_stages dividing %lld (%s), or give an uneven split "
            "with parallel.pp_layers%s%s%s",
            (long long)m->n_layer, list, example[0] ? ": \"" : "", example, example[0] ? "\"" : "");
    }
    return CT_OK;
}

/* Checks that the tp x cp x pp x dp grid fits the world size, and derives dp. */
static ct_status check_grid(const ct_parallel_config *p, int64_t world_size, ct_derived_config *d) {
    /* The grid against the world: rank = tp_rank + tp·(cp_rank + cp·(dp_rank + dp·pp_rank)). */
    long long tp = (long long)p->tp, cp = (long long)p->cp;
    int64_t mp = p->tp * p->pp * p->cp;
    char cp_part[48] = "";
    if (p->cp > 1) snprintf(cp_part, sizeof cp_part, " x parallel.cp=%lld", cp);
    if (p->dp && mp * p->dp != world_size)
        return with_hint(
            ct_error(CT_ERR_INPUT,
                     "parallel.tp=%lld%s x parallel.pp=%lld x parallel.dp=%lld = %lld "
                     "ranks, but the world size is %lld",
                     tp, cp_part, (long long)p->pp, (long long)p->dp, (long long)(mp * p->dp),
                     (long long)world_size),
            "launch %lld ranks, or set parallel.dp: 0 so that dp = world_size / (tp * cp * pp)",
            (long long)(mp * p->dp));
    if (world_size % mp)
        return with_hint(
            ct_error(CT_ERR_INPUT,
                     "parallel.tp=%lld%s x parallel.pp=%lld = %lld ranks per model "
                     "replica does not divide the world size %lld",
                     tp, cp_part, (long long)p->pp, (long long)mp, (long long)world_size),
            "launch a multiple of %lld ranks (mpirun -np N), or choose tp, cp and pp whose "
            "product divides %lld",
            (long long)mp, (long long)world_size);
    d->dp = world_size / mp;
    return CT_OK;
}

/* Context parallelism: every rank holds two whole chunks of each sequence (with sequence
 * parallelism, whole tp slices of them), and the sampler after training needs the whole window
 * on one rank. */
static ct_status check_cp(const ct_config *cfg) {
    const ct_parallel_config *p = &cfg->parallel;
    if (p->cp == 1) return CT_OK;
    const int64_t T = cfg->model.seq_len, unit = 2 * p->cp * (p->sequence_parallel ? p->tp : 1);
    if (T % unit)
        return with_hint(
            ct_error(CT_ERR_INPUT,
                     "parallel.cp=%lld needs model.seq_len=%lld divisible by 2 x cp%s = %lld "
                     "(each rank holds 2 of the sequence's 2 x cp chunks%s)",
                     (long long)p->cp, (long long)T, p->sequence_parallel ? " x parallel.tp" : "",
                     (long long)unit, p->sequence_parallel ? ", each split over the tp group" : ""),
            "use model.seq_len=%lld or %lld, or another parallel.cp", (long long)(T / unit * unit),
            (long long)((T / unit + 1) * unit));
    return CT_OK;
}

/* Checks the Mixture-of-Experts keys against the model and the grid (after check_grid: needs
 * dp), and derives moe_d_ff. */
static ct_status check_moe(const ct_config *cfg, ct_derived_config *d) {
    const ct_model_config *m = &cfg->model;
    const ct_parallel_config *p = &cfg->parallel;
    const long long E = (long long)m->moe_experts, ep = (long long)p->ep;
    char list[256];
    if (!E) {
        if (p->ep > 1)
            return with_hint(ct_error(CT_ERR_INPUT,
                                      "parallel.ep=%lld, but the model has no experts "
                                      "(model.moe_experts=0)",
                                      ep),
                             "expert parallelism spreads the experts of MoE layers: set "
                             "model.moe_experts, or parallel.ep: 1");
        return CT_OK;
    }
    d->moe_d_ff = m->moe_d_ff ? m->moe_d_ff : d->d_ff;
    if (m->moe_top_k > m->moe_experts)
        return with_hint(ct_error(CT_ERR_INPUT,
                                  "model.moe_top_k=%lld is more than model.moe_experts=%lld",
                                  (long long)m->moe_top_k, E),
                         "each token goes to top_k different experts: use moe_top_k <= %lld", E);
    if (m->moe_every > m->n_layer)
        return with_hint(ct_error(CT_ERR_INPUT,
                                  "model.moe_every=%lld leaves no MoE layer among model.n_layer="
                                  "%lld layers",
                                  (long long)m->moe_every, (long long)m->n_layer),
                         "layers moe_every - 1, 2 * moe_every - 1, ... are MoE layers: use "
                         "moe_every <= %lld",
                         (long long)m->n_layer);
    if (d->moe_d_ff % p->tp) {
        list_divisors(d->moe_d_ff, NULL, NULL, list, sizeof list);
        return with_hint(ct_error(CT_ERR_INPUT,
                                  "parallel.tp=%lld does not divide the experts' width "
                                  "(model.moe_d_ff=%lld)",
                                  (long long)p->tp, (long long)d->moe_d_ff),
                         "each tp rank holds a slice of every expert's MLP; tp values that divide "
                         "%lld: %s",
                         (long long)d->moe_d_ff, list);
    }
    if (d->dp % p->ep || m->moe_experts % p->ep) {
        list_divisors(ct_gcd64(d->dp, m->moe_experts), NULL, NULL, list, sizeof list);
        return with_hint(ct_error(CT_ERR_INPUT,
                                  "parallel.ep=%lld must divide both dp=%lld and "
                                  "model.moe_experts=%lld",
                                  ep, (long long)d->dp, E),
                         "an expert-parallel group is ep consecutive data-parallel ranks, each "
                         "holding moe_experts / ep experts; ep values that divide both: %s",
                         list);
    }
    return CT_OK;
}

/* Checks the batch against dp (picking micro_batch when auto), and derives grad_accum. */
static ct_status check_batch(ct_config *cfg, ct_derived_config *d) {
    const ct_model_config *m = &cfg->model;
    const ct_parallel_config *p = &cfg->parallel;
    const ct_train_config *t = &cfg->train;
    char list[256];

    /* The batch: global_batch = micro_batch · dp · grad_accum, fixed whatever the layout. */
    if (t->micro_batch == 0 || t->micro_batch_auto) {
        if (t->global_batch % d->dp)
            return with_hint(
                ct_error(CT_ERR_INPUT, "train.global_batch=%lld is not divisible by dp=%lld",
                         (long long)t->global_batch, (long long)d->dp),
                "every data-parallel rank takes global_batch / dp sequences: use a multiple of "
                "%lld, e.g. train.global_batch=%lld",
                (long long)d->dp, (long long)((t->global_batch / d->dp + 1) * d->dp));
        cfg->train.micro_batch = auto_micro_batch(t->global_batch / d->dp, m->seq_len, p->pp,
                                                  p->schedule == CT_SCHEDULE_INTERLEAVED);
        cfg->train.micro_batch_auto = true;
    }
    int64_t per_mb = t->micro_batch * d->dp;
    if (t->global_batch % per_mb) {
        ct_error(
            CT_ERR_INPUT,
            "train.global_batch=%lld is not divisible by train.micro_batch=%lld x dp=%lld = %lld",
            (long long)t->global_batch, (long long)t->micro_batch, (long long)d->dp,
            (long long)per_mb);
        if (t->global_batch % d->dp)
            return with_hint(CT_ERR_INPUT,
                             "global_batch must be a multiple of micro_batch * dp; with "
                             "micro_batch=%lld and dp=%lld try train.global_batch=%lld",
                             (long long)t->micro_batch, (long long)d->dp,
                             (long long)((t->global_batch / per_mb + 1) * per_mb));
        mb_limits ml = {t->global_batch / d->dp, 1};
        list_divisors(ml.per_rank, mb_fits, &ml, list, sizeof list);
        return with_hint(CT_ERR_INPUT,
                         "valid train.micro_batch values with dp=%lld: %s (or "
                         "train.micro_batch: auto, which picks one for any dp)",
                         (long long)d->dp, list);
    }
    d->grad_accum = t->global_batch / per_mb;
    if (p->schedule == CT_SCHEDULE_INTERLEAVED && d->grad_accum % p->pp) {
        mb_limits ml = {t->global_batch / d->dp, p->pp};
        list_divisors(ml.per_rank, mb_fits, &ml, list, sizeof list);
        return with_hint(
            ct_error(CT_ERR_INPUT,
                     "parallel.schedule=interleaved needs the microbatch count "
                     "(grad_accum=%lld = train.global_batch=%lld / (train.micro_batch=%lld "
                     "x dp=%lld)) to be a multiple of parallel.pp=%lld",
                     (long long)d->grad_accum, (long long)t->global_batch,
                     (long long)t->micro_batch, (long long)d->dp, (long long)p->pp),
            "valid train.micro_batch values for this schedule: %s (or raise "
            "train.global_batch)",
            list);
    }
    return CT_OK;
}

/* Checks that the learning-rate schedule fits: min_lr <= lr; bounds warmup by the run. */
static ct_status check_lr_schedule(ct_train_config *t, ct_derived_config *d) {
    char a[64], b[64];

    /* The optimizer schedule. */
    if (t->min_lr > t->lr) {
        format_double(t->min_lr, a, sizeof a);
        format_double(t->lr, b, sizeof b);
        return with_hint(ct_error(CT_ERR_INPUT, "train.min_lr=%s is larger than train.lr=%s", a, b),
                         "the learning rate decays from lr down to min_lr: lower train.min_lr or "
                         "raise train.lr");
    }
    /* A warmup longer than the run is bounded by it (a ready config tried for a few steps with
     * --set train.steps=N): the trainer says so at start-up. */
    d->warmup_asked = 0;
    if (t->warmup_steps > t->steps) {
        d->warmup_asked = t->warmup_steps;
        t->warmup_steps = t->steps;
    }
    return CT_OK;
}

/* Checks that checkpoint settings that need a directory have one. */
static ct_status check_checkpoint(const ct_config *cfg) {
    const ct_checkpoint_config *c = &cfg->checkpoint;
    if (!c->dir[0] && c->local_interval > 0)
        return with_hint(ct_error(CT_ERR_INPUT,
                                  "checkpoint.local_interval=%lld but checkpoint.dir is not set",
                                  (long long)c->local_interval),
                         "local checkpoints restart through checkpoint.dir (a restart gathers "
                         "the newest complete local step there): set it");
    if (c->dir[0] || c->interval == 0) return CT_OK;
    return with_hint(ct_error(CT_ERR_INPUT,
                              "checkpoint.interval=%lld but checkpoint.dir is not set",
                              (long long)c->interval),
                     "set checkpoint.dir to the directory the checkpoints go to");
}

/* log.profile waits for the stream around every op, which is idle time log.device_idle would
 * measure: one run measures one of them. */
static ct_status check_log(const ct_log_config *l) {
    if (!(l->profile && l->device_idle)) return CT_OK;
    return with_hint(ct_error(CT_ERR_INPUT, "log.profile and log.device_idle are both on"),
                     "the profile's wait after every op is idle time the audit would count: "
                     "measure them in two runs (--profile, then --device-idle)");
}

/* train.cuda_graph: a graph replays the device's work and none of the host's, so the step it
 * holds may not need the host between its ops (cmd/train/trainer.c, graph_step). */
static ct_status check_cuda_graph(const ct_config *cfg, int64_t world_size) {
    const char *why = NULL, *hint = NULL;
    char buf[160];
    if (!cfg->train.cuda_graph) return CT_OK;
    if (strcmp(cfg->runtime_backend, "cuda") != 0) {
        snprintf(buf, sizeof buf, "the %s backend has no graphs", cfg->runtime_backend);
        why = buf, hint = "run with --backend cuda, or leave train.cuda_graph off";
    } else if (world_size > 1) {
        snprintf(buf, sizeof buf, "it captures a one-process step, and the world size is %lld",
                 (long long)world_size);
        why = buf, hint = "run one process, or leave train.cuda_graph off: with several ranks "
                          "the step waits on the host for its communication";
    } else if (cfg->model.moe_experts > 0) {
        why = "Mixture of Experts routes its tokens on the host inside the step";
        hint = "leave train.cuda_graph off for model.moe_experts > 0";
    } else if (cfg->log.profile || cfg->log.device_idle || cfg->log.trace[0]) {
        why = "log.profile, log.device_idle and log.trace time the ops one by one";
        hint = "measure without the graph, or run the graph without them";
    }
    if (!why) return CT_OK;
    return with_hint(ct_error(CT_ERR_INPUT, "train.cuda_graph is on, but %s", why), "%s", hint);
}

ct_status ct_config_validate(ct_config *cfg, int64_t world_size) {
    CT_ASSERTF(world_size >= 1, "world size %lld", (long long)world_size);
    memset(&cfg->derived, 0, sizeof cfg->derived);
    CT_TRY(check_keys(cfg));

    ct_derived_config d;
    memset(&d, 0, sizeof d);
    CT_TRY(resolve_precision(cfg, &d));
    d.world_size = world_size;
    CT_TRY(check_model(&cfg->model, &d));
    CT_TRY(check_tp(cfg, &d));
    CT_TRY(check_pipeline(cfg));
    CT_TRY(check_grid(&cfg->parallel, world_size, &d));
    CT_TRY(check_cp(cfg));
    CT_TRY(check_moe(cfg, &d));
    CT_TRY(check_batch(cfg, &d));
    CT_TRY(check_lr_schedule(&cfg->train, &d));
    CT_TRY(check_checkpoint(cfg));
    CT_TRY(check_log(&cfg->log));
    CT_TRY(check_cuda_graph(cfg, world_size));

    d.tokens_per_step = cfg->train.global_batch * cfg->model.seq_len;
    d.n_params = model_params(&cfg->model, &d);
    cfg->derived = d;
    return CT_OK;
}

int64_t ct_config_unit_min_bytes(const ct_config *cfg) {
    return (int64_t)(cfg->parallel.bucket_mb * 1024.0 * 1024.0);
}
