/*
 * cuemu_selftest.cc — the CUDA emulator's own tests (cuda/emu/), compiled by g++ against the
 * emulator exactly as a .cu kernel file is; test/cli/cli_cuda_emu.sh runs one case per process:
 *
 *     cuemu_selftest CASE
 *
 * Correct kernels (reduce, softmax, atomics, shuffles, streams, memory, devices, launch-checks,
 * bf16, mma, cp-async, wgmma) are compared with plain loops and exit 0, printing "ok ..." lines;
 * so are stream capture and graphs (graphs: what runs when, in what order; capture-refusals: each
 * call a capture forbids is refused and invalidates it).
 * Each deliberately buggy kernel shows how the emulator reports its bug: an abort naming block and
 * thread (bad-mask, partial-barrier, deadlock, mismatch, big-static-smem, ldmatrix-misaligned,
 * cp-async-global, the wgmma-* hazards; capture-nccl, polled work captured; exit 3 when the kernel
 * runs through), a wrong result in
 * some warp order (missing-sync, cp-async-no-wait and cp-async-no-barrier exit 1 when the result is
 * wrong in the order CUEMU_ORDER sets), NaN from shared memory read before it is written
 * (uninit-shared), stale data after a missing stream sync (missing-stream-sync), and an
 * AddressSanitizer report from the ASan build (oob-shared, oob-global). `speed` prints emulated
 * threads per second.
 */
#include "cuda/ct_cuda.h"
#include "cuda/ct_async.cuh"
#include "cuda/ct_mma.cuh"
#include "cuda/ct_wgmma.cuh"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

static int failures;

static void check(bool good, const char *what) {
    printf("%s %s\n", good ? "ok" : "FAIL", what);
    if (!good) failures++;
}

static const cuemu_order all_orders[] = {CUEMU_ORDER_ASCENDING, CUEMU_ORDER_DESCENDING,
                                         CUEMU_ORDER_RANDOM};
static const char *const order_names[] = {"ascending", "descending", "random:7"};

template <typename T> static T *device_alloc(size_t n) {
    T *p = nullptr;
    CT_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
    return p;
}

static std::vector<float> random_floats(size_t n, unsigned seed) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        v[i] = (float)(seed >> 8) / (float)(1u << 24) * 2.0f - 1.0f;
    }
    return v;
}

static float max_abs_diff(const std::vector<float> &a, const std::vector<double> &b) {
    float worst = 0;
    for (size_t i = 0; i < a.size(); i++) {
        float d = std::fabs(a[i] - (float)b[i]);
        if (!(d <= worst)) worst = d; /* NaN counts as worst */
    }
    return worst;
}

/* ---- block reduction: warp shuffles, a CT_SHARED array, a second reduction in warp 0 only ---- */
__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

/* The sum over the block, returned to every thread. SKIP_FIRST_SYNC plants the classic bug:
 * warp 0 reads the partial sums before the other warps have written them. */
template <int BLOCK, bool SKIP_FIRST_SYNC> __device__ float block_sum(float v) {
    CT_SHARED(float, partial, 32);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    v = warp_sum(v);
    if (lane == 0) partial[warp] = v;
    if (!SKIP_FIRST_SYNC) __syncthreads();
    if (warp == 0) {
        float p = lane < BLOCK / 32 ? partial[lane] : 0.0f;
        p = warp_sum(p);
        if (lane == 0) partial[0] = p;
    }
    __syncthreads();
    float total = partial[0];
    __syncthreads(); /* partial is reused by the next call */
    return total;
}

template <int BLOCK, bool SKIP_FIRST_SYNC>
__global__ void __launch_bounds__(BLOCK)
    row_sum_kernel(float *__restrict__ out, const float *__restrict__ in, int C) {
    const float *row = in + (size_t)blockIdx.x * C;
    float v = 0;
    for (int i = threadIdx.x; i < C; i += BLOCK) v += row[i];
    float total = block_sum<BLOCK, SKIP_FIRST_SYNC>(v);
    if (threadIdx.x == 0) out[blockIdx.x] = total;
}

/* Sums rows with the (possibly buggy) kernel; returns max |error| against a double loop. */
template <bool SKIP_FIRST_SYNC> static float run_row_sum(int N, int C) {
    std::vector<float> h = random_floats((size_t)N * C, 42);
    float *in = device_alloc<float>(h.size()), *out = device_alloc<float>(N);
    CT_CUDA_CHECK(cudaMemcpy(in, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    ct_launch(row_sum_kernel<256, SKIP_FIRST_SYNC>, dim3(N), dim3(256), 0, 0, out, in, C);
    CT_CUDA_CHECK(cudaGetLastError());
    std::vector<float> got(N);
    CT_CUDA_CHECK(cudaMemcpy(got.data(), out, N * 4, cudaMemcpyDeviceToHost));
    std::vector<double> want(N, 0.0);
    for (int r = 0; r < N; r++)
        for (int i = 0; i < C; i++) want[r] += h[(size_t)r * C + i];
    CT_CUDA_CHECK(cudaFree(in));
    CT_CUDA_CHECK(cudaFree(out));
    return max_abs_diff(got, want);
}

static void case_reduce() {
    for (int o = 0; o < 3; o++) {
        cuemu_set_order(all_orders[o], 7);
        float err = run_row_sum<false>(16, 1000);
        char what[160];
        /* 1000 terms of |x| < 1 in float: 1e-4 is ~10x the rounding error of the sum */
        snprintf(what, sizeof what, "block reduction (%s order) matches a double loop: %.2g",
                 order_names[o], err);
        check(err < 1e-4f, what);
    }
}

/* missing-sync: run in the order CUEMU_ORDER sets; exits 1 with "wrong result" when the planted
 * bug shows in that order. */
static void case_missing_sync() {
    const char *order = getenv("CUEMU_ORDER");
    float err = run_row_sum<true>(16, 1000);
    printf("missing __syncthreads, CUEMU_ORDER=%s: max error %g: %s\n", order ? order : "", err,
           err < 1e-4f ? "result right (bug hidden)" : "wrong result");
    if (!(err < 1e-4f)) failures++;
}

/* ---- softmax: one row per block staged in dynamic shared memory ---------------------------- */
template <int BLOCK> __device__ float block_max(float v) {
    CT_SHARED(float, partial, 32);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int offset = 16; offset > 0; offset /= 2)
        v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, offset));
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    float m = partial[0];
    for (int w = 1; w < BLOCK / 32; w++) m = fmaxf(m, partial[w]);
    __syncthreads();
    return m;
}

template <int BLOCK> __global__ void softmax_kernel(float *out, const float *in, int C) {
    CT_DYN_SHARED(float, row);
    const float *x = in + (size_t)blockIdx.x * C;
    for (int i = threadIdx.x; i < C; i += BLOCK) row[i] = x[i];
    __syncthreads();
    float m = -INFINITY;
    for (int i = threadIdx.x; i < C; i += BLOCK) m = fmaxf(m, row[i]);
    m = block_max<BLOCK>(m);
    float s = 0;
    for (int i = threadIdx.x; i < C; i += BLOCK) {
        row[i] = __expf(row[i] - m);
        s += row[i];
    }
    s = block_sum<BLOCK, false>(s);
    for (int i = threadIdx.x; i < C; i += BLOCK) out[(size_t)blockIdx.x * C + i] = row[i] / s;
}

