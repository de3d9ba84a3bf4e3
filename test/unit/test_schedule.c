/*
 * test_schedule.c — pipeline schedules (parallel/schedule.h): each generator's order against
 * the rule it is written from, the transfers around every compute step, the simulator's bubble
 * against the closed-form theory, peak in-flight activations against values derived on paper,
 * deadlock detection on hand-broken lists, argument errors and the timeline printer.
 *
 * Tolerance for bubbles: 1e-12 absolute. Every simulated time is a sum of 1/v and ratio/v with
 * v ∈ {1, 2, 4} and ratio ∈ {1, 1.5, 2}: dyadic rationals, exact in a double at these sizes. The
 * only rounding is the final division busy / total (and the theory's division), ~1e-16, so any
 * difference above 1e-12 is a real one (a single idle 1/v slot would move the bubble by >1e-3).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/common.h"
#include "parallel/schedule.h"

#define BUBBLE_TOL 1e-12

/* Backward/forward cost ratios the theory is checked at: equal costs, the usual 2x, and a ratio
 * that makes forward and backward slots misalign. */
static const double ratios[] = {1.0, 2.0, 1.5};
#define N_RATIOS (int)(sizeof ratios / sizeof ratios[0])

/* ---- helpers ----------------------------------------------------------------------------------
 */

static bool same_action(const ct_action *a, ct_action_kind kind, int mb, int chunk, int peer) {
    return a->kind == kind && a->mb == mb && a->chunk == chunk && a->peer == peer;
}

/* The header's placement rule: RECV right before, SEND right after, peer = the other chunk's
 * rank, and no transfer anywhere else. */
static void check_transfers(const ct_schedule *s) {
    int last = s->pp * s->v - 1;
    for (int r = 0; r < s->pp; r++) {
        const ct_action *a = s->actions[r];
        int n = s->n_actions[r], expected = 0;
        for (int i = 0; i < n; i++) {
            int mb = a[i].mb, c = a[i].chunk;
            if (a[i].kind == CT_ACTION_FORWARD) {
                assert_int_equal(a[i].peer, -1);
                assert_int_equal(ct_schedule_chunk_rank(s, c), r);
                expected++;
                if (c > 0) {
                    assert_true(i > 0);
                    assert_true(same_action(&a[i - 1], CT_ACTION_RECV_ACT, mb, c,
                                            ct_schedule_chunk_rank(s, c - 1)));
                    expected++;
                }
                if (c < last) {
                    assert_true(i + 1 < n);
                    assert_true(same_action(&a[i + 1], CT_ACTION_SEND_ACT, mb, c,
                                            ct_schedule_chunk_rank(s, c + 1)));
                    expected++;
                }
            } else if (a[i].kind == CT_ACTION_BACKWARD_WEIGHT) { /* no transfer */
                assert_int_equal(a[i].peer, -1);
                assert_int_equal(ct_schedule_chunk_rank(s, c), r);
                expected++;
            } else if (a[i].kind == CT_ACTION_BACKWARD || a[i].kind == CT_ACTION_BACKWARD_INPUT) {
                assert_int_equal(a[i].peer, -1);
                assert_int_equal(ct_schedule_chunk_rank(s, c), r);
                expected++;
                if (c < last) {
                    assert_true(i > 0);
                    assert_true(same_action(&a[i - 1], CT_ACTION_RECV_GRAD, mb, c,
                                            ct_schedule_chunk_rank(s, c + 1)));
                    expected++;
                }
                if (c > 0) {
                    assert_true(i + 1 < n);
                    assert_true(same_action(&a[i + 1], CT_ACTION_SEND_GRAD, mb, c,
                                            ct_schedule_chunk_rank(s, c - 1)));
                    expected++;
                }
            }
        }
        /* Every action is a compute step or one of the transfers counted around one. */
        assert_int_equal(n, expected);
    }
}

/* Simulates at every ratio; checks no deadlock, order_ok, the same busy time on every rank and
 * every rank's bubble against `theory`. */
static void check_bubble(const ct_schedule *s, double theory) {
    for (int k = 0; k < N_RATIOS; k++) {
        ct_sim_result res = ct_schedule_simulate(s, ratios[k]);
        assert_false(res.deadlock);
        assert_int_equal(res.deadlock_rank, -1);
        if (!res.order_ok) fail_msg("%s", res.order_msg);
        double busy = s->m * (s->kind == CT_SCHEDULE_FORWARD_ONLY ? 1.0 : 1.0 + ratios[k]);
        for (int r = 0; r < s->pp; r++) {
            assert_true(fabs(res.busy[r] - busy) <= BUBBLE_TOL);
            if (fabs(res.bubble[r] - theory) > BUBBLE_TOL)
                fail_msg("%s pp=%d v=%d m=%d ratio %g rank %d: bubble %.15f, theory %.15f",
                         ct_schedule_kind_name(s->kind), s->pp, s->v, s->m, ratios[k], r,
                         res.bubble[r], theory);
        }
        ct_sim_result_release(&res);
    }
}

/* The microbatch counts of the brief: {1, pp−1, pp, 2pp, 8pp}, those < 1 skipped. */
static int microbatch_counts(int pp, int out[5]) {
    int cand[5] = {1, pp - 1, pp, 2 * pp, 8 * pp}, n = 0;
    for (int i = 0; i < 5; i++)
        if (cand[i] >= 1) out[n++] = cand[i];
    return n;
}

static const int pps[] = {2, 4, 8};

/* ---- GPipe and 1F1B ---------------------------------------------------------------------------
 */

