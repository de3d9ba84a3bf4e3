/* check.c — the failure path of CT_CUDA_CHECK and its cuBLAS/NCCL siblings. See ct_cuda_check.h. */
#include "cuda/ct_cuda_check.h"

#include <stdio.h>
#include <stdlib.h>

void ct_cuda_fail(const char *lib, const char *what, const char *name, const char *call,
                  const char *file, int line) {
    fprintf(stderr, "cooktrain: %s error '%s' (%s) in %s at %s:%d\n", lib, what, name, call, file,
            line);
    fflush(stderr);
    exit(1);
}
