/*
 * ct_cuda_check.h — every CUDA runtime call is checked (core/README.md, Errors). A failing call
 * prints
 *
 *     cooktrain: CUDA error 'out of memory' (cudaErrorMemoryAllocation) in cudaMalloc(&p, bytes)
 *     at cuda/backend_cuda.c:120
 *
 * and ends the process with exit code 1 (a device error is a runtime failure: the backend's ops
 * return nothing, and a CUDA error leaves the context unusable, so there is nothing to unwind).
 * Includable from C and C++, in the real and the emulated build alike.
 */
#ifndef CT_CUDA_CHECK_H
#define CT_CUDA_CHECK_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Prints "cooktrain: <lib> error '<what>' (<name>) in <call> at <file>:<line>" and exits 1. */
__attribute__((noreturn)) void ct_cuda_fail(const char *lib, const char *what, const char *name,
                                            const char *call, const char *file, int line);

#ifdef __cplusplus
}
#endif

#define CT_CUDA_CHECK(call)                                                                        \
    do {                                                                                           \
        cudaError_t ct_cuda_status_ = (call);                                                      \
        if (ct_cuda_status_ != cudaSuccess)                                                        \
            ct_cuda_fail("CUDA", cudaGetErrorString(ct_cuda_status_),                              \
                         cudaGetErrorName(ct_cuda_status_), #call, __FILE__, __LINE__);            \
    } while (0)

#endif /* CT_CUDA_CHECK_H */
