/*
 * wgmma_probe.cu — does a Hopper GPU read wgmma's operands and accumulators where
 * cuda/ct_wgmma.cuh (and so the emulator) says it does? One 64 x 64 x 16 product, D = A·B + C with
 * small integers (exact in bf16 and fp32), per case: A and B written to shared memory in one
 * layout (ct_wgmma_offset, ct_wgmma_swizzle) or A in registers, described, multiplied, and D
 * compared element by element with the host's. Built two ways:
 *   - by g++ against the emulator ($(BUILD)/test/wgmma_probe_emu; test/cli/cli_cuda_emu.sh): every
 *     case of layout variant 0 matches and every case of variant 1 does not, which shows the
 *     probe tells the two readings of the MN-major offsets apart;
 *   - by nvcc -arch=sm_90a on a Hopper GPU (scripts/gpu_check.sh): which cases the hardware
 *     matches. Variant 0's all matching confirms the emulator; variant 1's matching where 0's do
 *     not says the MN-major offsets are the other way round (swap them in ct_wgmma_offset).
 * Prints "case NAME: match" or "case NAME: MISMATCH: N of 4096 differ, first D[r][c] = got, want"
 * per case and exits 0; 1 on a CUDA error; on a GPU before sm_90 it says so and exits 0.
 *
 *   wgmma_probe
 */
#include "cuda/ct_cuda.h"
#include "cuda/ct_wgmma.cuh"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define PROBE_CHECK(call)                                                                          \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            printf("wgmma_probe: %s: %s\n", #call, cudaGetErrorString(e_));                        \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* One operand's place in shared memory: where its region starts (bytes past a 1024-aligned base),
 * the descriptor's start past that (a k-step into a swizzle atom), and the layout. */
struct operand {
    bool mn_major;
    int swizzle;
    uint32_t lbo, sbo, region, start;
};

struct probe_case {
    const char *name;
    bool a_regs;
    operand a, b;
    int variant; /* the MN-major reading the operands are written with (ct_wgmma_offset) */
};

/* M = N = 64, K = 16; A (64 x 16), B (16 x 64) and C row-major on the device, D out. */
enum { PM = 64, PN = 64, PK = 16, SMEM_BYTES = 1024 + 3 * 8192 };

/* Element (mn, k) of an operand to its shared-memory byte (relative to the aligned base). */
static __device__ inline uint32_t place(const operand &o, uint32_t base, int mn, int k,
                                        int variant) {
    /* the element's offset from the atom that holds the start: k counted from the atom's row
     * start, so a start 32 bytes in (k-step 1 of a 128-byte swizzle atom) holds k + 16 */
    const int k_in = k + (int)(o.start / 2);
    const uint32_t atom = base + o.region;
    const uint32_t addr =
        atom + ct_wgmma_offset(mn, k_in, o.mn_major, o.swizzle, o.lbo, o.sbo, variant);
    return ct_wgmma_swizzle(addr, o.swizzle) - base;
}

template <int TA, int TB>
static __device__ inline void issue(float (&d)[32], const probe_case &c, uint64_t da, uint64_t db,
                                    const uint32_t (&a)[4]) {
    if (c.a_regs)
        ct_wgmma_m64n64k16_rs<TB>(d, a, db, 1);
    else
        ct_wgmma_m64n64k16_ss<TA, TB>(d, da, db, 1);
}

