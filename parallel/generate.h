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

ct_status ct_generate_run(int argc, char **argv);

/*
 * `cooktrain eval DIR --data FILE|GLOB [--samples N]`: the mean per-token loss of the
 * checkpoint's model on the first N samples (default all) of token shards, read in file order
 * (data.h, ct_dataset_fill_in_order) and scored one per forward, summed in double in that order.
 * Prints one line ending "loss X"; another program can rebuild the same batch from the files
 * (test/check_export.py scores the export with PyTorch against it).
 */
ct_status ct_eval_run(int argc, char **argv);

#endif /* CT_PARALLEL_GENERATE_H */
