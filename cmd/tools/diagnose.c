/*
 * diagnose.c — `cooktrain diagnose RUN_DIR` (diagnose.h): reads every rank's flight record
 * (core/comm/flight.h) and names the first operation some rank entered and another never did,
 * or entered as a different operation.
 *
 * Groups are matched across ranks by name and members. For a collective #k of a group, a member
 * "never entered" it when its record holds the group's collectives up to some #j < k and nothing
 * was lost from its ring that could hold #k (the ring keeps the newest operations, so a record
 * with any of the group's operations knows the group's newest one). For point-to-point, send #k
 * from p to q is matched with receive #k on q from p. Of all unmatched operations the one entered
 * first (wall clock) is the diagnosis: what came after it is usually its consequence.
 */
#include "diagnose.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct op_rec {
    int group; /* the global group */
    char kind[24], dtype[8], state[12];
    unsigned long long seq, bytes;
    int peer, tag; /* peer: a group rank */
    double start, end;
} op_rec;

typedef struct rank_rec {
    int rank, world, pid, capacity;
    long long recorded;
    char host[256], reason[96], job[64], file[256];
    double time, timeout_s; /* timeout_s: the watchdog's, 0 when unknown (a version 1 record) */
    int *group_map;         /* the file's group index -> the global group */
    int n_groups;
    op_rec *ops;
    int n_ops;
} rank_rec;

typedef struct global_group {
    char name[32];
    int size;
    int *members; /* world ranks */
} global_group;

typedef struct diag {
    rank_rec *ranks; /* indexed by world rank; rank -1 where no record */
    int world;
    global_group *groups;
    int n_groups;
} diag;

/* ---- reading ------------------------------------------------------------------------------- */

static int global_group_of(diag *d, const char *name, int size, const int *members) {
    for (int i = 0; i < d->n_groups; i++)
        if (!strcmp(d->groups[i].name, name) && d->groups[i].size == size &&
            !memcmp(d->groups[i].members, members, (size_t)size * sizeof *members))
            return i;
    d->groups = realloc(d->groups, (size_t)(d->n_groups + 1) * sizeof *d->groups);
    CT_ASSERT(d->groups != NULL);
    global_group *g = &d->groups[d->n_groups];
    snprintf(g->name, sizeof g->name, "%s", name);
    g->size = size;
    g->members = ct_xmalloc((size_t)size * sizeof *members);
    memcpy(g->members, members, (size_t)size * sizeof *members);
    return d->n_groups++;
}

static ct_status bad_record(const char *path, int line, const char *what) {
    ct_error(CT_ERR_INPUT, "%s:%d: not a cooktrain flight record (%s)", path, line, what);
    ct_hint("flight records are written by cooktrain train as log.run_dir/flight/rank-R.txt; "
            "pass the run directory (or its flight/ directory) unchanged");
    return CT_ERR_INPUT;
}

