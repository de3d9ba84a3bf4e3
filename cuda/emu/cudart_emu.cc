/*
 * cudart_emu.cc — the CUDA runtime stand-in of the emulated build: the cudart entry points the
 * project calls, with the real signatures (they are declared by <cuda_runtime_api.h>), linked
 * instead of libcudart. The device is an H100-like sm_90 with 80 GB ("cuemu (CPU emulation)");
 * CUEMU_DEVICES=N sets how many there are (0: cudaGetDeviceCount fails with cudaErrorNoDevice).
 * Memory is not per device: every device sees one host heap.
 *
 * Memory. cudaMalloc returns host memory aligned to 256 bytes, of exactly the size asked (so
 * ASan sees an overrun), filled with the 32-bit pattern 0x7FC07FC0 (NaN as f32 and as each bf16
 * half); cudaFree poisons it again before freeing it.
 *
 * Streams are lazy. Kernels, async copies and memsets, event records and library work are queued
 * on their stream and run only at a sync point that needs them:
 *   cudaStreamSynchronize(s)      s's queue (and, first, what s waits on through events);
 *   cudaEventSynchronize(e)       e's stream up to e;
 *   cudaStreamQuery/EventQuery    report cudaErrorNotReady once when work is pending, and run it
 *                                 (a later query reports success), so polling code terminates —
 *                                 up to the first item that has not finished: library work that
 *                                 waits for other processes (the NCCL stand-in's collectives) is
 *                                 a polled item, which a query never blocks on and a synchronize
 *                                 calls until it finishes;
 *   cudaDeviceSynchronize, cudaMemcpy, cudaMemset, cudaFree: every stream.
 * So a host read without the sync it needs sees poison or stale values. CUEMU_EAGER=1 instead runs
 * every stream as far as it can (without waiting for an unfinished item) each time work is
 * queued, as a GPU runs work as soon as it arrives: slower to catch a missing sync, but it gives
 * event times that say when a stream could have reached them (the stream's clock, backend.h,
 * mark), which is what a test of device-side waiting needs. Stream 0 (and
 * cudaStreamLegacy, cudaStreamPerThread) is the legacy default stream: work queued on it first
 * waits for the work already queued on every blocking stream, and work queued on a blocking
 * stream first waits for the work already queued on it; non-blocking streams
 * (cudaStreamNonBlocking) are independent of it.
 *
 * Stream capture and graphs. cudaStreamBeginCapture(s, mode) (not on the legacy stream:
 * cudaErrorStreamCaptureUnsupported; not twice: cudaErrorIllegalState) makes every piece of work
 * queued on s — kernels, cudaMemcpyAsync, cudaMemsetAsync, cudaLaunchHostFunc, library work
 * (cuemu_stream_enqueue) — an item of the capture's graph instead: it does not run, and it adds
 * no legacy-stream waits. cudaStreamEndCapture returns the graph (its items in capture order);
 * cudaGraphInstantiate copies them into an executable graph, which outlives its graph, and each
 * cudaGraphLaunch(exec, t) queues a copy of every item on t, in order, as ordinary (lazy) stream
 * work, so each launch reads and writes memory as it is when the items run. Every mode is treated
 * as cudaStreamCaptureModeGlobal. While any capture is open (begun and not ended), these calls
 * from the host fail with cudaErrorStreamCaptureUnsupported, do nothing, and invalidate every
 * active capture:
 *   cudaMalloc, cudaFree, cudaMallocHost, cudaHostAlloc, cudaFreeHost, cudaMemcpy, cudaMemset,
 *   cudaDeviceSynchronize, cudaDeviceReset, cudaStreamSynchronize, cudaStreamQuery,
 *   cudaEventSynchronize, cudaEventQuery (they allocate, free or wait, which a graph cannot hold);
 * and on a capturing stream: cudaMemcpyAsync with a host side, cudaEventRecord and
 * cudaStreamWaitEvent (event nodes are not emulated), cudaGraphLaunch (child graphs are not
 * emulated), cudaStreamDestroy. Work queued on the legacy stream while a blocking stream captures
 * fails with cudaErrorStreamCaptureImplicit (the legacy stream would wait for the capture) and
 * invalidates the captures too; a capture on a non-blocking stream leaves the legacy stream free,
 * as in the real runtime. Work queued on an invalidated capture fails with
 * cudaErrorStreamCaptureInvalidated; cudaStreamEndCapture then returns that error and a null
 * graph, printing the first reason on stderr ("cuemu: stream capture invalidated: cudaMalloc
 * during a capture"). The NCCL stand-in's polled items (cuemu_stream_enqueue_poll) hold state
 * and cannot be replayed: queueing one on a capturing stream aborts. Runtime calls made inside
 * queued work (a replayed library item launching a kernel) are stream-ordered device work and
 * are never refused. Graphs and executable graphs are freed when destroyed.
 *
 * Every entry point takes one process-wide lock; launches run under it on the calling thread.
 */
#include "cuda/emu/cuemu.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

