/*
 * backend_cuda.c — the CUDA backend: struct ct_backend_i filled with the launchers of the cuda/ .cu
 * files and cuBLASLt GEMMs (gemm.h), on one device and one compute stream (core/README.md, The
 * backend interface).
 *
 * Host C, identical in the real build (linked with cudart, cuBLAS(Lt)) and the emulated one
 * (linked with the stand-ins of cuda/emu/): only the link line differs.
 *
 * Ordering (backend.h): every op is enqueued on the compute stream and returns; values reach the
 * host only through copy_to_host, which waits for the stream. copy_from_host waits too, because
 * the caller may reuse its host buffer as soon as the slot returns. event_record / event_wait map
 * onto CUDA events recorded on the stream; sync waits for the stream. free waits for the stream
 * (cudaFree synchronises the device).
 *
 * Errors: every CUDA call is checked (ct_cuda_check.h: message with file, line and call, exit 1).
 * Out of memory in alloc is the exception: it returns NULL, and the caller reports it.
 */
#include "cuda/backend_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/adamw.cuh"
#include "cuda/attention.cuh"
#include "cuda/attention_part.cuh"
#include "cuda/ct_cuda_check.h"
#include "cuda/elementwise.cuh"
#include "cuda/embedding.cuh"
#include "cuda/gelu.cuh"
#include "cuda/gemm.h"
#include "cuda/layernorm.cuh"
#include "cuda/moe_rows.cuh"
#include "cuda/rope.cuh"
#include "cuda/swiglu.cuh"
#include "cuda/xent.cuh"

struct ct_cuda_ctx {
    int device;
    struct cudaDeviceProp prop;
    cudaStream_t stream;
    cudaEvent_t events[CT_BACKEND_EVENTS];
    ct_cuda_gemm_ctx *gemm;
    void *workspace[2]; /* ct_cuda_workspace */
    size_t workspace_bytes[2];
    /* The stream's clock (backend.h, mark): one timing event per mark id, and the anchor, an
     * event recorded on the idle stream at host time anchor_host (ct_cuda_event_time). */
    cudaEvent_t *marks;
    int64_t cap_marks;
    cudaEvent_t anchor;
    double anchor_host;
    /* Device frees so far (tensors and workspace growth): a graph captured before a free may
     * hold the freed address (cuda_graph_launch). */
    uint64_t frees;
};

cudaStream_t ct_cuda_stream(const ct_cuda_ctx *cx) {
    return cx->stream;
}

int ct_cuda_sm_count(const ct_cuda_ctx *cx) {
    return cx->prop.multiProcessorCount;
}

int ct_cuda_cc_major(const ct_cuda_ctx *cx) {
    return cx->prop.major;
}

bool ct_cuda_wgmma_attention_asked(void) {
    const char *env = getenv("CT_CUDA_ATTENTION");
    return env && !strcmp(env, "wgmma");
}

void *ct_cuda_workspace(ct_cuda_ctx *cx, int slot, size_t bytes) {
    CT_ASSERTF(slot == 0 || slot == 1, "workspace slot %d", slot);
    if (bytes <= cx->workspace_bytes[slot]) return cx->workspace[slot];
    /* Grow by at least half, so a run settles after a few calls. cudaFree waits for the device,
     * so work still reading the old buffer finishes first. */
    size_t want = bytes + bytes / 2;
    if (cx->workspace[slot]) {
        CT_CUDA_CHECK(cudaFree(cx->workspace[slot]));
        cx->frees++;
    }
    CT_CUDA_CHECK(cudaMalloc(&cx->workspace[slot], want));
    cx->workspace_bytes[slot] = want;
    return cx->workspace[slot];
}

/* ---- memory -------------------------------------------------------------------------------- */

static void *cuda_alloc(void *ctx, size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* clear it: out of memory is reported by the caller */
        return NULL;
    }
    CT_CUDA_CHECK(e);
    return p;
}

static void cuda_free(void *ctx, void *ptr) {
    ct_cuda_ctx *cx = ctx;
    if (!ptr) return;
    CT_CUDA_CHECK(cudaFree(ptr));
    cx->frees++;
}

