/*
 * flight.c — the flight recorder (flight.h): a ring of the last N operations of this rank, a
 * registry of the groups they ran on, the writer of the record file, and the planted faults.
 */
#define _GNU_SOURCE
#include "flight.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct entry {
    int64_t id; /* ring position + 1: stale when the ring has moved past it */
    int group;  /* index into groups[] */
    uint8_t kind, is_recv, state;
    ct_dtype dtype;
    int peer, tag;
    uint64_t seq, bytes;
    double start, end;
} entry;

enum { STARTED, ENQUEUED, COMPLETED };
static const char *state_names[] = {"started", "enqueued", "completed"};

/* A group as first seen: what the record file names it by (the comm may be gone by then). */
typedef struct group_info {
    char name[32];
    int rank, size;
    int *members; /* world ranks; NULL when unknown */
} group_info;

/* A pending non-blocking operation and its record. */
typedef struct pending_req {
    ct_comm_request *req;
    int64_t id;
} pending_req;

/* Per-comm counters (comm->flight). */
struct ct_flight_group {
    int group;
    uint64_t coll;          /* collectives started */
    uint64_t *sent, *recvd; /* per peer: sends to it, receives from it */
    pending_req *reqs;
    int n_reqs, cap_reqs;
};

/* A completed operation for the trace (ct_flight_keep_spans). */
typedef struct span {
    int group;
    uint8_t kind, is_recv, on_device;
    int peer;
    uint64_t seq, bytes;
    double start, end; /* ct_now's clock */
} span;

/* What COOKTRAIN_FAULT_COMM asks for. */
enum { FAULT_NONE, FAULT_SKIP, FAULT_MISMATCH, FAULT_SLEEP, FAULT_SLEEP_SEND, FAULT_SLOW };

static struct {
    pthread_mutex_t mu;
    entry *ring;
    int capacity;
    int64_t next; /* records ever started */
    group_info *groups;
    int n_groups;
    char dir[4096];
    int world;
    char job[64];     /* the job's id, on every rank's record */
    double timeout_s; /* the watchdog's: what a wait is compared with */
    /* the writer thread: woken by a signal (ct_flight_signal) */
    sem_t wake;
    volatile sig_atomic_t signal_seen;
    bool writer;
    /* the planted fault */
    bool fault_read;
    int fault_rank;
    char fault_group[32];
    uint64_t fault_seq;
    int fault_action; /* FAULT_* */
    double fault_seconds;
    bool fault_done;
    /* log.trace: every operation that completed, as a span on ct_now's clock */
    bool keep_spans;
    span *spans;
    int64_t n_spans, cap_spans;
} fr = {.mu = PTHREAD_MUTEX_INITIALIZER};

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *writer_main(void *arg) {
    (void)arg;
    for (;;) {
        while (sem_wait(&fr.wake) != 0 && errno == EINTR) continue;
        int sig = fr.signal_seen;
        ct_flight_dump(sig == SIGUSR2 ? "SIGUSR2" : sig == SIGTERM ? "SIGTERM" : "signal");
    }
    return NULL;
}

/* The job id on a record file's second line ("-" when it has none: an older record's format). */
static void record_job(const char *path, char *job, size_t n) {
    snprintf(job, n, "-");
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[1024];
    if (fgets(line, sizeof line, f) && fgets(line, sizeof line, f)) {
        const char *k = strstr(line, " job ");
        char id[64];
        if (k && sscanf(k, " job %63s", id) == 1 && strspn(id, "0123456789abcdef-") == strlen(id))
            snprintf(job, n, "%s", id);
    }
    fclose(f);
}

/* An earlier job's record of `rank` in DIR/flight, moved to DIR/flight/earlier/JOB/, so that the
 * directory holds this job's records only (diagnose reads one job's). */
static void move_aside(const char *flight, int rank) {
    char path[4400], job[64], dest[4500];
    snprintf(path, sizeof path, "%s/rank-%05d.txt", flight, rank);
    if (access(path, F_OK) != 0) return;
    record_job(path, job, sizeof job);
    if (!strcmp(job, fr.job)) return;
    snprintf(dest, sizeof dest, "%s/earlier", flight);
    mkdir(dest, 0777);
    snprintf(dest, sizeof dest, "%s/earlier/%s", flight, strcmp(job, "-") ? job : "unknown");
    mkdir(dest, 0777);
    snprintf(dest + strlen(dest), sizeof dest - strlen(dest), "/rank-%05d.txt", rank);
    if (rename(path, dest) != 0)
        fprintf(stderr,
                "cooktrain: rank %d cannot move an earlier job's flight record %s aside: %s\n",
                rank, path, strerror(errno));
}

