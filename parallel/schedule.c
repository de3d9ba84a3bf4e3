/*
 * schedule.c — pipeline schedule generators, the simulator and the timeline printer (see
 * schedule.h).
 *
 * Every generator is the same skeleton: decide, per rank, the order in which it runs its
 * FORWARD(mb, c) and BACKWARD(mb, c) steps, and let emit_forward()/emit_backward() wrap each
 * step in its transfers. Keeping the transfers out of the ordering logic is what makes the four
 * schedules short and lets the simulator and the executor treat them alike.
 *
 * The simulator evaluates the lists as a dependency graph: an action's time depends only on the
 * previous action of its rank and, for a receive, on when the matching send ran. It therefore
 * advances each rank as far as it can, rank after rank, until nothing moves; the visiting order
 * cannot change any time, so this gives the same answer as a priority-queue event loop with less
 * machinery, and "nothing moves while work is left" is exactly a deadlock.
 */
#include "schedule.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"

/* ---- names and layout -------------------------------------------------------------------------
 */

const char *ct_schedule_kind_name(ct_schedule_kind kind) {
    switch (kind) {
    case CT_SCHEDULE_GPIPE: return "gpipe";
    case CT_SCHEDULE_1F1B: return "1f1b";
    case CT_SCHEDULE_INTERLEAVED: return "interleaved";
    case CT_SCHEDULE_ZBH1: return "zbh1";
    case CT_SCHEDULE_ZBV: return "zbv";
    case CT_SCHEDULE_FORWARD_ONLY: return "forward-only";
    }
    return "?";
}

bool ct_schedule_splits_backward(ct_schedule_kind kind) {
    return kind == CT_SCHEDULE_ZBH1 || kind == CT_SCHEDULE_ZBV;
}

const char *ct_action_kind_name(ct_action_kind kind) {
    switch (kind) {
    case CT_ACTION_FORWARD: return "FORWARD";
    case CT_ACTION_BACKWARD: return "BACKWARD";
    case CT_ACTION_SEND_ACT: return "SEND_ACT";
    case CT_ACTION_RECV_ACT: return "RECV_ACT";
    case CT_ACTION_SEND_GRAD: return "SEND_GRAD";
    case CT_ACTION_RECV_GRAD: return "RECV_GRAD";
    case CT_ACTION_BACKWARD_INPUT: return "BACKWARD_INPUT";
    case CT_ACTION_BACKWARD_WEIGHT: return "BACKWARD_WEIGHT";
    }
    return "?";
}

int ct_schedule_chunk_rank(const ct_schedule *s, int chunk) {
    CT_ASSERTF(chunk >= 0 && chunk < s->pp * s->v, "chunk %d of %d", chunk, s->pp * s->v);
    if (s->v_shape) /* the V: down the ranks, then back up */
        return chunk < s->pp ? chunk : 2 * s->pp - 1 - chunk;
    return chunk % s->pp;
}

static int n_chunks(const ct_schedule *s) {
    return s->pp * s->v;
}

/* The global index of rank r's local chunk j: r + j·pp, or in the V r and then 2pp−1−r (the
 * inverse of ct_schedule_chunk_rank). */
static int global_chunk(const ct_schedule *s, int r, int j) {
    return s->v_shape && j == 1 ? 2 * s->pp - 1 - r : r + j * s->pp;
}

static bool is_compute(ct_action_kind kind) {
    return kind == CT_ACTION_FORWARD || kind == CT_ACTION_BACKWARD ||
           kind == CT_ACTION_BACKWARD_INPUT || kind == CT_ACTION_BACKWARD_WEIGHT;
}

bool ct_action_match(const ct_schedule *s, int rank, const ct_action *a, ct_action *match) {
    int last = n_chunks(s) - 1, c = a->chunk, other;
    ct_action_kind kind;
    if (c < 0 || c > last) return false;
    switch (a->kind) {
    case CT_ACTION_SEND_ACT: kind = CT_ACTION_RECV_ACT, other = c + 1; break;
    case CT_ACTION_RECV_ACT: kind = CT_ACTION_SEND_ACT, other = c - 1; break;
    case CT_ACTION_SEND_GRAD: kind = CT_ACTION_RECV_GRAD, other = c - 1; break;
    case CT_ACTION_RECV_GRAD: kind = CT_ACTION_SEND_GRAD, other = c + 1; break;
    default: return false;
    }
    if (other < 0 || other > last) return false;
    *match = (ct_action){.kind = kind, .mb = a->mb, .chunk = other, .peer = rank};
    return true;
}

/* ---- generators -------------------------------------------------------------------------------
 */

static void emit(ct_schedule *s, int r, ct_action_kind kind, int mb, int c, int peer) {
    s->actions[r][s->n_actions[r]++] =
        (ct_action){.kind = kind, .mb = mb, .chunk = c, .peer = peer};
}

/* The receive goes right before the compute and the send right after, so a rank never holds a
 * message longer than it needs and the executor can post both around one step. */
static void emit_forward(ct_schedule *s, int r, int mb, int c) {
    int last = n_chunks(s) - 1;
    if (c > 0) emit(s, r, CT_ACTION_RECV_ACT, mb, c, ct_schedule_chunk_rank(s, c - 1));
    emit(s, r, CT_ACTION_FORWARD, mb, c, -1);
    if (c < last) emit(s, r, CT_ACTION_SEND_ACT, mb, c, ct_schedule_chunk_rank(s, c + 1));
}

