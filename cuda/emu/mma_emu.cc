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
#include <deque>
#include <vector>

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

/* wgmma (cuda/ct_wgmma.cuh), asynchronous as on the GPU. A thread's wgmmas are queued at issue;
 * its commit closes a group; a wait<N> is met by the whole warpgroup, and the last of the 128 to
 * arrive runs, in issue order, every instruction of all but the N newest groups, for all 128
 * threads, reading the operands then, before the block leaves through a barrier. Around that:
 *   - an instruction's shared-memory operands are read once more at its first thread's issue, and
 *     must not differ at its run (the writes of other threads not yet done when one issues, or an
 *     operand rewritten while the product is in flight);
 *   - a thread's accumulator is set to a NaN of its own at issue (the first instruction in flight
 *     on those registers, which keeps their value for the product), so a read of D before the
 *     wait meets NaNs; at the run, a D that is no longer that NaN was written in flight: abort;
 *   - A's registers are taken at issue (the kernel's array may be gone by the wait);
 *   - each thread's first wgmma, and the first after each of its waits, needs a wgmma.fence since;
 *   - a block that ends with a wgmma not waited for aborts. */
constexpr uint32_t WG_POISON = 0x7fc0face; /* a quiet NaN with a payload of its own */

struct wg_op { /* one thread's part of an instruction */
    float *d;
    std::vector<float> c; /* D at issue, for the chain's first instruction; empty when chained */
    uint32_t a[4];
};
struct wg_instr {
    bool a_regs, scale_d, trans_a, trans_b;
    uint64_t a_desc, b_desc;
    int n, issued;
    std::vector<uint16_t> a_seen, b_seen; /* the shared-memory operands at the first issue */
    wg_op op[128];
};
struct wg_thread {
    long issued = 0;             /* instructions this thread issued since the block started */
    std::vector<long> group_end; /* per committed group not yet waited for: issued at commit */
    bool fenced = false;         /* a wgmma.fence since the thread's start or last wait */
    std::vector<float *> flight; /* D arrays of its instructions in flight */
};
struct wg_block {
    long base = 0; /* instrs[0] is the block's instruction number base */
    std::deque<wg_instr> instrs;
    wg_thread thread[128];
    int at_wait = 0, wait_n = -1;
    bool used = false; /* any wgmma, fence, commit or wait in this block */
};
wg_block wgb;

/* The bits of bf16 element (mn, k) of an operand in shared memory through its descriptor (the
 * MN-major layouts' variant 0: ct_wgmma.cuh). */
uint16_t wg_smem(uint64_t desc, int mn, int k, bool mn_major, const char *which) {
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
    return v;
}

/* The instruction's operand in shared memory now, as bits: A (64 x 16, none when A is in
 * registers) or B (16 x n), row-major. */
std::vector<uint16_t> wg_read(const wg_instr &in, bool b) {
    std::vector<uint16_t> v;
    if (!b)
        for (int m = 0; m < 64 && !in.a_regs; m++)
            for (int k = 0; k < 16; k++) v.push_back(wg_smem(in.a_desc, m, k, in.trans_a, "A"));
    else
        for (int k = 0; k < 16; k++)
            for (int c = 0; c < in.n; c++) v.push_back(wg_smem(in.b_desc, c, k, in.trans_b, "B"));
    return v;
}

/* The first instruction in flight on a thread's D (none of `flight`, the D arrays in flight)
 * keeps D's value for its product and leaves NaNs for an early reader; a later one on the same D
 * takes the D its predecessor writes. */
void wg_keep(wg_op &op, int n, std::vector<float *> &flight) {
    for (float *f : flight)
        if (f == op.d) return;
    op.c.assign(op.d, op.d + n / 2);
    for (int i = 0; i < n / 2; i++) std::memcpy(&op.d[i], &WG_POISON, 4);
    flight.push_back(op.d);
}