static void test_gpipe(void **state) {
    for (int ip = 0; ip < 3; ip++) {
        int p = pps[ip], ms[5], nm = microbatch_counts(p, ms);
        for (int im = 0; im < nm; im++) {
            int m = ms[im];
            ct_schedule *s = ct_schedule_new(CT_SCHEDULE_GPIPE, p, 1, m);
            assert_non_null(s);
            check_transfers(s);
            /* All forwards in microbatch order, then all backwards in the same (FIFO) order. */
            for (int r = 0; r < p; r++) {
                int nf = 0, nb = 0;
                for (int i = 0; i < s->n_actions[r]; i++) {
                    const ct_action *a = &s->actions[r][i];
                    if (a->kind == CT_ACTION_FORWARD) {
                        assert_int_equal(nb, 0);
                        assert_int_equal(a->mb, nf++);
                    } else if (a->kind == CT_ACTION_BACKWARD) {
                        assert_int_equal(a->mb, nb++);
                    }
                }
                assert_int_equal(nf, m);
                assert_int_equal(nb, m);
            }
            double theory = (double)(p - 1) / (m + p - 1);
            assert_true(fabs(ct_schedule_theory_bubble(s) - theory) <= BUBBLE_TOL);
            check_bubble(s, theory);
            /* GPipe holds every microbatch on every rank before the first backward. */
            ct_sim_result res = ct_schedule_simulate(s, 2.0);
            for (int r = 0; r < p; r++) {
                assert_int_equal(res.peak_inflight_mb[r], m);
                assert_int_equal(res.peak_inflight[r], m);
            }
            ct_sim_result_release(&res);
            ct_schedule_free(s);
        }
    }
}

static void test_1f1b(void **state) {
    for (int ip = 0; ip < 3; ip++) {
        int p = pps[ip], ms[5], nm = microbatch_counts(p, ms);
        for (int im = 0; im < nm; im++) {
            int m = ms[im];
            ct_schedule *s = ct_schedule_new(CT_SCHEDULE_1F1B, p, 1, m);
            assert_non_null(s);
            check_transfers(s);
            /* min(p−r−1, m) warm-up forwards, then F/B alternating, then the drain; forwards
             * and backwards each in microbatch order. */
            for (int r = 0; r < p; r++) {
                int warmup = CT_MIN(p - r - 1, m), nf = 0, nb = 0;
                for (int i = 0; i < s->n_actions[r]; i++) {
                    const ct_action *a = &s->actions[r][i];
                    if (a->kind == CT_ACTION_FORWARD) {
                        assert_int_equal(nb, CT_MAX(nf - warmup, 0));
                        assert_int_equal(a->mb, nf++);
                    } else if (a->kind == CT_ACTION_BACKWARD) {
                        assert_int_equal(nf, CT_MIN(nb + warmup + 1, m));
                        assert_int_equal(a->mb, nb++);
                    }
                }
                assert_int_equal(nf, m);
                assert_int_equal(nb, m);
            }
            double theory = (double)(p - 1) / (m + p - 1);
            assert_true(fabs(ct_schedule_theory_bubble(s) - theory) <= BUBBLE_TOL);
            check_bubble(s, theory);
            /* Warm-up holds min(p−r−1, m); the first steady forward adds one before the first
             * backward frees one, and each later F/B pair keeps the level: min(p−r, m). */
            ct_sim_result res = ct_schedule_simulate(s, 2.0);
            for (int r = 0; r < p; r++) {
                assert_int_equal(res.peak_inflight_mb[r], CT_MIN(p - r, m));
                assert_int_equal(res.peak_inflight[r], CT_MIN(p - r, m));
            }
            ct_sim_result_release(&res);
            ct_schedule_free(s);
        }
    }
}

/* ---- interleaved 1F1B -------------------------------------------------------------------------
 */

/*
 * Peak in-flight, derived on paper (w_r = (p−r−1)·2 + (v−1)·p, the uncapped warm-up):
 *
 * Chunk activations. The w_r warm-up forwards only add. In steady state every step is one
 * FORWARD then one BACKWARD, so the level goes w_r+1, w_r, w_r+1, ...; the drain only removes.
 * If w_r ≥ m·v every forward is a warm-up forward and the level peaks at m·v. So
 *     peak_r = min(w_r + 1, m·v).
 * Rank 0: min((v+1)·p − 1, m·v); for m ≥ 2p that is (v+1)·p − 1 > p (m·v ≥ 2pv > (v+1)p − 1).
 * Each chunk activation is 1/v of a stage's, so rank 0 holds p + (p−1)/v stages' worth against
 * 1F1B's p: the memory price of the smaller bubble.
 *
 * Microbatches with any chunk held. Number the microbatches by their first forward step
 * x = g·p·v + i (group g = mb / p, i = mb % p); the last step to free microbatch mb is the
 * backward of local chunk 0, backward step x + (v−1)·p. Right after forward step w_r + j (before
 * backward j) microbatch x is held iff j − (v−1)·p ≤ x ≤ w_r + j: a window of
 * L = w_r + (v−1)·p + 1 = 2pv − 2r − 1 consecutive step numbers. Valid x come in blocks of p
 * every p·v; as 0 < 2r + 1 < pv, a window of length L holds at most one full block plus
 * min(p, pv − 2r − 1) of the next, reached when the window starts on a block (j = (v−1)·p,
 * which is inside steady state when m ≥ 2p). So for m ≥ 2p:
 *     peak_mb_r = p + min(p, p·v − 2r − 1)     (= 2p for v ≥ 3 or small r),
 * and for m = p every microbatch's chunk-0 forward is a warm-up forward (w_r ≥ (v−1)p ≥ p), so
 * peak_mb_r = m.
 */
