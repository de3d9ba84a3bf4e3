/* param_stream.c — global parameters streamed to rank 0, replicas compared. See param_stream.h. */
#include "param_stream.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tags of the two messages (header, data) a stage sends rank 0 per tensor. The stream runs when
 * no pipeline message is in flight, and one source's messages with one tag arrive in order. */
enum { TAG_HEADER = 11, TAG_DATA = 12 };

/* What travels ahead of a tensor's data from its stage to rank 0. */
typedef struct tensor_header {
    char name[64];
    int64_t rows, cols;
} tensor_header;

/* The world-size-1 group of a parameter: the embeddings (0), layer l (l + 1), the final norm
 * (L + 1). Inside a group every layout registers the tensors in one order. */
static int param_group(const ct_model *m, const ct_param *p) {
    if (p->layer >= 0) return p->layer + 1;
    /* The final norm is the head unit's own; the tied twin of wte there is an embedding. */
    return p->unit == ct_model_head_unit(m) && !p->tied_to ? ct_model_n_layers(m) + 1 : 0;
}

static uint32_t crc_of(const float *data, int64_t n) {
    return ct_crc32(0, data, (size_t)n * sizeof(float));
}

/* Compares this rank's CRC with every other member of `group`: the same bytes everywhere? */
static bool replicas_agree(ct_comm *group, uint32_t crc) {
    if (!group || group->size == 1) return true;
    int64_t lo_hi[2] = {(int64_t)crc, -(int64_t)crc};
    ct_comm_allreduce(group, lo_hi, 2, CT_DTYPE_I64, CT_REDUCE_MAX);
    return lo_hi[0] == -lo_hi[1];
}

/* Copies the (rows, cols) slice `part` of tensor p, held by tp rank r, into the global tensor. */
static void place_slice(const ct_param *p, int r, const float *part, float *global) {
    int64_t rows = p->local_shape[0], cols = p->local_shape[1], gcols = p->global_shape[1];
    int64_t row0 = p->tp_split_dim == 0 ? (int64_t)r * rows : 0;
    int64_t col0 = p->tp_split_dim == 1 ? (int64_t)r * cols : 0;
    for (int64_t i = 0; i < rows; i++)
        memcpy(global + (row0 + i) * gcols + col0, part + i * cols, (size_t)cols * sizeof(float));
}

typedef struct stream {
    ct_model *model;
    ct_dp *dp;
    ct_pctx *pctx;
    ct_param_sink_fn sink;
    void *sink_ctx;
    ct_status sink_status; /* rank 0: the first sink failure (its message is set then) */
    ct_status replica_status;
    char mismatch[256]; /* the first replica difference this rank saw */
    int64_t checked;
    float *unit_buf, *gathered, *global;
    int unit_in_buf; /* unit currently in unit_buf, -1 none */
} stream;

static void note_mismatch(stream *s, const char *name, const char *group) {
    if (s->replica_status != CT_OK) return;
    s->replica_status = CT_ERR_RUNTIME;
    snprintf(s->mismatch, sizeof s->mismatch, "the %s replicas of %s hold different bytes", group,
             name);
}

static void deliver(stream *s, const char *name, int64_t rows, int64_t cols, const float *data) {
    if (s->sink_status != CT_OK || !s->sink) return;
    s->sink_status = s->sink(s->sink_ctx, name, rows, cols, data);
}

/* Unit u of this stage on the host (gathered over dp at ZeRO-3: collective over the dp group). */
static const float *unit_on_host(stream *s, int u) {
    if (s->unit_in_buf != u) {
        ct_dp_unit_params_to_host(s->dp, u, s->unit_buf);
        s->unit_in_buf = u;
    }
    return s->unit_buf;
}

static void send_tensor(stream *s, const ct_param *p, const char *name, const float *local,
                        int owner_stage);

/* One tensor of this stage: replicas compared, slices assembled, sent to rank 0 (stage ranks). */
static void stream_param(stream *s, const ct_param *p, int owner_stage) {
    ct_pctx *pc = s->pctx;
    const float *local = unit_on_host(s, p->unit) + p->offset;
    uint32_t crc = crc_of(local, p->numel);
    s->checked++;
    if (!replicas_agree(pc->dpcp_comm, crc)) note_mismatch(s, p->name, "data-parallel");
    if (p->tp_split_dim < 0) {
        s->checked++;
        if (!replicas_agree(pc->tp_comm, crc)) note_mismatch(s, p->name, "tensor-parallel");
    }
    if (pc->dpcp_comm->rank != 0) return; /* one replica goes to rank 0 */
    send_tensor(s, p, p->name, local, owner_stage);
}

