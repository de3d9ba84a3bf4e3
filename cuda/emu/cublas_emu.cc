/*
 * cublas_emu.cc — CPU stand-ins for the cuBLAS and cuBLASLt entry points the backend calls
 * (cuda/gemm.c), linked instead of libcublas / libcublasLt in the emulated build (cuda/README.md,
 * Kernel files). Same signatures as <cublasLt.h> and <cublas_v2.h> (cublasCreate and friends are
 * macros for the _v2 symbols, which is what is defined here). Faithful to the documented semantics,
 * so that a call-site mistake fails here as it would on a GPU, and in a few places stricter (each
 * says so):
 *
 *   - GEMMs are column-major: D(m,n) = alpha·op(A)(m,k)·op(B)(k,n) + beta·C, with leading
 *     dimensions, CUBLAS_OP_N/T, strided batches (cuBLASLt layouts), and C == D in place or not.
 *     A leading dimension below max(1, rows) is CUBLAS_STATUS_INVALID_VALUE, as in the libraries
 *     (cuBLASLt accepts it in cublasLtMatrixLayoutCreate and refuses it at the heuristic and at
 *     the matmul). Matrix shapes that do not agree with the transposes: INVALID_VALUE.
 *   - Types: A = B = CUDA_R_32F with C = D = CUDA_R_32F, or A = B = CUDA_R_16BF with C = D =
 *     CUDA_R_16BF or CUDA_R_32F; compute type CUBLAS_COMPUTE_32F (or _PEDANTIC) and scale type
 *     CUDA_R_32F. Others: CUBLAS_STATUS_NOT_SUPPORTED.
 *   - Arithmetic is what a GPU kernel does: each product is added to an fp32 accumulator with a
 *     fused multiply-add, k in ascending order (bf16 products are exact in fp32); then
 *     alpha·acc + beta·C in fp32, the epilogue in fp32, and one rounding to D's type (nearest
 *     even for bf16). Reduced-precision compute modes are modelled, so asking for them shows in
 *     the numbers: CUBLAS_COMPUTE_32F_FAST_TF32 (and CUBLAS_TF32_TENSOR_OP_MATH on a cuBLAS
 *     handle with fp32 inputs) rounds fp32 inputs to TF32 (10-bit mantissa, nearest, ties away
 *     from zero, as cvt.rna.tf32 does), CUBLAS_COMPUTE_32F_FAST_16BF rounds them to bf16.
 *   - beta == 0 never reads C: C may hold NaN. alpha == 0 or k == 0 never reads A or B.
 *   - Epilogues (cuBLASLt): CUBLASLT_EPILOGUE_DEFAULT, _BIAS, _GELU, _GELU_BIAS, _GELU_AUX,
 *     _GELU_AUX_BIAS. The bias (CUBLASLT_MATMUL_DESC_BIAS_POINTER, one value per row of D, D's
 *     type unless CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE says CUDA_R_32F or CUDA_R_16BF; per-batch
 *     stride CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE) is added before GELU; GELU is the tanh form
 *     0.5·x·(1 + tanh(sqrt(2/pi)·(x + 0.044715·x^3))). The _AUX forms also store GELU's input
 *     (alpha·acc + beta·C + bias, in fp32, rounded once) to the aux matrix: m × n column-major
 *     at CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, leading dimension _EPILOGUE_AUX_LD (elements,
 *     >= m, else INVALID_VALUE), batch stride _EPILOGUE_AUX_BATCH_STRIDE, in D's type (the
 *     library's default for GELU input; CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE may only
 *     repeat it). D = GELU(aux value) from the fp32 value, not from the rounded aux. An aux
 *     epilogue without an aux pointer is INVALID_VALUE. Other epilogues: NOT_SUPPORTED.
 *   - Attribute setters check sizeInBytes against the attribute's type (int32_t for the
 *     transposes, uint64_t for the workspace size, ...): a mismatch is INVALID_VALUE, as the
 *     library answers. Attributes that would change the result but are not modelled here
 *     (scale pointers, aux scale pointers, amax, pointer modes other than host, orders other
 *     than column-major, pointer-array batches) are refused with NOT_SUPPORTED and a message:
 *     stricter than the library, so that nothing is silently computed differently.
 *   - cublasLtMatmulAlgoGetHeuristic returns zero results (status SUCCESS) when any leading
 *     dimension or batch stride of A, B, C, D in bytes is not a multiple of 16, when the
 *     preference's CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_{A,B,C,D}_BYTES (default 256: the
 *     promise the caller makes about its pointers) is below 16, when the bias or the aux pointer
 *     is not 16-byte aligned, or when the aux ld is not a multiple of 8 elements (the documented
 *     rule for GELU's aux) and of 16 bytes — as the real heuristics do for these types.
 *     Otherwise one algorithm, which needs 16-byte aligned pointers and min(1 MiB, the
 *     preference's workspace) of workspace.
 *   - cublasLtMatmul checks that the algorithm came from a heuristic query for the same problem
 *     (types, transposes, epilogue, m, n, k, leading dimensions, batch): stricter than the library,
 *     which may run a mismatched algorithm slowly or wrongly. It refuses pointers less aligned
 *     than the algorithm needs (INVALID_VALUE; on a GPU: a misaligned-address fault) and a
 *     workspace smaller than the algorithm's. It scribbles over the workspace it was given, so a
 *     workspace shared with live data shows up. algo == NULL runs the heuristic on the actual
 *     pointers, as the library does.
 *   - Every operand, the bias, the aux matrix and the workspace must be device memory
 *     (cuemu_is_device_pointer, over the whole extent the call reads or writes): anything else
 *     is INVALID_VALUE with a message naming the operand — the classic host-pointer bug.
 *   - cublasGemmGroupedBatchedEx: the per-group arrays (transposes, m, n, k, leading dimensions,
 *     alpha, beta, group sizes) are host memory read during the call, checked as the library
 *     documents (INVALID_VALUE); its type table has no 16BF -> 32F (NOT_SUPPORTED: A = B = C in
 *     32F or 16BF under CUBLAS_COMPUTE_32F; _PEDANTIC and _FAST_TF32 for 32F). The A/B/C pointer
 *     arrays must be device memory, and are read when the stream reaches the work, as the
 *     library's kernels read them: a pointer that is not device memory then, a pointer the
 *     documented alignment rule refuses (16-bit types: 16 bytes when k's byte size is a multiple
 *     of 16, 4 when of 4) or overlapping C matrices abort with a message (on a GPU: an illegal
 *     or misaligned address, or undefined results). Each problem is computed exactly as
 *     cublasGemmEx computes it, so grouped and single GEMMs agree bit for bit.
 *   - alpha and beta are host pointers (the default pointer mode), read during the call. The
 *     work is enqueued on the stream (cuemu_stream_enqueue) and runs when the emulator drains
 *     the stream, so a missing synchronisation shows up as a wrong result.
 *   - Handles and descriptors are checked for liveness: using one after its Destroy is
 *     NOT_INITIALIZED (handles) or INVALID_VALUE (descriptors), with a message.
 *   - Creating handles succeeds without a GPU (the real libraries answer NOT_INITIALIZED there).
 * Every non-success status is also explained on stderr ("cublas_emu: <function>: <why>").
 */
