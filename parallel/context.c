/*
 * context.c — MPI bootstrap, the rank grid and its groups, and status agreement (context.h).
 */
#include "context.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/comm/comm_mpi.h"

static int world_rank = 0, world_size = 1;
static int local_rank = 0, local_size = 1;
/* host_of[r]: the host (MPI_COMM_TYPE_SHARED node) of world rank r, numbered by first appearance
 * in rank order; n_hosts of them. NULL without MPI (one host). */
static int *host_of = NULL, n_hosts = 1;
/* One name for this job, the same on every rank (rank 0's clock and pid), distinct from any
 * earlier job's: what flight records are matched by. */
static char job_id[32];

static void make_job_id(void) {
    snprintf(job_id, sizeof job_id, "%lx-%x", (unsigned long)time(NULL), (unsigned)getpid());
}

ct_status ct_mpi_init(int *argc, char ***argv) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return CT_OK;
    /* Open MPI 4.1's non-blocking allreduce (libnbc) picks a binomial tree — reduce to one
     * rank, then broadcast: about 2·log2(N) full buffers through the root instead of the ring's
     * 2(N−1)/N — for every in-place call and for every group under 4 ranks, and ours are all
     * in place. Ask for reduce-scatter + allgather (Rabenseifner; a ring when the buffer has
     * fewer elements than ranks) unless the user chose an algorithm. scripts/bench_comm.sh
     * shows the difference: 2-3x at MiB sizes. Other MPI libraries ignore the variable. */
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", 0);
    int provided = MPI_THREAD_SINGLE;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return ct_error(CT_ERR_RUNTIME, "MPI_Init_thread failed");
    /* Errors come back as codes so CT_MPI_CHECK can name the call; communicators made from
     * world inherit this handler. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    CT_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
    CT_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
    ct_set_log_rank(world_rank);
    if (provided < MPI_THREAD_FUNNELED) {
        ct_error(CT_ERR_RUNTIME,
                 "the MPI library provides thread level %d, below MPI_THREAD_FUNNELED (%d)",
                 provided, MPI_THREAD_FUNNELED);
        ct_hint("cooktrain runs OpenMP threads next to MPI; use an MPI built with thread "
                "support (Open MPI's default build has it)");
        return CT_ERR_RUNTIME;
    }
    MPI_Comm node;
    CT_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank,
                                     MPI_INFO_NULL, &node));
    CT_MPI_CHECK(MPI_Comm_rank(node, &local_rank));
    CT_MPI_CHECK(MPI_Comm_size(node, &local_size));
    /* Which ranks share a host: each rank names its host by the lowest world rank on it. */
    int leader = world_rank;
    CT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, node));
    CT_MPI_CHECK(MPI_Comm_free(&node));
    host_of = ct_xmalloc((size_t)world_size * sizeof *host_of);
    CT_MPI_CHECK(MPI_Allgather(&leader, 1, MPI_INT, host_of, 1, MPI_INT, MPI_COMM_WORLD));
    n_hosts = 0;
    for (int r = 0; r < world_size; r++) /* leaders become 0, 1, ... in rank order */
        host_of[r] = host_of[r] == r ? n_hosts++ : host_of[host_of[r]];
    /* straight through MPI, not a ct_comm: the flight recorder numbers those */
    if (world_rank == 0) make_job_id();
    CT_MPI_CHECK(MPI_Bcast(job_id, sizeof job_id, MPI_CHAR, 0, MPI_COMM_WORLD));
    job_id[sizeof job_id - 1] = 0;
    return CT_OK;
}

const char *ct_mpi_job_id(void) {
    if (!job_id[0]) make_job_id(); /* one process, without MPI */
    return job_id;
}

void ct_mpi_finalize(void) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized) return;
    ct_comm_mpi_release_ops();
    MPI_Finalize();
}

int ct_mpi_world_rank(void) {
    return world_rank;
}
int ct_mpi_world_size(void) {
    return world_size;
}
int ct_mpi_local_rank(void) {
    return local_rank;
}
int ct_mpi_local_size(void) {
    return local_size;
}
int ct_mpi_host_count(void) {
    return n_hosts;
}
int ct_mpi_host_of(int world_rank_r) {
    return host_of && world_rank_r >= 0 && world_rank_r < world_size ? host_of[world_rank_r] : 0;
}

void ct_mpi_abort(int exit_code) {
    ct_error_print();
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, exit_code);
    exit(exit_code); /* without MPI (or after MPI_Abort failed to end us) */
}

/* ---- the grid ----------------------------------------------------------------------------- */

typedef enum group_kind {
    GROUP_TP,
    GROUP_CP,
    GROUP_DP,
    GROUP_DPCP,
    GROUP_PP,
    GROUP_MP,
    GROUP_EMBED,
    GROUP_EP,
    GROUP_EDP,
    GROUP_COUNT
} group_kind;

