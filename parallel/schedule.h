/*
 * schedule.h — pipeline schedules as data, and a simulator (parallel/README.md, Pipeline parallel).
 *
 * The model's layers are split into pp·v chunks (v = virtual stages per rank). Chunk c lives on
 * pipeline rank c % pp (interleaved assignment: rank r holds chunks r, r+pp, r+2pp, ...), except
 * under ZB-V, whose v = 2 chunks per rank form a V: rank r holds chunks r and 2pp−1−r, so the
 * first and the last chunk are both rank 0's. Chunk 0 holds the embeddings, chunk pp·v−1 the
 * final norm, LM head and loss.
 *
 * A schedule is, for every pipeline rank, an ordered list of actions. FORWARD(mb, c) and
 * BACKWARD(mb, c) run chunk c on microbatch mb. Around them the generator places the transfers:
 *   RECV_ACT(mb, c)  right before FORWARD(mb, c) when c > 0      (from the rank of chunk c−1)
 *   SEND_ACT(mb, c)  right after FORWARD(mb, c) when c < last    (to the rank of chunk c+1)
 *   RECV_GRAD(mb, c) right before BACKWARD(mb, c) when c < last  (from the rank of chunk c+1)
 *   SEND_GRAD(mb, c) right after BACKWARD(mb, c) when c > 0      (to the rank of chunk c−1)
 * `peer` is the pipeline rank on the other end; (mb, c) identify the message on both sides.
 * Matching pairs (ct_action_match): SEND_ACT(mb, c) ↔ RECV_ACT(mb, c+1) and
 * SEND_GRAD(mb, c) ↔ RECV_GRAD(mb, c−1), i.e. a message is named by the microbatch and the pair
 * of adjacent chunks it crosses. With pp = 1 and v > 1 the peer is the rank itself.
 * Sends never block (they are non-blocking and completed later); a receive waits for its data.
 * One executor (pipeline.c) runs any such list.
 *
 * The zero-bubble schedules (ZB-H1, ZB-V) split each backward in two: BACKWARD_INPUT(mb, c), the
 * gradient of the chunk's input, which the previous chunk waits for (RECV_GRAD before it,
 * SEND_GRAD after), and BACKWARD_WEIGHT(mb, c), the gradients of its weights, which nobody waits
 * for until the optimizer, run later to fill what would be idle time. Each chunk's weight parts
 * run in microbatch order, so the gradients accumulate in the order 1F1B's do: a schedule changes
 * when they are computed, never what.
 */
#ifndef CT_PARALLEL_SCHEDULE_H
#define CT_PARALLEL_SCHEDULE_H

#include <stdbool.h>
#include <stdio.h>

#include "core/common.h"
#include "core/config/config.h" /* ct_schedule_kind */

typedef enum ct_action_kind {
    CT_ACTION_FORWARD = 0,
    CT_ACTION_BACKWARD,
    CT_ACTION_SEND_ACT,
    CT_ACTION_RECV_ACT,
    CT_ACTION_SEND_GRAD,
    CT_ACTION_RECV_GRAD,
    CT_ACTION_BACKWARD_INPUT,  /* B: the input's gradient (zero-bubble schedules) */
    CT_ACTION_BACKWARD_WEIGHT, /* W: the weights' gradients, after its B */
} ct_action_kind;

typedef struct ct_action {
    ct_action_kind kind;
    int mb;    /* microbatch, 0..m-1 */
    int chunk; /* global chunk index, 0..pp·v-1 */
    int peer;  /* pipeline rank of the other end (transfers only; -1 otherwise) */
} ct_action;

typedef struct ct_schedule {
    ct_schedule_kind kind;
    int pp, v, m;        /* ranks, virtual stages per rank, microbatches */
    bool v_shape;        /* the V placement (ZB-V, and a forward-only schedule for its model) */
    int *n_actions;      /* [pp] */
    ct_action **actions; /* [pp][n_actions[r]] */
} ct_schedule;

