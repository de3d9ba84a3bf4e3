/*
 * backend.h — tensors and the ops the model needs, behind one interface (core/README.md, The
 * backend interface).
 *
 * A backend is a table of function pointers (struct ct_backend_i) plus a context. The CPU backend
 * (cpu/backend_cpu.c) is always built and is the numerical reference; the CUDA backend (cuda/)
 * fills the same table. Model, optimizer and training loop reach ops only through the ct_* wrappers
 * below, which check shapes (CT_ASSERT: a mismatch is a bug) and pass raw pointers and sizes to
 * the slot. Model code never dereferences tensor memory: values reach the host only through
 * ct_tensor_to_host().
 *
 * Tensors are small host-side handles (dtype, shape, owning backend, pointer into backend memory).
 * Memory is allocated in slabs (ct_tensor_new) and carved into views (ct_tensor_view), so every
 * byte belongs to one accounting category (enum ct_mem_category).
 *
 * Ordering: ops may run asynchronously on the backend's stream. event_record / event_wait / sync
 * order work against communication; all three are no-ops on the CPU.
 *
 * Conventions: matrices are row-major; a linear weight is (out_features, in_features). N = rows
 * (B·T tokens), C = channels. "accumulates" means the op adds into its output (+=); otherwise it
 * overwrites. Reductions inside ops are split into fixed-size chunks summed in a fixed order, so
 * results do not depend on the thread count.
 */
#ifndef CT_BACKEND_H
#define CT_BACKEND_H

#include "backend_ops.h"
#include "core/common.h"

#define CT_MAX_DIMS 4
#define CT_BACKEND_EVENTS 16 /* event ids per backend (event_record / event_wait) */

typedef enum ct_mem_category {
    CT_MEM_PARAMS = 0,
    CT_MEM_GRADS,
    CT_MEM_OPTIM,  /* AdamW m and v (fp32) */
    CT_MEM_MASTER, /* fp32 master weights (bf16 mixed precision only) */
    CT_MEM_ACTS,
    CT_MEM_COMM,
    CT_MEM_GATHERED,
    CT_MEM_WORKSPACE,
    CT_MEM_COUNT
} ct_mem_category;

const char *ct_mem_category_name(ct_mem_category category);

struct ct_backend;

typedef struct ct_tensor {
    ct_dtype dtype;
    int ndim;
    int64_t shape[CT_MAX_DIMS];
    int64_t numel;
    struct ct_backend *backend;
    void *data;     /* backend memory; only backends and comm implementations touch it */
    bool owns_data; /* true for slabs from ct_tensor_new, false for views */
    ct_mem_category category;
} ct_tensor;

/* One contiguous range of a flat optimizer buffer with its weight decay (0 for biases, norms). */
typedef struct ct_adamw_segment {
    int64_t offset; /* element offset inside the flat range */
    int64_t count;
    float weight_decay;
} ct_adamw_segment;

typedef struct ct_adamw_hparams {
    float lr, beta1, beta2, eps;
    int64_t step;     /* 1-based step number for bias correction */
    float grad_scale; /* gradients are multiplied by this first (clipping) */
} ct_adamw_hparams;

/*
 * The slots. Pointers are backend memory. Optional slots may be NULL (default written beside).
 *
 * Precision. Every op that touches activations takes `dt`, the storage dtype of its activations
 * and of the parameters it reads: CT_DTYPE_F32 (train.precision fp32) or CT_DTYPE_BF16 (bf16
 * mixed precision). Those pointers are `void *` and hold dt elements. Everything else is fp32 in
 * both modes and typed `float *`: parameter gradients (dw, db, dbias, dtable, dwpe — they
 * accumulate across microbatches), statistics (mean, rstd, lse, rowmax, sumexp, target_logit,
 * losses), optimizer state and master weights. Arithmetic is fp32 throughout (bf16 values are
 * widened on load and rounded to nearest even on store), and reductions accumulate in fp32 or
 * wider. So a backend provides, for each precision:
 *   fp32: every slot with dt = F32 (the exact reference);
 *   bf16: every slot with dt = BF16, gemm with bf16 A and B into an f32 or bf16 C, adamw writing
 *         a bf16 copy of the updated fp32 master weights, and cast.
 */
struct ct_backend_i {
    const char *name;

    /* memory */
    void *(*alloc)(void *ctx, size_t bytes); /* NULL on out-of-memory */
    void (*free)(void *ctx, void *ptr);
    void (*copy_from_host)(void *ctx, void *dst, const void *src, size_t bytes);
    void (*copy_to_host)(void *ctx, void *dst, const void *src, size_t bytes);

    /*
     * The ops: one slot per entry of CT_BACKEND_OPS (backend_ops.h), in its order,
     *     void (*name)(void *ctx, <its parameters>);
     * fill and copy (device to device) are memory ops; the others are the ct_ wrappers' below,
     * whose comments give each op's formula. What the wrappers do not say:
     *
     * gemm: C(M,N) = alpha·op(A)·op(B) + beta·C, row-major, op = transpose when trans_*;
     * lda/ldb/ldc are row strides in elements. A and B hold ab_dtype elements, C c_dtype (f32/f32,
     * bf16/f32 or bf16/bf16); products accumulate in fp32. beta = 0 never reads C.
     *
     * gemm_bias_gelu (optional): a linear layer's forward with GELU fused into the GEMM's
     * epilogue,
     *     pre(M,N) = A(M,K)·B(N,K)ᵀ + bias(N),   out(M,N) = GELU(pre)   (tanh form, as gelu_fwd),
     * row-major, lda/ldb >= K, ldpre/ldout >= N (row strides in elements); B is a weight stored
     * (out, in) = (N, K). A, B, bias, pre and out hold dt; products accumulate in fp32 and GELU is
     * evaluated in fp32 (in bf16 on the value of pre before or after its rounding: either is
     * within the tolerance of the separate ops). pre is kept for GELU's backward. NULL: the
     * wrapper (ct_gemm_bias_gelu) runs bias_init, gemm with beta = 1 and gelu_fwd instead — the
     * reference; the CPU backend leaves it NULL. out NULL (ct_gemm_bias): no GELU, pre is the
     * layer's output, the bias added in fp32 before pre's one rounding (without it: bias_init
     * and gemm with beta = 1).
     *
     * adamw: AdamW on fp32 weights (the parameters in fp32 mode, the master weights in bf16
     * mode); when param_copy is not NULL every updated element is also stored there as
     * copy_dtype (the bf16 parameters the model computes with).
     *
     * sumsq: out[i] = Σ_j x[i][j]² over n[i] elements, for each of count ranges at once (one
     * launch on a GPU rather than one per tensor): in double with fixed chunking, as float. The
     * arrays x and n are the caller's and may be reused as soon as the slot returns.
     */
#define CT_OP_SLOT_(name, need, queue, ...) void (*name)(void *ctx, CT_OP_PARAMS(__VA_ARGS__));
    CT_BACKEND_OPS(CT_OP_SLOT_)
#undef CT_OP_SLOT_

