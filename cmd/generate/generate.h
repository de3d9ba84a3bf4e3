/*
 * generate.h — `cooktrain sample DIR` and `cooktrain eval DIR`: text from a checkpoint and its
 * loss on a token file, on one process and the CPU backend, whatever layout trained it.
 *
 *   cooktrain sample DIR [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K]
 *                        [--seed S] [--tokenizer FILE]
 *
 * The model's shape and the tokenizer path come from the config the checkpoint carries; the
 * weights are loaded as a world-size-1 run would resume them (checkpoint_io.h), and the draw is
 * the sampler's (sampler.h): the same seed gives the same text as the sample a training run in
 * any layout prints with the same weights, prompt and options.
 */
#ifndef CT_PARALLEL_GENERATE_H
#define CT_PARALLEL_GENERATE_H

#include "core/common.h"
#include "cmd/generate/sampler.h"

/* `cooktrain sample`'s options (cmd/ parses them); CT_GENERATE_DEFAULTS fills the defaults. */
typedef struct ct_generate_options {
    const char *dir;       /* the checkpoint (a checkpoint.dir/step-N directory) */
    const char *prompt;    /* the text the sample continues ("" : from nothing) */
    const char *tokenizer; /* NULL: the one the checkpoint's config names (data.tokenizer) */
    int64_t tokens;        /* tokens to draw */
    uint64_t seed;
    ct_sample_options sample; /* temperature, top-k (0: off) */
} ct_generate_options;
#define CT_GENERATE_DEFAULTS                                                                       \
    ((ct_generate_options){.prompt = "", .tokens = 64, .seed = 1234, .sample = {1.0, 0}})

ct_status ct_generate_run(const ct_generate_options *options);

/*
 * `cooktrain eval DIR --data FILE|GLOB [--samples N]`: the mean per-token loss of the
 * checkpoint's model on the first N samples (default all) of token shards, read in file order
 * (data.h, ct_dataset_fill_in_order) and scored one per forward, summed in double in that order.
 * Prints one line ending "loss X"; another program can rebuild the same batch from the files
 * (test/tools/check_export.py scores the export with PyTorch against it). samples <= 0: all.
 */
ct_status ct_eval_run(const char *dir, const char *data, int64_t samples);

#endif /* CT_PARALLEL_GENERATE_H */
