/*
 * cuemu.cc — the emulator's scheduler: runs one launch's blocks one after another, each CUDA
 * thread of a block as a fiber (cuemu.h says what is checked).
 *
 * Fibers. One persistent fiber per thread slot of a block (up to 1024), each on its own mmap'd
 * stack with a guard page below it, created on first need and reused by every later block and
 * launch; a fiber loops forever, running its slot's CUDA thread once per block. A switch is
 * _setjmp/_longjmp between stacks (about 34 ns a round trip, against 441 ns for swapcontext,
 * which saves and restores the signal mask with a system call each time); makecontext is used
 * only to start a fiber on its stack. Under AddressSanitizer each switch is announced with
 * __sanitizer_start/finish_switch_fiber, so ASan knows which stack is live (its swapcontext
 * support clears the shadow of the whole stack at every switch: 100x slower). -DCUEMU_UCONTEXT
 * makes every switch a swapcontext, the portable fallback.
 *
 * Scheduling. A block is run in passes: each pass runs the warps in the chosen order, and a warp
 * runs its ready lanes (again in that order) until every lane waits at a barrier, waits at a warp
 * operation, or has exited. A warp operation completes, and its lanes become ready, when the last
 * lane named in its mask arrives; a lane's result is computed then, from the values all lanes
 * brought. After a pass nothing is ready: either every thread has exited (the block is done), or
 * every live thread waits at __syncthreads (release it), or the block is deadlocked (an error).
 */
#undef _FORTIFY_SOURCE /* __longjmp_chk would refuse to jump to another stack */

#include "cuda/emu/cuemu.h"

#include <algorithm>
#include <csetjmp>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define CUEMU_ASAN_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define CUEMU_ASAN_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#define CUEMU_ASAN_START_SWITCH(save, bottom, size)                                                \
    __sanitizer_start_switch_fiber(save, bottom, size)
#define CUEMU_ASAN_FINISH_SWITCH(save, bottom, size)                                               \
    __sanitizer_finish_switch_fiber(save, bottom, size)
#else
#define CUEMU_ASAN_POISON(p, n) ((void)(p), (void)(n))
#define CUEMU_ASAN_UNPOISON(p, n) ((void)(p), (void)(n))
#define CUEMU_ASAN_START_SWITCH(save, bottom, size) ((void)(save), (void)(bottom), (void)(size))
#define CUEMU_ASAN_FINISH_SWITCH(save, bottom, size) ((void)(save), (void)(bottom), (void)(size))
#endif

uint3 cuemu_thread_idx;
uint3 cuemu_block_idx;
dim3 cuemu_block_dim;
dim3 cuemu_grid_dim;
extern "C" const int warpSize = 32;

