/*
 * context.h — MPI bootstrap and the ParallelContext: the rank grid and its groups
 * (parallel/README.md, The grid).
 *
 * World = tp × cp × dp × pp ranks laid out with tp fastest, then cp, then dp, then pp:
 *     rank = tp_rank + tp·(cp_rank + cp·(dp_rank + dp·pp_rank))
 * so a TP group is consecutive ranks (one node's fast links), a context-parallel ring stays close
 * after it, and pipeline stages span nodes (Megatron's order).
 * Groups (each a ct_comm, comm.h): tp, cp (the ring of ring attention), dp (same position of the
 * sequence: the data order), dpcp (dp × cp: the ranks holding the same parameters, over which
 * gradients are reduced and ZeRO shards — the dp group itself when cp = 1), pp, model-parallel
 * (tp×pp: same dp and cp rank), and the embedding group (first and last pipeline stage, same tp,
 * cp and dp rank; NULL on other stages, and the same one-rank group as "first == last" when
 * pp = 1).
 * Expert parallelism folds into dp: an ep group is ep consecutive ranks of a dp group (dp ranks
 * b·ep .. b·ep + ep − 1 of block b; ep_rank = dp_rank % ep), over which a Mixture-of-Experts
 * layer's experts are spread and its tokens exchanged (all_to_all_v); the expert-data-parallel
 * group edp is its strided complement — the ranks holding the same experts: same tp, pp and
 * ep_rank, every block and every cp rank (cp·dp/ep ranks), over which expert gradients are
 * reduced. With ep = 1 the ep groups are single ranks and edp is dpcp.
 *
 * Failures that only some ranks see (a file missing on one node) are agreed on with
 * ct_mpi_agree before anyone exits, so every rank returns the same status and rank 0 can print
 * the message of the lowest failing rank (core/README.md, Errors).
 */
#ifndef CT_PARALLEL_CONTEXT_H
#define CT_PARALLEL_CONTEXT_H

#include "core/comm/comm.h"
#include "core/common.h"

#include <stdio.h>

/* MPI_Init_thread (MPI_THREAD_FUNNELED: only the main thread calls MPI; OpenMP threads never
 * do). Works without mpirun (a singleton world of one). Safe to call once per process. */
ct_status ct_mpi_init(int *argc, char ***argv);
void ct_mpi_finalize(void);
int ct_mpi_world_rank(void);
int ct_mpi_world_size(void);
/* Ranks of this job on this node (MPI_Comm_split_type shared) and this rank's index among them. */
int ct_mpi_local_size(void);
int ct_mpi_local_rank(void);
/* The hosts of the job (nodes in MPI_COMM_TYPE_SHARED's sense), and world rank r's host,
 * numbered 0, 1, ... in the order of their lowest rank; 1 and 0 without MPI. */
int ct_mpi_host_count(void);
int ct_mpi_host_of(int world_rank_r);
/* This job's id ("HEX-HEX": rank 0's start time and pid), the same on every rank of the job and
 * different for the next one started: flight records carry it (core/comm/flight.h). */
const char *ct_mpi_job_id(void);
/* Ends every rank of the job now (MPI_Abort), after printing the pending error on this rank. */
__attribute__((noreturn)) void ct_mpi_abort(int exit_code);

typedef struct ct_pctx {
    int world_rank, world_size;
    int tp, pp, dp, cp;                     /* group sizes */
    int tp_rank, pp_rank, dp_rank, cp_rank; /* coordinates */
    int ep, ep_rank;                        /* expert parallelism, inside dp (ep | dp) */
    ct_comm *world;
    ct_comm *tp_comm, *dp_comm, *pp_comm, *mp_comm, *cp_comm;
    ct_comm *dpcp_comm;  /* dp × cp; == dp_comm when cp = 1 (not a group of its own) */
    ct_comm *embed_comm; /* first + last stage; NULL on middle stages */
    ct_comm *ep_comm;    /* ep consecutive dp ranks; a one-rank group when ep = 1 */
    ct_comm *edp_comm;   /* the ranks holding the same experts; == dpcp_comm when ep = 1 */
    double timeout_s;    /* collective watchdog (parallel.timeout_s) */
} ct_pctx;

/* A grid of one rank without MPI: every group is a one-rank local group (comm.h). For world
 * size 1 (tests, `cooktrain train` outside mpirun) — nothing here touches MPI. */
ct_pctx *ct_pctx_local_new(void);

/* Builds the grid for tp·pp·dp == world size (the caller validated that), cp = 1. Collective. */
ct_status ct_pctx_new(ct_pctx **out, int tp, int pp, int dp, double timeout_s);
/* The same with context and expert parallelism: tp·cp·pp·dp == world size, ep | dp. */
ct_status ct_pctx_new_cp(ct_pctx **out, int tp, int cp, int pp, int dp, int ep, double timeout_s);
void ct_pctx_free(ct_pctx *pctx); /* accepts NULL; collective (frees communicators) */

/* Rank 0 prints the grid: which world ranks form each tp, dp, pp and embedding group. */
void ct_pctx_print(const ct_pctx *pctx, FILE *out);

/*
 * Every rank passes its own status; all get back the worst one (RUNTIME beats INPUT beats OK).
 * If any rank failed, the error message and hint of the lowest failing rank (the lowest among
 * those with the worst status, so message and exit code agree) are copied to every rank's error
 * channel (common.h), prefixed with "rank R: " when R != 0. Collective on world;
 * works before a ct_pctx exists (it uses MPI_COMM_WORLD).
 */
ct_status ct_mpi_agree(ct_status local);
/* Rank root's `bytes` at buf, copied to every rank's buf. Collective on world; works before a
 * ct_pctx exists; nothing to do without MPI or on a world of one. */
void ct_mpi_bcast(void *buf, size_t bytes, int root);
/* The same for the ranks of pctx; a grid of one process (no MPI) returns `local` as it is. */
ct_status ct_pctx_agree(const ct_pctx *pctx, ct_status local);

#endif /* CT_PARALLEL_CONTEXT_H */