#include "cuda/emu/cuemu.h"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

/* ---- liveness of handles and descriptors ------------------------------------------------- */

enum class Kind { lt_handle, blas_handle, matmul_desc, layout, preference };

std::mutex registry_mutex;
std::unordered_map<const void *, Kind> &registry() {
    static std::unordered_map<const void *, Kind> live;
    return live;
}

void track(const void *p, Kind k) {
    std::lock_guard<std::mutex> lock(registry_mutex);
    registry()[p] = k;
}

bool untrack(const void *p, Kind k) {
    std::lock_guard<std::mutex> lock(registry_mutex);
    auto it = registry().find(p);
    if (it == registry().end() || it->second != k) return false;
    registry().erase(it);
    return true;
}

bool alive(const void *p, Kind k) {
    std::lock_guard<std::mutex> lock(registry_mutex);
    auto it = registry().find(p);
    return it != registry().end() && it->second == k;
}

cublasStatus_t fail(cublasStatus_t st, const char *fn, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
cublasStatus_t fail(cublasStatus_t st, const char *fn, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cublas_emu: %s: %s\n", fn, msg);
    return st;
}

/* ---- objects ------------------------------------------------------------------------------ */

struct LtHandle {
    int unused;
};

struct BlasHandle {
    cudaStream_t stream = nullptr;
    int math_mode = CUBLAS_DEFAULT_MATH;
};

struct MatmulDesc {
    int32_t compute = CUBLAS_COMPUTE_32F;
    int32_t scale = CUDA_R_32F;
    int32_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
    int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N, transc = CUBLAS_OP_N;
    uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const void *bias = nullptr;
    int64_t bias_batch_stride = 0;
    int32_t bias_type = -1; /* -1: D's type */
    void *aux = nullptr;
    int64_t aux_ld = 0, aux_batch_stride = 0;
    int32_t aux_type = -1; /* -1: D's type */
};

struct Layout {
    uint32_t type = CUDA_R_32F;
    int32_t order = CUBLASLT_ORDER_COL;
    uint64_t rows = 0, cols = 0;
    int64_t ld = 0;
    int32_t batch = 1;
    int64_t stride = 0;
    uint32_t batch_mode = CUBLASLT_BATCH_MODE_STRIDED;
};

struct Preference {
    uint64_t max_workspace = 0;
    uint32_t align[4] = {256, 256, 256, 256}; /* A, B, C, D */
};

/* What the emulated algorithm records in cublasLtMatmulAlgo_t::data. */
constexpr uint64_t kAlgoMagic = 0x43554d45414c474full; /* "CUMEALGO" */
constexpr uint32_t kAlgoAlign = 16;
constexpr uint64_t kAlgoWorkspace = 1u << 20;

/* ---- element access ------------------------------------------------------------------------ */

float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1);                                           /* nearest even */
    return (uint16_t)(u >> 16);
}

float round_tf32(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return f; /* Inf, NaN */
    u = (u + 0x1000u) & 0xffffe000u;                /* 10-bit mantissa, ties away from zero */
    memcpy(&f, &u, 4);
    return f;
}

size_t type_size(uint32_t t) {
    return t == CUDA_R_16BF ? 2 : 4;
}

float load(uint32_t t, const void *p, int64_t i) {
    return t == CUDA_R_16BF ? bf16_to_f32(static_cast<const uint16_t *>(p)[i])
                            : static_cast<const float *>(p)[i];
}

void store(uint32_t t, void *p, int64_t i, float v) {
    if (t == CUDA_R_16BF)
        static_cast<uint16_t *>(p)[i] = f32_to_bf16(v);
    else
        static_cast<float *>(p)[i] = v;
}

float gelu_tanh(float x) {
    const float s = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + std::tanh(s * (x + 0.044715f * x * x * x)));
}

/* ---- the reference GEMM -------------------------------------------------------------------- */

enum class InputRounding { none, tf32, bf16 };

/* One column-major strided-batched GEMM with an epilogue, fully described by value, so the
 * enqueued work does not depend on descriptors the caller may destroy after the call. */
struct Gemm {
    bool ta = false, tb = false;
    int64_t m = 0, n = 0, k = 0;
    float alpha = 1, beta = 0;
    const void *a = nullptr, *b = nullptr, *c = nullptr;
    void *d = nullptr;
    uint32_t ta_type = CUDA_R_32F, c_type = CUDA_R_32F; /* A and B share a type; C and D too */
    int64_t lda = 0, ldb = 0, ldc = 0, ldd = 0;
    int32_t batch = 1;
    int64_t stride_a = 0, stride_b = 0, stride_c = 0, stride_d = 0;
    InputRounding rounding = InputRounding::none;
    bool bias = false, gelu = false;
    const void *bias_ptr = nullptr;
    uint32_t bias_type = CUDA_R_32F;
    int64_t bias_stride = 0;
    bool aux = false; /* store GELU's input (the _AUX epilogues) */
    void *aux_ptr = nullptr;
    int64_t aux_ld = 0, aux_stride = 0;
    void *workspace = nullptr;
    size_t workspace_bytes = 0;

    float input(const void *p, int64_t i) const {
        float v = load(ta_type, p, i);
        if (ta_type == CUDA_R_32F) {
            if (rounding == InputRounding::tf32)
                v = round_tf32(v);
            else if (rounding == InputRounding::bf16)
                v = bf16_to_f32(f32_to_bf16(v));
        }
        return v;
    }

    void run() const {
        /* Whatever the algorithm kept in its workspace is garbage to the caller. */
        if (workspace_bytes) memset(workspace, 0xff, workspace_bytes);
        const bool read_ab = k > 0 && alpha != 0.0f;
        for (int32_t bt = 0; bt < batch; bt++) {
            const char *A = static_cast<const char *>(a) + bt * stride_a * type_size(ta_type);
            const char *B = static_cast<const char *>(b) + bt * stride_b * type_size(ta_type);
            const char *C = static_cast<const char *>(c) + bt * stride_c * type_size(c_type);
            char *D = static_cast<char *>(d) + bt * stride_d * type_size(c_type);
            char *X =
                aux ? static_cast<char *>(aux_ptr) + bt * aux_stride * type_size(c_type) : nullptr;
            for (int64_t j = 0; j < n; j++)
                for (int64_t i = 0; i < m; i++) {
                    float acc = 0.0f;
                    if (read_ab)
                        for (int64_t p = 0; p < k; p++) {
                            float x = input(A, ta ? p + i * lda : i + p * lda);
                            float y = input(B, tb ? j + p * ldb : p + j * ldb);
                            acc = std::fma(x, y, acc);
                        }
                    float v = alpha * acc;
                    if (beta != 0.0f) v += beta * load(c_type, C, i + j * ldc);
                    if (bias) v += load(bias_type, bias_ptr, bt * bias_stride + i);
                    if (aux) store(c_type, X, i + j * aux_ld, v); /* GELU's input, D's type */
                    if (gelu) v = gelu_tanh(v);
                    store(c_type, D, i + j * ldd, v);
                }
        }
    }
};