namespace {

/* The bytes every poisoned buffer is filled with: NaN as an f32 and as each bf16 half. */
const uint32_t POISON32 = 0x7FC07FC0u;
const uint64_t POISON64 = 0x7FC07FC07FC07FC0ull;
const size_t STATIC_SHARED_LIMIT = 48 * 1024; /* ptxas rejects more */
const size_t ASAN_REDZONE = 64;               /* between static shared arrays, under ASan */

void poison_fill(void *p, size_t bytes) {
    unsigned char *b = static_cast<unsigned char *>(p);
    size_t words = bytes / 4;
    for (size_t i = 0; i < words; i++) std::memcpy(b + 4 * i, &POISON32, 4);
    std::memcpy(b + 4 * words, &POISON32, bytes % 4);
}

/* ---- fibers -------------------------------------------------------------------------------- */
struct fiber {
#ifdef CUEMU_UCONTEXT
    ucontext_t context;
#else
    jmp_buf context;
#endif
    void *stack;
    size_t stack_bytes;
    void *asan_fake_stack; /* ASan's bookkeeping while the fiber is switched out */
};

/* Never freed (a fixed array, so no exit-time destructor hides them from LeakSanitizer). */
fiber *fibers[1024];
int n_fibers;
#ifdef CUEMU_UCONTEXT
ucontext_t scheduler_context;
#else
jmp_buf scheduler_context;
ucontext_t boot_return; /* where a new fiber's first swapcontext comes back to */
fiber *booting;         /* the fiber being started */
#endif
/* the scheduler's stack as ASan knows it, learnt when a fiber is first entered */
void *scheduler_fake_stack;
const void *scheduler_stack_bottom;
size_t scheduler_stack_bytes;

size_t stack_bytes() {
    static size_t bytes = [] {
        const char *kb = getenv("CUEMU_STACK_KB");
        long n = kb ? atol(kb) : 0;
#ifdef __SANITIZE_ADDRESS__
        size_t fallback = 1024 * 1024; /* ASan's redzones make frames larger */
#else
        size_t fallback = 256 * 1024;
#endif
        return n > 0 ? (size_t)n * 1024 : fallback;
    }();
    return bytes;
}

/* The state of the block being run. */
enum thread_state : uint8_t { THREAD_READY, THREAD_AT_BARRIER, THREAD_AT_WARP_OP, THREAD_EXITED };
enum warp_op_kind : uint8_t {
    OP_SHFL_IDX = CUEMU_SHFL_IDX,
    OP_SHFL_UP = CUEMU_SHFL_UP,
    OP_SHFL_DOWN = CUEMU_SHFL_DOWN,
    OP_SHFL_XOR = CUEMU_SHFL_XOR,
    OP_SYNCWARP,
    OP_BALLOT,
    OP_ANY,
    OP_ALL,
    OP_COLLECTIVE, /* a warp-wide instruction (mma, ldmatrix): cuemu_warp_collective */
};
const char *const warp_op_names[] = {"__shfl_sync",     "__shfl_up_sync", "__shfl_down_sync",
                                     "__shfl_xor_sync", "__syncwarp",     "__ballot_sync",
                                     "__any_sync",      "__all_sync",     "a warp collective"};

/* One cp.async: `bytes` from src to dst, or zeros when src is null (src-size 0). */
struct cp_copy {
    void *dst;
    const void *src;
    unsigned bytes;
};

struct thread_slot {
    thread_state state;
    warp_op_kind op;
    int arg, width;
    unsigned mask;
    uint64_t value, result;
    cuemu_collective_fn collective; /* OP_COLLECTIVE: what runs once every lane has arrived */
    const char *collective_name;
    /* cp.async: copies issued and not yet committed, and the committed groups not yet landed
     * (oldest first); see cuemu_cp_async */
    std::vector<cp_copy> cp_open;
    std::deque<std::vector<cp_copy>> cp_groups;
};

struct warp_slot {
    unsigned ready;   /* lanes to run */
    unsigned waiting; /* lanes at a warp operation */
    unsigned gone;    /* lanes that exited, or that the block does not have */
};

struct block_state {
    const cuemu_launch_info *info;
    void (*thread_main)(void *);
    void *args;
    int n_threads, n_warps;
    int current; /* the linear thread id running now */
    int n_exited, n_at_barrier;
    std::vector<thread_slot> threads;
    std::vector<warp_slot> warps;
    std::vector<int> warp_order;
    /* shared memory */
    unsigned char *dynamic_shared;
    std::vector<unsigned char> static_arena;
    std::vector<std::pair<const void *, size_t>> static_sites; /* site -> offset */
    size_t static_used;
};
block_state block;
uint64_t threads_run;

/* ---- order --------------------------------------------------------------------------------- */
cuemu_order order = CUEMU_ORDER_ASCENDING;
uint64_t rng_state = 1;
std::string order_env_seen = "\x01"; /* the CUEMU_ORDER value last applied (none yet) */

/* Applies CUEMU_ORDER when it differs from the value applied last: tests change it between runs
 * of the same kernels (test/unit/cuda_test_util.h), so it is read at every launch, not once. */
void order_from_env() {
    const char *env = getenv("CUEMU_ORDER");
    std::string now = env ? env : "";
    if (now == order_env_seen) return;
    order_env_seen = now;
    if (now.empty() || now == "ascending") {
        order = CUEMU_ORDER_ASCENDING;
    } else if (now == "descending") {
        order = CUEMU_ORDER_DESCENDING;
    } else if (!strncmp(env, "random", 6)) {
        order = CUEMU_ORDER_RANDOM;
        rng_state = (env[6] == ':' ? strtoull(env + 7, nullptr, 10) : 1) * 2654435761u + 1;
    } else {
        fprintf(stderr, "cuemu: CUEMU_ORDER=%s is not ascending, descending or random:SEED\n", env);
        exit(2);
    }
}

uint32_t random_next() { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 2685821657736338717ull) >> 32);
}

