/*
 * prepare.h — the `cooktrain prepare` subcommand: read text, train a byte-level BPE tokenizer,
 * and write it with the tokenized text as a train shard and a validation shard.
 *
 *   cooktrain prepare --input FILE|DIR... --out DIR [--vocab-size N] [--val-fraction F]
 *                     [--byte-level]
 *
 *   --input        one or more files or directories (the option may also repeat). A directory
 *                  contributes every regular file directly inside it whose name has no '.', in
 *                  name order (so `--input /usr/share/games/fortunes` takes the fortune texts
 *                  and skips the .dat indexes and .u8 links). Files are read whole and joined
 *                  with one '\n' between consecutive files.
 *   --out          output directory, created (with parents) if needed. Receives tokenizer.bin,
 *                  train.bin and val.bin, each written as NAME.tmp and renamed into place.
 *   --vocab-size   tokenizer vocabulary, default 4096 (>= 256).
 *   --val-fraction the last fraction of the joined text goes to val.bin (default 0.05, in
 *                  [0, 1)); the cut is moved forward to just after a newline (or back, if no
 *                  newline follows) so no line is split. The tokenizer trains on the train part
 *                  only, so validation text stays unseen.
 *   --byte-level   no BPE: every byte is a token, the vocabulary 256 (tests with tiny
 *                  vocabularies); no tokenizer.bin is written.
 *
 * The command line is parsed in cmd/ (cmd/args.h), as every subcommand's. A summary goes to
 * stdout.
 */
#ifndef CT_PREPARE_H
#define CT_PREPARE_H

#include "core/common.h"

/* The options above (cmd/ parses them); CT_PREPARE_DEFAULTS fills the defaults. */
typedef struct ct_prepare_options {
    const char *const *inputs; /* files or directories, n_inputs of them */
    int n_inputs;
    const char *out_dir;
    int vocab_size;
    double val_fraction;
    bool byte_level;      /* no BPE: every byte is a token (tests with tiny vocabularies) */
    bool replace_unknown; /* byte_level: a byte the vocabulary cannot hold (>= vocab_size), or a
                             control byte other than tab and newline, becomes a space instead of
                             an error */
} ct_prepare_options;
#define CT_PREPARE_DEFAULTS ((ct_prepare_options){.vocab_size = 4096, .val_fraction = 0.05})

/*
 * Runs `prepare`. Options out of range (no input, no output directory, a vocabulary below 256
 * without byte_level), unreadable inputs → CT_ERR_INPUT with a hint; nothing exits.
 */
ct_status ct_prepare_run(const ct_prepare_options *options);

#endif /* CT_PREPARE_H */
