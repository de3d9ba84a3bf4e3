/*
 * generate.h — `cooktrain sample DIR`: text from a checkpoint, on one process and the CPU
 * backend, whatever layout trained it.
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

#endif /* CT_PARALLEL_GENERATE_H */
