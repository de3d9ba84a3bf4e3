/* checkpoint_io.c — saving and loading a run's state in any layout. See checkpoint_io.h. */
#include "checkpoint_io.h"

#include <stdlib.h>
#include <string.h>

#include "core/optim.h"

/* Every rank gets the worst status (one process needs no agreement). */
static ct_status agree(const ct_pctx *pctx, ct_status st) {
    return pctx->world_size == 1 ? st : ct_mpi_agree(st);
}

/* The box of the global tensor that this rank's slice of p covers ((n, 1) for 1-D tensors). */
static ct_ckpt_box param_box(const ct_param *p) {
    ct_ckpt_box b;
    memset(&b, 0, sizeof b);
    /* the twin of the tied embedding is stored as the tensor it is tied to */
    snprintf(b.name, sizeof b.name, "%s", p->tied_to ? p->tied_to : p->name);
    b.rows = p->global_shape[0];
    b.cols = p->global_shape[1];
    b.row1 = b.rows;
    b.col1 = b.cols;
    if (p->tp_split_dim == 0) {
        b.row0 = p->tp_offset;
        b.row1 = p->tp_offset + p->local_shape[0];
    } else if (p->tp_split_dim == 1) {
        b.col0 = p->tp_offset;
        b.col1 = p->tp_offset + p->local_shape[1];
    }
    return b;
}

/* One run of this rank's optimizer state: elements [a, b) of parameter p (its local flat
 * order, which is the row-major order of its box), at position `at` of the unit's state
 * range. */
typedef struct state_run {
    const ct_param *param;
    int unit;
    int64_t a, b, at;
} state_run;

/* Calls fn for every run of parameter elements in this rank's optimizer ranges; `saving` leaves
 * out the elements another rank saves (see checkpoint_io.h). */
static ct_status for_each_run(ct_model *model, ct_dp *dp, const ct_pctx *pctx, bool saving,
                              ct_status (*fn)(void *ctx, const state_run *run), void *ctx) {
    const bool zero = ct_dp_stage(dp) >= 1;
    if (saving && !zero && pctx->dp_rank != 0) return CT_OK;
    for (int i = 0; i < ct_model_n_params(model); i++) {
        const ct_param *p = ct_model_param(model, i);
        if (saving && (p->tied_to || (p->tp_split_dim < 0 && pctx->tp_rank != 0))) continue;
        int64_t lo, n;
        ct_dp_unit_range(dp, p->unit, &lo, &n);
        int64_t a = CT_MAX(p->offset, lo), b = CT_MIN(p->offset + p->numel, lo + n);
        if (b <= a) continue;
        state_run run = {
            .param = p, .unit = p->unit, .a = a - p->offset, .b = b - p->offset, .at = a - lo};
        CT_TRY(fn(ctx, &run));
    }
    return CT_OK;
}

/* ---- saving ------------------------------------------------------------------------------- */

typedef struct saver {
    ct_dp *dp;
    int64_t step;
    ct_ckpt_writer *writer;
    ct_ckpt_piece *pieces;
    int64_t n, cap;
    float *host;
    int64_t host_cap;
} saver;

static ct_status save_run(void *ctx, const state_run *run) {
    saver *s = ctx;
    ct_tensor *state[CT_CKPT_KIND_COUNT];
    ct_dp_unit_state(s->dp, run->unit, &state[CT_CKPT_WEIGHT], &state[CT_CKPT_ADAM_M],
                     &state[CT_CKPT_ADAM_V]);
    const int64_t len = run->b - run->a;
    if (len > s->host_cap) {
        s->host_cap = len;
        free(s->host);
        s->host = ct_xmalloc((size_t)len * sizeof(float));
    }
    ct_status st = CT_OK;
    for (int k = 0; k < CT_CKPT_KIND_COUNT && st == CT_OK; k++) {
        if (s->n == s->cap) {
            s->cap = s->cap ? 2 * s->cap : 256;
            s->pieces = realloc(s->pieces, (size_t)s->cap * sizeof *s->pieces);
            CT_ASSERT(s->pieces != NULL);
        }
        ct_ckpt_piece *pc = &s->pieces[s->n++];
        memset(pc, 0, sizeof *pc);
        pc->box = param_box(run->param);
        pc->box.kind = k;
        pc->box.lo = run->a;
        pc->box.hi = run->b;
        ct_tensor *v = ct_tensor_view_1d(state[k], run->at, len);
        ct_tensor_to_host_f32(s->host, v);
        ct_tensor_free(v);
        st = ct_ckpt_writer_add(s->writer, pc, s->host);
        if (k == 0 && s->n == 1) ct_ckpt_crash_point("mid-file", s->step);
    }
    for (int k = 0; k < CT_CKPT_KIND_COUNT; k++) ct_tensor_free(state[k]);
    return st;
}

