/*
 * test_units.c — the FSDP wrapping policy (layout.unit_min_bytes, model.h "Units"): which layers
 * share a unit, and that merging moves storage only. Merged and unmerged models must agree bit
 * for bit — initial values, loss and every gradient, by parameter name — because the per-layer
 * arithmetic is the same; no tolerance is needed. The unit_begin / unit_end brackets are checked
 * by recording hooks against the contract in model.h: their order, gradients untouched when a
 * backward bracket opens and complete when it closes, and — with hooks that act like ZeRO-3,
 * parameters NaN and gradients sent to scratch outside the bracket — the same numbers, which a
 * layer run outside its unit's bracket would change.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/backend/backend.h"
#include "core/model/model.h"
#include "core/rng.h"
#include "test_util.h"

#define HUGE_BYTES INT64_MAX
#define MAX_EVENTS 256
#define B_MICRO 2

/* test_tiny_config with n_layer layers on pp ranks × v chunks each (pp_layers "" = even). */
static void units_config(ct_config *cfg, int n_layer, int pp, int v, const char *pp_layers) {
    test_tiny_config(cfg, NULL);
    cfg->model.n_layer = n_layer;
    cfg->train.micro_batch = 1; /* grad_accum 4: a multiple of pp, as the schedules need */
    cfg->parallel.pp = pp;
    cfg->parallel.virtual_stages = v;
    cfg->parallel.schedule = v > 1 ? CT_SCHEDULE_INTERLEAVED : CT_SCHEDULE_1F1B;
    snprintf(cfg->parallel.pp_layers, sizeof cfg->parallel.pp_layers, "%s", pp_layers);
    ct_status st = ct_config_validate(cfg, pp);
    if (st != CT_OK) ct_error_print();
    assert_int_equal(st, CT_OK);
}

static ct_model *new_model(const ct_config *cfg, ct_backend *be, ct_model_layout layout,
                           int64_t min_bytes) {
    layout.unit_min_bytes = min_bytes;
    ct_model *m;
    assert_int_equal(ct_model_new(&m, cfg, be, &layout), CT_OK);
    return m;
}

/* Bytes of layer l's parameters on this rank, read off a model with one unit per layer. */
static int64_t layer_bytes(const ct_model *flat, int l) {
    const ct_unit *u = &flat->units[flat->layer_unit[l]];
    assert_int_equal(u->n_layers, 1);
    return u->numel * (int64_t)sizeof(float);
}

/* "embed,layers.0-1,layer.2,head": the units' names in order. */
static const char *unit_names(const ct_model *m) {
    static char buf[1024];
    size_t n = 0;
    buf[0] = '\0';
    for (int u = 0; u < m->n_units; u++)
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%s", u ? "," : "", m->units[u].name);
    return buf;
}

/* ---- the policy ------------------------------------------------------------------------------ */

/*
 * The policy written out again (reference), from the unmerged model's per-layer bytes: within
 * each chunk a layer opens a new unit if it is the chunk's first or the open unit already holds
 * min_bytes. Checks every layer unit of m against it, and the registry invariants merging must
 * keep: each unit a contiguous run of registry entries packed from offset 0, of one chunk, whose
 * layers are the unit's; names "layer.L" / "layers.A-B".
 */