    /* Ordering (NULL: no-op, for a backend whose ops complete before their slot returns, as the
     * plain CPU backend's do). Ops run in the order they are issued, on the backend's stream,
     * possibly after their slot has returned; host memory passed to a slot (hp, segments) may be
     * reused as soon as the slot returns. Events are integers in [0, CT_BACKEND_EVENTS).
     *   event_record: event `event` completes once every op issued before it has completed
     *                 (recording it again moves it to the current point);
     *   event_wait:   the host blocks until `event`, as last recorded, has completed;
     *   sync:         the host blocks until every op issued so far has completed.
     * copy_to_host returns with the bytes on the host (it waits for the ops before it); free
     * waits for the ops that may still use the memory. */
    void (*event_record)(void *ctx, int event);
    void (*event_wait)(void *ctx, int event);
    void (*sync)(void *ctx);

    /* The stream's clock (NULL: the host's, read when ct_backend_mark is called, right for a
     * backend whose ops complete before their slot returns).
     *   mark:       mark `id` takes the time at which the stream reaches this point (every op
     *               issued before it has completed); ids count from 0 again after a clear;
     *   marks_read: called after sync, when every mark has passed: times[i] = mark i's time for
     *               i < n, in seconds on ct_now's clock. */
    void (*mark)(void *ctx, int64_t id);
    void (*marks_read)(void *ctx, int64_t n, double *times);

    /* Graphs (all NULL: the backend cannot capture; train.cuda_graph is refused).
     *   capture_begin: from here the ops and memory ops issued (fill, copy) are recorded, not
     *                  run, until capture_end; nothing that waits, reads the stream's clock,
     *                  allocates or frees may be issued meanwhile (ct_backend asserts it);
     *   capture_end:   ends the recording; returns the graph and its operation count in *ops;
     *   graph_launch:  issues the recorded operations again, in their order, with the arguments
     *                  they were issued with (the same memory, the same host scalars), as if the
     *                  host had made the same calls; returns false, issuing nothing, when device
     *                  memory has been freed since the capture (an address in the graph may
     *                  dangle: capture again);
     *   graph_free:    releases the graph (the stream may still run a launch of it). */
    void (*capture_begin)(void *ctx);
    void *(*capture_end)(void *ctx, int64_t *ops);
    bool (*graph_launch)(void *ctx, void *graph);
    void (*graph_free)(void *ctx, void *graph);

    /* The hardware's peak FLOP/s for multiplies in dtype `dt` (f32 or bf16, fp32 accumulation) on
     * the threads or device this backend uses — the denominator of MFU — and how it was obtained,
     * written into `how` (e.g. "measured: FMA loop on 2 threads"). NULL: unknown (MFU is then
     * not reported). */
    double (*peak_flops)(void *ctx, ct_dtype dt, char *how, size_t how_cap);

    /* What runs the ops, for the start-up line, e.g. "2 threads" or "H100, 80 GiB". NULL: the
     * name alone. */
    void (*describe)(void *ctx, char *buf, size_t cap);

    void (*free_backend)(void *ctx); /* NULL: nothing to release */
};

/* Op categories of the profile (--profile): where a step's compute time goes. */
typedef enum ct_prof_category {
    CT_PROF_GEMM = 0,
    CT_PROF_ATTENTION,
    CT_PROF_NORM,
    CT_PROF_ELEMENTWISE, /* bias, GELU, residual adds, casts */
    CT_PROF_EMBEDDING,
    CT_PROF_LOSS,
    CT_PROF_OPTIMIZER, /* AdamW and the gradient norm */
    CT_PROF_COUNT
} ct_prof_category;
/* Ops --profile times one by one (there are fewer wrappers than this). */
enum { CT_PROF_OPS_MAX = 64 };
/* GEMM shapes the device-idle audit times apart (a model has a few dozen; more are dropped). */
enum { CT_GEMM_SHAPES_MAX = 64 };

const char *ct_prof_category_name(ct_prof_category category);

