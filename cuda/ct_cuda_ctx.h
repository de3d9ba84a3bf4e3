/*
 * ct_cuda_ctx.h — what an op's launcher gets from the backend (backend_cuda.c owns it): the
 * compute stream every kernel is issued on, and a scratch workspace for partial sums.
 *
 * Launchers: ct_cuda_<op>, one per op, declared below from the op list (core/backend/
 * backend_ops.h) with exactly the parameters of the op's slot of struct ct_backend_i
 * (core/backend/backend.h), so backend_cuda.c's table points at them and a missing or mistyped one
 * does not build. `ctx` is the backend's ct_cuda_ctx; the arguments mean what the slot says:
 * row-major tensors, `dt` the storage dtype of activations and parameters
 * (CT_DTYPE_F32 or CT_DTYPE_BF16; bf16 values are widened to fp32 on load and rounded to nearest
 * even on store), parameter gradients and statistics always fp32, "accumulates" meaning +=.
 * Every pointer is device memory. A launcher only enqueues work on the stream; it never waits.
 *
 * Determinism: no float atomics in anything a result depends on. Reductions use a fixed tree
 * (warp shuffles, then a fixed block order) and cross-block partials are summed by a second
 * kernel in block order, so a rerun gives the same bits (bit-exact resume on a GPU, core/README.md,
 * Determinism).
 *
 * Includable from C and C++.
 */
#ifndef CT_CUDA_CTX_H
#define CT_CUDA_CTX_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "core/backend/backend.h"

typedef struct ct_cuda_ctx ct_cuda_ctx;

/* The compute stream. */
cudaStream_t ct_cuda_stream(const ct_cuda_ctx *cx);

/* Device scratch of at least `bytes`, valid until the next call that asks for more (it may then
 * move: the old buffer is freed only after the stream has finished with it). One buffer per
 * backend, so a launcher must not hold two workspaces at once; `slot` (0 or 1) gives a second
 * independent buffer for launchers that need two. */
void *ct_cuda_workspace(ct_cuda_ctx *cx, int slot, size_t bytes);

/* Streaming multiprocessors of the device (grid sizing). */
int ct_cuda_sm_count(const ct_cuda_ctx *cx);
/* The device's compute capability, major part (9: Hopper, whose wgmma some kernels use). */
int ct_cuda_cc_major(const ct_cuda_ctx *cx);
/* CT_CUDA_ATTENTION=wgmma: Hopper's attention kernels asked for (attention_tc.cu), read at every
 * call so that a test can run both kernels in one process. */
bool ct_cuda_wgmma_attention_asked(void);

/* For the NCCL comm (comm_nccl.c): the compute stream and event `event` (CT_BACKEND_EVENTS of
 * them) of a backend made by ct_cuda_backend_new; a CT_ASSERT for any other backend (check mode
 * and the asynchronous stream cannot carry NCCL groups). */
cudaStream_t ct_cuda_backend_stream(const ct_backend *be);
cudaEvent_t ct_cuda_backend_event(const ct_backend *be, int event);
/* When `event` (timing enabled, on any stream of the device) passed, in seconds on ct_now's
 * clock: its distance from the clock's anchor (backend.h, mark; re-anchored at every
 * ct_backend_marks_settle), so best for events within a step or so of the last settle. NAN when
 * it has not passed. */
double ct_cuda_backend_event_time(const ct_backend *be, cudaEvent_t event);

/* The launchers: void ct_cuda_<op>(void *ctx, <the slot's parameters>) for every required and
 * feature op, each defined in the .cu file of its op family (cuda/README.md, the kernels' table);
 * copy and gemm, which call the runtime and cuBLASLt, in backend_cuda.c. */
#define CT_CUDA_DECL_(...) CT_OP_DECLARE(ct_cuda_, __VA_ARGS__)
CT_BACKEND_OPS(CT_CUDA_DECL_)
#undef CT_CUDA_DECL_

#ifdef __cplusplus
}
#endif

#endif /* CT_CUDA_CTX_H */
