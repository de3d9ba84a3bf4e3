/*
 * cuemu.h — the CPU emulator of CUDA kernels (cuda/README.md, Kernel files). ct_cuda.h includes it
 * when the compiler is not nvcc, so a .cu file compiles unchanged with g++ and its kernels run on
 * the CPU, with the checks a GPU test would need and a CPU cannot give for free:
 *
 *   - every CUDA thread of a block is a fiber; __syncthreads is a real block barrier, and warp
 *     shuffles, votes and __syncwarp are computed when every lane named in the mask has arrived
 *     (warps are not run in lockstep: Volta+ semantics);
 *   - warps run in ascending, descending or seeded random order (CUEMU_ORDER, cuemu_set_order),
 *     so a missing barrier gives a wrong result in at least one order;
 *   - errors a GPU hides or turns into hangs abort with the kernel, block and thread named: a mask
 *     naming an exited lane, mismatched warp operations, a __syncthreads that part of the block
 *     never reaches because it exited (strict mode, the default; CUEMU_STRICT=0 turns it off),
 *     a deadlock, more than 48 KB of static shared memory;
 *   - shared memory (CT_SHARED, CT_DYN_SHARED) is poisoned with NaN at every block start, device
 *     allocations with NaN at cudaMalloc: a read before a write shows;
 *   - launches are validated like a GPU's (cudaGetLastError reports a bad one) and run lazily on
 *     their stream, at the sync point that needs them (cudart_emu.cc): a missing sync shows.
 *
 * Blocks run one after another on the OS thread that reaches the sync point, so a run is
 * deterministic for a given order (atomics included). What it cannot catch: cuda/emu/README.md.
 *
 * Kernel files do not include this header themselves: they include cuda/ct_cuda.h.
 */
#ifndef CT_CUEMU_H
#define CT_CUEMU_H

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

/* ---- execution-space keywords -------------------------------------------------------------- */
/* The CUDA headers already turn __global__, __device__, __host__, __forceinline__, __noinline__
 * and __restrict__ into host-compiler spellings; these two they leave to nvcc. */
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
/* A raw __shared__ variable is one per block because blocks run one after another on one OS
 * thread; it is not poisoned between blocks, which is why kernels use CT_SHARED instead. */
#undef __shared__
#define __shared__ static thread_local
#ifndef __constant__
#define __constant__
#endif

/* ---- built-in variables -------------------------------------------------------------------- */
/* The scheduler rewrites these before it resumes a fiber; only one fiber runs at a time. The
 * CUDA headers declare the real names as extern const, so the macros point elsewhere. */
extern uint3 cuemu_thread_idx;
extern uint3 cuemu_block_idx;
extern dim3 cuemu_block_dim;
extern dim3 cuemu_grid_dim;
#define threadIdx cuemu_thread_idx
#define blockIdx cuemu_block_idx
#define blockDim cuemu_block_dim
#define gridDim cuemu_grid_dim
/* warpSize needs no macro: cuemu.cc defines the `extern const int warpSize` the headers declare. */

/* ---- the public API of the emulator -------------------------------------------------------- */
enum cuemu_order { CUEMU_ORDER_ASCENDING, CUEMU_ORDER_DESCENDING, CUEMU_ORDER_RANDOM };

/* The order in which warps (and the lanes of a warp, and blocks) are run from now on. The default
 * comes from CUEMU_ORDER=ascending|descending|random:SEED (ascending when unset). */
void cuemu_set_order(cuemu_order order, unsigned seed);

/* Appends host work (a library stand-in's GEMM, say) to a stream's queue: it runs in stream order,
 * at the sync point that needs it, like a kernel. Stream 0 is the legacy default stream. Work may
 * call the runtime: what it queues (copies, launches) runs at once, inside it, and the sync points
 * it reaches drain nothing, so stream order holds. */
void cuemu_stream_enqueue(cudaStream_t stream, std::function<void()> work);
/* The same for work that waits on something outside the process (the NCCL stand-in's MPI
 * requests): `work` is called when the stream reaches it and again until it returns true;
 * queries stop at it while it returns false, synchronizations keep calling it. */