static void cuda_fill(void *ctx, void *dst, ct_dtype dtype, int64_t n, float value) {
    ct_cuda_fill(ctx, dst, dtype, n, value);
}

static void cuda_copy_from_host(void *ctx, void *dst, const void *src, size_t bytes) {
    ct_cuda_ctx *cx = ctx;
    CT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cx->stream));
    ct_cuda_host_wait(cx->stream, NULL);
}

static void cuda_copy_to_host(void *ctx, void *dst, const void *src, size_t bytes) {
    ct_cuda_ctx *cx = ctx;
    CT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cx->stream));
    ct_cuda_host_wait(cx->stream, NULL);
}

static void cuda_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    ct_cuda_ctx *cx = ctx;
    CT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cx->stream));
}

/* ---- ops: straight to the launchers -------------------------------------------------------- */

/* An accumulating GEMM into bf16 (beta != 0: a linear layer's output that starts as its bias
 * where cuBLASLt has no epilogue algorithm, Mixture of Experts' outputs) is rounded once, as the
 * CPU's is: the product goes to fp32 in workspace slot 1, and one kernel stores bf16(product +
 * beta·C). cuBLASLt's own bf16 epilogue with beta = 1 did not: on an H200 (sm_90, CUDA 13.0) check
 * mode found results up to 27 bf16 ulps from the single rounding where the product and C nearly
 * cancel, as a second rounding (of the product, before C is added) would give. The price: the fp32
 * product written and read again, 8 bytes an element besides C's own read and write. */
static void cuda_gemm(void *ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                      float alpha, const void *A, int64_t lda, const void *B, int64_t ldb,
                      float beta, void *C, int64_t ldc, ct_dtype ab_dtype, ct_dtype c_dtype) {
    ct_cuda_ctx *cx = ctx;
    if (c_dtype == CT_DTYPE_BF16 && beta != 0.0f && M > 0 && N > 0 && K > 0 && alpha != 0.0f) {
        float *prod = ct_cuda_workspace(cx, 1, (size_t)(M * N) * sizeof(float));
        ct_cuda_gemm(cx->gemm, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, 0.0f, prod, N,
                     ab_dtype, CT_DTYPE_F32);
        ct_cuda_accumulate_rounded(cx, C, ldc, prod, beta, M, N);
        return;
    }
    ct_cuda_gemm(cx->gemm, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ab_dtype,
                 c_dtype);
}

/* Mixture of Experts' GEMMs (one per local expert) in one cublasGemmGroupedBatchedEx call
 * (ct_cuda_gemm_grouped), except where the GEMMs must go one by one through cuda_gemm: a bf16 C
 * with beta != 0 (rounded once, above; the grouped call has no fp32 product to hand), and what
 * the grouped call refuses (bf16 into an fp32 C, bf16 pointers not 16-byte aligned). Operands are
 * contiguous row-major (the slot's contract, backend.h). */
static void cuda_gemm_grouped(void *ctx, int count, bool trans_a, bool trans_b, const int64_t *mnk,
                              float alpha, void *const *ptrs, float beta, ct_dtype ab_dtype,
                              ct_dtype c_dtype) {
    ct_cuda_ctx *cx = ctx;
    if (!(c_dtype == CT_DTYPE_BF16 && beta != 0.0f) &&
        ct_cuda_gemm_grouped(cx->gemm, count, trans_a, trans_b, mnk, alpha, ptrs, beta, ab_dtype,
                             c_dtype))
        return;
    for (int i = 0; i < count; i++) {
        int64_t M = mnk[3 * i], N = mnk[3 * i + 1], K = mnk[3 * i + 2];
        cuda_gemm(cx, trans_a, trans_b, M, N, K, alpha, ptrs[3 * i], trans_a ? M : K,
                  ptrs[3 * i + 1], trans_b ? K : N, beta, ptrs[3 * i + 2], N, ab_dtype, c_dtype);
    }
}

/* GELU fused into the GEMM's epilogue (cuBLASLt's GELU_AUX_BIAS); where cuBLASLt has no
 * algorithm for it (ct_cuda_gemm_bias_gelu returns false), the same three steps as the model's
 * fallback: pre = bias on every row, pre += A·Bᵀ (beta = 1), out = GELU(pre). */