void order_indices(std::vector<int> &idx, int n) {
    idx.resize(n);
    for (int i = 0; i < n; i++) idx[i] = order == CUEMU_ORDER_DESCENDING ? n - 1 - i : i;
    if (order == CUEMU_ORDER_RANDOM)
        for (int i = n - 1; i > 0; i--) std::swap(idx[i], idx[random_next() % (i + 1)]);
}

/* The next lane of `lanes` (non-empty) to run. */
int pick_lane(unsigned lanes) {
    switch (order) {
    case CUEMU_ORDER_ASCENDING: return __builtin_ctz(lanes);
    case CUEMU_ORDER_DESCENDING: return 31 - __builtin_clz(lanes);
    case CUEMU_ORDER_RANDOM: break;
    }
    int k = (int)(random_next() % (unsigned)__builtin_popcount(lanes));
    while (k--) lanes &= lanes - 1;
    return __builtin_ctz(lanes);
}

/* ---- diagnostics --------------------------------------------------------------------------- */
std::string kernel_name(const cuemu_launch_info *info) {
    std::string name;
    int depth = 0;
    for (const char *c = info->text; *c; c++) { /* the text up to the first top-level comma */
        if (*c == '<' || *c == '(') depth++;
        if (*c == '>' || *c == ')') depth--;
        if (*c == ',' && depth <= 0) break;
        name += *c;
    }
    return name;
}

std::string thread_name(int t) {
    const dim3 &b = block.info->block;
    char s[64];
    snprintf(s, sizeof s, "%d,%d,%d", t % (int)b.x, t / (int)b.x % (int)b.y, t / (int)(b.x * b.y));
    return s;
}

[[noreturn]] void block_error(int t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
[[noreturn]] void block_error(int t, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cuemu: kernel %s (launched at %s:%d): %s (block %u,%u,%u thread %s)\n",
            kernel_name(block.info).c_str(), block.info->file, block.info->line, what,
            cuemu_block_idx.x, cuemu_block_idx.y, cuemu_block_idx.z,
            t >= 0 ? thread_name(t).c_str() : "-");
    fflush(stderr);
    abort();
}

/* ---- switching ----------------------------------------------------------------------------- */
/* Called on the fiber: back to the scheduler until it resumes this thread. */
void yield_to_scheduler() {
    fiber *f = fibers[block.current];
    CUEMU_ASAN_START_SWITCH(&f->asan_fake_stack, scheduler_stack_bottom, scheduler_stack_bytes);
#ifdef CUEMU_UCONTEXT
    swapcontext(&f->context, &scheduler_context);
#else
    if (!_setjmp(f->context)) _longjmp(scheduler_context, 1);
#endif
    CUEMU_ASAN_FINISH_SWITCH(fibers[block.current]->asan_fake_stack, &scheduler_stack_bottom,
                             &scheduler_stack_bytes);
}

void fiber_main() {
    CUEMU_ASAN_FINISH_SWITCH(fibers[block.current]->asan_fake_stack, &scheduler_stack_bottom,
                             &scheduler_stack_bytes);
    for (;;) {
        block.thread_main(block.args);
        block.threads[block.current].state = THREAD_EXITED;
        yield_to_scheduler();
    }
}

#ifndef CUEMU_UCONTEXT
void fiber_trampoline() {
    /* Park here: the first resume's _longjmp lands on this frame, on the fiber's own stack. */
    if (!_setjmp(booting->context)) {
        ucontext_t unused;
        swapcontext(&unused, &boot_return);
    }
    fiber_main();
}
#endif