static void check_units(const ct_model *m, const ct_model *flat, int64_t min_bytes) {
    const ct_model_layout *lo = &m->layout;
    int n_layer_units = 0;
    for (int c = 0; c < lo->n_chunks; c++) {
        const int first = lo->chunks[c].first_layer, n = lo->chunks[c].n_layers;
        int start = first, prev_unit = -1;
        int64_t bytes = 0;
        for (int l = first; l <= first + n; l++) {
            bool close = l == first + n || (l > first && bytes >= min_bytes);
            if (close && l > start) {
                /* layers [start, l) form one unit */
                int u = m->layer_unit[start];
                const ct_unit *unit = &m->units[u];
                assert_true(u >= 0);
                if (prev_unit >= 0) assert_int_equal(u, prev_unit + 1);
                prev_unit = u;
                assert_int_equal(unit->first_layer, start);
                assert_int_equal(unit->n_layers, l - start);
                for (int k = start; k < l; k++) assert_int_equal(m->layer_unit[k], u);
                char name[32];
                if (l - start == 1)
                    snprintf(name, sizeof name, "layer.%d", start);
                else
                    snprintf(name, sizeof name, "layers.%d-%d", start, l - 1);
                assert_string_equal(unit->name, name);
                n_layer_units++;
                start = l;
                bytes = 0;
            }
            if (l < first + n) bytes += layer_bytes(flat, l);
        }
    }
    assert_int_equal(m->n_units, n_layer_units + (m->embed_unit >= 0) + (m->head_unit >= 0));
    if (m->embed_unit >= 0) assert_string_equal(m->units[m->embed_unit].name, "embed");
    if (m->head_unit >= 0) assert_string_equal(m->units[m->head_unit].name, "head");

    int next_param = 0;
    for (int u = 0; u < m->n_units; u++) {
        const ct_unit *unit = &m->units[u];
        assert_int_equal(unit->first_param, next_param);
        next_param += unit->n_params;
        int64_t off = 0;
        for (int i = unit->first_param; i < unit->first_param + unit->n_params; i++) {
            const ct_param *p = &m->params[i];
            assert_int_equal(p->unit, u);
            assert_int_equal(p->offset, off);
            assert_int_equal(p->chunk, m->params[unit->first_param].chunk);
            off += p->numel;
            int l;
            if (sscanf(p->name, "layers.%d.", &l) == 1) {
                assert_true(l >= unit->first_layer && l < unit->first_layer + unit->n_layers);
            } else {
                assert_int_equal(unit->n_layers, 0);
            }
        }
        assert_int_equal(unit->numel, off);
        assert_true(unit->padded_numel >= unit->numel && unit->padded_numel % 16 == 0);
    }
    assert_int_equal(next_param, m->n_params);
}

/* Builds the model of `layout` with min_bytes, checks it against the reference policy and returns
 * its unit names. */
static const char *names_for(const ct_config *cfg, ct_backend *be, ct_model_layout layout,
                             int64_t min_bytes) {
    ct_model *flat = new_model(cfg, be, layout, 0);
    ct_model *m = new_model(cfg, be, layout, min_bytes);
    check_units(m, flat, min_bytes);
    const char *names = unit_names(m);
    ct_model_free(m);
    ct_model_free(flat);
    return names;
}