/* p's values `local` (this tp rank's slice) under `name`: the tp slices assembled, delivered
 * (rank 0) or sent to rank 0 (tp rank 0 of another stage). Collective over the tp group. */
static void send_tensor(stream *s, const ct_param *p, const char *name, const float *local,
                        int owner_stage) {
    ct_pctx *pc = s->pctx;
    int64_t rows = p->global_shape[0], cols = p->global_shape[1], numel = rows * cols;
    const float *global = local;
    if (p->tp_split_dim >= 0 && pc->tp > 1) {
        ct_comm_allgather(pc->tp_comm, local, s->gathered, p->numel * pc->tp, CT_DTYPE_F32);
        for (int r = 0; r < pc->tp; r++)
            place_slice(p, r, s->gathered + (int64_t)r * p->numel, s->global);
        global = s->global;
    }
    if (pc->tp_rank != 0) return;
    if (owner_stage == 0) { /* this is world rank 0 */
        deliver(s, name, rows, cols, global);
        return;
    }
    tensor_header h;
    memset(&h, 0, sizeof h);
    snprintf(h.name, sizeof h.name, "%s", name);
    h.rows = rows;
    h.cols = cols;
    ct_comm_wait(pc->pp_comm, ct_comm_isend(pc->pp_comm, &h, sizeof h, CT_DTYPE_U8, 0, TAG_HEADER));
    ct_comm_wait(pc->pp_comm, ct_comm_isend(pc->pp_comm, global, numel, CT_DTYPE_F32, 0, TAG_DATA));
}

/* An MoE layer's expert unit u, spread over the ep group (each rank holding E / ep experts):
 * replicas compared over the ranks holding the same experts, then the ep group of dp rank 0
 * gathers every rank's unit and sends all experts, in the order of one rank (expert 0's
 * tensors first). */
static void stream_experts(stream *s, int u, int owner_stage) {
    ct_pctx *pc = s->pctx;
    const ct_unit *unit = ct_model_unit(s->model, u);
    const float *mine = unit_on_host(s, u);
    for (int i = 0; i < unit->n_params; i++) {
        const ct_param *p = ct_model_param(s->model, unit->first_param + i);
        s->checked++;
        uint32_t crc = crc_of(mine + p->offset, p->numel);
        if (!replicas_agree(pc->edp_comm, crc)) note_mismatch(s, p->name, "expert-data-parallel");
        if (p->tp_split_dim < 0) {
            s->checked++;
            if (!replicas_agree(pc->tp_comm, crc)) note_mismatch(s, p->name, "tensor-parallel");
        }
    }
    if (pc->edp_comm->rank != 0) return; /* the ep group of dp rank 0 */
    float *all = ct_xmalloc((size_t)(unit->numel * pc->ep) * sizeof *all);
    ct_comm_allgather(pc->ep_comm, mine, all, unit->numel * pc->ep, CT_DTYPE_F32);
    if (pc->ep_rank == 0)
        for (int r = 0; r < pc->ep; r++)
            for (int i = 0; i < unit->n_params; i++) {
                const ct_param *p = ct_model_param(s->model, unit->first_param + i);
                /* rank r's expert in p's place: its index r·E/ep further */
                const int e = p->expert + r * (int)(s->model->mc.moe_experts / pc->ep);
                char name[64];
                const char *kind = strrchr(p->name, '.') + 1;
                snprintf(name, sizeof name, "layers.%d.moe.experts.%d.%s", p->layer, e, kind);
                send_tensor(s, p, name, all + (int64_t)r * unit->numel + p->offset, owner_stage);
            }
    free(all);
}

/* Rank 0: the tensors of group g from stage `from`, as many as it sends. */
static void receive_group(stream *s, int from, int n_tensors, int64_t max_numel) {
    ct_comm *pp = s->pctx->pp_comm;
    for (int i = 0; i < n_tensors; i++) {
        tensor_header h;
        ct_comm_wait(pp, ct_comm_irecv(pp, &h, sizeof h, CT_DTYPE_U8, from, TAG_HEADER));
        h.name[sizeof h.name - 1] = '\0';
        int64_t numel = h.rows * h.cols;
        CT_ASSERTF(numel >= 0 && numel <= max_numel, "tensor %s of %lld elements from stage %d",
                   h.name, (long long)numel, from);
        ct_comm_wait(pp, ct_comm_irecv(pp, s->global, numel, CT_DTYPE_F32, from, TAG_DATA));
        deliver(s, h.name, h.rows, h.cols, s->global);
    }
}

