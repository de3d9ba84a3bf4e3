/*
 * mpi_test_cp.c — ring attention (core/model/ring_attention.h) against one rank's causal
 * attention on the whole sequence, run under mpirun by test/mpi/cli_mpi_cp.sh with the world as one
 * context-parallel group (cp = 2, 4 or 8 ranks).
 *
 * Every rank makes the same random qkv and upstream gradient for B = 2 sequences of T = 64
 * (4 query heads of width 16; 4 kv heads (MHA) or 2 (GQA)), runs ct_attention_fwd/_bwd on the
 * whole sequence as the reference, then the ring on its own rows (zigzag and contiguous), and
 * checks, for fp32 and bf16:
 *   - out, lse and dqkv of its rows against the reference's rows at the same positions, and the
 *     qkv bias gradient summed over the ranks against the reference's;
 *   - the bytes its sends counted: forward (cp−1) kv blocks, backward (cp−1) more plus cp fp32
 *     dK/dV partials, each B·(T/cp)·2·n_kv·hd elements;
 *   - a rerun gives the same bits;
 * the causal work per rank (unmasked score elements) at T = 32: zigzag equal on every rank,
 * contiguous growing with the rank; and that ct_cp_owner finds every position's rank and row.
 *
 * Tolerances (u = 2^-24). The ring sums the same products in another order. A score
 * s = scale·q·k differs by at most e_s = hd·u·scale·Σ_d|q_d||k_d| between the two; a softmax
 * weight then by 2·e_s relative, and a weighted sum of T values (fp32 accumulation, plus the
 * 2·cp merges of the ring, each a few roundings) by (T + 4·cp)·u: so out within
 * (4·e_s + 2·(T + 4·cp)·u)·max|v| + 4u·|out|, lse within 2·e_s + (T + 4·cp)·u·(1 + |lse|)
 * (taking e_s at its largest over the rows: |q|, |k| < 1). Gradients are sums of at most T
 * products of softmax weights with dot products of hd terms, accumulated over cp partials: within
 * R·(|want| + M), R = 4·(T + hd + 8 + 2·cp)·u, M the largest |want| of the tensor (check mode's
 * attention_bwd bound with the ring's extra partials; backward is given the reference's out and
 * lse, so it is checked alone). bf16 stages the same bf16 inputs through fp32 on both sides and
 * rounds once at the end: two fp32 values that close may round to neighbouring bf16 numbers, so
 * one bf16 spacing (2^-7·|want|) on top.
 *
 * Built twice: as mpi_test_cp, everything on the CPU backend over the MPI comm; and with
 * CT_TEST_NCCL as mpi_test_cp_nccl (linked with the emulated CUDA backend and the NCCL stand-in,
 * cuda/emu/; test/mpi/cli_mpi_cuda.sh runs it with one emulated device per rank), where the ring runs
 * on the CUDA backend's part ops (cuda/attention_part.cu) over an NCCL cp group and the
 * reference stays the CPU backend's attention. Across backends the exponentials differ too
 * (CUDA's expf within 2 ulp, the CPU's within 1) and the CUDA forward rescales its running sums
 * once per key tile (exp of m_old − m_new: 6u plus the rounding of an argument of at most the
 * score range 2·scale·hd·max|q||k| = 8 here, one tile per chunk at these shapes): e_x = 20u more
 * relative on every weight, so 2·e_x more on out (|v| < 1) and lse, and 4·e_x more in R.
 * Prints "ok <what>" / "FAIL <what>" lines; exits 1 on any failure.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend/backend.h"
#include "core/model/ring_attention.h"
#include "parallel/context.h"
#include "test/unit/test_util.h"

#ifdef CT_TEST_NCCL
#include "cuda/backend_cuda.h"
#include "cuda/comm_nccl.h"
#include "core/comm/comm_mpi.h"
static const double e_x = 20.0 / 16777216.0; /* the header's cross-backend term, 20u */
#else
static const double e_x = 0.0;
#endif

static int failures, rank, world;

static void report(bool good, const char *what, const char *detail) {
    int bad = !good, any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (!good) printf("FAIL %s (rank %d): %s\n", what, rank, detail);
    if (rank == 0 && !any) printf("ok %s\n", what);
    if (any) failures++;
    fflush(stdout);
}