static void case_softmax() {
    const int N = 8, C = 700;
    std::vector<float> h = random_floats((size_t)N * C, 3);
    for (float &v : h) v *= 8;
    float *in = device_alloc<float>(h.size()), *out = device_alloc<float>(h.size());
    CT_CUDA_CHECK(cudaMemcpy(in, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    std::vector<double> want(h.size());
    for (int r = 0; r < N; r++) {
        double m = -INFINITY, s = 0;
        for (int i = 0; i < C; i++) m = std::fmax(m, h[(size_t)r * C + i]);
        for (int i = 0; i < C; i++) s += std::exp(h[(size_t)r * C + i] - m);
        for (int i = 0; i < C; i++)
            want[(size_t)r * C + i] = std::exp(h[(size_t)r * C + i] - m) / s;
    }
    for (int o = 0; o < 3; o++) {
        cuemu_set_order(all_orders[o], 11);
        ct_launch(softmax_kernel<128>, dim3(N), dim3(128), C * sizeof(float), 0, out, in, C);
        CT_CUDA_CHECK(cudaGetLastError());
        std::vector<float> got(h.size());
        CT_CUDA_CHECK(cudaMemcpy(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost));
        float err = max_abs_diff(got, want);
        char what[160];
        snprintf(what, sizeof what, "softmax in dynamic shared memory (%s order): %.2g",
                 order_names[o], err);
        check(err < 1e-6f, what); /* probabilities <= 1, float rounding ~1e-7 */
    }
    CT_CUDA_CHECK(cudaFree(in));
    CT_CUDA_CHECK(cudaFree(out));
}

/* ---- atomics ------------------------------------------------------------------------------- */
struct atomic_results {
    int count;
    unsigned umax;
    int imin;
    unsigned long long total;
    double dsum;
    int cas_count;
    unsigned exch;
};

__global__ void atomics_kernel(float *colsum, atomic_results *r, const float *in, int rows,
                               int cols) {
    int row = blockIdx.x, col = threadIdx.x;
    if (row < rows && col < cols) atomicAdd(&colsum[col], in[row * cols + col]);
    int id = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(&r->count, 1);
    atomicMax(&r->umax, (unsigned)id * 7u % 1000u);
    atomicMin(&r->imin, 500 - id);
    atomicAdd(&r->total, (unsigned long long)id);
    atomicAdd(&r->dsum, 0.5);
    /* a CAS loop, the way a custom atomic is built */
    int old = r->cas_count, assumed;
    do {
        assumed = old;
        old = atomicCAS(&r->cas_count, assumed, assumed + 2);
    } while (old != assumed);
    atomicExch(&r->exch, 77u);
}

static void case_atomics() {
    const int rows = 8, cols = 6, threads = 32;
    std::vector<float> h = random_floats(rows * cols, 5);
    float *in = device_alloc<float>(h.size()), *colsum = device_alloc<float>(cols);
    atomic_results *r = device_alloc<atomic_results>(1);
    atomic_results init = {0, 0, 1 << 30, 0, 0.0, 0, 0};
    CT_CUDA_CHECK(cudaMemcpy(in, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    CT_CUDA_CHECK(cudaMemset(colsum, 0, cols * 4));
    CT_CUDA_CHECK(cudaMemcpy(r, &init, sizeof init, cudaMemcpyHostToDevice));
    ct_launch(atomics_kernel, dim3(rows), dim3(threads), 0, 0, colsum, r, in, rows, cols);
    CT_CUDA_CHECK(cudaGetLastError());
    std::vector<float> got(cols);
    atomic_results res;
    CT_CUDA_CHECK(cudaMemcpy(got.data(), colsum, cols * 4, cudaMemcpyDeviceToHost));
    CT_CUDA_CHECK(cudaMemcpy(&res, r, sizeof res, cudaMemcpyDeviceToHost));
    std::vector<double> want(cols, 0.0);
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) want[j] += h[i * cols + j];
    int n = rows * threads;
    unsigned umax = 0;
    for (int id = 0; id < n; id++) umax = std::max(umax, (unsigned)id * 7u % 1000u);
    check(max_abs_diff(got, want) < 1e-5f, "float atomicAdd column sums match a double loop");
    check(res.count == n, "int atomicAdd counts every thread");
    check(res.umax == umax, "unsigned atomicMax");
    check(res.imin == 500 - (n - 1), "int atomicMin");
    check(res.total == (unsigned long long)n * (n - 1) / 2, "unsigned long long atomicAdd");
    check(res.dsum == 0.5 * n, "double atomicAdd");
    check(res.cas_count == 2 * n, "atomicCAS loop");
    check(res.exch == 77u, "atomicExch");
    CT_CUDA_CHECK(cudaFree(in));
    CT_CUDA_CHECK(cudaFree(colsum));
    CT_CUDA_CHECK(cudaFree(r));
}

/* ---- shuffles and votes against CUDA's documented rules ------------------------------------ */
__global__ void shuffles_kernel(int *out, int width) {
    int lane = threadIdx.x % 32, v = 100 + lane;
    int *o = out + threadIdx.x * 8;
    o[0] = __shfl_sync(0xffffffffu, v, lane + 3, width);
    o[1] = __shfl_up_sync(0xffffffffu, v, 3, width);
    o[2] = __shfl_down_sync(0xffffffffu, v, 3, width);
    o[3] = __shfl_xor_sync(0xffffffffu, v, 9, width);
    o[4] = (int)__ballot_sync(0xffffffffu, lane % 3 == 0);
    o[5] = __any_sync(0xffffffffu, lane == 17);
    o[6] = __all_sync(0xffffffffu, lane < 31);
    if (lane < 16) /* a half-warp mask: only these lanes take part */
        o[7] = __shfl_down_sync(0x0000ffffu, v, 1, 16);
    else
        o[7] = -1;
}

static void case_shuffles() {
    int *out = device_alloc<int>(64 * 8);
    for (int width : {32, 16, 8}) {
        ct_launch(shuffles_kernel, dim3(1), dim3(64), 0, 0, out, width);
        std::vector<int> got(64 * 8);
        CT_CUDA_CHECK(cudaMemcpy(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost));
        bool good = true;
        unsigned ballot = 0;
        for (int l = 0; l < 32; l++)
            if (l % 3 == 0) ballot |= 1u << l;
        for (int t = 0; t < 64; t++) {
            int lane = t % 32, seg = lane / width * width, in_seg = lane % width;
            int want[8];
            want[0] = 100 + seg + (lane + 3) % width; /* srcLane taken modulo width */
            want[1] = in_seg < 3 ? 100 + lane : 100 + lane - 3;
            want[2] = in_seg + 3 >= width ? 100 + lane : 100 + lane + 3;
            int x = lane ^ 9; /* at width 8: earlier segments in reach, later ones not */
            want[3] = x >= seg + width ? 100 + lane : 100 + x;
            want[4] = (int)ballot;
            want[5] = 1;
            want[6] = 0;
            want[7] = lane < 16 ? (lane + 1 >= 16 ? 100 + lane : 101 + lane) : -1;
            for (int k = 0; k < 8; k++) good = good && got[t * 8 + k] == want[k];
        }
        char what[80];
        snprintf(what, sizeof what, "shuffles and votes at width %d follow CUDA's rules", width);
        check(good, what);
    }
    CT_CUDA_CHECK(cudaFree(out));
}

/* ---- bugs the emulator aborts on ----------------------------------------------------------- */
__global__ void bad_mask_kernel(float *out) {
    float v = (float)threadIdx.x;
    if (threadIdx.x % 32 >= 16) return;      /* half the warp leaves ... */
    v += __shfl_xor_sync(0xffffffffu, v, 1); /* ... but the mask still names it */
    out[threadIdx.x] = v;
}

__global__ void partial_barrier_kernel(float *out) {
    if (threadIdx.x >= 32) return;
    __syncthreads(); /* the other 96 threads have exited */
    out[threadIdx.x] = 1;
}

__global__ void deadlock_kernel(float *out) {
    float v = 1;
    if (threadIdx.x == 5)
        __syncthreads(); /* lane 5 waits at the block barrier ... */
    else
        v = __shfl_sync(0xffffffffu, v, 0); /* ... the rest of its warp waits for it here */
    out[threadIdx.x] = v;
}

__global__ void mismatch_kernel(float *out) {
    float v = 1;
    if (threadIdx.x == 0)
        v = __shfl_down_sync(0xffffffffu, v, 1);
    else
        v = __shfl_xor_sync(0xffffffffu, v, 1);
    out[threadIdx.x] = v;
}

__global__ void big_static_smem_kernel(float *out) {
    CT_SHARED(float, a, 8192); /* 32 KB */
    CT_SHARED(float, b, 8192); /* 32 KB more: over the 48 KB ptxas allows */
    a[threadIdx.x] = 1;
    b[threadIdx.x] = 2;
    out[threadIdx.x] = a[threadIdx.x] + b[threadIdx.x];
}

/* Runs a buggy kernel the emulator should abort on (exit 134); exit 3 when it runs through. */
static void run_and_sync(void (*launch)(float *)) {
    float *out = device_alloc<float>(1024);
    launch(out);
    CT_CUDA_CHECK(cudaGetLastError());
    CT_CUDA_CHECK(cudaDeviceSynchronize());
    printf("the kernel ran to completion: nothing was reported\n");
    exit(3);
}

/* ---- shared memory read before it is written ----------------------------------------------- */
__global__ void uninit_shared_kernel(float *out) {
    CT_SHARED(float, tile, 64);
    /* thread t reads tile[t] ... which nobody writes in this block before the read */
    out[blockIdx.x * 64 + threadIdx.x] = tile[threadIdx.x];
    __syncthreads();
    tile[threadIdx.x] = 1.0f; /* the previous block's values must not leak into the next */
}

static void case_uninit_shared() {
    float *out = device_alloc<float>(4 * 64);
    ct_launch(uninit_shared_kernel, dim3(4), dim3(64), 0, 0, out);
    std::vector<float> got(4 * 64);
    CT_CUDA_CHECK(cudaMemcpy(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost));
    int nans = 0;
    for (float v : got) nans += std::isnan(v);
    char what[120];
    snprintf(what, sizeof what, "a read of CT_SHARED before any write gives NaN (%d of %zu)", nans,
             got.size());
    check(nans == (int)got.size(), what);
    CT_CUDA_CHECK(cudaFree(out));
}

/* ---- out-of-bounds writes (the ASan build reports them) ------------------------------------ */
__global__ void oob_shared_kernel(float *out) {
    CT_SHARED(float, tile, 32);
    tile[threadIdx.x] = 1.0f; /* 64 threads, 32 elements */
    __syncthreads();
    out[threadIdx.x] = tile[threadIdx.x % 32];
}

__global__ void oob_global_kernel(float *out, int n) {
    out[threadIdx.x] = (float)n; /* 64 threads, n = 60 elements */
}

/* ---- streams and events -------------------------------------------------------------------- */
__global__ void fill_kernel(float *out, float value, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = value;
}

__global__ void add_one_kernel(float *out, const float *in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] + 1;
}

static void case_missing_stream_sync() {
    const int n = 256;
    cudaStream_t s;
    CT_CUDA_CHECK(cudaStreamCreate(&s));
    float *d = device_alloc<float>(n);
    std::vector<float> h(n, -1.0f);
    ct_launch(fill_kernel, dim3(1), dim3(n), 0, s, d, 3.0f, n);
    CT_CUDA_CHECK(cudaMemcpyAsync(h.data(), d, n * 4, cudaMemcpyDeviceToHost, s));
    /* the bug: the host reads h without cudaStreamSynchronize(s) */
    check(h[0] == -1.0f && h[n - 1] == -1.0f, "without the stream sync the host sees stale data");
    CT_CUDA_CHECK(cudaStreamSynchronize(s));
    check(h[0] == 3.0f && h[n - 1] == 3.0f, "after cudaStreamSynchronize the host sees the result");
    CT_CUDA_CHECK(cudaFree(d));
    CT_CUDA_CHECK(cudaStreamDestroy(s));
}

static void case_streams() {
    const int n = 300;
    cudaStream_t s1, s2;
    cudaEvent_t e, t0, t1;
    CT_CUDA_CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CT_CUDA_CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    CT_CUDA_CHECK(cudaEventCreate(&e));
    CT_CUDA_CHECK(cudaEventCreate(&t0));
    CT_CUDA_CHECK(cudaEventCreate(&t1));
    float *a = device_alloc<float>(n), *b = device_alloc<float>(n);
    std::vector<float> h(n);

    /* s2 consumes what s1 produces, ordered by an event: syncing s2 alone must run s1 first */
    CT_CUDA_CHECK(cudaEventRecord(t0, s2));
    ct_launch(fill_kernel, dim3(2), dim3(256), 0, s1, a, 5.0f, n);
    CT_CUDA_CHECK(cudaEventRecord(e, s1));
    CT_CUDA_CHECK(cudaStreamWaitEvent(s2, e, 0));
    ct_launch(add_one_kernel, dim3(2), dim3(256), 0, s2, b, (const float *)a, n);
    CT_CUDA_CHECK(cudaMemcpyAsync(h.data(), b, n * 4, cudaMemcpyDeviceToHost, s2));
    CT_CUDA_CHECK(cudaEventRecord(t1, s2));
    check(cudaEventQuery(t1) == cudaErrorNotReady, "cudaEventQuery reports pending work once");
    CT_CUDA_CHECK(cudaStreamSynchronize(s2));
    check(h[0] == 6.0f && h[n - 1] == 6.0f, "cudaStreamWaitEvent orders s2 after s1");
    check(cudaEventQuery(t1) == cudaSuccess, "cudaEventQuery succeeds after the sync");
    float ms = -1;
    CT_CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    check(ms >= 0, "cudaEventElapsedTime between two completed events");

    /* without the event, s2 runs on its own and reads a's poison */
    ct_launch(fill_kernel, dim3(2), dim3(256), 0, s1, b, 7.0f, n);
    CT_CUDA_CHECK(cudaFree(a)); /* synchronizes everything, like the real one */
    a = device_alloc<float>(n);
    ct_launch(fill_kernel, dim3(2), dim3(256), 0, s1, a, 5.0f, n);
    ct_launch(add_one_kernel, dim3(2), dim3(256), 0, s2, b, (const float *)a, n);
    CT_CUDA_CHECK(cudaMemcpyAsync(h.data(), b, n * 4, cudaMemcpyDeviceToHost, s2));
    CT_CUDA_CHECK(cudaStreamSynchronize(s2));
    check(std::isnan(h[0]), "without cudaStreamWaitEvent s2 reads poison, not s1's result");

    /* the legacy default stream waits for blocking streams and they wait for it */
    cudaStream_t blocking;
    CT_CUDA_CHECK(cudaStreamCreate(&blocking));
    ct_launch(fill_kernel, dim3(2), dim3(256), 0, blocking, a, 9.0f, n);
    ct_launch(add_one_kernel, dim3(2), dim3(256), 0, 0, b, (const float *)a, n);
    CT_CUDA_CHECK(cudaMemcpyAsync(h.data(), b, n * 4, cudaMemcpyDeviceToHost, 0));
    CT_CUDA_CHECK(cudaStreamSynchronize(0));
    check(h[0] == 10.0f, "stream 0 waits for work queued on a blocking stream");

    /* host work queued by a library stand-in runs in stream order */
    float seen = 0;
    ct_launch(fill_kernel, dim3(2), dim3(256), 0, s1, a, 4.0f, n);
    cuemu_stream_enqueue(s1, [&seen, a]() { seen = a[n - 1]; });
    check(seen == 0, "cuemu_stream_enqueue work waits for a sync point");
    CT_CUDA_CHECK(cudaStreamSynchronize(s1));
    check(seen == 4.0f, "cuemu_stream_enqueue work runs after the kernel before it");

    /* work that calls the runtime itself (a library stand-in copying or launching) stays in
     * stream order: what it queues runs inside it, before the work queued after it */
    ct_launch(fill_kernel, dim3(2), dim3(256), 0, s1, a, 1.0f, n);
    cuemu_stream_enqueue(s1, [&seen, a, s1]() {
        CT_CUDA_CHECK(cudaMemcpy(&seen, a, 4, cudaMemcpyDeviceToHost));
        ct_launch(fill_kernel, dim3(2), dim3(256), 0, s1, a, 2.0f, 300);
    });
    ct_launch(add_one_kernel, dim3(2), dim3(256), 0, s1, b, (const float *)a, n);
    CT_CUDA_CHECK(cudaMemcpyAsync(h.data(), b, n * 4, cudaMemcpyDeviceToHost, s1));
    CT_CUDA_CHECK(cudaStreamSynchronize(s1));
    check(seen == 1.0f && h[n - 1] == 3.0f, "runtime calls inside queued work keep stream order");

    CT_CUDA_CHECK(cudaFree(a));
    CT_CUDA_CHECK(cudaFree(b));
    CT_CUDA_CHECK(cudaEventDestroy(e));
    CT_CUDA_CHECK(cudaEventDestroy(t0));
    CT_CUDA_CHECK(cudaEventDestroy(t1));
    CT_CUDA_CHECK(cudaStreamDestroy(s1));
    CT_CUDA_CHECK(cudaStreamDestroy(s2));
    CT_CUDA_CHECK(cudaStreamDestroy(blocking));
}

/* ---- stream capture and graphs ------------------------------------------------------------ */
__global__ void accumulate_kernel(float *y, const float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}

static bool all_equal(const float *p, int n, float want) {
    for (int i = 0; i < n; i++)
        if (!(p[i] == want)) return false;
    return true;
}

static bool eager_streams() {
    const char *eager = getenv("CUEMU_EAGER");
    return eager && eager[0] == '1';
}

static void count_calls(void *counter) {
    (*static_cast<int *>(counter))++;
}

/* graphs: captured work does not run at capture time, each launch of the executable graph runs
 * every item again in capture order on the memory as it is then, the executable graph outlives
 * its graph, cudaGraphGetNodes counts the items, and the capture calls' own rules. Device memory
 * is host memory here, so the checks read it directly after a sync. */
static void case_graphs() { /* also run with CUEMU_EAGER=1 */
    const int n = 300;
    cudaStream_t s, blocking, gone;
    CT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CT_CUDA_CHECK(cudaStreamCreate(&blocking));
    float *x = device_alloc<float>(n), *y = device_alloc<float>(n), *z = device_alloc<float>(n);
    std::vector<float> ones(n, 1.0f);
    CT_CUDA_CHECK(cudaMemcpy(x, ones.data(), n * 4, cudaMemcpyHostToDevice));
    CT_CUDA_CHECK(cudaMemset(y, 0, n * 4));

    /* (a) a kernel y += x captured, then launched twice, then once more after x changed */
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusInvalidated;
    CT_CUDA_CHECK(cudaStreamIsCapturing(s, &st));
    check(st == cudaStreamCaptureStatusNone, "cudaStreamIsCapturing: None before a capture");
    CT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CT_CUDA_CHECK(cudaStreamIsCapturing(s, &st));
    check(st == cudaStreamCaptureStatusActive, "cudaStreamIsCapturing: Active during a capture");
    ct_launch(accumulate_kernel, dim3(2), dim3(256), 0, s, y, (const float *)x, n);
    CT_CUDA_CHECK(cudaGetLastError());
    check(all_equal(y, n, 0.0f), "a captured kernel does not run when queued (CUEMU_EAGER too)");
    /* s does not block: the legacy stream stays usable, and its work is not captured */
    check(cudaMemsetAsync(z, 0, n * 4, 0) == cudaSuccess,
          "legacy-stream work while a non-blocking stream captures is accepted");
    cudaGraph_t g = nullptr;
    CT_CUDA_CHECK(cudaStreamEndCapture(s, &g));
    check(g != nullptr, "cudaStreamEndCapture returns a graph");
    CT_CUDA_CHECK(cudaStreamIsCapturing(s, &st));
    check(st == cudaStreamCaptureStatusNone, "cudaStreamIsCapturing: None after the capture");
    CT_CUDA_CHECK(cudaStreamSynchronize(s));
    CT_CUDA_CHECK(cudaDeviceSynchronize());
    check(all_equal(y, n, 0.0f), "a captured kernel does not run at capture time");
    check(all_equal(z, n, 0.0f), "legacy-stream work queued during the capture ran as usual");
    size_t count = 99;
    CT_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &count));
    check(count == 1, "cudaGraphGetNodes counts one captured kernel");
    cudaGraphExec_t exec = nullptr;
    CT_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    CT_CUDA_CHECK(cudaGraphDestroy(g)); /* (e) the executable graph outlives it */
    CT_CUDA_CHECK(cudaGraphLaunch(exec, s));
    CT_CUDA_CHECK(cudaGraphLaunch(exec, s));
    if (!eager_streams())
        check(all_equal(y, n, 0.0f), "a graph launch is lazy stream work, run at a sync point");
    CT_CUDA_CHECK(cudaStreamSynchronize(s));
    check(all_equal(y, n, 2.0f), "two launches of a captured y += x give y = 2x");
    std::vector<float> fives(n, 5.0f);
    CT_CUDA_CHECK(cudaMemcpy(x, fives.data(), n * 4, cudaMemcpyHostToDevice));
    CT_CUDA_CHECK(cudaGraphLaunch(exec, s));
    CT_CUDA_CHECK(cudaStreamSynchronize(s));
    check(all_equal(y, n, 7.0f), "a launch reads the inputs as they are when it runs (x changed)");
    CT_CUDA_CHECK(cudaGraphExecDestroy(exec));

    /* (b) several items, each depending on the one before, run in capture order */
    float *a = device_alloc<float>(n), *b = device_alloc<float>(n), *c = device_alloc<float>(n);
    int host_calls = 0;
    CT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CT_CUDA_CHECK(cudaMemsetAsync(a, 0, n * 4, s));                                 /* a = 0 */
    ct_launch(accumulate_kernel, dim3(2), dim3(256), 0, s, a, (const float *)x, n); /* a = x */
    ct_launch(add_one_kernel, dim3(2), dim3(256), 0, s, b, (const float *)a, n);    /* b = x + 1 */
    CT_CUDA_CHECK(cudaMemcpyAsync(c, b, n * 4, cudaMemcpyDeviceToDevice, s));       /* c = b */
    CT_CUDA_CHECK(cudaLaunchHostFunc(s, count_calls, &host_calls));
    ct_launch(accumulate_kernel, dim3(2), dim3(256), 0, s, c, (const float *)c, n); /* c = 2c */
    CT_CUDA_CHECK(cudaGetLastError());
    CT_CUDA_CHECK(cudaStreamEndCapture(s, &g));
    CT_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &count));
    check(count == 6, "cudaGraphGetNodes counts six captured items (memset, kernels, copy, host)");
    cudaGraphNode_t nodes[8];
    for (cudaGraphNode_t &node : nodes) node = reinterpret_cast<cudaGraphNode_t>(&count);
    count = 8;
    CT_CUDA_CHECK(cudaGraphGetNodes(g, nodes, &count));
    bool distinct = count == 6 && nodes[6] == nullptr && nodes[7] == nullptr;
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < i; j++) distinct = distinct && nodes[i] && nodes[i] != nodes[j];
    check(distinct, "cudaGraphGetNodes fills six distinct handles and NULLs the rest");
    count = 2;
    CT_CUDA_CHECK(cudaGraphGetNodes(g, nodes, &count));
    check(count == 2, "cudaGraphGetNodes fills no more handles than asked for");
    CT_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    CT_CUDA_CHECK(cudaStreamSynchronize(s));
    check(host_calls == 0 && std::isnan(a[0]) && std::isnan(c[n - 1]),
          "nothing captured ran at capture time (memory still poison, no host call)");
    CT_CUDA_CHECK(cudaGraphLaunch(exec, s));
    CT_CUDA_CHECK(cudaStreamSynchronize(s));
    check(host_calls == 1 && all_equal(a, n, 5.0f) && all_equal(b, n, 6.0f) &&
              all_equal(c, n, 12.0f),
          "six captured items run in capture order (a = 0, a += x, b = a + 1, c = b, c += c)");
    CT_CUDA_CHECK(cudaMemcpy(x, ones.data(), n * 4, cudaMemcpyHostToDevice));
    CT_CUDA_CHECK(cudaGraphLaunch(exec, blocking)); /* any stream, the legacy one included */
    CT_CUDA_CHECK(cudaGraphLaunch(exec, 0));
    CT_CUDA_CHECK(cudaStreamSynchronize(0));
    check(host_calls == 3 && all_equal(a, n, 1.0f) && all_equal(c, n, 4.0f),
          "the same graph again, on a blocking stream and the legacy stream, with a new x");
    CT_CUDA_CHECK(cudaGraphExecDestroy(exec));
    CT_CUDA_CHECK(cudaGraphDestroy(g));

    /* (d) where a capture cannot begin or end */
    check(cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal) ==
                  cudaErrorStreamCaptureUnsupported &&
              cudaStreamBeginCapture(cudaStreamLegacy, cudaStreamCaptureModeGlobal) ==
                  cudaErrorStreamCaptureUnsupported &&
              cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeRelaxed) ==
                  cudaErrorStreamCaptureUnsupported,
          "cudaStreamBeginCapture on the legacy stream: cudaErrorStreamCaptureUnsupported");
    check(cudaGetLastError() == cudaErrorStreamCaptureUnsupported,
          "... recorded for cudaGetLastError");
    check(cudaStreamEndCapture(s, &g) == cudaErrorIllegalState,
          "cudaStreamEndCapture without a capture: cudaErrorIllegalState");
    CT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    check(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaErrorIllegalState,
          "cudaStreamBeginCapture on a capturing stream: cudaErrorIllegalState");
    cudaGetLastError();
    CT_CUDA_CHECK(cudaStreamIsCapturing(s, &st));
    check(st == cudaStreamCaptureStatusActive, "... and the capture goes on");
    CT_CUDA_CHECK(cudaStreamEndCapture(s, &g));
    CT_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &count));
    check(count == 0, "an empty capture gives a graph of no nodes");
    CT_CUDA_CHECK(cudaGraphDestroy(g));
    check(cudaGraphDestroy(nullptr) == cudaErrorInvalidValue &&
              cudaGraphExecDestroy(nullptr) == cudaErrorInvalidValue &&
              cudaGraphLaunch(nullptr, s) == cudaErrorInvalidValue &&
              cudaGraphGetNodes(nullptr, nullptr, &count) == cudaErrorInvalidValue,
          "null graph handles: cudaErrorInvalidValue");
    cudaGetLastError();
    CT_CUDA_CHECK(cudaStreamCreate(&gone));
    CT_CUDA_CHECK(cudaStreamDestroy(gone));
    check(cudaStreamBeginCapture(gone, cudaStreamCaptureModeGlobal) ==
              cudaErrorInvalidResourceHandle,
          "cudaStreamBeginCapture on a destroyed stream: cudaErrorInvalidResourceHandle");
    cudaGetLastError();
    check(!strcmp(cudaGetErrorName(cudaErrorStreamCaptureImplicit),
                  "cudaErrorStreamCaptureImplicit") &&
              !strcmp(cudaGetErrorString(cudaErrorStreamCaptureUnsupported),
                      "operation not permitted when stream is capturing") &&
              !strcmp(cudaGetErrorString(cudaErrorStreamCaptureInvalidated),
                      "operation failed due to a previous error during capture"),
          "the capture errors' names and texts");

    for (float *p : {x, y, z, a, b, c}) CT_CUDA_CHECK(cudaFree(p));
    CT_CUDA_CHECK(cudaStreamDestroy(s));
    CT_CUDA_CHECK(cudaStreamDestroy(blocking));
}

