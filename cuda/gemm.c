/*
 * gemm.c — the CUDA backend's GEMM through cuBLASLt, with cublasGemmEx as the fallback. See
 * gemm.h for the semantics and invariants.
 *
 * Row-major to column-major. cuBLAS is column-major, and a row-major (r × c) matrix with row
 * stride ld is, read column-major, its transpose: a (c × r) matrix with leading dimension ld. So
 * the row-major C = op(A)·op(B) is, column-major, C^T = op(B)^T · op(A)^T: we ask cuBLAS for the
 * (N × M) product whose first operand is B's memory and whose second is A's, with the same
 * transpose flags (B read column-major is already B^T, so op(B)^T needs CUBLAS_OP_N exactly when
 * op is the identity), m = N, n = M, k = K, and the leading dimensions unchanged. Nothing is
 * copied or transposed in memory.
 *
 * The bias-GELU epilogue under that swap (ct_cublas_gemm_bias_gelu). cuBLASLt's bias has one value
 * per row of its column-major D, which is (N × M): one per column of our row-major (M, N) result,
 * i.e. the per-output-feature bias of a linear layer, packed, N values. Its aux matrix (GELU's
 * input) is laid out like D: (N × M) column-major with leading dimension CUBLASLT_MATMUL_DESC_
 * EPILOGUE_AUX_LD, i.e. our row-major (M, N) pre-activation with row stride ldpre (the library
 * wants it >= N, its row count, and a multiple of 8). Bias and aux are D's type (the defaults of
 * _BIAS_DATA_TYPE and _EPILOGUE_AUX_DATA_TYPE for bf16 and fp32 outputs).
 *
 * The grouped call (ct_cublas_gemm_grouped): cublasGemmGroupedBatchedEx with the cublasGemmEx
 * fallback's mapping, one group per GEMM. Its transposes, sizes, leading dimensions, alpha, beta
 * and group sizes are host arrays, read during the call; its A/B/C pointer arrays are device
 * memory, read by the library's kernels when the stream reaches them. So the pointers go through
 * a pinned staging buffer of ours (the caller's array may be freed the moment we return) and
 * cudaMemcpyAsync into a device buffer of ours, both on the stream. The device buffer needs no
 * wait: the next call's copy into it is queued behind this call's GEMMs on the same stream. The
 * staging does: a copy from pinned memory reads it when the stream reaches the copy, so a slot
 * is rewritten only after the copy that last read it ran (an event recorded behind each copy,
 * waited for on the host). With CT_GEMM_GROUPED_SLOTS slots used in turn that wait is for the
 * copy of the call that many calls back, normally long done; a single slot would make every
 * grouped call wait for the stream to reach the one before it (no queueing ahead across an
 * MoE layer's GEMMs). A plain cudaMemcpy would avoid the staging but synchronise the device at
 * every call.
 */
#include "cuda/gemm.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>

#include <cublasLt.h>
#include <cublas_v2.h>

#include "cuda/ct_cublas_check.h"
#include "cuda/ct_cuda_check.h"

/* cuBLASLt's recommended workspace on Hopper; split-K and stream-K algorithms use it. */
#define CT_GEMM_WORKSPACE_BYTES ((size_t)32 << 20)
/* A model has a few dozen GEMM configurations; past this many the cache starts over rather than
 * growing without bound (a program cycling through shapes would otherwise leak descriptors). */
#define CT_GEMM_CACHE_MAX 256
/* cuBLASLt's default and largest alignment assumption (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*). */
#define CT_GEMM_MAX_ALIGN 256u
/* Staging slots of the grouped call's pointer arrays (the top of the file says why several). */
#define CT_GEMM_GROUPED_SLOTS 4

/* Everything the descriptors, the layouts and the heuristic's choice depend on. */
typedef struct gemm_key {
    bool trans_a, trans_b;
    int64_t M, N, K, lda, ldb, ldc;
    ct_dtype ab_dtype, c_dtype;
    uint32_t align_a, align_b, align_c; /* bytes, powers of two up to 256 */
    /* The epilogue: 0 none, CUBLASLT_EPILOGUE_BIAS or _GELU_AUX_BIAS; the aux (pre-activation)
     * ld and the bias and aux pointers' alignments, which the heuristic reads from the
     * descriptor's pointers. All zero for a plain GEMM. */
    uint32_t epilogue;
    int64_t ld_aux;
    uint32_t align_bias, align_aux;
} gemm_key;