/* got within tol of want everywhere (NaN fails); reports "<what>: <part>". */
static void check_close(const char *what, const char *part, const float *got, const float *want,
                        const float *tol, int64_t n) {
    char label[200], detail[256] = "";
    bool good = true;
    for (int64_t i = 0; i < n && good; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (!(d <= tol[i])) {
            snprintf(detail, sizeof detail, "element %lld: got %.9g want %.9g (tolerance %.3g)",
                     (long long)i, got[i], want[i], tol[i]);
            good = false;
        }
    }
    snprintf(label, sizeof label, "%s: %s", what, part);
    report(good, label, detail);
}

static ct_tensor *upload(ct_backend *be, ct_dtype dt, const float *h, int64_t rows, int64_t cols) {
    ct_tensor *t = ct_tensor_new_2d(be, dt, rows, cols, CT_MEM_ACTS);
    ct_tensor_from_host_f32(t, h);
    return t;
}

static float *download(const ct_tensor *t) {
    float *h = ct_xmalloc((size_t)t->numel * sizeof(float));
    ct_tensor_to_host_f32(h, t);
    return h;
}

static float *floats(int64_t n) {
    return ct_xcalloc((size_t)n, sizeof(float));
}

enum { B = 2, T = 64, NH = 4, HD = 16 };