void ct_flight_configure(int capacity, const char *dir, int world_size, const char *job,
                         double timeout_s) {
    pthread_mutex_lock(&fr.mu);
    fr.world = world_size;
    free(fr.ring);
    fr.ring = capacity > 0 ? ct_xcalloc((size_t)capacity, sizeof *fr.ring) : NULL;
    fr.capacity = capacity > 0 ? capacity : 0;
    fr.next = 0;
    snprintf(fr.dir, sizeof fr.dir, "%s", dir && dir[0] ? dir : ".");
    snprintf(fr.job, sizeof fr.job, "%s", job && job[0] ? job : "-");
    fr.timeout_s = timeout_s;
    pthread_mutex_unlock(&fr.mu);
    if (fr.capacity) {
        /* each rank moves its own (ranks may not share a file system); rank 0 also those of
         * ranks this job does not have */
        char flight[4200];
        snprintf(flight, sizeof flight, "%s/flight", fr.dir);
        move_aside(flight, ct_log_rank());
        DIR *dh = ct_log_rank() == 0 ? opendir(flight) : NULL;
        struct dirent *e;
        while (dh && (e = readdir(dh))) {
            int r;
            char tail[8];
            if (sscanf(e->d_name, "rank-%d.tx%7s", &r, tail) == 2 && !strcmp(tail, "t") &&
                r >= world_size)
                move_aside(flight, r);
        }
        if (dh) closedir(dh);
    }
    if (fr.capacity && !fr.writer) {
        fr.writer = true;
        sem_init(&fr.wake, 0, 0);
        pthread_t thread;
        sigset_t all, old;
        sigfillset(&all); /* the writer takes no signals: the main thread handles them */
        pthread_sigmask(SIG_SETMASK, &all, &old);
        CT_ASSERTF(pthread_create(&thread, NULL, writer_main, NULL) == 0,
                   "cannot start the flight recorder's writer thread");
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_detach(thread);
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = ct_flight_signal;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART;
        sigaction(SIGUSR2, &sa, NULL);
    }
}

void ct_flight_signal(int sig) {
    if (!fr.writer) return;
    fr.signal_seen = sig;
    sem_post(&fr.wake);
}

/* ---- the planted fault ------------------------------------------------------------------- */

static void read_fault(void) {
    fr.fault_read = true;
    const char *env = getenv("COOKTRAIN_FAULT_COMM");
    if (!env || !env[0]) return;
    char action[16] = "";
    unsigned long long seq = 0;
    double seconds = 0;
    int n = sscanf(env, "%d:%31[^:]:%llu:%15[^:]:%lf", &fr.fault_rank, fr.fault_group, &seq, action,
                   &seconds);
    CT_ASSERTF(
        n >= 4,
        "COOKTRAIN_FAULT_COMM=%s: expected RANK:GROUP:SEQ:skip|mismatch|sleep|sleep-send|slow[:S]",
        env);
    fr.fault_seq = seq;
    fr.fault_seconds = seconds;
    fr.fault_action = !strcmp(action, "skip")         ? FAULT_SKIP
                      : !strcmp(action, "mismatch")   ? FAULT_MISMATCH
                      : !strcmp(action, "sleep")      ? FAULT_SLEEP
                      : !strcmp(action, "sleep-send") ? FAULT_SLEEP_SEND
                      : !strcmp(action, "slow")       ? FAULT_SLOW
                                                      : FAULT_NONE;
    CT_ASSERTF(fr.fault_action, "COOKTRAIN_FAULT_COMM: unknown action '%s'", action);
}

/* The fault planted on this operation, if any: collectives by their number on the group, sends
 * (sleep-send) by their number to their peer. */