static void cuda_gemm_bias_gelu(void *ctx, int64_t M, int64_t N, int64_t K, const void *A,
                                int64_t lda, const void *B, int64_t ldb, const void *bias,
                                void *pre, int64_t ldpre, void *out, int64_t ldout, ct_dtype dt) {
    ct_cuda_ctx *cx = ctx;
    if (!out) { /* the bias alone (cuBLASLt's BIAS epilogue): pre = A·Bᵀ + bias */
        if (ct_cuda_gemm_bias(cx->gemm, M, N, K, A, lda, B, ldb, bias, pre, ldpre, dt)) return;
        CT_ASSERTF(ldpre == N, "gemm_bias fallback with ldpre %lld, N %lld", (long long)ldpre,
                   (long long)N);
        ct_cuda_bias_init(cx, dt, pre, bias, NULL, M, N);
        cuda_gemm(cx, false, true, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, pre, ldpre, dt, dt);
        return;
    }
    if (ct_cuda_gemm_bias_gelu(cx->gemm, M, N, K, A, lda, B, ldb, bias, pre, ldpre, out, ldout, dt))
        return;
    /* The kernels take packed (M, N) rows: the wrapper passes ldpre = ldout = N. */
    CT_ASSERTF(ldpre == N && ldout == N,
               "gemm_bias_gelu fallback with ldpre %lld, ldout %lld, N %lld", (long long)ldpre,
               (long long)ldout, (long long)N);
    ct_cuda_bias_init(cx, dt, pre, bias, NULL, M, N);
    cuda_gemm(cx, false, true, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, pre, ldpre, dt, dt);
    ct_cuda_gelu_fwd(cx, dt, out, pre, M * N);
}

static void cuda_bias_add(void *ctx, ct_dtype dt, void *out, const void *bias, int64_t N,
                          int64_t C) {
    ct_cuda_bias_add(ctx, dt, out, bias, N, C);
}

static void cuda_bias_init(void *ctx, ct_dtype dt, void *out, const void *bias,
                           const void *residual, int64_t N, int64_t C) {
    ct_cuda_bias_init(ctx, dt, out, bias, residual, N, C);
}

static void cuda_bias_grad(void *ctx, ct_dtype dt, float *dbias, const void *dout, int64_t N,
                           int64_t C) {
    ct_cuda_bias_grad(ctx, dt, dbias, dout, N, C);
}

static void cuda_axpy(void *ctx, ct_dtype dt, void *dst, const void *src, float alpha, int64_t n) {
    ct_cuda_axpy(ctx, dt, dst, src, alpha, n);
}

static void cuda_scale(void *ctx, ct_dtype dt, void *x, float s, int64_t n) {
    ct_cuda_scale(ctx, dt, x, s, n);
}

static void cuda_embedding_fwd(void *ctx, ct_dtype dt, void *out, const int32_t *tokens,
                               const void *table, int64_t N, int64_t C, int64_t rows,
                               int64_t row_offset) {
    ct_cuda_embedding_fwd(ctx, dt, out, tokens, table, N, C, rows, row_offset);
}

static void cuda_embedding_bwd(void *ctx, ct_dtype dt, float *dtable, const void *dout,
                               const int32_t *tokens, int64_t N, int64_t C, int64_t rows,
                               int64_t row_offset) {
    ct_cuda_embedding_bwd(ctx, dt, dtable, dout, tokens, N, C, rows, row_offset);
}

static void cuda_gather_rows(void *ctx, ct_dtype dt, void *out, const void *in, const int32_t *idx,
                             const float *w, int64_t N, int64_t slots, int64_t C, int64_t in_rows) {
    ct_cuda_gather_rows(ctx, dt, out, in, idx, w, N, slots, C, in_rows);
}

static void cuda_gather_dot(void *ctx, ct_dtype dt, float *out, const void *a, const int32_t *ia,
                            const void *b, const int32_t *ib, int64_t R, int64_t C, int64_t a_rows,
                            int64_t b_rows) {
    ct_cuda_gather_dot(ctx, dt, out, a, ia, b, ib, R, C, a_rows, b_rows);
}