void cuemu_stream_enqueue_poll(cudaStream_t stream, std::function<bool()> work);

/* True when [p, p + bytes) lies inside one live cudaMalloc allocation. */
bool cuemu_is_device_pointer(const void *p, size_t bytes);

/* CUDA threads run since the process started (for speed reports). */
uint64_t cuemu_threads_run();

/* ---- barriers, warp shuffles and votes ----------------------------------------------------- */
void __syncthreads();
int __syncthreads_count(int predicate);
int __syncthreads_and(int predicate);
int __syncthreads_or(int predicate);
void __syncwarp(unsigned mask = 0xffffffffu);
unsigned __activemask();
unsigned __ballot_sync(unsigned mask, int predicate);
int __any_sync(unsigned mask, int predicate);
int __all_sync(unsigned mask, int predicate);
void __threadfence();
void __threadfence_block();
void __threadfence_system();

enum cuemu_warp_op { CUEMU_SHFL_IDX, CUEMU_SHFL_UP, CUEMU_SHFL_DOWN, CUEMU_SHFL_XOR };
/* Waits until every lane in mask arrives at the same shuffle; returns the source lane's bits. */
uint64_t cuemu_shuffle(cuemu_warp_op op, unsigned mask, uint64_t bits, int arg, int width);

template <typename T>
static inline T cuemu_shuffle_value(cuemu_warp_op op, unsigned mask, T var, int arg, int width) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
                  "warp shuffles move at most 8 bytes of a trivially copyable type");
    uint64_t bits = 0;
    std::memcpy(&bits, &var, sizeof(T));
    bits = cuemu_shuffle(op, mask, bits, arg, width);
    T out;
    std::memcpy(&out, &bits, sizeof(T));
    return out;
}
template <typename T>
static inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
    return cuemu_shuffle_value(CUEMU_SHFL_IDX, mask, var, src_lane, width);
}
template <typename T>
static inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    return cuemu_shuffle_value(CUEMU_SHFL_UP, mask, var, (int)delta, width);
}
template <typename T>
static inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    return cuemu_shuffle_value(CUEMU_SHFL_DOWN, mask, var, (int)delta, width);
}
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
    return cuemu_shuffle_value(CUEMU_SHFL_XOR, mask, var, lane_mask, width);
}

/* A warp-wide instruction (mma.sync, ldmatrix: .aligned, so all 32 lanes take part): each lane
 * arrives with its own argument block; when all 32 have, fn runs once with the blocks in lane
 * order, before any lane resumes, so it reads every lane's inputs and writes every lane's
 * outputs. Lanes at different collectives (another fn) or an exited lane abort, naming `name`.
 * The instructions built on it: cuda/emu/mma_emu.cc. */
typedef void (*cuemu_collective_fn)(void *const lane_args[32]);
void cuemu_warp_collective(const char *name, cuemu_collective_fn fn, void *lane_args);

/* Tensor-core and matrix-load instructions with the register fragments of the PTX ISA
 * (cuda/emu/mma_emu.cc; cuda/ct_mma.cuh is what kernels call):
 *   mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32  d = a·b + c (a 16x16, b 16x8, c 16x8)
 *   ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16 (row addresses from lanes 0..8n-1) */
void cuemu_mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2],
                             const float c[4]);
void cuemu_ldmatrix(uint32_t *r, int n_matrices, bool trans, const void *row_address);
/* Hopper's warpgroup MMA (cuda/ct_wgmma.cuh): wgmma.mma_async.m64nNk16.f32.bf16.bf16, D (n/2
 * floats a thread) = A·B + (scale_d ? D : 0), A from the thread's registers a_regs (NULL: from
 * shared memory through a_desc) and B through b_desc, with the layouts of ct_wgmma.cuh. Blocks of
 * exactly one warpgroup (128 threads) only. Asynchronous: queued at issue and run at the wait
 * that needs it, for all 128 threads (every thread's descriptors and flags must agree), with
 * checks for operands changed in flight, D read or written before the wait, a missing
 * wgmma.fence, and a block that ends with a product not waited for (mma_emu.cc). */