static ct_status read_record(diag *d, const char *path, rank_rec *out) {
    FILE *f = fopen(path, "r");
    if (!f) {
        ct_error(CT_ERR_INPUT, "cannot read flight record %s", path);
        ct_hint("check the file's permissions");
        return CT_ERR_INPUT;
    }
    char line[8192];
    int n = 0, version = 2;
    rank_rec r = {.rank = -1, .job = "-"};
    ct_status st = CT_OK;
    while (st == CT_OK && fgets(line, sizeof line, f)) {
        n++;
        if (n == 1) {
            if (!strcmp(line, "cooktrain flight record 1\n"))
                version = 1;
            else if (strcmp(line, "cooktrain flight record 2\n") != 0)
                st = bad_record(path, n, "first line");
            continue;
        }
        if (!strncmp(line, "rank ", 5)) {
            int used = 0;
            if (sscanf(line,
                       "rank %d world %d pid %d host %255s reason %95s time %lf capacity %d "
                       "recorded %lld%n",
                       &r.rank, &r.world, &r.pid, r.host, r.reason, &r.time, &r.capacity,
                       &r.recorded, &used) != 8 ||
                (version == 2 &&
                 (sscanf(line + used, " job %63s timeout %lf", r.job, &r.timeout_s) != 2 ||
                  !(r.timeout_s >= 0))) ||
                r.rank < 0 || r.world < 1 || r.world > 1 << 24 || r.rank >= r.world)
                st = bad_record(path, n, "rank line");
        } else if (!strncmp(line, "group ", 6)) {
            int idx, grank, size, used = 0;
            char name[32];
            if (sscanf(line, "group %d %31s %d %d%n", &idx, name, &grank, &size, &used) != 4 ||
                idx != r.n_groups || size < 1 || size > 1 << 24) {
                st = bad_record(path, n, "group line");
                break;
            }
            int *members = ct_xmalloc((size_t)size * sizeof *members);
            const char *p = line + used;
            for (int m = 0; m < size && st == CT_OK; m++) {
                int k = 0;
                if (sscanf(p, " %d%n", &members[m], &k) != 1 || members[m] < 0)
                    st = bad_record(path, n, "group members");
                p += k;
            }
            if (st == CT_OK) {
                r.group_map = realloc(r.group_map, (size_t)(r.n_groups + 1) * sizeof(int));
                CT_ASSERT(r.group_map != NULL);
                r.group_map[r.n_groups++] = global_group_of(d, name, size, members);
            }
            free(members);
        } else if (!strncmp(line, "op ", 3)) {
            op_rec o;
            int g;
            if (sscanf(line, "op %d %23s %llu %d %d %7s %llu %lf %lf %11s", &g, o.kind, &o.seq,
                       &o.peer, &o.tag, o.dtype, &o.bytes, &o.start, &o.end, o.state) != 10 ||
                g < 0 || g >= r.n_groups) {
                st = bad_record(path, n, "op line");
                break;
            }
            o.group = r.group_map[g];
            r.ops = realloc(r.ops, (size_t)(r.n_ops + 1) * sizeof *r.ops);
            CT_ASSERT(r.ops != NULL);
            r.ops[r.n_ops++] = o;
        } else {
            st = bad_record(path, n, "unknown line");
        }
    }
    fclose(f);
    if (st == CT_OK && r.rank < 0) st = bad_record(path, n, "no rank line");
    if (st != CT_OK) {
        free(r.group_map);
        free(r.ops);
        return st;
    }
    const char *base = strrchr(path, '/');
    snprintf(r.file, sizeof r.file, "%.255s", base ? base + 1 : path);
    *out = r;
    return CT_OK;
}

/* Keeps record r as its job's record of its rank (the job chosen: ct_diagnose). */
static ct_status keep_record(diag *d, rank_rec *r) {
    if (r->world > d->world) {
        d->ranks = realloc(d->ranks, (size_t)r->world * sizeof *d->ranks);
        CT_ASSERT(d->ranks != NULL);
        for (int i = d->world; i < r->world; i++) d->ranks[i] = (rank_rec){.rank = -1};
        d->world = r->world;
    }
    if (d->ranks[r->rank].rank >= 0) {
        ct_error(CT_ERR_INPUT, "two flight records of rank %d of job %s (%s, %s)", r->rank, r->job,
                 d->ranks[r->rank].file, r->file);
        ct_hint("keep one run's records in one directory");
        return CT_ERR_INPUT;
    }
    d->ranks[r->rank] = *r;
    r->group_map = NULL, r->ops = NULL;
    return CT_OK;
}

/* ---- analysis ------------------------------------------------------------------------------ */

static bool is_p2p(const op_rec *o) {
    return !strcmp(o->kind, "send") || !strcmp(o->kind, "recv");
}

/* The newest collective (or, with p2p, the newest `kind` with `peer`) of group g in rank r's
 * record: its seq in *hi, the op in *last. False when the record cannot know (its ring wrapped
 * and holds none of them); with no ring wrap and none, hi is 0. */
static bool newest(const rank_rec *r, int g, const char *kind, int peer, unsigned long long *hi,
                   const op_rec **last) {
    *hi = 0;
    *last = NULL;
    for (int i = 0; i < r->n_ops; i++) {
        const op_rec *o = &r->ops[i];
        if (o->group != g) continue;
        if (kind ? strcmp(o->kind, kind) != 0 || o->peer != peer : is_p2p(o)) continue;
        if (o->seq >= *hi) *hi = o->seq, *last = o;
    }
    return *last || r->recorded <= r->capacity;
}