static int planted(const ct_comm *comm, ct_comm_op_kind kind, bool is_recv, uint64_t seq) {
    if (!fr.fault_read) read_fault();
    if (!fr.fault_action || fr.fault_done) return FAULT_NONE;
    /* collectives take skip, mismatch and sleep; sends (not receives) sleep-send */
    const bool p2p = kind == CT_COMM_SEND;
    if (p2p != (fr.fault_action == FAULT_SLEEP_SEND) || (p2p && is_recv)) return FAULT_NONE;
    if (ct_log_rank() != fr.fault_rank || strcmp(comm->name, fr.fault_group) != 0)
        return FAULT_NONE;
    if (fr.fault_action == FAULT_SLOW) { /* every collective from the SEQ-th on: a slow rank */
        if (seq < fr.fault_seq) return FAULT_NONE;
        if (seq == fr.fault_seq)
            fprintf(stderr,
                    "cooktrain: planted fault on rank %d: %.3f s of sleep before each collective "
                    "on group %s from #%llu on\n",
                    ct_log_rank(), fr.fault_seconds, comm->name, (unsigned long long)seq);
        return FAULT_SLOW;
    }
    if (seq != fr.fault_seq) return FAULT_NONE;
    fr.fault_done = true;
    fprintf(stderr, "cooktrain: planted fault on rank %d: %s #%llu on group %s\n", ct_log_rank(),
            fr.fault_action == FAULT_SKIP       ? "skip collective"
            : fr.fault_action == FAULT_MISMATCH ? "a barrier in place of collective"
            : fr.fault_action == FAULT_SLEEP    ? "sleep before collective"
                                                : "sleep before send",
            (unsigned long long)seq, comm->name);
    return fr.fault_action;
}

/* ---- recording --------------------------------------------------------------------------- */

static struct ct_flight_group *group_of(ct_comm *comm) {
    if (comm->flight) return comm->flight;
    struct ct_flight_group *g = ct_xcalloc(1, sizeof *g);
    g->sent = ct_xcalloc((size_t)comm->size, sizeof *g->sent);
    g->recvd = ct_xcalloc((size_t)comm->size, sizeof *g->recvd);
    pthread_mutex_lock(&fr.mu);
    fr.groups = realloc(fr.groups, (size_t)(fr.n_groups + 1) * sizeof *fr.groups);
    CT_ASSERT(fr.groups != NULL);
    group_info *gi = &fr.groups[fr.n_groups];
    snprintf(gi->name, sizeof gi->name, "%s", comm->name ? comm->name : "?");
    gi->rank = comm->rank;
    gi->size = comm->size;
    gi->members = NULL;
    if (comm->members) {
        gi->members = ct_xmalloc((size_t)comm->size * sizeof *gi->members);
        memcpy(gi->members, comm->members, (size_t)comm->size * sizeof *gi->members);
    }
    g->group = fr.n_groups++;
    pthread_mutex_unlock(&fr.mu);
    comm->flight = g;
    return g;
}

static int64_t last_id; /* the record started last (main thread) */

ct_flight_fault ct_flight_start(ct_comm *comm, ct_comm_op_kind kind, bool is_recv, int peer,
                                int tag, ct_dtype dtype, int64_t n, int64_t *id) {
    *id = 0;
    if (comm->size <= 1) return CT_FAULT_NONE;
    struct ct_flight_group *g = group_of(comm);
    bool p2p = kind == CT_COMM_SEND;
    uint64_t seq;
    int fault = FAULT_NONE;
    if (p2p) {
        CT_ASSERTF(peer >= 0 && peer < comm->size, "peer %d of group %s", peer, comm->name);
        seq = is_recv ? ++g->recvd[peer] : ++g->sent[peer];
        fault = planted(comm, kind, is_recv, seq);
    } else {
        seq = g->coll + 1;
        fault = planted(comm, kind, false, seq);
        if (fault == FAULT_SKIP) return CT_FAULT_SKIP; /* not issued, not counted */
        g->coll = seq;
        if (fault == FAULT_MISMATCH) /* recorded as what it is */
            kind = CT_COMM_BARRIER, n = 0, dtype = CT_DTYPE_U8;
    }
    if (fault == FAULT_SLEEP || fault == FAULT_SLEEP_SEND || fault == FAULT_SLOW)
        ct_sleep(fr.fault_seconds);
    if (fr.capacity) {
        pthread_mutex_lock(&fr.mu);
        int64_t rec = ++fr.next;
        fr.ring[(rec - 1) % fr.capacity] = (entry){.id = rec,
                                                   .group = g->group,
                                                   .kind = (uint8_t)kind,
                                                   .is_recv = is_recv,
                                                   .state = STARTED,
                                                   .dtype = dtype,
                                                   .peer = p2p ? peer : -1,
                                                   .tag = p2p ? tag : -1,
                                                   .seq = seq,
                                                   .bytes = (uint64_t)n * ct_dtype_size(dtype),
                                                   .start = wall_now(),
                                                   .end = -1};
        last_id = rec;
        pthread_mutex_unlock(&fr.mu);
        *id = rec;
    }
    return fault == FAULT_MISMATCH ? CT_FAULT_MISMATCH : CT_FAULT_NONE;
}

int64_t ct_flight_last(void) {
    return last_id;
}