static const char *group_names[GROUP_COUNT] = {"tp", "cp",    "dp", "dpcp", "pp",
                                               "mp", "embed", "ep", "edp"};

typedef struct grid {
    int tp, cp, dp, pp, ep;
} grid;

/*
 * The MPI_Comm_split color of world rank r's group of `kind` (-1: not a member, only for embed).
 * Within every group the key is the varying coordinate, and because of the rank order (tp
 * fastest, then cp, then dp, then pp) that orders members by world rank too.
 */
static int group_color(group_kind kind, int r, grid g, int *key) {
    int tp_rank = r % g.tp, cp_rank = (r / g.tp) % g.cp, dp_rank = (r / (g.tp * g.cp)) % g.dp,
        pp_rank = r / (g.tp * g.cp * g.dp);
    switch (kind) {
    case GROUP_TP: *key = tp_rank; return cp_rank + g.cp * (dp_rank + g.dp * pp_rank);
    case GROUP_CP: *key = cp_rank; return tp_rank + g.tp * (dp_rank + g.dp * pp_rank);
    case GROUP_DP: *key = dp_rank; return tp_rank + g.tp * (cp_rank + g.cp * pp_rank);
    case GROUP_DPCP: *key = cp_rank + g.cp * dp_rank; return tp_rank + g.tp * pp_rank;
    case GROUP_PP: *key = pp_rank; return tp_rank + g.tp * (cp_rank + g.cp * dp_rank);
    case GROUP_MP: *key = tp_rank + g.tp * pp_rank; return cp_rank + g.cp * dp_rank;
    case GROUP_EMBED:
        *key = pp_rank;
        return pp_rank == 0 || pp_rank == g.pp - 1 ? tp_rank + g.tp * (cp_rank + g.cp * dp_rank)
                                                   : -1;
    case GROUP_EP: /* block dp_rank / ep of the dp group */
        *key = dp_rank % g.ep;
        return tp_rank + g.tp * (cp_rank + g.cp * (dp_rank / g.ep + g.dp / g.ep * pp_rank));
    case GROUP_EDP: /* the same ep_rank in every block, and every cp rank */
        *key = cp_rank + g.cp * (dp_rank / g.ep);
        return tp_rank + g.tp * (dp_rank % g.ep + g.ep * pp_rank);
    default: break;
    }
    CT_ASSERTF(0, "unknown group kind %d", (int)kind);
}

static grid grid_of(const ct_pctx *p) {
    return (grid){p->tp, p->cp, p->dp, p->pp, p->ep};
}

static ct_comm *split_group(group_kind kind, const ct_pctx *p, double timeout_s) {
    int key = 0;
    int color = group_color(kind, p->world_rank, grid_of(p), &key);
    MPI_Comm comm;
    CT_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, color < 0 ? MPI_UNDEFINED : color, key, &comm));
    if (comm == MPI_COMM_NULL) return NULL;
    return ct_comm_mpi_new(comm, group_names[kind], timeout_s);
}

ct_status ct_pctx_new(ct_pctx **out, int tp, int pp, int dp, double timeout_s) {
    return ct_pctx_new_cp(out, tp, 1, pp, dp, 1, timeout_s);
}