static void cuda_posemb_fwd(void *ctx, ct_dtype dt, void *out, const void *wpe, int64_t B,
                            int64_t T, int64_t C, int64_t pos_offset) {
    ct_cuda_posemb_fwd(ctx, dt, out, wpe, B, T, C, pos_offset);
}

static void cuda_posemb_bwd(void *ctx, ct_dtype dt, float *dwpe, const void *dout, int64_t B,
                            int64_t T, int64_t C, int64_t pos_offset) {
    ct_cuda_posemb_bwd(ctx, dt, dwpe, dout, B, T, C, pos_offset);
}

static void cuda_layernorm_fwd(void *ctx, ct_dtype dt, void *out, float *mean, float *rstd,
                               void *inp, const void *residual, const void *w, const void *b,
                               int64_t N, int64_t C) {
    ct_cuda_layernorm_fwd(ctx, dt, out, mean, rstd, inp, residual, w, b, N, C);
}

static void cuda_layernorm_bwd(void *ctx, ct_dtype dt, void *dinp, float *dw, float *db,
                               const void *dout, const void *inp, const void *w, const float *mean,
                               const float *rstd, int64_t N, int64_t C) {
    ct_cuda_layernorm_bwd(ctx, dt, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

static void cuda_rmsnorm_fwd(void *ctx, ct_dtype dt, void *out, float *rstd, void *inp,
                             const void *residual, const void *w, int64_t N, int64_t C, float eps) {
    ct_cuda_rmsnorm_fwd(ctx, dt, out, rstd, inp, residual, w, N, C, eps);
}

static void cuda_rmsnorm_bwd(void *ctx, ct_dtype dt, void *dinp, float *dw, const void *dout,
                             const void *inp, const void *w, const float *rstd, int64_t N,
                             int64_t C) {
    ct_cuda_rmsnorm_bwd(ctx, dt, dinp, dw, dout, inp, w, rstd, N, C);
}

static void cuda_rope(void *ctx, ct_dtype dt, void *x, const float *cos_sin, int64_t B, int64_t T,
                      int64_t n_rot_head, int64_t head_dim, int64_t ld, int64_t pos_offset,
                      bool inverse) {
    ct_cuda_rope(ctx, dt, x, cos_sin, B, T, n_rot_head, head_dim, ld, pos_offset, inverse);
}

static void cuda_swiglu_fwd(void *ctx, ct_dtype dt, void *out, const void *gate, const void *up,
                            int64_t N, int64_t H, int64_t ld) {
    ct_cuda_swiglu_fwd(ctx, dt, out, gate, up, N, H, ld);
}

static void cuda_swiglu_bwd(void *ctx, ct_dtype dt, void *dgate, void *dup, const void *gate,
                            const void *up, const void *dout, int64_t N, int64_t H, int64_t ld) {
    ct_cuda_swiglu_bwd(ctx, dt, dgate, dup, gate, up, dout, N, H, ld);
}

static void cuda_gelu_fwd(void *ctx, ct_dtype dt, void *out, const void *inp, int64_t n) {
    ct_cuda_gelu_fwd(ctx, dt, out, inp, n);
}

static void cuda_gelu_bwd(void *ctx, ct_dtype dt, void *dinp, float *dbias, const void *inp,
                          const void *dout, int64_t N, int64_t C) {
    ct_cuda_gelu_bwd(ctx, dt, dinp, dbias, inp, dout, N, C);
}

static void cuda_attention_fwd(void *ctx, ct_dtype dt, void *out, float *lse, const void *qkv,
                               int64_t B, int64_t T, int64_t n_head, int64_t n_kv_head,
                               int64_t head_dim) {
    ct_cuda_attention_fwd(ctx, dt, out, lse, qkv, B, T, n_head, n_kv_head, head_dim);
}

static void cuda_attention_bwd(void *ctx, ct_dtype dt, void *dqkv, float *dbias, const void *dout,
                               const void *qkv, const void *out, const float *lse, int64_t B,
                               int64_t T, int64_t n_head, int64_t n_kv_head, int64_t head_dim) {
    ct_cuda_attention_bwd(ctx, dt, dqkv, dbias, dout, qkv, out, lse, B, T, n_head, n_kv_head,
                          head_dim);
}

static void cuda_cast_cols(void *ctx, void *dst, ct_dtype dst_dtype, int64_t ld_dst,
                           const void *src, ct_dtype src_dtype, int64_t ld_src, int64_t rows,
                           int64_t cols) {
    ct_cuda_cast_cols(ctx, dst, dst_dtype, ld_dst, src, src_dtype, ld_src, rows, cols);
}

static void cuda_attention_part_fwd(void *ctx, ct_dtype dt, float *o_acc, float *lse_acc,
                                    const void *qkv, const void *kv, int64_t B, int64_t T,
                                    int64_t n_head, int64_t n_kv_head, int64_t head_dim,
                                    int64_t chunks) {
    ct_cuda_attention_part_fwd(ctx, dt, o_acc, lse_acc, qkv, kv, B, T, n_head, n_kv_head, head_dim,
                               chunks);
}

static void cuda_attention_part_bwd(void *ctx, ct_dtype dt, float *dq_acc, float *dkv_acc,
                                    const void *dout, const void *qkv, const void *out,
                                    const float *lse, const void *kv, int64_t B, int64_t T,
                                    int64_t n_head, int64_t n_kv_head, int64_t head_dim,
                                    int64_t chunks) {
    ct_cuda_attention_part_bwd(ctx, dt, dq_acc, dkv_acc, dout, qkv, out, lse, kv, B, T, n_head,
                               n_kv_head, head_dim, chunks);
}

static void cuda_xent_rowmax(void *ctx, ct_dtype dt, float *rowmax, const void *logits, int64_t N,
                             int64_t V, int64_t n_valid) {
    ct_cuda_xent_rowmax(ctx, dt, rowmax, logits, N, V, n_valid);
}

static void cuda_xent_sumexp(void *ctx, ct_dtype dt, float *sumexp, float *target_logit,
                             void *logits, const int32_t *targets, const float *rowmax, int64_t N,
                             int64_t V, int64_t n_valid, int64_t col_offset, bool keep_exp) {
    ct_cuda_xent_sumexp(ctx, dt, sumexp, target_logit, logits, targets, rowmax, N, V, n_valid,
                        col_offset, keep_exp);
}

static void cuda_xent_finish(void *ctx, ct_dtype dt, float *losses, void *logits_to_grad,
                             const int32_t *targets, const float *rowmax, const float *sumexp,
                             const float *target_logit, int64_t N, int64_t V, int64_t n_valid,
                             int64_t col_offset, float dloss, bool write_grad) {
    ct_cuda_xent_finish(ctx, dt, losses, logits_to_grad, targets, rowmax, sumexp, target_logit, N,
                        V, n_valid, col_offset, dloss, write_grad);
}

static void cuda_adamw(void *ctx, float *param, const float *grad, float *m, float *v,
                       const ct_adamw_segment *segments, int n_segments, const ct_adamw_hparams *hp,
                       void *param_copy, ct_dtype copy_dtype) {
    ct_cuda_adamw(ctx, param, grad, m, v, segments, n_segments, hp, param_copy, copy_dtype);
}

static void cuda_sumsq(void *ctx, float *out, const float *const *x, const int64_t *n, int count) {
    ct_cuda_sumsq(ctx, out, x, n, count);
}

static void cuda_cast(void *ctx, void *dst, ct_dtype dst_dtype, const void *src, ct_dtype src_dtype,
                      int64_t n) {
    ct_cuda_cast(ctx, dst, dst_dtype, src, src_dtype, n);
}

/* ---- ordering ------------------------------------------------------------------------------ */

static void cuda_event_record(void *ctx, int event) {
    ct_cuda_ctx *cx = ctx;
    CT_CUDA_CHECK(cudaEventRecord(cx->events[event], cx->stream));
}

static void cuda_event_wait(void *ctx, int event) {
    ct_cuda_ctx *cx = ctx;
    ct_cuda_host_wait(cx->stream, cx->events[event]);
}

static void cuda_sync(void *ctx) {
    ct_cuda_ctx *cx = ctx;
    ct_cuda_host_wait(cx->stream, NULL);
}

static const struct ct_backend_i cuda_iface;

/* ---- the clock ----------------------------------------------------------------------------- */

/* Records the anchor on the stream and waits for it: with nothing else queued it passes at once,
 * so its device time is the host time read just after (within the wait's return, microseconds). */
static void clock_anchor(ct_cuda_ctx *cx) {
    CT_CUDA_CHECK(cudaEventRecord(cx->anchor, cx->stream));
    CT_CUDA_CHECK(cudaEventSynchronize(cx->anchor));
    cx->anchor_host = ct_now();
}

double ct_cuda_backend_event_time(const ct_backend *be, cudaEvent_t event) {
    CT_ASSERTF(be->iface == &cuda_iface, "backend %s is not the CUDA backend", be->iface->name);
    const ct_cuda_ctx *cx = be->ctx;
    float ms = 0.0f;
    cudaError_t e = cudaEventElapsedTime(&ms, cx->anchor, event);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* not sticky: the event has not passed, or never ran */
        return NAN;
    }
    return cx->anchor_host + 1e-3 * ms;
}

static void cuda_mark(void *ctx, int64_t id) {
    ct_cuda_ctx *cx = ctx;
    if (id >= cx->cap_marks) {
        int64_t cap = CT_MAX(2 * cx->cap_marks, id + 64);
        cx->marks = realloc(cx->marks, (size_t)cap * sizeof *cx->marks);
        CT_ASSERT(cx->marks != NULL);
        for (int64_t i = cx->cap_marks; i < cap; i++)
            CT_CUDA_CHECK(cudaEventCreateWithFlags(&cx->marks[i], cudaEventDefault));
        cx->cap_marks = cap;
    }
    CT_CUDA_CHECK(cudaEventRecord(cx->marks[id], cx->stream));
}

/* Every mark has passed (the caller synchronised): each one's distance back from a new anchor.
 * The float milliseconds of cudaEventElapsedTime keep ~7 digits: microseconds over a step. */
static void cuda_marks_read(void *ctx, int64_t n, double *times) {
    ct_cuda_ctx *cx = ctx;
    clock_anchor(cx);
    for (int64_t i = 0; i < n; i++) {
        float ms = 0.0f;
        CT_CUDA_CHECK(cudaEventElapsedTime(&ms, cx->marks[i], cx->anchor));
        times[i] = cx->anchor_host - 1e-3 * ms;
    }
}

/* ---- graphs -------------------------------------------------------------------------------- */

/* The compute stream captured in global mode: a call that could make the capture wrong (an
 * allocation, a free, a host wait) fails it rather than slipping past, and CT_CUDA_CHECK exits
 * naming the call. The emulator refuses the same calls (cuda/emu/README.md). */
typedef struct cuda_graph {
    cudaGraphExec_t exec;
    uint64_t frees; /* cx->frees when captured */
} cuda_graph;

static void cuda_capture_begin(void *ctx) {
    ct_cuda_ctx *cx = ctx;
    CT_CUDA_CHECK(cudaStreamBeginCapture(cx->stream, cudaStreamCaptureModeGlobal));
}

static void *cuda_capture_end(void *ctx, int64_t *ops) {
    ct_cuda_ctx *cx = ctx;
    cudaGraph_t graph = NULL;
    CT_CUDA_CHECK(cudaStreamEndCapture(cx->stream, &graph));
    size_t nodes = 0;
    CT_CUDA_CHECK(cudaGraphGetNodes(graph, NULL, &nodes));
    cuda_graph *g = ct_xcalloc(1, sizeof *g);
    CT_CUDA_CHECK(cudaGraphInstantiate(&g->exec, graph, 0));
    CT_CUDA_CHECK(cudaGraphDestroy(graph));
    g->frees = cx->frees;
    *ops = (int64_t)nodes;
    return g;
}

static bool cuda_graph_launch(void *ctx, void *graph) {
    ct_cuda_ctx *cx = ctx;
    cuda_graph *g = graph;
    if (g->frees != cx->frees) return false;
    CT_CUDA_CHECK(cudaGraphLaunch(g->exec, cx->stream));
    return true;
}

static void cuda_graph_free(void *ctx, void *graph) {
    (void)ctx;
    cuda_graph *g = graph;
    CT_CUDA_CHECK(cudaGraphExecDestroy(g->exec)); /* a launch in flight completes first */
    free(g);
}

/* ---- the device ---------------------------------------------------------------------------- */

/* Dense multiply-adds per clock per SM, times 2 (FLOPs), by compute capability: tensor cores for
 * bf16 (A100 312 TFLOP/s = 108 SMs x 1.41 GHz x 2048; H100 SXM 989 = 132 x 1.83 x 4096), the
 * FP32 pipes for fp32 (128 lanes x 2 on both). Unknown architectures give 0: MFU not reported. */
static double flops_per_clock_per_sm(int major, ct_dtype dt) {
    if (dt == CT_DTYPE_F32) return major >= 8 ? 256.0 : 0.0;
    if (major == 8) return 2048.0;
    if (major >= 9) return 4096.0;
    return 0.0;
}

static double cuda_peak_flops(void *ctx, ct_dtype dt, char *how, size_t how_cap) {
    ct_cuda_ctx *cx = ctx;
    int khz = 0;
    CT_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, cx->device));
    double per_sm = flops_per_clock_per_sm(cx->prop.major, dt);
    double peak = per_sm * cx->prop.multiProcessorCount * (double)khz * 1e3;
    snprintf(how, how_cap, "from the device: %d SMs x %.2f GHz x %.0f %s FLOP/clock (sm_%d%d)",
             cx->prop.multiProcessorCount, khz / 1e6, per_sm, ct_dtype_name(dt), cx->prop.major,
             cx->prop.minor);
    return peak;
}