/* The tied embedding: the first stage's wte and the last stage's twin must be the same bytes
 * (pipeline parallel only; with one stage they are one tensor). */
static void check_tied_twin(stream *s) {
    ct_comm *embed = s->pctx->embed_comm;
    const ct_tied_place place = ct_model_tied_place(s->model, NULL);
    if (place != CT_TIED_FIRST && place != CT_TIED_LAST) return;
    if (!embed || embed->size == 1) return;
    const ct_param *w = ct_model_wte(s->model); /* the twin on the last stage */
    uint32_t crc = crc_of(unit_on_host(s, w->unit) + w->offset, w->numel);
    s->checked++;
    if (!replicas_agree(embed, crc)) note_mismatch(s, "wte", "tied-embedding (first/last stage)");
}

ct_status ct_param_stream(ct_model *m, ct_dp *dp, ct_pctx *pctx, ct_param_sink_fn sink, void *ctx,
                          int64_t *n_checked) {
    stream s = {
        .model = m, .dp = dp, .pctx = pctx, .sink = sink, .sink_ctx = ctx, .unit_in_buf = -1};
    const int n_groups = ct_model_n_layers(m) + 2;
    /* Which stage holds each group, and how many tensors and elements it has: every rank fills
     * in its own groups, the world takes the maximum. */
    int64_t *info = ct_xcalloc(3 * (size_t)n_groups + 1, sizeof(int64_t));
    int64_t *owner = info, *count = info + n_groups, *largest = info + 2 * n_groups;
    for (int g = 0; g < n_groups; g++) owner[g] = -1;
    int64_t max_unit = 0, max_local = 0;
    for (int u = 0; u < ct_model_n_units(m); u++)
        max_unit = CT_MAX(max_unit, ct_model_unit(m, u)->padded_numel);
    for (int i = 0; i < ct_model_n_params(m); i++) {
        const ct_param *p = ct_model_param(m, i);
        if (p->tied_to) continue; /* the twin: checked against wte (check_tied_twin) */
        int g = param_group(m, p);
        owner[g] = pctx->pp_rank;
        count[g] += p->expert >= 0 ? pctx->ep : 1; /* every rank of the ep group's experts */
        largest[g] = CT_MAX(largest[g], p->global_shape[0] * p->global_shape[1]);
        max_local = CT_MAX(max_local, p->numel);
    }
    if (pctx->world_size > 1)
        ct_comm_allreduce(pctx->world, info, 3 * n_groups, CT_DTYPE_I64, CT_REDUCE_MAX);
    int64_t max_global = 1;
    for (int g = 0; g < n_groups; g++) {
        CT_ASSERTF(owner[g] >= 0, "no stage holds parameter group %d", g);
        max_global = CT_MAX(max_global, largest[g]);
    }
    s.unit_buf = ct_xmalloc((size_t)CT_MAX(max_unit, 1) * sizeof(float));
    s.gathered = ct_xmalloc((size_t)CT_MAX(max_local, 1) * (size_t)pctx->tp * sizeof(float));
    s.global = ct_xmalloc((size_t)max_global * sizeof(float));

    for (int g = 0; g < n_groups; g++) {
        int stage = (int)owner[g];
        if (pctx->pp_rank == stage) {
            for (int i = 0; i < ct_model_n_params(m); i++) {
                const ct_param *p = ct_model_param(m, i);
                if (p->tied_to || param_group(m, p) != g) continue;
                const ct_unit *unit = ct_model_unit(m, p->unit);
                if (!unit->experts || pctx->ep == 1)
                    stream_param(&s, p, stage);
                else if (i == unit->first_param) /* the whole unit at once */
                    stream_experts(&s, p->unit, stage);
            }
        } else if (pctx->world_rank == 0) {
            receive_group(&s, stage, (int)count[g], max_global);
        }
    }
    check_tied_twin(&s);
    free(s.unit_buf);
    free(s.gathered);
    free(s.global);
    free(info);
    if (n_checked) *n_checked = s.checked;

    /* Everyone learns the outcome: a replica difference (a bug) first, then a sink failure. */
    ct_status st = CT_OK;
    if (s.replica_status != CT_OK) {
        ct_error(CT_ERR_RUNTIME, "%s (rank %d)", s.mismatch, pctx->world_rank);
        ct_hint("replicas must stay bit-identical; this is a bug in the parallel layer, please "
                "report it with the config");
        st = CT_ERR_RUNTIME;
    } else if (s.sink_status != CT_OK) {
        st = s.sink_status;
    }
    return ct_pctx_agree(pctx, st);
}

