/*
 * rng.h — counter-based random numbers: every value is a pure function of (seed, stream,
 * index), with no state to carry. This is what makes initialisation layout-independent
 * (core/README.md, Determinism): a TP or ZeRO shard asks for the values of its own global element
 * indices and gets exactly the bytes the single-process run has.
 *
 * The mixer is splitmix64's finaliser applied to a key built from seed and stream; quality is
 * ample for weight initialisation and data shuffling (it passes BigCrush as a counter-mode
 * generator), and it is trivially reproducible on any backend.
 */
#ifndef CT_RNG_H
#define CT_RNG_H

#include <stdint.h>

/* 64-bit FNV-1a of a string: turns a parameter name into a stream id. */
uint64_t ct_rng_hash_name(const char *name);
/* A uniformly distributed 64-bit value for (seed, stream, index). */
uint64_t ct_rng_u64(uint64_t seed, uint64_t stream, uint64_t index);
/* Uniform in [0, 1) with 53 bits. */
double ct_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);
/* Standard normal (Box–Muller on two 32-bit halves of one draw). */
double ct_rng_normal(uint64_t seed, uint64_t stream, uint64_t index);

#endif /* CT_RNG_H */
