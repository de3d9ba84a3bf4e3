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

/* The host waits for the stream (event NULL) or for an event on it. While NCCL groups exist (the
 * idle hook is set, core/common.h) it polls and runs the hook between polls: their watchdog sees
 * a collective that never finishes instead of the host blocking in the runtime for ever, and under
 * the emulator their streams move on. (backend_cuda.c's waits, gemm.c's grouped staging.) */
void ct_cuda_host_wait(cudaStream_t stream, cudaEvent_t event);

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
