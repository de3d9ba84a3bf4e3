/*
 * mma_emu.cc — the warp-level tensor-core instructions the kernels use (cuda/ct_mma.cuh), with
 * the register fragments of the PTX ISA ("Matrix fragments for mma.m16n8k16 with floating point
 * type"; "Warp-level matrix load instruction: ldmatrix"), run as warp collectives
 * (cuemu_warp_collective): every lane's registers are read and written at once, so a kernel that
 * puts an element in the wrong register of the wrong lane computes a wrong product here as on a
 * GPU.
 *
 * In a fragment, lane l is (g, t) = (l / 4, l % 4): its "group" and its index in the group.
 *
 *   mma m16n8k16 .row.col, bf16 inputs, f32 accumulators (registers of two bf16, the lower
 *   column or row index in the low 16 bits):
 *     A (16 x 16)  a[r] holds row g + 8·(r % 2), columns 2t + 8·(r / 2) and the next
 *     B (16 x 8)   b[r] holds rows 2t + 8·r and the next, column g
 *     C, D (16 x 8) c[r] is row g + 8·(r / 2), column 2t + r % 2
 *   The product is exact in double (a bf16 product has 16 significant bits) and the sum of the
 *   16 products and c is rounded once to float: at least as exact as the hardware, whose
 *   accumulation order and internal precision the ISA does not specify.
 *
 *   ldmatrix m8n8 .b16, n = 1, 2 or 4 matrices: lanes 8i .. 8i + 7 give the addresses of rows
 *   0 .. 7 of matrix i (16 bytes each, 16-byte aligned, in shared memory); register r[i] of lane
 *   l receives matrix i's row g, columns 2t and 2t + 1 — or with .trans its rows 2t and 2t + 1 of
 *   column g (the transposed matrix's row g). The addresses of lanes past 8n are not read.
 */
#include "cuda/emu/cuemu.h"
#include "cuda/ct_wgmma.cuh"

#include <cstdio>
#include <cstdlib>

namespace {

struct mma_lane {
    float *d;
    const uint32_t *a, *b;
    const float *c;
};

/* the bf16 of register `reg`'s half `hi` as a double */
double bf16_half(uint32_t reg, int hi) {
    uint32_t bits = (hi ? reg >> 16 : reg & 0xffffu) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return (double)f;
}

double a_elem(mma_lane *const *L, int row, int k) {
    const int lane = (row % 8) * 4 + (k / 2) % 4, reg = row / 8 + 2 * (k / 8);
    return bf16_half(L[lane]->a[reg], k % 2);
}

double b_elem(mma_lane *const *L, int k, int col) {
    const int lane = col * 4 + (k / 2) % 4, reg = k / 8;
    return bf16_half(L[lane]->b[reg], k % 2);
}

void mma_run(void *const args[32]) {
    mma_lane *const *L = reinterpret_cast<mma_lane *const *>(args);
    float out[32][4];
    for (int l = 0; l < 32; l++)
        for (int r = 0; r < 4; r++) {
            const int row = l / 4 + 8 * (r / 2), col = 2 * (l % 4) + r % 2;
            double acc = 0.0;
            for (int k = 0; k < 16; k++) acc += a_elem(L, row, k) * b_elem(L, k, col);
            out[l][r] = (float)(acc + (double)L[l]->c[r]);
        }
    /* written only now: d may be the c of the same lane (accumulate in place) */
    for (int l = 0; l < 32; l++)
        for (int r = 0; r < 4; r++) L[l]->d[r] = out[l][r];
}

struct ldm_lane {
    uint32_t *r;
    int n;
    bool trans;
    const void *row;
};

const char *ldm_name(const ldm_lane *x) {
    static const char *const names[2][3] = {
        {"ldmatrix.x1", "ldmatrix.x2", "ldmatrix.x4"},
        {"ldmatrix.x1.trans", "ldmatrix.x2.trans", "ldmatrix.x4.trans"}};
    return names[x->trans][x->n == 1 ? 0 : x->n == 2 ? 1 : 2];
}

uint16_t row_elem(ldm_lane *const *L, int lane, int col) {
    uint16_t v;
    std::memcpy(&v, static_cast<const unsigned char *>(L[lane]->row) + 2 * col, 2);
    return v;
}

void ldm_run(void *const args[32]) {
    ldm_lane *const *L = reinterpret_cast<ldm_lane *const *>(args);
    const int n = L[0]->n;
    for (int l = 0; l < 32; l++)
        if (L[l]->n != n || L[l]->trans != L[0]->trans) {
            fprintf(stderr, "cuemu: lanes 0 and %d are at different ldmatrix forms (%s, %s)\n", l,
                    ldm_name(L[0]), ldm_name(L[l]));
            abort();
        }
    for (int l = 0; l < 8 * n; l++) {
        const uintptr_t a = (uintptr_t)L[l]->row;
        if (a % 16 != 0 || !cuemu_is_shared_pointer(L[l]->row, 16)) {
            fprintf(stderr,
                    "cuemu: %s: lane %d's row address %p is not 16 bytes of shared memory on a "
                    "16-byte boundary\n",
                    ldm_name(L[l]), l, L[l]->row);
            abort();
        }
    }
    uint32_t out[32][4];
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, t = l % 4;
        for (int i = 0; i < n; i++) {
            uint16_t lo, hi;
            if (L[0]->trans) {
                lo = row_elem(L, 8 * i + 2 * t, g);
                hi = row_elem(L, 8 * i + 2 * t + 1, g);
            } else {
                lo = row_elem(L, 8 * i + g, 2 * t);
                hi = row_elem(L, 8 * i + g, 2 * t + 1);
            }
            out[l][i] = (uint32_t)lo | (uint32_t)hi << 16;
        }
    }
    for (int l = 0; l < 32; l++)
        for (int i = 0; i < n; i++) L[l]->r[i] = out[l][i];
}

