/*
 * ct_cuda.h — the one header every .cu file includes first (cuda/README.md, Kernel files): CUDA
 * under nvcc, the CPU emulator (cuda/emu/cuemu.h) under g++. A kernel file written against it
 * compiles unchanged in both builds, provided it keeps three rules:
 *
 *   - kernels are launched only through ct_launch(kernel, grid, block, smem_bytes, stream,
 *     args...), never with a raw <<<>>> (g++ cannot parse it);
 *   - dynamic shared memory is declared only with CT_DYN_SHARED(type, name) inside the kernel,
 *     static shared arrays only with CT_SHARED(type, name, count) (in the emulator `name` is a
 *     pointer into a per-block arena poisoned at every block start, so size from count, never
 *     sizeof(name));
 *   - device-only features (inline PTX, cp.async, CUB, cooperative groups) have a plain CUDA
 *     fallback, which is what the emulator runs; the exception are the tensor-core instructions
 *     of cuda/ct_mma.cuh (mma.sync, ldmatrix), which the emulator implements with the PTX ISA's
 *     register fragments (cuda/emu/mma_emu.cc).
 *
 * Launch errors (a bad configuration, too much shared memory) are reported by the next
 * cudaGetLastError(), as on a GPU: launchers follow ct_launch with
 * CT_CUDA_CHECK(cudaGetLastError()).
 */
#ifndef CT_CUDA_H
#define CT_CUDA_H

#ifdef __CUDACC__

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define CT_DYN_SHARED(type, name) extern __shared__ __align__(16) type name[]
#define CT_SHARED(type, name, count) __shared__ __align__(16) type name[count]
/* Unroll the next loop, fully or by n (nvcc: loops over register arrays need constant indices to
 * stay in registers); g++, the emulator, does not know the pragma and needs no unrolling. */
#define CT_UNROLL _Pragma("unroll")
#define CT_UNROLL_BY(n) _Pragma(CT_STR(unroll n))
#define CT_STR(x) #x

/* A template, not a macro, so that template kernels with commas in their arguments launch. */
template <typename... Params, typename... Args>
static inline void ct_launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                             cudaStream_t stream, Args... args) {
    kernel<<<grid, block, smem_bytes, stream>>>(args...);
}

#else /* g++: the emulator */

#include "cuda/emu/cuemu.h"
#define CT_UNROLL
#define CT_UNROLL_BY(n)

#endif

#include "cuda/ct_cuda_check.h"

#endif /* CT_CUDA_H */
