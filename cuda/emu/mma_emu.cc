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

} // namespace

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