/* wgmma (cuda/ct_wgmma.cuh): what each thread of the warpgroup brought, and how many have. */
struct wg_thread {
    float *d;
    uint32_t a[4];
    bool a_regs;
    uint64_t a_desc, b_desc;
    int n;
    bool scale_d, trans_a, trans_b;
};
wg_thread wg[128];
int wg_arrived;

/* Element (mn, k) of a bf16 operand in shared memory through its descriptor (the MN-major
 * layouts' variant 0: ct_wgmma.cuh). */
double wg_smem(uint64_t desc, int mn, int k, bool mn_major, const char *which) {
    const uint32_t start = (uint32_t)(desc & 0x3FFFu) << 4;
    const uint32_t lbo = (uint32_t)(desc >> 16 & 0x3FFFu) << 4;
    const uint32_t sbo = (uint32_t)(desc >> 32 & 0x3FFFu) << 4;
    const int swizzle = (int)(desc >> 62);
    if (swizzle != CT_WGMMA_SWIZZLE_NONE && swizzle != CT_WGMMA_SWIZZLE_128B) {
        fprintf(stderr,
                "cuemu: wgmma: %s's descriptor asks for swizzle mode %d (the emulator has "
                "none and 128-byte)\n",
                which, swizzle);
        abort();
    }
    const uint32_t addr =
        ct_wgmma_swizzle(start + ct_wgmma_offset(mn, k, mn_major, swizzle, lbo, sbo, 0), swizzle);
    const unsigned char *p = static_cast<const unsigned char *>(cuemu_dynamic_shared()) + addr;
    if (!cuemu_is_shared_pointer(p, 2)) {
        fprintf(stderr,
                "cuemu: wgmma: %s element (%d, %d) at shared address %u is outside the "
                "block's dynamic shared memory\n",
                which, mn, k, addr);
        abort();
    }
    uint16_t v;
    std::memcpy(&v, p, 2);
    return bf16_half(v, 0);
}