/* One cached configuration, in cuBLAS's column-major terms: x is B's memory (cuBLAS's "A"),
 * y is A's memory (cuBLAS's "B"), c is C (both cuBLAS's C and D: D = C, in place). */
typedef struct gemm_plan {
    gemm_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t x, y, c;
    bool has_algo; /* false: the heuristic offered none; the GEMM goes to cublasGemmEx */
    cublasLtMatmulAlgo_t algo;
} gemm_plan;

struct ct_cublas_gemm_ctx {
    cudaStream_t stream;
    cublasLtHandle_t lt;
    cublasHandle_t blas; /* the fallback, bound to `stream` */
    cublasLtMatmulPreference_t pref;
    void *workspace;
    size_t workspace_bytes;
    gemm_plan *plans;
    int n_plans;
    int64_t fallbacks;

    /* ct_cublas_gemm_grouped. The A/B/C pointer arrays the library reads on the device: staged in
     * pinned host slots of 3·grouped_cap pointers each, copied into grouped_dev (3·grouped_cap
     * pointers). grouped_copied[s] is recorded behind the latest copy out of slot s. */
    void **grouped_stage;
    void **grouped_dev;
    cudaEvent_t grouped_copied[CT_GEMM_GROUPED_SLOTS];
    int grouped_slot; /* the next slot to fill */
    int grouped_cap;  /* GEMMs a slot holds */
    /* The call's per-group host arrays, grouped_cap entries each. */
    cublasOperation_t *grouped_op_x, *grouped_op_y;
    int *grouped_m, *grouped_n, *grouped_k, *grouped_ldx, *grouped_ldy, *grouped_ldc, *grouped_size;
    float *grouped_alpha, *grouped_beta;
};

static cudaDataType_t cuda_type(ct_dtype dt) {
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "gemm dtype %s", ct_dtype_name(dt));
    return dt == CT_DTYPE_F32 ? CUDA_R_32F : CUDA_R_16BF;
}

/* The largest power of two (up to 256) that divides the address: what the heuristic may assume.
 * NULL (an empty operand) assumes the most. */
static uint32_t ptr_alignment(const void *p) {
    uintptr_t a = (uintptr_t)p;
    if (a == 0) return CT_GEMM_MAX_ALIGN;
    uintptr_t low = a & (~a + 1);
    return low >= CT_GEMM_MAX_ALIGN ? CT_GEMM_MAX_ALIGN : (uint32_t)low;
}

static bool key_equal(const gemm_key *a, const gemm_key *b) {
    return a->trans_a == b->trans_a && a->trans_b == b->trans_b && a->M == b->M && a->N == b->N &&
           a->K == b->K && a->lda == b->lda && a->ldb == b->ldb && a->ldc == b->ldc &&
           a->ab_dtype == b->ab_dtype && a->c_dtype == b->c_dtype && a->align_a == b->align_a &&
           a->align_b == b->align_b && a->align_c == b->align_c && a->epilogue == b->epilogue &&
           a->ld_aux == b->ld_aux && a->align_bias == b->align_bias && a->align_aux == b->align_aux;
}

static void plan_release(gemm_plan *p) {
    CT_CUBLASLT_CHECK(cublasLtMatrixLayoutDestroy(p->c));
    CT_CUBLASLT_CHECK(cublasLtMatrixLayoutDestroy(p->y));
    CT_CUBLASLT_CHECK(cublasLtMatrixLayoutDestroy(p->x));
    CT_CUBLASLT_CHECK(cublasLtMatmulDescDestroy(p->desc));
}

static void set_pref_u32(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
                         uint32_t value) {
    CT_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof value));
}

/* The epilogue's pointers live in the descriptor: set at plan time (the heuristic reads their
 * alignment) and again at every call (each layer has its own bias and pre-activation). */
static void set_epilogue_pointers(cublasLtMatmulDesc_t desc, const void *bias, void *aux) {
    CT_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                     sizeof bias));
    CT_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(
        desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
}

/* Builds the descriptors for `k` and asks the heuristic for one algorithm. bias and aux: the
 * epilogue's pointers when k->epilogue has them (else unused). */
