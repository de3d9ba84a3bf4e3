/*
 * mpi_check.h — the agreed verdicts of the MPI test programs (mpi_test_comm, mpi_test_moe):
 * every rank passes its own verdict to check(), all ranks agree on it (MPI_Allreduce of the
 * minimum), a failing rank prints its reason first, and rank 0 prints one line, "ok npN NAME" or
 * "FAIL npN NAME", which test/tools/lib_cli.sh relays. Header-only, so each program stays one file.
 */
#ifndef CT_TEST_MPI_CHECK_H
#define CT_TEST_MPI_CHECK_H

#include <mpi.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>

static int n_ok, n_fail;
static char detail[512]; /* why this rank failed the current check */

/* Records why the current check fails on this rank (the first reason is kept); returns false. */
static bool why(const char *fmt, ...) {
    if (detail[0]) return false;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    return false;
}

/* Collective on MPI_COMM_WORLD: every rank passes its verdict, rank 0 prints the agreed one. */
static void check(bool local_ok, const char *fmt, ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (!local_ok) {
        printf("    rank %d: %s: %s\n", rank, name, detail[0] ? detail : "failed");
        fflush(stdout);
    }
    int mine = local_ok, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (all)
        n_ok++;
    else
        n_fail++;
    if (rank == 0) {
        printf("%s np%d %s\n", all ? "ok" : "FAIL", size, name);
        fflush(stdout);
    }
    detail[0] = '\0';
}

#endif /* CT_TEST_MPI_CHECK_H */