/* A whole BACKWARD, or in a split schedule its input part (the weight part is emit_weight's). */
static void emit_backward(ct_schedule *s, int r, int mb, int c) {
    int last = n_chunks(s) - 1;
    ct_action_kind kind =
        ct_schedule_splits_backward(s->kind) ? CT_ACTION_BACKWARD_INPUT : CT_ACTION_BACKWARD;
    if (c < last) emit(s, r, CT_ACTION_RECV_GRAD, mb, c, ct_schedule_chunk_rank(s, c + 1));
    emit(s, r, kind, mb, c, -1);
    if (c > 0) emit(s, r, CT_ACTION_SEND_GRAD, mb, c, ct_schedule_chunk_rank(s, c - 1));
}

static void emit_weight(ct_schedule *s, int r, int mb, int c) {
    emit(s, r, CT_ACTION_BACKWARD_WEIGHT, mb, c, -1);
}

/* Megatron's numbering of a rank's m·v compute steps (v = 1 gives plain 1F1B: chunk r, mb k).
 * Microbatches go in groups of p: the group runs through local chunk 0, then 1, ..., so that by
 * the time a rank comes back to a chunk the previous group has left the rest of the pipeline. */
static int step_mb(const ct_schedule *s, int k) {
    return (k / (s->pp * s->v)) * s->pp + k % s->pp;
}
static int step_fwd_chunk(const ct_schedule *s, int r, int k) {
    return r + ((k / s->pp) % s->v) * s->pp;
}
static int step_bwd_chunk(const ct_schedule *s, int r, int k) {
    return r + (s->v - 1 - (k / s->pp) % s->v) * s->pp;
}

/* Warm-up forwards, then one forward / one backward, then the remaining backwards. */
static void gen_warmup_steady_cooldown(ct_schedule *s, int r, int warmup) {
    int total = s->m * s->v;
    for (int k = 0; k < warmup; k++) emit_forward(s, r, step_mb(s, k), step_fwd_chunk(s, r, k));
    for (int k = 0; k < total - warmup; k++) {
        int kf = k + warmup;
        emit_forward(s, r, step_mb(s, kf), step_fwd_chunk(s, r, kf));
        emit_backward(s, r, step_mb(s, k), step_bwd_chunk(s, r, k));
    }
    for (int k = total - warmup; k < total; k++)
        emit_backward(s, r, step_mb(s, k), step_bwd_chunk(s, r, k));
}

/*
 * ZB-H1: 1F1B's forwards and input gradients, each B's W queued behind the earlier ones (one
 * chunk: W in microbatch order) and run as soon as more than r wait on rank r. Rank r's idle in
 * 1F1B's steady state is where its gradients arrive late by the ranks below it; holding r weight
 * parts back fills it, and as a W keeps only what its GEMMs read, the microbatches held stay
 * 1F1B's rank 0's on every rank (pp−r un-backwarded plus up to r waiting). The rest drain at the
 * end. No transfer depends on a W, so the order of sends and receives is 1F1B's: deadlock-free for
 * any m as 1F1B is.
 */
static void gen_zbh1(ct_schedule *s, int r) {
    const int m = s->m, warmup = CT_MIN(s->pp - r - 1, m);
    int f = 0, b = 0, w = 0;
    for (; f < warmup; f++) emit_forward(s, r, f, r);
    while (b < m) {
        if (f < m) emit_forward(s, r, f++, r);
        emit_backward(s, r, b++, r);
        while (b - w > r) emit_weight(s, r, w++, r);
    }
    while (w < m) emit_weight(s, r, w++, r);
}

/*
 * ZB-V: rank r holds chunk c0 = r (going down the V) and c1 = 2p−1−r (coming back up). Each step
 * below is taken only when it can be (a forward of c1 after c0's of the same microbatch, a B after
 * its forward, c0's B after c1's — on rank p−1, c0's gradient comes from c1 — and a W after its
 * B), so the lists hold every action once for any m; every chunk runs F, B and W in microbatch
 * order. Phases: 2(p−r)−1 forwards of c0 fill the V down to this rank's turn; r pairs (F c1,
 * F c0) while the ranks above start sending back; p−r triples (F, B, W of c1); then F, B, W of
 * c0 and of c1 in turn until the forwards are done; r pairs of B (c0, c1) and p−r (B, W) of c0
 * cool down; the remaining weight parts last, c1's then c0's. With equal costs a rank never
 * idles between its first and last action once m ≥ 2p (the simulator checks it, test_schedule).
 * Deadlock-free: checked by the simulator for pp 2..8 and m 1..40 (test_schedule).
 */
typedef struct zbv_counts {
    int f0, f1, b0, b1, w0, w1;
} zbv_counts;

/* One step: f/F a forward of c0/c1, b/B an input gradient, w/W a weight part, when it can be. */
static void zbv_step(ct_schedule *s, int r, zbv_counts *n, char what) {
    const int m = s->m, c0 = global_chunk(s, r, 0), c1 = global_chunk(s, r, 1);
    switch (what) {
    case 'f':
        if (n->f0 < m) emit_forward(s, r, n->f0++, c0);
        break;
    case 'F':
        if (n->f1 < n->f0) emit_forward(s, r, n->f1++, c1);
        break;
    case 'b':
        if (n->b0 < n->b1) emit_backward(s, r, n->b0++, c0);
        break;
    case 'B':
        if (n->b1 < n->f1) emit_backward(s, r, n->b1++, c1);
        break;
    case 'w':
        if (n->w0 < n->b0) emit_weight(s, r, n->w0++, c0);
        break;
    case 'W':
        if (n->w1 < n->b1) emit_weight(s, r, n->w1++, c1);
        break;
    }
}

