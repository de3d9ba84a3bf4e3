/*
 * data.h — token shards on disk and the layout-independent sample order (core/README.md,
 * Determinism).
 *
 * Shard file (little-endian): 64-byte header — magic "CTSHARD1" (8 bytes), u32 version,
 * u32 byte-order mark 0x01020304, u32 token width in bytes (2 or 4), u32 vocab_size,
 * u64 token count, then zero padding to 64 bytes — followed by the tokens.
 *
 * A dataset is one or more shards (a path or a glob, sorted by name). It is cut into samples of
 * seq_len + 1 tokens (inputs and shifted targets) that start every seq_len tokens and never
 * cross a shard boundary. Samples are visited in a seeded random-access order: global sample
 * index g lies in epoch e = g / n_samples, at position g % n_samples of the permutation of epoch
 * e (a function of (seed, e) only). The training position is one number, g, which is what
 * checkpoints store; step s of a run with global batch G uses g in [s·G, (s+1)·G).
 *
 * The permutation of epoch e is Fisher–Yates whose i-th draw is splitmix64-hashed from
 * (seed, e, i), so it depends on (seed, e, n_samples) only. A dataset holds at most 2^32 - 1
 * samples. Shards are read little-endian on any host.
 */
#ifndef CT_DATA_H
#define CT_DATA_H

#include "core/common.h"

#define CT_SHARD_HEADER_BYTES 64

/* Writes tokens (each < vocab_size) as one shard; width 2 if vocab_size <= 65536 else 4. */
ct_status ct_shard_write(const char *path, const int32_t *tokens, size_t n_tokens, int vocab_size);

typedef struct ct_dataset ct_dataset;

/*
 * Opens (memory-maps) every shard matching `pattern` and checks each header: bad magic, version,
 * byte order, width, or a file shorter than its header says → CT_ERR_INPUT naming the file.
 * Also rejects a token >= vocab_size found in a header's vocab_size larger than `vocab_size`
 * (the model's), and a dataset with no complete sample.
 */
ct_status ct_dataset_open(ct_dataset **out, const char *pattern, int64_t seq_len,
                          int64_t vocab_size, uint64_t seed);
void ct_dataset_free(ct_dataset *ds);

int64_t ct_dataset_n_samples(const ct_dataset *ds);
int64_t ct_dataset_n_tokens(const ct_dataset *ds);

/*
 * Fills inputs and targets (each n_seq × seq_len, row-major) with the samples of global indices
 * [first, first + n_seq) in the dataset's order. Host memory. Every token read is checked
 * against its shard's vocab_size: a token out of range (a corrupt shard) gives CT_ERR_INPUT
 * naming the file, position and sample (the buffers are then partly filled).
 */
ct_status ct_dataset_fill(ct_dataset *ds, int64_t first, int64_t n_seq, int32_t *inputs,
                          int32_t *targets);

/*
 * The same for samples [first, first + n_seq) in file order, with no shuffle: shards by name,
 * and inside a shard its sample k is tokens [k·seq_len, k·seq_len + seq_len]. What `cooktrain
 * eval` reads, so another program can rebuild the batch from the files alone.
 * first + n_seq <= n_samples.
 */
ct_status ct_dataset_fill_in_order(const ct_dataset *ds, int64_t first, int64_t n_seq,
                                   int32_t *inputs, int32_t *targets);

/*
 * Added: the sample (in [0, n_samples), shards in name order, samples in file order) that global
 * index g >= 0 visits. The permutation of g's epoch is computed on first use and cached until g
 * moves to another epoch (one u32 per sample), so walk g forward, as training does.
 */
int64_t ct_dataset_sample_at(ct_dataset *ds, int64_t g);

/*
 * Reads every token once and checks it is below its shard's header vocab_size; CT_ERR_INPUT
 * naming the file and position otherwise. Costs one pass over all the data, so training does
 * not call it: ct_dataset_fill checks the tokens of each sample it reads instead.
 */
ct_status ct_dataset_check_tokens(const ct_dataset *ds);

#endif /* CT_DATA_H */
