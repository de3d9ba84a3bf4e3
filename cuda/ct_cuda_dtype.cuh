/*
 * ct_cuda_dtype.cuh — what every kernel file shares: the storage dtypes (fp32, bf16) widened to
 * fp32 on load and rounded to nearest even on store (core/README.md, Precision), 16-byte vector
 * loads and stores of either, and the warp butterfly reductions. Included after cuda/ct_cuda.h;
 * device code only.
 */
#ifndef CT_CUDA_DTYPE_CUH
#define CT_CUDA_DTYPE_CUH

/* fp32 from a stored element. */
static __device__ inline float ct_to_f32(float x) {
    return x;
}
static __device__ inline float ct_to_f32(__nv_bfloat16 x) {
    return __bfloat162float(x);
}

/* A stored element from fp32: bf16 rounds to nearest even. */
template <typename T> static __device__ inline T ct_from_f32(float x);
template <> __device__ inline float ct_from_f32<float>(float x) {
    return x;
}
template <> __device__ inline __nv_bfloat16 ct_from_f32<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

/* VEC elements of T as one aligned load / store (VEC·sizeof(T) is 16 bytes, or 1 element). */
template <typename T, int VEC> struct alignas(sizeof(T) * VEC) ct_pack { T v[VEC]; };

/* f[0..VEC) = p[0..VEC) widened; p aligned to VEC·sizeof(T). */
template <typename T, int VEC> static __device__ inline void ct_load(const T *p, float *f) {
    ct_pack<T, VEC> x = *reinterpret_cast<const ct_pack<T, VEC> *>(p);
    for (int k = 0; k < VEC; k++) f[k] = ct_to_f32(x.v[k]);
}

/* p[0..VEC) = f[0..VEC) stored; p aligned to VEC·sizeof(T). */
template <typename T, int VEC> static __device__ inline void ct_put(T *p, const float *f) {
    ct_pack<T, VEC> x;
    for (int k = 0; k < VEC; k++) x.v[k] = ct_from_f32<T>(f[k]);
    *reinterpret_cast<ct_pack<T, VEC> *>(p) = x;
}

/* Butterfly sum and max over the 32 lanes of a full warp: every lane ends with the same bits
 * (each step adds a + b on one lane and b + a on its partner, which are equal). */
static __device__ inline float ct_warp_sum(float v) {
    for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}
static __device__ inline float ct_warp_max(float v) {
    for (int off = 16; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

#endif /* CT_CUDA_DTYPE_CUH */
