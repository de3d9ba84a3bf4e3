/*
 * ct_wgmma.cuh — Hopper's warpgroup-level MMA (wgmma.mma_async, sm_90a) as small device functions:
 * inline PTX under nvcc, the emulator's implementation under g++ (cuda/emu/mma_emu.cc), as
 * ct_mma.cuh does for mma.sync. attention_tc.cu's wgmma kernels use it (CT_CUDA_ATTENTION=wgmma);
 * test/unit/wgmma_probe.cu runs it alone, under the emulator in `make test` and on a Hopper GPU in
 * scripts/gpu_check.sh, which reports whether the hardware reads each shared-memory layout below as
 * the emulator does.
 *
 * A warpgroup is 4 consecutive warps (128 threads, the first a multiple of 128) and all of them
 * execute each instruction. For the m64nNk16 shape with bf16 operands and fp32 accumulators:
 *   D (64 x N)      thread 32w + 4g + q (warp w of the group, lane group g, q in 0..3) holds
 *                   d[4j + r] = D[16w + g + 8·(r / 2)][8j + 2q + r % 2], j < N / 8: the mma.sync
 *                   m16n8 accumulator layout, warp w's 16 rows, n-tile after n-tile;
 *   A in registers  a[r] (two bf16, the lower column in the low half) = A[16w + g + 8·(r % 2)]
 *                   [2q + 8·(r / 2)] and the next: mma.sync's A fragment for warp w's 16 rows;
 *   A, B in shared memory, described by a 64-bit descriptor (ct_wgmma_desc): start address,
 *                   leading- and stride-dimension byte offsets (LBO, SBO) and a swizzle mode.
 *                   The element (mn, k) of A (mn a row, M = 64) or B (mn a column, N) lies at
 *                   ct_wgmma_offset() bytes past the start, before the swizzle (ct_wgmma_swizzle)
 *                   of the absolute address. K-major (imm-trans 0: k contiguous, as a row-major
 *                   A or a B stored as Bᵀ rows) and MN-major (imm-trans 1).
 * The layouts are this file's reading of the PTX ISA ("Matrix Descriptor", "Shared Memory Matrix
 * Layout"); the MN-major ones, where the ISA's words admit two readings of which offset steps
 * along MN, take `variant` 0 here and in the emulator, and the probe runs both on the GPU.
 *
 *   ct_smem_u32(p)               p's address in the shared window (cvta.to.shared)
 *   ct_wgmma_desc(addr, lbo, sbo, swizzle)
 *   ct_fence_async_proxy()       fence.proxy.async.shared::cta: the thread's shared-memory
 *                                writes (stores, landed cp.async copies) visible to wgmma, which
 *                                reads through the async proxy; then a barrier
 *   ct_wgmma_fence()             wgmma.fence.sync.aligned: before the first wgmma that reads
 *                                registers or shared memory written since
 *   ct_wgmma_commit()            wgmma.commit_group.sync.aligned
 *   ct_wgmma_wait<N>()           wgmma.wait_group.sync.aligned N: all but the N newest groups done
 *   ct_wgmma_fence_operand(d)    keeps the compiler from moving reads of d above the wait (or
 *                                writes below an issue): after every wait, on each result
 *   ct_wgmma_m64n64k16_ss<TA, TB>(d, desc_a, desc_b, scale_d)   D = A·B + (scale_d ? D : 0)
 *   ct_wgmma_m64n64k16_rs<TB>(d, a, desc_b, scale_d)            A from registers
 *
 * The emulator (cuda/emu/README.md) supports blocks of exactly one warpgroup and runs wgmma
 * asynchronously: a product runs at the wait that needs it, reading its operands then. It aborts
 * for an operand in shared memory that changed between the first thread's issue and the wait, an
 * accumulator written in flight, a wgmma with no wgmma.fence since the thread's last wait, and a
 * block that ends with a product not waited for; an accumulator read before its wait reads NaNs.
 * It cannot see a register written between the fence and the wgmma that reads it (make A's
 * fragments before the fence).
 */
#ifndef CT_WGMMA_CUH
#define CT_WGMMA_CUH

#include <stdint.h>

enum { CT_WGMMA_SWIZZLE_NONE = 0, CT_WGMMA_SWIZZLE_128B = 1 };

/* The descriptor: (addr & 0x3FFFF) >> 4 in bits 0-13, LBO >> 4 in 16-29, SBO >> 4 in 32-45, base
 * offset 0 (bits 49-51: a 128-byte-swizzled matrix starts on a 1024-byte boundary), swizzle mode
 * in 62-63 (0 none, 1 128-byte). */
static __host__ __device__ inline uint64_t ct_wgmma_desc(uint32_t addr, uint32_t lbo, uint32_t sbo,
                                                         int swizzle) {
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | (uint64_t)((lbo & 0x3FFFFu) >> 4) << 16 |
           (uint64_t)((sbo & 0x3FFFFu) >> 4) << 32 | (uint64_t)(swizzle & 3) << 62;
}

