/*
 * ct_async.cuh — asynchronous copies from global to shared memory (cp.async, sm_80 and later) as
 * small device functions: inline PTX under nvcc, the emulator's version under g++ (cuda/emu/
 * cuemu.cc), which lands each group of copies at the latest (ascending order) or the earliest
 * (descending) moment the PTX ISA allows, so a read before the wait or a copy into a buffer still
 * being read gives a wrong result in one of the orders. Included after cuda/ct_cuda.h; device
 * code only.
 *
 *   ct_cp_async<BYTES>(dst, src, fill)  BYTES (4, 8, or 16) from global src to shared dst, or
 *                                       zeros when fill is false (src-size 0: src is not read);
 *                                       dst and src aligned to BYTES
 *                                       cp.async.{ca,cg}.shared.global [dst], [src], BYTES, n
 *   ct_cp_async_commit()                the thread's copies since the last commit become a group
 *                                       cp.async.commit_group
 *   ct_cp_async_wait<N>()               waits until at most N of the thread's groups are still in
 *                                       flight; other threads' copies need a barrier after it
 *                                       cp.async.wait_group N
 */
#ifndef CT_ASYNC_CUH
#define CT_ASYNC_CUH

template <int BYTES>
static __device__ inline void ct_cp_async(void *dst, const void *src, bool fill) {
    static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async copies 4, 8 or 16 bytes");
#ifdef __CUDACC__
    const unsigned addr = (unsigned)__cvta_generic_to_shared(dst);
    const int n = fill ? BYTES : 0;
    if (BYTES == 16) /* .cg: cached in L2 only (16 bytes alone) */
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(src), "r"(n)
                     : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(addr), "l"(src),
                     "n"(BYTES), "r"(n)
                     : "memory");
#else
    cuemu_cp_async(dst, src, BYTES, fill);
#endif
}

static __device__ inline void ct_cp_async_commit() {
#ifdef __CUDACC__
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#else
    cuemu_cp_async_commit();
#endif
}

template <int N> static __device__ inline void ct_cp_async_wait() {
#ifdef __CUDACC__
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#else
    cuemu_cp_async_wait(N);
#endif
}

#endif /* CT_ASYNC_CUH */