typedef struct ct_backend {
    const struct ct_backend_i *iface;
    void *ctx;
    /* Allocations beyond this many bytes in total fail as out of memory (0: no limit): the
     * environment variable COOKTRAIN_MEM_LIMIT_MB sets it when a backend is made, to rehearse a
     * device's memory on the CPU and to test the out-of-memory paths. */
    size_t mem_limit;
    /* Fault injection for tests: every allocation of this category fails as out of memory (-1:
     * none). The environment variable COOKTRAIN_FAIL_ALLOC=<category name> sets it. */
    int fail_category;
    size_t bytes_in_use[CT_MEM_COUNT];
    size_t peak_bytes[CT_MEM_COUNT];
    bool profiling;
    double prof_seconds[CT_PROF_COUNT]; /* wall time inside each category's ops */
    /* The same time by op (the ct_ wrapper that ran it, "ct_" dropped), in first-call order. */
    struct ct_prof_op {
        const char *name;
        double seconds;
        int64_t calls;
    } prof_ops[CT_PROF_OPS_MAX];
    int n_prof_ops;
    /* log.device_idle (ct_backend_idle): a mark before and after every op, read at each
     * ct_backend_marks_settle into the time the stream spent in ops (busy) and between them
     * (idle: waiting for the host to issue the next op, or for an event), the idle time charged
     * to the op that ended the wait. */
    bool idle_on;
    bool idle_paused;   /* ct_backend_idle_pause: ops go unaudited (the trainer's, between steps) */
    int idle_depth;     /* ops inside ops count once, as the outer op */
    struct ct_idle_op { /* the ops since the last settle */
        int64_t before, after; /* their marks */
        const char *name;      /* the wrapper's, "ct_" dropped (as in prof_ops) */
        int gemm;              /* its entry of busy_by_gemm (ct_backend_idle_gemm), or -1 */
    } * idle_ops;
    int64_t n_idle_ops, cap_idle_ops;
    double idle_settled_at; /* ct_now after the last settle's wait: the stream was empty then */
    double idle_busy, idle_gaps; /* seconds, since ct_backend_idle(be, true) */
    int64_t idle_n_ops;
    struct ct_prof_op idle_by_op[CT_PROF_OPS_MAX]; /* seconds: idle before the op; calls */
    int n_idle_by_op;
    struct ct_prof_op busy_by_op[CT_PROF_OPS_MAX]; /* seconds: in the op; calls */
    int n_busy_by_op;
    /* The GEMM ops' time in the stream by shape, in first-call order. */
    struct ct_gemm_shape {
        const char *op;  /* the wrapper: gemm, gemm_bias (+ bias), gemm_bias_gelu (+ bias, GELU) */
        int64_t M, N, K; /* C (M × N) = op(A) (M × K) · op(B) (K × N), row-major */
        bool trans_a, trans_b;
        bool accumulate; /* beta ≠ 0: C += the product */
        ct_dtype ab, c;  /* the operands' and C's types */
        double seconds;
        int64_t calls;
    } busy_by_gemm[CT_GEMM_SHAPES_MAX];
    int n_busy_by_gemm;
    /* Copies to the host so far (ct_tensor_to_host and the _f32 form). Each one waits for the
     * stream, so the training loop makes a fixed few per step whatever the microbatch count
     * (loss, gradient norm); its metrics report them and tests compare. */
    int64_t host_copies;
    /* The marks since the last settle (ct_backend_mark): their times, NAN until settled. */
    double *mark_times;
    int64_t n_marks, cap_marks;
    bool capturing; /* between ct_backend_capture_begin and _end */
} ct_backend;

/* Starts (on) or stops timing every op by category, clearing the totals. */
void ct_backend_profile(ct_backend *be, bool on);
/* Adds `seconds` and one call to op `name`'s entry of ops[0..*n) (--profile's and the device-idle
 * audit's tables), found by the static string's address; a new op is appended, or dropped once
 * CT_PROF_OPS_MAX are there. */
void ct_prof_op_add(struct ct_prof_op *ops, int *n, const char *name, double seconds);
/* Starts (on) or stops the device-idle audit (log.device_idle), clearing its totals (call it
 * after a settle, outside ops): from then
 * each op is bracketed by two marks (no waits: the host runs ahead as it would), and each
 * ct_backend_marks_settle adds to be->idle_busy the time between each op's marks (and to the
 * op's entry of be->busy_by_op: a profile on the device's own clock, nothing synced), to
 * be->idle_gaps the time from one op's end (or the settle before) to the next op's start, and
 * that gap to the next op's entry in be->idle_by_op. Excludes log.profile, whose waits around
 * every op are idle time themselves. */
void ct_backend_idle(ct_backend *be, bool on);
/* Leaves ops unaudited while paused, keeping the totals (call it outside ops, after a settle): the
 * trainer audits its steps, not the evaluation and checkpoints between them. */
void ct_backend_idle_pause(ct_backend *be, bool paused);
/* The audit's brackets around one op (no-ops while it is off), which the op wrappers call; name:
 * a static string. COOKTRAIN_FAULT_HOST_DELAY=OP:N:SECONDS makes the host sleep before issuing
 * the N-th audited call of op OP (the tests' late host). */
void ct_backend_idle_begin(ct_backend *be, const char *name);
void ct_backend_idle_end(ct_backend *be);
/* Called by a GEMM wrapper between its brackets: the op's shape, whose time in the stream goes to
 * its entry of be->busy_by_gemm as well (when the op is the outermost one audited). */
void ct_backend_idle_gemm(ct_backend *be, int64_t M, int64_t N, int64_t K, bool trans_a,
                          bool trans_b, bool accumulate, ct_dtype ab, ct_dtype c);

/* ---- backends ---------------------------------------------------------------------------- */

/*
 * The registry: the one place backends are made. Built in: "cpu" (cpu/backend_cpu.c, always) and
 * "cpu-async" (the CPU backend behind the asynchronous stream, ct_backend_async_new). A backend
 * built elsewhere (cuda/) registers itself with ct_backend_register before the first
 * ct_backend_new. `name` "auto" picks the first registered accelerator whose `usable` says yes,
 * else "cpu". The environment variable COOKTRAIN_ASYNC=1 puts whatever backend is made behind the
 * asynchronous stream (how the test suite proves the ordering of every caller); CT_CHECK_BACKEND=1
 * then wraps any backend other than the plain "cpu" in check mode (ct_backend_check_new).
 * n_threads: host threads (<= 0: what OpenMP would use). On success *out is the backend and
 * `chosen` (cap bytes) says what was picked and why, e.g. "cpu (auto: this build has no CUDA
 * backend)". An unknown name, or a known one that is not built or cannot run here, is
 * CT_ERR_INPUT with a message and a hint.
 */