namespace {

const uint32_t POISON32 = 0x7FC07FC0u;
const size_t DEVICE_MEMORY = 80ull << 30;
const size_t DYNAMIC_SHARED_DEFAULT = 48 * 1024;
const size_t DYNAMIC_SHARED_OPTIN = 227 * 1024;

std::recursive_mutex lock;
#define CUEMU_LOCKED std::lock_guard<std::recursive_mutex> guard_(lock)

thread_local cudaError_t last_error = cudaSuccess;
thread_local int current_device = 0;

/* Every failing call also sets the error cudaGetLastError returns, as in the real runtime. */
cudaError_t fail(cudaError_t e) {
    if (e != cudaSuccess) last_error = e;
    return e;
}

void poison_fill(void *p, size_t bytes) {
    unsigned char *b = static_cast<unsigned char *>(p);
    size_t words = bytes / 4;
    for (size_t i = 0; i < words; i++) std::memcpy(b + 4 * i, &POISON32, 4);
    std::memcpy(b + 4 * words, &POISON32, bytes % 4);
}

int device_count() {
    static int n = [] {
        const char *s = getenv("CUEMU_DEVICES");
        return s && *s ? atoi(s) : 1;
    }();
    return n;
}

/* The runtime's tables are never destroyed: CUDA calls from exit-time destructors still work,
 * and LeakSanitizer still sees what they point to. */
template <typename T> T &forever() {
    static T *t = new T();
    return *t;
}

/* ---- allocations --------------------------------------------------------------------------- */
std::map<uintptr_t, size_t> &device_allocations = forever<std::map<uintptr_t, size_t>>();
size_t device_bytes_in_use;
std::set<void *> &host_allocations = forever<std::set<void *>>();

/* The allocation holding [p, p + bytes), or end(). */
std::map<uintptr_t, size_t>::iterator find_allocation(const void *p, size_t bytes) {
    uintptr_t a = (uintptr_t)p;
    auto it = device_allocations.upper_bound(a);
    if (it == device_allocations.begin()) return device_allocations.end();
    --it;
    if (a + bytes > it->first + it->second || a + bytes < a) return device_allocations.end();
    return it;
}

/* ---- streams and events -------------------------------------------------------------------- */
/* A queued item returns true when it has finished; false means "not yet" (a library stand-in
 * waiting for other processes, cuemu_stream_enqueue_poll): it stays at the front of its stream
 * and is called again. */
enum capture_state { CAPTURE_NONE, CAPTURE_ACTIVE, CAPTURE_INVALIDATED };
struct stream_impl {
    std::deque<std::function<bool()>> queue;
    uint64_t enqueued = 0, done = 0; /* items ever queued, items run */
    bool blocking = true;            /* synchronizes with the legacy stream */
    bool destroyed = false;
    bool reported_not_ready = false;
    bool running = false; /* its front item is running (a wait cycle must not re-enter it) */
    capture_state capture = CAPTURE_NONE;
    std::vector<std::function<void()>> captured; /* the open capture's items, in order */
    std::string invalidated_why;                 /* the first reason the capture was invalidated */
};
struct event_impl {
    unsigned flags = 0;
    stream_impl *stream = nullptr; /* of the latest record; null: never recorded */
    uint64_t seq = 0;              /* the record's position in that stream */
    uint64_t generation = 0;       /* of the latest record; an older record completes nothing */
    bool complete = false;
    bool destroyed = false;
    bool reported_not_ready = false;
    std::chrono::steady_clock::time_point when;
};

stream_impl &legacy_stream = forever<stream_impl>();
/* Streams and events are never freed: an event may still name a destroyed stream, a queued
 * record a destroyed event, and use after destroy is reported. */
std::vector<stream_impl *> &streams = forever<std::vector<stream_impl *>>();
std::vector<event_impl *> &events = forever<std::vector<event_impl *>>();

stream_impl *stream_of(cudaStream_t s) {
    if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return &legacy_stream;
    return reinterpret_cast<stream_impl *>(s);
}
event_impl *event_of(cudaEvent_t e) {
    return reinterpret_cast<event_impl *>(e);
}

/* How deep the host is inside queued work. Work that calls the runtime (a library stand-in
 * copying, or launching a kernel) is already in stream order: what it queues runs at once, and
 * the sync points it reaches drain nothing (draining would run later items before it ends). */
int work_depth;

/* Whether the sync point being served may wait for an unfinished item (cudaStreamSynchronize and
 * the like: call it again until it finishes) or must not (cudaStreamQuery, cudaEventQuery: stop
 * there and report not ready), so a query never blocks on another process, as on a GPU. */
bool may_block = true;

struct blocking_scope {
    bool saved;
    explicit blocking_scope(bool block) : saved(may_block) { may_block = block; }
    ~blocking_scope() { may_block = saved; }
};

bool run_stream_until(stream_impl *s, uint64_t seq);

/* While a synchronization waits for an unfinished item, the other streams move on as far as
 * they can without waiting, as a GPU runs its streams side by side: the item may wait for another
 * process that waits for this one's transfer on another stream. */
void progress_others(const stream_impl *waiting) {
    bool saved = may_block;
    may_block = false;
    for (size_t i = 0; i < streams.size(); i++) {
        stream_impl *t = streams[i];
        if (t != waiting && !t->running && !t->queue.empty()) run_stream_until(t, t->enqueued);
    }
    may_block = saved;
}

/* Runs s's items up to position seq; false when an unfinished item stopped it (only when
 * may_block is false, or on a wait cycle that re-enters s). */
bool run_stream_until(stream_impl *s, uint64_t seq) {
    while (s->done < seq && !s->queue.empty()) {
        if (s->running) return false;
        s->running = true;
        work_depth++;
        bool finished = s->queue.front()();
        work_depth--;
        s->running = false;
        if (!finished) {
            if (!may_block) return false;
            progress_others(s);
            std::this_thread::yield();
            continue;
        }
        s->queue.pop_front();
        s->done++;
    }
    return s->done >= seq;
}

/* The sync points: each a no-op inside queued work (see work_depth). */
void run_stream(stream_impl *s) {
    if (work_depth == 0) run_stream_until(s, s->enqueued);
}

void run_event(stream_impl *s, uint64_t seq) {
    if (work_depth == 0) run_stream_until(s, seq);
}

void run_everything() {
    bool again = work_depth == 0;
    while (again) {
        again = false;
        run_stream(&legacy_stream);
        for (stream_impl *s : streams) {
            if (s->queue.empty()) continue;
            run_stream(s);
            again = true;
        }
    }
}

/* CUEMU_EAGER=1: run what can run whenever work is queued (the header says why). */
bool eager() {
    static int on = -1;
    if (on < 0) {
        const char *env = getenv("CUEMU_EAGER");
        on = env && env[0] == '1';
    }
    return on == 1;
}

void push(stream_impl *s, std::function<bool()> work) {
    s->queue.push_back(std::move(work));
    s->enqueued++;
    if (work_depth == 0 && eager()) progress_others(nullptr);
}

void push_wait(stream_impl *s, stream_impl *on, uint64_t seq) {
    push(s, [on, seq]() { return run_stream_until(on, seq); });
}

void enqueue_poll(stream_impl *s, std::function<bool()> work) {
    if (work_depth > 0) {
        while (!work()) std::this_thread::yield();
        return;
    }
    if (s == &legacy_stream) {
        for (stream_impl *t : streams)
            if (t->blocking && !t->destroyed && t->enqueued > t->done) push_wait(s, t, t->enqueued);
    } else if (s->blocking && legacy_stream.enqueued > legacy_stream.done) {
        push_wait(s, &legacy_stream, legacy_stream.enqueued);
    }
    push(s, std::move(work));
}

/* ---- stream capture ------------------------------------------------------------------------ */
int open_captures; /* streams whose capture was begun and not ended */

/* Whether a host call is made while a capture is open. Calls made inside queued work are device
 * work in stream order (a replayed library item launching a kernel): never refused. */
bool in_capture() {
    return open_captures > 0 && work_depth == 0;
}

bool blocking_capture_open() {
    for (stream_impl *s : streams)
        if (s->capture != CAPTURE_NONE && s->blocking) return true;
    return false;
}

/* A call a capture forbids: every active capture is invalidated (each keeps its first reason)
 * and the call fails with e, recorded for cudaGetLastError; the caller does nothing else. */
cudaError_t refuse_in_capture(const std::string &why,
                              cudaError_t e = cudaErrorStreamCaptureUnsupported) {
    for (stream_impl *s : streams)
        if (s->capture == CAPTURE_ACTIVE) {
            s->capture = CAPTURE_INVALIDATED;
            s->invalidated_why = why;
        }
    return fail(e);
}

/* For the calls refused whichever stream captures (allocation, freeing, synchronization). */
cudaError_t refuse_if_capturing(const char *call) {
    if (!in_capture()) return cudaSuccess;
    return refuse_in_capture(std::string(call) + " during a capture");
}

/* Whether host call `what` may queue work on s: not on an invalidated capture
 * (cudaErrorStreamCaptureInvalidated), not on the legacy stream while a blocking stream captures
 * (cudaErrorStreamCaptureImplicit: it would wait for the capture; the captures are invalidated). */
cudaError_t capture_admits(stream_impl *s, const std::string &what) {
    if (!in_capture()) return cudaSuccess;
    if (s->capture == CAPTURE_INVALIDATED) return fail(cudaErrorStreamCaptureInvalidated);
    if (s == &legacy_stream && blocking_capture_open())
        return refuse_in_capture(what + " on the legacy stream while a blocking stream captures",
                                 cudaErrorStreamCaptureImplicit);
    return cudaSuccess;
}

/* The same for a call that a capture cannot hold: refused on a capturing stream too. */
cudaError_t uncapturable(stream_impl *s, const char *what, const char *note) {
    cudaError_t e = capture_admits(s, what);
    if (e != cudaSuccess || !in_capture() || s->capture != CAPTURE_ACTIVE) return e;
    return refuse_in_capture(std::string(what) + " on a capturing stream" + note);
}

/* Queues work on s, or appends it to s's capture; `what` names the call for refusals. */
cudaError_t enqueue(stream_impl *s, std::function<void()> work, const std::string &what) {
    cudaError_t e = capture_admits(s, what);
    if (e != cudaSuccess) return e;
    if (in_capture() && s->capture == CAPTURE_ACTIVE) {
        s->captured.push_back(std::move(work));
        return cudaSuccess;
    }
    enqueue_poll(s, [work = std::move(work)]() {
        work();
        return true;
    });
    return cudaSuccess;
}

bool bad_stream(cudaStream_t s) {
    return stream_of(s)->destroyed;
}

/* ---- kernels ------------------------------------------------------------------------------- */
/* cudaFuncAttributeMaxDynamicSharedMemorySize per kernel */
std::map<const void *, int> &max_dynamic_shared = forever<std::map<const void *, int>>();

/* Prints why a launch is refused (the error code alone says little) and records the error. */
cudaError_t refuse_launch(const cuemu_launch_info &info, cudaError_t e, const char *why) {
    fprintf(stderr, "cuemu: launch refused (%s) at %s:%d: ct_launch(%s): %s\n", cudaGetErrorName(e),
            info.file, info.line, info.text, why);
    return fail(e);
}

} // namespace