void *map_stack(size_t bytes) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    void *base = mmap(nullptr, bytes + page, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (base == MAP_FAILED) {
        perror("cuemu: mmap of a fiber stack");
        abort();
    }
    mprotect(base, page, PROT_NONE); /* the guard page: an overflow faults instead of corrupting */
    return static_cast<char *>(base) + page;
}

void ensure_fibers(int n) {
    while (n_fibers < n) {
        fiber *f = fibers[n_fibers++] = new fiber();
        size_t bytes = stack_bytes();
        void *stack = map_stack(bytes);
        f->stack = stack;
        f->stack_bytes = bytes;
#ifdef CUEMU_UCONTEXT
        getcontext(&f->context);
        f->context.uc_stack.ss_sp = stack;
        f->context.uc_stack.ss_size = bytes;
        f->context.uc_link = nullptr;
        makecontext(&f->context, fiber_main, 0);
#else
        ucontext_t start;
        getcontext(&start);
        start.uc_stack.ss_sp = stack;
        start.uc_stack.ss_size = bytes;
        start.uc_link = nullptr;
        makecontext(&start, fiber_trampoline, 0);
        booting = f;
        swapcontext(&boot_return, &start);
#endif
    }
}

void set_thread_idx(int t) {
    const dim3 &b = block.info->block;
    cuemu_thread_idx.x = (unsigned)t % b.x;
    cuemu_thread_idx.y = (unsigned)t / b.x % b.y;
    cuemu_thread_idx.z = (unsigned)t / (b.x * b.y);
}

/* Runs thread t until it waits or exits. */
void resume(int t) {
    block.current = t;
    set_thread_idx(t);
    fiber *f = fibers[t];
    CUEMU_ASAN_START_SWITCH(&scheduler_fake_stack, f->stack, f->stack_bytes);
#ifdef CUEMU_UCONTEXT
    swapcontext(&scheduler_context, &f->context);
#else
    if (!_setjmp(scheduler_context)) _longjmp(f->context, 1);
#endif
    CUEMU_ASAN_FINISH_SWITCH(scheduler_fake_stack, nullptr, nullptr);
}

/* ---- warp operations ----------------------------------------------------------------------- */
/* The value lane `lane` receives from a completed shuffle (CUDA's rules for width and for source
 * lanes outside the segment); a source lane outside the mask gives poison (undefined in CUDA). */
uint64_t shuffle_result(const thread_slot *lanes, unsigned mask, int lane) {
    const thread_slot &me = lanes[lane];
    int width = me.width, segment = lane & ~(width - 1), src = 0;
    int arg = me.arg & 31; /* the hardware reads the low 5 bits of the lane or offset */
    switch (me.op) {
    case OP_SHFL_IDX: src = segment + (arg & (width - 1)); break;
    case OP_SHFL_UP:
        if ((lane & (width - 1)) < arg) return me.value;
        src = lane - arg;
        break;
    case OP_SHFL_DOWN:
        if ((lane & (width - 1)) + arg >= width) return me.value;
        src = lane + arg;
        break;
    case OP_SHFL_XOR:
        src = lane ^ arg;
        if (src >= segment + width) return me.value; /* later segments are out of reach */
        break;
    default: break;
    }
    return (mask >> src & 1u) ? lanes[src].value : POISON64;
}