static void zbv_steps(ct_schedule *s, int r, zbv_counts *n, const char *what, int times) {
    for (int t = 0; t < times; t++)
        for (const char *c = what; *c; c++) zbv_step(s, r, n, *c);
}

static void gen_zbv(ct_schedule *s, int r) {
    const int p = s->pp, m = s->m;
    zbv_counts n = {0};
    zbv_steps(s, r, &n, "f", 2 * (p - r) - 1);
    zbv_steps(s, r, &n, "Ff", r);
    zbv_steps(s, r, &n, "FBW", p - r);
    while (n.f1 < m) zbv_steps(s, r, &n, "fbwFBW", 1);
    zbv_steps(s, r, &n, "bB", r);
    zbv_steps(s, r, &n, "bw", p - r);
    while (n.b0 < m || n.b1 < m) zbv_steps(s, r, &n, "Bb", 1);
    zbv_steps(s, r, &n, "W", m);
    zbv_steps(s, r, &n, "w", m);
}

static void gen_rank(ct_schedule *s, int r) {
    int p = s->pp, v = s->v, m = s->m;
    switch (s->kind) {
    case CT_SCHEDULE_GPIPE:
        for (int mb = 0; mb < m; mb++) emit_forward(s, r, mb, r);
        for (int mb = 0; mb < m; mb++) emit_backward(s, r, mb, r);
        break;
    case CT_SCHEDULE_1F1B:
        /* Rank r can admit p−r−1 microbatches before the first gradient could possibly return. */
        gen_warmup_steady_cooldown(s, r, CT_MIN(p - r - 1, m));
        break;
    case CT_SCHEDULE_INTERLEAVED:
        /* Megatron's count: (v−1)·p forwards fill the later chunks' first group, and 2 more
         * per downstream rank give the slack that keeps a rank from stalling on its neighbours
         * when sends and receives are posted in pairs (NVIDIA/Megatron-LM#169). With free,
         * non-blocking transfers, as simulated here, the makespan is the same without them;
         * they cost 2 chunk activations per downstream rank. */
        gen_warmup_steady_cooldown(s, r, CT_MIN((p - r - 1) * 2 + (v - 1) * p, m * v));
        break;
    case CT_SCHEDULE_ZBH1: gen_zbh1(s, r); break;
    case CT_SCHEDULE_ZBV: gen_zbv(s, r); break;
    case CT_SCHEDULE_FORWARD_ONLY:
        /* Global chunk order inside a microbatch, microbatches in order: every receive waits on
         * a send that comes earlier in the (mb, chunk) lexicographic order, so no cycle. */
        for (int mb = 0; mb < m; mb++)
            for (int j = 0; j < v; j++) emit_forward(s, r, mb, global_chunk(s, r, j));
        break;
    }
}

ct_status ct_schedule_check(ct_schedule_kind kind, int pp, int v, int m) {
    const char *name = ct_schedule_kind_name(kind);
    if ((int)kind < 0 || kind > CT_SCHEDULE_FORWARD_ONLY) {
        ct_error(CT_ERR_INPUT, "unknown pipeline schedule kind %d", (int)kind);
        ct_hint("use gpipe, 1f1b, interleaved, zbh1, zbv or forward-only");
        return CT_ERR_INPUT;
    }
    if (pp < 1 || v < 1 || m < 1) {
        ct_error(CT_ERR_INPUT,
                 "pipeline schedule %s needs pp >= 1, v >= 1 and m >= 1 (got pp=%d v=%d m=%d)",
                 name, pp, v, m);
        ct_hint("pp is the number of pipeline ranks, v the chunks per rank, m the microbatches "
                "per step; all must be positive");
        return CT_ERR_INPUT;
    }
    if ((kind == CT_SCHEDULE_GPIPE || kind == CT_SCHEDULE_1F1B || kind == CT_SCHEDULE_ZBH1) &&
        v > 1) {
        ct_error(CT_ERR_INPUT, "pipeline schedule %s runs one chunk per rank (got v=%d, pp=%d)",
                 name, v, pp);
        ct_hint("use v=1 with %s, or the interleaved schedule for v=%d chunks per rank", name, v);
        return CT_ERR_INPUT;
    }
    if (kind == CT_SCHEDULE_ZBV && v != 2) {
        ct_error(CT_ERR_INPUT, "pipeline schedule zbv runs 2 chunks per rank in a V (got v=%d)", v);
        ct_hint("use v=2 with zbv");
        return CT_ERR_INPUT;
    }
    if (kind == CT_SCHEDULE_INTERLEAVED && v < 2) {
        ct_error(CT_ERR_INPUT,
                 "pipeline schedule interleaved needs v >= 2 chunks per rank (got "
                 "v=%d, pp=%d, m=%d)",
                 v, pp, m);
        ct_hint("use v=2 or more, or the 1f1b schedule for one chunk per rank");
        return CT_ERR_INPUT;
    }
    if (kind == CT_SCHEDULE_INTERLEAVED && m % pp) {
        ct_error(CT_ERR_INPUT,
                 "pipeline schedule interleaved needs m=%d microbatches to be a multiple of "
                 "pp=%d (m %% pp = %d)",
                 m, pp, m % pp);
        if (m < pp)
            ct_hint("microbatches go through the chunks in groups of pp; try m=%d", pp);
        else
            ct_hint("microbatches go through the chunks in groups of pp; try m=%d or m=%d",
                    (m / pp) * pp, (m / pp + 1) * pp);
        return CT_ERR_INPUT;
    }
    /* Each compute step brings at most two transfers: 7 actions per (mb, local chunk) with the
     * weight part. */
    if ((int64_t)pp * v > INT_MAX / 2 || (int64_t)m * v > INT_MAX / 7) {
        ct_error(CT_ERR_INPUT, "pipeline schedule %s with pp=%d v=%d m=%d is too large", name, pp,
                 v, m);
        ct_hint("pp·v and 7·m·v must fit in an int");
        return CT_ERR_INPUT;
    }
    return CT_OK;
}