/* Elements spanned by a column-major rows × cols matrix with leading dimension ld, batched. */
int64_t extent(int64_t rows, int64_t cols, int64_t ld, int32_t batch, int64_t stride) {
    if (rows == 0 || cols == 0 || batch == 0) return 0;
    return (batch - 1) * stride + (cols - 1) * ld + rows;
}

bool check_device(const char *fn, const char *what, const void *p, int64_t elems, size_t elem) {
    if (elems <= 0) return true;
    size_t bytes = (size_t)elems * elem;
    if (p != nullptr && cuemu_is_device_pointer(p, bytes)) return true;
    fail(CUBLAS_STATUS_INVALID_VALUE, fn,
         "%s (%p, %zu bytes) is not device memory (a host pointer, freed memory, or an extent "
         "past the end of its allocation)",
         what, p, bytes);
    return false;
}

bool supported_types(uint32_t ab, uint32_t cd) {
    return (ab == CUDA_R_32F && cd == CUDA_R_32F) ||
           (ab == CUDA_R_16BF && (cd == CUDA_R_16BF || cd == CUDA_R_32F));
}

/* The compute types modelled, and how they treat fp32 inputs. */
bool compute_rounding(int32_t compute, InputRounding *r) {
    switch (compute) {
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC: *r = InputRounding::none; return true;
    case CUBLAS_COMPUTE_32F_FAST_TF32: *r = InputRounding::tf32; return true;
    case CUBLAS_COMPUTE_32F_FAST_16BF: *r = InputRounding::bf16; return true;
    default: return false;
    }
}

bool op_ok(int32_t op) {
    return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; /* C is T for reals */
}

/* ---- cuBLASLt problem validation ------------------------------------------------------------ */

struct LtProblem {
    Gemm g;
    const Layout *la, *lb, *lc, *ld;
    const MatmulDesc *desc;
};

/* Checks a descriptor set and fills p->g's shape, types and epilogue (not pointers). */
cublasStatus_t lt_validate(const char *fn, cublasLtMatmulDesc_t computeDesc,
                           cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                           cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                           LtProblem *p) {
    if (!alive(computeDesc, Kind::matmul_desc))
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "the matmul descriptor is not live");
    const cublasLtMatrixLayout_t lays[4] = {Adesc, Bdesc, Cdesc, Ddesc};
    const char *names = "ABCD";
    for (int i = 0; i < 4; i++)
        if (!alive(lays[i], Kind::layout))
            return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "layout of %c is not live", names[i]);
    const MatmulDesc &d = *reinterpret_cast<const MatmulDesc *>(computeDesc);
    const Layout &A = *reinterpret_cast<const Layout *>(Adesc);
    const Layout &B = *reinterpret_cast<const Layout *>(Bdesc);
    const Layout &C = *reinterpret_cast<const Layout *>(Cdesc);
    const Layout &D = *reinterpret_cast<const Layout *>(Ddesc);
    p->la = &A, p->lb = &B, p->lc = &C, p->ld = &D, p->desc = &d;
    Gemm &g = p->g;

    if (!compute_rounding(d.compute, &g.rounding))
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "compute type %d not emulated", d.compute);
    if (d.scale != CUDA_R_32F)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "scale type %d (want CUDA_R_32F)", d.scale);
    if (d.pointer_mode != CUBLASLT_POINTER_MODE_HOST)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "pointer mode %d not emulated",
                    d.pointer_mode);
    if (!op_ok(d.transa) || !op_ok(d.transb))
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "transa %d / transb %d", d.transa, d.transb);
    if (d.transc != CUBLAS_OP_N)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "transc must be CUBLAS_OP_N");
    for (int i = 0; i < 4; i++) {
        const Layout &L = *reinterpret_cast<const Layout *>(lays[i]);
        if (L.order != CUBLASLT_ORDER_COL)
            return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "%c: order %d not emulated", names[i],
                        L.order);
        if (L.batch_mode != CUBLASLT_BATCH_MODE_STRIDED)
            return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "%c: pointer-array batch not emulated",
                        names[i]);
        if (L.ld < std::max<int64_t>(1, (int64_t)L.rows))
            return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "%c: ld %lld < rows %llu", names[i],
                        (long long)L.ld, (unsigned long long)L.rows);
        if (L.batch < 1 || L.stride < 0)
            return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "%c: batch count %d, stride %lld",
                        names[i], L.batch, (long long)L.stride);
    }
    if (A.type != B.type || C.type != D.type || !supported_types(A.type, C.type))
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                    "types A %u B %u C %u D %u not supported (A = B in 32F or 16BF, C = D in "
                    "32F, or 16BF with 16BF inputs)",
                    A.type, B.type, C.type, D.type);

    g.ta = d.transa != CUBLAS_OP_N;
    g.tb = d.transb != CUBLAS_OP_N;
    g.m = (int64_t)D.rows;
    g.n = (int64_t)D.cols;
    g.k = (int64_t)(g.ta ? A.rows : A.cols);
    int64_t a_m = (int64_t)(g.ta ? A.cols : A.rows);
    int64_t b_k = (int64_t)(g.tb ? B.cols : B.rows), b_n = (int64_t)(g.tb ? B.rows : B.cols);
    if (a_m != g.m || b_k != g.k || b_n != g.n || (int64_t)C.rows != g.m || (int64_t)C.cols != g.n)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                    "shapes disagree: op(A) %lldx%lld, op(B) %lldx%lld, C %llux%llu, D %llux%llu",
                    (long long)a_m, (long long)g.k, (long long)b_k, (long long)b_n,
                    (unsigned long long)C.rows, (unsigned long long)C.cols,
                    (unsigned long long)D.rows, (unsigned long long)D.cols);
    if (A.batch != D.batch || B.batch != D.batch || C.batch != D.batch)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "batch counts A %d B %d C %d D %d differ",
                    A.batch, B.batch, C.batch, D.batch);
    g.ta_type = A.type;
    g.c_type = C.type;
    g.lda = A.ld, g.ldb = B.ld, g.ldc = C.ld, g.ldd = D.ld;
    g.batch = D.batch;
    g.stride_a = A.stride, g.stride_b = B.stride, g.stride_c = C.stride, g.stride_d = D.stride;

    switch (d.epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT: break;
    case CUBLASLT_EPILOGUE_BIAS: g.bias = true; break;
    case CUBLASLT_EPILOGUE_GELU: g.gelu = true; break;
    case CUBLASLT_EPILOGUE_GELU_BIAS: g.bias = g.gelu = true; break;
    case CUBLASLT_EPILOGUE_GELU_AUX: g.gelu = g.aux = true; break;
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: g.bias = g.gelu = g.aux = true; break;
    default: return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "epilogue %u not emulated", d.epilogue);
    }
    if (g.bias) {
        g.bias_ptr = d.bias;
        g.bias_type = d.bias_type == -1 ? D.type : (uint32_t)d.bias_type;
        g.bias_stride = d.bias_batch_stride;
        if (d.bias == nullptr)
            return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                        "a bias epilogue without CUBLASLT_MATMUL_DESC_BIAS_POINTER");
        if (g.bias_type != CUDA_R_32F && g.bias_type != CUDA_R_16BF)
            return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "bias type %u", g.bias_type);
    }
    if (g.aux) {
        g.aux_ptr = d.aux;
        g.aux_ld = d.aux_ld;
        g.aux_stride = d.aux_batch_stride;
        if (d.aux == nullptr)
            return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                        "an aux epilogue without CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER");
        if (d.aux_ld < std::max<int64_t>(1, g.m))
            return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                        "CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD %lld < rows of D %lld",
                        (long long)d.aux_ld, (long long)g.m);
        if (D.batch > 1 && d.aux_batch_stride < 0)
            return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "aux batch stride %lld",
                        (long long)d.aux_batch_stride);
        if (d.aux_type != -1 && (uint32_t)d.aux_type != D.type)
            return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "aux type %d (only D's type emulated)",
                        d.aux_type);
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* The heuristic's verdict for 16-byte-vector kernels: leading dimensions and batch strides in
 * bytes, the promised pointer alignments, the bias pointer. Empty reason: an algorithm exists. */
