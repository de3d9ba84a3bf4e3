/* context_local.c — the one-rank ParallelContext (see ct_pctx_local_new in context.h). */
#include "context.h"

ct_pctx *ct_pctx_local_new(void) {
    ct_pctx *p = ct_xcalloc(1, sizeof *p);
    p->world_size = p->tp = p->pp = p->dp = p->cp = p->ep = 1;
    p->world = ct_comm_local_new("world");
    p->tp_comm = ct_comm_local_new("tp");
    p->dp_comm = ct_comm_local_new("dp");
    p->dpcp_comm = p->dp_comm;
    p->cp_comm = ct_comm_local_new("cp");
    p->pp_comm = ct_comm_local_new("pp");
    p->mp_comm = ct_comm_local_new("mp");
    p->embed_comm = ct_comm_local_new("embed");
    p->ep_comm = ct_comm_local_new("ep");
    p->edp_comm = p->dpcp_comm;
    p->timeout_s = 0;
    return p;
}