static const op_rec *find_op(const rank_rec *r, int g, const char *kind, int peer,
                             unsigned long long seq) {
    for (int i = 0; i < r->n_ops; i++) {
        const op_rec *o = &r->ops[i];
        if (o->group == g && o->seq == seq &&
            (kind ? !strcmp(o->kind, kind) && o->peer == peer : !is_p2p(o)))
            return o;
    }
    return NULL;
}

static void group_label(const global_group *g, char *buf, size_t n) {
    size_t used = (size_t)snprintf(buf, n, "%s (ranks", g->name);
    for (int m = 0; m < g->size && used < n; m++)
        used += (size_t)snprintf(buf + used, n - used, " %d", g->members[m]);
    if (used < n) snprintf(buf + used, n - used, ")");
}

static void clock_label(double t, char *buf, size_t n) {
    time_t s = (time_t)t;
    struct tm tm;
    gmtime_r(&s, &tm);
    snprintf(buf, n, "%02d:%02d:%02d.%03d UTC", tm.tm_hour, tm.tm_min, tm.tm_sec,
             (int)((t - (double)s) * 1000));
}

/* The best candidate so far: an operation the ranks entered as different operations (a bug in
 * itself, whatever the clocks say), else the unmatched operation entered first. Entered first
 * is a matter of clocks when ranks drift apart: a rank ahead of the others can enter a later
 * collective before they reach the one that hangs them. */
typedef struct finding {
    bool mismatch;
    double when;
    char text[4096];
    bool found;
} finding;

static void consider(finding *best, bool mismatch, double when, const char *text) {
    if (best->found &&
        (best->mismatch > mismatch || (best->mismatch == mismatch && when >= best->when)))
        return;
    best->found = true;
    best->mismatch = mismatch;
    best->when = when;
    snprintf(best->text, sizeof best->text, "%s", text);
}

static bool same_op(const op_rec *a, const op_rec *b) {
    if (strcmp(a->kind, b->kind) != 0 || strcmp(a->dtype, b->dtype) != 0) return false;
    return !strcmp(a->kind, "all_to_all_v") || a->bytes == b->bytes; /* v: counts differ */
}

/* World rank wr's record, or NULL when it wrote none. */
static const rank_rec *record_of(const diag *d, int wr) {
    return wr < d->world && d->ranks[wr].rank >= 0 ? &d->ranks[wr] : NULL;
}