/* ---- the emulator's C++ API ---------------------------------------------------------------- */
void cuemu_stream_enqueue(cudaStream_t stream, std::function<void()> work) {
    CUEMU_LOCKED;
    /* a refusal is recorded for cudaGetLastError, as a refused launch is */
    enqueue(stream_of(stream), std::move(work), "library work (cuemu_stream_enqueue)");
}

void cuemu_stream_enqueue_poll(cudaStream_t stream, std::function<bool()> work) {
    CUEMU_LOCKED;
    stream_impl *s = stream_of(stream);
    if (in_capture() &&
        (s->capture != CAPTURE_NONE || (s == &legacy_stream && blocking_capture_open()))) {
        /* a polled item holds the state of one transfer: a graph could not run it again */
        fprintf(stderr,
                "cuemu: the NCCL stand-in's work cannot be captured in a graph (polled work, "
                "cuemu_stream_enqueue_poll, queued on %s)\n",
                s->capture != CAPTURE_NONE ? "a capturing stream"
                                           : "the legacy stream while a blocking stream captures");
        fflush(stderr);
        abort();
    }
    enqueue_poll(s, std::move(work));
}

bool cuemu_is_device_pointer(const void *p, size_t bytes) {
    CUEMU_LOCKED;
    return find_allocation(p, bytes) != device_allocations.end();
}