/*
 * Builds the action lists. GPipe: all forwards, then all backwards. 1F1B: rank r runs
 * min(pp−r−1, m) warm-up forwards, then alternates one forward / one backward, then drains.
 * Interleaved 1F1B (v ≥ 2, m % pp == 0): Megatron's order over the v chunks of each rank.
 * ZB-H1 (v = 1): 1F1B's order of forwards and input gradients, each B's W queued and run while
 * more than r are queued on rank r, the rest at the end: the same peak of microbatches held as
 * 1F1B's rank 0 on every rank, a third of its bubble when F, B and W cost the same. ZB-V (v = 2,
 * V placement): warm-up forwards through the V, then F, B and W of both chunks in turn; about
 * (pp−1) chunk-forwards of idle a rank at equal costs and m ≥ 2pp, and at most 2pp chunk
 * activations held. Both are generated for any pp and m ≥ 1.
 * Forward-only: every microbatch through every chunk, no backward. v must be 1 except for
 * interleaved, ZB-V (2) and forward-only, which follows the chunk layout. Returns NULL with a
 * message (common.h, CT_ERR_INPUT) when the arguments cannot make that schedule.
 */
ct_schedule *ct_schedule_new(ct_schedule_kind kind, int pp, int v, int m);
/* The forward-only schedule of a model whose chunks form a V (v = 2; model.h, v_shape): each
 * microbatch through rank r's chunks r and 2pp−1−r in global order. */
ct_schedule *ct_schedule_new_forward_only_v(int pp, int m);
/* The argument check ct_schedule_new runs: CT_OK, or CT_ERR_INPUT with the message and hint
 * recorded, naming the numbers. Lets a caller validate a layout before building anything. */
ct_status ct_schedule_check(ct_schedule_kind kind, int pp, int v, int m);
void ct_schedule_free(ct_schedule *s); /* accepts NULL */

const char *ct_schedule_kind_name(ct_schedule_kind kind);
/* Whether the schedule splits backwards into BACKWARD_INPUT and BACKWARD_WEIGHT. */
bool ct_schedule_splits_backward(ct_schedule_kind kind);
const char *ct_action_kind_name(ct_action_kind kind);
/* Pipeline rank that holds global chunk c. */
int ct_schedule_chunk_rank(const ct_schedule *s, int chunk);

/* The simulator's costs of one full stage's forward (f), input gradient (b) and weight gradients
 * (w), in any unit; a chunk's costs are these over v, a whole BACKWARD costs b + w.
 * ct_sim_costs_of_ratio(R): f = 1 and b = w = R/2 (R: the backward over the forward). */
typedef struct ct_sim_costs {
    double f, b, w;
} ct_sim_costs;
ct_sim_costs ct_sim_costs_of_ratio(double backward_ratio);

/* What the simulator reports. Times are in the unit of the costs (ct_schedule_simulate: one
 * forward of one full stage; a chunk's forward costs 1/v, its backward backward_ratio/v). */
typedef struct ct_sim_result {
    bool deadlock;         /* some rank waits forever */
    int deadlock_rank;     /* first rank found stuck (-1 if none) */
    double total_time;     /* makespan */
    double *busy;          /* [pp] compute time per rank */
    double *bubble;        /* [pp] 1 − busy / total_time */
    int *peak_inflight;    /* [pp] peak activations held, counted in chunk activations
                              (forward done, backward not yet) */
    int *peak_inflight_mb; /* [pp] the same counted in microbatches (any chunk held) */
    int *peak_pending_w;   /* [pp] peak weight parts waiting to run (B done, W not yet) */
    bool order_ok;         /* every forward precedes its backward, every (mb, chunk) once */
    /* Where the simulation stuck and what is wrong with the order, for messages and tests. */
    int deadlock_action; /* index in deadlock_rank's list of the action it waits on, or -1 */
    char order_msg[160]; /* first problem found when !order_ok, "" otherwise */
} ct_sim_result;

