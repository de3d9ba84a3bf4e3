/* check.c — the failure path of CT_CUDA_CHECK and its cuBLAS/NCCL siblings, and the host's wait
 * for a stream. See ct_cuda_check.h. */
#include "cuda/ct_cuda_check.h"

#include "core/common.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

void ct_cuda_fail(const char *lib, const char *what, const char *name, const char *call,
                  const char *file, int line) {
    fprintf(stderr, "cooktrain: %s error '%s' (%s) in %s at %s:%d\n", lib, what, name, call, file,
            line);
    fflush(stderr);
    exit(1);
}

void ct_cuda_host_wait(cudaStream_t stream, cudaEvent_t event) {
    if (!ct_idle_hooked()) {
        if (event)
            CT_CUDA_CHECK(cudaEventSynchronize(event));
        else
            CT_CUDA_CHECK(cudaStreamSynchronize(stream));
        return;
    }
    for (;;) {
        cudaError_t e = event ? cudaEventQuery(event) : cudaStreamQuery(stream);
        if (e == cudaSuccess) return;
        if (e != cudaErrorNotReady) CT_CUDA_CHECK(e);
        ct_idle();
        sched_yield();
    }
}