static ct_schedule *schedule_new(ct_schedule_kind kind, int pp, int v, int m, bool v_shape) {
    if (ct_schedule_check(kind, pp, v, m) != CT_OK) return NULL;
    ct_schedule *s = ct_xcalloc(1, sizeof *s);
    s->kind = kind;
    s->v_shape = v_shape;
    s->pp = pp;
    s->v = v;
    s->m = m;
    s->n_actions = ct_xcalloc((size_t)pp, sizeof *s->n_actions);
    s->actions = ct_xcalloc((size_t)pp, sizeof *s->actions);
    size_t cap = (size_t)7 * (size_t)m * (size_t)v;
    for (int r = 0; r < pp; r++) {
        s->actions[r] = ct_xmalloc(cap * sizeof(ct_action));
        gen_rank(s, r);
        CT_ASSERT((size_t)s->n_actions[r] <= cap);
    }
    return s;
}

ct_schedule *ct_schedule_new(ct_schedule_kind kind, int pp, int v, int m) {
    return schedule_new(kind, pp, v, m, kind == CT_SCHEDULE_ZBV);
}

ct_schedule *ct_schedule_new_forward_only_v(int pp, int m) {
    return schedule_new(CT_SCHEDULE_FORWARD_ONLY, pp, 2, m, true);
}

void ct_schedule_free(ct_schedule *s) {
    if (!s) return;
    for (int r = 0; r < s->pp; r++) free(s->actions[r]);
    free(s->actions);
    free(s->n_actions);
    free(s);
}

double ct_schedule_theory_bubble(const ct_schedule *s) {
    return ct_schedule_theory_bubble_costs(s, (ct_sim_costs){1.0, 1.0, 1.0});
}

double ct_schedule_theory_bubble_costs(const ct_schedule *s, ct_sim_costs c) {
    double p = s->pp, v = s->v, m = s->m;
    switch (s->kind) {
    case CT_SCHEDULE_ZBH1: {
        /* idle (p−1)(F+B−W) a rank, its work m(F+B+W) */
        double idle = (p - 1) * CT_MAX(c.f + c.b - c.w, 0.0);
        return idle / (m * (c.f + c.b + c.w) + idle);
    }
    case CT_SCHEDULE_ZBV: {
        /* rank r starts r chunk-forwards late and ends as late (equal costs, m >= 2p) */
        double idle = (p - 1) * c.f / v;
        return idle / (m * (c.f + c.b + c.w) + idle);
    }
    case CT_SCHEDULE_GPIPE:
    case CT_SCHEDULE_1F1B: return (p - 1) / (m + p - 1);
    case CT_SCHEDULE_INTERLEAVED: return (p - 1) / (v * m + p - 1);
    case CT_SCHEDULE_FORWARD_ONLY:
        /* In units of one chunk forward: microbatch k enters chunk 0 at k·((v−1)·p + 1) (rank 0
         * must finish k−1's last local chunk first) and needs p·v more to leave. */
        return 1 - m * v / ((m - 1) * ((v - 1) * p + 1) + p * v);
    }
    return 0;
}

/* ---- order check ------------------------------------------------------------------------------
 */

static void action_str(const ct_action *a, char *buf, size_t n) {
    snprintf(buf, n, "%s(mb %d, chunk %d)", ct_action_kind_name(a->kind), a->mb, a->chunk);
}