int wg_tid() {
    return (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
}

/* D = A·B + (scale_d ? C : 0) for all 128 threads: C is D at issue for the first instruction of
 * a chain on the same registers, else the D the previous one wrote. */
void wg_run(wg_instr &in, long number) {
    if (in.issued != 128) {
        fprintf(stderr,
                "cuemu: wgmma: instruction %ld of the block was issued by %d of the warpgroup's "
                "128 threads before a wait needed it\n",
                number, in.issued);
        abort();
    }
    const std::vector<uint16_t> a_now = wg_read(in, false), b_now = wg_read(in, true);
    if (a_now != in.a_seen || b_now != in.b_seen) {
        fprintf(stderr,
                "cuemu: wgmma: instruction %ld's %s in shared memory changed between its first "
                "thread's issue and its wait (written in flight, or not yet written by every "
                "thread when it was issued: a barrier missing)\n",
                number, a_now != in.a_seen ? "A" : "B");
        abort();
    }
    const int n = in.n;
    static double A[64][16];
    for (int t = 0; t < 128; t++) {
        const int w = t / 32, g = t % 32 / 4, q = t % 4;
        for (int r = 0; r < 4 && in.a_regs; r++) {
            const int row = 16 * w + g + 8 * (r % 2), col = 2 * q + 8 * (r / 2);
            A[row][col] = bf16_half(in.op[t].a[r], 0);
            A[row][col + 1] = bf16_half(in.op[t].a[r], 1);
        }
    }
    for (int m = 0; m < 64 && !in.a_regs; m++)
        for (int k = 0; k < 16; k++) A[m][k] = bf16_half(a_now[(size_t)m * 16 + (size_t)k], 0);
    static double B[16][256];
    for (int k = 0; k < 16; k++)
        for (int c = 0; c < n; c++) B[k][c] = bf16_half(b_now[(size_t)k * n + (size_t)c], 0);
    for (int t = 0; t < 128; t++) {
        const wg_op &o = in.op[t];
        const int w = t / 32, g = t % 32 / 4, q = t % 4;
        for (int i = 0; i < n / 2; i++) {
            const int row = 16 * w + g + 8 * (i % 4 / 2), col = 8 * (i / 4) + 2 * q + i % 2;
            if (!o.c.empty()) {
                uint32_t bits;
                std::memcpy(&bits, &o.d[i], 4);
                if (bits != WG_POISON) {
                    fprintf(stderr,
                            "cuemu: wgmma: thread %d wrote element %d of the accumulator of "
                            "instruction %ld while it was in flight (before its wait)\n",
                            t, i, number);
                    abort();
                }
            }
            double acc = 0.0;
            for (int k = 0; k < 16; k++) acc += A[row][k] * B[k][col];
            const double c = o.c.empty() ? (double)o.d[i] : (double)o.c[i];
            o.d[i] = (float)(acc + (in.scale_d ? c : 0.0));
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
    const int t = wg_tid();
    wg_thread &me = wgb.thread[t];
    wgb.used = true;
    if (!me.fenced) {
        fprintf(stderr,
                "cuemu: wgmma: thread %d issued a wgmma with no wgmma.fence (ct_wgmma_fence) "
                "since its start or its last wait\n",
                t);
        abort();
    }
    const long number = me.issued++;
    if (number - wgb.base == (long)wgb.instrs.size()) { /* the first thread to issue it */
        wgb.instrs.emplace_back();
        wg_instr &in = wgb.instrs.back();
        in.a_regs = a_regs != nullptr, in.scale_d = scale_d, in.trans_a = trans_a;
        in.trans_b = trans_b, in.a_desc = a_desc, in.b_desc = b_desc, in.n = n, in.issued = 0;
        in.a_seen = wg_read(in, false);
        in.b_seen = wg_read(in, true);
    }
    wg_instr &in = wgb.instrs[(size_t)(number - wgb.base)];
    if (in.n != n || in.a_regs != (a_regs != nullptr) || in.b_desc != b_desc ||
        (!a_regs && in.a_desc != a_desc) || in.scale_d != scale_d || in.trans_a != trans_a ||
        in.trans_b != trans_b) {
        fprintf(stderr,
                "cuemu: wgmma: thread %d's instruction %ld differs from its first thread's "
                "(shape, descriptors or flags)\n",
                t, number);
        abort();
    }
    in.issued++;
    wg_op &op = in.op[t];
    op.d = d;
    op.c.clear();
    if (a_regs) std::memcpy(op.a, a_regs, sizeof op.a);
    wg_keep(op, n, me.flight);
}

void cuemu_wgmma_fence() {
    wgb.used = true;
    wgb.thread[wg_tid()].fenced = true;
}

void cuemu_wgmma_commit() {
    wgb.used = true;
    wg_thread &me = wgb.thread[wg_tid()];
    me.group_end.push_back(me.issued);
}

void cuemu_wgmma_wait(int n_pending) {
    const int t = wg_tid();
    if (wgb.at_wait > 0 && n_pending != wgb.wait_n) {
        fprintf(stderr,
                "cuemu: wgmma: thread %d waits for all but %d groups, another for all "
                "but %d\n",
                t, n_pending, wgb.wait_n);
        abort();
    }
    wgb.wait_n = n_pending;
    wgb.used = true;
    if (++wgb.at_wait == (int)(blockDim.x * blockDim.y * blockDim.z)) {
        wgb.at_wait = 0;
        const wg_thread &t0 = wgb.thread[0];
        for (int u = 1; u < 128; u++)
            if (wgb.thread[u].group_end != t0.group_end || wgb.thread[u].issued != t0.issued) {
                fprintf(stderr,
                        "cuemu: wgmma: at a wait, threads 0 and %d have issued or committed "
                        "different wgmmas\n",
                        u);
                abort();
            }
        const size_t groups = t0.group_end.size(),
                     done = groups > (size_t)n_pending ? groups - (size_t)n_pending : 0;
        if (done > 0) {
            const long end = t0.group_end[done - 1];
            while (wgb.base < end) {
                wg_run(wgb.instrs.front(), wgb.base);
                wgb.instrs.pop_front();
                wgb.base++;
            }
            for (int u = 0; u < 128; u++) {
                wg_thread &th = wgb.thread[u];
                th.group_end.erase(th.group_end.begin(), th.group_end.begin() + (long)done);
                th.flight.clear();
                for (wg_instr &in : wgb.instrs) { /* what is still in flight keeps its D */
                    if (!in.op[u].c.empty())
                        th.flight.push_back(in.op[u].d);
                    else /* its chain's first ran: it takes D from here */
                        wg_keep(in.op[u], in.n, th.flight);
                }
            }
        }
        for (wg_thread &u : wgb.thread) u.fenced = false;
    }
    __syncthreads(); /* no thread goes on before the last one has run the products */
}

void cuemu_wgmma_block_end() {
    if (!wgb.used) return;
    const bool pending = !wgb.instrs.empty() || wgb.thread[0].issued != wgb.base;
    if (pending) {
        fprintf(stderr,
                "cuemu: wgmma: the block ended with %zu wgmma instructions not waited for "
                "(ct_wgmma_commit, then ct_wgmma_wait)\n",
                wgb.instrs.size());
        abort();
    }
    wgb = wg_block();
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
