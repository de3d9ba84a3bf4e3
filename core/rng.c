/* rng.c — counter-based generator; see rng.h. */
#include "rng.h"

#include <math.h>

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t ct_rng_hash_name(const char *name) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ULL;
    }
    return h;
}

uint64_t ct_rng_u64(uint64_t seed, uint64_t stream, uint64_t index) {
    /* Two rounds: the key separates (seed, stream) pairs, the second mixes the counter in. */
    uint64_t key = mix64(seed * 0x9e3779b97f4a7c15ULL + mix64(stream + 0x632be59bd9b4e019ULL));
    return mix64(key + (index + 1) * 0x9e3779b97f4a7c15ULL);
}

double ct_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    return (double)(ct_rng_u64(seed, stream, index) >> 11) * 0x1.0p-53;
}

double ct_rng_normal(uint64_t seed, uint64_t stream, uint64_t index) {
    uint64_t x = ct_rng_u64(seed, stream, index);
    double u1 = ((double)(x >> 32) + 1.0) * 0x1.0p-32;   /* (0, 1]: log is finite */
    double u2 = (double)(x & 0xffffffffULL) * 0x1.0p-32; /* [0, 1) */
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