const char *lt_alignment_problem(const LtProblem &p, const uint32_t align[4]) {
    const Layout *lays[4] = {p.la, p.lb, p.lc, p.ld};
    static const char *const ld_msgs[4] = {"A's ld in bytes", "B's ld in bytes", "C's ld in bytes",
                                           "D's ld in bytes"};
    static const char *const al_msgs[4] = {"A's pointer", "B's pointer", "C's pointer",
                                           "D's pointer"};
    for (int i = 0; i < 4; i++) {
        size_t es = type_size(lays[i]->type);
        if (((size_t)lays[i]->ld * es) % 16 != 0) return ld_msgs[i];
        if (lays[i]->batch > 1 && ((size_t)lays[i]->stride * es) % 16 != 0)
            return "a batch stride in bytes";
        if (align[i] < 16) return al_msgs[i];
    }
    if (p.g.bias && (uintptr_t)p.g.bias_ptr % 16 != 0) return "the bias pointer";
    if (p.g.aux) {
        size_t es = type_size(p.ld->type);
        if (p.g.aux_ld % 8 != 0 || ((size_t)p.g.aux_ld * es) % 16 != 0) return "the aux ld";
        if (p.ld->batch > 1 && ((size_t)p.g.aux_stride * es) % 16 != 0)
            return "the aux batch stride";
        if ((uintptr_t)p.g.aux_ptr % 16 != 0) return "the aux pointer";
    }
    return "";
}

uint64_t fingerprint(const LtProblem &p) {
    const Gemm &g = p.g;
    const int64_t v[] = {g.ta,       g.tb,       g.m,         g.n,        g.k,
                         g.lda,      g.ldb,      g.ldc,       g.ldd,      g.batch,
                         g.ta_type,  g.c_type,   g.bias,      g.gelu,     (int64_t)g.rounding,
                         g.stride_a, g.stride_b, g.stride_c,  g.stride_d, p.desc->compute,
                         g.aux,      g.aux_ld,   g.aux_stride};
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the values */
    for (int64_t x : v)
        for (int i = 0; i < 8; i++) {
            h ^= (uint64_t)(x >> (8 * i)) & 0xff;
            h *= 1099511628211ull;
        }
    return h;
}

uint32_t ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    if (a == 0) return 256;
    uintptr_t low = a & (~a + 1);
    return low >= 256 ? 256u : (uint32_t)low;
}

