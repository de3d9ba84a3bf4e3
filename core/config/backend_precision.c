/*
 * backend_precision.c — train.precision=auto resolved by the backend (backend_precision.h).
 */
#include "backend_precision.h"

#include "core/backend/cpu_gemm.h"

#include <stdio.h>

ct_precision ct_backend_auto_precision(bool cuda, char *why, size_t cap) {
    char what[80];
    bool native = cuda || ct_cpu_has_native_bf16(what, sizeof what);
    snprintf(why, cap, "auto: %s", cuda ? "GPU" : what);
    return native ? CT_PRECISION_BF16 : CT_PRECISION_FP32;
}
