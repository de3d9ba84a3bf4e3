/*
 * ring_attention.h — causal attention over a sequence sharded across the ranks of a
 * context-parallel group (parallel/README.md, Context parallelism), from the backend's part ops
 * (backend.h, ct_attention_part_fwd) and the group's point-to-point sends.
 *
 * Each of the cp ranks holds T local rows of every sequence as two chunks of T/2 (the sequence
 * is cut into 2·cp chunks): zigzag gives rank r chunks r and 2cp−1−r, so every rank has the same
 * causal work; contiguous gives it 2r and 2r+1. Forward runs cp steps: at step s the rank attends
 * to the key/value block of rank (r − s) mod cp while it sends the block it holds to r + 1 and
 * receives the next from r − 1 (one message of the kv heads only, B·T·2·n_kv_head·hd elements),
 * merging partial outputs by their log-sum-exps in fp32. Backward circulates the blocks again and,
 * with each, the fp32 partial dK/dV its visitors added (rank r adds its own part to the partial
 * it receives, then passes it on), so after cp hops every block's gradient is back with its
 * owner; dQ stays local. Every sum runs in ring order whatever the timing: reruns give the same
 * bits. Bytes sent per call: forward (cp−1)·B·T·2·n_kv·hd·dtype size; backward that again plus
 * cp·B·T·2·n_kv·hd·4.
 */
#ifndef CT_RING_ATTENTION_H
#define CT_RING_ATTENTION_H

#include "core/backend/backend.h"
#include "core/comm/comm.h"
#include "core/trace.h"

/* The chunk indices (of 2·cp) that rank r of cp holds. */
void ct_cp_chunks(int cp, int r, bool zigzag, int64_t *c0, int64_t *c1);
/* The global position of local row t (0 ≤ t < T_local) of rank r; with cp 1, t itself (the
 * sampler's window may then have any length, 1 or odd, as the model's seq_len may). */
int64_t ct_cp_position(int cp, int r, bool zigzag, int64_t T_local, int64_t t);
/* Its inverse: the rank r that holds global position p and the local row there. */
void ct_cp_owner(int cp, bool zigzag, int64_t T_local, int64_t p, int *r, int64_t *row);
/* local[t] = seq[ct_cp_position(.., t)] for t < T_local: rank r's tokens of one whole sequence
 * (cp·T_local of them). */
void ct_cp_cut(int cp, int r, bool zigzag, int64_t T_local, const int32_t *seq, int32_t *local);

/* The unmasked score elements rank r computes for one (batch, head) of a sequence of T
 * positions: the causal work it gets (zigzag: the same on every rank). */
int64_t ct_cp_score_elements(int cp, int r, bool zigzag, int64_t T);

/* The ring's buffers, kept from call to call and grown to the largest call: two kv blocks in the
 * model's dtype, the fp32 dK/dV partials (two of this rank's, one arriving), dQ and the bf16
 * forward's fp32 output (CT_MEM_WORKSPACE). Allocating them per call would make the CUDA backend
 * free device memory, and so wait for the device, in every layer. */
typedef struct ct_ring_ws ct_ring_ws;
ct_ring_ws *ct_ring_ws_new(void);
void ct_ring_ws_free(ct_ring_ws *ws);

/* Like ct_attention_fwd, on this rank's T local rows; cp the group, bound to qkv's backend. */
void ct_ring_attention_fwd(ct_comm *cp, bool zigzag, ct_ring_ws *ws, ct_tensor *out, ct_tensor *lse,
                           const ct_tensor *qkv, int64_t B, int64_t T, int64_t n_head,
                           int64_t n_kv_head);
/* Like ct_attention_bwd (dqkv overwritten; dbias, if not NULL, accumulated). */
void ct_ring_attention_bwd(ct_comm *cp, bool zigzag, ct_ring_ws *ws, ct_tensor *dqkv,
                           ct_tensor *dbias, const ct_tensor *dout, const ct_tensor *qkv,
                           const ct_tensor *out, const ct_tensor *lse, int64_t B, int64_t T,
                           int64_t n_head, int64_t n_kv_head);

/*
 * log.trace's view of the ring (off by default; one recorder per process): with events on, every
 * call records each step's block computation ("fwd 3 block 1": the third forward call since the
 * last ct_ring_trace, step 1) and each hop from its start to the first moment it is seen complete
 * — tested right after the block it overlaps, else when its wait returns — so a hop drawn across
 * its block was in flight while the block computed. Times are the host's (ct_now): on an
 * asynchronous backend they are when work was issued, not when it ran.
 */
void ct_ring_log_events(bool on);
/* Writes the recorded spans as threads 2 ("cp attention") and 3 ("cp ring") of this rank's
 * trace, and forgets them. */
void ct_ring_trace(ct_trace *trace);

#endif /* CT_RING_ATTENTION_H */
