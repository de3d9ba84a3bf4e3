/*
 * rope.h — the rotary position embedding's frequencies and table, computed on the host (the op
 * itself is ct_rope, backend.h; Llama's MLP width rule is ct_llama_ffn_dim, config.h).
 *
 * RoPE convention, the one cooktrain uses everywhere: pairs are adjacent — dims (2i, 2i+1) of a
 * head rotate together by the angle pos·inv_freq_i, inv_freq_i = theta^(-2i/head_dim), i < hd/2.
 * Hugging Face's checkpoints pair dims (i, i + hd/2) instead; the two agree after a fixed
 * permutation of each head's q and k rows, which import and export apply and nothing else does.
 * The table is computed here once, in double, and stored as fp32: every backend reads the same
 * bytes, so they agree bit for bit on the angles.
 */
#ifndef CT_ROPE_H
#define CT_ROPE_H

#include <stdint.h>

/* Llama 3.1's frequency scaling ("rope_type": "llama3" in Hugging Face's config.json): factor 0
 * leaves the frequencies as they are. Wavelengths 2π/inv_freq shorter than
 * original_max_pos / high_freq_factor are kept, longer than original_max_pos / low_freq_factor
 * divided by factor, and those between blended linearly in original_max_pos / wavelength. */
typedef struct ct_rope_scaling {
    double factor;            /* 8 for Llama 3.1; 0: no scaling */
    double low_freq_factor;   /* 1 */
    double high_freq_factor;  /* 4 */
    int64_t original_max_pos; /* 8192 */
} ct_rope_scaling;

/* inv_freq[i] for i < head_dim/2, scaled as `scaling` says (NULL or factor 0: unscaled). */
void ct_rope_inv_freq(double *inv_freq, int64_t head_dim, double theta,
                      const ct_rope_scaling *scaling);

/* cos_sin (max_pos, head_dim/2, 2): {cos, sin} of pos·inv_freq[i], in double, rounded to fp32.
 * head_dim must be even. */
void ct_rope_table(float *cos_sin, int64_t max_pos, int64_t head_dim, double theta,
                   const ct_rope_scaling *scaling);

#endif /* CT_ROPE_H */