/* capture-refusals: (c) each call a capture forbids, made during a capture, fails with the
 * error the real runtime gives, does nothing, and invalidates the capture: cudaStreamIsCapturing
 * says Invalidated, further work on the stream fails with cudaErrorStreamCaptureInvalidated,
 * cudaStreamEndCapture returns that error and a null graph (printing why on stderr), and the
 * stream works as before afterwards. */
static void case_capture_refusals() {
    const int n = 64;
    cudaStream_t other, spare;
    CT_CUDA_CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    CT_CUDA_CHECK(cudaStreamCreateWithFlags(&spare, cudaStreamNonBlocking));
    cudaEvent_t ev;
    CT_CUDA_CHECK(cudaEventCreate(&ev));
    cudaGraph_t empty; /* a capture of nothing, to launch into a capturing stream */
    cudaGraphExec_t exec;
    CT_CUDA_CHECK(cudaStreamBeginCapture(spare, cudaStreamCaptureModeGlobal));
    CT_CUDA_CHECK(cudaStreamEndCapture(spare, &empty));
    CT_CUDA_CHECK(cudaGraphInstantiate(&exec, empty, 0));
    CT_CUDA_CHECK(cudaGraphDestroy(empty));

    /* made afresh for each refusal: d and pending poisoned, host all 2 */
    float *d = nullptr, *pending = nullptr, *kept = nullptr;
    void *kept_host = nullptr, *got = nullptr;
    float host[n];
    struct refusal {
        const char *call;
        cudaError_t want;
        bool blocking; /* capture on a blocking stream */
        std::function<cudaError_t(cudaStream_t)> run;
    };
    const cudaError_t U = cudaErrorStreamCaptureUnsupported;
    std::vector<refusal> refusals = {
        {"cudaMalloc", U, false, [&](cudaStream_t) { return cudaMalloc(&got, 1024); }},
        {"cudaFree", U, false, [&](cudaStream_t) { return cudaFree(kept); }},
        {"cudaMallocHost", U, false, [&](cudaStream_t) { return cudaMallocHost(&got, 64); }},
        {"cudaHostAlloc", U, false,
         [&](cudaStream_t) { return cudaHostAlloc(&got, 64, cudaHostAllocDefault); }},
        {"cudaFreeHost", U, false, [&](cudaStream_t) { return cudaFreeHost(kept_host); }},
        {"cudaMemcpy", U, false,
         [&](cudaStream_t) { return cudaMemcpy(d, host, n * 4, cudaMemcpyHostToDevice); }},
        {"cudaMemset", U, false, [&](cudaStream_t) { return cudaMemset(d, 0, n * 4); }},
        {"cudaDeviceSynchronize", U, false, [&](cudaStream_t) { return cudaDeviceSynchronize(); }},
        {"cudaStreamSynchronize (another stream)", U, false,
         [&](cudaStream_t) { return cudaStreamSynchronize(other); }},
        {"cudaStreamSynchronize (the capturing stream)", U, false,
         [&](cudaStream_t s) { return cudaStreamSynchronize(s); }},
        {"cudaStreamQuery", U, false, [&](cudaStream_t) { return cudaStreamQuery(other); }},
        {"cudaEventSynchronize", U, false, [&](cudaStream_t) { return cudaEventSynchronize(ev); }},
        {"cudaEventQuery", U, false, [&](cudaStream_t) { return cudaEventQuery(ev); }},
        {"cudaEventRecord on the capturing stream", U, false,
         [&](cudaStream_t s) { return cudaEventRecord(ev, s); }},
        {"cudaStreamWaitEvent on the capturing stream", U, false,
         [&](cudaStream_t s) { return cudaStreamWaitEvent(s, ev, 0); }},
        {"cudaMemcpyAsync from host memory on the capturing stream", U, false,
         [&](cudaStream_t s) {
             return cudaMemcpyAsync(d, host, n * 4, cudaMemcpyHostToDevice, s);
         }},
        {"cudaMemcpyAsync to host memory on the capturing stream", U, false,
         [&](cudaStream_t s) {
             return cudaMemcpyAsync(host, d, n * 4, cudaMemcpyDeviceToHost, s);
         }},
        {"cudaGraphLaunch into the capturing stream", U, false,
         [&](cudaStream_t s) { return cudaGraphLaunch(exec, s); }},
        {"cudaStreamDestroy of the capturing stream", U, false,
         [&](cudaStream_t s) { return cudaStreamDestroy(s); }},
        {"a kernel on the legacy stream (the capturing stream is blocking)",
         cudaErrorStreamCaptureImplicit, true,
         [&](cudaStream_t) {
             ct_launch(fill_kernel, dim3(1), dim3(n), 0, 0, d, 1.0f, n);
             return cudaPeekAtLastError();
         }},
        {"cudaMemsetAsync on the legacy stream (the capturing stream is blocking)",
         cudaErrorStreamCaptureImplicit, true,
         [&](cudaStream_t) { return cudaMemsetAsync(d, 0, n * 4, 0); }},
    };
    for (const refusal &r : refusals) {
        const std::string call = std::string(" (") + r.call + ")";
        cudaStream_t s;
        CT_CUDA_CHECK(
            cudaStreamCreateWithFlags(&s, r.blocking ? cudaStreamDefault : cudaStreamNonBlocking));
        d = device_alloc<float>(n);
        pending = device_alloc<float>(n);
        kept = device_alloc<float>(16);
        CT_CUDA_CHECK(cudaMallocHost(&kept_host, 64));
        got = &got; /* not null: a refused allocation must set it to null */
        for (float &v : host) v = 2.0f;
        /* queued before the capture, lazily (CUEMU_EAGER runs it at once): a refused
         * synchronization must not run it */
        ct_launch(fill_kernel, dim3(1), dim3(n), 0, other, pending, 3.0f, n);
        CT_CUDA_CHECK(cudaEventRecord(ev, other));

        CT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        ct_launch(fill_kernel, dim3(1), dim3(n), 0, s, d, 4.0f, n); /* captured */
        CT_CUDA_CHECK(cudaGetLastError());
        cudaError_t e = r.run(s);
        check(
            e == r.want && cudaGetLastError() == r.want,
            ("during a capture, " + std::string(r.call) + " fails with " + cudaGetErrorName(r.want))
                .c_str());
        cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
        CT_CUDA_CHECK(cudaStreamIsCapturing(s, &st));
        bool invalidated = st == cudaStreamCaptureStatusInvalidated;
        bool later_refused = cudaMemsetAsync(d, 0, n * 4, s) == cudaErrorStreamCaptureInvalidated;
        cudaGetLastError();
        cudaGraph_t g = reinterpret_cast<cudaGraph_t>(&g);
        bool ended = cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated && !g &&
                     cudaGetLastError() == cudaErrorStreamCaptureInvalidated;
        CT_CUDA_CHECK(cudaStreamIsCapturing(s, &st));
        check(invalidated && later_refused && ended && st == cudaStreamCaptureStatusNone,
              ("... Invalidated; later work refused; cudaStreamEndCapture gives "
               "cudaErrorStreamCaptureInvalidated and no graph; capture over" +
               call)
                  .c_str());

        /* the refused call did nothing: no memory given or taken, nothing copied, set or run */
        cudaPointerAttributes attr;
        CT_CUDA_CHECK(cudaPointerGetAttributes(&attr, kept_host));
        bool nothing = std::isnan(d[0]) && std::isnan(d[n - 1]) &&
                       (eager_streams() || std::isnan(pending[0])) && host[0] == 2.0f &&
                       host[n - 1] == 2.0f && cuemu_is_device_pointer(kept, 64) &&
                       attr.type == cudaMemoryTypeHost;
        if (!strcmp(r.call, "cudaMalloc") || !strcmp(r.call, "cudaMallocHost") ||
            !strcmp(r.call, "cudaHostAlloc"))
            nothing = nothing && got == nullptr;
        check(nothing, ("... the refused call did nothing" + call).c_str());

        /* the stream and the runtime work as before */
        ct_launch(fill_kernel, dim3(1), dim3(n), 0, s, d, 6.0f, n);
        CT_CUDA_CHECK(cudaMemcpyAsync(host, d, n * 4, cudaMemcpyDeviceToHost, s));
        CT_CUDA_CHECK(cudaStreamSynchronize(s));
        CT_CUDA_CHECK(cudaEventSynchronize(ev));
        check(host[0] == 6.0f && host[n - 1] == 6.0f && pending[0] == 3.0f,
              ("... afterwards the stream runs work again" + call).c_str());
        CT_CUDA_CHECK(cudaStreamDestroy(s));
        CT_CUDA_CHECK(cudaFree(d));
        CT_CUDA_CHECK(cudaFree(pending));
        CT_CUDA_CHECK(cudaFree(kept));
        CT_CUDA_CHECK(cudaFreeHost(kept_host));
    }
    CT_CUDA_CHECK(cudaGraphExecDestroy(exec));
    CT_CUDA_CHECK(cudaEventDestroy(ev));
    CT_CUDA_CHECK(cudaStreamDestroy(other));
    CT_CUDA_CHECK(cudaStreamDestroy(spare));
}