static void cuda_describe(void *ctx, char *buf, size_t cap) {
    ct_cuda_ctx *cx = ctx;
    /* CT_CUDA_ATTENTION=wgmma (attention_tc.cu): said here, so a run shows which kernels it got */
    const bool wgmma = ct_cuda_wgmma_attention_asked();
    snprintf(buf, cap, "cuda:%d %s, %.1f GiB, sm_%d%d%s", cx->device, cx->prop.name,
             (double)cx->prop.totalGlobalMem / (1 << 30), cx->prop.major, cx->prop.minor,
             !wgmma                ? ""
             : cx->prop.major == 9 ? ", wgmma attention"
                                   : ", no wgmma before sm_90");
}

static void cuda_free_backend(void *ctx) {
    ct_cuda_ctx *cx = ctx;
    CT_CUDA_CHECK(cudaStreamSynchronize(cx->stream));
    ct_cuda_gemm_free(cx->gemm);
    for (int s = 0; s < 2; s++)
        if (cx->workspace[s]) CT_CUDA_CHECK(cudaFree(cx->workspace[s]));
    for (int e = 0; e < CT_BACKEND_EVENTS; e++) CT_CUDA_CHECK(cudaEventDestroy(cx->events[e]));
    for (int64_t i = 0; i < cx->cap_marks; i++) CT_CUDA_CHECK(cudaEventDestroy(cx->marks[i]));
    free(cx->marks);
    CT_CUDA_CHECK(cudaEventDestroy(cx->anchor));
    CT_CUDA_CHECK(cudaStreamDestroy(cx->stream));
    free(cx);
}