static void plan_init(ct_cublas_gemm_ctx *g, gemm_plan *p, const gemm_key *k, const void *bias,
                      void *aux) {
    p->key = *k;
    CT_CUBLASLT_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    /* The attributes are int32_t (cublasOperation_t values); pass exactly that size. */
    int32_t op_x = k->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    int32_t op_y = k->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    CT_CUBLASLT_CHECK(
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_x, sizeof op_x));
    CT_CUBLASLT_CHECK(
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_y, sizeof op_y));
    if (k->epilogue) {
        /* The attribute is uint32_t, the aux ld int64_t (elements). */
        uint32_t epilogue = k->epilogue;
        CT_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                         &epilogue, sizeof epilogue));
        if (k->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
            int64_t ld_aux = k->ld_aux;
            CT_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(
                p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld_aux, sizeof ld_aux));
        }
        set_epilogue_pointers(p->desc, bias, aux);
    }

    /* Column-major shapes of the stored operands (see the top of the file): B's memory is
     * (N × K), or (K × N) when trans_b; A's memory is (K × M), or (M × K) when trans_a. */
    cudaDataType_t ab = cuda_type(k->ab_dtype), c = cuda_type(k->c_dtype);
    CT_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&p->x, ab, (uint64_t)(k->trans_b ? k->K : k->N),
                                                 (uint64_t)(k->trans_b ? k->N : k->K), k->ldb));
    CT_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&p->y, ab, (uint64_t)(k->trans_a ? k->M : k->K),
                                                 (uint64_t)(k->trans_a ? k->K : k->M), k->lda));
    CT_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&p->c, c, (uint64_t)k->N, (uint64_t)k->M, k->ldc));

    /* Tell the heuristic how aligned the pointers really are (the default promise is 256
     * bytes, which a pointer into a slab need not keep). cuBLAS's A is our B. */
    set_pref_u32(g->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, k->align_b);
    set_pref_u32(g->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, k->align_a);
    set_pref_u32(g->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, k->align_c);
    set_pref_u32(g->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, k->align_c);

    cublasLtMatmulHeuristicResult_t result;
    int n_results = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(g->lt, p->desc, p->x, p->y, p->c, p->c,
                                                       g->pref, 1, &result, &n_results);
    /* NOT_SUPPORTED means "no heuristic for this configuration": the same as zero results. */
    if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED)
        ct_cuda_fail("cuBLASLt", cublasGetStatusString(st), cublasGetStatusName(st),
                     "cublasLtMatmulAlgoGetHeuristic(g->lt, p->desc, ...)", __FILE__, __LINE__);
    p->has_algo =
        st == CUBLAS_STATUS_SUCCESS && n_results > 0 && result.state == CUBLAS_STATUS_SUCCESS;
    if (p->has_algo) p->algo = result.algo;
}

static gemm_plan *plan_get(ct_cublas_gemm_ctx *g, const gemm_key *k, const void *bias, void *aux) {
    for (int i = 0; i < g->n_plans; i++)
        if (key_equal(&g->plans[i].key, k)) return &g->plans[i];
    if (g->n_plans == CT_GEMM_CACHE_MAX) {
        /* Descriptors are host objects: work already queued does not use them any more. */
        for (int i = 0; i < g->n_plans; i++) plan_release(&g->plans[i]);
        g->n_plans = 0;
    }
    gemm_plan *p = &g->plans[g->n_plans++];
    plan_init(g, p, k, bias, aux);
    return p;
}