/* One layout on one rank: thresholds around one, two and four layers' bytes, and huge. */
static void test_unit_names_single(void **state) {
    ct_config cfg;
    units_config(&cfg, 6, 1, 1, "");
    ct_backend *be = test_backend_new(1);
    ct_model_layout layout = ct_model_layout_single(&cfg);
    assert_int_equal(layout.unit_min_bytes, 0);
    ct_model *flat = new_model(&cfg, be, layout, 0);
    const int64_t lb = layer_bytes(flat, 0);
    for (int l = 1; l < 6; l++) assert_int_equal(layer_bytes(flat, l), lb);
    ct_model_free(flat);

    const char *each = "embed,layer.0,layer.1,layer.2,layer.3,layer.4,layer.5,head";
    const char *pairs = "embed,layers.0-1,layers.2-3,layers.4-5,head";
    const char *triples = "embed,layers.0-2,layers.3-5,head";
    struct {
        int64_t min_bytes;
        const char *names;
    } cases[] = {
        {0, each},
        {lb - 1, each},
        {lb, each}, /* one layer already holds the threshold */
        {lb + 1, pairs},
        {2 * lb, pairs}, /* a unit closes as soon as it reaches the threshold */
        {2 * lb + 1, triples},
        {4 * lb, "embed,layers.0-3,layers.4-5,head"}, /* the chunk's last unit may be smaller */
        {HUGE_BYTES, "embed,layers.0-5,head"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const char *got = names_for(&cfg, be, layout, cases[k].min_bytes);
        printf("unit_min_bytes %lld: %s\n", (long long)cases[k].min_bytes, got);
        assert_string_equal(got, cases[k].names);
    }
    ct_backend_free(be);
}

/*
 * Tensor parallelism: the threshold counts this rank's slice. At 1.5 local layers the units are
 * pairs; counted in global elements (almost twice as many) every layer would reach it alone.
 */
static void test_unit_names_tp(void **state) {
    ct_config cfg;
    units_config(&cfg, 6, 1, 1, "");
    ct_backend *be = test_backend_new(1);
    for (int r = 0; r < 2; r++) {
        ct_model_layout layout = ct_model_layout_single(&cfg);
        layout.tp_size = 2;
        layout.tp_rank = r;
        ct_model *flat = new_model(&cfg, be, layout, 0);
        const int64_t lb = layer_bytes(flat, 0);
        ct_model *whole = new_model(&cfg, be, ct_model_layout_single(&cfg), 0);
        assert_true(layer_bytes(whole, 0) > 3 * lb / 2);
        ct_model_free(whole);
        ct_model_free(flat);
        assert_string_equal(names_for(&cfg, be, layout, 3 * lb / 2),
                            "embed,layers.0-1,layers.2-3,layers.4-5,head");
    }
    ct_backend_free(be);
}

/* Pipeline layouts: units never span two chunks, even with a threshold nothing reaches. */
static void test_unit_names_pipeline(void **state) {
    ct_backend *be = test_backend_new(1);
    ct_config cfg;
    units_config(&cfg, 6, 1, 1, "");
    ct_model *flat = new_model(&cfg, be, ct_model_layout_single(&cfg), 0);
    const int64_t lb = layer_bytes(flat, 0);
    ct_model_free(flat);

    /* pp = 2: layers 0-2 on rank 0, 3-5 on rank 1 */
    units_config(&cfg, 6, 2, 1, "");
    const char *pp_names[2][2] = {
        {"embed,layers.0-1,layer.2", "embed,layers.0-2"},
        {"layers.3-4,layer.5,head", "layers.3-5,head"},
    };
    for (int r = 0; r < 2; r++) {
        ct_model_layout layout = ct_model_layout_pipeline(&cfg, r);
        assert_int_equal(layout.unit_min_bytes, 0);
        assert_string_equal(names_for(&cfg, be, layout, lb + 1), pp_names[r][0]);
        assert_string_equal(names_for(&cfg, be, layout, HUGE_BYTES), pp_names[r][1]);
    }

    /* Interleaved, pp = 2 × v = 2, uneven: chunks 0-3 hold layers 0-2, 3, 4-5, 6-7; rank 0 runs
     * chunks 0 and 2, rank 1 chunks 1 and 3. */
    units_config(&cfg, 8, 2, 2, "3,1,2,2");
    const char *v_names[2][2] = {
        {"embed,layers.0-1,layer.2,layers.4-5", "embed,layers.0-2,layers.4-5"},
        {"layer.3,layers.6-7,head", "layer.3,layers.6-7,head"},
    };
    for (int r = 0; r < 2; r++) {
        ct_model_layout layout = ct_model_layout_pipeline(&cfg, r);
        assert_int_equal(layout.n_chunks, 2);
        assert_string_equal(names_for(&cfg, be, layout, lb + 1), v_names[r][0]);
        assert_string_equal(names_for(&cfg, be, layout, HUGE_BYTES), v_names[r][1]);
    }
    ct_backend_free(be);
}

/* ---- the same numbers ------------------------------------------------------------------------ */

/* Every parameter's value (grads: gradient) in `a` has the same bytes as the one of that name in
 * `b`. Returns the number of tensors that differ. */
static int count_differing(const ct_model *a, ct_model *b, bool grads) {
    int differ = 0;
    assert_int_equal(a->n_params, b->n_params);
    for (int i = 0; i < a->n_params; i++) {
        const ct_param *pa = &a->params[i];
        const ct_param *pb = ct_model_find_param(b, pa->name);
        assert_non_null(pb);
        assert_int_equal(pa->numel, pb->numel);
        size_t bytes = (size_t)pa->numel * sizeof(float);
        float *ha = ct_xmalloc(bytes), *hb = ct_xmalloc(bytes);
        ct_tensor_to_host(ha, grads ? pa->grad : pa->value);
        ct_tensor_to_host(hb, grads ? pb->grad : pb->value);
        if (memcmp(ha, hb, bytes)) {
            printf("%s of %s differs\n", grads ? "gradient" : "value", pa->name);
            differ++;
        }
        free(ha);
        free(hb);
    }
    return differ;
}

typedef struct layout_case {
    const char *what;
    int n_layer, pp, v;
    const char *pp_layers;
    int pp_rank;
    int64_t d_model; /* 24: a layer of 7224 elements, so merged layers start off 64-byte lines */
} layout_case;

static const layout_case layout_cases[] = {
    {"single", 6, 1, 1, "", 0, 32},
    {"single, d_model 24", 6, 1, 1, "", 0, 24},
    {"pp=2 rank 0", 6, 2, 1, "", 0, 32},
    {"pp=2 rank 1", 6, 2, 1, "", 1, 32},
    {"v=2 rank 0", 8, 2, 2, "3,1,2,2", 0, 32},
    {"v=2 rank 1", 8, 2, 2, "3,1,2,2", 1, 32},
};
#define N_LAYOUT_CASES ((int)(sizeof layout_cases / sizeof layout_cases[0]))

static ct_model_layout case_layout(const layout_case *lc, ct_config *cfg) {
    units_config(cfg, lc->n_layer, lc->pp, lc->v, lc->pp_layers);
    if (lc->d_model != cfg->model.d_model) {
        cfg->model.d_model = lc->d_model;
        assert_int_equal(ct_config_validate(cfg, lc->pp), CT_OK);
    }
    return lc->pp > 1 ? ct_model_layout_pipeline(cfg, lc->pp_rank) : ct_model_layout_single(cfg);
}

/* Thresholds for a layout: pairs, triples and whole chunks. */
static void case_thresholds(const ct_model *flat, int64_t out[3]) {
    int l0 = flat->layout.chunks[0].first_layer;
    out[0] = layer_bytes(flat, l0) + 1;
    out[1] = 2 * layer_bytes(flat, l0) + 1;
    out[2] = HUGE_BYTES;
}

/* Initialisation is a function of (seed, name, element index): where a tensor sits changes
 * nothing. */
static void test_init_bitwise(void **state) {
    ct_backend *be = test_backend_new(1);
    for (int k = 0; k < N_LAYOUT_CASES; k++) {
        ct_config cfg;
        ct_model_layout layout = case_layout(&layout_cases[k], &cfg);
        ct_model *flat = new_model(&cfg, be, layout, 0);
        int64_t thresholds[3];
        case_thresholds(flat, thresholds);
        for (int t = 0; t < 3; t++) {
            ct_model *m = new_model(&cfg, be, layout, thresholds[t]);
            assert_true(m->n_units < flat->n_units);
            assert_int_equal(count_differing(m, flat, false), 0);
            ct_model_free(m);
        }
        ct_model_free(flat);
    }
    ct_backend_free(be);
}

/* ---- one forward and backward, with or without recording hooks ------------------------------ */

typedef struct event {
    int unit, chunk;
    ct_pass pass;
    bool begin;
} event;

/*
 * Hooks that record the brackets, in one of two modes.
 *  - observe: the model keeps its buffers. In backward a unit's gradients must be zero when its
 *    bracket opens (nothing of this microbatch written yet); they are copied when it closes, to
 *    be compared with the final gradients (everything written by then).
 *  - enforce: like ZeRO-3, a unit's parameters are real only inside its bracket (NaN outside)
 *    and its gradients land in the real buffer only inside its backward bracket (a scratch
 *    buffer outside), so a read or write outside the bracket changes the loss or a gradient.
 */
typedef struct recorder {
    ct_model *m;
    bool enforce;
    ct_tensor *poison, *trash; /* enforce: (slab_numel) NaN parameters, scratch gradients */
    int chunk;                 /* the chunk being run */
    event ev[MAX_EVENTS];
    int n_ev;
    int dirty_at_begin;  /* backward brackets opened over gradients already written */
    float **grad_at_end; /* [n_units] each unit's gradients when its backward bracket closed */
    int *n_backward_ends;
} recorder;

static bool all_zero(const ct_tensor *t) {
    float *h = ct_xmalloc((size_t)t->numel * sizeof(float));
    ct_tensor_to_host(h, t);
    bool zero = true;
    for (int64_t i = 0; i < t->numel; i++) zero &= h[i] == 0.0f;
    free(h);
    return zero;
}

static void rec_begin(void *ctx, int u, ct_pass pass) {
    recorder *r = ctx;
    ct_model *m = r->m;
    assert_true(r->n_ev < MAX_EVENTS);
    r->ev[r->n_ev++] = (event){.unit = u, .chunk = r->chunk, .pass = pass, .begin = true};
    if (r->enforce) ct_model_bind_unit_params(m, u, m->param_slab, m->units[u].slab_offset);
    if (pass == CT_PASS_BACKWARD) {
        if (r->enforce) ct_model_bind_unit_grads(m, u, m->grad_slab, m->units[u].slab_offset);
        if (!all_zero(m->units[u].grads)) r->dirty_at_begin++;
    }
}

static void rec_end(void *ctx, int u, ct_pass pass) {
    recorder *r = ctx;
    ct_model *m = r->m;
    assert_true(r->n_ev < MAX_EVENTS);
    r->ev[r->n_ev++] = (event){.unit = u, .chunk = r->chunk, .pass = pass, .begin = false};
    if (pass == CT_PASS_BACKWARD) {
        const ct_tensor *g = m->units[u].grads;
        free(r->grad_at_end[u]);
        r->grad_at_end[u] = ct_xmalloc((size_t)g->numel * sizeof(float));
        ct_tensor_to_host(r->grad_at_end[u], g);
        r->n_backward_ends[u]++;
        if (r->enforce) ct_model_bind_unit_grads(m, u, r->trash, m->units[u].slab_offset);
    }
    if (r->enforce) ct_model_bind_unit_params(m, u, r->poison, m->units[u].slab_offset);
}

static void bind_all(ct_model *m, const ct_tensor *params, const ct_tensor *grads) {
    for (int u = 0; u < m->n_units; u++) {
        ct_model_bind_unit_params(m, u, params, m->units[u].slab_offset);
        ct_model_bind_unit_grads(m, u, grads, m->units[u].slab_offset);
    }
}

static void fill_normal(ct_tensor *t, uint64_t stream, float scale) {
    float *h = ct_xmalloc((size_t)t->numel * sizeof(float));
    for (int64_t i = 0; i < t->numel; i++)
        h[i] = scale * (float)ct_rng_normal(3, stream, (uint64_t)i);
    ct_tensor_from_host(t, h);
    free(h);
}

/*
 * One forward and backward of every chunk of m, in order, on a fixed batch (gradients zeroed
 * first). A chunk without the embedding starts from a fixed residual, one without the head from
 * a fixed incoming gradient: they stand in for the neighbouring pipeline stages. Returns the
 * summed loss (0 without the head).
 */
static double run_step(ct_model *m, recorder *r) {
    ct_acts *a;
    ct_grad_scratch *s;
    assert_int_equal(ct_acts_new(&a, m, B_MICRO), CT_OK);
    assert_int_equal(ct_grad_scratch_new(&s, m, B_MICRO), CT_OK);
    const int64_t N = B_MICRO * m->T;
    int32_t *tokens = ct_xmalloc((size_t)N * sizeof(int32_t));
    int32_t *targets = ct_xmalloc((size_t)N * sizeof(int32_t));
    for (int64_t i = 0; i < N; i++) {
        tokens[i] = (int32_t)(ct_rng_u64(17, 1, (uint64_t)i) % (uint64_t)m->V);
        targets[i] = (int32_t)(ct_rng_u64(17, 2, (uint64_t)i) % (uint64_t)m->V);
    }
    ct_acts_set_batch(a, 0, tokens, targets);
    ct_model_zero_grads(m);
    if (r) {
        if (r->enforce) bind_all(m, r->poison, r->trash);
        m->hooks = (ct_model_hooks){.ctx = r, .unit_begin = rec_begin, .unit_end = rec_end};
    }
    const ct_model_layout *lo = &m->layout;
    ct_model_begin_losses(m, 1, a->B);
    for (int c = 0; c < lo->n_chunks; c++) {
        if (r) r->chunk = c;
        if (!lo->chunks[c].has_embed)
            fill_normal(a->residual[lo->chunks[c].first_layer], 100 + lo->chunks[c].index, 1.0f);
        ct_model_forward_chunk(m, c, a, (float)(1.0 / (double)N));
    }
    double loss = ct_model_loss_sum(m);
    for (int c = lo->n_chunks - 1; c >= 0; c--) {
        if (r) r->chunk = c;
        if (!lo->chunks[c].has_head) fill_normal(s->dres, 200 + lo->chunks[c].index, 1e-2f);
        ct_model_backward_chunk(m, c, a, s);
    }
    if (r) {
        m->hooks = (ct_model_hooks){0};
        bind_all(m, m->param_slab, m->grad_slab);
    }
    free(tokens);
    free(targets);
    ct_grad_scratch_free(s);
    ct_acts_free(a);
    return loss;
}

/* Same loss and gradients, bit for bit, by name: merging moves storage, not arithmetic. */
static void test_step_bitwise(void **state) {
    ct_backend *be = test_backend_new(1);
    for (int k = 0; k < N_LAYOUT_CASES; k++) {
        ct_config cfg;
        ct_model_layout layout = case_layout(&layout_cases[k], &cfg);
        ct_model *flat = new_model(&cfg, be, layout, 0);
        double ref = run_step(flat, NULL);
        int64_t thresholds[3];
        case_thresholds(flat, thresholds);
        for (int t = 0; t < 3; t++) {
            ct_model *m = new_model(&cfg, be, layout, thresholds[t]);
            double loss = run_step(m, NULL);
            printf("%-20s %-44s loss %.9f\n", layout_cases[k].what, unit_names(m), loss);
            assert_memory_equal(&loss, &ref, sizeof loss);
            assert_int_equal(count_differing(m, flat, true), 0);
            ct_model_free(m);
        }
        ct_model_free(flat);
    }
    ct_backend_free(be);
}

/* ---- the brackets ---------------------------------------------------------------------------- */

static void push(event *ev, int *n, int unit, int chunk, ct_pass pass, bool begin) {
    assert_true(*n < MAX_EVENTS);
    ev[(*n)++] = (event){.unit = unit, .chunk = chunk, .pass = pass, .begin = begin};
}

/* Layer units of chunk c in forward order. */
static int chunk_layer_units(const ct_model *m, int c, int *out) {
    int n = 0, first = m->layout.chunks[c].first_layer;
    for (int l = first; l < first + m->layout.chunks[c].n_layers; l++)
        if (n == 0 || out[n - 1] != m->layer_unit[l]) out[n++] = m->layer_unit[l];
    return n;
}

/*
 * The brackets the hook contract (model.h) asks for, pass by pass and chunk by chunk: each unit
 * opened and closed once; layer units one after the other, forward in layer order and backward
 * in reverse; the tied embedding around the head when both are in the chunk.
 */
static int expected_events(const ct_model *m, event *ev) {
    int n = 0, units[64];
    const ct_model_layout *lo = &m->layout;
    const ct_pass F = CT_PASS_FORWARD, B = CT_PASS_BACKWARD;
    for (int c = 0; c < lo->n_chunks; c++) {
        bool e = lo->chunks[c].has_embed, h = lo->chunks[c].has_head;
        if (e) push(ev, &n, m->embed_unit, c, F, true);
        if (e && !h) push(ev, &n, m->embed_unit, c, F, false);
        int nu = chunk_layer_units(m, c, units);
        for (int i = 0; i < nu; i++) {
            push(ev, &n, units[i], c, F, true);
            push(ev, &n, units[i], c, F, false);
        }
        if (h) {
            push(ev, &n, m->head_unit, c, F, true);
            push(ev, &n, m->head_unit, c, F, false);
        }
        if (e && h) push(ev, &n, m->embed_unit, c, F, false);
    }
    for (int c = lo->n_chunks - 1; c >= 0; c--) {
        bool e = lo->chunks[c].has_embed, h = lo->chunks[c].has_head;
        if (e && h) push(ev, &n, m->embed_unit, c, B, true);
        if (h) {
            push(ev, &n, m->head_unit, c, B, true);
            push(ev, &n, m->head_unit, c, B, false);
        }
        int nu = chunk_layer_units(m, c, units);
        for (int i = nu - 1; i >= 0; i--) {
            push(ev, &n, units[i], c, B, true);
            push(ev, &n, units[i], c, B, false);
        }
        if (e && !h) push(ev, &n, m->embed_unit, c, B, true);
        if (e) push(ev, &n, m->embed_unit, c, B, false);
    }
    return n;
}

static void print_events(const char *what, const ct_model *m, const event *ev, int n) {
    printf("%s:", what);
    for (int i = 0; i < n; i++)
        printf(" %s%s%s(c%d)", ev[i].pass == CT_PASS_FORWARD ? "F" : "B", ev[i].begin ? "+" : "-",
               m->units[ev[i].unit].name, ev[i].chunk);
    printf("\n");
}

/* Checks of the recorded brackets that need no reference: per pass, a unit opens before it
 * closes and at most one layer unit is open at a time. Returns the number of violations. */
static int bracket_violations(const ct_model *m, const recorder *r) {
    int bad = 0;
    int *open = ct_xcalloc((size_t)m->n_units, sizeof(int));
    int layer_open = 0;
    for (int i = 0; i < r->n_ev; i++) {
        const event *e = &r->ev[i];
        bool is_layer = m->units[e->unit].n_layers > 0;
        if (i > 0 && e->pass != r->ev[i - 1].pass) {
            for (int u = 0; u < m->n_units; u++) bad += open[u] != 0;
            memset(open, 0, (size_t)m->n_units * sizeof(int));
        }
        open[e->unit] += e->begin ? 1 : -1;
        if (open[e->unit] < 0 || open[e->unit] > 1) bad++;
        if (is_layer) layer_open += e->begin ? 1 : -1;
        if (layer_open > 1) bad++;
    }
    for (int u = 0; u < m->n_units; u++) bad += open[u] != 0;
    free(open);
    return bad;
}

/* Sum of |gradient| over layer l's parameters in unit u, from the unit's gradients `g`. */
static double layer_grad_l1(const ct_model *m, const ct_unit *unit, int l, const float *g) {
    double sum = 0;
    for (int i = unit->first_param; i < unit->first_param + unit->n_params; i++) {
        const ct_param *p = &m->params[i];
        int pl;
        if (sscanf(p->name, "layers.%d.", &pl) != 1 || pl != l) continue;
        for (int64_t e = 0; e < p->numel; e++) sum += fabs(g[p->offset + e]);
    }
    return sum;
}

/* Runs one step of the merged model under recording hooks and checks the brackets against the
 * contract, and the numbers against the unmerged model without hooks. Prints what went wrong
 * and returns false on any failure (the caller asserts after all cases, so one run shows every
 * case that fails). */
static bool check_hooks(const char *what, const ct_config *cfg, ct_backend *be,
                        ct_model_layout layout, int64_t min_bytes, bool enforce) {
    ct_model *flat = new_model(cfg, be, layout, 0);
    double ref = run_step(flat, NULL);
    ct_model *m = new_model(cfg, be, layout, min_bytes);
    recorder r = {.m = m, .enforce = enforce};
    if (enforce) {
        r.poison = ct_tensor_new_1d(be, CT_DTYPE_F32, m->slab_numel, CT_MEM_WORKSPACE);
        r.trash = ct_tensor_new_1d(be, CT_DTYPE_F32, m->slab_numel, CT_MEM_WORKSPACE);
        ct_tensor_fill(r.poison, NAN);
        ct_tensor_zero(r.trash);
    }
    r.grad_at_end = ct_xcalloc((size_t)m->n_units, sizeof *r.grad_at_end);
    r.n_backward_ends = ct_xcalloc((size_t)m->n_units, sizeof(int));
    double loss = run_step(m, &r);

    event want[MAX_EVENTS];
    int n_want = expected_events(m, want);
    bool order = n_want == r.n_ev;
    for (int i = 0; order && i < n_want; i++)
        order = want[i].unit == r.ev[i].unit && want[i].chunk == r.ev[i].chunk &&
                want[i].pass == r.ev[i].pass && want[i].begin == r.ev[i].begin;
    int violations = bracket_violations(m, &r);
    /* After a unit's backward bracket closed, nothing more was written to its gradients
     * (observe), and each of its layers had written something (both modes). */
    int ends = 0, late = 0, empty = 0;
    for (int u = 0; u < m->n_units; u++) {
        const ct_unit *unit = &m->units[u];
        size_t bytes = (size_t)unit->padded_numel * sizeof(float);
        ends += r.n_backward_ends[u] != 1;
        if (!r.grad_at_end[u]) continue;
        float *final = ct_xmalloc(bytes);
        ct_tensor_to_host(final, unit->grads);
        late += memcmp(final, r.grad_at_end[u], bytes) != 0;
        for (int l = unit->first_layer; l < unit->first_layer + unit->n_layers; l++)
            empty += !(layer_grad_l1(m, unit, l, r.grad_at_end[u]) > 0);
        free(final);
    }
    bool same_loss = !memcmp(&loss, &ref, sizeof loss);
    int differ = count_differing(m, flat, true);
    bool ok = order && !violations && !r.dirty_at_begin && !ends && !late && !empty && same_loss &&
              !differ;
    if (!ok) {
        printf("%s, unit_min_bytes %lld, %s, %s: order %s, %d violations, %d dirty at begin, "
               "%d units not closed once in backward, %d written after close, %d layers empty "
               "at close, loss %s, %d gradients differ\n",
               what, (long long)min_bytes, layout.recompute ? "recompute" : "keep",
               enforce ? "enforce" : "observe", order ? "ok" : "WRONG", violations,
               r.dirty_at_begin, ends, late, empty, same_loss ? "same" : "DIFFERS", differ);
        print_events("  expected", m, want, n_want);
        print_events("  recorded", m, r.ev, r.n_ev);
    }
    for (int u = 0; u < m->n_units; u++) free(r.grad_at_end[u]);
    free(r.grad_at_end);
    free(r.n_backward_ends);
    ct_tensor_free(r.poison);
    ct_tensor_free(r.trash);
    ct_model_free(m);
    ct_model_free(flat);
    return ok;
}

/* The brackets for every layout case and threshold (one per layer included), keeping every
 * activation and with train.recompute = full (the layer's forward rerun inside the backward
 * bracket), observed and enforced. */
static void test_hooks(void **state) {
    ct_backend *be = test_backend_new(1);
    int failed = 0, cases = 0;
    for (int k = 0; k < N_LAYOUT_CASES; k++) {
        for (int recompute = 0; recompute < 2; recompute++) {
            ct_config cfg;
            ct_model_layout layout = case_layout(&layout_cases[k], &cfg);
            layout.recompute = recompute;
            ct_model *flat = new_model(&cfg, be, layout, 0);
            int64_t thresholds[4] = {0};
            case_thresholds(flat, thresholds + 1);
            ct_model_free(flat);
            for (int t = 0; t < 4; t++)
                for (int enforce = 0; enforce < 2; enforce++, cases++)
                    failed += !check_hooks(layout_cases[k].what, &cfg, be, layout, thresholds[t],
                                           enforce);
        }
    }
    printf("%d of %d bracket cases failed\n", failed, cases);
    assert_int_equal(failed, 0);
    ct_backend_free(be);
}

int main(int argc, char **argv) {
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unit_names_single),   cmocka_unit_test(test_unit_names_tp),
        cmocka_unit_test(test_unit_names_pipeline), cmocka_unit_test(test_init_bitwise),
        cmocka_unit_test(test_step_bitwise),        cmocka_unit_test(test_hooks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
