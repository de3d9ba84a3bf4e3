/*
 * backend_precision.h — train.precision=auto, decided by the backend the run will use: bf16 where
 * it multiplies bf16 natively (a CUDA device always; the CPU backend when the CPU has AMX-BF16 or
 * AVX512-BF16, cpu_gemm.h), else fp32. ct_config_validate asks here rather than probing the
 * hardware itself; cmd names the backend (ct_config.runtime_backend_cuda) before validating.
 */
#ifndef CT_BACKEND_PRECISION_H
#define CT_BACKEND_PRECISION_H

#include "config.h"

/* train.precision=auto resolved to FP32 or BF16 for the CPU backend, or a CUDA one when `cuda`.
 * `why` (cap bytes) gets how it was chosen, as the run prints it: "auto: GPU",
 * "auto: avx512_bf16", "auto: forced off by COOKTRAIN_CPU_BF16=0". */
ct_precision ct_backend_auto_precision(bool cuda, char *why, size_t cap);

#endif /* CT_BACKEND_PRECISION_H */