cudaError_t cuemu_check_launch(const cuemu_launch_info &info, cudaStream_t stream) {
    CUEMU_LOCKED;
    const dim3 &b = info.block, &g = info.grid;
    char why[320];
    uint64_t threads = (uint64_t)b.x * b.y * b.z;
    if (threads == 0 || g.x == 0 || g.y == 0 || g.z == 0) {
        snprintf(why, sizeof why, "empty grid (%u,%u,%u) or block (%u,%u,%u)", g.x, g.y, g.z, b.x,
                 b.y, b.z);
        return refuse_launch(info, cudaErrorInvalidConfiguration, why);
    }
    if (threads > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64) {
        snprintf(why, sizeof why,
                 "block (%u,%u,%u) has %llu threads; at most 1024, with x, y <= 1024 and z <= 64",
                 b.x, b.y, b.z, (unsigned long long)threads);
        return refuse_launch(info, cudaErrorInvalidConfiguration, why);
    }
    if (g.x > 2147483647u || g.y > 65535 || g.z > 65535) {
        snprintf(why, sizeof why, "grid (%u,%u,%u) exceeds (2^31-1, 65535, 65535)", g.x, g.y, g.z);
        return refuse_launch(info, cudaErrorInvalidConfiguration, why);
    }
    size_t allowed = DYNAMIC_SHARED_DEFAULT;
    auto attr = max_dynamic_shared.find(info.kernel);
    if (attr != max_dynamic_shared.end() && (size_t)attr->second > allowed)
        allowed = (size_t)attr->second;
    if (info.smem_bytes > allowed) {
        snprintf(why, sizeof why,
                 "%zu bytes of dynamic shared memory, over this kernel's limit of %zu; "
                 "cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, n) "
                 "raises it up to %zu",
                 info.smem_bytes, allowed, DYNAMIC_SHARED_OPTIN);
        return refuse_launch(info, cudaErrorInvalidValue, why);
    }
    if (bad_stream(stream))
        return refuse_launch(info, cudaErrorInvalidResourceHandle, "the stream was destroyed");
    if (!in_capture()) return cudaSuccess; /* the common case: no names to build */
    std::string text = info.text, kernel = text.substr(0, text.find(','));
    std::string what =
        "kernel " + kernel + " (ct_launch at " + info.file + ":" + std::to_string(info.line) + ")";
    cudaError_t e = capture_admits(stream_of(stream), what);
    if (e != cudaSuccess)
        return refuse_launch(info, e,
                             e == cudaErrorStreamCaptureInvalidated
                                 ? "the stream's capture was invalidated earlier"
                                 : "the legacy stream while a blocking stream captures");
    return cudaSuccess;
}

/* ---- devices ------------------------------------------------------------------------------- */
cudaError_t cudaGetDeviceCount(int *count) {
    if (!count) return fail(cudaErrorInvalidValue);
    if (device_count() <= 0) return fail(cudaErrorNoDevice);
    *count = device_count();
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    if (!device) return fail(cudaErrorInvalidValue);
    if (device_count() <= 0) return fail(cudaErrorNoDevice);
    *device = current_device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    if (!prop) return fail(cudaErrorInvalidValue);
    if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
    std::memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "cuemu (CPU emulation)");
    prop->totalGlobalMem = DEVICE_MEMORY;
    prop->sharedMemPerBlock = DYNAMIC_SHARED_DEFAULT;
    prop->sharedMemPerBlockOptin = DYNAMIC_SHARED_OPTIN;
    prop->sharedMemPerMultiprocessor = 228 * 1024;
    prop->regsPerBlock = 65536;
    prop->regsPerMultiprocessor = 65536;
    prop->warpSize = 32;
    prop->memPitch = 2147483647;
    prop->maxThreadsPerBlock = 1024;
    prop->maxThreadsDim[0] = 1024;
    prop->maxThreadsDim[1] = 1024;
    prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 2147483647;
    prop->maxGridSize[1] = 65535;
    prop->maxGridSize[2] = 65535;
    prop->totalConstMem = 65536;
    prop->major = 9;
    prop->minor = 0;
    prop->textureAlignment = 512;
    prop->multiProcessorCount = 132;
    prop->maxThreadsPerMultiProcessor = 2048;
    prop->maxBlocksPerMultiProcessor = 32;
    prop->l2CacheSize = 50 * 1024 * 1024;
    prop->memoryBusWidth = 5120;
    prop->concurrentKernels = 1;
    prop->asyncEngineCount = 2;
    prop->unifiedAddressing = 1;
    prop->canMapHostMemory = 1;
    prop->streamPrioritiesSupported = 1;
    prop->globalL1CacheSupported = 1;
    prop->localL1CacheSupported = 1;
    prop->managedMemory = 1;
    prop->cooperativeLaunch = 1;
    prop->memoryPoolsSupported = 1;
    prop->clusterLaunch = 1;
    prop->pciBusID = device + 1;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
    if (!value) return fail(cudaErrorInvalidValue);
    if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrMaxBlockDimX: *value = 1024; break;
    case cudaDevAttrMaxBlockDimY: *value = 1024; break;
    case cudaDevAttrMaxBlockDimZ: *value = 64; break;
    case cudaDevAttrMaxGridDimX: *value = 2147483647; break;
    case cudaDevAttrMaxGridDimY: *value = 65535; break;
    case cudaDevAttrMaxGridDimZ: *value = 65535; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)DYNAMIC_SHARED_DEFAULT; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)DYNAMIC_SHARED_OPTIN; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = 228 * 1024; break;
    case cudaDevAttrTotalConstantMemory: *value = 65536; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMaxRegistersPerBlock: *value = 65536; break;
    case cudaDevAttrMaxRegistersPerMultiprocessor: *value = 65536; break;
    case cudaDevAttrMultiProcessorCount: *value = 132; break;
    case cudaDevAttrClockRate: *value = 1980000; break;       /* kHz: an H100 SXM's boost clock */
    case cudaDevAttrMemoryClockRate: *value = 2619000; break; /* kHz */
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = 2048; break;
    case cudaDevAttrMaxBlocksPerMultiprocessor: *value = 32; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrL2CacheSize: *value = 50 * 1024 * 1024; break;
    case cudaDevAttrGlobalMemoryBusWidth: *value = 5120; break;
    case cudaDevAttrConcurrentKernels: *value = 1; break;
    case cudaDevAttrAsyncEngineCount: *value = 2; break;
    case cudaDevAttrUnifiedAddressing: *value = 1; break;
    case cudaDevAttrIntegrated: *value = 0; break;
    case cudaDevAttrCanMapHostMemory: *value = 1; break;
    case cudaDevAttrManagedMemory: *value = 1; break;
    case cudaDevAttrCooperativeLaunch: *value = 1; break;
    case cudaDevAttrMemoryPoolsSupported: *value = 1; break;
    case cudaDevAttrPciBusId: *value = device + 1; break;
    case cudaDevAttrPciDeviceId: *value = 0; break;
    case cudaDevAttrPciDomainId: *value = 0; break;
    case cudaDevAttrEccEnabled: *value = 0; break;
    default: return fail(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *version) {
    if (!version) return fail(cudaErrorInvalidValue);
    *version = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *version) {
    if (!version) return fail(cudaErrorInvalidValue);
    *version = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    CUEMU_LOCKED;
    if (cudaError_t e = refuse_if_capturing("cudaDeviceSynchronize")) return e;
    run_everything();
    return cudaSuccess;
}