/* Byte offset of bf16 element (mn, k) from a descriptor's start address, before the swizzle.
 *   K-major, no swizzle: 8 x 8 core matrices (8 rows of 16 bytes, k along a row), SBO from one
 *     8-row group to the next along mn, LBO from one core matrix to the next along k.
 *   K-major, 128-byte swizzle: atoms of 8 rows of 128 bytes (64 k), rows 128 bytes apart, SBO
 *     from one 8-row atom to the next along mn; one instruction's 16 k lie in one row (the
 *     caller steps the start address 32 bytes a k-step), LBO unused.
 *   MN-major, no swizzle (variant 0): core matrices of 8 k-rows of 16 bytes (8 mn along a row),
 *     LBO from one core matrix to the next along mn, SBO along k; variant 1 swaps the two.
 *   MN-major, 128-byte swizzle (variant 0): atoms of 8 k-rows of 128 bytes (64 mn), LBO from
 *     one atom to the next along mn, SBO along k; variant 1 swaps the two. */
static __host__ __device__ inline uint32_t ct_wgmma_offset(int mn, int k, bool mn_major,
                                                           int swizzle, uint32_t lbo, uint32_t sbo,
                                                           int variant) {
    if (!mn_major) {
        if (swizzle == CT_WGMMA_SWIZZLE_128B)
            return (uint32_t)(mn / 8) * sbo + (uint32_t)(mn % 8) * 128u + (uint32_t)k * 2u;
        return (uint32_t)(mn / 8) * sbo + (uint32_t)(k / 8) * lbo + (uint32_t)(mn % 8) * 16u +
               (uint32_t)(k % 8) * 2u;
    }
    const uint32_t along_mn = variant ? sbo : lbo, along_k = variant ? lbo : sbo;
    if (swizzle == CT_WGMMA_SWIZZLE_128B)
        return (uint32_t)(mn / 64) * along_mn + (uint32_t)(k / 8) * along_k +
               (uint32_t)(k % 8) * 128u + (uint32_t)(mn % 64) * 2u;
    return (uint32_t)(mn / 8) * along_mn + (uint32_t)(k / 8) * along_k + (uint32_t)(k % 8) * 16u +
           (uint32_t)(mn % 8) * 2u;
}

/* The 128-byte swizzle of an absolute shared address: its 16-byte chunk within each 128-byte row
 * XORed with the row's index within its 1024-byte block (address bits 4-6 ^= bits 7-9). */
static __host__ __device__ inline uint32_t ct_wgmma_swizzle(uint32_t addr, int swizzle) {
    return swizzle == CT_WGMMA_SWIZZLE_128B ? addr ^ (((addr >> 7) & 7u) << 4) : addr;
}

static __device__ inline uint32_t ct_smem_u32(const void *p) {
#ifdef __CUDACC__
    return (uint32_t)__cvta_generic_to_shared(p);
#else
    return cuemu_smem_address(p);
#endif
}

/* fence.proxy.async.shared::cta: this thread's earlier writes to shared memory (stores, cp.async
 * copies that have landed) become visible to the async proxy, through which wgmma reads its
 * operands; before the barrier after which a wgmma reads them. */
static __device__ inline void ct_fence_async_proxy() {
#ifdef __CUDACC__
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

static __device__ inline void ct_wgmma_fence() {
#ifdef __CUDACC__
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
    cuemu_wgmma_fence();
#endif
}

static __device__ inline void ct_wgmma_commit() {
#ifdef __CUDACC__
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
    cuemu_wgmma_commit();
#endif
}

template <int N> static __device__ inline void ct_wgmma_wait() {
#ifdef __CUDACC__
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#else
    cuemu_wgmma_wait(N);
#endif
}

/* Pins an accumulator array to this point of the program: after a wgmma.wait_group, so the
 * compiler cannot move a read of the results above the wait (the wgmma's asm statement was the
 * last to write them, as far as the compiler knows); before an issue, likewise for writes. */
template <int N> static __device__ inline void ct_wgmma_fence_operand(float (&d)[N]) {
#ifdef __CUDACC__
    CT_UNROLL
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
#else
    (void)d;
#endif
}

/* The 32 accumulator operands of an m64n64 instruction, in order. */
#define CT_WGMMA_D32(d)                                                                            \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),            \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define CT_WGMMA_D32_LIST                                                                          \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "  \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"

template <int TA, int TB>
static __device__ inline void ct_wgmma_m64n64k16_ss(float (&d)[32], uint64_t desc_a,
                                                    uint64_t desc_b, int scale_d) {
#ifdef __CUDACC__
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " CT_WGMMA_D32_LIST
                 ", %32, %33, p, 1, 1, %35, %36;\n}\n"
                 : CT_WGMMA_D32(d)
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TA), "n"(TB));
#else
    cuemu_wgmma_bf16(d, 64, nullptr, desc_a, desc_b, scale_d != 0, TA != 0, TB != 0);
#endif
}

template <int TB>
static __device__ inline void ct_wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4],
                                                    uint64_t desc_b, int scale_d) {
#ifdef __CUDACC__
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " CT_WGMMA_D32_LIST
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
                 : CT_WGMMA_D32(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TB));
#else
    cuemu_wgmma_bf16(d, 64, a, 0, desc_b, scale_d != 0, false, TB != 0);
#endif
}

#endif /* CT_WGMMA_CUH */
