/*
 * launch.cuh — the launch shapes the grid-stride kernels share (elementwise.cu, embedding.cu,
 * gelu.cu, adamw.cu): blocks of CT_LAUNCH_THREADS, grids capped at a few blocks per SM — enough
 * to fill the device, the grid-stride loop covers the rest — and the alignment test that picks a
 * kernel's 16-byte vector path, and the opt-in to more than 48 KB of dynamic shared memory. Host
 * code only; included after cuda/ct_cuda.h.
 *
 * The grid shape never changes a result: every kernel launched with these shapes gives each
 * element (or each column of a row sum) to one thread whatever the grid, and loops over the rest.
 */
#ifndef CT_CUDA_LAUNCH_CUH
#define CT_CUDA_LAUNCH_CUH

#include <stdint.h>

#include "cuda/ct_cuda_ctx.h"

#define CT_LAUNCH_THREADS 256     /* threads per block */
#define CT_LAUNCH_BLOCKS_PER_SM 8 /* 8 x 256 threads: a full SM on sm_80 / sm_90 */

/* The most blocks worth launching: blocks_per_sm on every SM of the context's device. */
static inline int64_t ct_launch_cap(const ct_cuda_ctx *cx,
                                    int blocks_per_sm = CT_LAUNCH_BLOCKS_PER_SM) {
    return (int64_t)ct_cuda_sm_count(cx) * blocks_per_sm;
}

/* Blocks of CT_LAUNCH_THREADS for a grid-stride loop over `work` items: one thread an item up to
 * ct_launch_cap, at least one block. */
static inline unsigned ct_launch_blocks(const ct_cuda_ctx *cx, int64_t work,
                                        int blocks_per_sm = CT_LAUNCH_BLOCKS_PER_SM) {
    int64_t want = (work + CT_LAUNCH_THREADS - 1) / CT_LAUNCH_THREADS;
    const int64_t cap = ct_launch_cap(cx, blocks_per_sm);
    if (want > cap) want = cap;
    return (unsigned)(want > 0 ? want : 1);
}

/* A 2-D launch over `rows` x `cols` (column vectors): blocks of CT_LAUNCH_THREADS threads, x a
 * multiple of 32 covering the columns (up to CT_LAUNCH_THREADS), y the rest over rows; the grid
 * sized to fill the device (ct_launch_cap blocks in all, at most 65535 in y). */
static inline void ct_launch_rows(const ct_cuda_ctx *cx, int64_t rows, int64_t cols, dim3 *grid,
                                  dim3 *block) {
    const int64_t cap = ct_launch_cap(cx);
    unsigned bx = cols >= CT_LAUNCH_THREADS ? CT_LAUNCH_THREADS : (unsigned)((cols + 31) / 32 * 32);
    if (bx == 0) bx = 32;
    unsigned by = CT_LAUNCH_THREADS / bx;
    int64_t gx = (cols + bx - 1) / bx;
    if (gx > cap) gx = cap;
    if (gx < 1) gx = 1;
    int64_t gy = (rows + by - 1) / by, gy_cap = cap / gx;
    if (gy > gy_cap) gy = gy_cap;
    if (gy > 65535) gy = 65535;
    if (gy < 1) gy = 1;
    *grid = dim3((unsigned)gx, (unsigned)gy);
    *block = dim3(bx, by);
}

/* True when p is aligned to `bytes` (a vector path's loads and stores); NULL is aligned. */
static inline bool ct_launch_aligned(const void *p, size_t bytes) {
    return ((uintptr_t)p % bytes) == 0;
}

/* Dynamic shared memory above the default 48 KB needs the kernel's opt-in (per device). */
template <typename K> static inline void ct_launch_allow_smem(K *kernel, size_t bytes) {
    if (bytes > 48 * 1024)
        CT_CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

#endif /* CT_CUDA_LAUNCH_CUH */