template <typename T> cublasStatus_t set_value(void *dst, const void *buf, size_t size) {
    if (buf == nullptr || size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(dst, buf, sizeof(T));
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t accept_size(const void *buf, size_t size, size_t want) {
    return buf != nullptr && size == want ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

} /* namespace */

/* ==== cuBLASLt ================================================================================ */

cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t *lightHandle) {
    if (lightHandle == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, __func__, "NULL handle");
    LtHandle *h = new LtHandle();
    track(h, Kind::lt_handle);
    *lightHandle = reinterpret_cast<cublasLtHandle_t>(h);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t lightHandle) {
    if (!untrack(lightHandle, Kind::lt_handle))
        return fail(CUBLAS_STATUS_NOT_INITIALIZED, __func__, "not a live cuBLASLt handle");
    delete reinterpret_cast<LtHandle *>(lightHandle);
    return CUBLAS_STATUS_SUCCESS;
}

const char *CUBLASWINAPI cublasLtGetStatusName(cublasStatus_t status) {
    return cublasGetStatusName(status);
}

const char *CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t status) {
    return cublasGetStatusString(status);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc,
                                                     cublasComputeType_t computeType,
                                                     cudaDataType_t scaleType) {
    if (matmulDesc == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, __func__, "NULL");
    MatmulDesc *d = new MatmulDesc();
    d->compute = computeType; /* checked at use, as the library does */
    d->scale = scaleType;
    track(d, Kind::matmul_desc);
    *matmulDesc = reinterpret_cast<cublasLtMatmulDesc_t>(d);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
    if (!untrack(matmulDesc, Kind::matmul_desc))
        return fail(CUBLAS_STATUS_INVALID_VALUE, __func__, "not a live matmul descriptor");
    delete reinterpret_cast<MatmulDesc *>(matmulDesc);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                           cublasLtMatmulDescAttributes_t attr,
                                                           const void *buf, size_t sizeInBytes) {
    if (!alive(matmulDesc, Kind::matmul_desc))
        return fail(CUBLAS_STATUS_INVALID_VALUE, __func__, "not a live matmul descriptor");
    MatmulDesc &d = *reinterpret_cast<MatmulDesc *>(matmulDesc);
    cublasStatus_t st;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
        st = set_value<int32_t>(&d.compute, buf, sizeInBytes);
        break;
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
        st = set_value<int32_t>(&d.scale, buf, sizeInBytes);
        break;
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
        st = set_value<int32_t>(&d.pointer_mode, buf, sizeInBytes);
        break;
    case CUBLASLT_MATMUL_DESC_TRANSA: st = set_value<int32_t>(&d.transa, buf, sizeInBytes); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: st = set_value<int32_t>(&d.transb, buf, sizeInBytes); break;
    case CUBLASLT_MATMUL_DESC_TRANSC: st = set_value<int32_t>(&d.transc, buf, sizeInBytes); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        st = set_value<uint32_t>(&d.epilogue, buf, sizeInBytes);
        break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        st = set_value<const void *>(&d.bias, buf, sizeInBytes);
        break;
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE:
        st = set_value<int64_t>(&d.bias_batch_stride, buf, sizeInBytes);
        break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
        st = set_value<int32_t>(&d.bias_type, buf, sizeInBytes);
        break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
        st = set_value<void *>(&d.aux, buf, sizeInBytes);
        break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
        st = set_value<int64_t>(&d.aux_ld, buf, sizeInBytes);
        break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE:
        st = set_value<int64_t>(&d.aux_batch_stride, buf, sizeInBytes);
        break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE:
        st = set_value<int32_t>(&d.aux_type, buf, sizeInBytes);
        break;
    /* Tuning knobs that do not change the result: checked for size, otherwise ignored. */
    case CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET: st = accept_size(buf, sizeInBytes, 4); break;
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM: st = accept_size(buf, sizeInBytes, 1); break;
    default:
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, __func__, "attribute %d not emulated", (int)attr);
    }
    if (st != CUBLAS_STATUS_SUCCESS)
        return fail(st, __func__, "attribute %d: buf %p, sizeInBytes %zu is not its size",
                    (int)attr, buf, sizeInBytes);
    return st;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout,
                                                       cudaDataType type, uint64_t rows,
                                                       uint64_t cols, int64_t ld) {
    if (matLayout == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, __func__, "NULL");
    Layout *l = new Layout();
    l->type = type;
    l->rows = rows;
    l->cols = cols;
    l->ld = ld; /* ld >= rows is checked at use, as the library does */
    track(l, Kind::layout);
    *matLayout = reinterpret_cast<cublasLtMatrixLayout_t>(l);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
    if (!untrack(matLayout, Kind::layout))
        return fail(CUBLAS_STATUS_INVALID_VALUE, __func__, "not a live matrix layout");
    delete reinterpret_cast<Layout *>(matLayout);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                             cublasLtMatrixLayoutAttribute_t attr,
                                                             const void *buf, size_t sizeInBytes) {
    if (!alive(matLayout, Kind::layout))
        return fail(CUBLAS_STATUS_INVALID_VALUE, __func__, "not a live matrix layout");
    Layout &l = *reinterpret_cast<Layout *>(matLayout);
    cublasStatus_t st;
    switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: st = set_value<uint32_t>(&l.type, buf, sizeInBytes); break;
    case CUBLASLT_MATRIX_LAYOUT_ORDER: st = set_value<int32_t>(&l.order, buf, sizeInBytes); break;
    case CUBLASLT_MATRIX_LAYOUT_ROWS: st = set_value<uint64_t>(&l.rows, buf, sizeInBytes); break;
    case CUBLASLT_MATRIX_LAYOUT_COLS: st = set_value<uint64_t>(&l.cols, buf, sizeInBytes); break;
    case CUBLASLT_MATRIX_LAYOUT_LD: st = set_value<int64_t>(&l.ld, buf, sizeInBytes); break;
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT:
        st = set_value<int32_t>(&l.batch, buf, sizeInBytes);
        break;
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
        st = set_value<int64_t>(&l.stride, buf, sizeInBytes);
        break;
    case CUBLASLT_MATRIX_LAYOUT_BATCH_MODE:
        st = set_value<uint32_t>(&l.batch_mode, buf, sizeInBytes);
        break;
    default:
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, __func__, "attribute %d not emulated", (int)attr);
    }
    if (st != CUBLAS_STATUS_SUCCESS)
        return fail(st, __func__, "attribute %d: buf %p, sizeInBytes %zu is not its size",
                    (int)attr, buf, sizeInBytes);
    return st;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
    if (pref == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, __func__, "NULL");
    Preference *p = new Preference();
    track(p, Kind::preference);
    *pref = reinterpret_cast<cublasLtMatmulPreference_t>(p);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    if (!untrack(pref, Kind::preference))
        return fail(CUBLAS_STATUS_INVALID_VALUE, __func__, "not a live preference");
    delete reinterpret_cast<Preference *>(pref);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(
    cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
    size_t sizeInBytes) {
    if (!alive(pref, Kind::preference))
        return fail(CUBLAS_STATUS_INVALID_VALUE, __func__, "not a live preference");
    Preference &p = *reinterpret_cast<Preference *>(pref);
    cublasStatus_t st;
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
        st = set_value<uint64_t>(&p.max_workspace, buf, sizeInBytes);
        break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
        st = set_value<uint32_t>(&p.align[0], buf, sizeInBytes);
        break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
        st = set_value<uint32_t>(&p.align[1], buf, sizeInBytes);
        break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
        st = set_value<uint32_t>(&p.align[2], buf, sizeInBytes);
        break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
        st = set_value<uint32_t>(&p.align[3], buf, sizeInBytes);
        break;
    /* Filters on the algorithms offered; the emulated one is a plain, non-split kernel that
     * passes all of them. Checked for size. */
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE:
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: st = accept_size(buf, sizeInBytes, 4); break;
    case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT: st = accept_size(buf, sizeInBytes, 4); break;
    case CUBLASLT_MATMUL_PREF_IMPL_MASK: st = accept_size(buf, sizeInBytes, 8); break;
    default:
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, __func__, "attribute %d not emulated", (int)attr);
    }
    if (st != CUBLAS_STATUS_SUCCESS)
        return fail(st, __func__, "attribute %d: buf %p, sizeInBytes %zu is not its size",
                    (int)attr, buf, sizeInBytes);
    return st;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int *returnAlgoCount) {
    const char *fn = __func__;
    if (!alive(lightHandle, Kind::lt_handle))
        return fail(CUBLAS_STATUS_NOT_INITIALIZED, fn, "not a live cuBLASLt handle");
    if (requestedAlgoCount <= 0 || heuristicResultsArray == nullptr || returnAlgoCount == nullptr)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "requestedAlgoCount %d, results %p, count %p",
                    requestedAlgoCount, (void *)heuristicResultsArray, (void *)returnAlgoCount);
    if (!alive(preference, Kind::preference))
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "not a live preference");
    LtProblem p;
    cublasStatus_t st = lt_validate(fn, operationDesc, Adesc, Bdesc, Cdesc, Ddesc, &p);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    const Preference &pref = *reinterpret_cast<const Preference *>(preference);
    *returnAlgoCount = 0;
    if (*lt_alignment_problem(p, pref.align) != '\0') return CUBLAS_STATUS_SUCCESS;
    cublasLtMatmulHeuristicResult_t &r = heuristicResultsArray[0];
    memset(&r, 0, sizeof r);
    r.algo.data[0] = kAlgoMagic;
    r.algo.data[1] = fingerprint(p);
    r.algo.data[2] = kAlgoAlign;
    r.algo.data[3] = std::min<uint64_t>(kAlgoWorkspace, pref.max_workspace);
    r.workspaceSize = (size_t)r.algo.data[3];
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = 1.0f;
    *returnAlgoCount = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmul(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void *alpha,
    const void *A, cublasLtMatrixLayout_t Adesc, const void *B, cublasLtMatrixLayout_t Bdesc,
    const void *beta, const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
    cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo, void *workspace,
    size_t workspaceSizeInBytes, cudaStream_t stream) {
    const char *fn = __func__;
    if (!alive(lightHandle, Kind::lt_handle))
        return fail(CUBLAS_STATUS_NOT_INITIALIZED, fn, "not a live cuBLASLt handle");
    LtProblem p;
    cublasStatus_t st = lt_validate(fn, computeDesc, Adesc, Bdesc, Cdesc, Ddesc, &p);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    if (alpha == nullptr || beta == nullptr)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "alpha %p, beta %p", alpha, beta);
    Gemm &g = p.g;
    g.alpha = *static_cast<const float *>(alpha); /* host pointer mode: read now */
    g.beta = *static_cast<const float *>(beta);
    g.a = A, g.b = B, g.c = C, g.d = D;

    /* The algorithm: from a heuristic query for this problem, or chosen now when NULL. */
    uint64_t need_align = kAlgoAlign, need_ws = 0;
    if (algo == nullptr) {
        const uint32_t actual[4] = {ptr_align(A), ptr_align(B), ptr_align(C), ptr_align(D)};
        const char *why = lt_alignment_problem(p, actual);
        if (*why != '\0')
            return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                        "no algorithm: %s is not a multiple of 16 bytes", why);
    } else {
        if (algo->data[0] != kAlgoMagic)
            return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                        "algo does not come from cublasLtMatmulAlgoGetHeuristic");
        if (algo->data[1] != fingerprint(p))
            return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                        "algo was chosen for another problem (types, transposes, epilogue, "
                        "shape, leading dimensions or batch differ)");
        need_align = algo->data[2];
        need_ws = algo->data[3];
    }
    const void *ptrs[5] = {A, B, C, D, g.aux ? g.aux_ptr : nullptr};
    static const char *const names[5] = {"A", "B", "C", "D", "the aux matrix"};
    for (int i = 0; i < 5; i++)
        if (i != 2 || g.beta != 0.0f)
            if ((uintptr_t)ptrs[i] % need_align != 0)
                return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                            "%s = %p is not %llu-byte aligned as the algorithm needs (the "
                            "preference's MIN_ALIGNMENT promised more than the pointer has)",
                            names[i], ptrs[i], (unsigned long long)need_align);
    if (workspaceSizeInBytes < need_ws)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                    "workspace of %zu bytes; the algorithm needs %llu", workspaceSizeInBytes,
                    (unsigned long long)need_ws);
    if (need_ws > 0 && !check_device(fn, "workspace", workspace, (int64_t)need_ws, 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    g.workspace = workspace;
    g.workspace_bytes = (size_t)need_ws;

    /* In place (C == D) needs the same layout for both. */
    if (C == D &&
        (p.lc->ld != p.ld->ld || p.lc->type != p.ld->type || p.lc->stride != p.ld->stride))
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "C == D with different layouts");

    const size_t es_ab = type_size(g.ta_type), es_c = type_size(g.c_type);
    const bool read_ab = g.k > 0 && g.alpha != 0.0f;
    if (g.m > 0 && g.n > 0) {
        if (read_ab && (!check_device(fn, "A", A,
                                      extent((int64_t)p.la->rows, (int64_t)p.la->cols, g.lda,
                                             g.batch, g.stride_a),
                                      es_ab) ||
                        !check_device(fn, "B", B,
                                      extent((int64_t)p.lb->rows, (int64_t)p.lb->cols, g.ldb,
                                             g.batch, g.stride_b),
                                      es_ab)))
            return CUBLAS_STATUS_INVALID_VALUE;
        if (g.beta != 0.0f &&
            !check_device(fn, "C", C, extent(g.m, g.n, g.ldc, g.batch, g.stride_c), es_c))
            return CUBLAS_STATUS_INVALID_VALUE;
        if (!check_device(fn, "D", D, extent(g.m, g.n, g.ldd, g.batch, g.stride_d), es_c))
            return CUBLAS_STATUS_INVALID_VALUE;
        if (g.bias && !check_device(fn, "bias", g.bias_ptr, (g.batch - 1) * g.bias_stride + g.m,
                                    type_size(g.bias_type)))
            return CUBLAS_STATUS_INVALID_VALUE;
        if (g.aux && !check_device(fn, "aux", g.aux_ptr,
                                   extent(g.m, g.n, g.aux_ld, g.batch, g.aux_stride), es_c))
            return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (g.m == 0 || g.n == 0) return CUBLAS_STATUS_SUCCESS;
    cuemu_stream_enqueue(stream, [g]() { g.run(); });
    return CUBLAS_STATUS_SUCCESS;
}

/* ==== cuBLAS ================================================================================== */

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t *handle) {
    if (handle == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, __func__, "NULL handle");
    BlasHandle *h = new BlasHandle();
    track(h, Kind::blas_handle);
    *handle = reinterpret_cast<cublasHandle_t>(h);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) {
    if (!untrack(handle, Kind::blas_handle))
        return fail(CUBLAS_STATUS_NOT_INITIALIZED, __func__, "not a live cuBLAS handle");
    delete reinterpret_cast<BlasHandle *>(handle);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId) {
    if (!alive(handle, Kind::blas_handle))
        return fail(CUBLAS_STATUS_NOT_INITIALIZED, __func__, "not a live cuBLAS handle");
    reinterpret_cast<BlasHandle *>(handle)->stream = streamId;
    return CUBLAS_STATUS_SUCCESS;
}

