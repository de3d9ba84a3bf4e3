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

#include "cuda/ct_cuda_check.h"
#include "cuda/ct_cuda_ctx.h"
#include "cuda/elementwise.cuh"
#include "cuda/gemm.h"

struct ct_cuda_ctx {
    int device;
    struct cudaDeviceProp prop;
    cudaStream_t stream;
    cudaEvent_t events[CT_BACKEND_EVENTS];
    ct_cublas_gemm_ctx *gemm;
    void *workspace[2]; /* ct_cuda_workspace */
    size_t workspace_bytes[2];
    /* Workspaces outgrown, kept until the backend is freed: a cudaFree waits for the whole
     * device, a pipeline transfer pending on a channel's stream included, whose partner rank may
     * be waiting in the same way for its own — a cycle (met by the zbv schedule, whose ranks both
     * send and receive each way). Growth by half keeps them under twice the last size. */
    void **retired;
    int n_retired;
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
    /* Grow by at least half, so a run settles after a few calls; the old buffer is retired, not
     * freed (above), so work still reading it needs no wait. */
    size_t want = bytes + bytes / 2;
    if (cx->workspace[slot]) {
        cx->retired = realloc(cx->retired, (size_t)(cx->n_retired + 1) * sizeof *cx->retired);
        CT_ASSERT(cx->retired != NULL);
        cx->retired[cx->n_retired++] = cx->workspace[slot];
        cx->frees++; /* a graph captured with the old buffer is captured again */
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

void ct_cuda_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    ct_cuda_ctx *cx = ctx;
    CT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cx->stream));
}

/* ---- ops: the GEMMs ------------------------------------------------------------------------
 *
 * Every other op's slot is its launcher, ct_cuda_<op> in the op family's .cu file (ct_cuda_ctx.h
 * declares them from the op list). */

/* An accumulating GEMM into bf16 (beta != 0: a linear layer's output that starts as its bias
 * where cuBLASLt has no epilogue algorithm, Mixture of Experts' outputs) is rounded once, as the
 * CPU's is: the product goes to fp32 in workspace slot 1, and one kernel stores bf16(product +
 * beta·C). cuBLASLt's own bf16 epilogue with beta = 1 did not: on an H200 (sm_90, CUDA 13.0) check
 * mode found results up to 27 bf16 ulps from the single rounding where the product and C nearly
 * cancel, as a second rounding (of the product, before C is added) would give. The price: the fp32
 * product written and read again, 8 bytes an element besides C's own read and write. */
void ct_cuda_gemm(void *ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                  float alpha, const void *A, int64_t lda, const void *B, int64_t ldb, float beta,
                  void *C, int64_t ldc, ct_dtype ab_dtype, ct_dtype c_dtype) {
    ct_cuda_ctx *cx = ctx;
    if (c_dtype == CT_DTYPE_BF16 && beta != 0.0f && M > 0 && N > 0 && K > 0 && alpha != 0.0f) {
        float *prod = ct_cuda_workspace(cx, 1, (size_t)(M * N) * sizeof(float));
        ct_cublas_gemm(cx->gemm, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, 0.0f, prod, N,
                       ab_dtype, CT_DTYPE_F32);
        ct_cuda_accumulate_rounded(cx, C, ldc, prod, beta, M, N);
        return;
    }
    ct_cublas_gemm(cx->gemm, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                   ab_dtype, c_dtype);
}

/* Mixture of Experts' GEMMs (one per local expert) in one cublasGemmGroupedBatchedEx call
 * (ct_cublas_gemm_grouped), except where the GEMMs must go one by one through ct_cuda_gemm: a bf16
 * C with beta != 0 (rounded once, above; the grouped call has no fp32 product to hand), and what
 * the grouped call refuses (bf16 into an fp32 C, bf16 pointers not 16-byte aligned). Operands are
 * contiguous row-major (the slot's contract, backend.h). */
