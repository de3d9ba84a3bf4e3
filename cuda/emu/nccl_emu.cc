/*
 * nccl_emu.cc — the NCCL stand-in of the emulated build: the NCCL entry points cuda/comm_nccl.c
 * calls, with the real signatures (declared by <nccl.h>), implemented over MPI on host memory
 * (the emulator's device memory is host memory). Linked only into the emulated build, instead of
 * libnccl; the host code that calls it is the same in both builds.
 *
 * What it holds a caller to, as NCCL documents it:
 *   counts are in elements of the datatype; ncclReduceScatter's recvcount and ncclAllGather's
 *   sendcount are per rank (the full buffer is nranks times that);
 *   every buffer is device memory (one live cudaMalloc allocation covers its whole extent:
 *   a count that is off by a factor of nranks, or a host pointer, is refused);
 *   in place means recvbuff == sendbuff for allreduce and broadcast,
 *   sendbuff == recvbuff + rank·sendcount for allgather, recvbuff == sendbuff + rank·recvcount
 *   for reduce-scatter; any other overlap of send and receive buffers is refused;
 *   sum, max and min on uint8, int32, int64, float32, float64, bfloat16;
 *   every rank of a communicator issues the same collectives in the same order with the same
 *   count, datatype, op and root (checked: a mismatch is printed with both ranks' calls and
 *   becomes the communicator's asynchronous error, ncclInvalidUsage, as far as
 *   ncclCommGetAsyncError is concerned; the operation is then dropped);
 *   send and receive match in posting order between a pair of ranks (no tags), and a receive
 *   must name the count of its send;
 *   calls between ncclGroupStart and ncclGroupEnd are started together at ncclGroupEnd (so a
 *   send and a receive in one group cannot wait for each other), and their buffers are read
 *   only when the stream reaches them.
 * Errors in arguments are printed ("nccl_emu: <call>: <why>") and returned as
 * ncclInvalidArgument or ncclInvalidUsage.
 *
 * Bootstrap. ncclGetUniqueId writes an id naming the calling process (its MPI_COMM_WORLD rank)
 * and a serial number; ncclCommInitRank sends (rank, nranks) to that process, which checks that
 * every rank of the communicator called in once with the same nranks and answers with the list
 * of world ranks; then MPI_Comm_create_group makes the communicator (collective over its members
 * only, as ncclCommInitRank is). The process that made the id must be a member. Needs MPI
 * initialised (the product bootstraps with MPI anyway).
 *
 * Execution: an operation is queued on its stream. When the stream reaches it, it copies its
 * input (the moment a kernel would read it) and starts, non-blocking, both the exchange of call
 * descriptors (to check that every rank called the same operation) and the transfer, on two
 * communicators; from then on it needs only MPI's progress, which any MPI call of the process
 * makes, as a GPU needs no host. It finishes when both have: then it writes its output in one
 * piece. So a caller that forgets to order the stream after the compute that
 * writes the input sends stale data, and one that reads the output without waiting for the
 * stream reads the old contents — wrong results, as on a GPU. Reductions gather every rank's
 * input and add in rank order (deterministic; bf16 widened to float, rounded once). A polled
 * item (cuemu_stream_enqueue_poll): a query never blocks on another rank.
 *
 * ncclCommAbort may be called from another thread (a watchdog): it marks the communicator, and
 * its queued operations finish without result.
 */
#include "cuda/emu/cuemu.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include <cuda_runtime_api.h>
#define OMPI_SKIP_MPICXX 1 /* the C API only */
#include <mpi.h>
#include <nccl.h>

struct ncclComm {
    MPI_Comm mpi = MPI_COMM_NULL;  /* the descriptors every rank's call is checked against */
    MPI_Comm data = MPI_COMM_NULL; /* the transfers: a duplicate, so a mismatch never mixes them */
    int rank = 0, nranks = 0;
    uint64_t issued = 0; /* collectives queued (their sequence numbers) */
    std::atomic<int> async_error{ncclSuccess};
    std::atomic<bool> aborted{false};
    bool destroyed = false;
};

namespace {

const char ID_MAGIC[16] = "cuemu-nccl-id";
const int BOOT_TAG_BASE = 30000; /* MPI_TAG_UB is at least 32767 */

struct emu_id {
    char magic[16];
    int32_t root; /* MPI_COMM_WORLD rank of the process that made the id */
    uint32_t serial;
};

ncclResult_t complain(ncclResult_t r, const char *call, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "nccl_emu: %s: %s\n", call, msg);
    return r;
}