/* The workspace is recorded only: the stand-in's GEMMs need none. It must be device memory. */
cublasStatus_t CUBLASWINAPI cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace,
                                                  size_t workspaceSizeInBytes) {
    if (!alive(handle, Kind::blas_handle))
        return fail(CUBLAS_STATUS_NOT_INITIALIZED, __func__, "not a live cuBLAS handle");
    if (workspaceSizeInBytes && !cuemu_is_device_pointer(workspace, workspaceSizeInBytes))
        return fail(CUBLAS_STATUS_INVALID_VALUE, __func__, "%zu bytes at %p are not device memory",
                    workspaceSizeInBytes, workspace);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *streamId) {
    if (!alive(handle, Kind::blas_handle))
        return fail(CUBLAS_STATUS_NOT_INITIALIZED, __func__, "not a live cuBLAS handle");
    if (streamId == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, __func__, "NULL");
    *streamId = reinterpret_cast<BlasHandle *>(handle)->stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    if (!alive(handle, Kind::blas_handle))
        return fail(CUBLAS_STATUS_NOT_INITIALIZED, __func__, "not a live cuBLAS handle");
    int base = (int)mode & 0xf;
    if (base != CUBLAS_DEFAULT_MATH && base != CUBLAS_PEDANTIC_MATH &&
        base != CUBLAS_TF32_TENSOR_OP_MATH && base != CUBLAS_TENSOR_OP_MATH &&
        base != CUBLAS_FP32_EMULATED_BF16X9_MATH)
        return fail(CUBLAS_STATUS_INVALID_VALUE, __func__, "math mode %d", (int)mode);
    reinterpret_cast<BlasHandle *>(handle)->math_mode = (int)mode;
    return CUBLAS_STATUS_SUCCESS;
}