ct_status ct_pctx_new_cp(ct_pctx **out, int tp, int cp, int pp, int dp, int ep, double timeout_s) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    CT_ASSERTF(initialized, "ct_pctx_new before ct_mpi_init");
    CT_ASSERTF(tp >= 1 && cp >= 1 && pp >= 1 && dp >= 1 && tp * cp * pp * dp == world_size,
               "grid tp %d x cp %d x pp %d x dp %d does not match world size %d (callers "
               "validate it)",
               tp, cp, pp, dp, world_size);
    CT_ASSERTF(ep >= 1 && dp % ep == 0, "ep %d does not divide dp %d (callers validate it)", ep,
               dp);
    ct_pctx *p = ct_xcalloc(1, sizeof *p);
    p->world_rank = world_rank;
    p->world_size = world_size;
    p->tp = tp;
    p->cp = cp;
    p->pp = pp;
    p->dp = dp;
    p->tp_rank = world_rank % tp;
    p->cp_rank = (world_rank / tp) % cp;
    p->dp_rank = (world_rank / (tp * cp)) % dp;
    p->pp_rank = world_rank / (tp * cp * dp);
    p->ep = ep;
    p->ep_rank = p->dp_rank % ep;
    p->timeout_s = timeout_s;

    MPI_Comm world;
    CT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world));
    p->world = ct_comm_mpi_new(world, "world", timeout_s);
    /* Every rank makes the same sequence of splits: MPI_Comm_split is collective on world. */
    p->tp_comm = split_group(GROUP_TP, p, timeout_s);
    p->cp_comm = split_group(GROUP_CP, p, timeout_s);
    p->dp_comm = split_group(GROUP_DP, p, timeout_s);
    p->dpcp_comm = cp > 1 ? split_group(GROUP_DPCP, p, timeout_s) : p->dp_comm;
    p->pp_comm = split_group(GROUP_PP, p, timeout_s);
    p->mp_comm = split_group(GROUP_MP, p, timeout_s);
    p->embed_comm = split_group(GROUP_EMBED, p, timeout_s);
    p->ep_comm = ep > 1 ? split_group(GROUP_EP, p, timeout_s) : ct_comm_local_new("ep");
    p->edp_comm = ep > 1 ? split_group(GROUP_EDP, p, timeout_s) : p->dpcp_comm;
    CT_ASSERT(p->tp_comm->size == tp && p->tp_comm->rank == p->tp_rank);
    CT_ASSERT(p->cp_comm->size == cp && p->cp_comm->rank == p->cp_rank);
    CT_ASSERT(p->dp_comm->size == dp && p->dp_comm->rank == p->dp_rank);
    CT_ASSERT(p->dpcp_comm->size == dp * cp && p->dpcp_comm->rank == p->cp_rank + cp * p->dp_rank);
    CT_ASSERT(p->pp_comm->size == pp && p->pp_comm->rank == p->pp_rank);
    CT_ASSERT(p->ep_comm->size == ep && p->ep_comm->rank == p->ep_rank);
    CT_ASSERT(p->edp_comm->size == cp * dp / ep);
    *out = p;
    return CT_OK;
}

void ct_pctx_free(ct_pctx *p) {
    if (!p) return;
    if (p->ep > 1) ct_comm_free(p->edp_comm); /* with ep = 1 it names dpcp */
    ct_comm_free(p->ep_comm);
    ct_comm_free(p->embed_comm);
    ct_comm_free(p->mp_comm);
    ct_comm_free(p->pp_comm);
    if (p->dpcp_comm != p->dp_comm) ct_comm_free(p->dpcp_comm);
    ct_comm_free(p->dp_comm);
    ct_comm_free(p->cp_comm);
    ct_comm_free(p->tp_comm);
    ct_comm_free(p->world);
    free(p);
}

/* "tp groups: [0 1] [2 3]": every group of one kind, each listed once by its lowest rank. */
static void print_groups(const ct_pctx *p, group_kind kind, FILE *out) {
    int n = p->world_size, key;
    grid g = grid_of(p);
    fprintf(out, "%s groups:", group_names[kind]);
    for (int r = 0; r < n; r++) {
        int color = group_color(kind, r, g, &key);
        if (color < 0) continue;
        bool first = true;
        for (int s = 0; s < r && first; s++)
            if (group_color(kind, s, g, &key) == color) first = false;
        if (!first) continue;
        fputs(" [", out);
        bool lead = true;
        for (int s = r; s < n; s++) {
            if (group_color(kind, s, g, &key) != color) continue;
            fprintf(out, lead ? "%d" : " %d", s);
            lead = false;
        }
        fputc(']', out);
    }
    fputc('\n', out);
}

/* Whether some group of `kind` has members on more than one host. */
static bool group_spans_hosts(const ct_pctx *p, group_kind kind) {
    int n = p->world_size, key;
    grid g = grid_of(p);
    for (int r = 0; r < n; r++) {
        int color = group_color(kind, r, g, &key);
        for (int s = r + 1; s < n && color >= 0; s++)
            if (group_color(kind, s, g, &key) == color && ct_mpi_host_of(s) != ct_mpi_host_of(r))
                return true;
    }
    return false;
}

/* "hosts: 2 (ranks per host: 2 2); tp groups within a host, dp groups across hosts, ..." */
static void print_hosts(const ct_pctx *p, FILE *out) {
    int hosts = ct_mpi_host_count();
    fprintf(out, "hosts: %d (ranks per host:", hosts);
    for (int h = 0; h < hosts; h++) {
        int ranks = 0;
        for (int r = 0; r < p->world_size; r++) ranks += ct_mpi_host_of(r) == h;
        fprintf(out, " %d", ranks);
    }
    fputc(')', out);
    if (hosts > 1) {
        const group_kind shown[] = {GROUP_TP, GROUP_CP, GROUP_PP, GROUP_DP, GROUP_EP};
        const int sizes[] = {p->tp, p->cp, p->pp, p->dp, p->ep};
        const char *sep = ";";
        bool tp_across = false;
        for (int i = 0; i < 5; i++) {
            if (sizes[i] <= 1) continue;
            bool across = group_spans_hosts(p, shown[i]);
            if (shown[i] == GROUP_TP) tp_across = across;
            fprintf(out, "%s %s groups %s", sep, group_names[shown[i]],
                    across ? "across hosts" : "within a host");
            sep = ",";
        }
        /* tp all-reduces run at every layer, on the critical path: they want one host's links */
        if (tp_across)
            fprintf(out,
                    " (tp across hosts is slow: give each host a multiple of tp=%d ranks, "
                    "filled in rank order, e.g. mpirun --map-by slot)",
                    p->tp);
    }
    fputc('\n', out);
}