/* Keeps record e, completed between start and end (ct_now's clock), as a span. Under fr.mu. */
static void keep_span(const entry *e, double start, double end, bool on_device) {
    if (fr.n_spans == fr.cap_spans) {
        fr.cap_spans = fr.cap_spans ? 2 * fr.cap_spans : 1024;
        fr.spans = realloc(fr.spans, (size_t)fr.cap_spans * sizeof *fr.spans);
        CT_ASSERT(fr.spans != NULL);
    }
    fr.spans[fr.n_spans++] = (span){.group = e->group,
                                    .kind = e->kind,
                                    .is_recv = e->is_recv,
                                    .on_device = on_device,
                                    .peer = e->peer,
                                    .seq = e->seq,
                                    .bytes = e->bytes,
                                    .start = start,
                                    .end = end};
}

/* Ends record `id`; a device's times (ct_now's clock) when device_start is not NAN. */
static void end_record(int64_t id, bool enqueued_only, double device_start, double device_end) {
    if (id <= 0 || !fr.capacity) return;
    pthread_mutex_lock(&fr.mu);
    entry *e = &fr.ring[(id - 1) % fr.capacity];
    if (e->id == id && e->state != COMPLETED) {
        e->state = enqueued_only ? ENQUEUED : COMPLETED;
        if (!enqueued_only) e->end = wall_now();
        if (!enqueued_only && fr.keep_spans) {
            /* the device's times, or the host's: the wall-clock length, ending now on ct_now's
             * clock */
            double now = ct_now();
            if (isnan(device_start))
                keep_span(e, now - (e->end - e->start), now, false);
            else
                keep_span(e, device_start, device_end, true);
        }
    }
    pthread_mutex_unlock(&fr.mu);
}

void ct_flight_end(int64_t id, bool enqueued_only) {
    end_record(id, enqueued_only, NAN, NAN);
}

void ct_flight_end_device(int64_t id, double start, double end) {
    end_record(id, false, start, end);
}

bool ct_flight_keeps_spans(void) {
    pthread_mutex_lock(&fr.mu);
    bool on = fr.keep_spans && fr.capacity > 0;
    pthread_mutex_unlock(&fr.mu);
    return on;
}

void ct_flight_keep_spans(bool on) {
    pthread_mutex_lock(&fr.mu);
    fr.keep_spans = on;
    pthread_mutex_unlock(&fr.mu);
}

/* A group's spans go to two threads: tid_base + 2·group on the device, + 1 on the host. */
static int span_tid(int tid_base, const span *sp) {
    return tid_base + 2 * sp->group + (sp->on_device ? 0 : 1);
}

void ct_flight_trace(ct_trace *trace, int tid_base) {
    pthread_mutex_lock(&fr.mu);
    char name[96];
    for (int g = 0; g < fr.n_groups; g++)
        for (int device = 1; device >= 0; device--) {
            bool any = false;
            for (int64_t i = 0; i < fr.n_spans && !any; i++)
                any = fr.spans[i].group == g && fr.spans[i].on_device == device;
            if (!any) continue;
            snprintf(name, sizeof name, "%s comm %s", device ? "device" : "host",
                     fr.groups[g].name);
            ct_trace_thread(trace, tid_base + 2 * g + !device, name);
        }
    for (int64_t i = 0; i < fr.n_spans; i++) {
        const span *sp = &fr.spans[i];
        const char *op = sp->kind == CT_COMM_SEND && sp->is_recv
                             ? "recv"
                             : ct_comm_op_name((ct_comm_op_kind)sp->kind);
        char size[32], peer[24] = "";
        double b = (double)sp->bytes;
        if (b < 1024)
            snprintf(size, sizeof size, "%.0f B", b);
        else if (b < 1048576)
            snprintf(size, sizeof size, "%.1f KiB", b / 1024);
        else
            snprintf(size, sizeof size, "%.1f MiB", b / 1048576);
        if (sp->peer >= 0) snprintf(peer, sizeof peer, " peer %d", sp->peer);
        snprintf(name, sizeof name, "%s %s%s #%llu", op, size, peer, (unsigned long long)sp->seq);
        ct_trace_span(trace, span_tid(tid_base, sp), name, sp->start, sp->end, -1);
    }
    pthread_mutex_unlock(&fr.mu);
}

void ct_flight_request(ct_comm *comm, ct_comm_request *req, int64_t id) {
    if (id <= 0) return;
    struct ct_flight_group *g = group_of(comm);
    if (g->n_reqs == g->cap_reqs) {
        g->cap_reqs = g->cap_reqs ? 2 * g->cap_reqs : 16;
        g->reqs = realloc(g->reqs, (size_t)g->cap_reqs * sizeof *g->reqs);
        CT_ASSERT(g->reqs);
    }
    g->reqs[g->n_reqs++] = (pending_req){req, id};
}