typedef struct ct_backend_desc {
    const char *name;
    ct_backend *(*create)(int n_threads);
    /* NULL: always usable. Else true when the backend can run here; false with the reason
     * written into why (e.g. "no usable CUDA device (cudaErrorInsufficientDriver)"). */
    bool (*usable)(char *why, size_t cap);
    bool accelerator; /* a candidate for "auto" */
    /* NULL: not a device backend. Else how many devices this process sees (0 with the reason in
     * why when none is usable). */
    int (*device_count)(char *why, size_t cap);
    /* NULL: bf16 is computed by widening to fp32 (train.precision=auto picks fp32). Else true
     * when the backend multiplies bf16 natively here, so auto picks bf16; how says why either way
     * ("avx512_bf16", "a CUDA device", "no native bf16 (...)"). */
    bool (*native_bf16)(char *how, size_t cap);
} ct_backend_desc;
void ct_backend_register(const ct_backend_desc *desc);
ct_status ct_backend_new(ct_backend **out, const char *name, int n_threads, char *chosen,
                         size_t cap);
/* The registered backend that ct_backend_new(name) would make: name itself, or for "auto" the
 * first usable accelerator, else "cpu". NULL when name is not registered (ct_backend_new then
 * says why). */
const char *ct_backend_resolve(const char *name);
/* train.precision=auto, decided by the backend that will run (ct_backend_resolve(name)): true when
 * it multiplies bf16 natively here (ct_backend_desc.native_bf16), so bf16 is the faster choice;
 * false for fp32. how (cap bytes) gets the reason the run prints: "avx512_bf16", "a CUDA
 * device", "forced off by COOKTRAIN_CPU_BF16=0". */
bool ct_backend_native_bf16(const char *name, char *how, size_t cap);
/*
 * Device selection for accelerator backends: the device ordinal the next one made opens (0 by
 * default). cmd/ sets it from the node-local rank (one rank per GPU, parallel/README.md, The grid).
 * ct_backend_device_count asks the named backend how many devices it sees (0 for a backend that
 * is not a device backend, or not registered, or has none usable: why says which).
 */
void ct_backend_set_device(int device);
int ct_backend_device(void);
int ct_backend_device_count(const char *name, char *why, size_t cap);
/* The CPU backend (only the registry and the CPU backend's own tests call it directly);
 * n_threads <= 0 means "what OpenMP would use". */
ct_backend *ct_backend_cpu_new(int n_threads);
/*
 * The asynchronous stream (backend_async.c): a backend whose ops run on a worker thread, after
 * their slot has returned, by `inner`'s slots, in issue order. It runs queued work lazily — only
 * when the host waits (event_wait, sync, copy_to_host, free, peak_flops) or the queue is full —
 * so an op that reaches memory without the wait the ordering rules require (a collective reading
 * a gradient before the backward that writes it has run) sees stale values every time, not by
 * chance. Takes ownership of `inner`. Results are bit-identical to `inner`'s.
 */
ct_backend *ct_backend_async_new(ct_backend *inner);
/*
 * Check mode (backend_check.c): a backend whose every op runs on `inner` (the backend under test)
 * and then again on a private CPU backend from the same input bytes, the results compared with a
 * per-op tolerance derived in that file (exact for copies, casts and gathers; a few ulps for
 * elementwise ops; K·2^-24 relative to Σ|terms| for reductions of K terms; one bf16 ulp more for
 * bf16 outputs). The first op that differs is reported on stderr — op, shape arguments, output
 * buffer, worst element (index, got, want, tolerance), how many ops agreed before it — and the
 * process exits with status 1; an op that changes one of its read-only operands is reported the
 * same way. Memory, ordering, peak_flops pass through; describe says "checked: ...". Slow by
 * design (every operand goes through the host). The environment variable CT_CHECK_BACKEND=1 makes
 * ct_backend_new wrap every backend but the plain "cpu" in it; CT_CHECK_BACKEND_RTOL=<factor>
 * scales every non-exact tolerance. Takes ownership of `inner`.
 */
ct_backend *ct_backend_check_new(ct_backend *inner);
void ct_backend_free(ct_backend *be);
/* The first slot a complete backend must fill that `iface` leaves NULL — a memory slot or an op
 * of CT_BACKEND_OPS that is not optional — as its name; NULL when there is none. ct_backend_new
 * asserts it on every backend it makes. */
const char *ct_backend_missing_op(const struct ct_backend_i *iface);
/* The backend's name and what runs its ops (the describe slot), e.g. "cpu, 2 threads". */
void ct_backend_describe(const ct_backend *be, char *buf, size_t cap);
/* Ordering (the slots' rules above): the host waits for everything issued so far; records event
 * `event` at the current point of the stream; waits on the host for it. */
void ct_backend_sync(ct_backend *be);
void ct_backend_event_record(ct_backend *be, int event);
void ct_backend_event_wait(ct_backend *be, int event);
/*
 * The stream's clock, for measuring what the device did rather than what the host waited for
 * (core/README.md, Device time): under NCCL a wait makes the stream wait, not the host, so only
 * the stream sees exposed communication and bubble.
 *   ct_backend_mark:         a mark at the current point of the stream; returns its id (0, 1,
 *                            ... since the last clear).
 *   ct_backend_marks_settle: the host waits for the stream; then every mark's time is known.
 *   ct_backend_mark_time:    mark `id`'s time (seconds, ct_now's clock), once settled. A
 *                            backend without a clock of its own (mark slot NULL) gives the
 *                            host's time when the mark was made, known at once.
 *   ct_backend_marks_clear:  forgets every mark (the trainer's, once a step's users have read
 *                            theirs: cmd/train/trainer.c, settle_marks).
 */
int64_t ct_backend_mark(ct_backend *be);
void ct_backend_marks_settle(ct_backend *be);
double ct_backend_mark_time(const ct_backend *be, int64_t id);
void ct_backend_marks_clear(ct_backend *be);

/*
 * Graphs (the capture slots above; core/README.md, CUDA graphs): a sequence of ops recorded once
 * and issued again by one call, which saves the host its per-op work.
 *   ct_backend_can_capture:   whether the backend has the slots;
 *   ct_backend_capture_begin: ops from here on are recorded, not run; a host copy, wait, mark,
 *                             allocation or free before ct_backend_capture_end is a bug (asserted);
 *   ct_backend_capture_end:   the graph (NULL never: a failed capture exits), its op count in
 *                             *ops;
 *   ct_backend_graph_launch:  issues the recorded ops again; false, issuing nothing, when device
 *                             memory was freed since the capture (capture again);
 *   ct_backend_graph_free:    NULL is ignored.
 */