static int interleaved_peak_chunks(int p, int v, int m, int r) {
    return CT_MIN((p - r - 1) * 2 + (v - 1) * p + 1, m * v);
}

static int interleaved_peak_mb(int p, int v, int m, int r) {
    if (m < 2 * p) return m;
    return p + CT_MIN(p, p * v - 2 * r - 1);
}

/* The brief's rule for the k-th forward / backward on a rank, written out independently. */
static void check_interleaved_order(const ct_schedule *s) {
    int p = s->pp, v = s->v, m = s->m, total = m * v;
    for (int r = 0; r < p; r++) {
        int warmup = CT_MIN((p - r - 1) * 2 + (v - 1) * p, total), nf = 0, nb = 0;
        for (int i = 0; i < s->n_actions[r]; i++) {
            const ct_action *a = &s->actions[r][i];
            if (a->kind == CT_ACTION_FORWARD) {
                int k = nf++;
                assert_int_equal(nb, CT_MAX(k - warmup, 0));
                assert_int_equal(a->chunk, r + ((k / p) % v) * p);
                assert_int_equal(a->mb, (k / (p * v)) * p + k % p);
            } else if (a->kind == CT_ACTION_BACKWARD) {
                int k = nb++;
                assert_int_equal(nf, CT_MIN(k + warmup + 1, total));
                assert_int_equal(a->chunk, r + (v - 1 - (k / p) % v) * p);
                assert_int_equal(a->mb, (k / (p * v)) * p + k % p);
            }
        }
        assert_int_equal(nf, total);
        assert_int_equal(nb, total);
    }
}

/*
 * The formula (p−1)/(v·m+p−1) holds exactly on every rank and at every ratio tried (1, 1.5, 2),
 * so it is asserted as is. It is a per-rank statement only because every rank does the same
 * work (m·(1+ratio)) against the one makespan; the idle time is not all at the ends — with
 * m ≥ 2p some ranks wait in the middle of the steady state (see the printed timeline) — but the
 * total comes to (p−1)·(1+ratio)/v per rank all the same.
 */
static void test_interleaved(void **state) {
    static const int vs[] = {2, 4};
    for (int ip = 0; ip < 3; ip++) {
        for (int iv = 0; iv < 2; iv++) {
            int p = pps[ip], v = vs[iv], ms[3] = {p, 2 * p, 8 * p};
            for (int im = 0; im < 3; im++) {
                int m = ms[im];
                ct_schedule *s = ct_schedule_new(CT_SCHEDULE_INTERLEAVED, p, v, m);
                assert_non_null(s);
                check_transfers(s);
                check_interleaved_order(s);
                double theory = (double)(p - 1) / (v * m + p - 1);
                assert_true(fabs(ct_schedule_theory_bubble(s) - theory) <= BUBBLE_TOL);
                check_bubble(s, theory);

                ct_sim_result res = ct_schedule_simulate(s, 2.0);
                for (int r = 0; r < p; r++) {
                    assert_int_equal(res.peak_inflight[r], interleaved_peak_chunks(p, v, m, r));
                    assert_int_equal(res.peak_inflight_mb[r], interleaved_peak_mb(p, v, m, r));
                }
                if (m >= 2 * p) {
                    assert_true(res.peak_inflight[0] > p);
                    assert_int_equal(res.peak_inflight[0], (v + 1) * p - 1);
                }
                ct_sim_result_release(&res);
                ct_schedule_free(s);
            }
        }
    }
}

/* Not a check: the peak table the design asks to report (run the test by name to see it). */
static void test_interleaved_peak_report(void **state) {
    static const int vs[] = {2, 4};
    printf("interleaved peak in-flight per rank (chunk activations / microbatches), m >= 2p:\n");
    for (int ip = 0; ip < 3; ip++) {
        for (int iv = 0; iv < 2; iv++) {
            int p = pps[ip], v = vs[iv];
            ct_schedule *s = ct_schedule_new(CT_SCHEDULE_INTERLEAVED, p, v, 2 * p);
            ct_sim_result res = ct_schedule_simulate(s, 2.0);
            printf("  pp=%d v=%d:", p, v);
            for (int r = 0; r < p; r++)
                printf(" %d/%d", res.peak_inflight[r], res.peak_inflight_mb[r]);
            printf("   (1f1b rank 0 holds %d)\n", p);
            ct_sim_result_release(&res);
            ct_schedule_free(s);
        }
    }
}

/* ---- forward-only -----------------------------------------------------------------------------
 */

/*
 * Forward-only runs, on each rank, every microbatch through the rank's chunks in global chunk
 * order. At v = 1 that is the ordinary pipeline fill, bubble (p−1)/(m+p−1). At v > 1 a rank
 * cannot start the next microbatch before this one came back around for its last local chunk,
 * so the fill is paid per microbatch; the theory function carries that formula and the
 * simulation must match it exactly too.
 */