static void check_collectives(const diag *d, int g, finding *best) {
    const global_group *gg = &d->groups[g];
    char label[1024], line[4096], clock[32];
    group_label(gg, label, sizeof label);
    /* every seq some member entered */
    for (int m = 0; m < gg->size; m++) {
        int wr = gg->members[m];
        const rank_rec *r = record_of(d, wr);
        for (int i = 0; r && i < r->n_ops; i++) {
            const op_rec *o = &r->ops[i];
            if (o->group != g || is_p2p(o)) continue;
            /* this op is the candidate's first entry only on its lowest member with it */
            bool first = true;
            for (int q = 0; q < m && first; q++) {
                const rank_rec *rq = record_of(d, gg->members[q]);
                if (rq && find_op(rq, g, NULL, -1, o->seq)) first = false;
            }
            if (!first) continue;
            /* when the first member entered it: a record written before then cannot hold it */
            double when = o->start;
            for (int q = 0; q < gg->size; q++) {
                const rank_rec *rq = record_of(d, gg->members[q]);
                const op_rec *oq = rq ? find_op(rq, g, NULL, -1, o->seq) : NULL;
                if (oq && oq->start < when) when = oq->start;
            }
            char entered[1024] = "", missing[2048] = "", differs[2048] = "";
            size_t ne = 0, nm = 0, nd = 0;
            /* the first member named as missing; whether it completed anywhere: then every
             * member entered it, and one without a record is no suspect */
            int first_missing = -1;
            bool unfinished = true;
            double waited = 0.0; /* the longest an entering rank had waited at its record */
            for (int q = 0; q < gg->size; q++) {
                int wq = gg->members[q];
                const rank_rec *rq = record_of(d, wq);
                const op_rec *oq = rq ? find_op(rq, g, NULL, -1, o->seq) : NULL;
                if (oq) {
                    if (!strcmp(oq->state, "completed"))
                        unfinished = false;
                    else
                        waited = CT_MAX(waited, rq->time - oq->start);
                    if (ne < sizeof entered)
                        ne += (size_t)snprintf(entered + ne, sizeof entered - ne, " %d", wq);
                    if (!same_op(oq, o) && nd < sizeof differs)
                        nd += (size_t)snprintf(differs + nd, sizeof differs - nd,
                                               ", rank %d %s (%s, %llu bytes)", wq, oq->kind,
                                               oq->dtype, oq->bytes);
                    continue;
                }
                unsigned long long hi;
                const op_rec *last;
                if (!rq) {
                    if (first_missing < 0) first_missing = wq;
                    if (nm < sizeof missing)
                        nm += (size_t)snprintf(missing + nm, sizeof missing - nm,
                                               "; rank %d wrote no flight record", wq);
                } else if (rq->time > when && newest(rq, g, NULL, -1, &hi, &last) && hi < o->seq) {
                    if (first_missing < 0) first_missing = wq;
                    if (nm < sizeof missing)
                        nm += (size_t)snprintf(
                            missing + nm, sizeof missing - nm,
                            "; rank %d never entered it (its last collective on this group: "
                            "%s%llu%s%s%s)",
                            wq, last ? "#" : "none", last ? last->seq : 0ULL, last ? " " : "",
                            last ? last->kind : "",
                            last ? (strcmp(last->state, "completed") ? ", unfinished"
                                                                     : ", completed")
                                 : "");
                }
            }
            if (!nd && (!nm || !unfinished)) continue;
            clock_label(when, clock, sizeof clock);
            if (nd)
                snprintf(line, sizeof line,
                         "diagnosis: collective #%llu on group %s differs between ranks: rank %d "
                         "%s (%s, %llu bytes)%s\n  entered by ranks%s, the first at %s%s\n",
                         o->seq, label, wr, o->kind, o->dtype, o->bytes, differs, entered, clock,
                         missing);
            else if (!record_of(d, first_missing))
                snprintf(line, sizeof line,
                         "diagnosis: rank %d wrote no flight record (it may have died), and "
                         "collective #%llu (%s, %s, %llu bytes) on group %s waits for it\n  "
                         "entered by ranks%s, the first at %s, waiting %.3f s when their records "
                         "were written%s\n",
                         first_missing, o->seq, o->kind, o->dtype, o->bytes, label, entered, clock,
                         waited, missing);
            else
                snprintf(line, sizeof line,
                         "diagnosis: rank %d never entered collective #%llu (%s, %s, %llu bytes) "
                         "on group %s\n  entered by ranks%s, the first at %s, waiting %.3f s when "
                         "their records were written%s\n",
                         first_missing, o->seq, o->kind, o->dtype, o->bytes, label, entered, clock,
                         waited, missing);
            consider(best, nd > 0, when, line);
        }
    }
}