typedef struct ct_backend_graph ct_backend_graph;
bool ct_backend_can_capture(const ct_backend *be);
void ct_backend_capture_begin(ct_backend *be);
ct_backend_graph *ct_backend_capture_end(ct_backend *be, int64_t *ops);
bool ct_backend_graph_launch(ct_backend *be, ct_backend_graph *graph);
void ct_backend_graph_free(ct_backend *be, ct_backend_graph *graph);

/* Waits timed on the stream's clock: the stream's idle time while it waits for something else
 * (communication), between a mark before the wait and one after. The owner zero-initialises it
 * (keep: also keep each wait as a span, for the trace), and after each ct_backend_marks_settle
 * calls ct_waits_settle, which adds the waits since the last one to `seconds`. */
typedef struct ct_waits {
    bool keep;
    double seconds;
    int64_t *marks; /* (before, after) per wait since the last settle */
    int n_marks, cap_marks;
    double *spans; /* (start, end) per kept wait, ct_now's clock */
    int n_spans, cap_spans;
} ct_waits;
void ct_waits_end(ct_waits *w, ct_backend *be, int64_t before); /* before: ct_backend_mark's */
void ct_waits_settle(ct_waits *w, const ct_backend *be);
void ct_waits_release(ct_waits *w);
/* Sets be->mem_limit from COOKTRAIN_MEM_LIMIT_MB (a malformed value is ignored with a warning)
 * and be->fail_category from COOKTRAIN_FAIL_ALLOC; every backend constructor calls it. */
void ct_backend_apply_env(ct_backend *be);
/* The backend's peak_flops slot (0 when the backend does not know; `how` says so). */
double ct_backend_peak_flops(ct_backend *be, ct_dtype dt, char *how, size_t how_cap);

/* Bytes currently allocated in one category and the total over all categories. */
size_t ct_backend_mem(const ct_backend *be, ct_mem_category category);
size_t ct_backend_mem_total(const ct_backend *be);
/* Copies bytes_in_use of every category into bytes[CT_MEM_COUNT]. */
void ct_backend_mem_snapshot(const ct_backend *be, size_t *bytes);

/* ---- tensors ----------------------------------------------------------------------------- */

/* Allocates a tensor (a slab) of the given shape; NULL with ct_error(CT_ERR_RUNTIME) on OOM. */
ct_tensor *ct_tensor_new(ct_backend *be, ct_dtype dtype, int ndim, const int64_t *shape,
                         ct_mem_category category);
ct_tensor *ct_tensor_new_1d(ct_backend *be, ct_dtype dtype, int64_t n, ct_mem_category category);
ct_tensor *ct_tensor_new_2d(ct_backend *be, ct_dtype dtype, int64_t rows, int64_t cols,
                            ct_mem_category category);
/* A view of `parent` starting at element `offset`, with a new shape (must fit inside). */
ct_tensor *ct_tensor_view(const ct_tensor *parent, int64_t offset, int ndim, const int64_t *shape);
ct_tensor *ct_tensor_view_1d(const ct_tensor *parent, int64_t offset, int64_t n);
ct_tensor *ct_tensor_view_2d(const ct_tensor *parent, int64_t offset, int64_t rows, int64_t cols);
/* A view of `dtype` elements starting `byte_offset` bytes into `parent` (any dtype; the offset
 * a multiple of dtype's size): one activation slab holds tensors of several dtypes. */
ct_tensor *ct_tensor_view_as(const ct_tensor *parent, ct_dtype dtype, size_t byte_offset, int ndim,
                             const int64_t *shape);
/* A view handle with no memory yet (data NULL); bind it with ct_tensor_rebind. Used for tensors
 * whose storage moves: ZeRO-3 parameters live in a gathered buffer only while in use. */
ct_tensor *ct_tensor_new_unbound(ct_backend *be, ct_dtype dtype, int ndim, const int64_t *shape);
/* Points a view at `parent` from element `offset` (must fit); parent NULL unbinds it. */
void ct_tensor_rebind(ct_tensor *view, const ct_tensor *parent, int64_t offset);
/* Frees the handle, and the memory if it owns it. Accepts NULL. */
void ct_tensor_free(ct_tensor *t);

size_t ct_tensor_bytes(const ct_tensor *t);
/* "f32[4,256,768]" for assertion messages: a few rotating thread-local buffers, so one message
 * can quote several tensors (NULL gives "(null)"). */
const char *ct_tensor_shape_str(const ct_tensor *t);
int64_t ct_tensor_rows(const ct_tensor *t); /* product of all but the last dim */
int64_t ct_tensor_cols(const ct_tensor *t); /* last dim */
/* Elements a row-major operand of `rows` rows of `cols`, at row stride ld, spans (0 when empty):
 * what a slot with a leading dimension may touch. */
static inline int64_t ct_strided_extent(int64_t rows, int64_t cols, int64_t ld) {
    return rows > 0 && cols > 0 ? (rows - 1) * ld + cols : 0;
}

void ct_tensor_fill(ct_tensor *t, float value);
void ct_tensor_zero(ct_tensor *t);
void ct_tensor_from_host(ct_tensor *dst, const void *src); /* copies ct_tensor_bytes(dst) */
void ct_tensor_to_host(void *dst, const ct_tensor *src);
void ct_tensor_copy(ct_tensor *dst, const ct_tensor *src); /* same dtype and numel */
/* Host fp32 values to and from an f32 or bf16 tensor (converted on the host; bf16 rounds to
 * nearest even): how parameters are initialised, dumped and checked whatever their dtype. */
void ct_tensor_from_host_f32(ct_tensor *dst, const float *src);
void ct_tensor_to_host_f32(float *dst, const ct_tensor *src);

/* ---- ops (thin wrappers; shapes in comments) ------------------------------------------------ *
 * Activation and parameter tensors of one op share a dtype, f32 or bf16 (the slot's `dt`);
 * parameter gradients and statistics are f32 (see the slot table). */