const char *CUBLASWINAPI cublasGetStatusName(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "unrecognized status";
}

/* The strings libcublas 13 returns. */
const char *CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "an unsupported value or parameter was passed to the function";
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return "the function requires an architectural feature absent from the device";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the function failed to launch on the GPU";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the requested functionality is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "the license check failed";
    }
    return "unrecognized status";
}

cublasStatus_t CUBLASWINAPI cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const void *alpha, const void *A, cudaDataType Atype,
                                         int lda, const void *B, cudaDataType Btype, int ldb,
                                         const void *beta, void *C, cudaDataType Ctype, int ldc,
                                         cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    const char *fn = __func__;
    if (!alive(handle, Kind::blas_handle))
        return fail(CUBLAS_STATUS_NOT_INITIALIZED, fn, "not a live cuBLAS handle");
    const BlasHandle &h = *reinterpret_cast<const BlasHandle *>(handle);
    if (!op_ok(transa) || !op_ok(transb))
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "transa %d / transb %d", (int)transa,
                    (int)transb);
    const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
    /* The BLAS argument checks, in the reference BLAS order. */
    if (m < 0 || n < 0 || k < 0)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "m %d n %d k %d", m, n, k);
    if (lda < std::max(1, ta ? k : m))
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "lda %d < max(1, %d)", lda, ta ? k : m);
    if (ldb < std::max(1, tb ? n : k))
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "ldb %d < max(1, %d)", ldb, tb ? n : k);
    if (ldc < std::max(1, m))
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "ldc %d < max(1, %d)", ldc, m);
    if (Atype != Btype || !supported_types(Atype, Ctype))
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "types A %d B %d C %d not supported",
                    (int)Atype, (int)Btype, (int)Ctype);
    Gemm g;
    if (!compute_rounding(computeType, &g.rounding))
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "compute type %d not emulated",
                    (int)computeType);
    if (computeType == CUBLAS_COMPUTE_32F && (h.math_mode & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH)
        g.rounding = InputRounding::tf32; /* the handle allows TF32 for fp32 inputs */
    if (!((algo >= CUBLAS_GEMM_DEFAULT && algo <= CUBLAS_GEMM_ALGO23) ||
          (algo >= CUBLAS_GEMM_DEFAULT_TENSOR_OP && algo <= CUBLAS_GEMM_ALGO15_TENSOR_OP)))
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "algo %d", (int)algo);
    if (alpha == nullptr || beta == nullptr)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "alpha %p, beta %p", alpha, beta);
    g.alpha = *static_cast<const float *>(alpha);
    g.beta = *static_cast<const float *>(beta);
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    if ((g.alpha == 0.0f || k == 0) && g.beta == 1.0f) return CUBLAS_STATUS_SUCCESS;

    g.ta = ta, g.tb = tb;
    g.m = m, g.n = n, g.k = k;
    g.a = A, g.b = B, g.c = C, g.d = C;
    g.ta_type = Atype, g.c_type = Ctype;
    g.lda = lda, g.ldb = ldb, g.ldc = ldc, g.ldd = ldc;
    const size_t es_ab = type_size(Atype), es_c = type_size(Ctype);
    if (k > 0 && g.alpha != 0.0f &&
        (!check_device(fn, "A", A, extent(ta ? k : m, ta ? m : k, lda, 1, 0), es_ab) ||
         !check_device(fn, "B", B, extent(tb ? n : k, tb ? k : n, ldb, 1, 0), es_ab)))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!check_device(fn, "C", C, extent(m, n, ldc, 1, 0), es_c))
        return CUBLAS_STATUS_INVALID_VALUE;
    cuemu_stream_enqueue(h.stream, [g]() { g.run(); });
    return CUBLAS_STATUS_SUCCESS;
}