int64_t ct_flight_request_take(ct_comm *comm, ct_comm_request *req) {
    struct ct_flight_group *g = comm->flight;
    if (!g) return 0;
    for (int i = g->n_reqs - 1; i >= 0; i--) {
        if (g->reqs[i].req != req) continue;
        int64_t id = g->reqs[i].id;
        g->reqs[i] = g->reqs[--g->n_reqs];
        return id;
    }
    return 0;
}

void ct_flight_forget(ct_comm *comm) {
    struct ct_flight_group *g = comm->flight;
    if (!g) return;
    free(g->sent);
    free(g->recvd);
    free(g->reqs);
    free(g);
    comm->flight = NULL;
}

/* ---- the record file --------------------------------------------------------------------- */

static const char *kind_name(const entry *e) {
    if (e->kind == CT_COMM_SEND) return e->is_recv ? "recv" : "send";
    return ct_comm_op_name((ct_comm_op_kind)e->kind);
}

static bool dump(const char *why);

bool ct_flight_dump(const char *why) {
    /* the watchdog thread and the writer thread may both write */
    static pthread_mutex_t dump_mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&dump_mu);
    bool ok = dump(why);
    pthread_mutex_unlock(&dump_mu);
    return ok;
}

static bool dump(const char *why) {
    if (!fr.capacity) return false;
    /* a later record replaces an earlier one (it holds more) but keeps why the first was made */
    static char reason[96];
    if (!reason[0] || strlen(reason) + strlen(why) + 2 >= sizeof reason)
        snprintf(reason, sizeof reason, "%s", why);
    else if (strcmp(reason, why) != 0)
        strcat(strcat(reason, ","), why);
    for (char *c = reason; *c; c++) /* one word on the record's line: "MPI-error" */
        if (*c == ' ') *c = '-';
    char dir[4200], path[4300], tmp[4400];
    snprintf(dir, sizeof dir, "%s/flight", fr.dir);
    mkdir(fr.dir, 0777);
    mkdir(dir, 0777);
    int rank = ct_log_rank();
    snprintf(path, sizeof path, "%s/rank-%05d.txt", dir, rank);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fprintf(stderr, "cooktrain: rank %d cannot write its flight record %s: %s\n", rank, tmp,
                strerror(errno));
        return false;
    }
    char host[256] = "-";
    if (gethostname(host, sizeof host - 1) != 0 || !host[0]) snprintf(host, sizeof host, "-");
    for (char *c = host; *c; c++)
        if (*c == ' ' || *c == '\n') *c = '_';
    pthread_mutex_lock(&fr.mu);
    int world = CT_MAX(fr.world, rank + 1);
    fprintf(f, "cooktrain flight record 2\n");
    fprintf(f,
            "rank %d world %d pid %d host %s reason %s time %.6f capacity %d recorded %lld job %s "
            "timeout %.3f\n",
            rank, world, (int)getpid(), host, reason, wall_now(), fr.capacity, (long long)fr.next,
            fr.job, fr.timeout_s);
    for (int i = 0; i < fr.n_groups; i++) {
        const group_info *gi = &fr.groups[i];
        fprintf(f, "group %d %s %d %d", i, gi->name, gi->rank, gi->size);
        for (int m = 0; m < gi->size; m++)
            if (gi->members)
                fprintf(f, " %d", gi->members[m]);
            else
                fprintf(f, " -");
        fputc('\n', f);
    }
    int64_t first = fr.next > fr.capacity ? fr.next - fr.capacity + 1 : 1;
    for (int64_t id = first; id <= fr.next; id++) {
        const entry *e = &fr.ring[(id - 1) % fr.capacity];
        fprintf(f, "op %d %s %llu %d %d %s %llu %.6f %.6f %s\n", e->group, kind_name(e),
                (unsigned long long)e->seq, e->peer, e->tag, ct_dtype_name(e->dtype),
                (unsigned long long)e->bytes, e->start, e->end, state_names[e->state]);
    }
    pthread_mutex_unlock(&fr.mu);
    bool ok = fflush(f) == 0 && !ferror(f);
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        fprintf(stderr, "cooktrain: rank %d cannot write its flight record %s: %s\n", rank, path,
                strerror(errno));
        unlink(tmp);
        return false;
    }
    fprintf(stderr, "cooktrain: rank %d wrote its flight record (%s): %s\n", rank, reason, path);
    return true;
}