void cuemu_wgmma_bf16(float *d, int n, const uint32_t *a_regs, uint64_t a_desc, uint64_t b_desc,
                      bool scale_d, bool trans_a, bool trans_b);
/* wgmma.fence, wgmma.commit_group and wgmma.wait_group n_pending (all but the n_pending newest
 * groups done), as mma_emu.cc emulates them: a wait is met by the whole block. */
void cuemu_wgmma_fence();
void cuemu_wgmma_commit();
void cuemu_wgmma_wait(int n_pending);
/* Called by the emulator as each block ends: aborts for a wgmma never waited for. */
void cuemu_wgmma_block_end();
/* p's address in the shared window: its offset in the block's dynamic shared memory (aborts for
 * any other pointer). */
uint32_t cuemu_smem_address(const void *p);

/* Asynchronous copies from global to shared memory (cp.async; cuda/ct_async.cuh is what kernels
 * call): one copy of `bytes` (4, 8 or 16) from src, or zeros when fill is false; the thread's
 * copies since its last commit become a group; wait lands every group but the n_pending newest.
 * When a group lands, between its issue and its wait, depends on the order (cuemu.cc). */
void cuemu_cp_async(void *dst, const void *src, unsigned bytes, bool fill);
void cuemu_cp_async_commit();
void cuemu_cp_async_wait(int n_pending);

/* ---- shared memory ------------------------------------------------------------------------- */
/* True when [p, p + bytes) lies in the running block's shared memory (dynamic or static). */
bool cuemu_is_shared_pointer(const void *p, size_t bytes);

/* This block's dynamic shared memory (the launch's smem_bytes), poisoned at every block start. */
void *cuemu_dynamic_shared();
/* The static shared array declared at `site` (one per declaration, whichever thread asks first
 * places it), poisoned at every block start; more than 48 KB in a block aborts. */
void *cuemu_static_shared(const void *site, size_t bytes, size_t align, const char *name);

#define CT_DYN_SHARED(type, name) type *name = static_cast<type *>(cuemu_dynamic_shared())
/* A pointer, not an array, in the emulator: sizeof(name) differs from nvcc's, so size from count.
 */