/* C(M,N) = alpha·op(A)·op(B) + beta·C. 2-D views, or N-D treated as (rows, last dim). A and B
 * share a dtype; C is f32, or bf16 when A and B are. */
void ct_gemm(ct_tensor *C, const ct_tensor *A, const ct_tensor *B, bool trans_a, bool trans_b,
             float alpha, float beta);
/* count independent GEMMs C[i] = alpha·op(A[i])·op(B[i]) + beta·C[i], each as ct_gemm would do it
 * (shapes checked the same way; one dtype pair for all), in one grouped call where the backend has
 * gemm_grouped (CUDA: cublasGemmGroupedBatchedEx) and count > 1, else one ct_gemm each (the CPU's
 * loop over OpenBLAS / oneDNN). GEMMs with an empty C are skipped, and the grouped slot gets the
 * non-empty ones with K > 0 (K = 0, C = beta·C, goes through ct_gemm). The slot's operands are
 * contiguous row-major: lda = trans_a ? M : K, ldb = trans_b ? K : N, ldc = N. Mixture of Experts:
 * one call for the same projection of every local expert. */
void ct_gemm_grouped(int count, ct_tensor *const *C, const ct_tensor *const *A,
                     const ct_tensor *const *B, bool trans_a, bool trans_b, float alpha,
                     float beta);
/* The MLP up-projection and its GELU: pre(N,F) = x(N,C)·w(F,C)ᵀ + b(F), out(N,F) = GELU(pre)
 * (pre is what ct_gelu_bwd reads later). One fused op where the backend has gemm_bias_gelu, else
 * ct_bias_init(pre, b) + ct_gemm(pre, x, w, false, true, 1, 1) + ct_gelu_fwd(out, pre). All five
 * tensors share a dtype. */
/* out = x·wᵀ + b (a linear layer's forward, out (M, N), w (N, K), b (N)): the bias in the GEMM's
 * epilogue where the backend fuses it (gemm_bias_gelu with out NULL), else bias_init and gemm with
 * beta = 1 — the same single rounding of bias + product either way. */
void ct_gemm_bias(ct_tensor *out, const ct_tensor *x, const ct_tensor *w, const ct_tensor *b);
void ct_gemm_bias_gelu(ct_tensor *pre, ct_tensor *out, const ct_tensor *x, const ct_tensor *w,
                       const ct_tensor *b);
/* out(N,C) += bias(C) */
void ct_bias_add(ct_tensor *out, const ct_tensor *bias);
/* out(N,C) = bias(C) on every row, + residual(N,C) unless it is NULL: the starting value of a
 * linear layer's output, which a beta = 1 GEMM then accumulates into. One pass instead of three
 * (the GEMM's own zeroing for beta = 0, the bias add, the residual add). */
void ct_bias_init(ct_tensor *out, const ct_tensor *bias, const ct_tensor *residual);
/* dbias(C) += sum over rows of dout(N,C) */
void ct_bias_grad(ct_tensor *dbias, const ct_tensor *dout);
/* dst += alpha·src (same numel) */
void ct_axpy(ct_tensor *dst, const ct_tensor *src, float alpha);
void ct_scale(ct_tensor *x, float s);

/* Mixture of Experts' row movements (core/model/moe_dispatch.h), on the backend's memory.
 * ct_gather_rows: out (N, C) row i = Σ_{j<k} w[i·k + j] · in[idx[i·k + j]], the k terms added in
 * slot order starting from slot 0's product, in fp32, rounded once to out's dtype; w NULL: every
 * weight 1 (the plain sum; with k = 1 a row gather, exact). in (rows, C) like out; idx (N·k) i32,
 * each in [0, rows of in); w (N·k) f32 or NULL. Rows are independent: bit-identical for any
 * thread count. */
void ct_gather_rows(ct_tensor *out, const ct_tensor *in, const ct_tensor *idx, const ct_tensor *w,
                    int64_t k);
/* out (R) f32, out[r] = Σ_c a[ia[r], c] · b[ib[r], c]: products summed in double and rounded
 * once (the CPU backend in column order; others in their own fixed order); a and b (·, C) of one
 * dtype, ia and ib (R) i32. */
void ct_gather_dot(ct_tensor *out, const ct_tensor *a, const ct_tensor *ia, const ct_tensor *b,
                   const ct_tensor *ib);

/* out(N,C) = table[token - row_offset] for tokens in [row_offset, row_offset + rows), else 0;
 * table (rows, C). This is the vocab-parallel form; with one shard row_offset = 0. */
void ct_embedding_fwd(ct_tensor *out, const ct_tensor *tokens, const ct_tensor *table,
                      int64_t row_offset);
/* dtable(rows,C) += dout[n] at row token[n] - row_offset (tokens outside the slice skipped). */
void ct_embedding_bwd(ct_tensor *dtable, const ct_tensor *dout, const ct_tensor *tokens,
                      int64_t row_offset);
/* out(B,T,C) += wpe[pos_offset + t] */
void ct_posemb_fwd(ct_tensor *out, const ct_tensor *wpe, int64_t B, int64_t T, int64_t pos_offset);
/* dwpe[pos_offset + t] += sum_b dout(B,T,C)[b,t] */
void ct_posemb_bwd(ct_tensor *dwpe, const ct_tensor *dout, int64_t B, int64_t T,
                   int64_t pos_offset);

/* out(N,C) = LayerNorm(inp)·w + b; saves mean(N), rstd(N). eps = 1e-5. */
void ct_layernorm_fwd(ct_tensor *out, ct_tensor *mean, ct_tensor *rstd, const ct_tensor *inp,
                      const ct_tensor *w, const ct_tensor *b);
/* The residual add fused into the norm that reads its result: inp += residual (one add per
 * element, rounded to inp's dtype and stored: it is the residual stream), then
 * ct_layernorm_fwd of that sum. residual NULL: ct_layernorm_fwd. Same rounding as ct_axpy
 * followed by ct_layernorm_fwd, in one pass over the row. */