/* Every rank's pieces to world rank 0: counts, then the records padded to the largest count. */
static ct_ckpt_piece *gather_pieces(const ct_pctx *pctx, const saver *s, int64_t *total) {
    const int N = pctx->world_size;
    int64_t *counts = ct_xcalloc((size_t)N, sizeof *counts);
    counts[pctx->world_rank] = s->n;
    ct_comm_allreduce(pctx->world, counts, N, CT_DTYPE_I64, CT_REDUCE_SUM);
    int64_t most = 0;
    *total = 0;
    for (int r = 0; r < N; r++) most = CT_MAX(most, counts[r]), *total += counts[r];
    const size_t each = (size_t)CT_MAX(most, 1) * sizeof(ct_ckpt_piece);
    uint8_t *all = ct_xcalloc((size_t)N, each);
    memcpy(all + (size_t)pctx->world_rank * each, s->pieces, (size_t)s->n * sizeof *s->pieces);
    ct_comm_allgather(pctx->world, all + (size_t)pctx->world_rank * each, all, (int64_t)each * N,
                      CT_DTYPE_U8);
    ct_ckpt_piece *pieces = ct_xcalloc((size_t)CT_MAX(*total, 1), sizeof *pieces);
    int64_t k = 0;
    for (int r = 0; r < N; r++) {
        memcpy(pieces + k, all + (size_t)r * each, (size_t)counts[r] * sizeof *pieces);
        k += counts[r];
    }
    free(all);
    free(counts);
    return pieces;
}

static ct_ckpt_state run_state(const ct_config *cfg, const ct_pctx *pctx, int64_t step,
                               int64_t optimizer_step) {
    const ct_model_config *mc = &cfg->model;
    ct_ckpt_state s = {
        .step = step,
        .samples_seen = step * cfg->train.global_batch,
        .tokens_seen = step * cfg->train.global_batch * mc->seq_len,
        .optimizer_step = optimizer_step,
        .seed = (int64_t)cfg->train.seed,
        .global_batch = cfg->train.global_batch,
        .arch = mc->arch,
        .vocab_size = mc->vocab_size,
        .vocab_pad = mc->vocab_pad,
        .seq_len = mc->seq_len,
        .n_layer = mc->n_layer,
        .d_model = mc->d_model,
        .n_head = mc->n_head,
        .n_kv_head = cfg->derived.n_kv_head,
        .d_ff = cfg->derived.d_ff,
        .world_size = pctx->world_size,
        .tp = pctx->tp,
        .pp = pctx->pp,
        .dp = pctx->dp,
        .zero_stage = cfg->parallel.zero_stage,
        .virtual_stages = cfg->parallel.virtual_stages,
        .precision = cfg->derived.precision,
        .format_version = 1,
    };
    return s;
}

/* Rank 0: the manifest into step-N.tmp, then publish and prune. */
static ct_status write_manifest(const ct_config *cfg, const ct_pctx *pctx, int64_t step,
                                int64_t optimizer_step, ct_ckpt_piece *pieces, int64_t n) {
    const char *root = cfg->checkpoint.dir;
    ct_ckpt_manifest m = {.state = run_state(cfg, pctx, step, optimizer_step),
                          .n_files = pctx->world_size,
                          .n_pieces = n,
                          .pieces = pieces};
    size_t config_len = 0;
    FILE *mem = open_memstream(&m.config_text, &config_len);
    CT_ASSERT(mem != NULL);
    ct_config_print(cfg, mem);
    fclose(mem);
    char tmp[CT_PATH_MAX + 32];
    ct_ckpt_step_path(tmp, sizeof tmp, root, step, true);
    ct_ckpt_crash_point("before-manifest", step);
    ct_status st = ct_ckpt_manifest_write(tmp, &m);
    free(m.config_text);
    if (st != CT_OK) return st;
    ct_ckpt_crash_point("before-rename", step);
    CT_TRY(ct_ckpt_publish(root, step));
    return ct_ckpt_prune(root, cfg->checkpoint.keep);
}

ct_status ct_ckpt_save(const ct_config *cfg, ct_model *model, ct_dp *dp, ct_pctx *pctx,
                       int64_t step, double *blocked_s) {
    const double start = ct_now();
    const char *root = cfg->checkpoint.dir;
    ct_backend_sync(ct_model_backend(model));
    CT_TRY(agree(pctx, pctx->world_rank == 0 ? ct_ckpt_begin(root, step) : CT_OK));
    char tmp[CT_PATH_MAX + 32];
    ct_ckpt_step_path(tmp, sizeof tmp, root, step, true);
    saver s = {.dp = dp, .step = step};
    ct_status st = ct_ckpt_writer_open(&s.writer, tmp, pctx->world_rank);
    if (st == CT_OK) st = for_each_run(model, dp, pctx, true, save_run, &s);
    if (s.writer) {
        ct_status closed = ct_ckpt_writer_close(s.writer);
        if (st == CT_OK) st = closed;
    }
    free(s.host);
    st = agree(pctx, st);
    if (st == CT_OK) {
        int64_t n = 0;
        ct_ckpt_piece *pieces = gather_pieces(pctx, &s, &n);
        int64_t opt_step = ct_dp_optimizer(dp)->step;
        st = pctx->world_rank == 0 ? write_manifest(cfg, pctx, step, opt_step, pieces, n) : CT_OK;
        free(pieces);
        st = agree(pctx, st);
    }
    free(s.pieces);
    if (blocked_s) *blocked_s = ct_now() - start;
    return st;
}