/*
 * Runs every rank's list with unit compute costs and zero communication cost. Ranks advance
 * independently; a send is instant, a receive completes at max(now, time its send ran) and waits
 * while the send has not run. Deadlock: no rank can advance while some still have actions.
 * order_ok also checks the transfers: each RECV_ACT/RECV_GRAD sits before its compute and each
 * SEND after it, every RECV has its SEND on `peer` (pointing back) and every SEND its RECV.
 * In-flight counts a chunk activation from the end of its FORWARD to the end of its BACKWARD
 * (of its BACKWARD_WEIGHT, which needs the chunk's inputs and output gradients, in a split
 * schedule). A forward-only schedule has no backward, so nothing is released and its peaks are
 * m·v chunk activations and m microbatches, which is what the executor holds (pipeline.h:
 * forward-only keeps its contexts to the end of the run).
 */
ct_sim_result ct_schedule_simulate(const ct_schedule *s, double backward_ratio);
/* The same with separate costs of F, B and W. */
ct_sim_result ct_schedule_simulate_costs(const ct_schedule *s, ct_sim_costs costs);
/* The same with each global chunk's own costs (per_chunk[pp·v]; a chunk's, not a stage's): for
 * stages that differ, as measured ones do (the first holds the embeddings, the last the LM head).
 */
ct_sim_result ct_schedule_simulate_chunks(const ct_schedule *s, const ct_sim_costs *per_chunk);
void ct_sim_result_release(ct_sim_result *r);

/* The theoretical bubble fraction: (p−1)/(m+p−1), interleaved (p−1)/(v·m+p−1). Forward-only
 * runs each microbatch through all of a rank's chunks before the next one, so with v > 1 it
 * pays the pipeline fill once per microbatch: 1 − m·v / ((m−1)·((v−1)·p+1) + p·v), which is
 * (p−1)/(m+p−1) at v = 1. ZB-H1 at F = B = W: (p−1)/(3m+p−1), the idle (p−1)(F+B−W) of a rank
 * over its work m(F+B+W) plus that idle (ct_schedule_theory_bubble_costs for other costs); ZB-V
 * at F = B = W and m ≥ 2p: (p−1)/(6m+p−1) (rank r starts r chunk-forwards late and ends as
 * late; nothing idles in between). */
double ct_schedule_theory_bubble(const ct_schedule *s);
double ct_schedule_theory_bubble_costs(const ct_schedule *s, ct_sim_costs costs);

/* The transfer at the other end of transfer `a` on rank `rank` (see the pairs above); its peer
 * is `rank`. Returns false for FORWARD/BACKWARD and for a transfer off either end of the model. */
bool ct_action_match(const ct_schedule *s, int rank, const ct_action *a, ct_action *match);

/*
 * True when every channel delivers in order: for each direction (activations, gradients) and each
 * chunk boundary, the sending rank's list sends the microbatches in the same order as the
 * receiving rank's list receives them. Then messages of one channel may share a tag — MPI
 * matches messages with the same source and tag in the order they were sent, to receives in the
 * order they were posted — which is what lets the executor keep its tags below a small
 * MPI_TAG_UB. On false, *why (may be NULL) names the first channel out of order.
 */
bool ct_schedule_channels_in_order(const ct_schedule *s, char *why, size_t why_cap);

/* Prints the schedule as a text timeline, one row per rank, one column per time unit of the
 * simulation (F/B/W with the microbatch, '.' idle), then the per-rank report. A column is one
 * chunk forward (1/v) wide and holds "F<mb>" (v = 1) or "F<mb>:<global chunk>"; a backward fills
 * backward_ratio columns (B and W of a split one b/f and w/f; rounded to the nearest column). */
void ct_schedule_print(const ct_schedule *s, double backward_ratio, FILE *out);
void ct_schedule_print_costs(const ct_schedule *s, ct_sim_costs costs, FILE *out);
void ct_schedule_print_chunks(const ct_schedule *s, const ct_sim_costs *per_chunk, FILE *out);

#endif /* CT_PARALLEL_SCHEDULE_H */
