/*
 * ct_mma.cuh — the warp-level tensor-core instructions kernels may use, as small device functions:
 * inline PTX under nvcc (sm_80 and later), the emulator's implementation of the same register
 * fragments under g++ (cuda/emu/mma_emu.cc, which spells the fragment layouts out), so a kernel
 * that puts an element in the wrong register of the wrong lane fails its emulated test.
 * Included after cuda/ct_cuda.h; device code only. All 32 lanes of the warp must call each one
 * together (the instructions are .aligned).
 *
 *   ct_mma_bf16(d, a, b)     d += a·b: a 16x16 (4 registers), b 16x8 (2), d 16x8 fp32 (4);
 *                            mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
 *   ct_ldmatrix_x4(r, p)     four 8x8 bf16 matrices from shared memory, lane 8i + j giving the
 *                            address of row j of matrix i (16 bytes, 16-byte aligned);
 *                            ldmatrix.sync.aligned.m8n8.x4.shared.b16
 *   ct_ldmatrix_x4_trans     the same, each matrix transposed (.trans)
 *   ct_pack_bf16x2(lo, hi)   two floats rounded to nearest even into one register, lo in the
 *                            low half (a fragment register of A or B)
 *   ct_exp2(x)               2^x by the special-function unit alone: ex2.approx.ftz.f32, the
 *                            instruction exp2f wraps (2 ulp, CUDA's math documentation says of
 *                            exp2f) without exp2f's rescaling of subnormal results: a result
 *                            below FLT_MIN (x < -126) is +0, and -inf gives +0. Fewer
 *                            instructions an element, for weights that vanish against the
 *                            row's largest (which is 1) anyway.
 *
 * ldmatrix has no "memory" clobber: it reads shared memory the caller's barrier made visible, and
 * being volatile it stays on its side of that barrier; a clobber would make the compiler reload
 * every shared value the kernel holds in registers (a step's lse and D) after each one.
 */
#ifndef CT_MMA_CUH
#define CT_MMA_CUH

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static __device__ inline void ct_mma_bf16(float (&d)[4], const uint32_t (&a)[4],
                                          const uint32_t (&b)[2]) {
#ifdef __CUDACC__
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    cuemu_mma_m16n8k16_bf16(d, a, b, d);
#endif
}

static __device__ inline void ct_ldmatrix_x4(uint32_t (&r)[4], const void *row) {
#ifdef __CUDACC__
    const unsigned addr = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#else
    cuemu_ldmatrix(r, 4, false, row);
#endif
}

static __device__ inline void ct_ldmatrix_x4_trans(uint32_t (&r)[4], const void *row) {
#ifdef __CUDACC__
    const unsigned addr = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#else
    cuemu_ldmatrix(r, 4, true, row);
#endif
}

static __device__ inline uint32_t ct_pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

static __device__ inline float ct_exp2(float x) {
#ifdef __CUDACC__
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
#else
    const float y = exp2f(x);
    return y < FLT_MIN ? 0.0f : y; /* ftz: subnormal (and underflowed) results are +0 */
#endif
}

#endif /* CT_MMA_CUH */