/* Records the first problem; later ones would mostly be consequences of it. */
static void order_fail(ct_sim_result *res, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void order_fail(ct_sim_result *res, const char *fmt, ...) {
    if (!res->order_ok) return;
    res->order_ok = false;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(res->order_msg, sizeof res->order_msg, fmt, ap);
    va_end(ap);
}

#define N_KINDS 8

/* Per (kind, mb, chunk): how often it occurs and where (on the rank that runs chunk c, which is
 * where all six kinds for (mb, c) belong). */
static void check_order(const ct_schedule *s, ct_sim_result *res) {
    int nc = n_chunks(s), last = nc - 1, m = s->m;
    size_t cells = (size_t)m * (size_t)nc;
    int *count = ct_xcalloc(N_KINDS * cells, sizeof *count);
    int *pos = ct_xcalloc(N_KINDS * cells, sizeof *pos);
    char buf[64];
    res->order_ok = true;
    res->order_msg[0] = '\0';

    for (int r = 0; r < s->pp; r++) {
        for (int i = 0; i < s->n_actions[r]; i++) {
            const ct_action *a = &s->actions[r][i];
            action_str(a, buf, sizeof buf);
            if ((int)a->kind < 0 || (int)a->kind >= N_KINDS || a->mb < 0 || a->mb >= m ||
                a->chunk < 0 || a->chunk >= nc) {
                order_fail(res, "rank %d action %d: %s is out of range (m=%d, %d chunks)", r, i,
                           buf, m, nc);
                continue;
            }
            if (ct_schedule_chunk_rank(s, a->chunk) != r) {
                order_fail(res, "rank %d action %d: %s belongs to rank %d", r, i, buf,
                           ct_schedule_chunk_rank(s, a->chunk));
                continue;
            }
            if (!is_compute(a->kind)) {
                ct_action match;
                if (!ct_action_match(s, r, a, &match)) {
                    order_fail(res, "rank %d action %d: %s crosses the end of the model", r, i,
                               buf);
                    continue;
                }
                int want = ct_schedule_chunk_rank(s, match.chunk);
                if (a->peer != want)
                    order_fail(res, "rank %d action %d: %s has peer %d, its partner is on rank %d",
                               r, i, buf, a->peer, want);
            }
            size_t at = (size_t)a->kind * cells + (size_t)a->mb * nc + a->chunk;
            count[at]++;
            pos[at] = i;
        }
    }

    bool fwd_only = s->kind == CT_SCHEDULE_FORWARD_ONLY;
    bool split = ct_schedule_splits_backward(s->kind);
    for (int mb = 0; mb < m && res->order_ok; mb++) {
        for (int c = 0; c < nc && res->order_ok; c++) {
            int r = ct_schedule_chunk_rank(s, c);
            size_t at = (size_t)mb * nc + c;
#define CNT(k) count[(size_t)(k)*cells + at]
#define POS(k) pos[(size_t)(k)*cells + at]
            /* How many of each kind (mb, c) needs; each message needs its partner too, which
             * this also covers: a missing SEND_ACT(mb, c−1) shows up at (mb, c−1). */
            int need[N_KINDS] = {
                [CT_ACTION_FORWARD] = 1,
                [CT_ACTION_BACKWARD] = !fwd_only && !split,
                [CT_ACTION_BACKWARD_INPUT] = split,
                [CT_ACTION_BACKWARD_WEIGHT] = split,
                [CT_ACTION_RECV_ACT] = c > 0,
                [CT_ACTION_SEND_ACT] = c < last,
                [CT_ACTION_RECV_GRAD] = !fwd_only && c < last,
                [CT_ACTION_SEND_GRAD] = !fwd_only && c > 0,
            };
            for (int k = 0; k < N_KINDS; k++) {
                if (CNT(k) != need[k]) {
                    ct_action a = {.kind = (ct_action_kind)k, .mb = mb, .chunk = c};
                    action_str(&a, buf, sizeof buf);
                    order_fail(res, "rank %d runs %s %d times, expected %d", r, buf, CNT(k),
                               need[k]);
                    break;
                }
            }
            if (!res->order_ok) break;
            int f = POS(CT_ACTION_FORWARD),
                b = POS(split ? CT_ACTION_BACKWARD_INPUT : CT_ACTION_BACKWARD);
            if (split && POS(CT_ACTION_BACKWARD_WEIGHT) < b)
                order_fail(res,
                           "rank %d: BACKWARD_WEIGHT(mb %d, chunk %d) comes before its "
                           "BACKWARD_INPUT",
                           r, mb, c);
            /* a chunk's weight gradients accumulate in microbatch order, as in 1F1B */
            if (split && mb > 0 &&
                POS(CT_ACTION_BACKWARD_WEIGHT) <
                    pos[(size_t)CT_ACTION_BACKWARD_WEIGHT * cells + at - (size_t)nc])
                order_fail(res,
                           "rank %d: BACKWARD_WEIGHT(mb %d, chunk %d) comes before "
                           "microbatch %d's",
                           r, mb, c, mb - 1);
            if (!fwd_only && b < f)
                order_fail(res, "rank %d: %s(mb %d, chunk %d) comes before its FORWARD", r,
                           split ? "BACKWARD_INPUT" : "BACKWARD", mb, c);
            if (c > 0 && POS(CT_ACTION_RECV_ACT) > f)
                order_fail(res, "rank %d: RECV_ACT(mb %d, chunk %d) comes after its FORWARD", r, mb,
                           c);
            if (c < last && POS(CT_ACTION_SEND_ACT) < f)
                order_fail(res, "rank %d: SEND_ACT(mb %d, chunk %d) comes before its FORWARD", r,
                           mb, c);
            if (!fwd_only && c < last && POS(CT_ACTION_RECV_GRAD) > b)
                order_fail(res, "rank %d: RECV_GRAD(mb %d, chunk %d) comes after its backward", r,
                           mb, c);
            if (!fwd_only && c > 0 && POS(CT_ACTION_SEND_GRAD) < b)
                order_fail(res, "rank %d: SEND_GRAD(mb %d, chunk %d) comes before its backward", r,
                           mb, c);
#undef CNT
#undef POS
        }
    }
    free(count);
    free(pos);
}

/* ---- simulator --------------------------------------------------------------------------------
 */

/* A message is named by its direction, microbatch and the lower of the two chunks it crosses. */
static bool message_key(const ct_schedule *s, const ct_action *a, size_t *key) {
    int nc = n_chunks(s), lower;
    if (a->mb < 0 || a->mb >= s->m || a->chunk < 0 || a->chunk >= nc) return false;
    bool grad = a->kind == CT_ACTION_SEND_GRAD || a->kind == CT_ACTION_RECV_GRAD;
    switch (a->kind) {
    case CT_ACTION_SEND_ACT: lower = a->chunk; break;
    case CT_ACTION_RECV_ACT: lower = a->chunk - 1; break;
    case CT_ACTION_SEND_GRAD: lower = a->chunk - 1; break;
    case CT_ACTION_RECV_GRAD: lower = a->chunk; break;
    default: return false;
    }
    if (lower < 0 || lower >= nc - 1) return false;
    *key = ((size_t)grad * s->m + a->mb) * (size_t)(nc - 1) + lower;
    return true;
}

/* The simulation proper; `start`, when given, receives every action's start time ([pp][n]). */
ct_sim_costs ct_sim_costs_of_ratio(double backward_ratio) {
    return (ct_sim_costs){.f = 1.0, .b = backward_ratio / 2, .w = backward_ratio / 2};
}

/* A compute action's cost on its chunk (cc: each global chunk's own costs); 0 for a transfer. */
static double action_cost(const ct_schedule *s, const ct_action *a, const ct_sim_costs *cc) {
    if (a->chunk < 0 || a->chunk >= n_chunks(s)) return 0.0; /* a broken list's */
    const ct_sim_costs c = cc[a->chunk];
    switch (a->kind) {
    case CT_ACTION_FORWARD: return c.f;
    case CT_ACTION_BACKWARD: return c.b + c.w;
    case CT_ACTION_BACKWARD_INPUT: return c.b;
    case CT_ACTION_BACKWARD_WEIGHT: return c.w;
    default: return 0.0;
    }
}

/* A stage's costs as every chunk's: a chunk costs 1/v of them. Free with free(). */
static ct_sim_costs *uniform_costs(const ct_schedule *s, ct_sim_costs stage) {
    const int nc = n_chunks(s);
    ct_sim_costs *cc = ct_xmalloc((size_t)nc * sizeof *cc);
    for (int c = 0; c < nc; c++)
        cc[c] = (ct_sim_costs){.f = stage.f / s->v, .b = stage.b / s->v, .w = stage.w / s->v};
    return cc;
}

static ct_sim_result simulate(const ct_schedule *s, const ct_sim_costs *cc, double **start) {
    int pp = s->pp, m = s->m, nc = n_chunks(s);
    ct_sim_result res = {.deadlock_rank = -1, .deadlock_action = -1};
    res.busy = ct_xcalloc((size_t)pp, sizeof *res.busy);
    res.bubble = ct_xcalloc((size_t)pp, sizeof *res.bubble);
    res.peak_inflight = ct_xcalloc((size_t)pp, sizeof *res.peak_inflight);
    res.peak_inflight_mb = ct_xcalloc((size_t)pp, sizeof *res.peak_inflight_mb);
    res.peak_pending_w = ct_xcalloc((size_t)pp, sizeof *res.peak_pending_w);
    check_order(s, &res);

    size_t n_msgs = (size_t)2 * m * (size_t)(nc > 1 ? nc - 1 : 1);
    double *sent_at = ct_xmalloc(n_msgs * sizeof *sent_at);
    for (size_t i = 0; i < n_msgs; i++) sent_at[i] = -1;
    int *pc = ct_xcalloc((size_t)pp, sizeof *pc);
    double *clock = ct_xcalloc((size_t)pp, sizeof *clock);
    int *held = ct_xcalloc((size_t)pp, sizeof *held);           /* chunk activations held */
    int *held_mb = ct_xcalloc((size_t)pp, sizeof *held_mb);     /* microbatches with any held */
    int *held_of = ct_xcalloc((size_t)pp * m, sizeof *held_of); /* [r][mb] chunks held */
    int *pending_w = ct_xcalloc((size_t)pp, sizeof *pending_w);

    int64_t left = 0;
    for (int r = 0; r < pp; r++) left += s->n_actions[r];
    while (left > 0) {
        bool moved = false;
        for (int r = 0; r < pp; r++) {
            while (pc[r] < s->n_actions[r]) {
                const ct_action *a = &s->actions[r][pc[r]];
                bool mb_ok = a->mb >= 0 && a->mb < m;
                int *mine = &held_of[(size_t)r * m + (mb_ok ? a->mb : 0)];
                size_t key;
                if (start) start[r][pc[r]] = clock[r];
                const double cost = action_cost(s, a, cc); /* 0: a transfer */
                clock[r] += cost;
                res.busy[r] += cost;
                switch (a->kind) {
                case CT_ACTION_FORWARD:
                    if (mb_ok) {
                        held[r]++;
                        if ((*mine)++ == 0) held_mb[r]++;
                        res.peak_inflight[r] = CT_MAX(res.peak_inflight[r], held[r]);
                        res.peak_inflight_mb[r] = CT_MAX(res.peak_inflight_mb[r], held_mb[r]);
                    }
                    break;
                case CT_ACTION_BACKWARD_INPUT: /* what its W reads stays held */
                    pending_w[r]++;
                    res.peak_pending_w[r] = CT_MAX(res.peak_pending_w[r], pending_w[r]);
                    break;
                case CT_ACTION_BACKWARD:
                case CT_ACTION_BACKWARD_WEIGHT:
                    if (a->kind == CT_ACTION_BACKWARD_WEIGHT && pending_w[r] > 0) pending_w[r]--;
                    /* A broken list may free what it never held; keep the counts sane. */
                    if (mb_ok && *mine > 0) {
                        held[r]--;
                        if (--(*mine) == 0) held_mb[r]--;
                    }
                    break;
                case CT_ACTION_SEND_ACT:
                case CT_ACTION_SEND_GRAD:
                    if (message_key(s, a, &key) && sent_at[key] < 0) sent_at[key] = clock[r];
                    break;
                case CT_ACTION_RECV_ACT:
                case CT_ACTION_RECV_GRAD:
                    if (!message_key(s, a, &key) || sent_at[key] < 0) goto blocked;
                    clock[r] = CT_MAX(clock[r], sent_at[key]);
                    break;
                }
                pc[r]++;
                left--;
                moved = true;
            }
        blocked:;
        }
        if (!moved) {
            res.deadlock = true;
            for (int r = 0; r < pp && res.deadlock_rank < 0; r++)
                if (pc[r] < s->n_actions[r]) {
                    res.deadlock_rank = r;
                    res.deadlock_action = pc[r];
                }
            break;
        }
    }

    for (int r = 0; r < pp; r++) res.total_time = CT_MAX(res.total_time, clock[r]);
    for (int r = 0; r < pp; r++)
        res.bubble[r] = res.total_time > 0 ? 1 - res.busy[r] / res.total_time : 0;
    free(sent_at);
    free(pc);
    free(clock);
    free(held);
    free(held_mb);
    free(held_of);
    free(pending_w);
    return res;
}

bool ct_schedule_channels_in_order(const ct_schedule *s, char *why, size_t why_cap) {
    /* A channel is (direction, lower chunk of the boundary): the k-th send on it must carry the
     * same microbatch as the k-th receive. */
    const int nc = n_chunks(s), m = s->m;
    int *sent = ct_xmalloc((size_t)2 * (size_t)nc * (size_t)m * sizeof(int));
    int *n_sent = ct_xcalloc((size_t)2 * (size_t)nc, sizeof(int));
    int *n_recv = ct_xcalloc((size_t)2 * (size_t)nc, sizeof(int));
    bool ok = true;
    for (int pass = 0; pass < 2 && ok; pass++) { /* sends first, then the receives against them */
        for (int r = 0; r < s->pp && ok; r++) {
            for (int i = 0; i < s->n_actions[r] && ok; i++) {
                const ct_action *a = &s->actions[r][i];
                bool grad = a->kind == CT_ACTION_SEND_GRAD || a->kind == CT_ACTION_RECV_GRAD;
                bool send = a->kind == CT_ACTION_SEND_ACT || a->kind == CT_ACTION_SEND_GRAD;
                bool recv = a->kind == CT_ACTION_RECV_ACT || a->kind == CT_ACTION_RECV_GRAD;
                if (!(pass == 0 ? send : recv)) continue;
                /* the boundary's lower chunk: activations leave c and enter c + 1, gradients
                 * leave c and enter c − 1 */
                int lower = a->kind == CT_ACTION_SEND_ACT || a->kind == CT_ACTION_RECV_GRAD
                                ? a->chunk
                                : a->chunk - 1;
                int ch = 2 * lower + (grad ? 1 : 0);
                if (pass == 0) {
                    CT_ASSERT(n_sent[ch] < m);
                    sent[(size_t)ch * (size_t)m + (size_t)n_sent[ch]++] = a->mb;
                } else {
                    int k = n_recv[ch]++;
                    if (k >= n_sent[ch] || sent[(size_t)ch * (size_t)m + (size_t)k] != a->mb) {
                        ok = false;
                        if (why)
                            snprintf(why, why_cap,
                                     "rank %d receives %s of microbatch %d across chunks %d|%d "
                                     "as its message %d on that channel, which carries "
                                     "microbatch %d",
                                     r, grad ? "gradients" : "activations", a->mb, lower, lower + 1,
                                     k, k < n_sent[ch] ? sent[(size_t)ch * m + k] : -1);
                    }
                }
            }
        }
    }
    free(sent);
    free(n_sent);
    free(n_recv);
    if (ok && why && why_cap) why[0] = '\0';
    return ok;
}

ct_sim_result ct_schedule_simulate(const ct_schedule *s, double backward_ratio) {
    return ct_schedule_simulate_costs(s, ct_sim_costs_of_ratio(backward_ratio));
}

ct_sim_result ct_schedule_simulate_costs(const ct_schedule *s, ct_sim_costs costs) {
    ct_sim_costs *cc = uniform_costs(s, costs);
    ct_sim_result res = simulate(s, cc, NULL);
    free(cc);
    return res;
}

ct_sim_result ct_schedule_simulate_chunks(const ct_schedule *s, const ct_sim_costs *per_chunk) {
    return simulate(s, per_chunk, NULL);
}

void ct_sim_result_release(ct_sim_result *r) {
    if (!r) return;
    free(r->busy);
    free(r->bubble);
    free(r->peak_inflight);
    free(r->peak_inflight_mb);
    free(r->peak_pending_w);
    r->busy = r->bubble = NULL;
    r->peak_inflight = r->peak_inflight_mb = r->peak_pending_w = NULL;
}

/* ---- timeline ---------------------------------------------------------------------------------
 */

static int n_digits(int x) {
    int d = 1;
    while (x >= 10) x /= 10, d++;
    return d;
}

void ct_schedule_print(const ct_schedule *s, double backward_ratio, FILE *out) {
    ct_schedule_print_costs(s, ct_sim_costs_of_ratio(backward_ratio), out);
}

void ct_schedule_print_costs(const ct_schedule *s, ct_sim_costs costs, FILE *out) {
    ct_sim_costs *cc = uniform_costs(s, costs);
    ct_schedule_print_chunks(s, cc, out);
    free(cc);
}

void ct_schedule_print_chunks(const ct_schedule *s, const ct_sim_costs *cc, FILE *out) {
    int pp = s->pp, v = s->v, nc = n_chunks(s);
    const bool split = ct_schedule_splits_backward(s->kind);
    /* the stage's costs the header, the ruler and the theory speak of: the chunks' mean, times v */
    ct_sim_costs costs = {0};
    bool uneven = false;
    for (int c = 0; c < nc; c++) {
        costs.f += cc[c].f * v / nc, costs.b += cc[c].b * v / nc, costs.w += cc[c].w * v / nc;
        uneven = uneven || cc[c].f != cc[0].f || cc[c].b != cc[0].b || cc[c].w != cc[0].w;
    }
    double **start = ct_xcalloc((size_t)pp, sizeof *start);
    for (int r = 0; r < pp; r++) {
        start[r] = ct_xmalloc(((size_t)s->n_actions[r] + 1) * sizeof **start);
        for (int i = 0; i < s->n_actions[r]; i++) start[r][i] = -1;
    }
    ct_sim_result res = simulate(s, cc, start);

    /* One cell per chunk forward; every label in a row has the same width so columns line up:
     * "F07" or, with several chunks per rank, "F07:12" (microbatch 7 on global chunk 12). */
    int mb_w = n_digits(s->m - 1), c_w = n_digits(n_chunks(s) - 1);
    int w = 1 + mb_w + (v > 1 ? 1 + c_w : 0);
    /* cells are chunk forwards: time in stage-forward units of f */
    const double unit = costs.f / v;
    int n_cells = (int)ceil(res.total_time / unit - 1e-9);
    size_t row_len = (size_t)n_cells * w;
    char *row = ct_xmalloc(row_len + 1);
    char label[64];
    int rank_w = n_digits(pp - 1);

    if (split)
        fprintf(out,
                "%s pipeline: pp=%d v=%d m=%d, input gradient (B) = %g x forward, weight "
                "gradients (W) = %g x forward\n",
                ct_schedule_kind_name(s->kind), pp, v, s->m, costs.b / costs.f, costs.w / costs.f);
    else
        fprintf(out, "%s pipeline: pp=%d v=%d m=%d, backward = %g x forward\n",
                ct_schedule_kind_name(s->kind), pp, v, s->m, (costs.b + costs.w) / costs.f);
    if (uneven) fprintf(out, "costs per chunk given; the ratios above are their means\n");
    fprintf(out, "one cell = one chunk forward (1/%d of a stage forward); %s<mb>%s, '.' idle\n", v,
            split ? "F/B/W" : "F/B", v > 1 ? ":<global chunk>" : "");

    /* A ruler with the time, in stage-forward units, above the cell where it starts. */
    int prefix = (int)strlen("rank  |") + rank_w;
    memset(row, ' ', row_len);
    row[row_len] = '\0';
    int free_from = 0;
    for (int t = 0; (size_t)t * v * w < row_len; t++) { /* t in stage forwards */
        int at = t * v * w, len = snprintf(label, sizeof label, "%d", t);
        if (at < free_from || (size_t)(at + len) > row_len) continue;
        memcpy(row + at, label, (size_t)len);
        free_from = at + len + 1;
    }
    size_t used = row_len;
    while (used > 0 && row[used - 1] == ' ') used--;
    fprintf(out, "%-*s%.*s\n", prefix, "time", (int)used, row);

    for (int r = 0; r < pp; r++) {
        memset(row, '.', row_len);
        for (int i = 0; i < s->n_actions[r]; i++) {
            const ct_action *a = &s->actions[r][i];
            /* Actions a deadlock kept from running have no time (-1) and are left out. */
            if (!is_compute(a->kind) || start[r][i] < 0) continue;
            double dur = action_cost(s, a, cc) / unit;
            /* Both ends rounded the same way, so neighbours neither overlap nor leave gaps. */
            int c0 = (int)floor(start[r][i] / unit + 0.5);
            int c1 = (int)floor(start[r][i] / unit + dur + 0.5);
            char letter = a->kind == CT_ACTION_FORWARD           ? 'F'
                          : a->kind == CT_ACTION_BACKWARD_WEIGHT ? 'W'
                                                                 : 'B';
            if (v > 1)
                snprintf(label, sizeof label, "%c%0*d:%0*d", letter, mb_w, a->mb, c_w, a->chunk);
            else
                snprintf(label, sizeof label, "%c%0*d", letter, mb_w, a->mb);
            for (int c = c0; c < c1 && c < n_cells; c++)
                memcpy(row + (size_t)c * w, label, (size_t)w);
        }
        fprintf(out, "rank %*d |%s|\n", rank_w, r, row);
    }

    for (int r = 0; r < pp; r++) {
        fprintf(out,
                "rank %*d: busy %.3f  bubble %6.2f%%  peak in-flight %d chunk activations, %d "
                "microbatches",
                rank_w, r, res.busy[r] / costs.f, 100 * res.bubble[r], res.peak_inflight[r],
                res.peak_inflight_mb[r]);
        if (split) fprintf(out, ", %d weight parts waiting", res.peak_pending_w[r]);
        fprintf(out, "\n");
    }
    fprintf(out, "total time %.3f (stage-forward units), theory bubble %.2f%%, deadlock: ",
            res.total_time / costs.f, 100 * ct_schedule_theory_bubble_costs(s, costs));
    if (res.deadlock) {
        char buf[64];
        action_str(&s->actions[res.deadlock_rank][res.deadlock_action], buf, sizeof buf);
        fprintf(out, "yes, rank %d waits forever at action %d, %s\n", res.deadlock_rank,
                res.deadlock_action, buf);
    } else {
        fprintf(out, "no\n");
    }
    if (!res.order_ok) fprintf(out, "order: NOT ok: %s\n", res.order_msg);

    free(row);
    for (int r = 0; r < pp; r++) free(start[r]);
    free(start);
    ct_sim_result_release(&res);
}