static void check_p2p(const diag *d, int g, finding *best) {
    const global_group *gg = &d->groups[g];
    char label[1024], line[4096], clock[32];
    group_label(gg, label, sizeof label);
    for (int m = 0; m < gg->size; m++) {
        int wr = gg->members[m];
        const rank_rec *r = record_of(d, wr);
        for (int i = 0; r && i < r->n_ops; i++) {
            const op_rec *o = &r->ops[i];
            if (o->group != g || !is_p2p(o) || o->peer < 0 || o->peer >= gg->size) continue;
            bool send = !strcmp(o->kind, "send");
            int wq = gg->members[o->peer];
            const rank_rec *rq = record_of(d, wq);
            const char *other = send ? "recv" : "send";
            unsigned long long hi;
            const op_rec *last;
            if (rq && find_op(rq, g, other, m, o->seq)) continue;
            if (rq && !(rq->time > o->start && newest(rq, g, other, m, &hi, &last) && hi < o->seq))
                continue; /* posted, or its record was written before this was entered */
            if (!rq && !strcmp(o->state, "completed")) continue;
            clock_label(o->start, clock, sizeof clock);
            if (rq)
                snprintf(line, sizeof line,
                         "diagnosis: rank %d never posted %s #%llu %s rank %d on group %s\n  rank "
                         "%d entered %s #%llu (%s, %llu bytes, tag %d) at %s, %s; rank %d's last "
                         "%s %s it: %s%llu\n",
                         wq, send ? "receive" : "send", o->seq, send ? "from" : "to", wr, label, wr,
                         o->kind, o->seq, o->dtype, o->bytes, o->tag, clock, o->state, wq, other,
                         send ? "from" : "to", last ? "#" : "none ", last ? last->seq : 0ULL);
            else
                snprintf(line, sizeof line,
                         "diagnosis: rank %d wrote no flight record; rank %d waits in %s #%llu "
                         "%s it on group %s since %s (%.3f s when its record was written)\n",
                         wq, wr, o->kind, o->seq, send ? "to" : "from", label, clock,
                         r->time - o->start);
            consider(best, false, o->start, line);
        }
    }
}

/* The longest any rank of the job had waited in an unfinished operation when its record was
 * written, described in `what`. */
static double longest_wait(const diag *d, char *what, size_t n) {
    double most = 0.0;
    snprintf(what, n, "no rank was inside an operation");
    for (int r = 0; r < d->world; r++) {
        const rank_rec *rr = record_of(d, r);
        for (int i = 0; rr && i < rr->n_ops; i++) {
            const op_rec *o = &rr->ops[i];
            if (!strcmp(o->state, "completed") || rr->time - o->start <= most) continue;
            most = rr->time - o->start;
            snprintf(what, n, "rank %d in %s #%llu on group %s, %s", r, o->kind, o->seq,
                     d->groups[o->group].name, o->state);
        }
    }
    return most;
}

/* Whether the records are snapshots of a running job rather than of a hang or a failure: every
 * rank wrote one, no watchdog fired and no MPI or NCCL error was seen, and no rank had waited
 * `hang_after` seconds in one operation. */
static bool running_job(const diag *d, double wait, double hang_after) {
    for (int r = 0; r < d->world; r++) {
        const rank_rec *rr = record_of(d, r);
        if (!rr || strstr(rr->reason, "watchdog") || strstr(rr->reason, "error")) return false;
    }
    return wait < hang_after;
}

/* The job whose records diagnose reads: the one that wrote the newest record. */
static const char *newest_job(const rank_rec *recs, int n) {
    const rank_rec *newest = NULL;
    for (int i = 0; i < n; i++)
        if (!newest || recs[i].time > newest->time) newest = &recs[i];
    return newest ? newest->job : "-";
}