/* ---- the dump file ----------------------------------------------------------------------------
 */

struct ct_param_dump {
    char *path;
    FILE *data, *index;
    int64_t offset; /* elements written */
    int n_tensors;
};

static ct_status dump_io_error(const char *path) {
    ct_error(CT_ERR_RUNTIME, "cannot write the parameter dump '%s': %s", path, strerror(errno));
    ct_hint("check free space and that the directory is writable");
    return CT_ERR_RUNTIME;
}

ct_status ct_param_dump_open(ct_param_dump **out, const char *path) {
    ct_param_dump *d = ct_xcalloc(1, sizeof *d);
    d->path = ct_xstrdup(path);
    size_t n = strlen(path) + 16;
    char *index_path = ct_xmalloc(n);
    snprintf(index_path, n, "%s.index.json", path);
    d->data = fopen(path, "wb");
    d->index = d->data ? fopen(index_path, "w") : NULL;
    ct_status st = CT_OK;
    if (!d->data || !d->index) {
        ct_error(CT_ERR_INPUT, "cannot open the parameter dump '%s': %s",
                 d->data ? index_path : path, strerror(errno));
        ct_hint("check that the directory exists and is writable (--dump-params)");
        if (d->data) fclose(d->data);
        free(d->path);
        free(d);
        d = NULL;
        st = CT_ERR_INPUT;
    } else {
        fputs("[", d->index);
    }
    free(index_path);
    *out = d;
    return st;
}

ct_status ct_param_dump_sink(void *ctx, const char *name, int64_t rows, int64_t cols,
                             const float *data) {
    ct_param_dump *d = ctx;
    size_t n = (size_t)(rows * cols);
    if (fwrite(data, sizeof(float), n, d->data) != n) return dump_io_error(d->path);
    if (fprintf(d->index, "%s\n {\"name\": \"%s\", \"shape\": [%lld, %lld], \"offset\": %lld}",
                d->n_tensors ? "," : "", name, (long long)rows, (long long)cols,
                (long long)d->offset) < 0)
        return dump_io_error(d->path);
    d->offset += (int64_t)n;
    d->n_tensors++;
    return CT_OK;
}

ct_status ct_param_dump_close(ct_param_dump *d) {
    if (!d) return CT_OK;
    fputs("\n]\n", d->index);
    bool ok = !ferror(d->data) && !ferror(d->index);
    ok = (fclose(d->data) == 0) && ok;
    ok = (fclose(d->index) == 0) && ok;
    ct_status st = ok ? CT_OK : dump_io_error(d->path);
    free(d->path);
    free(d);
    return st;
}

ct_status ct_param_dump_write(ct_model *m, ct_dp *dp, ct_pctx *pctx, const char *path) {
    ct_param_dump *d = NULL;
    ct_status st = pctx->world_rank == 0 ? ct_param_dump_open(&d, path) : CT_OK;
    st = ct_pctx_agree(pctx, st);
    if (st != CT_OK) return st;
    int64_t checked = 0, tensors = 0;
    st = ct_param_stream(m, dp, pctx, d ? ct_param_dump_sink : NULL, d, &checked);
    if (d) tensors = d->n_tensors;
    ct_status closed = ct_param_dump_close(d);
    if (st == CT_OK) st = closed;
    if (pctx->world_size > 1) {
        st = ct_mpi_agree(st);
        ct_comm_allreduce(pctx->world, &checked, 1, CT_DTYPE_I64, CT_REDUCE_SUM);
    }
    if (st == CT_OK && pctx->world_rank == 0)
        printf("parameter dump: %lld tensors to %s; %lld replica comparisons, all "
               "bit-identical\n",
               (long long)tensors, path, (long long)checked);
    return st;
}