/* Called when lane `t` has arrived at a warp operation: completes it if every lane is there. */
void warp_op_arrived(int t) {
    int w = t / 32, lane = t % 32;
    warp_slot &warp = block.warps[w];
    thread_slot *lanes = &block.threads[w * 32];
    const thread_slot &me = lanes[lane];
    unsigned mask = me.mask;
    if (!(mask >> lane & 1u))
        block_error(t, "%s mask 0x%08x does not name the calling lane %d", warp_op_names[me.op],
                    mask, lane);
    if (mask & warp.gone)
        block_error(t, "%s mask 0x%08x names lanes that have exited or do not exist (0x%08x)",
                    warp_op_names[me.op], mask, mask & warp.gone);
    warp.waiting |= 1u << lane;
    if ((warp.waiting & mask) != mask) return;
    for (unsigned m = mask; m; m &= m - 1) {
        const thread_slot &other = lanes[__builtin_ctz(m)];
        if (other.op != me.op || other.mask != mask)
            block_error(t,
                        "warp operations do not match: lane %d is at %s mask 0x%08x, lane %d "
                        "at %s mask 0x%08x",
                        lane, warp_op_names[me.op], mask, __builtin_ctz(m), warp_op_names[other.op],
                        other.mask);
    }
    if (me.op == OP_COLLECTIVE) {
        void *args[32];
        for (int l = 0; l < 32; l++) {
            if (lanes[l].collective != me.collective)
                block_error(t, "warp collectives do not match: lane %d is at %s, lane %d at %s",
                            lane, me.collective_name, l, lanes[l].collective_name);
            args[l] = (void *)(uintptr_t)lanes[l].value;
        }
        me.collective(args); /* every lane's inputs read, every lane's outputs written */
    }
    unsigned votes = 0;
    for (unsigned m = mask; m; m &= m - 1)
        if (lanes[__builtin_ctz(m)].value) votes |= 1u << __builtin_ctz(m);
    for (unsigned m = mask; m; m &= m - 1) {
        thread_slot &l = lanes[__builtin_ctz(m)];
        switch (l.op) {
        case OP_SYNCWARP:
        case OP_COLLECTIVE: l.result = 0; break;
        case OP_BALLOT: l.result = votes; break;
        case OP_ANY: l.result = votes != 0; break;
        case OP_ALL: l.result = votes == mask; break;
        default: l.result = shuffle_result(lanes, mask, __builtin_ctz(m)); break;
        }
        l.state = THREAD_READY;
    }
    warp.waiting &= ~mask;
    warp.ready |= mask;
}

void thread_exited(int t) {
    int w = t / 32, lane = t % 32;
    warp_slot &warp = block.warps[w];
    warp.gone |= 1u << lane;
    block.n_exited++;
    for (unsigned m = warp.waiting; m; m &= m - 1) {
        const thread_slot &other = block.threads[w * 32 + __builtin_ctz(m)];
        if (other.mask >> lane & 1u)
            block_error(w * 32 + __builtin_ctz(m),
                        "%s mask 0x%08x names lane %d, which exited without reaching it",
                        warp_op_names[other.op], other.mask, lane);
    }
}

uint64_t warp_op(warp_op_kind op, unsigned mask, uint64_t value, int arg, int width) {
    if (!block.info) {
        fprintf(stderr, "cuemu: %s called outside a kernel\n", warp_op_names[op]);
        abort();
    }
    thread_slot &me = block.threads[block.current];
    me.state = THREAD_AT_WARP_OP;
    me.op = op;
    me.mask = mask;
    me.value = value;
    me.arg = arg;
    me.width = width;
    yield_to_scheduler();
    return block.threads[block.current].result;
}

bool strict_barriers() {
    static bool strict = [] {
        const char *s = getenv("CUEMU_STRICT");
        return !(s && !strcmp(s, "0"));
    }();
    return strict;
}

/* Nothing is ready: release a barrier every live thread waits at, or report the deadlock. */
void release_barrier_or_fail() {
    int first_barrier = -1, first_exited = -1, first_warp_op = -1;
    for (int t = 0; t < block.n_threads; t++) {
        thread_state s = block.threads[t].state;
        if (s == THREAD_AT_BARRIER && first_barrier < 0) first_barrier = t;
        if (s == THREAD_EXITED && first_exited < 0) first_exited = t;
        if (s == THREAD_AT_WARP_OP && first_warp_op < 0) first_warp_op = t;
    }
    if (first_warp_op >= 0) {
        const thread_slot &w = block.threads[first_warp_op];
        unsigned missing = w.mask & ~block.warps[first_warp_op / 32].waiting;
        block_error(first_warp_op,
                    "deadlock: this thread waits at %s mask 0x%08x for lanes 0x%08x, which wait "
                    "elsewhere (%d threads of the block wait at __syncthreads)",
                    warp_op_names[w.op], w.mask, missing, block.n_at_barrier);
    }
    if (block.n_exited > 0 && strict_barriers())
        block_error(first_barrier,
                    "__syncthreads reached by %d of %d threads; the others exited first (thread "
                    "%s, for one), which real hardware does not define (CUEMU_STRICT=0 allows it)",
                    block.n_at_barrier, block.n_threads, thread_name(first_exited).c_str());
    uint64_t count = 0; /* for __syncthreads_count/and/or: true predicates, and participants */
    for (int t = 0; t < block.n_threads; t++)
        if (block.threads[t].state == THREAD_AT_BARRIER && block.threads[t].value) count++;
    count |= (uint64_t)block.n_at_barrier << 32;
    for (int t = 0; t < block.n_threads; t++) {
        thread_slot &s = block.threads[t];
        if (s.state != THREAD_AT_BARRIER) continue;
        s.result = count;
        s.state = THREAD_READY;
        block.warps[t / 32].ready |= 1u << (t % 32);
    }
    block.n_at_barrier = 0;
}