#define CT_SHARED(type, name, count)                                                               \
    static char name##_cuemu_site;                                                                 \
    type *name = static_cast<type *>(cuemu_static_shared(                                          \
        &name##_cuemu_site, sizeof(type) * (size_t)(count), alignof(type), #name))

/* ---- atomics ------------------------------------------------------------------------------- */
/* One OS thread runs every fiber and fibers switch only at barriers and warp operations, so a
 * plain read-modify-write is atomic, and the order of a float atomicAdd is fixed per run. */
template <typename T> static inline T cuemu_atomic_add(T *address, T value) {
    T old = *address;
    *address = old + value;
    return old;
}
static inline int atomicAdd(int *a, int v) {
    return cuemu_atomic_add(a, v);
}
static inline unsigned atomicAdd(unsigned *a, unsigned v) {
    return cuemu_atomic_add(a, v);
}
static inline unsigned long long atomicAdd(unsigned long long *a, unsigned long long v) {
    return cuemu_atomic_add(a, v);
}
static inline float atomicAdd(float *a, float v) {
    return cuemu_atomic_add(a, v);
}
static inline double atomicAdd(double *a, double v) {
    return cuemu_atomic_add(a, v);
}
static inline __nv_bfloat16 atomicAdd(__nv_bfloat16 *a, __nv_bfloat16 v) {
    __nv_bfloat16 old = *a;
    *a = __float2bfloat16(__bfloat162float(old) + __bfloat162float(v));
    return old;
}
static inline __nv_bfloat162 atomicAdd(__nv_bfloat162 *a, __nv_bfloat162 v) {
    __nv_bfloat162 old = *a;
    a->x = __float2bfloat16(__bfloat162float(old.x) + __bfloat162float(v.x));
    a->y = __float2bfloat16(__bfloat162float(old.y) + __bfloat162float(v.y));
    return old;
}
static inline int atomicSub(int *a, int v) {
    return cuemu_atomic_add(a, -v);
}
static inline unsigned atomicSub(unsigned *a, unsigned v) {
    return cuemu_atomic_add(a, 0u - v);
}
template <typename T> static inline T cuemu_atomic_max(T *a, T v) {
    T old = *a;
    if (v > old) *a = v;
    return old;
}
template <typename T> static inline T cuemu_atomic_min(T *a, T v) {
    T old = *a;
    if (v < old) *a = v;
    return old;
}
static inline int atomicMax(int *a, int v) {
    return cuemu_atomic_max(a, v);
}
static inline unsigned atomicMax(unsigned *a, unsigned v) {
    return cuemu_atomic_max(a, v);
}
static inline long long atomicMax(long long *a, long long v) {
    return cuemu_atomic_max(a, v);
}
static inline unsigned long long atomicMax(unsigned long long *a, unsigned long long v) {
    return cuemu_atomic_max(a, v);
}
static inline int atomicMin(int *a, int v) {
    return cuemu_atomic_min(a, v);
}
static inline unsigned atomicMin(unsigned *a, unsigned v) {
    return cuemu_atomic_min(a, v);
}
static inline long long atomicMin(long long *a, long long v) {
    return cuemu_atomic_min(a, v);
}
static inline unsigned long long atomicMin(unsigned long long *a, unsigned long long v) {
    return cuemu_atomic_min(a, v);
}
template <typename T> static inline T cuemu_atomic_cas(T *a, T compare, T value) {
    T old = *a;
    if (old == compare) *a = value;
    return old;
}
static inline int atomicCAS(int *a, int c, int v) {
    return cuemu_atomic_cas(a, c, v);
}
static inline unsigned atomicCAS(unsigned *a, unsigned c, unsigned v) {
    return cuemu_atomic_cas(a, c, v);
}
static inline unsigned long long atomicCAS(unsigned long long *a, unsigned long long c,
                                           unsigned long long v) {
    return cuemu_atomic_cas(a, c, v);
}
template <typename T> static inline T cuemu_atomic_exch(T *a, T v) {
    T old = *a;
    *a = v;
    return old;
}
static inline int atomicExch(int *a, int v) {
    return cuemu_atomic_exch(a, v);
}
static inline unsigned atomicExch(unsigned *a, unsigned v) {
    return cuemu_atomic_exch(a, v);
}
static inline unsigned long long atomicExch(unsigned long long *a, unsigned long long v) {
    return cuemu_atomic_exch(a, v);
}
static inline float atomicExch(float *a, float v) {
    return cuemu_atomic_exch(a, v);
}
static inline int atomicAnd(int *a, int v) {
    int o = *a;
    *a = o & v;
    return o;
}
static inline unsigned atomicAnd(unsigned *a, unsigned v) {
    unsigned o = *a;
    *a = o & v;
    return o;
}
static inline int atomicOr(int *a, int v) {
    int o = *a;
    *a = o | v;
    return o;
}
static inline unsigned atomicOr(unsigned *a, unsigned v) {
    unsigned o = *a;
    *a = o | v;
    return o;
}
static inline int atomicXor(int *a, int v) {
    int o = *a;
    *a = o ^ v;
    return o;
}
static inline unsigned atomicXor(unsigned *a, unsigned v) {
    unsigned o = *a;
    *a = o ^ v;
    return o;
}

/* ---- device math that host libm lacks ------------------------------------------------------ */
/* Host math is more exact than nvcc's fast intrinsics (__expf, rsqrtf): tests need tolerances. */
static inline float rsqrtf(float x) {
    return 1.0f / sqrtf(x);
}
static inline double rsqrt(double x) {
    return 1.0 / sqrt(x);
}
/* glibc's <math.h> declares __expf and the like (extern "C", noexcept) but libm does not export
 * them: these inline definitions complete those declarations. */
inline float __expf(float x) noexcept {
    return expf(x);
}
inline float __logf(float x) noexcept {
    return logf(x);
}
inline float __log2f(float x) noexcept {
    return log2f(x);
}
inline float __powf(float x, float y) noexcept {
    return powf(x, y);
}
inline float __sinf(float x) noexcept {
    return sinf(x);
}
inline float __cosf(float x) noexcept {
    return cosf(x);
}
inline float __tanf(float x) noexcept {
    return tanf(x);
}
static inline float __fdividef(float a, float b) {
    return a / b;
}
static inline float __frcp_rn(float x) {
    return 1.0f / x;
}
static inline float __fsqrt_rn(float x) {
    return sqrtf(x);
}
static inline float __frsqrt_rn(float x) {
    return 1.0f / sqrtf(x);
}
static inline float __fmaf_rn(float a, float b, float c) {
    return fmaf(a, b, c);
}
static inline float __fmul_rn(float a, float b) {
    return a * b;
}
static inline float __fadd_rn(float a, float b) {
    return a + b;
}
static inline float __fsub_rn(float a, float b) {
    return a - b;
}
static inline float __saturatef(float x) {
    return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f;
}
static inline int __float_as_int(float x) {
    int i;
    std::memcpy(&i, &x, 4);
    return i;
}
static inline float __int_as_float(int i) {
    float x;
    std::memcpy(&x, &i, 4);
    return x;
}
static inline unsigned __float_as_uint(float x) {
    unsigned u;
    std::memcpy(&u, &x, 4);
    return u;
}
static inline float __uint_as_float(unsigned u) {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}
static inline long long __double_as_longlong(double x) {
    long long i;
    std::memcpy(&i, &x, 8);
    return i;
}
static inline double __longlong_as_double(long long i) {
    double x;
    std::memcpy(&x, &i, 8);
    return x;
}
static inline int __float2int_rn(float x) {
    return (int)nearbyintf(x);
}
static inline int __float2int_rz(float x) {
    return (int)x;
}
static inline int __float2int_rd(float x) {
    return (int)floorf(x);
}
static inline int __float2int_ru(float x) {
    return (int)ceilf(x);
}
static inline float __int2float_rn(int i) {
    return (float)i;
}
static inline int __popc(unsigned x) {
    return __builtin_popcount(x);
}
static inline int __popcll(unsigned long long x) {
    return __builtin_popcountll(x);
}
static inline int __clz(int x) {
    return x ? __builtin_clz((unsigned)x) : 32;
}
static inline int __clzll(long long x) {
    return x ? __builtin_clzll((unsigned long long)x) : 64;
}
static inline int __ffs(int x) {
    return __builtin_ffs(x);
}
static inline int __ffsll(long long x) {
    return __builtin_ffsll(x);
}
static inline unsigned __brev(unsigned x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0F0F0F0Fu) | ((x & 0x0F0F0F0Fu) << 4);
    return __builtin_bswap32(x);
}
static inline unsigned __umulhi(unsigned a, unsigned b) {
    return (unsigned)(((unsigned long long)a * b) >> 32);
}
template <typename T> static inline T __ldg(const T *p) {
    return *p;
}

/* nvcc's min/max overload set (crt/math_functions.h), so the same calls resolve the same way. */
#define CUEMU_MINMAX(R, A, B)                                                                      \
    static inline R min(const A a, const B b) {                                                    \
        return (R)a < (R)b ? (R)a : (R)b;                                                          \
    }                                                                                              \
    static inline R max(const A a, const B b) {                                                    \
        return (R)a > (R)b ? (R)a : (R)b;                                                          \
    }
CUEMU_MINMAX(int, int, int)
CUEMU_MINMAX(unsigned, unsigned, unsigned)
CUEMU_MINMAX(unsigned, int, unsigned)
CUEMU_MINMAX(unsigned, unsigned, int)
CUEMU_MINMAX(long, long, long)
CUEMU_MINMAX(unsigned long, unsigned long, unsigned long)
CUEMU_MINMAX(unsigned long, long, unsigned long)
CUEMU_MINMAX(unsigned long, unsigned long, long)
CUEMU_MINMAX(long long, long long, long long)
CUEMU_MINMAX(unsigned long long, unsigned long long, unsigned long long)
CUEMU_MINMAX(unsigned long long, long long, unsigned long long)
CUEMU_MINMAX(unsigned long long, unsigned long long, long long)
#undef CUEMU_MINMAX
static inline float min(const float a, const float b) {
    return fminf(a, b);
}
static inline float max(const float a, const float b) {
    return fmaxf(a, b);
}
static inline double min(const double a, const double b) {
    return fmin(a, b);
}
static inline double max(const double a, const double b) {
    return fmax(a, b);
}
static inline double min(const float a, const double b) {
    return fmin(a, b);
}
static inline double max(const float a, const double b) {
    return fmax(a, b);
}
static inline double min(const double a, const float b) {
    return fmin(a, b);
}
static inline double max(const double a, const float b) {
    return fmax(a, b);
}

/* ---- the runtime's C++ overloads that <cuda_runtime.h> declares for nvcc only ---------------- */
template <typename T>
static inline cudaError_t cudaFuncSetAttribute(T *entry, cudaFuncAttribute attr, int value) {
    return cudaFuncSetAttribute((const void *)entry, attr, value);
}
template <typename T>
static inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *attr, T *entry) {
    return cudaFuncGetAttributes(attr, (const void *)entry);
}