static void test_forward_only(void **state) {
    static const int vs[] = {1, 2, 4};
    for (int ip = 0; ip < 3; ip++) {
        for (int iv = 0; iv < 3; iv++) {
            int p = pps[ip], v = vs[iv], ms[5], nm = microbatch_counts(p, ms);
            for (int im = 0; im < nm; im++) {
                int m = ms[im];
                ct_schedule *s = ct_schedule_new(CT_SCHEDULE_FORWARD_ONLY, p, v, m);
                assert_non_null(s);
                check_transfers(s);
                for (int r = 0; r < p; r++) {
                    int k = 0;
                    for (int i = 0; i < s->n_actions[r]; i++) {
                        const ct_action *a = &s->actions[r][i];
                        assert_true(a->kind != CT_ACTION_BACKWARD &&
                                    a->kind != CT_ACTION_SEND_GRAD &&
                                    a->kind != CT_ACTION_RECV_GRAD);
                        if (a->kind != CT_ACTION_FORWARD) continue;
                        assert_int_equal(a->mb, k / v);
                        assert_int_equal(a->chunk, r + (k % v) * p);
                        k++;
                    }
                    assert_int_equal(k, m * v);
                }
                double theory = ct_schedule_theory_bubble(s);
                if (v == 1) assert_true(fabs(theory - (double)(p - 1) / (m + p - 1)) <= BUBBLE_TOL);
                check_bubble(s, theory);
                /* No backward ever releases an activation: all m·v chunks, all m microbatches. */
                ct_sim_result res = ct_schedule_simulate(s, 2.0);
                for (int r = 0; r < p; r++) {
                    assert_int_equal(res.peak_inflight[r], m * v);
                    assert_int_equal(res.peak_inflight_mb[r], m);
                }
                ct_sim_result_release(&res);
                ct_schedule_free(s);
            }
        }
    }
}

/* pp = 1: no pipeline, no bubble; with v > 1 the chunks talk to their own rank. */
static void test_single_rank(void **state) {
    for (int kind = CT_SCHEDULE_1F1B; kind <= CT_SCHEDULE_FORWARD_ONLY; kind++) {
        int v = kind == CT_SCHEDULE_INTERLEAVED || kind == CT_SCHEDULE_ZBV ? 2 : 1;
        ct_schedule *s = ct_schedule_new((ct_schedule_kind)kind, 1, v, 3);
        assert_non_null(s);
        check_transfers(s);
        for (int i = 0; i < s->n_actions[0]; i++)
            if (s->actions[0][i].peer >= 0) assert_int_equal(s->actions[0][i].peer, 0);
        assert_true(fabs(ct_schedule_theory_bubble(s)) <= BUBBLE_TOL);
        check_bubble(s, 0.0);
        ct_schedule_free(s);
    }
}

static void test_match_and_chunk_rank(void **state) {
    ct_schedule *s = ct_schedule_new(CT_SCHEDULE_INTERLEAVED, 4, 2, 4);
    assert_non_null(s);
    assert_int_equal(ct_schedule_chunk_rank(s, 0), 0);
    assert_int_equal(ct_schedule_chunk_rank(s, 5), 1);
    assert_int_equal(ct_schedule_chunk_rank(s, 7), 3);
    ct_action m;
    ct_action send = {CT_ACTION_SEND_ACT, 2, 3, 0};
    assert_true(ct_action_match(s, 3, &send, &m));
    assert_true(same_action(&m, CT_ACTION_RECV_ACT, 2, 4, 3));
    ct_action recv = {CT_ACTION_RECV_GRAD, 1, 3, 0};
    assert_true(ct_action_match(s, 3, &recv, &m));
    assert_true(same_action(&m, CT_ACTION_SEND_GRAD, 1, 4, 3));
    ct_action off_end = {CT_ACTION_SEND_ACT, 0, 7, 0};
    assert_false(ct_action_match(s, 3, &off_end, &m));
    ct_action compute = {CT_ACTION_FORWARD, 0, 1, -1};
    assert_false(ct_action_match(s, 1, &compute, &m));
    /* Every transfer a generator emits has its partner on the peer, pointing back. */
    for (int r = 0; r < s->pp; r++) {
        for (int i = 0; i < s->n_actions[r]; i++) {
            const ct_action *a = &s->actions[r][i];
            if (a->peer < 0) continue;
            assert_true(ct_action_match(s, r, a, &m));
            bool found = false;
            for (int j = 0; j < s->n_actions[a->peer] && !found; j++)
                found = same_action(&s->actions[a->peer][j], m.kind, m.mb, m.chunk, r);
            assert_true(found);
        }
    }
    ct_schedule_free(s);
}

/* ---- broken schedules -------------------------------------------------------------------------
 */

static int find_action(const ct_schedule *s, int r, ct_action_kind kind, int mb, int chunk) {
    for (int i = 0; i < s->n_actions[r]; i++) {
        const ct_action *a = &s->actions[r][i];
        if (a->kind == kind && a->mb == mb && a->chunk == chunk) return i;
    }
    fail_msg("rank %d has no %s(mb %d, chunk %d)", r, ct_action_kind_name(kind), mb, chunk);
    return -1;
}

static void swap_actions(ct_schedule *s, int r, int i, int j) {
    ct_action t = s->actions[r][i];
    s->actions[r][i] = s->actions[r][j];
    s->actions[r][j] = t;
}

