/*
 * rope.c — RoPE's frequencies and table (rope.h).
 */
#include "rope.h"

#include "core/common.h"

#include <math.h>
#include <stdlib.h>

void ct_rope_inv_freq(double *inv_freq, int64_t head_dim, double theta,
                      const ct_rope_scaling *scaling) {
    CT_ASSERTF(head_dim > 0 && head_dim % 2 == 0 && theta > 1.0,
               "rope: head_dim %lld must be even and theta %g above 1", (long long)head_dim, theta);
    const double two_pi = 6.283185307179586;
    for (int64_t i = 0; i < head_dim / 2; i++) {
        double f = pow(theta, -2.0 * (double)i / (double)head_dim);
        if (scaling && scaling->factor > 0) {
            double old = (double)scaling->original_max_pos, wavelen = two_pi / f;
            double low_wavelen = old / scaling->low_freq_factor;
            double high_wavelen = old / scaling->high_freq_factor;
            if (wavelen > low_wavelen) {
                f /= scaling->factor;
            } else if (wavelen >= high_wavelen) {
                double smooth = (old / wavelen - scaling->low_freq_factor) /
                                (scaling->high_freq_factor - scaling->low_freq_factor);
                f = (1.0 - smooth) * f / scaling->factor + smooth * f;
            }
        }
        inv_freq[i] = f;
    }
}

void ct_rope_table(float *cos_sin, int64_t max_pos, int64_t head_dim, double theta,
                   const ct_rope_scaling *scaling) {
    int64_t half = head_dim / 2;
    double *inv_freq = ct_xmalloc((size_t)CT_MAX(half, 1) * sizeof *inv_freq);
    ct_rope_inv_freq(inv_freq, head_dim, theta, scaling);
    for (int64_t p = 0; p < max_pos; p++)
        for (int64_t i = 0; i < half; i++) {
            double angle = (double)p * inv_freq[i];
            cos_sin[(p * half + i) * 2] = (float)cos(angle);
            cos_sin[(p * half + i) * 2 + 1] = (float)sin(angle);
        }
    free(inv_freq);
}