static const struct ct_backend_i cuda_iface = {
    .name = "cuda",
    .alloc = cuda_alloc,
    .free = cuda_free,
    .fill = cuda_fill,
    .copy_from_host = cuda_copy_from_host,
    .copy_to_host = cuda_copy_to_host,
    .copy = cuda_copy,
    .gemm = cuda_gemm,
    .gemm_grouped = cuda_gemm_grouped,
    .gemm_bias_gelu = cuda_gemm_bias_gelu,
    .bias_add = cuda_bias_add,
    .bias_init = cuda_bias_init,
    .bias_grad = cuda_bias_grad,
    .axpy = cuda_axpy,
    .scale = cuda_scale,
    .embedding_fwd = cuda_embedding_fwd,
    .embedding_bwd = cuda_embedding_bwd,
    .gather_rows = cuda_gather_rows,
    .gather_dot = cuda_gather_dot,
    .posemb_fwd = cuda_posemb_fwd,
    .posemb_bwd = cuda_posemb_bwd,
    .layernorm_fwd = cuda_layernorm_fwd,
    .layernorm_bwd = cuda_layernorm_bwd,
    .rmsnorm_fwd = cuda_rmsnorm_fwd,
    .rmsnorm_bwd = cuda_rmsnorm_bwd,
    .rope = cuda_rope,
    .swiglu_fwd = cuda_swiglu_fwd,
    .swiglu_bwd = cuda_swiglu_bwd,
    .gelu_fwd = cuda_gelu_fwd,
    .gelu_bwd = cuda_gelu_bwd,
    .attention_fwd = cuda_attention_fwd,
    .attention_bwd = cuda_attention_bwd,
    .cast_cols = cuda_cast_cols,
    .attention_part_fwd = cuda_attention_part_fwd,
    .attention_part_bwd = cuda_attention_part_bwd,
    .xent_rowmax = cuda_xent_rowmax,
    .xent_sumexp = cuda_xent_sumexp,
    .xent_finish = cuda_xent_finish,
    .adamw = cuda_adamw,
    .sumsq = cuda_sumsq,
    .cast = cuda_cast,
    .event_record = cuda_event_record,
    .event_wait = cuda_event_wait,
    .mark = cuda_mark,
    .marks_read = cuda_marks_read,
    .sync = cuda_sync,
    .capture_begin = cuda_capture_begin,
    .capture_end = cuda_capture_end,
    .graph_launch = cuda_graph_launch,
    .graph_free = cuda_graph_free,
    .peak_flops = cuda_peak_flops,
    .describe = cuda_describe,
    .free_backend = cuda_free_backend,
};