static __global__ void probe_kernel(float *D, const uint16_t *A, const uint16_t *B, const float *C,
                                    probe_case c) {
    CT_DYN_SHARED(unsigned char, raw);
    const int t = (int)threadIdx.x, w = t / 32, g = t % 32 / 4, q = t % 4;
    const uint32_t raw_addr = ct_smem_u32(raw);
    const uint32_t pad = (1024u - raw_addr % 1024u) % 1024u;
    unsigned char *sm = raw + pad;
    const uint32_t base = raw_addr + pad;
    for (int i = t; i < 3 * 8192; i += 128) sm[i] = 0;
    __syncthreads();
    for (int e = t; e < PM * PK; e += 128) {
        const int m = e / PK, k = e % PK;
        if (!c.a_regs) memcpy(sm + place(c.a, base, m, k, c.variant), &A[m * PK + k], 2);
    }
    for (int e = t; e < PK * PN; e += 128) {
        const int k = e / PN, n = e % PN;
        memcpy(sm + place(c.b, base, n, k, c.variant), &B[k * PN + n], 2);
    }
    ct_fence_async_proxy(); /* the stores, visible to wgmma's reads */
    __syncthreads();
    float d[32];
    for (int i = 0; i < 32; i++)
        d[i] = C[(16 * w + g + 8 * (i % 4 / 2)) * PN + 8 * (i / 4) + 2 * q + i % 2];
    uint32_t a[4];
    for (int r = 0; r < 4; r++) {
        const int row = 16 * w + g + 8 * (r % 2), col = 2 * q + 8 * (r / 2);
        a[r] = (uint32_t)A[row * PK + col] | (uint32_t)A[row * PK + col + 1] << 16;
    }
    const uint64_t da = ct_wgmma_desc(base + c.a.region + c.a.start, c.a.lbo, c.a.sbo, c.a.swizzle);
    const uint64_t db = ct_wgmma_desc(base + c.b.region + c.b.start, c.b.lbo, c.b.sbo, c.b.swizzle);
    ct_wgmma_fence();
    if (c.a.mn_major && c.b.mn_major)
        issue<1, 1>(d, c, da, db, a);
    else if (c.a.mn_major)
        issue<1, 0>(d, c, da, db, a);
    else if (c.b.mn_major)
        issue<0, 1>(d, c, da, db, a);
    else
        issue<0, 0>(d, c, da, db, a);
    ct_wgmma_commit();
    ct_wgmma_wait<0>();
    for (int i = 0; i < 32; i++)
        D[(16 * w + g + 8 * (i % 4 / 2)) * PN + 8 * (i / 4) + 2 * q + i % 2] = d[i];
}