void run_warp(int w) {
    warp_slot &warp = block.warps[w];
    while (warp.ready) {
        int lane = pick_lane(warp.ready);
        int t = w * 32 + lane;
        warp.ready &= ~(1u << lane);
        resume(t);
        switch (block.threads[t].state) {
        case THREAD_EXITED: thread_exited(t); break;
        case THREAD_AT_WARP_OP: warp_op_arrived(t); break;
        case THREAD_AT_BARRIER: block.n_at_barrier++; break;
        case THREAD_READY: break;
        }
    }
}

void run_block() {
    int n = block.n_threads;
    for (int t = 0; t < n; t++) {
        block.threads[t].state = THREAD_READY;
        block.threads[t].cp_open.clear(); /* a thread that exited with copies in flight */
        block.threads[t].cp_groups.clear();
    }
    for (int w = 0; w < block.n_warps; w++) {
        int lanes = std::min(32, n - 32 * w);
        unsigned present = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
        block.warps[w] = warp_slot{present, 0, ~present};
    }
    block.n_exited = block.n_at_barrier = 0;
    block.static_sites.clear();
    block.static_used = 0;
    CUEMU_ASAN_POISON(block.static_arena.data(), block.static_arena.size());
    if (block.info->smem_bytes) poison_fill(block.dynamic_shared, block.info->smem_bytes);
    for (;;) {
        order_indices(block.warp_order, block.n_warps);
        for (int w : block.warp_order) run_warp(w);
        if (block.n_exited == n) break;
        release_barrier_or_fail();
    }
    cuemu_wgmma_block_end();
    threads_run += (uint64_t)n;
}

} // namespace

/* ---- entry points -------------------------------------------------------------------------- */
void cuemu_set_order(cuemu_order new_order, unsigned seed) {
    order_from_env(); /* a bad CUEMU_ORDER is reported even when a test sets its own order; the
                       * order set here holds until CUEMU_ORDER changes */
    order = new_order;
    rng_state = (uint64_t)seed * 2654435761u + 1;
}

/* cp.async. The PTX ISA lets a copy land any time between its issue and the cp.async.wait_group
 * that covers its group; the emulator picks the two ends by order: ascending lands every group at
 * the wait (a read before the wait sees the poison or the previous tile), descending at the issue
 * (a copy into a buffer other warps still read, before the barrier that frees it, clobbers it), a
 * random order each group at one end or the other. */
namespace {
void cp_land(std::vector<cp_copy> &group) {
    for (const cp_copy &c : group) {
        if (c.src)
            memcpy(c.dst, c.src, c.bytes);
        else
            memset(c.dst, 0, c.bytes);
    }
    group.clear();
}
bool cp_land_at_issue() {
    switch (order) {
    case CUEMU_ORDER_ASCENDING: return false;
    case CUEMU_ORDER_DESCENDING: return true;
    case CUEMU_ORDER_RANDOM: break;
    }
    return random_next() & 1u;
}
} // namespace