int ct_cuda_device_count(char *why, size_t cap) {
    int count = 0;
    /* The count is valid only on success: without a driver the runtime returns
     * cudaErrorInsufficientDriver and leaves it untouched. No driver and no device both mean
     * "no GPU here". */
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaSuccess && count > 0) return count;
    (void)cudaGetLastError();
    snprintf(why, cap, "no usable CUDA device (%s)",
             e == cudaSuccess ? "cudaErrorNoDevice" : cudaGetErrorName(e));
    return 0;
}

bool ct_cuda_usable(char *why, size_t cap) {
    return ct_cuda_device_count(why, cap) > 0;
}

cudaStream_t ct_cuda_backend_stream(const ct_backend *be) {
    CT_ASSERTF(be->iface == &cuda_iface, "backend %s is not the CUDA backend", be->iface->name);
    return ((const ct_cuda_ctx *)be->ctx)->stream;
}

cudaEvent_t ct_cuda_backend_event(const ct_backend *be, int event) {
    CT_ASSERTF(be->iface == &cuda_iface, "backend %s is not the CUDA backend", be->iface->name);
    CT_ASSERTF(event >= 0 && event < CT_BACKEND_EVENTS, "event %d", event);
    return ((const ct_cuda_ctx *)be->ctx)->events[event];
}