static void test_deadlock_detected(void **state) {
    /* GPipe pp=2 m=1, rank 0 waits for the gradient before sending the activation that the
     * gradient depends on: a two-rank cycle. Each action is still on the right side of its
     * compute step, so the order check passes; only the simulation can see this. */
    ct_schedule *s = ct_schedule_new(CT_SCHEDULE_GPIPE, 2, 1, 1);
    int i_send = find_action(s, 0, CT_ACTION_SEND_ACT, 0, 0);
    int i_recv = find_action(s, 0, CT_ACTION_RECV_GRAD, 0, 0);
    swap_actions(s, 0, i_send, i_recv);
    ct_sim_result res = ct_schedule_simulate(s, 2.0);
    assert_true(res.deadlock);
    assert_true(res.order_ok);
    assert_int_equal(res.deadlock_rank, 0);
    assert_int_equal(res.deadlock_action, i_send); /* the RECV_GRAD, now where the send was */
    assert_int_equal(s->actions[0][res.deadlock_action].kind, CT_ACTION_RECV_GRAD);
    ct_sim_result_release(&res);
    ct_schedule_free(s);

    /* 1F1B pp=4 m=8: rank 1 holds back microbatch 0's activation until microbatch 0's gradient
     * comes back: ranks 1..3 wait on each other, rank 0 on rank 1, so rank 0 is the first
     * stuck rank, at the receive of its first gradient. */
    s = ct_schedule_new(CT_SCHEDULE_1F1B, 4, 1, 8);
    i_send = find_action(s, 1, CT_ACTION_SEND_ACT, 0, 1);
    i_recv = find_action(s, 1, CT_ACTION_RECV_GRAD, 0, 1);
    swap_actions(s, 1, i_send, i_recv);
    res = ct_schedule_simulate(s, 2.0);
    assert_true(res.deadlock);
    assert_true(res.order_ok);
    assert_int_equal(res.deadlock_rank, 0);
    assert_true(same_action(&s->actions[0][res.deadlock_action], CT_ACTION_RECV_GRAD, 0, 0, 1));
    ct_sim_result_release(&res);
    ct_schedule_free(s);

    /* A late send is not a deadlock: on rank 0 of 1F1B pp=4 m=8, sending microbatch 3 only after
     * microbatch 0's gradient is received is fine, since rank 1 runs backward 0 before it needs
     * microbatch 3 (its warm-up is one shorter). The simulator must not cry wolf. */
    s = ct_schedule_new(CT_SCHEDULE_1F1B, 4, 1, 8);
    i_send = find_action(s, 0, CT_ACTION_SEND_ACT, 3, 0);
    i_recv = find_action(s, 0, CT_ACTION_RECV_GRAD, 0, 0);
    assert_true(i_send < i_recv);
    swap_actions(s, 0, i_send, i_recv);
    res = ct_schedule_simulate(s, 2.0);
    assert_false(res.deadlock);
    assert_true(res.order_ok);
    ct_sim_result_release(&res);
    ct_schedule_free(s);
}

static void test_broken_order(void **state) {
    /* A send naming the wrong microbatch: rank 1's receive of microbatch 1 never matches and
     * rank 0 then waits for microbatch 1's gradient, so both are stuck and rank 0, the first,
     * is reported. The order check names the doubled message. */
    ct_schedule *s = ct_schedule_new(CT_SCHEDULE_1F1B, 2, 1, 2);
    int i = find_action(s, 0, CT_ACTION_SEND_ACT, 1, 0);
    s->actions[0][i].mb = 0;
    ct_sim_result res = ct_schedule_simulate(s, 1.0);
    assert_true(res.deadlock);
    assert_int_equal(res.deadlock_rank, 0);
    assert_true(same_action(&s->actions[0][res.deadlock_action], CT_ACTION_RECV_GRAD, 1, 0, 1));
    assert_false(res.order_ok);
    if (!strstr(res.order_msg, "SEND_ACT(mb 0, chunk 0) 2 times")) fail_msg("%s", res.order_msg);
    ct_sim_result_release(&res);
    ct_schedule_free(s);

    /* A backward moved before its forward (transfers included, so nothing waits forever). */
    s = ct_schedule_new(CT_SCHEDULE_GPIPE, 1, 1, 2);
    int f = find_action(s, 0, CT_ACTION_FORWARD, 1, 0);
    int b = find_action(s, 0, CT_ACTION_BACKWARD, 1, 0);
    swap_actions(s, 0, f, b);
    res = ct_schedule_simulate(s, 1.0);
    assert_false(res.deadlock);
    assert_false(res.order_ok);
    assert_non_null(strstr(res.order_msg, "BACKWARD(mb 1, chunk 0) comes before its FORWARD"));
    ct_sim_result_release(&res);
    ct_schedule_free(s);

    /* A transfer with the wrong peer. */
    s = ct_schedule_new(CT_SCHEDULE_GPIPE, 4, 1, 1);
    i = find_action(s, 2, CT_ACTION_RECV_ACT, 0, 2);
    s->actions[2][i].peer = 3;
    res = ct_schedule_simulate(s, 1.0);
    assert_false(res.order_ok);
    assert_non_null(strstr(res.order_msg, "peer 3"));
    ct_sim_result_release(&res);
    ct_schedule_free(s);
}

/* Every generator delivers each channel in order (the executor's tags may then repeat across
 * microbatches, pipeline.c), and a list that receives two microbatches of one channel in the
 * other order than they are sent is found. */
