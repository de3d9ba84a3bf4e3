/*
 * tokenizer.h — byte-level BPE: training, encoding, decoding, and its file format.
 *
 * Tokens 0..255 are the 256 single bytes; token 256+i is merge i (the concatenation of two
 * earlier tokens). Every byte sequence round-trips: decode(encode(x)) == x. Training is
 * deterministic (ties between equally frequent pairs break by the smaller (left, right) token
 * ids). Text is pre-split into chunks (a run of letters/digits with at most one leading space,
 * runs of other bytes, newlines) so merges never cross chunk boundaries, as in GPT-2.
 *
 * File format (little-endian): magic "CTTOKNZR", u32 version, u32 byte-order mark 0x01020304,
 * u32 vocab_size, u32 n_merges, then n_merges × (u32 left, u32 right). vocab_size is always
 * 256 + n_merges, and merge i may only refer to tokens < 256 + i; loading checks both, and the
 * exact file length, and rejects anything else as corrupt (CT_ERR_INPUT naming the file).
 *
 * Pre-split details: "letters/digits" are ASCII letters, ASCII digits and every byte >= 0x80 (so
 * UTF-8 words stay whole); a run of newlines is one chunk; every chunk is cut after 128 bytes,
 * which bounds the cost of encoding one chunk on inputs such as long runs of '='.
 */
#ifndef CT_TOKENIZER_H
#define CT_TOKENIZER_H

#include "core/common.h"

typedef struct ct_tokenizer ct_tokenizer;

/*
 * Trains a tokenizer of vocab_size tokens (>= 256) on text. Merging stops early when no pair
 * occurs at least twice, so ct_tokenizer_vocab_size() can be smaller than asked for on a small
 * corpus (never larger). Pair counts include overlapping occurrences ("aaa" holds (a,a) twice).
 */
ct_status ct_tokenizer_train(ct_tokenizer **out, const uint8_t *text, size_t n, int vocab_size);
ct_status ct_tokenizer_load(ct_tokenizer **out, const char *path);
ct_status ct_tokenizer_save(const ct_tokenizer *tok, const char *path);
void ct_tokenizer_free(ct_tokenizer *tok);

int ct_tokenizer_vocab_size(const ct_tokenizer *tok);

/* Encodes n bytes; returns the number of tokens written to *tokens (malloc'd, caller frees). */
size_t ct_tokenizer_encode(const ct_tokenizer *tok, const uint8_t *text, size_t n,
                           int32_t **tokens);
/*
 * Decodes tokens into a malloc'd buffer (caller frees); *n_out bytes, plus a terminating NUL
 * that *n_out does not count. An id outside [0, vocab_size) — which a model whose vocabulary is
 * larger than the tokenizer's can sample — decodes to U+FFFD (EF BF BD) instead of failing.
 */
uint8_t *ct_tokenizer_decode(const ct_tokenizer *tok, const int32_t *tokens, size_t n_tokens,
                             size_t *n_out);
/* The bytes of one token (pointer into the tokenizer; valid while it lives). */
const uint8_t *ct_tokenizer_token_bytes(const ct_tokenizer *tok, int32_t token, size_t *len);

/* Added: merge i (0 <= i < vocab_size - 256), i.e. token 256 + i = left ++ right. */
void ct_tokenizer_merge(const ct_tokenizer *tok, int i, int32_t *left, int32_t *right);

/*
 * Added: the pre-splitting rule, exposed so tests and tools can reproduce chunking: the length
 * (>= 1) of the chunk that starts at text[i], for i < n. Encoding and training both cut text
 * into chunks by calling this from position 0 on.
 */
size_t ct_tokenizer_chunk_len(const uint8_t *text, size_t n, size_t i);

#endif /* CT_TOKENIZER_H */