ct_backend *ct_cuda_backend_new(int device) {
    ct_cuda_ctx *cx = ct_xcalloc(1, sizeof *cx);
    cx->device = device;
    CT_CUDA_CHECK(cudaSetDevice(device));
    CT_CUDA_CHECK(cudaGetDeviceProperties(&cx->prop, device));
    CT_CUDA_CHECK(cudaStreamCreateWithFlags(&cx->stream, cudaStreamNonBlocking));
    for (int e = 0; e < CT_BACKEND_EVENTS; e++)
        CT_CUDA_CHECK(cudaEventCreateWithFlags(&cx->events[e], cudaEventDisableTiming));
    CT_CUDA_CHECK(cudaEventCreateWithFlags(&cx->anchor, cudaEventDefault));
    clock_anchor(cx);
    cx->gemm = ct_cuda_gemm_new(cx->stream);
    ct_backend *be = ct_xcalloc(1, sizeof *be);
    be->iface = &cuda_iface;
    be->ctx = cx;
    ct_backend_apply_env(be);
    return be;
}

static ct_backend *create_cuda(int n_threads) {
    (void)n_threads;
    return ct_cuda_backend_new(ct_backend_device());
}

void ct_cuda_register(void) {
    static const ct_backend_desc desc = {.name = "cuda",
                                         .create = create_cuda,
                                         .usable = ct_cuda_usable,
                                         .accelerator = true,
                                         .device_count = ct_cuda_device_count,
                                         .native_bf16 = ct_cuda_native_bf16};
    ct_backend_register(&desc);
}
