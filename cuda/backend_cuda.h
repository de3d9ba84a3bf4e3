/*
 * backend_cuda.h — the CUDA backend (core/README.md, The backend interface): the slots of struct
 * ct_backend_i on one device, as kernels (the .cu files here, one op family per file) and
 * cuBLASLt GEMMs (gemm.h).
 *
 * cmd/ calls ct_cuda_register() once at start in a build with CUDA; "--backend cuda" then makes
 * it, and "--backend auto" picks it where ct_cuda_usable() says a device is usable. Without a
 * usable device, "--backend cuda" is refused with "no usable CUDA device (cudaErrorNoDevice or
 * cudaErrorInsufficientDriver)" (exit 2) by the registry (backend.h).
 */
#ifndef CT_CUDA_BACKEND_CUDA_H
#define CT_CUDA_BACKEND_CUDA_H

#include <stdio.h>

#include "core/backend/backend.h"

/* Adds "cuda" to the backend registry. */
void ct_cuda_register(void);

/* True when a CUDA device is usable here; else false with the reason in why. Never reads the
 * device count without checking the call's status. */
bool ct_cuda_usable(char *why, size_t cap);

/* How many CUDA devices this process sees; 0 with the reason in why when none is usable. */
int ct_cuda_device_count(char *why, size_t cap);

/* train.precision=auto (ct_backend_desc.native_bf16): tensor cores multiply bf16 on every
 * device this backend runs on (sm_80 and later). Inline: the registry entry of the plugin
 * loader (plugin.c) answers it without loading the library. */
static inline bool ct_cuda_native_bf16(char *how, size_t cap) {
    snprintf(how, cap, "a CUDA device");
    return true;
}

/* The backend on device `device` (its own compute stream, events and cuBLASLt handle). */
ct_backend *ct_cuda_backend_new(int device);

#endif /* CT_CUDA_BACKEND_CUDA_H */