/* capture-nccl: polled work (the NCCL stand-in's) queued on a capturing stream aborts: a graph
 * could not run it again. */
static void case_capture_nccl() {
    cudaStream_t s;
    CT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cuemu_stream_enqueue_poll(s, []() { return true; });
    printf("polled work was captured: nothing was reported\n");
    exit(3);
}

/* ---- memory, errors, devices --------------------------------------------------------------- */
static void case_memory() {
    float *p = device_alloc<float>(1000);
    uint32_t word;
    std::memcpy(&word, p + 999, 4);
    check(word == 0x7FC07FC0u, "cudaMalloc memory is poisoned with 0x7FC07FC0");
    check((uintptr_t)p % 256 == 0, "cudaMalloc is 256-byte aligned");
    check(cuemu_is_device_pointer(p + 10, 990 * 4), "cuemu_is_device_pointer inside");
    check(!cuemu_is_device_pointer(p + 10, 991 * 4), "cuemu_is_device_pointer past the end");
    float host[4];
    check(!cuemu_is_device_pointer(host, 4), "cuemu_is_device_pointer on a host array");
    check(cudaMemcpy(host, p, 4 * 1001, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue,
          "cudaMemcpy past the end of an allocation is refused");
    check(cudaGetLastError() == cudaErrorInvalidValue && cudaGetLastError() == cudaSuccess,
          "cudaGetLastError returns the error once");
    check(cudaFree(host) == cudaErrorInvalidValue, "cudaFree of an unknown pointer");
    cudaGetLastError();
    check(!strcmp(cudaGetErrorName(cudaErrorInvalidValue), "cudaErrorInvalidValue") &&
              !strcmp(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory"),
          "cudaGetErrorName and cudaGetErrorString give the real texts");
    void *huge = nullptr;
    check(cudaMalloc(&huge, (size_t)100 << 30) == cudaErrorMemoryAllocation,
          "cudaMalloc over 80 GB fails with cudaErrorMemoryAllocation");
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    CT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    check(total_b == (size_t)80 << 30 && free_b == total_b - 4000, "cudaMemGetInfo");
    CT_CUDA_CHECK(cudaMemset(p, 0, 4000));
    check(p[999] == 0.0f, "cudaMemset");
    CT_CUDA_CHECK(cudaFree(p));
}

static void case_devices() {
    int n = -1;
    cudaError_t e = cudaGetDeviceCount(&n);
    const char *want = getenv("CUEMU_DEVICES");
    if (want && atoi(want) == 0) {
        check(e == cudaErrorNoDevice,
              "CUEMU_DEVICES=0: cudaGetDeviceCount gives cudaErrorNoDevice");
        return;
    }
    check(e == cudaSuccess && n == (want ? atoi(want) : 1), "cudaGetDeviceCount");
    cudaDeviceProp prop;
    CT_CUDA_CHECK(cudaGetDeviceProperties(&prop, n - 1));
    check(prop.major == 9 && prop.multiProcessorCount == 132 &&
              prop.sharedMemPerBlockOptin == 227 * 1024 && strstr(prop.name, "cuemu"),
          "cudaGetDeviceProperties: an H100-like sm_90");
    check(cudaSetDevice(n) == cudaErrorInvalidDevice, "cudaSetDevice past the last device");
    cudaGetLastError();
    CT_CUDA_CHECK(cudaSetDevice(n - 1));
    int d = -1;
    CT_CUDA_CHECK(cudaGetDevice(&d));
    check(d == n - 1, "cudaGetDevice returns what cudaSetDevice set");
}

/* ---- launch checks ------------------------------------------------------------------------- */
__global__ void smem_kernel(float *out, int n) {
    CT_DYN_SHARED(float, buf);
    for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = (float)i;
    __syncthreads();
    float s = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += buf[n - 1 - i];
    s = block_sum<256, false>(s);
    if (threadIdx.x == 0) out[0] = s;
}

static void case_launch_checks() {
    float *out = device_alloc<float>(1024);
    ct_launch(fill_kernel, dim3(1), dim3(1025), 0, 0, out, 1.0f, 1025);
    check(cudaGetLastError() == cudaErrorInvalidConfiguration,
          "1025 threads per block: cudaErrorInvalidConfiguration");
    ct_launch(fill_kernel, dim3(1), dim3(1, 1, 65), 0, 0, out, 1.0f, 1);
    check(cudaGetLastError() == cudaErrorInvalidConfiguration, "blockDim.z 65 is refused");
    ct_launch(fill_kernel, dim3(1, 65536), dim3(32), 0, 0, out, 1.0f, 1);
    check(cudaGetLastError() == cudaErrorInvalidConfiguration, "gridDim.y 65536 is refused");
    CT_CUDA_CHECK(cudaDeviceSynchronize());
    uint32_t word;
    std::memcpy(&word, out, 4);
    check(word == 0x7FC07FC0u, "a refused launch does not run");

    const int n = 16384; /* 64 KB of floats */
    ct_launch(smem_kernel, dim3(1), dim3(256), n * sizeof(float), 0, out, n);
    check(cudaGetLastError() == cudaErrorInvalidValue,
          "64 KB dynamic shared memory without cudaFuncSetAttribute: cudaErrorInvalidValue");
    check(cudaFuncSetAttribute(smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               228 * 1024) == cudaErrorInvalidValue,
          "cudaFuncSetAttribute above 227 KB is refused");
    cudaGetLastError();
    CT_CUDA_CHECK(cudaFuncSetAttribute(smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       n * sizeof(float)));
    ct_launch(smem_kernel, dim3(1), dim3(256), n * sizeof(float), 0, out, n);
    CT_CUDA_CHECK(cudaGetLastError());
    float got = 0;
    CT_CUDA_CHECK(cudaMemcpy(&got, out, 4, cudaMemcpyDeviceToHost));
    check(got == (float)n * (n - 1) / 2, "64 KB dynamic shared memory after cudaFuncSetAttribute");
    ct_launch(fill_kernel, dim3(1), dim3(32), n * sizeof(float), 0, out, 1.0f, 1);
    check(cudaGetLastError() == cudaErrorInvalidValue,
          "the attribute raises the limit only for the kernel it was set on");
    CT_CUDA_CHECK(cudaFree(out));
}

/* ---- bf16 ---------------------------------------------------------------------------------- */
__global__ void bf16_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = __bfloat162float(in[i]);
    out[i] = __float2bfloat16(x * 2.0f + 1.0f);
}

static void case_bf16() {
    const int n = 100;
    std::vector<__nv_bfloat16> h(n);
    for (int i = 0; i < n; i++) h[i] = __float2bfloat16(0.37f * i);
    __nv_bfloat16 *in = device_alloc<__nv_bfloat16>(n), *out = device_alloc<__nv_bfloat16>(n);
    CT_CUDA_CHECK(cudaMemcpy(in, h.data(), n * 2, cudaMemcpyHostToDevice));
    ct_launch(bf16_kernel, dim3(4), dim3(32), 0, 0, out, (const __nv_bfloat16 *)in, n);
    std::vector<__nv_bfloat16> got(n);
    CT_CUDA_CHECK(cudaMemcpy(got.data(), out, n * 2, cudaMemcpyDeviceToHost));
    bool good = true;
    for (int i = 0; i < n; i++) {
        float want = __bfloat162float(__float2bfloat16(__bfloat162float(h[i]) * 2.0f + 1.0f));
        good = good && __bfloat162float(got[i]) == want;
    }
    check(good, "bf16 conversions from <cuda_bf16.h> inside a kernel");
    check(__bfloat162float(__float2bfloat16(3.14159f)) == 3.140625f, "bf16 rounds to nearest");
    CT_CUDA_CHECK(cudaFree(in));
    CT_CUDA_CHECK(cudaFree(out));
}

/* ---- tensor cores: mma.sync and ldmatrix (cuda/ct_mma.cuh, cuda/emu/mma_emu.cc) ------------- */
/* D (16 x 16) = A (16 x 32) · B (32 x 16), one warp, twice: B's fragments once by ldmatrix from
 * Bt (B's columns as rows) and once by ldmatrix.trans from B row-major. Both D's must equal the
 * exact product: the fragments of ldmatrix (both forms) and of mma have to agree with the PTX ISA
 * and with each other for that, so an index wrong in any of them shows. misaligned: one lane's
 * ldmatrix row address is 8 bytes off (the emulator aborts; a GPU faults). */
enum { MMA_M = 16, MMA_N = 16, MMA_K = 32, MMA_PAD = 8 };

__global__ void mma_kernel(float *D, const __nv_bfloat16 *A, const __nv_bfloat16 *Bt,
                           const __nv_bfloat16 *B, int misaligned) {
    constexpr int LA = MMA_K + MMA_PAD, LB = MMA_N + MMA_PAD;
    CT_SHARED(__nv_bfloat16, as, MMA_M * LA);
    CT_SHARED(__nv_bfloat16, bts, MMA_N * LA);
    CT_SHARED(__nv_bfloat16, bs, MMA_K * LB);
    const int lane = threadIdx.x, i = lane >> 3, j = lane & 7, g = lane >> 2, t = lane & 3;
    for (int e = lane; e < MMA_M * MMA_K; e += 32) as[e / MMA_K * LA + e % MMA_K] = A[e];
    for (int e = lane; e < MMA_N * MMA_K; e += 32) bts[e / MMA_K * LA + e % MMA_K] = Bt[e];
    for (int e = lane; e < MMA_K * MMA_N; e += 32) bs[e / MMA_N * LB + e % MMA_N] = B[e];
    __syncwarp();
    float d[2][2][4] = {}; /* [way][n-tile][fragment] */
    for (int kk = 0; kk < MMA_K / 16; kk++) {
        uint32_t a[4], r[4];
        const int off = misaligned && lane == 5 ? 4 : 0;
        ct_ldmatrix_x4(a, as + (j + 8 * (i & 1)) * LA + 16 * kk + 8 * (i >> 1) + off);
        ct_ldmatrix_x4(r, bts + (j + 8 * (i >> 1)) * LA + 16 * kk + 8 * (i & 1));
        const uint32_t b00[2] = {r[0], r[1]}, b01[2] = {r[2], r[3]};
        ct_mma_bf16(d[0][0], a, b00);
        ct_mma_bf16(d[0][1], a, b01);
        ct_ldmatrix_x4_trans(r, bs + (16 * kk + j + 8 * (i & 1)) * LB + 8 * (i >> 1));
        const uint32_t b10[2] = {r[0], r[1]}, b11[2] = {r[2], r[3]};
        ct_mma_bf16(d[1][0], a, b10);
        ct_mma_bf16(d[1][1], a, b11);
    }
    for (int way = 0; way < 2; way++)
        for (int n = 0; n < 2; n++)
            for (int e = 0; e < 4; e++)
                D[way * MMA_M * MMA_N + (g + 8 * (e >> 1)) * MMA_N + 8 * n + 2 * t + (e & 1)] =
                    d[way][n][e];
}

static void mma_run(int misaligned) {
    std::vector<float> fa = random_floats(MMA_M * MMA_K, 11), fb = random_floats(MMA_K * MMA_N, 12);
    std::vector<__nv_bfloat16> ha(fa.size()), hb(fb.size()), hbt(fb.size());
    for (size_t e = 0; e < fa.size(); e++) ha[e] = __float2bfloat16(fa[e]);
    for (int k = 0; k < MMA_K; k++)
        for (int n = 0; n < MMA_N; n++) {
            hb[k * MMA_N + n] = __float2bfloat16(fb[k * MMA_N + n]);
            hbt[n * MMA_K + k] = hb[k * MMA_N + n];
        }
    std::vector<double> want(2 * MMA_M * MMA_N), mag(want.size());
    for (int m = 0; m < MMA_M; m++)
        for (int n = 0; n < MMA_N; n++) {
            double acc = 0.0, abs_acc = 0.0;
            for (int k = 0; k < MMA_K; k++) {
                const double x = (double)__bfloat162float(ha[m * MMA_K + k]) *
                                 (double)__bfloat162float(hb[k * MMA_N + n]);
                acc += x, abs_acc += std::fabs(x);
            }
            want[m * MMA_N + n] = want[MMA_M * MMA_N + m * MMA_N + n] = acc;
            mag[m * MMA_N + n] = mag[MMA_M * MMA_N + m * MMA_N + n] = abs_acc;
        }
    __nv_bfloat16 *A = device_alloc<__nv_bfloat16>(ha.size());
    __nv_bfloat16 *Bt = device_alloc<__nv_bfloat16>(hbt.size());
    __nv_bfloat16 *B = device_alloc<__nv_bfloat16>(hb.size());
    float *D = device_alloc<float>(want.size());
    CT_CUDA_CHECK(cudaMemcpy(A, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
    CT_CUDA_CHECK(cudaMemcpy(Bt, hbt.data(), hbt.size() * 2, cudaMemcpyHostToDevice));
    CT_CUDA_CHECK(cudaMemcpy(B, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
    for (int o = 0; o < 3; o++) {
        cuemu_set_order(all_orders[o], 7);
        ct_launch(mma_kernel, dim3(1), dim3(32), 0, 0, D, (const __nv_bfloat16 *)A,
                  (const __nv_bfloat16 *)Bt, (const __nv_bfloat16 *)B, misaligned);
        std::vector<float> got(want.size());
        CT_CUDA_CHECK(cudaMemcpy(got.data(), D, got.size() * 4, cudaMemcpyDeviceToHost));
        /* Each mma rounds the exact sum of its 16 products (exact in double) and c once: two
         * k-steps, two roundings, each within 2^-24 of a value at most Σ|a·b|. */
        bool good = true;
        for (size_t e = 0; e < want.size(); e++)
            good = good && std::fabs((double)got[e] - want[e]) <= 2.0 / 16777216.0 * mag[e];
        std::string what = std::string("mma m16n8k16 over ldmatrix and ldmatrix.trans fragments "
                                       "equals the exact product (") +
                           order_names[o] + ")";
        check(good, what.c_str());
    }
    CT_CUDA_CHECK(cudaFree(A));
    CT_CUDA_CHECK(cudaFree(Bt));
    CT_CUDA_CHECK(cudaFree(B));
    CT_CUDA_CHECK(cudaFree(D));
}

/* ---- cp.async: a double-buffered stream of tiles (cuda/ct_async.cuh) ----------------------- */
/* 64 threads sum, over n tiles of 64 floats, the element of the other warp's half; the last warp
 * copies each tile (16 threads x 16 bytes) into the buffer the tile before last used, while the
 * block reads the other. bug 1: no cp.async.wait_group (the emulator lands the copies at the wait
 * in ascending order, so the reads see poison); bug 2: no barrier freeing a buffer before the
 * next copy into it (copies land at the commit in descending order, where the copying warp runs
 * first and overwrites a tile the other warp has yet to read); bug 3: a copy to global memory. */
__global__ void cp_async_kernel(float *out, const float *in, int n, int bug) {
    CT_SHARED(float4, buf4, 2 * 16);
    float *buf = reinterpret_cast<float *>(buf4);
    const int t = threadIdx.x;
    auto load = [&](int k) {
        if (t >= 48) {
            float *dst = bug == 3 ? out + 4 * (t - 48) : buf + (k & 1) * 64 + 4 * (t - 48);
            ct_cp_async<16>(dst, in + k * 64 + 4 * (t - 48), true);
        }
        ct_cp_async_commit();
    };
    load(0);
    float acc = 0.0f;
    for (int k = 0; k < n; k++) {
        if (k + 1 < n) {
            load(k + 1);
            if (bug != 1) ct_cp_async_wait<1>();
        } else if (bug != 1) {
            ct_cp_async_wait<0>();
        }
        __syncthreads();
        acc += buf[(k & 1) * 64 + (t + 32) % 64];
        if (bug != 2) __syncthreads();
    }
    out[t] = acc;
}

/* Runs the kernel in the orders given (all three for the correct one); exits 1 with "wrong
 * result" when a planted bug shows in CUEMU_ORDER's order. */
static void cp_async_run(int bug) {
    const int n = 9;
    std::vector<float> h = random_floats(64 * n, 21);
    std::vector<double> want(64, 0.0);
    for (int k = 0; k < n; k++)
        for (int t = 0; t < 64; t++) want[t] += (double)h[k * 64 + (t + 32) % 64];
    float *in = device_alloc<float>(h.size()), *out = device_alloc<float>(64);
    CT_CUDA_CHECK(cudaMemcpy(in, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    for (int o = 0; o < (bug ? 1 : 3); o++) {
        if (!bug) cuemu_set_order(all_orders[o], 7);
        ct_launch(cp_async_kernel, dim3(1), dim3(64), 0, 0, out, (const float *)in, n, bug);
        std::vector<float> got(64);
        CT_CUDA_CHECK(cudaMemcpy(got.data(), out, 64 * 4, cudaMemcpyDeviceToHost));
        const float err = max_abs_diff(got, want);
        if (bug) {
            const char *order = getenv("CUEMU_ORDER");
            printf("cp.async bug %d, CUEMU_ORDER=%s: max error %g: %s\n", bug, order ? order : "",
                   err, err < 1e-4f ? "result right (bug hidden)" : "wrong result");
            if (!(err < 1e-4f)) failures++;
        } else {
            std::string what = std::string("double-buffered cp.async stream equals the sum (") +
                               order_names[o] + ")";
            check(err < 1e-4f, what.c_str());
        }
    }
    CT_CUDA_CHECK(cudaFree(in));
    CT_CUDA_CHECK(cudaFree(out));
}

/* ---- wgmma, asynchronous (cuda/ct_wgmma.cuh) ------------------------------------------------ */
/* One warpgroup: A (64 x 16) and B (16 x 64) written to shared memory K-major without swizzle,
 * then two groups in flight: d1 = A·B and d2 = A·B + 1. After wait<1> d1 is done and d2, still in
 * flight, reads as NaN; after wait<0> both are done. out: d1, d2 and the NaN flag, per thread.
 * Each bug breaks one rule the emulator checks: 1 rewrites B in flight, 2 writes d1 in flight,
 * 3 issues with no wgmma.fence, 4 never waits, 5 writes the operands with no barrier before the
 * issue. */
#define WGT_LBO 128u /* one 8 x 16-byte core matrix to the next along k */
#define WGT_SBO 256u /* one 8-row group to the next */
static float wgt_a(int m, int k) {
    return (float)((m * 7 + k) % 5 - 2);
}
static float wgt_b(int k, int n) {
    return (float)((k * 3 + n) % 7 - 3);
}

__global__ void wgmma_async_kernel(float *out, int bug) {
    CT_DYN_SHARED(unsigned char, sm);
    const int t = (int)threadIdx.x;
    for (int e = t; e < 64 * 16; e += 128) {
        const int mn = e / 16, k = e % 16;
        const uint32_t off =
            ct_wgmma_offset(mn, k, false, CT_WGMMA_SWIZZLE_NONE, WGT_LBO, WGT_SBO, 0);
        const __nv_bfloat16 a = __float2bfloat16(wgt_a(mn, k)), b = __float2bfloat16(wgt_b(k, mn));
        std::memcpy(sm + off, &a, 2);
        std::memcpy(sm + 2048 + off, &b, 2);
    }
    ct_fence_async_proxy();
    if (bug != 5) __syncthreads(); /* without it, the first warp issues before the others wrote */
    const uint32_t base = ct_smem_u32(sm);
    const uint64_t da = ct_wgmma_desc(base, WGT_LBO, WGT_SBO, CT_WGMMA_SWIZZLE_NONE);
    const uint64_t db = ct_wgmma_desc(base + 2048, WGT_LBO, WGT_SBO, CT_WGMMA_SWIZZLE_NONE);
    float d1[32], d2[32];
    for (int i = 0; i < 32; i++) d1[i] = 0.0f, d2[i] = 1.0f;
    if (bug != 3) ct_wgmma_fence();
    ct_wgmma_m64n64k16_ss<0, 0>(d1, da, db, 0);
    ct_wgmma_commit();
    ct_wgmma_m64n64k16_ss<0, 0>(d2, da, db, 1);
    ct_wgmma_commit();
    if (bug == 4) return;
    if (bug == 1 && t == 0) {
        const __nv_bfloat16 z = __float2bfloat16(5.0f);
        std::memcpy(sm + 2048, &z, 2);
    }
    if (bug == 2) d1[3] = 0.0f;
    ct_wgmma_wait<1>();
    bool early_nan = true;
    for (int i = 0; i < 32; i++) early_nan = early_nan && std::isnan(d2[i]);
    ct_wgmma_wait<0>();
    for (int i = 0; i < 32; i++) {
        out[t * 65 + i] = d1[i];
        out[t * 65 + 32 + i] = d2[i];
    }
    out[t * 65 + 64] = early_nan ? 1.0f : 0.0f;
}

static void wgmma_run(int bug) {
    float *out = device_alloc<float>(128 * 65);
    for (int o = 0; o < (bug ? 1 : 3); o++) {
        if (!bug) cuemu_set_order(all_orders[o], 7);
        ct_launch(wgmma_async_kernel, dim3(1), dim3(128), 4096, 0, out, bug);
        CT_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<float> got(128 * 65);
        CT_CUDA_CHECK(cudaMemcpy(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost));
        bool right = true, nan_early = true;
        for (int t = 0; t < 128; t++) {
            const int w = t / 32, g = t % 32 / 4, q = t % 4;
            for (int i = 0; i < 32; i++) { /* the D fragment of ct_wgmma.cuh */
                const int row = 16 * w + g + 8 * (i % 4 / 2), col = 8 * (i / 4) + 2 * q + i % 2;
                double d = 0.0;
                for (int k = 0; k < 16; k++) d += (double)wgt_a(row, k) * (double)wgt_b(k, col);
                right =
                    right && got[t * 65 + i] == (float)d && got[t * 65 + 32 + i] == (float)(d + 1);
            }
            nan_early = nan_early && got[t * 65 + 64] == 1.0f;
        }
        std::string what = std::string(" (") + order_names[o] + ")";
        check(right, ("two wgmma groups give A·B and A·B + D" + what).c_str());
        check(nan_early, ("after wait<1>, the newer group's D reads as NaN" + what).c_str());
    }
    CT_CUDA_CHECK(cudaFree(out));
}

/* ---- speed --------------------------------------------------------------------------------- */
template <int BLOCK>
__global__ void layernorm_kernel(float *out, const float *in, const float *w, const float *b,
                                 int C) {
    const float *x = in + (size_t)blockIdx.x * C;
    float s = 0;
    for (int i = threadIdx.x; i < C; i += BLOCK) s += x[i];
    float mean = block_sum<BLOCK, false>(s) / C;
    float v = 0;
    for (int i = threadIdx.x; i < C; i += BLOCK) v += (x[i] - mean) * (x[i] - mean);
    float rstd = rsqrtf(block_sum<BLOCK, false>(v) / C + 1e-5f);
    for (int i = threadIdx.x; i < C; i += BLOCK)
        out[(size_t)blockIdx.x * C + i] = (x[i] - mean) * rstd * w[i] + b[i];
}

static void case_speed() {
    const int N = 256, C = 768;
    std::vector<float> h = random_floats((size_t)N * C, 9), hw = random_floats(C, 1);
    float *in = device_alloc<float>(h.size()), *out = device_alloc<float>(h.size());
    float *w = device_alloc<float>(C), *b = device_alloc<float>(C);
    CT_CUDA_CHECK(cudaMemcpy(in, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    CT_CUDA_CHECK(cudaMemcpy(w, hw.data(), C * 4, cudaMemcpyHostToDevice));
    CT_CUDA_CHECK(cudaMemcpy(b, hw.data(), C * 4, cudaMemcpyHostToDevice));
    CT_CUDA_CHECK(cudaDeviceSynchronize());
    uint64_t before = cuemu_threads_run();
    auto t0 = std::chrono::steady_clock::now();
    ct_launch(layernorm_kernel<256>, dim3(N), dim3(256), 0, 0, out, (const float *)in,
              (const float *)w, (const float *)b, C);
    CT_CUDA_CHECK(cudaDeviceSynchronize());
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("speed: layernorm %dx%d, 256 threads/block (8 barriers, 40 shuffles a thread): "
           "%.3g threads/s (%.3f s)\n",
           N, C, (double)(cuemu_threads_run() - before) / secs, secs);
    const int n = 1 << 20;
    float *big = device_alloc<float>(n);
    before = cuemu_threads_run();
    t0 = std::chrono::steady_clock::now();
    ct_launch(fill_kernel, dim3(n / 256), dim3(256), 0, 0, big, 1.0f, n);
    CT_CUDA_CHECK(cudaDeviceSynchronize());
    secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("speed: elementwise, no barriers, %d threads: %.3g threads/s (%.3f s)\n", n,
           (double)(cuemu_threads_run() - before) / secs, secs);
    CT_CUDA_CHECK(cudaFree(in));
    CT_CUDA_CHECK(cudaFree(out));
    CT_CUDA_CHECK(cudaFree(w));
    CT_CUDA_CHECK(cudaFree(b));
    CT_CUDA_CHECK(cudaFree(big));
}

/* ---- main ---------------------------------------------------------------------------------- */
static void usage() {
    fprintf(stderr, "usage: cuemu_selftest CASE\n  correct: reduce softmax atomics shuffles "
                    "streams memory launch-checks graphs capture-refusals bf16 mma cp-async wgmma "
                    "speed\n  buggy: missing-sync, "
                    "bad-mask, partial-barrier, deadlock, mismatch, big-static-smem, "
                    "uninit-shared, missing-stream-sync, oob-shared, oob-global, "
                    "ldmatrix-misaligned, cp-async-no-wait, cp-async-no-barrier, cp-async-global, "
                    "wgmma-operand-in-flight, wgmma-d-in-flight, wgmma-no-fence, wgmma-no-wait, "
                    "wgmma-no-barrier, capture-nccl\n");
    exit(2);
}

int main(int argc, char **argv) {
    if (argc < 2) usage();
    std::string c = argv[1];
    if (c == "reduce")
        case_reduce();
    else if (c == "softmax")
        case_softmax();
    else if (c == "atomics")
        case_atomics();
    else if (c == "shuffles")
        case_shuffles();
    else if (c == "streams")
        case_streams();
    else if (c == "memory")
        case_memory();
    else if (c == "devices")
        case_devices();
    else if (c == "launch-checks")
        case_launch_checks();
    else if (c == "graphs")
        case_graphs();
    else if (c == "capture-refusals")
        case_capture_refusals();
    else if (c == "capture-nccl")
        case_capture_nccl();
    else if (c == "bf16")
        case_bf16();
    else if (c == "mma")
        mma_run(0);
    else if (c == "ldmatrix-misaligned") {
        mma_run(1);
        printf("the kernel ran to completion: nothing was reported\n");
        exit(3);
    } else if (c == "cp-async")
        cp_async_run(0);
    else if (c == "cp-async-no-wait")
        cp_async_run(1);
    else if (c == "cp-async-no-barrier")
        cp_async_run(2);
    else if (c == "cp-async-global") {
        cp_async_run(3);
        printf("the kernel ran to completion: nothing was reported\n");
        exit(3);
    } else if (c == "wgmma")
        wgmma_run(0);
    else if (c.rfind("wgmma-", 0) == 0) {
        const char *bugs[] = {"",
                              "wgmma-operand-in-flight",
                              "wgmma-d-in-flight",
                              "wgmma-no-fence",
                              "wgmma-no-wait",
                              "wgmma-no-barrier"};
        int bug = 0;
        for (int k = 1; k < 6; k++)
            if (c == bugs[k]) bug = k;
        if (!bug) usage();
        wgmma_run(bug);
        printf("the kernel ran to completion: nothing was reported\n");
        exit(3);
    } else if (c == "speed")
        case_speed();
    else if (c == "missing-sync")
        case_missing_sync();
    else if (c == "uninit-shared")
        case_uninit_shared();
    else if (c == "missing-stream-sync")
        case_missing_stream_sync();
    else if (c == "bad-mask")
        run_and_sync([](float *o) { ct_launch(bad_mask_kernel, dim3(2), dim3(64), 0, 0, o); });
    else if (c == "partial-barrier")
        run_and_sync(
            [](float *o) { ct_launch(partial_barrier_kernel, dim3(1), dim3(128), 0, 0, o); });
    else if (c == "deadlock")
        run_and_sync([](float *o) { ct_launch(deadlock_kernel, dim3(1), dim3(64), 0, 0, o); });
    else if (c == "mismatch")
        run_and_sync([](float *o) { ct_launch(mismatch_kernel, dim3(1), dim3(32), 0, 0, o); });
    else if (c == "big-static-smem")
        run_and_sync(
            [](float *o) { ct_launch(big_static_smem_kernel, dim3(1), dim3(32), 0, 0, o); });
    else if (c == "oob-shared")
        run_and_sync([](float *o) { ct_launch(oob_shared_kernel, dim3(1), dim3(64), 0, 0, o); });
    else if (c == "oob-global") {
        float *o = device_alloc<float>(60);
        ct_launch(oob_global_kernel, dim3(1), dim3(64), 0, 0, o, 60);
        CT_CUDA_CHECK(cudaDeviceSynchronize());
        printf("the kernel ran to completion: nothing was reported\n");
        exit(3);
    } else
        usage();
    return failures ? 1 : 0;
}

/* CT_CUDA_CHECK's reporter (cuda/check.c in the backend; the self-test links only the emulator). */
extern "C" void ct_cuda_fail(const char *lib, const char *what, const char *name, const char *call,
                             const char *file, int line) {
    fprintf(stderr, "cooktrain: %s error '%s' (%s) in %s at %s:%d\n", lib, what, name, call, file,
            line);
    exit(1);
}