/* The reference on `ref` (the CPU backend), the ring on `be` over cp. */
static void ring_case(ct_backend *ref, ct_backend *be, ct_comm *cp, ct_dtype dt, bool zigzag,
                      int nkv) {
    char what[160], label[200];
    const int n = cp->size, r = cp->rank;
    const int64_t Tl = T / n, cq = NH * HD, ckv = nkv * HD, lqkv = cq + 2 * ckv;
    const double u = ldexp(1.0, -24), bf = dt == CT_DTYPE_BF16 ? ldexp(1.0, -7) : 0.0;
    snprintf(what, sizeof what, "cp=%d %s %s %s", n, zigzag ? "zigzag" : "contiguous",
             nkv == NH ? "MHA" : "GQA", ct_dtype_name(dt));

    /* the same inputs on every rank; bf16 ones rounded first, so both sides see the same */
    uint64_t seed = 1234 + (uint64_t)nkv;
    float *qkv = floats(B * T * lqkv), *dout = floats(B * T * cq);
    for (int64_t i = 0; i < B * T * lqkv; i++) qkv[i] = test_urand(&seed, -1.0f, 1.0f);
    for (int64_t i = 0; i < B * T * cq; i++) dout[i] = test_urand(&seed, -1.0f, 1.0f);
    if (dt == CT_DTYPE_BF16) {
        for (int64_t i = 0; i < B * T * lqkv; i++) qkv[i] = ct_bf16_to_f32(ct_f32_to_bf16(qkv[i]));
        for (int64_t i = 0; i < B * T * cq; i++) dout[i] = ct_bf16_to_f32(ct_f32_to_bf16(dout[i]));
    }

    /* the reference: one rank, the whole sequence */
    ct_tensor *f_qkv = upload(ref, dt, qkv, B * T, lqkv);
    ct_tensor *f_dout = upload(ref, dt, dout, B * T, cq);
    ct_tensor *f_out = ct_tensor_new_2d(ref, dt, B * T, cq, CT_MEM_ACTS);
    ct_tensor *f_lse = ct_tensor_new_1d(ref, CT_DTYPE_F32, B * NH * T, CT_MEM_ACTS);
    ct_tensor *f_dqkv = ct_tensor_new_2d(ref, dt, B * T, lqkv, CT_MEM_ACTS);
    ct_tensor *f_dbias = ct_tensor_new_1d(ref, CT_DTYPE_F32, lqkv, CT_MEM_ACTS);
    ct_tensor_zero(f_dbias);
    ct_attention_fwd(f_out, f_lse, f_qkv, B, T, NH, nkv);
    ct_attention_bwd(f_dqkv, f_dbias, f_dout, f_qkv, f_out, f_lse, B, T, NH, nkv);
    float *w_out = download(f_out), *w_lse = download(f_lse), *w_dqkv = download(f_dqkv),
          *w_dbias = download(f_dbias);

    /* this rank's rows */
    float *l_qkv = floats(B * Tl * lqkv), *l_dout = floats(B * Tl * cq);
    int64_t pos[T];
    for (int64_t t = 0; t < Tl; t++) pos[t] = ct_cp_position(n, r, zigzag, Tl, t);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < Tl; t++) {
            memcpy(l_qkv + (b * Tl + t) * lqkv, qkv + (b * T + pos[t]) * lqkv,
                   sizeof(float) * (size_t)lqkv);
            memcpy(l_dout + (b * Tl + t) * cq, dout + (b * T + pos[t]) * cq,
                   sizeof(float) * (size_t)cq);
        }
    ct_tensor *qkv_t = upload(be, dt, l_qkv, B * Tl, lqkv);
    ct_tensor *dout_t = upload(be, dt, l_dout, B * Tl, cq);
    ct_tensor *out_t = ct_tensor_new_2d(be, dt, B * Tl, cq, CT_MEM_ACTS);
    ct_tensor *lse_t = ct_tensor_new_1d(be, CT_DTYPE_F32, B * NH * Tl, CT_MEM_ACTS);
    ct_tensor *dqkv_t = ct_tensor_new_2d(be, dt, B * Tl, lqkv, CT_MEM_ACTS);
    ct_tensor *dbias_t = ct_tensor_new_1d(be, CT_DTYPE_F32, lqkv, CT_MEM_ACTS);
    /* backward gets the reference's out and lse of these rows, so that it is checked alone (a
     * bf16 out one spacing off would move D = rowsum(dO ⊙ O) by more than the sums' order) */
    float *r_out = floats(B * Tl * cq), *r_lse = floats(B * NH * Tl);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < Tl; t++) {
            memcpy(r_out + (b * Tl + t) * cq, w_out + (b * T + pos[t]) * cq,
                   sizeof(float) * (size_t)cq);
            for (int64_t h = 0; h < NH; h++)
                r_lse[(b * NH + h) * Tl + t] = w_lse[(b * NH + h) * T + pos[t]];
        }
    ct_tensor *r_out_t = upload(be, dt, r_out, B * Tl, cq);
    ct_tensor *r_lse_t = upload(be, CT_DTYPE_F32, r_lse, 1, B * NH * Tl);
    float *got[2][4];
    uint64_t fwd_bytes = 0, bwd_bytes = 0;
    ct_ring_ws *ws = ct_ring_ws_new(); /* kept over both runs, as a model keeps it */
    for (int run = 0; run < 2; run++) {
        ct_tensor_zero(dbias_t);
        ct_comm_reset_counters(cp);
        ct_ring_attention_fwd(cp, zigzag, ws, out_t, lse_t, qkv_t, B, Tl, NH, nkv);
        fwd_bytes = cp->bytes[CT_COMM_SEND];
        ct_ring_attention_bwd(cp, zigzag, ws, dqkv_t, dbias_t, dout_t, qkv_t, r_out_t, r_lse_t, B,
                              Tl, NH, nkv);
        bwd_bytes = cp->bytes[CT_COMM_SEND] - fwd_bytes;
        got[run][0] = download(out_t), got[run][1] = download(lse_t);
        got[run][2] = download(dqkv_t), got[run][3] = download(dbias_t);
    }

    /* out and lse */
    float *want = floats(B * Tl * lqkv), *tol = floats(B * Tl * lqkv);
    const double e_s = HD * u * (1.0 / sqrt((double)HD)) * HD; /* hd·u·scale·Σ|q||k| */
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++)
            for (int64_t t = 0; t < Tl; t++) {
                int64_t i = (b * NH + h) * Tl + t;
                want[i] = w_lse[(b * NH + h) * T + pos[t]];
                tol[i] = (float)(2 * e_s + 2 * e_x + (T + 4 * n) * u * (1 + fabs(want[i])));
            }
    check_close(what, "lse", got[0][1], want, tol, B * NH * Tl);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < Tl; t++)
            for (int64_t c = 0; c < cq; c++) {
                int64_t i = (b * Tl + t) * cq + c;
                want[i] = w_out[(b * T + pos[t]) * cq + c];
                tol[i] =
                    (float)(4 * e_s + 2 * e_x + 2 * (T + 4 * n) * u + (4 * u + bf) * fabs(want[i]));
            }
    check_close(what, "out", got[0][0], want, tol, B * Tl * cq);

    /* dqkv: each part (q, k, v) against its largest reference value */
    const double R = 4.0 * (T + HD + 8 + 2 * n) * u + 4 * e_x;
    double M[3] = {0, 0, 0};
    for (int64_t i = 0; i < B * T * lqkv; i++) {
        int64_t c = i % lqkv, part = c < cq ? 0 : c < cq + ckv ? 1 : 2;
        M[part] = fmax(M[part], fabs(w_dqkv[i]));
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < Tl; t++)
            for (int64_t c = 0; c < lqkv; c++) {
                int64_t i = (b * Tl + t) * lqkv + c, part = c < cq ? 0 : c < cq + ckv ? 1 : 2;
                want[i] = w_dqkv[(b * T + pos[t]) * lqkv + c];
                tol[i] = (float)(R * (fabs(want[i]) + M[part]) + bf * fabs(want[i]));
            }
    check_close(what, "dqkv", got[0][2], want, tol, B * Tl * lqkv);

    /* dbias: the ranks' column sums add up to the whole sequence's (fp32 sums of fp32 values
     * on both sides: T·u relative to the column's magnitude, plus the dqkv tolerance summed) */
    float *dbias_sum = floats(lqkv);
    MPI_Allreduce(got[0][3], dbias_sum, (int)lqkv, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (int64_t c = 0; c < lqkv; c++) {
        int64_t part = c < cq ? 0 : c < cq + ckv ? 1 : 2;
        tol[c] = (float)(B * T * (R + bf + u) * (fabs(w_dbias[c]) + M[part]));
    }
    check_close(what, "dbias summed over the ranks", dbias_sum, w_dbias, tol, lqkv);

    /* bytes, and the same bits again */
    const size_t es = ct_dtype_size(dt);
    const uint64_t block = (uint64_t)B * (uint64_t)Tl * (uint64_t)ckv * 2;
    const uint64_t want_fwd = (uint64_t)(n - 1) * block * es,
                   want_bwd = want_fwd + (uint64_t)(n > 1 ? n : 0) * block * 4;
    char detail[160];
    snprintf(detail, sizeof detail, "forward %llu bytes (want %llu), backward %llu (want %llu)",
             (unsigned long long)fwd_bytes, (unsigned long long)want_fwd,
             (unsigned long long)bwd_bytes, (unsigned long long)want_bwd);
    snprintf(label, sizeof label, "%s: bytes sent", what);
    report(fwd_bytes == want_fwd && bwd_bytes == want_bwd, label, detail);
    const int64_t sizes[4] = {B * Tl * cq, B * NH * Tl, B * Tl * lqkv, lqkv};
    bool same = true;
    for (int k = 0; k < 4; k++)
        same = same && !memcmp(got[0][k], got[1][k], sizeof(float) * (size_t)sizes[k]);
    snprintf(label, sizeof label, "%s: a rerun gives the same bits", what);
    report(same, label, "out, lse, dqkv or dbias differ");

    for (int run = 0; run < 2; run++)
        for (int k = 0; k < 4; k++) free(got[run][k]);
    free(want), free(tol), free(dbias_sum);
    free(qkv), free(dout), free(l_qkv), free(l_dout), free(r_out), free(r_lse);
    free(w_out), free(w_lse), free(w_dqkv), free(w_dbias);
    ct_ring_ws_free(ws);
    ct_tensor *all[] = {f_qkv,  f_dout, f_out, f_lse,  f_dqkv,  f_dbias, qkv_t,
                        dout_t, out_t,  lse_t, dqkv_t, dbias_t, r_out_t, r_lse_t};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ct_tensor_free(all[i]);
}