/* Run by the last of the 128 threads to arrive: D = A·B + (scale_d ? D : 0) for all of them. */
void wg_run() {
    const wg_thread &w0 = wg[0];
    for (int t = 1; t < 128; t++) {
        const wg_thread &w = wg[t];
        if (w.n != w0.n || w.a_regs != w0.a_regs || w.b_desc != w0.b_desc ||
            (!w0.a_regs && w.a_desc != w0.a_desc) || w.scale_d != w0.scale_d ||
            w.trans_a != w0.trans_a || w.trans_b != w0.trans_b) {
            fprintf(stderr,
                    "cuemu: wgmma: threads 0 and %d of the warpgroup issued different "
                    "instructions (shape, descriptors or flags)\n",
                    t);
            abort();
        }
    }
    const int n = w0.n;
    static double A[64][16], B[16][256];
    for (int t = 0; t < 128 && w0.a_regs; t++) {
        const int w = t / 32, g = t % 32 / 4, q = t % 4;
        for (int r = 0; r < 4; r++) {
            const int row = 16 * w + g + 8 * (r % 2), col = 2 * q + 8 * (r / 2);
            A[row][col] = bf16_half(wg[t].a[r], 0);
            A[row][col + 1] = bf16_half(wg[t].a[r], 1);
        }
    }
    for (int m = 0; m < 64 && !w0.a_regs; m++)
        for (int k = 0; k < 16; k++) A[m][k] = wg_smem(w0.a_desc, m, k, w0.trans_a, "A");
    for (int k = 0; k < 16; k++)
        for (int c = 0; c < n; c++) B[k][c] = wg_smem(w0.b_desc, c, k, w0.trans_b, "B");
    for (int t = 0; t < 128; t++) {
        const int w = t / 32, g = t % 32 / 4, q = t % 4;
        for (int i = 0; i < n / 2; i++) {
            const int row = 16 * w + g + 8 * (i % 4 / 2), col = 8 * (i / 4) + 2 * q + i % 2;
            double acc = 0.0;
            for (int k = 0; k < 16; k++) acc += A[row][k] * B[k][col];
            wg[t].d[i] = (float)(acc + (w0.scale_d ? (double)wg[t].d[i] : 0.0));
        }
    }
}

} // namespace

void cuemu_wgmma_bf16(float *d, int n, const uint32_t *a_regs, uint64_t a_desc, uint64_t b_desc,
                      bool scale_d, bool trans_a, bool trans_b) {
    const int threads = (int)(blockDim.x * blockDim.y * blockDim.z);
    if (threads != 128) {
        fprintf(stderr,
                "cuemu: wgmma in a block of %d threads: the emulator runs it in blocks of "
                "exactly one warpgroup (128)\n",
                threads);
        abort();
    }
    if (n < 8 || n > 256 || n % 8) {
        fprintf(stderr, "cuemu: wgmma m64n%dk16: N must be a multiple of 8 from 8 to 256\n", n);
        abort();
    }
    const int t = (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
    wg_thread &me = wg[t];
    me =
        wg_thread{d, {0, 0, 0, 0}, a_regs != nullptr, a_desc, b_desc, n, scale_d, trans_a, trans_b};
    if (a_regs) std::memcpy(me.a, a_regs, sizeof me.a);
    if (++wg_arrived == 128) {
        wg_arrived = 0;
        wg_run();
    }
    __syncthreads(); /* no thread goes on before the last one has run the product */
}

void cuemu_mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2],
                             const float c[4]) {
    mma_lane me = {d, a, b, c};
    cuemu_warp_collective("mma.sync.m16n8k16.bf16", mma_run, &me);
}

void cuemu_ldmatrix(uint32_t *r, int n_matrices, bool trans, const void *row_address) {
    if (n_matrices != 1 && n_matrices != 2 && n_matrices != 4) {
        fprintf(stderr, "cuemu: ldmatrix of %d matrices (1, 2 or 4)\n", n_matrices);
        abort();
    }
    ldm_lane me = {r, n_matrices, trans, row_address};
    cuemu_warp_collective("ldmatrix", ldm_run, &me);
}