namespace {

/* One problem of a grouped call, fully described at the call but for its three matrix pointers,
 * which the library reads from the device pointer arrays when the stream reaches the work. */
struct GroupedProblem {
    Gemm g;
    int group;
};

[[noreturn]] void grouped_fault(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void grouped_fault(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cublas_emu: cublasGemmGroupedBatchedEx, running on its stream: %s\n", msg);
    abort();
}

/* What a grouped call's kernels do on the device: read each problem's pointers from the arrays
 * (as they are now), fault on an operand that is not device memory, a pointer the documented
 * alignment rule refuses, or overlapping C matrices, then compute each problem as cublasGemmEx
 * would (the same Gemm::run). */
void grouped_run(const std::vector<GroupedProblem> &problems, const void *const *Aarray,
                 const void *const *Barray, void *const *Carray, bool align_rule) {
    const size_t count = problems.size();
    std::vector<std::pair<uintptr_t, uintptr_t>> written; /* [begin, end) of each C */
    std::vector<Gemm> gs(count);
    for (size_t idx = 0; idx < count; idx++) {
        Gemm g = problems[idx].g;
        g.a = Aarray[idx], g.b = Barray[idx], g.c = Carray[idx], g.d = Carray[idx];
        gs[idx] = g;
        if (g.m == 0 || g.n == 0) continue;
        const bool read_ab = g.k > 0 && g.alpha != 0.0f;
        const bool touch_c = !((g.alpha == 0.0f || g.k == 0) && g.beta == 1.0f);
        const size_t es_ab = type_size(g.ta_type), es_c = type_size(g.c_type);
        const int64_t ea = extent(g.ta ? g.k : g.m, g.ta ? g.m : g.k, g.lda, 1, 0);
        const int64_t eb = extent(g.tb ? g.n : g.k, g.tb ? g.k : g.n, g.ldb, 1, 0);
        const int64_t ec = extent(g.m, g.n, g.ldc, 1, 0);
        const void *ops[3] = {g.a, g.b, g.c};
        const int64_t bytes[3] = {(int64_t)(ea * es_ab), (int64_t)(eb * es_ab),
                                  (int64_t)(ec * es_c)};
        const bool used[3] = {read_ab, read_ab, touch_c};
        static const char *const names[3] = {"A", "B", "C"};
        for (int o = 0; o < 3; o++) {
            if (!used[o]) continue;
            if (ops[o] == nullptr || !cuemu_is_device_pointer(ops[o], (size_t)bytes[o]))
                grouped_fault("problem %zu (group %d): %sarray[%zu] = %p (%lld bytes) is not "
                              "device memory: an illegal address on a GPU (a host pointer, or "
                              "pointer arrays not yet, or no longer, holding this call's "
                              "pointers when it ran)",
                              idx, problems[idx].group, names[o], idx, ops[o], (long long)bytes[o]);
            /* The documented rule for 16-bit types and FAST compute types. */
            const size_t kb = (size_t)g.k * es_ab;
            const uintptr_t need = kb % 16 == 0 ? 16 : kb % 4 == 0 ? 4 : 1;
            if (align_rule && (uintptr_t)ops[o] % need != 0)
                grouped_fault("problem %zu (group %d): %s = %p is not %zu-byte aligned (k = %lld "
                              "elements of %zu bytes): a misaligned address on a GPU",
                              idx, problems[idx].group, names[o], ops[o], (size_t)need,
                              (long long)g.k, es_ab);
        }
        if (touch_c) written.push_back({(uintptr_t)g.c, (uintptr_t)g.c + (uintptr_t)bytes[2]});
    }
    std::sort(written.begin(), written.end());
    for (size_t i = 1; i < written.size(); i++)
        if (written[i].first < written[i - 1].second)
            grouped_fault("two C matrices overlap (%p and %p): undefined behaviour in the "
                          "library (the problems must be independent)",
                          (void *)written[i - 1].first, (void *)written[i].first);
    for (size_t idx = 0; idx < count; idx++) {
        const Gemm &g = gs[idx];
        if (g.m == 0 || g.n == 0) continue;
        if ((g.alpha == 0.0f || g.k == 0) && g.beta == 1.0f) continue; /* as cublasGemmEx */
        g.run();
    }
}

} // namespace

cublasStatus_t CUBLASWINAPI cublasGemmGroupedBatchedEx(
    cublasHandle_t handle, const cublasOperation_t transa_array[],
    const cublasOperation_t transb_array[], const int m_array[], const int n_array[],
    const int k_array[], const void *alpha_array, const void *const Aarray[], cudaDataType_t Atype,
    const int lda_array[], const void *const Barray[], cudaDataType_t Btype, const int ldb_array[],
    const void *beta_array, void *const Carray[], cudaDataType_t Ctype, const int ldc_array[],
    int group_count, const int group_size[], cublasComputeType_t computeType) {
    const char *fn = __func__;
    if (!alive(handle, Kind::blas_handle))
        return fail(CUBLAS_STATUS_NOT_INITIALIZED, fn, "not a live cuBLAS handle");
    const BlasHandle &h = *reinterpret_cast<const BlasHandle *>(handle);
    /* The documented INVALID_VALUE checks: the host arrays, then each group. */
    if (!transa_array || !transb_array || !m_array || !n_array || !k_array || !alpha_array ||
        !lda_array || !ldb_array || !beta_array || !ldc_array || !group_size)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "a NULL per-group array");
    if (group_count < 0)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "group_count %d", group_count);
    for (int i = 0; i < group_count; i++) {
        const int m = m_array[i], n = n_array[i], k = k_array[i];
        if (m < 0 || n < 0 || k < 0 || group_size[i] < 0)
            return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "group %d: m %d n %d k %d group_size %d",
                        i, m, n, k, group_size[i]);
        if (!op_ok(transa_array[i]) || !op_ok(transb_array[i]))
            return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "group %d: transa %d / transb %d", i,
                        (int)transa_array[i], (int)transb_array[i]);
        const bool ta = transa_array[i] != CUBLAS_OP_N, tb = transb_array[i] != CUBLAS_OP_N;
        if (lda_array[i] < std::max(1, ta ? k : m))
            return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "group %d: lda %d < max(1, %d)", i,
                        lda_array[i], ta ? k : m);
        if (ldb_array[i] < std::max(1, tb ? n : k))
            return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "group %d: ldb %d < max(1, %d)", i,
                        ldb_array[i], tb ? n : k);
        if (ldc_array[i] < std::max(1, m))
            return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "group %d: ldc %d < max(1, %d)", i,
                        ldc_array[i], m);
    }
    /* The documented type table (of the types emulated): CUBLAS_COMPUTE_32F with A = B = C in
     * 32F or in 16BF; _PEDANTIC and _FAST_TF32 with 32F only. No 16BF -> 32F, unlike
     * cublasGemmEx. Scale type CUDA_R_32F. */
    Gemm proto;
    const bool types_ok =
        Atype == Btype && Atype == Ctype && (Atype == CUDA_R_32F || Atype == CUDA_R_16BF);
    const bool compute_ok = computeType == CUBLAS_COMPUTE_32F ||
                            (Atype == CUDA_R_32F && (computeType == CUBLAS_COMPUTE_32F_PEDANTIC ||
                                                     computeType == CUBLAS_COMPUTE_32F_FAST_TF32));
    if (!types_ok || !compute_ok || !compute_rounding(computeType, &proto.rounding))
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                    "types A %d B %d C %d with compute type %d not supported (A = B = C in 32F "
                    "or 16BF under CUBLAS_COMPUTE_32F)",
                    (int)Atype, (int)Btype, (int)Ctype, (int)computeType);
    if (computeType == CUBLAS_COMPUTE_32F && (h.math_mode & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH)
        proto.rounding = InputRounding::tf32; /* the handle allows TF32 for fp32 inputs */
    proto.ta_type = Atype, proto.c_type = Ctype;

    /* Every problem, described now: the per-group arrays and the scalars are host memory, read
     * during the call (host pointer mode). */
    const float *alphas = static_cast<const float *>(alpha_array);
    const float *betas = static_cast<const float *>(beta_array);
    std::vector<GroupedProblem> problems;
    for (int i = 0; i < group_count; i++)
        for (int j = 0; j < group_size[i]; j++) {
            GroupedProblem p{proto, i};
            Gemm &g = p.g;
            g.ta = transa_array[i] != CUBLAS_OP_N, g.tb = transb_array[i] != CUBLAS_OP_N;
            g.m = m_array[i], g.n = n_array[i], g.k = k_array[i];
            g.alpha = alphas[i], g.beta = betas[i];
            g.lda = lda_array[i], g.ldb = ldb_array[i], g.ldc = ldc_array[i], g.ldd = ldc_array[i];
            problems.push_back(p);
        }
    if (problems.empty()) return CUBLAS_STATUS_SUCCESS;
    /* The pointer arrays are device memory, read by the library's kernels when they run. */
    const size_t array_bytes = problems.size() * sizeof(void *);
    if (!check_device(fn, "Aarray", Aarray, 1, array_bytes) ||
        !check_device(fn, "Barray", Barray, 1, array_bytes) ||
        !check_device(fn, "Carray", Carray, 1, array_bytes))
        return CUBLAS_STATUS_INVALID_VALUE;
    const bool align_rule = Atype == CUDA_R_16BF || computeType == CUBLAS_COMPUTE_32F_FAST_TF32;
    cuemu_stream_enqueue(h.stream, [problems, Aarray, Barray, Carray, align_rule]() {
        grouped_run(problems, Aarray, Barray, Carray, align_rule);
    });
    return CUBLAS_STATUS_SUCCESS;
}