/* Reads every rank-R.txt in dir into *recs. */
static ct_status read_records(diag *d, const char *dir, DIR *dh, rank_rec **recs, int *n) {
    ct_status st = CT_OK;
    struct dirent *e;
    while (st == CT_OK && (e = readdir(dh))) {
        int rank;
        char tail[8];
        if (sscanf(e->d_name, "rank-%d.tx%7s", &rank, tail) != 2 || strcmp(tail, "t") != 0)
            continue;
        char path[2 * CT_PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        *recs = realloc(*recs, (size_t)(*n + 1) * sizeof **recs);
        CT_ASSERT(*recs != NULL);
        st = read_record(d, path, &(*recs)[*n]);
        if (st == CT_OK) ++*n;
    }
    return st;
}

static void print_ranks(const diag *d, const char *dir, const char *job, FILE *out) {
    int have = 0;
    for (int r = 0; r < d->world; r++) have += d->ranks[r].rank >= 0;
    fprintf(out, "flight records: %d of %d ranks (%s), job %s\n", have, d->world, dir, job);
    double first = 0, last = 0;
    for (int r = 0; r < d->world; r++) {
        const rank_rec *rr = &d->ranks[r];
        char clock[32];
        if (rr->rank < 0) {
            fprintf(out, "  rank %d: no record\n", r);
            continue;
        }
        if (!first || rr->time < first) first = rr->time;
        if (rr->time > last) last = rr->time;
        clock_label(rr->time, clock, sizeof clock);
        fprintf(out, "  rank %d: host %s, pid %d, written on %s at %s, %d of %lld operations\n", r,
                rr->host, rr->pid, rr->reason, clock, rr->n_ops, rr->recorded);
    }
    if (have > 1)
        fprintf(out,
                "  the records were written %.3f s apart, each at its own moment: an operation "
                "a rank entered after another's record was written is not missing from it\n",
                last - first);
}

ct_status ct_diagnose(const char *run_dir, double hang_after, FILE *out) {
    char dir[CT_PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/flight", run_dir);
    DIR *dh = opendir(dir);
    if (!dh) {
        snprintf(dir, sizeof dir, "%s", run_dir);
        dh = opendir(dir);
    }
    if (!dh) {
        ct_error(CT_ERR_INPUT, "cannot open '%s' (nor '%s/flight')", run_dir, run_dir);
        ct_hint("pass the run's log.run_dir (flight records are in its flight/ directory), or "
                "the directory the job ran in when log.run_dir was not set");
        return CT_ERR_INPUT;
    }
    diag d = {0};
    rank_rec *recs = NULL;
    int files = 0;
    ct_status st = read_records(&d, dir, dh, &recs, &files);
    closedir(dh);
    if (st == CT_OK && files == 0) {
        ct_error(CT_ERR_INPUT, "no flight records (rank-R.txt) in '%s'", dir);
        ct_hint("ranks write them on a watchdog timeout, an MPI or NCCL error, SIGTERM or SIGUSR2 "
                "(`kill -USR2 PID` with the job's mpirun's PID, or `scancel --signal=USR2 JOBID` "
                "under SLURM, while it hangs), into log.run_dir/flight/ or ./flight/");
        st = CT_ERR_INPUT;
    }
    /* One job's records: another job's (an earlier run in the same directory) are named, and
     * left out. */
    char job[64];
    snprintf(job, sizeof job, "%s", newest_job(recs, files));
    for (int i = 0; st == CT_OK && i < files; i++)
        if (!strcmp(recs[i].job, job)) st = keep_record(&d, &recs[i]);
    if (st == CT_OK) {
        print_ranks(&d, dir, job, out);
        for (int i = 0; i < files; i++) {
            if (!strcmp(recs[i].job, job)) continue;
            char clock[32];
            clock_label(recs[i].time, clock, sizeof clock);
            fprintf(out, "  ignored %s: another job's record (job %s, written at %s)\n",
                    recs[i].file, recs[i].job, clock);
        }
        if (hang_after < 0) { /* the watchdog's timeout, at most 10 s */
            hang_after = 10.0;
            for (int r = 0; r < d.world; r++)
                if (d.ranks[r].rank >= 0 && d.ranks[r].timeout_s > 0)
                    hang_after = CT_MIN(hang_after, d.ranks[r].timeout_s);
        }
        char what[512];
        double wait = longest_wait(&d, what, sizeof what);
        finding best = {0};
        for (int g = 0; g < d.n_groups; g++) {
            check_collectives(&d, g, &best);
            check_p2p(&d, g, &best);
        }
        if (running_job(&d, wait, hang_after))
            fprintf(out,
                    "diagnosis: not hung — no rank had waited %.3g s in one operation (the "
                    "longest: %.3f s, %s), every rank wrote a record and no watchdog fired: "
                    "snapshots of a running job\n",
                    hang_after, wait, what);
        else if (best.found)
            fputs(best.text, out);
        else
            fprintf(out, "diagnosis: none — every operation a rank entered was entered by every "
                         "member of its group (a hang outside communication, or records written "
                         "before it)\n");
    }
    for (int i = 0; i < files; i++) free(recs[i].group_map), free(recs[i].ops);
    free(recs);
    for (int r = 0; r < d.world; r++) {
        free(d.ranks[r].group_map);
        free(d.ranks[r].ops);
    }
    free(d.ranks);
    for (int g = 0; g < d.n_groups; g++) free(d.groups[g].members);
    free(d.groups);
    return st;
}