static void test_channels_in_order(void **state) {
    static const ct_schedule_kind kinds[] = {CT_SCHEDULE_GPIPE, CT_SCHEDULE_1F1B,
                                             CT_SCHEDULE_INTERLEAVED, CT_SCHEDULE_FORWARD_ONLY};
    int checked = 0;
    char why[256];
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (int pp = 1; pp <= 8; pp++)
            for (int v = 1; v <= 3; v++)
                for (int m = 1; m <= 17; m++) {
                    if (ct_schedule_check(kinds[k], pp, v, m) != CT_OK) continue;
                    ct_schedule *s = ct_schedule_new(kinds[k], pp, v, m);
                    if (!ct_schedule_channels_in_order(s, why, sizeof why))
                        fail_msg("%s pp=%d v=%d m=%d: %s", ct_schedule_kind_name(kinds[k]), pp, v,
                                 m, why);
                    ct_schedule_free(s);
                    checked++;
                }
    assert_true(checked > 300);
    ct_error_clear();

    /* Rank 1 of a GPipe over 2 ranks receives microbatch 1's activations before microbatch 0's:
     * the simulator is content (both are sent before either is received), the channel is not. */
    ct_schedule *s = ct_schedule_new(CT_SCHEDULE_GPIPE, 2, 1, 2);
    int r0 = find_action(s, 1, CT_ACTION_RECV_ACT, 0, 1);
    int r1 = find_action(s, 1, CT_ACTION_RECV_ACT, 1, 1);
    s->actions[1][r0].mb = 1;
    s->actions[1][r1].mb = 0;
    int f0 = find_action(s, 1, CT_ACTION_FORWARD, 0, 1);
    int f1 = find_action(s, 1, CT_ACTION_FORWARD, 1, 1);
    s->actions[1][f0].mb = 1;
    s->actions[1][f1].mb = 0;
    ct_sim_result res = ct_schedule_simulate(s, 1.0);
    assert_false(res.deadlock);
    ct_sim_result_release(&res);
    assert_false(ct_schedule_channels_in_order(s, why, sizeof why));
    if (!strstr(why, "rank 1 receives activations of microbatch 1 across chunks 0|1"))
        fail_msg("%s", why);
    ct_schedule_free(s);
}

/* ---- arguments --------------------------------------------------------------------------------
 */