cudaError_t cudaDeviceReset(void) {
    CUEMU_LOCKED;
    if (cudaError_t e = refuse_if_capturing("cudaDeviceReset")) return e;
    run_everything();
    max_dynamic_shared.clear();
    return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
    if (least) *least = 0;
    if (greatest) *greatest = -5;
    return cudaSuccess;
}

/* ---- errors -------------------------------------------------------------------------------- */
cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) {
    return last_error;
}

namespace {
struct error_text {
    cudaError_t code;
    const char *name, *text;
};
#define CUEMU_ERR(code, text)                                                                      \
    { code, #code, text }
const error_text error_texts[] = {
    CUEMU_ERR(cudaSuccess, "no error"),
    CUEMU_ERR(cudaErrorInvalidValue, "invalid argument"),
    CUEMU_ERR(cudaErrorMemoryAllocation, "out of memory"),
    CUEMU_ERR(cudaErrorInitializationError, "initialization error"),
    CUEMU_ERR(cudaErrorCudartUnloading, "driver shutting down"),
    CUEMU_ERR(cudaErrorInvalidConfiguration, "invalid configuration argument"),
    CUEMU_ERR(cudaErrorInvalidPitchValue, "invalid pitch argument"),
    CUEMU_ERR(cudaErrorInvalidSymbol, "invalid device symbol"),
    CUEMU_ERR(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy"),
    CUEMU_ERR(cudaErrorInsufficientDriver,
              "CUDA driver version is insufficient for CUDA runtime version"),
    CUEMU_ERR(cudaErrorNoDevice, "no CUDA-capable device is detected"),
    CUEMU_ERR(cudaErrorInvalidDevice, "invalid device ordinal"),
    CUEMU_ERR(cudaErrorInvalidDeviceFunction, "invalid device function"),
    CUEMU_ERR(cudaErrorInvalidResourceHandle, "invalid resource handle"),
    CUEMU_ERR(cudaErrorIllegalAddress, "an illegal memory access was encountered"),
    CUEMU_ERR(cudaErrorLaunchOutOfResources, "too many resources requested for launch"),
    CUEMU_ERR(cudaErrorLaunchTimeout, "the launch timed out and was terminated"),
    CUEMU_ERR(cudaErrorLaunchFailure, "unspecified launch failure"),
    CUEMU_ERR(cudaErrorNotReady, "device not ready"),
    CUEMU_ERR(cudaErrorNotSupported, "operation not supported"),
    CUEMU_ERR(cudaErrorHostMemoryNotRegistered,
              "pointer does not correspond to a registered memory region"),
    CUEMU_ERR(cudaErrorIllegalState, "the operation cannot be performed in the present state"),
    CUEMU_ERR(cudaErrorStreamCaptureUnsupported,
              "operation not permitted when stream is capturing"),
    CUEMU_ERR(cudaErrorStreamCaptureInvalidated,
              "operation failed due to a previous error during capture"),
    CUEMU_ERR(cudaErrorStreamCaptureImplicit,
              "operation would make the legacy stream depend on a capturing blocking stream"),
    CUEMU_ERR(cudaErrorUnknown, "unknown error"),
};
#undef CUEMU_ERR

const error_text *find_error(cudaError_t e) {
    for (const error_text &t : error_texts)
        if (t.code == e) return &t;
    return nullptr;
}
} // namespace

const char *cudaGetErrorName(cudaError_t error) {
    const error_text *t = find_error(error);
    return t ? t->name : "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t error) {
    const error_text *t = find_error(error);
    return t ? t->text : "unrecognized error code";
}

/* ---- memory -------------------------------------------------------------------------------- */
cudaError_t cudaMalloc(void **ptr, size_t size) {
    CUEMU_LOCKED;
    if (!ptr) return fail(cudaErrorInvalidValue);
    *ptr = nullptr;
    if (cudaError_t e = refuse_if_capturing("cudaMalloc")) return e;
    if (device_count() <= 0) return fail(cudaErrorNoDevice);
    if (size == 0) return cudaSuccess;
    if (size > DEVICE_MEMORY - device_bytes_in_use) return fail(cudaErrorMemoryAllocation);
    void *p = nullptr;
    if (posix_memalign(&p, 256, size) != 0) return fail(cudaErrorMemoryAllocation);
    poison_fill(p, size);
    device_allocations[(uintptr_t)p] = size;
    device_bytes_in_use += size;
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFree(void *ptr) {
    CUEMU_LOCKED;
    if (cudaError_t e = refuse_if_capturing("cudaFree")) return e; /* the memory stays */
    run_everything(); /* like the real one: work queued before may still use it */
    if (!ptr) return cudaSuccess;
    auto it = device_allocations.find((uintptr_t)ptr);
    if (it == device_allocations.end()) return fail(cudaErrorInvalidValue);
    poison_fill(ptr, it->second); /* a stale pointer then reads NaN (ASan reports it) */
    device_bytes_in_use -= it->second;
    device_allocations.erase(it);
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **ptr, size_t size) {
    CUEMU_LOCKED;
    if (!ptr) return fail(cudaErrorInvalidValue);
    *ptr = nullptr;
    if (cudaError_t e = refuse_if_capturing("cudaMallocHost")) return e;
    void *p = nullptr;
    if (posix_memalign(&p, 256, size ? size : 1) != 0) return fail(cudaErrorMemoryAllocation);
    host_allocations.insert(p);
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags) {
    CUEMU_LOCKED;
    (void)flags;
    if (ptr) *ptr = nullptr;
    if (cudaError_t e = refuse_if_capturing("cudaHostAlloc")) return e;
    return cudaMallocHost(ptr, size);
}

cudaError_t cudaFreeHost(void *ptr) {
    CUEMU_LOCKED;
    if (cudaError_t e = refuse_if_capturing("cudaFreeHost")) return e;
    run_everything();
    if (!ptr) return cudaSuccess;
    if (!host_allocations.erase(ptr)) return fail(cudaErrorInvalidValue);
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    CUEMU_LOCKED;
    if (free_bytes) *free_bytes = DEVICE_MEMORY - device_bytes_in_use;
    if (total_bytes) *total_bytes = DEVICE_MEMORY;
    return cudaSuccess;
}

namespace {
/* The device side of a copy must lie inside one allocation; the host side is not checked. */
cudaError_t check_copy(void *dst, const void *src, size_t count, cudaMemcpyKind kind) {
    if (count == 0) return cudaSuccess;
    if (!dst || !src) return cudaErrorInvalidValue;
    bool dst_dev = find_allocation(dst, count) != device_allocations.end();
    bool src_dev = find_allocation(src, count) != device_allocations.end();
    switch (kind) {
    case cudaMemcpyHostToHost: return cudaSuccess;
    case cudaMemcpyHostToDevice: return dst_dev ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToHost: return src_dev ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToDevice: return dst_dev && src_dev ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDefault: return cudaSuccess;
    }
    return cudaErrorInvalidMemcpyDirection;
}
} // namespace

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    CUEMU_LOCKED;
    cudaError_t e = check_copy(dst, src, count, kind);
    if (e != cudaSuccess) return fail(e);
    if ((e = refuse_if_capturing("cudaMemcpy"))) return e;
    run_everything();
    if (count) std::memmove(dst, src, count);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
    CUEMU_LOCKED;
    cudaError_t e = check_copy(dst, src, count, kind);
    if (e != cudaSuccess) return fail(e);
    if (bad_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
    if (!count) return cudaSuccess;
    stream_impl *s = stream_of(stream);
    if (in_capture() && (find_allocation(dst, count) == device_allocations.end() ||
                         find_allocation(src, count) == device_allocations.end())) {
        e = uncapturable(s, "cudaMemcpyAsync to or from host memory", "");
        if (e != cudaSuccess) return e;
    }
    /* the copy reads src when it runs, as a pinned-memory copy does: changing the host buffer
     * before the sync is a bug this shows */
    return enqueue(
        s, [=]() { std::memmove(dst, src, count); }, "cudaMemcpyAsync");
}

cudaError_t cudaMemset(void *ptr, int value, size_t count) {
    CUEMU_LOCKED;
    if (count && find_allocation(ptr, count) == device_allocations.end())
        return fail(cudaErrorInvalidValue);
    if (cudaError_t e = refuse_if_capturing("cudaMemset")) return e;
    run_everything();
    if (count) std::memset(ptr, value, count);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream) {
    CUEMU_LOCKED;
    if (count && find_allocation(ptr, count) == device_allocations.end())
        return fail(cudaErrorInvalidValue);
    if (bad_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
    if (!count) return cudaSuccess;
    return enqueue(
        stream_of(stream), [=]() { std::memset(ptr, value, count); }, "cudaMemsetAsync");
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *ptr) {
    CUEMU_LOCKED;
    if (!attr) return fail(cudaErrorInvalidValue);
    std::memset(attr, 0, sizeof *attr);
    auto it = find_allocation(ptr, 1);
    if (it != device_allocations.end()) {
        attr->type = cudaMemoryTypeDevice;
        attr->device = current_device;
        attr->devicePointer = const_cast<void *>(ptr);
    } else if (host_allocations.count(const_cast<void *>(ptr))) {
        attr->type = cudaMemoryTypeHost;
        attr->hostPointer = const_cast<void *>(ptr);
        attr->devicePointer = const_cast<void *>(ptr);
    } else {
        attr->type = cudaMemoryTypeUnregistered;
        attr->device = -2;
    }
    return cudaSuccess;
}

/* ---- streams ------------------------------------------------------------------------------- */
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
    CUEMU_LOCKED;
    if (!stream) return fail(cudaErrorInvalidValue);
    stream_impl *s = new stream_impl();
    s->blocking = !(flags & cudaStreamNonBlocking);
    streams.push_back(s);
    *stream = reinterpret_cast<cudaStream_t>(s);
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream) {
    return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *stream, unsigned int flags, int priority) {
    (void)priority;
    return cudaStreamCreateWithFlags(stream, flags);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    CUEMU_LOCKED;
    stream_impl *s = stream_of(stream);
    if (s == &legacy_stream || s->destroyed) return fail(cudaErrorInvalidResourceHandle);
    if (in_capture() && s->capture != CAPTURE_NONE)
        return refuse_in_capture("cudaStreamDestroy of a capturing stream");
    run_stream(s); /* the real call returns at once and lets queued work finish */
    s->destroyed = true;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    CUEMU_LOCKED;
    if (bad_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
    if (cudaError_t e = refuse_if_capturing("cudaStreamSynchronize")) return e;
    run_stream(stream_of(stream));
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
    CUEMU_LOCKED;
    if (bad_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
    if (cudaError_t e = refuse_if_capturing("cudaStreamQuery")) return e;
    stream_impl *s = stream_of(stream);
    if (s->done == s->enqueued) return cudaSuccess;
    blocking_scope scope(false);
    run_stream(s);
    return cudaErrorNotReady; /* not recorded as an error, as in the real runtime */
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
    CUEMU_LOCKED;
    (void)flags;
    if (bad_stream(stream) || !event || event_of(event)->destroyed)
        return fail(cudaErrorInvalidResourceHandle);
    if (cudaError_t r = uncapturable(stream_of(stream), "cudaStreamWaitEvent",
                                     " (event nodes are not emulated)"))
        return r;
    event_impl *e = event_of(event);
    if (!e->stream) return cudaSuccess; /* never recorded: nothing to wait for */
    if (work_depth > 0)
        run_stream_until(e->stream, e->seq);
    else
        push_wait(stream_of(stream), e->stream, e->seq);
    return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *user_data) {
    CUEMU_LOCKED;
    if (!fn) return fail(cudaErrorInvalidValue);
    if (bad_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
    return enqueue(
        stream_of(stream), [fn, user_data]() { fn(user_data); }, "cudaLaunchHostFunc");
}

/* ---- events -------------------------------------------------------------------------------- */
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    CUEMU_LOCKED;
    if (!event) return fail(cudaErrorInvalidValue);
    event_impl *e = new event_impl();
    events.push_back(e);
    e->flags = flags;
    *event = reinterpret_cast<cudaEvent_t>(e);
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) {
    return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    CUEMU_LOCKED;
    if (!event || event_of(event)->destroyed) return fail(cudaErrorInvalidResourceHandle);
    event_of(event)->destroyed = true; /* kept: a queued record may still refer to it */
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    CUEMU_LOCKED;
    if (!event || event_of(event)->destroyed || bad_stream(stream))
        return fail(cudaErrorInvalidResourceHandle);
    event_impl *e = event_of(event);
    stream_impl *s = stream_of(stream);
    if (cudaError_t r = uncapturable(s, "cudaEventRecord", " (event nodes are not emulated)"))
        return r;
    uint64_t generation = ++e->generation;
    e->complete = false;
    enqueue(
        s,
        [e, generation]() {
            if (e->generation != generation) return;
            e->complete = true;
            e->when = std::chrono::steady_clock::now();
        },
        "cudaEventRecord");
    e->stream = s;
    e->seq = work_depth > 0 ? s->done : s->enqueued; /* inside work it has run already */
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    CUEMU_LOCKED;
    if (!event || event_of(event)->destroyed) return fail(cudaErrorInvalidResourceHandle);
    if (cudaError_t r = refuse_if_capturing("cudaEventSynchronize")) return r;
    event_impl *e = event_of(event);
    if (e->stream) run_event(e->stream, e->seq);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
    CUEMU_LOCKED;
    if (!event || event_of(event)->destroyed) return fail(cudaErrorInvalidResourceHandle);
    if (cudaError_t r = refuse_if_capturing("cudaEventQuery")) return r;
    event_impl *e = event_of(event);
    if (!e->stream || e->complete) return cudaSuccess;
    blocking_scope scope(false);
    run_event(e->stream, e->seq);
    return cudaErrorNotReady;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    CUEMU_LOCKED;
    if (!ms) return fail(cudaErrorInvalidValue);
    if (!start || !end) return fail(cudaErrorInvalidResourceHandle);
    event_impl *a = event_of(start), *b = event_of(end);
    if (a->destroyed || b->destroyed || !a->stream || !b->stream ||
        ((a->flags | b->flags) & cudaEventDisableTiming))
        return fail(cudaErrorInvalidResourceHandle);
    if (!a->complete || !b->complete) return fail(cudaErrorNotReady);
    *ms = std::chrono::duration<float, std::milli>(b->when - a->when).count();
    return cudaSuccess;
}

/* ---- stream capture and graphs -------------------------------------------------------------- */
namespace {
/* A graph is its captured items in order; an executable graph, a copy of them. Both are freed on
 * destroy; the live ones of each kind are listed so that a stale or foreign handle is refused. */
struct graph_items {
    std::vector<std::function<void()>> items;
};
std::set<graph_items *> &graphs = forever<std::set<graph_items *>>();
std::set<graph_items *> &graph_execs = forever<std::set<graph_items *>>();

/* The live entry of `live` that handle h (a cudaGraph_t or cudaGraphExec_t) names, or null. */
template <typename H> graph_items *live_of(std::set<graph_items *> &live, H h) {
    auto it = live.find(reinterpret_cast<graph_items *>(h));
    return it == live.end() ? nullptr : *it;
}

template <typename H> cudaError_t destroy_live(std::set<graph_items *> &live, H h) {
    graph_items *g = live_of(live, h);
    if (!g) return fail(cudaErrorInvalidValue);
    live.erase(g);
    delete g; /* queued launches hold copies of its items */
    return cudaSuccess;
}
} // namespace

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
    CUEMU_LOCKED;
    if (bad_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
    stream_impl *s = stream_of(stream);
    if (s == &legacy_stream) return fail(cudaErrorStreamCaptureUnsupported);
    /* every mode is treated as cudaStreamCaptureModeGlobal (the header says what that refuses) */
    if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
        mode != cudaStreamCaptureModeRelaxed)
        return fail(cudaErrorInvalidValue);
    if (s->capture != CAPTURE_NONE) return fail(cudaErrorIllegalState);
    s->capture = CAPTURE_ACTIVE;
    s->captured.clear();
    s->invalidated_why.clear();
    open_captures++;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph) {
    CUEMU_LOCKED;
    if (!pGraph) return fail(cudaErrorInvalidValue);
    if (bad_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
    stream_impl *s = stream_of(stream);
    if (s->capture == CAPTURE_NONE) return fail(cudaErrorIllegalState);
    bool invalidated = s->capture == CAPTURE_INVALIDATED;
    std::vector<std::function<void()>> items = std::move(s->captured);
    std::string why = std::move(s->invalidated_why);
    s->capture = CAPTURE_NONE;
    s->captured.clear();
    s->invalidated_why.clear();
    open_captures--;
    if (invalidated) {
        *pGraph = nullptr;
        fprintf(stderr, "cuemu: stream capture invalidated: %s\n", why.c_str());
        return fail(cudaErrorStreamCaptureInvalidated);
    }
    graph_items *g = new graph_items();
    g->items = std::move(items);
    graphs.insert(g);
    *pGraph = reinterpret_cast<cudaGraph_t>(g);
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream,
                                  enum cudaStreamCaptureStatus *pCaptureStatus) {
    CUEMU_LOCKED;
    if (!pCaptureStatus) return fail(cudaErrorInvalidValue);
    if (bad_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
    stream_impl *s = stream_of(stream);
    /* the legacy stream never captures; asked while a blocking stream captures, the real runtime
     * answers with this error (and invalidates nothing) */
    if (s == &legacy_stream && blocking_capture_open()) return fail(cudaErrorStreamCaptureImplicit);
    *pCaptureStatus = s->capture == CAPTURE_ACTIVE        ? cudaStreamCaptureStatusActive
                      : s->capture == CAPTURE_INVALIDATED ? cudaStreamCaptureStatusInvalidated
                                                          : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}

/* nodes: NULL asks for the count; otherwise up to *numNodes opaque handles (one per item, in
 * capture order; the rest NULL) and *numNodes becomes the number filled in. The handles can only
 * be compared: no node API is emulated. */
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *numNodes) {
    CUEMU_LOCKED;
    graph_items *g = live_of(graphs, graph);
    if (!g || !numNodes) return fail(cudaErrorInvalidValue);
    size_t n = g->items.size();
    if (nodes) {
        for (size_t i = 0; i < *numNodes; i++)
            nodes[i] = i < n ? reinterpret_cast<cudaGraphNode_t>(&g->items[i]) : nullptr;
        if (*numNodes < n) n = *numNodes;
    }
    *numNodes = n;
    return cudaSuccess;
}

/* flags are accepted and ignored (upload, auto-free and priorities change nothing here). */
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                 unsigned long long flags) {
    CUEMU_LOCKED;
    (void)flags;
    if (!pGraphExec) return fail(cudaErrorInvalidValue);
    graph_items *g = live_of(graphs, graph);
    if (!g) return fail(cudaErrorInvalidValue);
    graph_items *x = new graph_items();
    x->items = g->items; /* a copy: the graph may be destroyed, the executable graph still runs */
    graph_execs.insert(x);
    *pGraphExec = reinterpret_cast<cudaGraphExec_t>(x);
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
    CUEMU_LOCKED;
    graph_items *x = live_of(graph_execs, graphExec);
    if (!x) return fail(cudaErrorInvalidValue);
    if (bad_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
    stream_impl *s = stream_of(stream);
    if (cudaError_t e = uncapturable(s, "cudaGraphLaunch", " (child graphs are not emulated)"))
        return e;
    /* each item is ordinary stream work, run when a sync point needs it */
    for (const std::function<void()> &item : x->items) enqueue(s, item, "cudaGraphLaunch");
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec) {
    CUEMU_LOCKED;
    return destroy_live(graph_execs, graphExec);
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    CUEMU_LOCKED;
    return destroy_live(graphs, graph);
}

/* ---- functions ----------------------------------------------------------------------------- */
cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
    CUEMU_LOCKED;
    if (!func) return fail(cudaErrorInvalidDeviceFunction);
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || (size_t)value > DYNAMIC_SHARED_OPTIN) return fail(cudaErrorInvalidValue);
        max_dynamic_shared[func] = value;
        return cudaSuccess;
    }
    if (attr == cudaFuncAttributePreferredSharedMemoryCarveout) return cudaSuccess;
    return cudaSuccess; /* the other attributes change nothing a CPU can show */
}

cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, const void *func) {
    CUEMU_LOCKED;
    if (!attr) return fail(cudaErrorInvalidValue);
    if (!func) return fail(cudaErrorInvalidDeviceFunction);
    std::memset(attr, 0, sizeof *attr);
    auto it = max_dynamic_shared.find(func);
    attr->maxDynamicSharedSizeBytes =
        it != max_dynamic_shared.end() ? it->second : (int)DYNAMIC_SHARED_DEFAULT;
    attr->maxThreadsPerBlock = 1024;
    attr->numRegs = 32;
    attr->ptxVersion = 90;
    attr->binaryVersion = 90;
    return cudaSuccess;
}