/* Unmasked score elements per rank at T = 32 (of 32·33/2 = 528 in all). */
static __attribute__((unused)) void balance(void) {
    static const int64_t contiguous4[4] = {36, 100, 164, 228}, contiguous2[2] = {136, 392};
    bool good = true;
    char detail[200] = "";
    for (int cp = 2; cp <= 4; cp += 2) {
        int64_t total_z = 0, total_c = 0;
        for (int r = 0; r < cp; r++) {
            int64_t z = ct_cp_score_elements(cp, r, true, 32),
                    c = ct_cp_score_elements(cp, r, false, 32);
            int64_t want_c = cp == 4 ? contiguous4[r] : contiguous2[r];
            if (z != 528 / cp || c != want_c) {
                snprintf(detail, sizeof detail,
                         "cp %d rank %d: zigzag %lld (want %d), contiguous "
                         "%lld (want %lld)",
                         cp, r, (long long)z, 528 / cp, (long long)c, (long long)want_c);
                good = false;
            }
            total_z += z, total_c += c;
        }
        good = good && total_z == 528 && total_c == 528;
    }
    report(good,
           "causal work per rank at T 32: zigzag 264 x 2 and 132 x 4, contiguous "
           "[136 392] and [36 100 164 228]",
           detail);
}

/* ct_cp_owner inverts ct_cp_position: every local row of every rank maps back to itself. */
static __attribute__((unused)) void owners(void) {
    bool good = true;
    char detail[160] = "";
    for (int cp = 1; cp <= 4; cp *= 2)
        for (int z = 0; z < 2; z++)
            for (int r = 0; r < cp; r++)
                for (int64_t t = 0; t < 6; t++) {
                    int got_r = -1;
                    int64_t got_t = -1, p = ct_cp_position(cp, r, z, 6, t);
                    ct_cp_owner(cp, z, 6, p, &got_r, &got_t);
                    if (got_r != r || got_t != t) {
                        snprintf(detail, sizeof detail,
                                 "cp %d %s: position %lld of rank %d row %lld -> rank %d row %lld",
                                 cp, z ? "zigzag" : "contiguous", (long long)p, r, (long long)t,
                                 got_r, (long long)got_t);
                        good = false;
                    }
                }
    report(good, "ct_cp_owner inverts ct_cp_position (cp 1, 2, 4; zigzag and contiguous)", detail);
}