size_t dtype_size(ncclDataType_t dt) {
    switch (dt) {
    case ncclUint8: return 1;
    case ncclInt32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclFloat64: return 8;
    case ncclBfloat16: return 2;
    default: return 0; /* not supported by the stand-in */
    }
}

const char *dtype_name(int dt) {
    switch (dt) {
    case ncclUint8: return "uint8";
    case ncclInt32: return "int32";
    case ncclInt64: return "int64";
    case ncclFloat32: return "float32";
    case ncclFloat64: return "float64";
    case ncclBfloat16: return "bfloat16";
    default: return "?";
    }
}

const char *redop_name(int op) {
    return op == ncclSum ? "sum" : op == ncclMax ? "max" : op == ncclMin ? "min" : "?";
}

enum op_kind { OP_ALLREDUCE, OP_REDUCE_SCATTER, OP_ALLGATHER, OP_BROADCAST, OP_SEND, OP_RECV };
const char *op_call[] = {"ncclAllReduce", "ncclReduceScatter", "ncclAllGather",
                         "ncclBroadcast", "ncclSend",          "ncclRecv"};

/* What every rank of a collective must agree on. */
struct op_desc {
    int64_t kind, dtype, redop, root, count, seq;
};

/* One queued operation and its progress. */
struct op_state {
    op_kind kind;
    const void *send;
    void *recv;
    size_t count; /* elements, as the call gave it */
    ncclDataType_t dtype;
    ncclRedOp_t redop;
    int peer; /* root for broadcast, peer for send/recv */
    ncclComm_t comm;
    cudaStream_t stream;
    int phase = 0; /* 0 not started, 1 agreeing on descriptors, 2 transferring, 3 done */
    MPI_Request desc_req = MPI_REQUEST_NULL;
    op_desc mine{};
    std::vector<op_desc> all_desc;
    std::vector<unsigned char> input, output;
    MPI_Request req = MPI_REQUEST_NULL;
};

using group_t = std::vector<std::shared_ptr<op_state>>;
int group_depth;
group_t group_ops;

