/*
 * prepare.h — the `cooktrain prepare` subcommand: read text, train a byte-level BPE tokenizer,
 * and write it with the tokenized text as a train shard and a validation shard.
 *
 *   cooktrain prepare --input FILE|DIR... --out DIR [--vocab-size N] [--val-fraction F]
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
 *
 * Options also take the --name=value form. A summary goes to stdout.
 */
#ifndef CT_PREPARE_H
#define CT_PREPARE_H

#include "common.h"

/*
 * Runs `prepare` with the options that follow the subcommand name (argv[0] is the first option,
 * not "prepare"). Bad arguments, unreadable inputs → CT_ERR_INPUT with a usage hint; nothing
 * exits. `--help` prints the usage to stdout and returns CT_OK.
 */
ct_status ct_prepare_run(int argc, char **argv);

#endif /* CT_PREPARE_H */