void ct_layernorm_add_fwd(ct_tensor *out, ct_tensor *mean, ct_tensor *rstd, ct_tensor *inp,
                          const ct_tensor *residual, const ct_tensor *w, const ct_tensor *b);
/* dinp(N,C) += ..., dw(C) += ..., db(C) += ... (all accumulate) */
void ct_layernorm_bwd(ct_tensor *dinp, ct_tensor *dw, ct_tensor *db, const ct_tensor *dout,
                      const ct_tensor *inp, const ct_tensor *w, const ct_tensor *mean,
                      const ct_tensor *rstd);

/* GELU, tanh approximation (GPT-2). gelu_bwd: dinp = gelu'(inp)·dout (dinp may alias dout); with
 * dbias (not NULL) also dbias(C) += sum over rows of dinp(N,C) without reading dinp again (the
 * bias of the layer before GELU). On the CPU backend in f32 it is bit-identical to a following
 * ct_bias_grad(dbias, dinp) (the CUDA backend sums the rows in another fixed order); in bf16 it
 * sums the fp32 values before dinp's rounding, so it is the more accurate of the two. */
void ct_gelu_fwd(ct_tensor *out, const ct_tensor *inp);
void ct_gelu_bwd(ct_tensor *dinp, ct_tensor *dbias, const ct_tensor *inp, const ct_tensor *dout);

/* RMSNorm (Llama): out(N,C) = inp·rstd·w with rstd = 1/sqrt(mean_j inp_j² + eps), in fp32 (bf16
 * storage rounds out once); saves rstd(N). No mean, no bias. rmsnorm_bwd accumulates: with
 * g = dout·w, dinp(N,C) += rstd·g - inp·rstd³·mean_j(g_j·inp_j), dw(C) += sum over rows of
 * dout·inp·rstd. */
void ct_rmsnorm_fwd(ct_tensor *out, ct_tensor *rstd, const ct_tensor *inp, const ct_tensor *w,
                    float eps);
/* inp += residual, then ct_rmsnorm_fwd of the sum (as ct_layernorm_add_fwd). */
void ct_rmsnorm_add_fwd(ct_tensor *out, ct_tensor *rstd, ct_tensor *inp, const ct_tensor *residual,
                        const ct_tensor *w, float eps);
void ct_rmsnorm_bwd(ct_tensor *dinp, ct_tensor *dw, const ct_tensor *dout, const ct_tensor *inp,
                    const ct_tensor *w, const ct_tensor *rstd);

/*
 * Rotary position embedding, in place, on the first n_rot_head heads of each row of x (B·T rows;
 * a packed qkv rotates its query and key heads: n_rot_head = n_head + n_kv_head). Pairs are
 * adjacent: dims (2i, 2i+1) of a head rotate by the angle of (position, i), position =
 * pos_offset + t, read from cos_sin (max_pos, head_dim/2, 2) = {cos, sin} in fp32 — the one table
 * ct_rope_table (core/model/rope.h) builds on the host, every backend reading the same bytes.
 * inverse rotates by minus the angle: the backward of the rotation (its transpose), so
 * ct_rope(dx, ..., true) turns the gradient of rotated q and k into that of q and k.
 */
void ct_rope(ct_tensor *x, const ct_tensor *cos_sin, int64_t B, int64_t T, int64_t n_rot_head,
             int64_t head_dim, int64_t pos_offset, bool inverse);

/* SwiGLU (Llama's MLP): gate_up (N, 2H) holds the gate projection in columns [0, H) and the up
 * projection in [H, 2H); out(N,H) = silu(gate)·up with silu(a) = a·σ(a). swiglu_bwd overwrites
 * dgate_up (N, 2H): dgate = dout·up·σ(a)(1 + a(1 - σ(a))), dup = dout·silu(a). */
void ct_swiglu_fwd(ct_tensor *out, const ct_tensor *gate_up);
void ct_swiglu_bwd(ct_tensor *dgate_up, const ct_tensor *gate_up, const ct_tensor *dout);

/*
 * Causal self-attention on a packed qkv (B, T, (n_head + 2·n_kv_head)·hd): each row holds the
 * query heads, then the key heads, then the value heads — the output of one fused QKV projection.
 * n_kv_head divides n_head (grouped-query attention; equal for GPT-2). out: (B, T, n_head·hd).
 * Scale 1/sqrt(hd). lse (B, n_head, T) saves each row's log-sum-exp of the scaled scores for
 * backward. attention_bwd overwrites dqkv (same layout as qkv); with dbias (not NULL) it also
 * adds the sum over rows of dqkv to dbias ((n_head + 2·n_kv_head)·hd) — the gradient of the QKV
 * projection's bias, taken while each head's slice is in cache (each batch element's rows in
 * order, then the batch elements in order).
 */
void ct_attention_fwd(ct_tensor *out, ct_tensor *lse, const ct_tensor *qkv, int64_t B, int64_t T,
                      int64_t n_head, int64_t n_kv_head);
void ct_attention_bwd(ct_tensor *dqkv, ct_tensor *dbias, const ct_tensor *dout,
                      const ct_tensor *qkv, const ct_tensor *out, const ct_tensor *lse, int64_t B,
                      int64_t T, int64_t n_head, int64_t n_kv_head);

/*
 * One decoding step of causal attention against a key/value cache (sampling, cmd/README.md).
 * qkv (B, 1, (n_head + 2·n_kv_head)·hd) holds each sequence's query, key and value heads at
 * position pos, packed as for ct_attention_fwd. Its key and value heads are copied into row pos of
 * the cache kv (B, T_max, 2·n_kv_head·hd: each row the key heads then the value heads of one
 * position, the layout of ct_attention_part_fwd's blocks), and out (B, 1, n_head·hd) is the
 * attention of the query against cache rows 0..pos: what ct_attention_fwd gives row pos of a
 * sequence whose rows 0..pos-1 were cached. Scale 1/sqrt(hd); scores, weights and sums in fp32,
 * the keys summed in order. 0 <= pos < T_max.
 */
void ct_attention_decode(ct_tensor *out, ct_tensor *kv, const ct_tensor *qkv, int64_t pos,
                         int64_t n_head, int64_t n_kv_head);