void cuemu_cp_async(void *dst, const void *src, unsigned bytes, bool fill) {
    const int t = block.current;
    if ((bytes != 4 && bytes != 8 && bytes != 16) || (uintptr_t)dst % bytes != 0 ||
        !cuemu_is_shared_pointer(dst, bytes))
        block_error(t,
                    "cp.async of %u bytes to %p: 4, 8 or 16 bytes of shared memory on a "
                    "boundary of that size",
                    bytes, dst);
    if (fill && ((uintptr_t)src % bytes != 0 || !cuemu_is_device_pointer(src, bytes)))
        block_error(t,
                    "cp.async of %u bytes from %p: not %u bytes of device memory on a boundary "
                    "of that size",
                    bytes, src, bytes);
    block.threads[t].cp_open.push_back(cp_copy{dst, fill ? src : nullptr, bytes});
}

void cuemu_cp_async_commit() {
    thread_slot &me = block.threads[block.current];
    me.cp_groups.push_back(std::move(me.cp_open));
    me.cp_open.clear();
    if (cp_land_at_issue()) cp_land(me.cp_groups.back());
}

void cuemu_cp_async_wait(int n_pending) {
    thread_slot &me = block.threads[block.current];
    while ((int)me.cp_groups.size() > n_pending) {
        cp_land(me.cp_groups.front());
        me.cp_groups.pop_front();
    }
}

uint64_t cuemu_threads_run() {
    return threads_run;
}

void cuemu_run_grid(const cuemu_launch_info &info, void (*thread_main)(void *), void *args) {
    order_from_env();
    int n = (int)(info.block.x * info.block.y * info.block.z);
    ensure_fibers(n);
    block.info = &info;
    block.thread_main = thread_main;
    block.args = args;
    block.n_threads = n;
    block.n_warps = (n + 31) / 32;
    block.threads.assign((size_t)block.n_warps * 32, thread_slot{});
    block.warps.assign(block.n_warps, warp_slot{});
    block.static_arena.resize(2 * STATIC_SHARED_LIMIT);
    /* dynamic shared memory: its own allocation, so ASan sees an access past its end */
    std::unique_ptr<unsigned char[]> dynamic(
        new unsigned char[info.smem_bytes ? info.smem_bytes : 1]);
    block.dynamic_shared = info.smem_bytes ? dynamic.get() : nullptr;
    cuemu_grid_dim = info.grid;
    cuemu_block_dim = info.block;

    uint64_t blocks_xy = (uint64_t)info.grid.x * info.grid.y;
    uint64_t n_blocks = blocks_xy * info.grid.z;
    std::vector<int> shuffled;
    bool shuffle = order == CUEMU_ORDER_RANDOM && n_blocks <= (1u << 24);
    if (shuffle) order_indices(shuffled, (int)n_blocks);
    for (uint64_t i = 0; i < n_blocks; i++) {
        uint64_t b = shuffle                           ? (uint64_t)shuffled[i]
                     : order == CUEMU_ORDER_DESCENDING ? n_blocks - 1 - i
                                                       : i;
        cuemu_block_idx.x = (unsigned)(b % info.grid.x);
        cuemu_block_idx.y = (unsigned)(b / info.grid.x % info.grid.y);
        cuemu_block_idx.z = (unsigned)(b / blocks_xy);
        run_block();
    }
    block.info = nullptr;
    CUEMU_ASAN_UNPOISON(block.static_arena.data(), block.static_arena.size());
}

void *cuemu_dynamic_shared() {
    if (!block.info) {
        fprintf(stderr, "cuemu: CT_DYN_SHARED used outside a kernel\n");
        abort();
    }
    return block.dynamic_shared;
}

uint32_t cuemu_smem_address(const void *p) {
    const unsigned char *c = static_cast<const unsigned char *>(p);
    if (!block.info || !block.dynamic_shared || c < block.dynamic_shared ||
        c >= block.dynamic_shared + block.info->smem_bytes) {
        fprintf(stderr,
                "cuemu: the shared-window address of %p: not in the running block's "
                "dynamic shared memory\n",
                p);
        abort();
    }
    return (uint32_t)(c - block.dynamic_shared);
}