void ct_pctx_print(const ct_pctx *p, FILE *out) {
    if (p->world_rank != 0) return;
    print_hosts(p, out);
    if (p->cp > 1)
        fprintf(out,
                "grid: world %d = tp %d x cp %d x pp %d x dp %d (rank = tp_rank + tp*(cp_rank + "
                "cp*(dp_rank + dp*pp_rank)))\n",
                p->world_size, p->tp, p->cp, p->pp, p->dp);
    else
        fprintf(out,
                "grid: world %d = tp %d x pp %d x dp %d (rank = tp_rank + tp*(dp_rank + "
                "dp*pp_rank))\n",
                p->world_size, p->tp, p->pp, p->dp);
    if (p->ep > 1)
        fprintf(out,
                "experts: ep %d inside dp %d (ep groups: %d consecutive dp ranks; edp: the %d "
                "ranks holding the same experts)\n",
                p->ep, p->dp, p->ep, p->edp_comm->size);
    for (int k = 0; k < GROUP_COUNT; k++) {
        /* without context parallelism the cp groups are single ranks and dpcp is dp */
        if (p->cp == 1 && (k == GROUP_CP || k == GROUP_DPCP)) continue;
        /* without expert parallelism ep groups are single ranks and edp is dpcp */
        if (p->ep == 1 && (k == GROUP_EP || k == GROUP_EDP)) continue;
        print_groups(p, (group_kind)k, out);
    }
    fflush(out);
}

/* ---- agreeing on a status ------------------------------------------------------------------ */

static int severity(ct_status st) {
    return st == CT_ERR_RUNTIME ? 2 : st == CT_ERR_INPUT ? 1 : 0;
}

ct_status ct_pctx_agree(const ct_pctx *pctx, ct_status local) {
    return pctx->world_size > 1 ? ct_mpi_agree(local) : local;
}

/* MPI_MAX of one int over the world; non-blocking while NCCL groups exist (ct_mpi_wait). */
static void world_max(const int *mine, int *out) {
    if (!ct_idle_hooked()) {
        CT_MPI_CHECK(MPI_Allreduce(mine, out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
        return;
    }
    MPI_Request req;
    CT_MPI_CHECK(MPI_Iallreduce(mine, out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &req));
    ct_mpi_wait(&req);
}

void ct_mpi_bcast(void *buf, size_t bytes, int root) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized || world_size == 1) return;
    CT_ASSERTF(bytes <= INT32_MAX, "a broadcast of %zu bytes", bytes);
    CT_MPI_CHECK(MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD));
}

ct_status ct_mpi_agree(ct_status local) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized || world_size == 1) return local;
    /* First the worst severity; then, negated so that MAX finds the lowest, the lowest rank
     * with that severity, whose message then matches the status everyone returns. */
    int sev = severity(local), worst_sev = 0, neg_root = 0;
    world_max(&sev, &worst_sev);
    if (worst_sev == 0) return CT_OK;
    int neg_mine = sev == worst_sev ? -world_rank : -world_size;
    world_max(&neg_mine, &neg_root);
    int root = -neg_root;
    ct_status worst = worst_sev == 2 ? CT_ERR_RUNTIME : CT_ERR_INPUT;

    /* Message and hint travel in one fixed-size buffer (the sizes of the error channel's). */
    enum { MSG = 2048, HINT = 1024 };
    char *buf = ct_xcalloc(1, MSG + HINT);
    if (world_rank == root) {
        snprintf(buf, MSG, "%s", ct_error_message());
        snprintf(buf + MSG, HINT, "%s", ct_error_hint());
    }
    CT_MPI_CHECK(MPI_Bcast(buf, MSG + HINT, MPI_CHAR, root, MPI_COMM_WORLD));
    buf[MSG - 1] = buf[MSG + HINT - 1] = '\0';
    const char *msg = buf[0] ? buf : "failed without an error message";
    if (root != 0)
        ct_error(worst, "rank %d: %s", root, msg);
    else
        ct_error(worst, "%s", msg);
    if (buf[MSG]) ct_hint("%s", buf + MSG);
    free(buf);
    return worst;
}