/*
 * Context parallelism (ring attention, parallel/README.md): a rank holds T local rows of each
 * sequence as two chunks of T/2 rows, at global chunk indices q0 and q1 (zigzag: r and 2cp−1−r;
 * contiguous: 2r and 2r+1; chunk k covers positions [k·T/2, (k+1)·T/2)), and attends to key/value
 * blocks that arrive from the other ranks of its cp group. A block kv (B, T, 2·n_kv_head·hd)
 * holds the key heads then the value heads of its owner's rows (chunks k0, k1); CT_ATT_CHUNKS
 * packs the four indices, each below 2^15.
 *
 * attention_part_fwd merges the attention of the local queries (qkv, packed as for
 * ct_attention_fwd) against the block's keys into running fp32 accumulators: o_acc (B, T,
 * n_head·hd), the output normalised so far, and lse_acc (B, n_head, T), its log-sum-exp (start
 * them at 0 and -inf). Query chunk qc attends to key chunk kc fully when kc < qc, causally when
 * kc == qc, and not at all when kc > qc; each attended pair is merged as one block (O, L) ←
 * (e^(L−L')·O + e^(Lb−L')·Ob, L' = max(L, Lb) + log1p(e^(−|L−Lb|))), pairs in the order (query
 * chunk, key chunk).
 *
 * attention_part_bwd adds the gradients of that part: given the final out (B, T, n_head·hd, in
 * the model's dtype) and lse of the local rows and the upstream dout, it adds dQ into dq_acc
 * (B, T, n_head·hd) and dK, dV into dkv_acc (B, T, 2·n_kv_head·hd, the block's layout), both
 * fp32, with P recomputed from the final lse (never a block-local one).
 */
#define CT_ATT_CHUNKS(q0, q1, k0, k1)                                                              \
    ((int64_t)(q0) | (int64_t)(q1) << 16 | (int64_t)(k0) << 32 | (int64_t)(k1) << 48)
/* Index i of a packed CT_ATT_CHUNKS: 0 and 1 the query chunks, 2 and 3 the key chunks. */
#define CT_ATT_CHUNK(chunks, i) (((chunks) >> (16 * (i))) & 0x7fff)
void ct_attention_part_fwd(ct_tensor *o_acc, ct_tensor *lse_acc, const ct_tensor *qkv,
                           const ct_tensor *kv, int64_t B, int64_t T, int64_t n_head,
                           int64_t n_kv_head, int64_t chunks);
void ct_attention_part_bwd(ct_tensor *dq_acc, ct_tensor *dkv_acc, const ct_tensor *dout,
                           const ct_tensor *qkv, const ct_tensor *out, const ct_tensor *lse,
                           const ct_tensor *kv, int64_t B, int64_t T, int64_t n_head,
                           int64_t n_kv_head, int64_t chunks);
/* Columns [dst_col, dst_col + cols) of every row of dst (rows, ·) = columns [src_col, src_col +
 * cols) of src (same rows), converted as by ct_cast (f32 <-> bf16 or a copy): how the ring packs
 * a block's keys and values and unpacks the gradients. */
void ct_cast_cols(ct_tensor *dst, int64_t dst_col, const ct_tensor *src, int64_t src_col,
                  int64_t cols);
/* True when the backend has the ops of context parallelism (the CT_OP_FEATURE slots above). */
bool ct_backend_has_context_parallel(const ct_backend *be);

/*
 * Softmax cross-entropy in three steps so that the vocab-parallel form (logits split by columns
 * over tp ranks) needs only allreduces of N-vectors between them:
 *   xent_rowmax:  rowmax(N) = max over the first n_valid columns of logits(N, V)
 *                 [allreduce MAX over tp]
 *   xent_sumexp:  sumexp(N) = sum exp(logit - rowmax), target_logit(N) = logit at the target if
 *                 it lies in [col_offset, col_offset + n_valid), else 0   [allreduce SUM over tp];
 *                 with keep_exp the logits are overwritten by exp(logit - rowmax), so that the
 *                 gradient needs no second exp
 *   xent_finish:  losses(N) = log(sumexp) + rowmax - target_logit; if write_grad, the logits —
 *                 which must then hold sumexp's keep_exp values — are overwritten by
 *                 dloss·(softmax - onehot) (padded columns get 0).
 * Columns at or past n_valid are vocabulary padding: −∞ logits, excluded everywhere.
 */
void ct_xent_rowmax(ct_tensor *rowmax, const ct_tensor *logits, int64_t n_valid);
void ct_xent_sumexp(ct_tensor *sumexp, ct_tensor *target_logit, ct_tensor *logits,
                    const ct_tensor *targets, const ct_tensor *rowmax, int64_t n_valid,
                    int64_t col_offset, bool keep_exp);
void ct_xent_finish(ct_tensor *losses, ct_tensor *logits, const ct_tensor *targets,
                    const ct_tensor *rowmax, const ct_tensor *sumexp, const ct_tensor *target_logit,
                    int64_t n_valid, int64_t col_offset, float dloss, bool write_grad);

/* AdamW on flat 1-D f32 views of equal length; only elements covered by a segment are updated.
 * param is the fp32 copy the optimizer owns (the parameters themselves in fp32 mode, the master
 * weights in bf16 mode); param_copy (NULL: none) gets the updated values in its own dtype. */
void ct_adamw(ct_tensor *param, const ct_tensor *grad, ct_tensor *m, ct_tensor *v,
              const ct_adamw_segment *segments, int n_segments, const ct_adamw_hparams *hp,
              ct_tensor *param_copy);
/* out[index + i] = sum of xs[i]² for i < count (each in double, fixed chunking; out is an f32 1-D
 * tensor, every xs[i] f32 on out's backend): all count tensors in one call of the slot. */
void ct_sumsq(ct_tensor *out, int64_t index, ct_tensor *const *xs, int count);
/* Elementwise dtype conversion (f32 <-> bf16, round to nearest even). */
void ct_cast(ct_tensor *dst, const ct_tensor *src);

#endif /* CT_BACKEND_H */
