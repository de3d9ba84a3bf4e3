/*
 * schedule.h — pipeline schedules as data, and a simulator (DESIGN §6, "Pipeline parallel").
 *
 * The model's layers are split into pp·v chunks (v = virtual stages per rank). Chunk c lives on
 * pipeline rank c % pp (interleaved assignment: rank r holds chunks r, r+pp, r+2pp, ...); chunk 0
 * holds the embeddings, chunk pp·v−1 the final norm, LM head and loss.
 *
 * A schedule is, for every pipeline rank, an ordered list of actions. FORWARD(mb, c) and
 * BACKWARD(mb, c) run chunk c on microbatch mb. Around them the generator places the transfers:
 *   RECV_ACT(mb, c)  right before FORWARD(mb, c) when c > 0      (from the rank of chunk c−1)
 *   SEND_ACT(mb, c)  right after FORWARD(mb, c) when c < last    (to the rank of chunk c+1)
 *   RECV_GRAD(mb, c) right before BACKWARD(mb, c) when c < last  (from the rank of chunk c+1)
 *   SEND_GRAD(mb, c) right after BACKWARD(mb, c) when c > 0      (to the rank of chunk c−1)
 * `peer` is the pipeline rank on the other end; (mb, c) identify the message on both sides.
 * Sends never block (they are non-blocking and completed later); a receive waits for its data.
 * One executor (pipeline.c) runs any such list.
 */
#ifndef CT_PARALLEL_SCHEDULE_H
#define CT_PARALLEL_SCHEDULE_H

#include <stdbool.h>
#include <stdio.h>

typedef enum ct_action_kind {
    CT_ACTION_FORWARD = 0,
    CT_ACTION_BACKWARD,
    CT_ACTION_SEND_ACT,
    CT_ACTION_RECV_ACT,
    CT_ACTION_SEND_GRAD,
    CT_ACTION_RECV_GRAD,
} ct_action_kind;

typedef struct ct_action {
    ct_action_kind kind;
    int mb;    /* microbatch, 0..m-1 */
    int chunk; /* global chunk index, 0..pp·v-1 */
    int peer;  /* pipeline rank of the other end (transfers only; -1 otherwise) */
} ct_action;

typedef enum ct_schedule_kind {
    CT_SCHEDULE_KIND_GPIPE = 0,
    CT_SCHEDULE_KIND_1F1B,
    CT_SCHEDULE_KIND_INTERLEAVED,
    CT_SCHEDULE_KIND_FORWARD_ONLY, /* evaluation: forwards only */
} ct_schedule_kind;

typedef struct ct_schedule {
    ct_schedule_kind kind;
    int pp, v, m;       /* ranks, virtual stages per rank, microbatches */
    int *n_actions;     /* [pp] */
    ct_action **actions;/* [pp][n_actions[r]] */
} ct_schedule;

/*
 * Builds the action lists. GPipe: all forwards, then all backwards. 1F1B: rank r runs
 * min(pp−r−1, m) warm-up forwards, then alternates one forward / one backward, then drains.
 * Interleaved 1F1B (v ≥ 2, m % pp == 0): Megatron's order over the v chunks of each rank.
 * Forward-only: every microbatch through every chunk, no backward. v must be 1 except for
 * interleaved (and forward-only, which follows the chunk layout). Returns NULL with a message
 * (common.h, CT_ERR_INPUT) when the arguments cannot make that schedule.
 */
ct_schedule *ct_schedule_new(ct_schedule_kind kind, int pp, int v, int m);
void ct_schedule_free(ct_schedule *s); /* accepts NULL */

const char *ct_schedule_kind_name(ct_schedule_kind kind);
const char *ct_action_kind_name(ct_action_kind kind);
/* Pipeline rank that holds global chunk c. */
int ct_schedule_chunk_rank(const ct_schedule *s, int chunk);

/* What the simulator reports. Times are in units of one forward of one full stage (a chunk's
 * forward costs 1/v, its backward backward_ratio/v). */
typedef struct ct_sim_result {
    bool deadlock;          /* some rank waits forever */
    int deadlock_rank;      /* first rank found stuck (-1 if none) */
    double total_time;      /* makespan */
    double *busy;           /* [pp] compute time per rank */
    double *bubble;         /* [pp] 1 − busy / total_time */
    int *peak_inflight;     /* [pp] peak activations held, counted in chunk activations
                               (forward done, backward not yet) */
    int *peak_inflight_mb;  /* [pp] the same counted in microbatches (any chunk held) */
    bool order_ok;          /* every forward precedes its backward, every (mb, chunk) once */
} ct_sim_result;

/* Runs every rank's list with unit compute costs and zero communication cost. */
ct_sim_result ct_schedule_simulate(const ct_schedule *s, double backward_ratio);
void ct_sim_result_release(ct_sim_result *r);

/* The theoretical bubble fraction: (p−1)/(m+p−1), interleaved (p−1)/(v·m+p−1). */
double ct_schedule_theory_bubble(const ct_schedule *s);

/* Prints the schedule as a text timeline, one row per rank, one column per time unit of the
 * simulation (F/B with the microbatch, '.' idle), then the per-rank report. */
void ct_schedule_print(const ct_schedule *s, double backward_ratio, FILE *out);

#endif /* CT_PARALLEL_SCHEDULE_H */