static void test_invalid_arguments(void **state) {
    static const struct {
        ct_schedule_kind kind;
        int pp, v, m;
        const char *says[2]; /* substrings the message must contain */
    } cases[] = {
        {CT_SCHEDULE_GPIPE, 0, 1, 4, {"pp=0", NULL}},
        {CT_SCHEDULE_1F1B, -2, 1, 4, {"pp=-2", NULL}},
        {CT_SCHEDULE_1F1B, 4, 1, 0, {"m=0", NULL}},
        {CT_SCHEDULE_FORWARD_ONLY, 4, 0, 4, {"v=0", NULL}},
        {CT_SCHEDULE_GPIPE, 4, 2, 8, {"gpipe", "v=2"}},
        {CT_SCHEDULE_1F1B, 4, 3, 8, {"1f1b", "v=3"}},
        {CT_SCHEDULE_INTERLEAVED, 4, 1, 8, {"interleaved", "v=1"}},
        {CT_SCHEDULE_INTERLEAVED, 4, 2, 6, {"m=6", "pp=4"}},
        {CT_SCHEDULE_INTERLEAVED, 4, 2, 2, {"m=2", "pp=4"}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        ct_error_clear();
        assert_int_equal(ct_schedule_check(cases[k].kind, cases[k].pp, cases[k].v, cases[k].m),
                         CT_ERR_INPUT);
        ct_error_clear();
        assert_null(ct_schedule_new(cases[k].kind, cases[k].pp, cases[k].v, cases[k].m));
        for (int j = 0; j < 2; j++)
            if (cases[k].says[j] && !strstr(ct_error_message(), cases[k].says[j]))
                fail_msg("case %zu: message \"%s\" lacks \"%s\"", k, ct_error_message(),
                         cases[k].says[j]);
        assert_true(strlen(ct_error_hint()) > 0);
    }
    /* The hint for a non-multiple proposes the neighbouring multiples. */
    ct_error_clear();
    assert_null(ct_schedule_new(CT_SCHEDULE_INTERLEAVED, 4, 2, 6));
    assert_non_null(strstr(ct_error_hint(), "m=4 or m=8"));
    /* And the valid edge cases pass the check. */
    assert_int_equal(ct_schedule_check(CT_SCHEDULE_INTERLEAVED, 4, 2, 4), CT_OK);
    assert_int_equal(ct_schedule_check(CT_SCHEDULE_1F1B, 1, 1, 1), CT_OK);
    assert_int_equal(ct_schedule_check(CT_SCHEDULE_FORWARD_ONLY, 2, 3, 1), CT_OK);
    ct_error_clear();
}

/* ---- timeline ---------------------------------------------------------------------------------
 */

/* Prints to a temporary file and returns its text (caller frees). */
static char *print_to_string(const ct_schedule *s, double ratio) {
    FILE *f = tmpfile();
    assert_non_null(f);
    ct_schedule_print(s, ratio, f);
    long n = ftell(f);
    assert_true(n > 0);
    rewind(f);
    char *text = ct_xmalloc((size_t)n + 1);
    assert_int_equal(fread(text, 1, (size_t)n, f), (size_t)n);
    text[n] = '\0';
    fclose(f);
    return text;
}

static void assert_has_line(const char *text, const char *prefix) {
    for (const char *line = text; line && *line;) {
        if (strncmp(line, prefix, strlen(prefix)) == 0) return;
        line = strchr(line, '\n');
        if (line) line++;
    }
    fail_msg("no line starting with \"%s\" in:\n%s", prefix, text ? text : "(nothing)");
}

static void test_print_timeline(void **state) {
    /* GPipe pp=4 m=4, backward twice a forward: the textbook picture, every cell one forward. */
    ct_schedule *s = ct_schedule_new(CT_SCHEDULE_GPIPE, 4, 1, 4);
    char *text = print_to_string(s, 2.0);
    assert_has_line(text, "rank 0 |F0F1F2F3..................B0B0B1B1B2B2B3B3|");
    assert_has_line(text, "rank 1 |..F0F1F2F3............B0B0B1B1B2B2B3B3....|");
    assert_has_line(text, "rank 3 |......F0F1F2F3B0B0B1B1B2B2B3B3............|");
    assert_has_line(text, "rank 0: busy 12.000  bubble  42.86%  peak in-flight 4 chunk");
    assert_has_line(text, "total time 21.000");
    assert_non_null(strstr(text, "theory bubble 42.86%, deadlock: no"));
    free(text);
    ct_schedule_free(s);

    /* Interleaved: cells name the global chunk; rank 0 starts with its first group on chunk 0. */
    s = ct_schedule_new(CT_SCHEDULE_INTERLEAVED, 4, 2, 8);
    text = print_to_string(s, 2.0);
    assert_has_line(text, "rank 0 |F0:0F1:0F2:0F3:0F0:4F1:4F2:4F3:4F4:0");
    assert_has_line(text, "rank 3 |............F0:3F1:3F2:3F3:3F0:7B0:7B0:7");
    assert_has_line(text, "rank 0: busy 24.000  bubble  15.79%  peak in-flight 11 chunk "
                          "activations, 8 microbatches");
    free(text);
    ct_schedule_free(s);

    /* A deadlocked list prints what ran and says where it stuck. */
    s = ct_schedule_new(CT_SCHEDULE_GPIPE, 2, 1, 1);
    swap_actions(s, 0, find_action(s, 0, CT_ACTION_SEND_ACT, 0, 0),
                 find_action(s, 0, CT_ACTION_RECV_GRAD, 0, 0));
    text = print_to_string(s, 2.0);
    assert_has_line(text, "rank 0 |F0|");
    assert_has_line(text, "rank 1 |..|");
    assert_non_null(strstr(text, "deadlock: yes, rank 0 waits forever at action 1, "
                                 "RECV_GRAD(mb 0, chunk 0)"));
    free(text);
    ct_schedule_free(s);
}

/* ---- zero-bubble schedules --------------------------------------------------------------------
 */

/* F, B, W costs the zero-bubble schedules are checked at: equal, B dearer than W, and B twice
 * F. All dyadic-friendly but 1.2/0.8, for which BUBBLE_TOL covers the few roundings of a sum of
 * at most 3·m·v terms (each exact to 1e-16 relative; m·v ≤ 64 here). */
static const ct_sim_costs zb_costs[] = {{1.0, 1.0, 1.0}, {1.0, 1.2, 0.8}, {1.0, 2.0, 1.0}};
#define N_ZB_COSTS (int)(sizeof zb_costs / sizeof zb_costs[0])

/* What every split schedule must be: each rank's list valid (order_ok also checks each chunk's
 * W after its B and in microbatch order), its messages in channel order, no deadlock, every rank
 * the same work. */
static ct_sim_result check_split(const ct_schedule *s, ct_sim_costs c) {
    check_transfers(s);
    char why[256];
    if (!ct_schedule_channels_in_order(s, why, sizeof why)) fail_msg("%s", why);
    ct_sim_result res = ct_schedule_simulate_costs(s, c);
    if (res.deadlock)
        fail_msg("%s pp=%d m=%d: deadlock at rank %d action %d", ct_schedule_kind_name(s->kind),
                 s->pp, s->m, res.deadlock_rank, res.deadlock_action);
    if (!res.order_ok)
        fail_msg("%s pp=%d m=%d: %s", ct_schedule_kind_name(s->kind), s->pp, s->m, res.order_msg);
    for (int r = 0; r < s->pp; r++)
        assert_true(fabs(res.busy[r] - s->m * (c.f + c.b + c.w)) <= BUBBLE_TOL * s->m);
    return res;
}

/*
 * ZB-H1: with the weight parts taken out and each input part read as a whole backward, the lists
 * are 1F1B's (the same transfers in the same order, so 1F1B's deadlock freedom and channel order
 * carry over); every rank holds at most p microbatches (1F1B's rank 0) and rank r at most r + 1
 * weight parts; from m ≥ p on, every rank idles exactly (p−1)(F+B−W) (a third of 1F1B's
 * (p−1)(F+B+W) at equal costs), the formula of ct_schedule_theory_bubble_costs.
 */
static void test_zbh1(void **state) {
    for (int ip = 0; ip < 3; ip++) {
        int p = pps[ip], ms[5], nm = microbatch_counts(p, ms);
        for (int im = 0; im < nm; im++) {
            int m = ms[im];
            ct_schedule *s = ct_schedule_new(CT_SCHEDULE_ZBH1, p, 1, m);
            ct_schedule *ref = ct_schedule_new(CT_SCHEDULE_1F1B, p, 1, m);
            assert_non_null(s);
            for (int r = 0; r < p; r++) {
                int j = 0;
                for (int i = 0; i < s->n_actions[r]; i++) {
                    ct_action a = s->actions[r][i];
                    if (a.kind == CT_ACTION_BACKWARD_WEIGHT) continue;
                    if (a.kind == CT_ACTION_BACKWARD_INPUT) a.kind = CT_ACTION_BACKWARD;
                    assert_true(j < ref->n_actions[r]);
                    const ct_action *b = &ref->actions[r][j++];
                    if (!same_action(&a, b->kind, b->mb, b->chunk, b->peer))
                        fail_msg("zbh1 pp=%d m=%d rank %d: action %d is %s(mb %d), 1F1B's %s(mb "
                                 "%d)",
                                 p, m, r, j - 1, ct_action_kind_name(a.kind), a.mb,
                                 ct_action_kind_name(b->kind), b->mb);
                }
                assert_int_equal(j, ref->n_actions[r]);
            }
            for (int k = 0; k < N_ZB_COSTS; k++) {
                ct_sim_costs c = zb_costs[k];
                ct_sim_result res = check_split(s, c);
                const double idle = (p - 1) * (c.f + c.b - c.w);
                for (int r = 0; r < p; r++) {
                    assert_true(res.peak_inflight_mb[r] <= CT_MIN(p, m));
                    assert_true(res.peak_pending_w[r] <= r + 1);
                    if (m >= p && fabs(res.total_time - res.busy[r] - idle) > BUBBLE_TOL * (m + p))
                        fail_msg("zbh1 pp=%d m=%d costs %g,%g,%g rank %d: idle %.15f, "
                                 "(p-1)(F+B-W) = %.15f",
                                 p, m, c.f, c.b, c.w, r, res.total_time - res.busy[r], idle);
                }
                if (m >= p)
                    assert_true(fabs(res.bubble[0] - ct_schedule_theory_bubble_costs(s, c)) <=
                                BUBBLE_TOL * (m + p));
                ct_sim_result_release(&res);
            }
            ct_schedule_free(ref);
            ct_schedule_free(s);
        }
    }
}

/*
 * ZB-V: rank r holds exactly chunks r and 2p−1−r (the V; the embeddings and the loss both rank
 * 0's); for pp 2..8 and every m in 1..40: every action once, valid, in channel order, no
 * deadlock, at most 2p chunk activations held (1F1B's rank 0: p stages' worth). From m ≥ 2p at
 * equal costs no rank idles between its first and last action: the makespan is the work plus the
 * skew of (p−1) chunk forwards, (p−1)/2 stage forwards.
 */
static void test_zbv(void **state) {
    for (int p = 2; p <= 8; p++)
        for (int m = 1; m <= 40; m++) {
            ct_schedule *s = ct_schedule_new(CT_SCHEDULE_ZBV, p, 2, m);
            assert_non_null(s);
            for (int c = 0; c < 2 * p; c++)
                assert_int_equal(ct_schedule_chunk_rank(s, c), c < p ? c : 2 * p - 1 - c);
            for (int k = 0; k < (m <= 2 * p + 1 ? N_ZB_COSTS : 1); k++) {
                ct_sim_costs c = zb_costs[k];
                ct_sim_result res = check_split(s, c);
                for (int r = 0; r < p; r++) assert_true(res.peak_inflight[r] <= 2 * p);
                if (k == 0 && m >= 2 * p) {
                    double want = 3.0 * m + (p - 1) / 2.0;
                    if (fabs(res.total_time - want) > BUBBLE_TOL * m)
                        fail_msg("zbv pp=%d m=%d: makespan %.15f, work + skew %.15f", p, m,
                                 res.total_time, want);
                    assert_true(fabs(res.bubble[0] - ct_schedule_theory_bubble(s)) <=
                                BUBBLE_TOL * m);
                }
                ct_sim_result_release(&res);
            }
            ct_schedule_free(s);
        }
    /* the targets against 1F1B's 27% at pp 4, m 8, equal costs */
    ct_schedule *h = ct_schedule_new(CT_SCHEDULE_ZBH1, 4, 1, 8),
                *v = ct_schedule_new(CT_SCHEDULE_ZBV, 4, 2, 8);
    ct_sim_result rh = ct_schedule_simulate_costs(h, zb_costs[0]),
                  rv = ct_schedule_simulate_costs(v, zb_costs[0]);
    print_message("pp 4, m 8, F = B = W: 1F1B 27.27%%, ZB-H1 %.2f%%, ZB-V %.2f%%\n",
                  100 * rh.bubble[0], 100 * rv.bubble[0]);
    ct_sim_result_release(&rh);
    ct_sim_result_release(&rv);
    ct_schedule_free(h);
    ct_schedule_free(v);
}

/* A weight part before its input part, or out of microbatch order, is refused by the order
 * check; the V's two chunks are rank 0's at both ends. */
static void test_split_order_broken(void **state) {
    ct_schedule *s = ct_schedule_new(CT_SCHEDULE_ZBH1, 2, 1, 4);
    int b = find_action(s, 1, CT_ACTION_BACKWARD_INPUT, 0, 1),
        w = find_action(s, 1, CT_ACTION_BACKWARD_WEIGHT, 0, 1);
    swap_actions(s, 1, b, w);
    ct_sim_result res = ct_schedule_simulate(s, 2.0);
    assert_false(res.order_ok);
    assert_non_null(strstr(res.order_msg, "BACKWARD_WEIGHT(mb 0, chunk 1) comes before its "
                                          "BACKWARD_INPUT"));
    ct_sim_result_release(&res);
    swap_actions(s, 1, b, w);
    int w1 = find_action(s, 1, CT_ACTION_BACKWARD_WEIGHT, 1, 1);
    swap_actions(s, 1, w, w1);
    res = ct_schedule_simulate(s, 2.0);
    assert_false(res.order_ok);
    ct_sim_result_release(&res);
    ct_schedule_free(s);
}

int main(int argc, char **argv) {
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpipe),
        cmocka_unit_test(test_1f1b),
        cmocka_unit_test(test_interleaved),
        cmocka_unit_test(test_interleaved_peak_report),
        cmocka_unit_test(test_forward_only),
        cmocka_unit_test(test_single_rank),
        cmocka_unit_test(test_match_and_chunk_rank),
        cmocka_unit_test(test_deadlock_detected),
        cmocka_unit_test(test_broken_order),
        cmocka_unit_test(test_channels_in_order),
        cmocka_unit_test(test_invalid_arguments),
        cmocka_unit_test(test_print_timeline),
        cmocka_unit_test(test_zbh1),
        cmocka_unit_test(test_zbv),
        cmocka_unit_test(test_split_order_broken),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