ct_cublas_gemm_ctx *ct_cublas_gemm_new(cudaStream_t stream) {
    ct_cublas_gemm_ctx *g = ct_xcalloc(1, sizeof *g);
    g->stream = stream;
    g->plans = ct_xcalloc(CT_GEMM_CACHE_MAX, sizeof *g->plans);
    /* The workspace first: without a usable device this is the call that fails, with CUDA's
     * own message (cudaErrorInsufficientDriver / cudaErrorNoDevice). */
    g->workspace_bytes = CT_GEMM_WORKSPACE_BYTES;
    CT_CUDA_CHECK(cudaMalloc(&g->workspace, g->workspace_bytes));
    CT_CUBLASLT_CHECK(cublasLtCreate(&g->lt));
    CT_CUBLAS_CHECK(cublasCreate(&g->blas));
    CT_CUBLAS_CHECK(cublasSetStream(g->blas, stream));
    /* cublasGemmEx's workspace is cuBLASLt's (the same stream orders them), so cuBLAS allocates
     * none of its own, which a graph capture (train.cuda_graph) could not hold. */
    CT_CUBLAS_CHECK(cublasSetWorkspace(g->blas, g->workspace, g->workspace_bytes));
    /* No TF32 for fp32 inputs (the default math with CUBLAS_COMPUTE_32F), and split-K partial
     * sums reduced in fp32 even when C is bf16. */
    CT_CUBLAS_CHECK(cublasSetMathMode(
        g->blas,
        (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));

    CT_CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&g->pref));
    uint64_t ws = g->workspace_bytes;
    CT_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(
        g->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    /* The cuBLASLt side of "reduce in fp32": no algorithm that sums split-K partials in the
     * output buffer (INPLACE) or in the output type. */
    set_pref_u32(g->pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                 CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
    for (int s = 0; s < CT_GEMM_GROUPED_SLOTS; s++)
        CT_CUDA_CHECK(cudaEventCreateWithFlags(&g->grouped_copied[s], cudaEventDisableTiming));
    return g;
}

static void grouped_release(ct_cublas_gemm_ctx *g);

void ct_cublas_gemm_free(ct_cublas_gemm_ctx *g) {
    if (!g) return;
    grouped_release(g);
    for (int s = 0; s < CT_GEMM_GROUPED_SLOTS; s++)
        CT_CUDA_CHECK(cudaEventDestroy(g->grouped_copied[s]));
    for (int i = 0; i < g->n_plans; i++) plan_release(&g->plans[i]);
    CT_CUBLASLT_CHECK(cublasLtMatmulPreferenceDestroy(g->pref));
    CT_CUBLAS_CHECK(cublasDestroy(g->blas));
    CT_CUBLASLT_CHECK(cublasLtDestroy(g->lt));
    CT_CUDA_CHECK(cudaFree(g->workspace));
    free(g->plans);
    free(g);
}

int64_t ct_cublas_gemm_fallbacks(const ct_cublas_gemm_ctx *g) {
    return g->fallbacks;
}

int ct_cublas_gemm_cache_size(const ct_cublas_gemm_ctx *g) {
    return g->n_plans;
}

static int int_dim_of(const char *call, int64_t v) {
    CT_ASSERTF(v <= INT_MAX, "%s dimension %lld exceeds INT_MAX", call, (long long)v);
    return (int)v;
}

static int int_dim(int64_t v) {
    return int_dim_of("cublasGemmEx", v);
}

/* cublasGemmEx with the same operand mapping as the cuBLASLt path; k = 0 makes it C = beta·C
 * without touching A or B (BLAS semantics). */
static void gemm_ex(ct_cublas_gemm_ctx *g, bool trans_a, bool trans_b, int64_t M, int64_t N,
                    int64_t K, float alpha, const void *A, int64_t lda, const void *B, int64_t ldb,
                    float beta, void *C, int64_t ldc, ct_dtype ab_dtype, ct_dtype c_dtype) {
    cudaDataType_t ab = cuda_type(ab_dtype), c = cuda_type(c_dtype);
    CT_CUBLAS_CHECK(cublasGemmEx(
        g->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
        int_dim(N), int_dim(M), int_dim(K), &alpha, B, ab, int_dim(ldb), A, ab, int_dim(lda), &beta,
        C, c, int_dim(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void ct_cublas_gemm(ct_cublas_gemm_ctx *g, bool trans_a, bool trans_b, int64_t M, int64_t N,
                    int64_t K, float alpha, const void *A, int64_t lda, const void *B, int64_t ldb,
                    float beta, void *C, int64_t ldc, ct_dtype ab_dtype, ct_dtype c_dtype) {
    CT_ASSERT(g != NULL);
    CT_ASSERTF(M >= 0 && N >= 0 && K >= 0, "gemm M=%lld N=%lld K=%lld", (long long)M, (long long)N,
               (long long)K);
    CT_ASSERTF(
        (ab_dtype == CT_DTYPE_F32 && c_dtype == CT_DTYPE_F32) ||
            (ab_dtype == CT_DTYPE_BF16 && (c_dtype == CT_DTYPE_F32 || c_dtype == CT_DTYPE_BF16)),
        "gemm dtypes %s -> %s", ct_dtype_name(ab_dtype), ct_dtype_name(c_dtype));
    CT_ASSERTF(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N) && ldc >= N,
               "gemm ta=%d tb=%d M=%lld N=%lld K=%lld: lda=%lld ldb=%lld ldc=%lld too small",
               trans_a, trans_b, (long long)M, (long long)N, (long long)K, (long long)lda,
               (long long)ldb, (long long)ldc);
    if (M == 0 || N == 0) return;

    if (K == 0 || alpha == 0.0f) {
        /* Nothing to multiply: C = beta·C. With k = 0, cuBLAS still wants ld >= max(1, rows)
         * of the unread operands, whose stored rows are then 0 where they count K. */
        int64_t lda0 = trans_a ? lda : (lda > 1 ? lda : 1);
        int64_t ldb0 = trans_b ? (ldb > 1 ? ldb : 1) : ldb;
        gemm_ex(g, trans_a, trans_b, M, N, 0, alpha, A, lda0, B, ldb0, beta, C, ldc, ab_dtype,
                c_dtype);
        return;
    }

    gemm_key key = {
        .trans_a = trans_a,
        .trans_b = trans_b,
        .M = M,
        .N = N,
        .K = K,
        .lda = lda,
        .ldb = ldb,
        .ldc = ldc,
        .ab_dtype = ab_dtype,
        .c_dtype = c_dtype,
        .align_a = ptr_alignment(A),
        .align_b = ptr_alignment(B),
        .align_c = ptr_alignment(C),
    };
    gemm_plan *p = plan_get(g, &key, NULL, NULL);
    if (!p->has_algo) {
        g->fallbacks++;
        gemm_ex(g, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ab_dtype,
                c_dtype);
        return;
    }
    CT_CUBLASLT_CHECK(cublasLtMatmul(g->lt, p->desc, &alpha, B, p->x, A, p->y, &beta, C, p->c, C,
                                     p->c, &p->algo, g->workspace, g->workspace_bytes, g->stream));
}

/* A linear layer's forward with the bias (and with gelu: GELU) in the epilogue: out = [GELU]
 * (A·Bᵀ + bias), pre the pre-activation (gelu only). false: no algorithm (counted) or K == 0 (not
 * counted). */
static bool gemm_epilogue(ct_cublas_gemm_ctx *g, bool gelu, int64_t M, int64_t N, int64_t K,
                          const void *A, int64_t lda, const void *B, int64_t ldb, const void *bias,
                          void *pre, int64_t ldpre, void *out, int64_t ldout, ct_dtype dt) {
    const char *op = gelu ? "gemm_bias_gelu" : "gemm_bias";
    CT_ASSERT(g != NULL);
    CT_ASSERTF(M >= 0 && N >= 0 && K >= 0, "%s M=%lld N=%lld K=%lld", op, (long long)M,
               (long long)N, (long long)K);
    CT_ASSERTF(dt == CT_DTYPE_F32 || dt == CT_DTYPE_BF16, "%s dtype %s", op, ct_dtype_name(dt));
    CT_ASSERTF(lda >= K && ldb >= K && (!gelu || ldpre >= N) && ldout >= N,
               "%s M=%lld N=%lld K=%lld: lda=%lld ldb=%lld ldpre=%lld ldout=%lld too small", op,
               (long long)M, (long long)N, (long long)K, (long long)lda, (long long)ldb,
               (long long)ldpre, (long long)ldout);
    if (M == 0 || N == 0) return true;
    if (K == 0) return false; /* no product: the caller's bias [+ GELU] path (not a fallback) */

    /* y = x·Wᵀ: trans_a = false, trans_b = true, as a linear layer's forward. */
    gemm_key key = {
        .trans_a = false,
        .trans_b = true,
        .M = M,
        .N = N,
        .K = K,
        .lda = lda,
        .ldb = ldb,
        .ldc = ldout,
        .ab_dtype = dt,
        .c_dtype = dt,
        .align_a = ptr_alignment(A),
        .align_b = ptr_alignment(B),
        .align_c = ptr_alignment(out),
        .epilogue = gelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_BIAS,
        .ld_aux = gelu ? ldpre : 0,
        .align_bias = ptr_alignment(bias),
        .align_aux = gelu ? ptr_alignment(pre) : 0,
    };
    gemm_plan *p = plan_get(g, &key, bias, pre);
    if (!p->has_algo) {
        g->fallbacks++;
        return false;
    }
    set_epilogue_pointers(p->desc, bias, pre);
    /* beta = 0: C (out's memory, same layout as D) is not read. */
    const float alpha = 1.0f, beta = 0.0f;
    CT_CUBLASLT_CHECK(cublasLtMatmul(g->lt, p->desc, &alpha, B, p->x, A, p->y, &beta, out, p->c,
                                     out, p->c, &p->algo, g->workspace, g->workspace_bytes,
                                     g->stream));
    return true;
}

bool ct_cublas_gemm_bias_gelu(ct_cublas_gemm_ctx *g, int64_t M, int64_t N, int64_t K, const void *A,
                              int64_t lda, const void *B, int64_t ldb, const void *bias, void *pre,
                              int64_t ldpre, void *out, int64_t ldout, ct_dtype dt) {
    return gemm_epilogue(g, true, M, N, K, A, lda, B, ldb, bias, pre, ldpre, out, ldout, dt);
}

bool ct_cublas_gemm_bias(ct_cublas_gemm_ctx *g, int64_t M, int64_t N, int64_t K, const void *A,
                         int64_t lda, const void *B, int64_t ldb, const void *bias, void *out,
                         int64_t ldout, ct_dtype dt) {
    return gemm_epilogue(g, false, M, N, K, A, lda, B, ldb, bias, NULL, 0, out, ldout, dt);
}

/* ---- the grouped call ------------------------------------------------------------------------ */

/* Frees the grouped call's buffers, once nothing queued reads them: the staging slots are read by
 * queued copies, the device buffer by queued grouped GEMMs. */
static void grouped_release(ct_cublas_gemm_ctx *g) {
    if (g->grouped_cap == 0) return;
    ct_cuda_host_wait(g->stream, NULL);
    CT_CUDA_CHECK(cudaFreeHost(g->grouped_stage));
    CT_CUDA_CHECK(cudaFree(g->grouped_dev));
    free(g->grouped_op_x), free(g->grouped_op_y);
    free(g->grouped_m), free(g->grouped_n), free(g->grouped_k);
    free(g->grouped_ldx), free(g->grouped_ldy), free(g->grouped_ldc), free(g->grouped_size);
    free(g->grouped_alpha), free(g->grouped_beta);
    g->grouped_stage = NULL, g->grouped_dev = NULL;
    g->grouped_cap = 0;
}

/* Room for `count` GEMMs a call: grown to at least twice the old size, so a run settles after a
 * few calls (an MoE layer's calls have its local expert count, or fewer). */
static void grouped_reserve(ct_cublas_gemm_ctx *g, int count) {
    if (count <= g->grouped_cap) return;
    int cap = g->grouped_cap * 2 > count ? g->grouped_cap * 2 : count;
    grouped_release(g);
    size_t n = (size_t)cap;
    CT_CUDA_CHECK(
        cudaMallocHost((void **)&g->grouped_stage, CT_GEMM_GROUPED_SLOTS * 3 * n * sizeof(void *)));
    CT_CUDA_CHECK(cudaMalloc((void **)&g->grouped_dev, 3 * n * sizeof(void *)));
    g->grouped_op_x = ct_xmalloc(n * sizeof *g->grouped_op_x);
    g->grouped_op_y = ct_xmalloc(n * sizeof *g->grouped_op_y);
    g->grouped_m = ct_xmalloc(n * sizeof(int));
    g->grouped_n = ct_xmalloc(n * sizeof(int));
    g->grouped_k = ct_xmalloc(n * sizeof(int));
    g->grouped_ldx = ct_xmalloc(n * sizeof(int));
    g->grouped_ldy = ct_xmalloc(n * sizeof(int));
    g->grouped_ldc = ct_xmalloc(n * sizeof(int));
    g->grouped_size = ct_xmalloc(n * sizeof(int));
    g->grouped_alpha = ct_xmalloc(n * sizeof(float));
    g->grouped_beta = ct_xmalloc(n * sizeof(float));
    g->grouped_cap = cap;
}

bool ct_cublas_gemm_grouped(ct_cublas_gemm_ctx *g, int count, bool trans_a, bool trans_b,
                            const int64_t *mnk, float alpha, void *const *ptrs, float beta,
                            ct_dtype ab_dtype, ct_dtype c_dtype) {
    static const char call[] = "cublasGemmGroupedBatchedEx";
    CT_ASSERT(g != NULL && mnk != NULL && ptrs != NULL);
    CT_ASSERTF(count >= 1, "gemm_grouped count %d", count);
    CT_ASSERTF(
        (ab_dtype == CT_DTYPE_F32 && c_dtype == CT_DTYPE_F32) ||
            (ab_dtype == CT_DTYPE_BF16 && (c_dtype == CT_DTYPE_F32 || c_dtype == CT_DTYPE_BF16)),
        "gemm_grouped dtypes %s -> %s", ct_dtype_name(ab_dtype), ct_dtype_name(c_dtype));
    for (int i = 0; i < count; i++)
        CT_ASSERTF(mnk[3 * i] > 0 && mnk[3 * i + 1] > 0 && mnk[3 * i + 2] > 0,
                   "gemm_grouped GEMM %d: M=%lld N=%lld K=%lld (all must be > 0)", i,
                   (long long)mnk[3 * i], (long long)mnk[3 * i + 1], (long long)mnk[3 * i + 2]);
    /* The call's type table has no bf16 -> fp32 under CUBLAS_COMPUTE_32F. */
    if (ab_dtype == CT_DTYPE_BF16 && c_dtype == CT_DTYPE_F32) return false;
    /* For 16-bit types the call wants its matrix pointers 16-byte aligned where K's byte size is
     * (4-byte where it is a multiple of 4): we ask 16 of every pointer and leave the rest to
     * ct_cublas_gemm, whose cuBLASLt/cublasGemmEx choice handles any alignment. */
    if (ab_dtype == CT_DTYPE_BF16)
        for (int i = 0; i < 3 * count; i++)
            if ((uintptr_t)ptrs[i] % 16 != 0) return false;

    grouped_reserve(g, count);
    /* Column-major, as gemm_ex: cuBLAS's A ("x") is our B, its B ("y") our A, m = N, n = M. */
    for (int i = 0; i < count; i++) {
        int64_t M = mnk[3 * i], N = mnk[3 * i + 1], K = mnk[3 * i + 2];
        g->grouped_op_x[i] = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
        g->grouped_op_y[i] = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
        g->grouped_m[i] = int_dim_of(call, N);
        g->grouped_n[i] = int_dim_of(call, M);
        g->grouped_k[i] = int_dim_of(call, K);
        g->grouped_ldx[i] = int_dim_of(call, trans_b ? K : N); /* ldb */
        g->grouped_ldy[i] = int_dim_of(call, trans_a ? M : K); /* lda */
        g->grouped_ldc[i] = int_dim_of(call, N);
        g->grouped_size[i] = 1;
        g->grouped_alpha[i] = alpha;
        g->grouped_beta[i] = beta;
    }

    /* The slot's previous copy must have read it before we overwrite it (the top of the file). */
    int slot = g->grouped_slot;
    g->grouped_slot = (slot + 1) % CT_GEMM_GROUPED_SLOTS;
    ct_cuda_host_wait(g->stream, g->grouped_copied[slot]);
    void **stage = g->grouped_stage + (size_t)slot * 3 * (size_t)g->grouped_cap;
    for (int i = 0; i < count; i++) {
        stage[i] = ptrs[3 * i + 1];             /* x: B */
        stage[count + i] = ptrs[3 * i];         /* y: A */
        stage[2 * count + i] = ptrs[3 * i + 2]; /* C */
    }
    void **dev = g->grouped_dev;
    CT_CUDA_CHECK(cudaMemcpyAsync(dev, stage, 3 * (size_t)count * sizeof(void *),
                                  cudaMemcpyHostToDevice, g->stream));
    CT_CUDA_CHECK(cudaEventRecord(g->grouped_copied[slot], g->stream));

    cudaDataType_t ab = cuda_type(ab_dtype), c = cuda_type(c_dtype);
    CT_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
        g->blas, g->grouped_op_x, g->grouped_op_y, g->grouped_m, g->grouped_n, g->grouped_k,
        g->grouped_alpha, (const void *const *)dev, ab, g->grouped_ldx,
        (const void *const *)(dev + count), ab, g->grouped_ldy, g->grouped_beta, dev + 2 * count, c,
        g->grouped_ldc, count, g->grouped_size, CUBLAS_COMPUTE_32F));
    return true;
}