/* ---- launches ------------------------------------------------------------------------------ */
/* What the scheduler needs to know about one launch; `text` is ct_launch's argument text, whose
 * first argument names the kernel in error messages. */
struct cuemu_launch_info {
    const void *kernel;
    const char *text;
    const char *file;
    int line;
    dim3 grid, block;
    size_t smem_bytes;
};

/* Validates a launch as a GPU would; a bad one is recorded for cudaGetLastError and returns its
 * error (and a one-line explanation goes to stderr). */
cudaError_t cuemu_check_launch(const cuemu_launch_info &info, cudaStream_t stream);
/* Runs every block of a launch now; thread_main(args) is one CUDA thread's body. */
void cuemu_run_grid(const cuemu_launch_info &info, void (*thread_main)(void *), void *args);

/* One launch's kernel and its arguments, converted to the parameter types and captured by value
 * (the launch runs later, at a sync point, so nothing may refer to the caller's variables). */
template <typename... Params> struct cuemu_launch_args {
    void (*kernel)(Params...);
    std::tuple<typename std::decay<Params>::type...> args;
    static void thread_main(void *self) {
        auto *launch = static_cast<cuemu_launch_args *>(self);
        std::apply(launch->kernel, launch->args);
    }
};

template <typename... Params, typename... Args>
static inline void cuemu_launch(const char *text, const char *file, int line,
                                void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                                cudaStream_t stream, Args &&...args) {
    static_assert(sizeof...(Params) == sizeof...(Args),
                  "ct_launch: the argument count differs from the kernel's parameter count");
    cuemu_launch_info info = {(const void *)kernel, text, file, line, grid, block, smem_bytes};
    if (cuemu_check_launch(info, stream) != cudaSuccess) return;
    auto launch = std::make_shared<cuemu_launch_args<Params...>>(cuemu_launch_args<Params...>{
        kernel, std::tuple<typename std::decay<Params>::type...>(std::forward<Args>(args)...)});
    cuemu_stream_enqueue(stream, [info, launch]() {
        cuemu_run_grid(info, &cuemu_launch_args<Params...>::thread_main, launch.get());
    });
}

/* A macro around the template so that errors can name the kernel and the launch site. */
#define ct_launch(...) cuemu_launch(#__VA_ARGS__, __FILE__, __LINE__, __VA_ARGS__)

#endif /* CT_CUEMU_H */