/* float value of element i of a buffer of dtype dt */
double load(const unsigned char *p, ncclDataType_t dt, size_t i) {
    switch (dt) {
    case ncclUint8: return p[i];
    case ncclInt32: {
        int32_t v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    case ncclInt64: {
        int64_t v;
        memcpy(&v, p + 8 * i, 8);
        return (double)v;
    }
    case ncclFloat32: {
        float v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    case ncclFloat64: {
        double v;
        memcpy(&v, p + 8 * i, 8);
        return v;
    }
    case ncclBfloat16: {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        uint32_t bits = (uint32_t)h << 16;
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    default: return 0.0;
    }
}

/* Reduces element i over the ranks' inputs at `base + r·stride` bytes, in rank order, into out.
 * Integers are reduced as integers (u8 sums wrap), floats in their own precision (bf16 in float,
 * rounded to nearest even once at the end). */
void reduce_element(const unsigned char *base, size_t stride, int n, ncclDataType_t dt,
                    ncclRedOp_t op, size_t i, unsigned char *out) {
    auto pick = [op](auto acc, auto v) {
        return op == ncclSum ? acc + v : op == ncclMax ? (v > acc ? v : acc) : (v < acc ? v : acc);
    };
    switch (dt) {
    case ncclUint8: {
        uint8_t acc = base[i];
        for (int r = 1; r < n; r++) acc = (uint8_t)pick(acc, base[r * stride + i]);
        out[i] = acc;
        break;
    }
    case ncclInt32:
    case ncclInt64: {
        size_t es = dtype_size(dt);
        int64_t acc = 0;
        for (int r = 0; r < n; r++) {
            int64_t v;
            if (es == 4) {
                int32_t w;
                memcpy(&w, base + r * stride + 4 * i, 4);
                v = w;
            } else
                memcpy(&v, base + r * stride + 8 * i, 8);
            acc = r == 0 ? v : (es == 4 ? (int64_t)(int32_t)pick(acc, v) : pick(acc, v));
        }
        if (es == 4) {
            int32_t w = (int32_t)acc;
            memcpy(out + 4 * i, &w, 4);
        } else
            memcpy(out + 8 * i, &acc, 8);
        break;
    }
    case ncclFloat32:
    case ncclBfloat16: {
        float acc = 0.0f;
        for (int r = 0; r < n; r++) {
            float v = (float)load(base + r * stride, dt, i);
            acc = r == 0 ? v : pick(acc, v);
        }
        if (dt == ncclFloat32) {
            memcpy(out + 4 * i, &acc, 4);
            break;
        }
        uint32_t bits;
        memcpy(&bits, &acc, 4);
        uint16_t h = (acc != acc) ? (uint16_t)((bits >> 16) | 0x40)
                                  : (uint16_t)((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
        memcpy(out + 2 * i, &h, 2);
        break;
    }
    case ncclFloat64: {
        double acc = 0.0;
        for (int r = 0; r < n; r++) {
            double v = load(base + r * stride, dt, i);
            acc = r == 0 ? v : pick(acc, v);
        }
        memcpy(out + 8 * i, &acc, 8);
        break;
    }
    default: break;
    }
}

/* Bytes the operation reads from sendbuff and writes to recvbuff. */
size_t send_bytes(const op_state &o) {
    size_t b = o.count * dtype_size(o.dtype);
    switch (o.kind) {
    case OP_REDUCE_SCATTER: return b * (size_t)o.comm->nranks;
    case OP_BROADCAST: return o.comm->rank == o.peer ? b : 0;
    case OP_RECV: return 0;
    default: return b;
    }
}
size_t recv_bytes(const op_state &o) {
    size_t b = o.count * dtype_size(o.dtype);
    if (o.kind == OP_ALLGATHER) return b * (size_t)o.comm->nranks;
    return o.kind == OP_SEND ? 0 : b;
}

bool overlaps(const void *a, size_t na, const void *b, size_t nb) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na && nb && x < y + nb && y < x + na;
}

/* The argument checks every call makes; ncclSuccess or the error (printed). */
ncclResult_t validate(const op_state &o) {
    const char *call = op_call[o.kind];
    ncclComm_t c = o.comm;
    if (!c || c->destroyed) return complain(ncclInvalidArgument, call, "invalid communicator");
    if (dtype_size(o.dtype) == 0)
        return complain(ncclInvalidArgument, call, "datatype %d is not one the stand-in carries",
                        (int)o.dtype);
    if ((o.kind == OP_ALLREDUCE || o.kind == OP_REDUCE_SCATTER) && o.redop != ncclSum &&
        o.redop != ncclMax && o.redop != ncclMin)
        return complain(ncclInvalidArgument, call,
                        "reduction op %d: the stand-in has sum, max, min", (int)o.redop);
    if ((o.kind == OP_BROADCAST || o.kind == OP_SEND || o.kind == OP_RECV) &&
        (o.peer < 0 || o.peer >= c->nranks))
        return complain(ncclInvalidArgument, call, "%s %d outside a communicator of %d ranks",
                        o.kind == OP_BROADCAST ? "root" : "peer", o.peer, c->nranks);
    size_t sb = send_bytes(o), rb = recv_bytes(o);
    if (sb > INT32_MAX || rb > INT32_MAX)
        return complain(ncclInvalidArgument, call,
                        "%zu bytes: the stand-in carries at most 2 GiB per operation",
                        sb > rb ? sb : rb);
    if (sb && !cuemu_is_device_pointer(o.send, sb))
        return complain(ncclInvalidArgument, call,
                        "sendbuff %p with %zu bytes (count %zu %s) is not inside one device "
                        "allocation",
                        o.send, sb, o.count, dtype_name(o.dtype));
    if (rb && !cuemu_is_device_pointer(o.recv, rb))
        return complain(ncclInvalidArgument, call,
                        "recvbuff %p with %zu bytes (count %zu %s) is not inside one device "
                        "allocation",
                        o.recv, rb, o.count, dtype_name(o.dtype));
    if (sb && rb && overlaps(o.send, sb, o.recv, rb)) {
        size_t shard = o.count * dtype_size(o.dtype) * (size_t)c->rank;
        bool in_place =
            (o.kind == OP_ALLREDUCE || o.kind == OP_BROADCAST) ? o.send == o.recv
            : o.kind == OP_ALLGATHER      ? (const char *)o.send == (const char *)o.recv + shard
            : o.kind == OP_REDUCE_SCATTER ? (const char *)o.recv == (const char *)o.send + shard
                                          : false;
        if (!in_place)
            return complain(ncclInvalidArgument, call,
                            "sendbuff %p and recvbuff %p overlap without being in place (rank %d)",
                            o.send, o.recv, c->rank);
    }
    return ncclSuccess;
}

const char *describe(const op_desc &d, char *buf, size_t cap) {
    snprintf(buf, cap, "%s(count %lld, %s%s%s", op_call[d.kind], (long long)d.count,
             dtype_name((int)d.dtype),
             d.kind == OP_ALLREDUCE || d.kind == OP_REDUCE_SCATTER ? ", " : "",
             d.kind == OP_ALLREDUCE || d.kind == OP_REDUCE_SCATTER ? redop_name((int)d.redop) : "");
    size_t used = strlen(buf);
    if (d.kind == OP_BROADCAST) snprintf(buf + used, cap - used, ", root %lld", (long long)d.root);
    used = strlen(buf);
    snprintf(buf + used, cap - used, ") #%lld", (long long)d.seq);
    return buf;
}

/* Advances one operation as far as it can without waiting; true when it is done. */
bool advance(op_state &o) {
    ncclComm_t c = o.comm;
    int n = c->nranks;
    size_t es = dtype_size(o.dtype), b = o.count * es;
    if (o.phase == 3) return true;
    if (c->aborted.load() || c->async_error.load() != ncclSuccess) {
        o.phase = 3; /* its MPI requests are left behind: the job is ending */
        return true;
    }
    if (o.phase == 0) {
        /* The stream has reached the operation: this is when a kernel would read its input.
         * Descriptors and data are both started now, so that once started, the operation needs
         * nothing but MPI's progress (any MPI call of this process) to finish, as a GPU needs no
         * host: a process blocked in MPI elsewhere still lets the others' operation complete. */
        size_t sb = send_bytes(o);
        o.input.assign((const unsigned char *)o.send, (const unsigned char *)o.send + sb);
        o.output.resize(o.kind == OP_ALLREDUCE || o.kind == OP_ALLGATHER ||
                                o.kind == OP_REDUCE_SCATTER
                            ? b * (size_t)n
                            : b);
        switch (o.kind) {
        case OP_SEND:
            MPI_Isend(o.input.data(), (int)b, MPI_BYTE, o.peer, 0, c->data, &o.req);
            break;
        case OP_RECV:
            MPI_Irecv(o.output.data(), (int)b, MPI_BYTE, o.peer, 0, c->data, &o.req);
            break;
        case OP_ALLREDUCE:
        case OP_ALLGATHER:
            MPI_Iallgather(o.input.data(), (int)b, MPI_BYTE, o.output.data(), (int)b, MPI_BYTE,
                           c->data, &o.req);
            break;
        case OP_REDUCE_SCATTER:
            MPI_Ialltoall(o.input.data(), (int)b, MPI_BYTE, o.output.data(), (int)b, MPI_BYTE,
                          c->data, &o.req);
            break;
        case OP_BROADCAST:
            if (c->rank == o.peer) memcpy(o.output.data(), o.input.data(), b);
            MPI_Ibcast(o.output.data(), (int)b, MPI_BYTE, o.peer, c->data, &o.req);
            break;
        }
        if (o.kind != OP_SEND && o.kind != OP_RECV) {
            o.all_desc.resize((size_t)n);
            MPI_Iallgather(&o.mine, (int)sizeof o.mine, MPI_BYTE, o.all_desc.data(),
                           (int)sizeof o.mine, MPI_BYTE, c->mpi, &o.desc_req);
        }
        o.phase = 1;
    }
    int flag = 0;
    if (o.phase == 1) {
        MPI_Test(&o.desc_req, &flag, MPI_STATUS_IGNORE); /* a null request: done at once */
        if (!flag) return false;
        for (int r = 0; r < n && o.kind != OP_SEND && o.kind != OP_RECV; r++) {
            const op_desc &d = o.all_desc[(size_t)r];
            if (memcmp(&d, &o.mine, sizeof d) != 0) {
                char a[160], x[160];
                fprintf(stderr,
                        "nccl_emu: collective mismatch: rank %d of %d called %s, rank %d called "
                        "%s\n",
                        c->rank, n, describe(o.mine, a, sizeof a), r, describe(d, x, sizeof x));
                c->async_error.store(ncclInvalidUsage);
                o.phase = 3; /* the transfer, mismatched, is abandoned with the communicator */
                return true;
            }
        }
        o.phase = 2;
    }
    MPI_Status status;
    MPI_Test(&o.req, &flag, &status);
    if (!flag) return false;
    /* phase 2: the transfer is complete; write the result in one piece */
    unsigned char *out = (unsigned char *)o.recv;
    switch (o.kind) {
    case OP_ALLREDUCE:
    case OP_REDUCE_SCATTER: {
        std::vector<unsigned char> result(b);
        for (size_t i = 0; i < o.count; i++)
            reduce_element(o.output.data(), b, n, o.dtype, o.redop, i, result.data());
        memcpy(out, result.data(), b);
        break;
    }
    case OP_ALLGATHER: memcpy(out, o.output.data(), b * (size_t)n); break;
    case OP_BROADCAST: memcpy(out, o.output.data(), b); break;
    case OP_RECV: {
        int got = 0;
        MPI_Get_count(&status, MPI_BYTE, &got);
        if ((size_t)got != b) {
            fprintf(stderr,
                    "nccl_emu: ncclRecv on rank %d: %zu bytes expected from rank %d, its ncclSend "
                    "had %d\n",
                    c->rank, b, o.peer, got);
            c->async_error.store(ncclInvalidUsage);
            break;
        }
        memcpy(out, o.output.data(), b);
        break;
    }
    case OP_SEND: break;
    }
    o.phase = 3;
    return true;
}

/* Queues a group of operations on the stream of its first: started together when reached. */
void launch(group_t ops) {
    if (ops.empty()) return;
    cudaStream_t stream = ops[0]->stream;
    cuemu_stream_enqueue_poll(stream, [ops]() {
        bool all = true;
        for (auto &o : ops) all = advance(*o) && all;
        return all;
    });
}

ncclResult_t issue(std::shared_ptr<op_state> o) {
    ncclResult_t r = validate(*o);
    if (r != ncclSuccess) return r;
    if (o->kind != OP_SEND && o->kind != OP_RECV)
        o->mine = op_desc{
            o->kind,
            o->dtype,
            o->kind == OP_ALLREDUCE || o->kind == OP_REDUCE_SCATTER ? (int64_t)o->redop : -1,
            o->kind == OP_BROADCAST ? o->peer : -1,
            (int64_t)o->count,
            (int64_t)o->comm->issued++};
    if (group_depth > 0) {
        if (!group_ops.empty() && group_ops[0]->stream != o->stream)
            return complain(ncclInvalidUsage, op_call[o->kind],
                            "the stand-in needs one stream per group");
        group_ops.push_back(o);
    } else {
        launch(group_t{o});
    }
    return ncclSuccess;
}

std::shared_ptr<op_state> make_op(op_kind kind, const void *send, void *recv, size_t count,
                                  ncclDataType_t dt, ncclRedOp_t op, int peer, ncclComm_t comm,
                                  cudaStream_t stream) {
    auto o = std::make_shared<op_state>();
    o->kind = kind;
    o->send = send;
    o->recv = recv;
    o->count = count;
    o->dtype = dt;
    o->redop = op;
    o->peer = peer;
    o->comm = comm;
    o->stream = stream;
    return o;
}

} // namespace

/* ---- the NCCL entry points ----------------------------------------------------------------- */

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result) {
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    return "";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *unique_id) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited)
        return complain(ncclSystemError, "ncclGetUniqueId",
                        "the stand-in bootstraps over MPI, which is not initialised");
    if (!unique_id) return complain(ncclInvalidArgument, "ncclGetUniqueId", "null id");
    static uint32_t serial;
    emu_id id{};
    memcpy(id.magic, ID_MAGIC, sizeof id.magic);
    MPI_Comm_rank(MPI_COMM_WORLD, &id.root);
    id.serial = serial++;
    memset(unique_id, 0, sizeof *unique_id);
    memcpy(unique_id->internal, &id, sizeof id);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId comm_id, int rank) {
    const char *call = "ncclCommInitRank";
    emu_id id;
    memcpy(&id, comm_id.internal, sizeof id);
    if (!comm) return complain(ncclInvalidArgument, call, "null communicator pointer");
    if (memcmp(id.magic, ID_MAGIC, sizeof id.magic) != 0)
        return complain(ncclInvalidArgument, call,
                        "the id was not made by ncclGetUniqueId (not broadcast to this rank?)");
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return complain(ncclInvalidArgument, call, "rank %d of %d", rank, nranks);
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    const int tag = BOOT_TAG_BASE + (int)(id.serial % 2000);
    /* [0] status (0 ok), [1 + r] world rank of communicator rank r */
    std::vector<int> members((size_t)nranks + 1, -1);
    if (world_rank == id.root) {
        members[0] = 0;
        members[1 + (size_t)rank] = world_rank;
        for (int k = 1; k < nranks; k++) {
            int msg[3]; /* rank, nranks, world rank */
            MPI_Recv(msg, 3, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (msg[1] != nranks || msg[0] < 0 || msg[0] >= nranks || members[1 + msg[0]] != -1) {
                complain(ncclInvalidUsage, call,
                         "world rank %d joined as rank %d of %d; the root expects %d ranks%s",
                         msg[2], msg[0], msg[1], nranks,
                         msg[0] >= 0 && msg[0] < nranks && members[1 + msg[0]] != -1
                             ? " and has that rank already"
                             : "");
                members[0] = 1;
                if (msg[0] >= 0 && msg[0] < nranks && members[1 + msg[0]] == -1)
                    members[1 + msg[0]] = msg[2];
            } else {
                members[1 + msg[0]] = msg[2];
            }
        }
        for (int r = 0; r < nranks; r++)
            if (r != rank && members[1 + (size_t)r] >= 0)
                MPI_Send(members.data(), nranks + 1, MPI_INT, members[1 + (size_t)r], tag,
                         MPI_COMM_WORLD);
    } else {
        int msg[3] = {rank, nranks, world_rank};
        MPI_Send(msg, 3, MPI_INT, id.root, tag, MPI_COMM_WORLD);
        MPI_Recv(members.data(), nranks + 1, MPI_INT, id.root, tag, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
    }
    if (members[0] != 0) return ncclInvalidUsage;
    MPI_Group world_group, group;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    MPI_Group_incl(world_group, nranks, members.data() + 1, &group);
    ncclComm *c = new ncclComm();
    MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &c->mpi);
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN);
    MPI_Comm_dup(c->mpi, &c->data);
    c->rank = rank;
    c->nranks = nranks;
    *comm = c;
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    if (!comm || !count) return ncclInvalidArgument;
    *count = comm->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    if (!comm || !rank) return ncclInvalidArgument;
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error) {
    if (!comm || !async_error) return ncclInvalidArgument;
    *async_error = (ncclResult_t)comm->async_error.load();
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    comm->aborted.store(true); /* from any thread: queued operations finish without result */
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    if (comm->destroyed) return complain(ncclInvalidArgument, "ncclCommDestroy", "destroyed twice");
    /* NCCL waits for the communicator's queued work; its streams are the caller's to drain */
    comm->destroyed = true;
    if (!comm->aborted.load() && comm->mpi != MPI_COMM_NULL) {
        MPI_Comm_free(&comm->data);
        MPI_Comm_free(&comm->mpi);
    }
    /* kept, not deleted: queued items may still point at it after an abort */
    return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
    if (group_depth == 0)
        return complain(ncclInvalidUsage, "ncclGroupEnd", "without ncclGroupStart");
    if (--group_depth == 0) {
        group_t ops;
        ops.swap(group_ops);
        launch(ops);
    }
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
    return issue(make_op(OP_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, -1, comm, stream));
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
    return issue(
        make_op(OP_REDUCE_SCATTER, sendbuff, recvbuff, recvcount, datatype, op, -1, comm, stream));
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
    return issue(
        make_op(OP_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, -1, comm, stream));
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
    return issue(
        make_op(OP_BROADCAST, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream));
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
    return issue(make_op(OP_SEND, sendbuff, nullptr, count, datatype, ncclSum, peer, comm, stream));
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
    return issue(make_op(OP_RECV, nullptr, recvbuff, count, datatype, ncclSum, peer, comm, stream));
}