static void cuda_gemm_grouped(void *ctx, int count, bool trans_a, bool trans_b, const int64_t *mnk,
                              float alpha, void *const *ptrs, float beta, ct_dtype ab_dtype,
                              ct_dtype c_dtype) {
    ct_cuda_ctx *cx = ctx;
    if (!(c_dtype == CT_DTYPE_BF16 && beta != 0.0f) &&
        ct_cublas_gemm_grouped(cx->gemm, count, trans_a, trans_b, mnk, alpha, ptrs, beta, ab_dtype,
                               c_dtype))
        return;
    for (int i = 0; i < count; i++) {
        int64_t M = mnk[3 * i], N = mnk[3 * i + 1], K = mnk[3 * i + 2];
        ct_cuda_gemm(cx, trans_a, trans_b, M, N, K, alpha, ptrs[3 * i], trans_a ? M : K,
                     ptrs[3 * i + 1], trans_b ? K : N, beta, ptrs[3 * i + 2], N, ab_dtype, c_dtype);
    }
}

/* GELU fused into the GEMM's epilogue (cuBLASLt's GELU_AUX_BIAS); where cuBLASLt has no
 * algorithm for it (ct_cublas_gemm_bias_gelu returns false), the same three steps as the model's
 * fallback: pre = bias on every row, pre += A·Bᵀ (beta = 1), out = GELU(pre). */
static void cuda_gemm_bias_gelu(void *ctx, int64_t M, int64_t N, int64_t K, const void *A,
                                int64_t lda, const void *B, int64_t ldb, const void *bias,
                                void *pre, int64_t ldpre, void *out, int64_t ldout, ct_dtype dt) {
    ct_cuda_ctx *cx = ctx;
    if (!out) { /* the bias alone (cuBLASLt's BIAS epilogue): pre = A·Bᵀ + bias */
        if (ct_cublas_gemm_bias(cx->gemm, M, N, K, A, lda, B, ldb, bias, pre, ldpre, dt)) return;
        CT_ASSERTF(ldpre == N, "gemm_bias fallback with ldpre %lld, N %lld", (long long)ldpre,
                   (long long)N);
        ct_cuda_bias_init(cx, dt, pre, bias, NULL, M, N);
        ct_cuda_gemm(cx, false, true, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, pre, ldpre, dt, dt);
        return;
    }
    if (ct_cublas_gemm_bias_gelu(cx->gemm, M, N, K, A, lda, B, ldb, bias, pre, ldpre, out, ldout,
                                 dt))
        return;
    /* The kernels take packed (M, N) rows: the wrapper passes ldpre = ldout = N. */
    CT_ASSERTF(ldpre == N && ldout == N,
               "gemm_bias_gelu fallback with ldpre %lld, ldout %lld, N %lld", (long long)ldpre,
               (long long)ldout, (long long)N);
    ct_cuda_bias_init(cx, dt, pre, bias, NULL, M, N);
    ct_cuda_gemm(cx, false, true, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, pre, ldpre, dt, dt);
    ct_cuda_gelu_fwd(cx, dt, out, pre, M * N);
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
    ct_cublas_gemm_free(cx->gemm);
    for (int s = 0; s < 2; s++)
        if (cx->workspace[s]) CT_CUDA_CHECK(cudaFree(cx->workspace[s]));
    for (int i = 0; i < cx->n_retired; i++) CT_CUDA_CHECK(cudaFree(cx->retired[i]));
    free(cx->retired);
    for (int e = 0; e < CT_BACKEND_EVENTS; e++) CT_CUDA_CHECK(cudaEventDestroy(cx->events[e]));
    for (int64_t i = 0; i < cx->cap_marks; i++) CT_CUDA_CHECK(cudaEventDestroy(cx->marks[i]));
    free(cx->marks);
    CT_CUDA_CHECK(cudaEventDestroy(cx->anchor));
    CT_CUDA_CHECK(cudaStreamDestroy(cx->stream));
    free(cx);
}

/* The ops come from the list (core/backend/backend_ops.h): ct_cuda_<op> for every required and
 * feature op (ct_cuda_ctx.h); the two optional GEMMs by hand. */
#define CUDA_SLOT_(...) CT_OP_SLOT(ct_cuda_, __VA_ARGS__)
static const struct ct_backend_i cuda_iface = {.name = "cuda",
                                               .alloc = cuda_alloc,
                                               .free = cuda_free,
                                               .copy_from_host = cuda_copy_from_host,
                                               .copy_to_host = cuda_copy_to_host,
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
                                               .gemm_grouped = cuda_gemm_grouped,
                                               .gemm_bias_gelu = cuda_gemm_bias_gelu,
                                               CT_BACKEND_OPS(CUDA_SLOT_)};
#undef CUDA_SLOT_

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
    cx->gemm = ct_cublas_gemm_new(cx->stream);
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