/* ---- loading ------------------------------------------------------------------------------ */

/* The checkpoint must come from the same model, seed and global batch (the data order and the
 * sample position depend on the last two). */
static ct_status check_compatible(const char *path, const ct_ckpt_state *s, const ct_config *cfg) {
    const ct_ckpt_state mine = run_state(cfg, &(ct_pctx){0}, 0, 0);
    static const struct {
        const char *key;
        size_t offset;
    } fields[] = {
        {"model.arch", offsetof(ct_ckpt_state, arch)},
        {"model.vocab_size", offsetof(ct_ckpt_state, vocab_size)},
        {"model.vocab_pad", offsetof(ct_ckpt_state, vocab_pad)},
        {"model.seq_len", offsetof(ct_ckpt_state, seq_len)},
        {"model.n_layer", offsetof(ct_ckpt_state, n_layer)},
        {"model.d_model", offsetof(ct_ckpt_state, d_model)},
        {"model.n_head", offsetof(ct_ckpt_state, n_head)},
        {"model.n_kv_head", offsetof(ct_ckpt_state, n_kv_head)},
        {"model.d_ff", offsetof(ct_ckpt_state, d_ff)},
        {"train.seed", offsetof(ct_ckpt_state, seed)},
        {"train.global_batch", offsetof(ct_ckpt_state, global_batch)},
    };
    for (size_t i = 0; i < CT_ARRAY_LEN(fields); i++) {
        int64_t theirs = *(const int64_t *)((const char *)s + fields[i].offset);
        int64_t ours = *(const int64_t *)((const char *)&mine + fields[i].offset);
        if (theirs == ours) continue;
        ct_error(CT_ERR_INPUT, "checkpoint '%s' was written with %s=%lld, this run has %lld", path,
                 fields[i].key, (long long)theirs, (long long)ours);
        ct_hint("a checkpoint resumes the same model, seed and global batch (the layout may "
                "change); set %s: %lld, or checkpoint.resume: never",
                fields[i].key, (long long)theirs);
        return CT_ERR_INPUT;
    }
    return CT_OK;
}

typedef struct loader {
    const char *path;
    const ct_ckpt_manifest *manifest;
    ct_dp *dp;
    float *host;
    int64_t host_cap;
} loader;

static ct_status load_run(void *ctx, const state_run *run) {
    loader *l = ctx;
    ct_tensor *state[CT_CKPT_KIND_COUNT];
    ct_dp_unit_state(l->dp, run->unit, &state[CT_CKPT_WEIGHT], &state[CT_CKPT_ADAM_M],
                     &state[CT_CKPT_ADAM_V]);
    const int64_t len = run->b - run->a;
    if (len > l->host_cap) {
        l->host_cap = len;
        free(l->host);
        l->host = ct_xmalloc((size_t)len * sizeof(float));
    }
    ct_status st = CT_OK;
    for (int k = 0; k < CT_CKPT_KIND_COUNT && st == CT_OK; k++) {
        ct_ckpt_box want = param_box(run->param);
        want.kind = k;
        want.lo = run->a;
        want.hi = run->b;
        st = ct_ckpt_read_box(l->path, l->manifest, &want, l->host);
        if (st != CT_OK) break;
        ct_tensor *v = ct_tensor_view_1d(state[k], run->at, len);
        ct_tensor_from_host(v, l->host); /* the optimizer state is fp32 */
        ct_tensor_free(v);
    }
    for (int k = 0; k < CT_CKPT_KIND_COUNT; k++) ct_tensor_free(state[k]);
    return st;
}

ct_status ct_ckpt_load(const char *path, const ct_config *cfg, ct_model *model, ct_dp *dp,
                       ct_pctx *pctx, ct_ckpt_state *state) {
    ct_ckpt_manifest m;
    ct_status st = ct_ckpt_open(path, &m);
    if (st == CT_OK) st = check_compatible(path, &m.state, cfg);
    st = agree(pctx, st);
    if (st != CT_OK) {
        ct_ckpt_manifest_release(&m);
        return st;
    }
    loader l = {.path = path, .manifest = &m, .dp = dp};
    st = agree(pctx, for_each_run(model, dp, pctx, false, load_run, &l));
    free(l.host);
    if (st == CT_OK) {
        *state = m.state;
        ct_dp_load_done(dp, m.state.optimizer_step);
    }
    ct_ckpt_manifest_release(&m);
    return st;
}