static void all_cases(ct_backend *ref, ct_backend *be, ct_comm *cp) {
    for (int dt = 0; dt < 2; dt++)
        for (int z = 1; z >= 0; z--)
            for (int nkv = NH; nkv >= NH / 2; nkv /= 2)
                ring_case(ref, be, cp, dt ? CT_DTYPE_BF16 : CT_DTYPE_F32, z, nkv);
}

int main(int argc, char **argv) {
    if (ct_mpi_init(&argc, &argv) != CT_OK) {
        ct_error_print();
        return 1;
    }
    rank = ct_mpi_world_rank();
    world = ct_mpi_world_size();
    ct_backend *cpu = test_backend_new(1);
#ifdef CT_TEST_NCCL
    /* one emulated device per rank (CUEMU_DEVICES), as cmd/ picks them; a cp group through NCCL */
    ct_comm_nccl_set_abort(ct_mpi_abort);
    ct_backend *gpu = ct_cuda_backend_new(ct_mpi_local_rank());
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    ct_comm *cp = ct_comm_nccl_new(ct_comm_mpi_new(dup, "cp", 120.0), gpu, 120.0, false);
    CT_ASSERTF(cp != NULL, "ct_comm_nccl_new: %s", ct_error_message());
    ct_comm_set_stream(cp, gpu); /* sends after the kernels that write their buffers, as a model */
    all_cases(cpu, gpu, cp);
    ct_comm_unset_stream(cp, gpu);
    ct_comm_free(cp);
    ct_backend_free(gpu);
#else
    ct_pctx *pctx;
    if (ct_pctx_new(&pctx, world, 1, 1, 120.0) != CT_OK) {
        ct_error_print();
        return 1;
    }
    ct_comm_set_stream(pctx->world, cpu);
    all_cases(cpu, cpu, pctx->world);
    if (world == 2) balance(), owners();
    ct_comm_unset_stream(pctx->world, cpu);
    ct_pctx_free(pctx);
#endif
    ct_backend_free(cpu);
    ct_mpi_finalize();
    return failures ? 1 : 0;
}