static uint16_t bf16_bits(float f) { /* exact for the small integers used here */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

int main() {
    int dev = 0;
    cudaDeviceProp prop;
    PROBE_CHECK(cudaGetDevice(&dev));
    PROBE_CHECK(cudaGetDeviceProperties(&prop, dev));
#ifdef __CUDACC__
    if (prop.major != 9) {
        printf("wgmma_probe: %s is sm_%d%d: wgmma needs sm_90 (Hopper); nothing probed\n",
               prop.name, prop.major, prop.minor);
        return 0;
    }
    printf("wgmma_probe: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
#else
    printf("wgmma_probe: the emulator\n");
#endif
    std::vector<uint16_t> A(PM * PK), B(PK * PN);
    std::vector<float> Af(PM * PK), Bf(PK * PN), C(PM * PN), want(PM * PN), got(PM * PN);
    for (int m = 0; m < PM; m++)
        for (int k = 0; k < PK; k++) Af[m * PK + k] = (float)((m * 13 + k * 7) % 31 - 15);
    for (int k = 0; k < PK; k++)
        for (int n = 0; n < PN; n++) Bf[k * PN + n] = (float)((k * 11 + n * 5) % 29 - 14);
    for (int i = 0; i < PM * PN; i++) C[i] = (float)(i % 5 - 2);
    for (int i = 0; i < PM * PK; i++) A[i] = bf16_bits(Af[i]);
    for (int i = 0; i < PK * PN; i++) B[i] = bf16_bits(Bf[i]);
    for (int m = 0; m < PM; m++)
        for (int n = 0; n < PN; n++) {
            float s = C[m * PN + n];
            for (int k = 0; k < PK; k++) s += Af[m * PK + k] * Bf[k * PN + n];
            want[m * PN + n] = s;
        }
    uint16_t *dA, *dB;
    float *dC, *dD;
    PROBE_CHECK(cudaMalloc(&dA, A.size() * 2));
    PROBE_CHECK(cudaMalloc(&dB, B.size() * 2));
    PROBE_CHECK(cudaMalloc(&dC, C.size() * 4));
    PROBE_CHECK(cudaMalloc(&dD, C.size() * 4));
    PROBE_CHECK(cudaMemcpy(dA, A.data(), A.size() * 2, cudaMemcpyHostToDevice));
    PROBE_CHECK(cudaMemcpy(dB, B.data(), B.size() * 2, cudaMemcpyHostToDevice));
    PROBE_CHECK(cudaMemcpy(dC, C.data(), C.size() * 4, cudaMemcpyHostToDevice));
    PROBE_CHECK(cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     SMEM_BYTES));

    /* K-major, no swizzle: 128-byte core matrices; A's k-neighbours adjacent (LBO 128) and its
     * 8-row groups 256 apart, B the other way round (LBO 1024, SBO 128), so a swapped reading of
     * LBO and SBO shows. 128-byte swizzle: 1024-byte atoms (SBO), LBO unused (16). MN-major, no
     * swizzle: 8 core matrices along mn 128 apart, the second k-half 1024 on (variant 0: LBO
     * along mn). MN-major, 128-byte swizzle: one 64-wide atom along mn, the k-halves 1024 apart
     * (variant 0: SBO along k; LBO 2048 is variant 1's step). */
    const uint32_t R0 = 0, R1 = 8192, R2 = 16384;
    const operand k_none_a = {false, CT_WGMMA_SWIZZLE_NONE, 128, 256, R0, 0};
    const operand k_none_b = {false, CT_WGMMA_SWIZZLE_NONE, 1024, 128, R1, 0};
    const operand k_128_a = {false, CT_WGMMA_SWIZZLE_128B, 16, 1024, R0, 0};
    const operand k_128_b = {false, CT_WGMMA_SWIZZLE_128B, 16, 1024, R1, 0};
    const operand k_128_b_step = {false, CT_WGMMA_SWIZZLE_128B, 16, 1024, R1, 32};
    const operand mn_none_b = {true, CT_WGMMA_SWIZZLE_NONE, 128, 1024, R1, 0};
    const operand mn_none_a = {true, CT_WGMMA_SWIZZLE_NONE, 128, 1024, R2, 0};
    const operand mn_128_b = {true, CT_WGMMA_SWIZZLE_128B, 2048, 1024, R1, 0};
    const probe_case cases[] = {
        {"K-major A and B, no swizzle", false, k_none_a, k_none_b, 0},
        {"K-major A and B, 128-byte swizzle", false, k_128_a, k_128_b, 0},
        {"K-major B, 128-byte swizzle, k-step 1 (start + 32 bytes)", false, k_128_a, k_128_b_step,
         0},
        {"A in registers, K-major B, 128-byte swizzle", true, k_128_a, k_128_b, 0},
        {"MN-major B, no swizzle, variant 0", false, k_none_a, mn_none_b, 0},
        {"MN-major B, no swizzle, variant 1", false, k_none_a, mn_none_b, 1},
        {"MN-major B, 128-byte swizzle, variant 0", false, k_128_a, mn_128_b, 0},
        {"MN-major B, 128-byte swizzle, variant 1", false, k_128_a, mn_128_b, 1},
        {"MN-major A, no swizzle, variant 0", false, mn_none_a, k_none_b, 0},
        {"MN-major A, no swizzle, variant 1", false, mn_none_a, k_none_b, 1},
    };
    for (const probe_case &c : cases) {
        PROBE_CHECK(cudaMemset(dD, 0xff, C.size() * 4));
        ct_launch(probe_kernel, dim3(1), dim3(128), (size_t)SMEM_BYTES, (cudaStream_t)0, dD,
                  (const uint16_t *)dA, (const uint16_t *)dB, (const float *)dC, c);
        PROBE_CHECK(cudaGetLastError());
        PROBE_CHECK(cudaMemcpy(got.data(), dD, got.size() * 4, cudaMemcpyDeviceToHost));
        int bad = 0, first = -1;
        for (int i = 0; i < PM * PN; i++)
            if (!(got[i] == want[i])) {
                if (first < 0) first = i;
                bad++;
            }
        if (!bad)
            printf("case %s: match\n", c.name);
        else
            printf("case %s: MISMATCH: %d of %d differ, first D[%d][%d] = %g, want %g\n", c.name,
                   bad, PM * PN, first / PN, first % PN, got[first], want[first]);
    }
    return 0;
}