void *cuemu_static_shared(const void *site, size_t bytes, size_t align, const char *name) {
    if (!block.info) {
        fprintf(stderr, "cuemu: CT_SHARED(%s) used outside a kernel\n", name);
        abort();
    }
    for (const auto &s : block.static_sites)
        if (s.first == site) return block.static_arena.data() + s.second;
    if (align < 16) align = 16;
    size_t offset = (block.static_used + align - 1) / align * align;
    if (offset + bytes > STATIC_SHARED_LIMIT)
        block_error(block.current,
                    "static shared memory %s makes %zu bytes, over the 48 KB a block may declare "
                    "statically (ptxas rejects it)",
                    name, offset + bytes);
    unsigned char *p = block.static_arena.data() + offset;
    CUEMU_ASAN_UNPOISON(p, bytes);
    poison_fill(p, bytes);
    block.static_sites.emplace_back(site, offset);
#ifdef __SANITIZE_ADDRESS__
    block.static_used = offset + bytes + ASAN_REDZONE; /* stays poisoned: overruns are reported */
#else
    (void)ASAN_REDZONE;
    block.static_used = offset + bytes;
#endif
    return p;
}

/* ---- device functions ---------------------------------------------------------------------- */
/* Returns the number of participants with a true predicate in the low 32 bits, the number of
 * participants in the high 32. */
static uint64_t block_barrier(int predicate) {
    if (!block.info) {
        fprintf(stderr, "cuemu: __syncthreads called outside a kernel\n");
        abort();
    }
    thread_slot &me = block.threads[block.current];
    me.state = THREAD_AT_BARRIER;
    me.value = predicate != 0;
    yield_to_scheduler();
    return block.threads[block.current].result;
}

void __syncthreads() {
    block_barrier(0);
}
int __syncthreads_count(int predicate) {
    return (int)(uint32_t)block_barrier(predicate);
}
int __syncthreads_and(int predicate) {
    uint64_t r = block_barrier(predicate);
    return (uint32_t)r == (uint32_t)(r >> 32);
}
int __syncthreads_or(int predicate) {
    return (uint32_t)block_barrier(predicate) != 0;
}

void __syncwarp(unsigned mask) {
    warp_op(OP_SYNCWARP, mask, 0, 0, 32);
}
unsigned __ballot_sync(unsigned mask, int predicate) {
    return (unsigned)warp_op(OP_BALLOT, mask, predicate != 0, 0, 32);
}
int __any_sync(unsigned mask, int predicate) {
    return (int)warp_op(OP_ANY, mask, predicate != 0, 0, 32);
}
int __all_sync(unsigned mask, int predicate) {
    return (int)warp_op(OP_ALL, mask, predicate != 0, 0, 32);
}
unsigned __activemask() {
    /* The lanes not exited: the emulator has no divergence to report, and this is the largest
     * mask a following warp operation may name. */
    return ~block.warps[block.current / 32].gone;
}

void cuemu_warp_collective(const char *name, cuemu_collective_fn fn, void *lane_args) {
    if (!block.info) {
        fprintf(stderr, "cuemu: %s called outside a kernel\n", name);
        abort();
    }
    thread_slot &me = block.threads[block.current];
    me.collective = fn;
    me.collective_name = name;
    warp_op(OP_COLLECTIVE, 0xffffffffu, (uint64_t)(uintptr_t)lane_args, 0, 32);
}

bool cuemu_is_shared_pointer(const void *p, size_t bytes) {
    const unsigned char *c = static_cast<const unsigned char *>(p);
    if (block.dynamic_shared && c >= block.dynamic_shared &&
        c + bytes <= block.dynamic_shared + block.info->smem_bytes)
        return true;
    const unsigned char *arena = block.static_arena.data();
    return c >= arena && c + bytes <= arena + block.static_used;
}

uint64_t cuemu_shuffle(cuemu_warp_op op, unsigned mask, uint64_t bits, int arg, int width) {
    if (width < 1 || width > 32 || (width & (width - 1)))
        block_error(block.current, "%s width %d is not a power of two from 1 to 32",
                    warp_op_names[op], width);
    return warp_op((warp_op_kind)op, mask, bits, arg, width);
}

/* One OS thread runs every fiber, so there is nothing to order. */
void __threadfence() {}
void __threadfence_block() {}
void __threadfence_system() {}
