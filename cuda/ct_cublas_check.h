/*
 * ct_cublas_check.h — every cuBLAS and cuBLASLt call is checked, like CUDA calls (ct_cuda_check.h,
 * core/README.md, Errors): a failing call prints
 *
 *     cooktrain: cuBLASLt error 'the requested functionality is not supported'
 *     (CUBLAS_STATUS_NOT_SUPPORTED) in cublasLtMatmul(...) at cuda/gemm.c:310
 *
 * (on one line) and ends the process with exit code 1. Both libraries share cublasStatus_t, so
 * both use cuBLAS's status strings. Includable from C and C++, real and emulated builds alike.
 */
#ifndef CT_CUBLAS_CHECK_H
#define CT_CUBLAS_CHECK_H

#include <cublas_api.h>

#include "cuda/ct_cuda_check.h"

/* The call is stringified here, before the argument is macro-expanded (cublasCreate is a macro
 * for cublasCreate_v2): the message shows the call as written. */
#define CT_CUBLAS_CHECK_(lib, call, call_str)                                                      \
    do {                                                                                           \
        cublasStatus_t ct_cublas_status_ = (call);                                                 \
        if (ct_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                            \
            ct_cuda_fail(lib, cublasGetStatusString(ct_cublas_status_),                            \
                         cublasGetStatusName(ct_cublas_status_), call_str, __FILE__, __LINE__);    \
    } while (0)

#define CT_CUBLAS_CHECK(call) CT_CUBLAS_CHECK_("cuBLAS", call, #call)
#define CT_CUBLASLT_CHECK(call) CT_CUBLAS_CHECK_("cuBLASLt", call, #call)

#endif /* CT_CUBLAS_CHECK_H */
