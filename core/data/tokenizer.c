/*
 * tokenizer.c — byte-level BPE: pre-splitting, training, encoding, decoding, file I/O.
 * See tokenizer.h for the contract and the file format.
 *
 * Training works on *unique* chunks weighted by how often they occur, never on the raw text:
 * English has a few tens of thousands of distinct words, so after one counting pass the merge
 * loop is independent of the corpus size. Pair counts are updated incrementally: each pair
 * keeps a list of the chunks that (may) contain it, so a merge only rewrites the chunks that
 * hold the merged pair. The best pair comes from a max-heap with lazy deletion; that is exact
 * because a pair's count never grows after the merge that created it (only pairs that contain
 * the newest token can gain occurrences), so a heap entry whose count is still current is the
 * true maximum.
 *
 * Encoding splits the text the same way, caches the tokens of each distinct chunk, and encodes
 * a new chunk by repeatedly merging its lowest-rank pair. That equals replaying the merges in
 * training order: once the lowest-rank pair present is r, no pair of lower rank can appear
 * later, because merges only create pairs that contain tokens newer than r.
 */
#include "tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TOK_MAGIC "CTTOKNZR"
#define TOK_VERSION 1u
#define TOK_BOM 0x01020304u
#define TOK_HEADER_BYTES 24
/* A chunk longer than this is cut into pieces of this size: bounds the cost of encoding one
 * chunk (quadratic in its length) on inputs like long runs of '=' or text without spaces. */
#define TOK_CHUNK_MAX 128
/* Upper bounds accepted when loading, so a corrupt file cannot ask for absurd allocations
 * (merges of a token with itself double its length each time). */
#define TOK_MAX_VOCAB (1 << 24)
#define TOK_MAX_TOKEN_BYTES (1 << 16)

struct ct_tokenizer {
    int vocab_size; /* 256 + n_merges */
    int n_merges;
    uint32_t *merges;  /* (n_merges, 2): left, right of merge i = token 256 + i */
    uint32_t *tok_off; /* (vocab_size,): offset of each token's bytes in `bytes` */
    uint32_t *tok_len; /* (vocab_size,) */
    uint8_t *bytes;
    /* pair (left << 32 | right) → merge rank, open addressing, power-of-two capacity */
    uint64_t *rank_keys;
    int32_t *rank_vals;
    size_t rank_cap;
};

/* ---- small helpers -------------------------------------------------------------------------- */

static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    return mix64(h);
}

static inline uint64_t pair_key(uint32_t left, uint32_t right) {
    return (uint64_t)left << 32 | right;
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* ---- pre-splitting -------------------------------------------------------------------------- */

/* Letters and digits; bytes >= 0x80 count as letters so UTF-8 words stay in one chunk. */
static inline bool is_word_byte(uint8_t c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c >= 0x80;
}

/*
 * Length of the chunk starting at text[i] (i < n). Chunks: a run of newlines; a run of word
 * bytes with at most one leading space; a run of other bytes, which leaves a space that
 * directly precedes a word to that word (so " the" is one chunk, as in GPT-2).
 */
size_t ct_tokenizer_chunk_len(const uint8_t *text, size_t n, size_t i) {
    size_t j = i;
    size_t end = n - i > TOK_CHUNK_MAX ? i + TOK_CHUNK_MAX : n;
    uint8_t c = text[i];
    if (c == '\n') {
        while (j < end && text[j] == '\n') j++;
    } else if (is_word_byte(c) || (c == ' ' && i + 1 < end && is_word_byte(text[i + 1]))) {
        j++;
        while (j < end && is_word_byte(text[j])) j++;
    } else {
        j++;
        while (j < end) {
            uint8_t d = text[j];
            if (d == '\n' || is_word_byte(d)) break;
            if (d == ' ' && j + 1 < n && is_word_byte(text[j + 1])) break;
            j++;
        }
    }
    return j - i;
}

/* ---- a map from byte strings (pointers into caller memory) to indices ----------------------- */

typedef struct str_map {
    uint32_t *slots; /* index+1 into entries; 0 = empty */
    size_t cap;      /* power of two */
    size_t n;
    const uint8_t **ptr; /* (n,) */
    uint32_t *len;       /* (n,) */
    uint64_t *hash;      /* (n,) */
    size_t entries_cap;
} str_map;

static void str_map_init(str_map *m, size_t expected) {
    m->cap = pow2_at_least(expected * 2);
    m->slots = ct_xcalloc(m->cap, sizeof *m->slots);
    m->n = 0;
    m->entries_cap = expected > 16 ? expected : 16;
    m->ptr = ct_xmalloc(m->entries_cap * sizeof *m->ptr);
    m->len = ct_xmalloc(m->entries_cap * sizeof *m->len);
    m->hash = ct_xmalloc(m->entries_cap * sizeof *m->hash);
}

static void str_map_release(str_map *m) {
    free(m->slots);
    free(m->ptr);
    free(m->len);
    free(m->hash);
    memset(m, 0, sizeof *m);
}

static void str_map_grow(str_map *m) {
    size_t cap = m->cap * 2;
    uint32_t *slots = ct_xcalloc(cap, sizeof *slots);
    for (size_t e = 0; e < m->n; e++) {
        size_t s = m->hash[e] & (cap - 1);
        while (slots[s]) s = (s + 1) & (cap - 1);
        slots[s] = (uint32_t)(e + 1);
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
}

/* Returns the index of (p, len), inserting it if new (*inserted tells which). */
static size_t str_map_get(str_map *m, const uint8_t *p, uint32_t len, bool *inserted) {
    uint64_t h = hash_bytes(p, len);
    size_t s = h & (m->cap - 1);
    while (m->slots[s]) {
        size_t e = m->slots[s] - 1;
        if (m->hash[e] == h && m->len[e] == len && memcmp(m->ptr[e], p, len) == 0) {
            *inserted = false;
            return e;
        }
        s = (s + 1) & (m->cap - 1);
    }
    CT_ASSERTF(m->n < UINT32_MAX - 1, "too many distinct chunks");
    if (m->n == m->entries_cap) {
        m->entries_cap *= 2;
        m->ptr = realloc(m->ptr, m->entries_cap * sizeof *m->ptr);
        m->len = realloc(m->len, m->entries_cap * sizeof *m->len);
        m->hash = realloc(m->hash, m->entries_cap * sizeof *m->hash);
        CT_ASSERTF(m->ptr && m->len && m->hash, "out of host memory");
    }
    size_t e = m->n++;
    m->ptr[e] = p;
    m->len[e] = len;
    m->hash[e] = h;
    m->slots[s] = (uint32_t)(e + 1);
    *inserted = true;
    if (m->n * 2 > m->cap) str_map_grow(m);
    return e;
}

/* ---- building a tokenizer from its merges --------------------------------------------------- */

static int32_t rank_lookup(const ct_tokenizer *tok, uint32_t left, uint32_t right) {
    uint64_t key = pair_key(left, right);
    size_t s = mix64(key) & (tok->rank_cap - 1);
    while (tok->rank_keys[s] != UINT64_MAX) {
        if (tok->rank_keys[s] == key) return tok->rank_vals[s];
        s = (s + 1) & (tok->rank_cap - 1);
    }
    return -1;
}

/*
 * Takes ownership of `merges` (n_merges pairs, already validated to refer to earlier tokens)
 * and derives the token bytes and the rank table. Returns NULL if a token would be longer than
 * TOK_MAX_TOKEN_BYTES (only a corrupt file can ask for that).
 */
static ct_tokenizer *tok_build(uint32_t *merges, int n_merges) {
    ct_tokenizer *tok = ct_xcalloc(1, sizeof *tok);
    tok->n_merges = n_merges;
    tok->vocab_size = 256 + n_merges;
    tok->merges = merges;
    tok->tok_off = ct_xmalloc((size_t)tok->vocab_size * sizeof *tok->tok_off);
    tok->tok_len = ct_xmalloc((size_t)tok->vocab_size * sizeof *tok->tok_len);
    size_t total = 256;
    for (int t = 0; t < 256; t++) tok->tok_len[t] = 1;
    for (int i = 0; i < n_merges; i++) {
        uint32_t len = tok->tok_len[merges[2 * i]] + tok->tok_len[merges[2 * i + 1]];
        if (len > TOK_MAX_TOKEN_BYTES) {
            tok->vocab_size = 256 + i; /* so free() sees consistent sizes */
            ct_tokenizer_free(tok);
            return NULL;
        }
        tok->tok_len[256 + i] = len;
        total += len;
    }
    tok->bytes = ct_xmalloc(total);
    for (int t = 0; t < 256; t++) {
        tok->bytes[t] = (uint8_t)t;
        tok->tok_off[t] = (uint32_t)t;
    }
    size_t off = 256;
    for (int i = 0; i < n_merges; i++) {
        uint32_t l = merges[2 * i], r = merges[2 * i + 1];
        tok->tok_off[256 + i] = (uint32_t)off;
        memcpy(tok->bytes + off, tok->bytes + tok->tok_off[l], tok->tok_len[l]);
        memcpy(tok->bytes + off + tok->tok_len[l], tok->bytes + tok->tok_off[r], tok->tok_len[r]);
        off += tok->tok_len[l] + tok->tok_len[r];
    }
    tok->rank_cap = pow2_at_least((size_t)n_merges * 2 + 2);
    tok->rank_keys = ct_xmalloc(tok->rank_cap * sizeof *tok->rank_keys);
    tok->rank_vals = ct_xmalloc(tok->rank_cap * sizeof *tok->rank_vals);
    memset(tok->rank_keys, 0xff, tok->rank_cap * sizeof *tok->rank_keys);
    for (int i = 0; i < n_merges; i++) {
        uint64_t key = pair_key(merges[2 * i], merges[2 * i + 1]);
        size_t s = mix64(key) & (tok->rank_cap - 1);
        while (tok->rank_keys[s] != UINT64_MAX && tok->rank_keys[s] != key)
            s = (s + 1) & (tok->rank_cap - 1);
        /* A duplicated merge can only come from a hand-made file; the first rank wins, which is
         * what replaying the merges in order would do (the later one never finds its pair). */
        if (tok->rank_keys[s] == UINT64_MAX) {
            tok->rank_keys[s] = key;
            tok->rank_vals[s] = i;
        }
    }
    return tok;
}

void ct_tokenizer_free(ct_tokenizer *tok) {
    if (!tok) return;
    free(tok->merges);
    free(tok->tok_off);
    free(tok->tok_len);
    free(tok->bytes);
    free(tok->rank_keys);
    free(tok->rank_vals);
    free(tok);
}

int ct_tokenizer_vocab_size(const ct_tokenizer *tok) {
    return tok->vocab_size;
}

const uint8_t *ct_tokenizer_token_bytes(const ct_tokenizer *tok, int32_t token, size_t *len) {
    CT_ASSERTF(token >= 0 && token < tok->vocab_size, "token %d outside vocabulary of %d",
               (int)token, tok->vocab_size);
    *len = tok->tok_len[token];
    return tok->bytes + tok->tok_off[token];
}

void ct_tokenizer_merge(const ct_tokenizer *tok, int i, int32_t *left, int32_t *right) {
    CT_ASSERTF(i >= 0 && i < tok->n_merges, "merge %d outside [0, %d)", i, tok->n_merges);
    *left = (int32_t)tok->merges[2 * i];
    *right = (int32_t)tok->merges[2 * i + 1];
}

/* ---- training ------------------------------------------------------------------------------- */

typedef struct pair_info {
    uint64_t key;
    int64_t count;   /* weighted occurrences over all unique chunks */
    int32_t *chunks; /* chunks that contained this pair at some point (may be stale) */
    int32_t n_chunks, cap_chunks;
    int32_t queued; /* merge step at which it was last queued for a heap push, plus one */
} pair_info;

typedef struct heap_entry {
    int64_t count;
    uint32_t left, right;
} heap_entry;

typedef struct trainer {
    /* unique chunks */
    size_t n_chunks;
    int64_t *weight;   /* (n_chunks,) occurrences in the text */
    size_t *seq_off;   /* (n_chunks,) offset into seq */
    uint32_t *seq_len; /* (n_chunks,) current length in tokens (shrinks as merges apply) */
    int32_t *stamp;    /* (n_chunks,) last merge step that visited the chunk, plus one */
    uint32_t *seq;     /* tokens of all chunks */
    /* pairs: key → index into pairs */
    pair_info *pairs;
    size_t n_pairs, cap_pairs;
    int32_t *pair_slots; /* index+1; 0 = empty */
    size_t slot_cap;
    /* max-heap of candidate pairs */
    heap_entry *heap;
    size_t heap_n, heap_cap;
    /* pairs that contain the newest token, to push once the merge is done */
    int32_t *fresh;
    size_t n_fresh, cap_fresh;
} trainer;

static void pair_slots_rebuild(trainer *t, size_t cap) {
    free(t->pair_slots);
    t->slot_cap = cap;
    t->pair_slots = ct_xcalloc(cap, sizeof *t->pair_slots);
    for (size_t p = 0; p < t->n_pairs; p++) {
        size_t s = mix64(t->pairs[p].key) & (cap - 1);
        while (t->pair_slots[s]) s = (s + 1) & (cap - 1);
        t->pair_slots[s] = (int32_t)(p + 1);
    }
}

/* The index of pair (left, right), created with count 0 if new. */
static int32_t pair_get(trainer *t, uint32_t left, uint32_t right) {
    uint64_t key = pair_key(left, right);
    size_t s = mix64(key) & (t->slot_cap - 1);
    while (t->pair_slots[s]) {
        int32_t p = t->pair_slots[s] - 1;
        if (t->pairs[p].key == key) return p;
        s = (s + 1) & (t->slot_cap - 1);
    }
    if (t->n_pairs == t->cap_pairs) {
        t->cap_pairs = t->cap_pairs ? t->cap_pairs * 2 : 1024;
        t->pairs = realloc(t->pairs, t->cap_pairs * sizeof *t->pairs);
        CT_ASSERTF(t->pairs, "out of host memory");
    }
    int32_t p = (int32_t)t->n_pairs++;
    t->pairs[p] = (pair_info){.key = key};
    t->pair_slots[s] = p + 1;
    if (t->n_pairs * 2 > t->slot_cap) pair_slots_rebuild(t, t->slot_cap * 2);
    return p;
}

static void pair_add_chunk(pair_info *pi, int32_t chunk) {
    /* Chunks are visited in order within one pass, so checking the tail removes duplicates. */
    if (pi->n_chunks && pi->chunks[pi->n_chunks - 1] == chunk) return;
    if (pi->n_chunks == pi->cap_chunks) {
        pi->cap_chunks = pi->cap_chunks ? pi->cap_chunks * 2 : 4;
        pi->chunks = realloc(pi->chunks, (size_t)pi->cap_chunks * sizeof *pi->chunks);
        CT_ASSERTF(pi->chunks, "out of host memory");
    }
    pi->chunks[pi->n_chunks++] = chunk;
}

/* Heap order: higher count first, then smaller (left, right) — the documented tie-break. */
static inline bool heap_before(const heap_entry *a, const heap_entry *b) {
    if (a->count != b->count) return a->count > b->count;
    if (a->left != b->left) return a->left < b->left;
    return a->right < b->right;
}

static void heap_push(trainer *t, heap_entry e) {
    if (t->heap_n == t->heap_cap) {
        t->heap_cap = t->heap_cap ? t->heap_cap * 2 : 1024;
        t->heap = realloc(t->heap, t->heap_cap * sizeof *t->heap);
        CT_ASSERTF(t->heap, "out of host memory");
    }
    size_t i = t->heap_n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!heap_before(&e, &t->heap[parent])) break;
        t->heap[i] = t->heap[parent];
        i = parent;
    }
    t->heap[i] = e;
}

static heap_entry heap_pop(trainer *t) {
    heap_entry top = t->heap[0];
    heap_entry last = t->heap[--t->heap_n];
    size_t i = 0, n = t->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap_before(&t->heap[c + 1], &t->heap[c])) c++;
        if (!heap_before(&t->heap[c], &last)) break;
        t->heap[i] = t->heap[c];
        i = c;
    }
    if (n) t->heap[i] = last;
    return top;
}

static void trainer_release(trainer *t) {
    free(t->weight);
    free(t->seq_off);
    free(t->seq_len);
    free(t->stamp);
    free(t->seq);
    for (size_t p = 0; p < t->n_pairs; p++) free(t->pairs[p].chunks);
    free(t->pairs);
    free(t->pair_slots);
    free(t->heap);
    free(t->fresh);
}

/* Counts the distinct chunks of the text and lays out their bytes as initial token sequences. */
static void trainer_load_chunks(trainer *t, const uint8_t *text, size_t n) {
    str_map m;
    str_map_init(&m, 1 << 14);
    size_t cap_w = 1 << 14;
    t->weight = ct_xmalloc(cap_w * sizeof *t->weight);
    for (size_t i = 0; i < n;) {
        size_t len = ct_tokenizer_chunk_len(text, n, i);
        bool inserted;
        size_t e = str_map_get(&m, text + i, (uint32_t)len, &inserted);
        if (inserted) {
            if (e == cap_w) {
                cap_w *= 2;
                t->weight = realloc(t->weight, cap_w * sizeof *t->weight);
                CT_ASSERTF(t->weight, "out of host memory");
            }
            t->weight[e] = 0;
        }
        t->weight[e]++;
        i += len;
    }
    t->n_chunks = m.n;
    t->seq_off = ct_xmalloc((m.n + 1) * sizeof *t->seq_off);
    t->seq_len = ct_xmalloc((m.n + 1) * sizeof *t->seq_len);
    t->stamp = ct_xcalloc(m.n + 1, sizeof *t->stamp);
    size_t total = 0;
    for (size_t c = 0; c < m.n; c++) total += m.len[c];
    t->seq = ct_xmalloc((total + 1) * sizeof *t->seq);
    size_t off = 0;
    for (size_t c = 0; c < m.n; c++) {
        t->seq_off[c] = off;
        t->seq_len[c] = m.len[c];
        for (uint32_t k = 0; k < m.len[c]; k++) t->seq[off + k] = m.ptr[c][k];
        off += m.len[c];
    }
    str_map_release(&m);
}

static void trainer_count_pairs(trainer *t) {
    pair_slots_rebuild(t, 1 << 16);
    for (size_t c = 0; c < t->n_chunks; c++) {
        const uint32_t *s = t->seq + t->seq_off[c];
        for (uint32_t k = 0; k + 1 < t->seq_len[c]; k++) {
            int32_t p = pair_get(t, s[k], s[k + 1]);
            t->pairs[p].count += t->weight[c];
            pair_add_chunk(&t->pairs[p], (int32_t)c);
        }
    }
    for (size_t p = 0; p < t->n_pairs; p++) {
        uint64_t key = t->pairs[p].key;
        heap_push(t, (heap_entry){t->pairs[p].count, (uint32_t)(key >> 32), (uint32_t)key});
    }
}

/*
 * Applies merge `step` (left, right) → z to every chunk that holds the pair. A rewritten chunk
 * has all its old pair counts subtracted and its new ones added: simpler to get right than
 * patching neighbours (overlaps like "aaa" and back-to-back matches), and chunks are short.
 */
static void trainer_apply_merge(trainer *t, int step, uint32_t left, uint32_t right, uint32_t z) {
    int32_t pidx = pair_get(t, left, right);
    /* New pairs all contain z, so nothing appends to this pair's list while we walk it; copy
     * the pointer and length anyway because pair_get may move the pairs array. */
    int32_t *list = t->pairs[pidx].chunks;
    int32_t n_list = t->pairs[pidx].n_chunks;
    t->n_fresh = 0;
    for (int32_t li = 0; li < n_list; li++) {
        int32_t c = list[li];
        if (t->stamp[c] == step + 1) continue;
        t->stamp[c] = step + 1;
        uint32_t *s = t->seq + t->seq_off[c];
        uint32_t len = t->seq_len[c];
        bool found = false;
        for (uint32_t k = 0; k + 1 < len; k++) {
            if (s[k] == left && s[k + 1] == right) {
                found = true;
                break;
            }
        }
        if (!found) continue; /* stale entry: an earlier merge consumed the pair here */
        int64_t w = t->weight[c];
        for (uint32_t k = 0; k + 1 < len; k++) t->pairs[pair_get(t, s[k], s[k + 1])].count -= w;
        uint32_t o = 0;
        for (uint32_t k = 0; k < len;) {
            if (k + 1 < len && s[k] == left && s[k + 1] == right) {
                s[o++] = z;
                k += 2;
            } else {
                s[o++] = s[k++];
            }
        }
        t->seq_len[c] = len = o;
        for (uint32_t k = 0; k + 1 < len; k++) {
            int32_t p = pair_get(t, s[k], s[k + 1]);
            pair_info *pi = &t->pairs[p];
            pi->count += w;
            if (s[k] == z || s[k + 1] == z) {
                pair_add_chunk(pi, c);
                if (pi->queued != step + 1) {
                    pi->queued = step + 1;
                    if (t->n_fresh == t->cap_fresh) {
                        t->cap_fresh = t->cap_fresh ? t->cap_fresh * 2 : 256;
                        t->fresh = realloc(t->fresh, t->cap_fresh * sizeof *t->fresh);
                        CT_ASSERTF(t->fresh, "out of host memory");
                    }
                    t->fresh[t->n_fresh++] = p;
                }
            }
        }
    }
    for (size_t f = 0; f < t->n_fresh; f++) {
        const pair_info *pi = &t->pairs[t->fresh[f]];
        heap_push(t, (heap_entry){pi->count, (uint32_t)(pi->key >> 32), (uint32_t)pi->key});
    }
}

ct_status ct_tokenizer_train(ct_tokenizer **out, const uint8_t *text, size_t n, int vocab_size) {
    *out = NULL;
    if (vocab_size < 256 || vocab_size > TOK_MAX_VOCAB) {
        ct_error(CT_ERR_INPUT, "tokenizer vocab_size=%d is out of range [256, %d]", vocab_size,
                 TOK_MAX_VOCAB);
        ct_hint("the 256 byte tokens come first; ask for e.g. --vocab-size 4096");
        return CT_ERR_INPUT;
    }
    int max_merges = vocab_size - 256;
    uint32_t *merges = ct_xmalloc(((size_t)max_merges + 1) * 2 * sizeof *merges);
    int n_merges = 0;

    trainer t = {0};
    trainer_load_chunks(&t, text, n);
    trainer_count_pairs(&t);
    while (n_merges < max_merges && t.heap_n > 0) {
        heap_entry e = heap_pop(&t);
        int64_t current = t.pairs[pair_get(&t, e.left, e.right)].count;
        if (current != e.count) { /* stale: counts only shrink, so re-queue the true count */
            if (current > 0) heap_push(&t, (heap_entry){current, e.left, e.right});
            continue;
        }
        /* A pair seen once gains nothing from a merge; stopping here keeps the vocabulary to
         * tokens the corpus actually repeats (vocab_size is then smaller than requested). */
        if (current < 2) break;
        uint32_t z = 256u + (uint32_t)n_merges;
        merges[2 * n_merges] = e.left;
        merges[2 * n_merges + 1] = e.right;
        trainer_apply_merge(&t, n_merges, e.left, e.right, z);
        n_merges++;
    }
    trainer_release(&t);
    *out = tok_build(merges, n_merges);
    CT_ASSERT(*out != NULL); /* trained tokens are at most TOK_CHUNK_MAX bytes */
    return CT_OK;
}

/* ---- encoding and decoding ------------------------------------------------------------------ */

/* Encodes one chunk into out (room for len tokens); returns the token count. */
static uint32_t encode_chunk(const ct_tokenizer *tok, const uint8_t *p, uint32_t len,
                             int32_t *out) {
    for (uint32_t k = 0; k < len; k++) out[k] = p[k];
    uint32_t n = len;
    while (n >= 2) {
        int32_t best = INT32_MAX;
        for (uint32_t k = 0; k + 1 < n; k++) {
            int32_t r = rank_lookup(tok, (uint32_t)out[k], (uint32_t)out[k + 1]);
            if (r >= 0 && r < best) best = r;
        }
        if (best == INT32_MAX) break;
        int32_t left = (int32_t)tok->merges[2 * best], right = (int32_t)tok->merges[2 * best + 1];
        int32_t z = 256 + best;
        uint32_t o = 0;
        for (uint32_t k = 0; k < n;) {
            if (k + 1 < n && out[k] == left && out[k + 1] == right) {
                out[o++] = z;
                k += 2;
            } else {
                out[o++] = out[k++];
            }
        }
        n = o;
    }
    return n;
}

size_t ct_tokenizer_encode(const ct_tokenizer *tok, const uint8_t *text, size_t n,
                           int32_t **tokens) {
    size_t cap = n / 3 + 64;
    int32_t *res = ct_xmalloc(cap * sizeof *res);
    size_t n_res = 0;
    /* cache: distinct chunk → its tokens in `cache_toks` */
    str_map m;
    str_map_init(&m, 1 << 12);
    size_t cache_entries = 1 << 12, cache_cap = 1 << 14, cache_n = 0;
    size_t *cache_off = ct_xmalloc(cache_entries * sizeof *cache_off);
    uint32_t *cache_len = ct_xmalloc(cache_entries * sizeof *cache_len);
    int32_t *cache_toks = ct_xmalloc(cache_cap * sizeof *cache_toks);
    int32_t scratch[TOK_CHUNK_MAX];

    for (size_t i = 0; i < n;) {
        uint32_t len = (uint32_t)ct_tokenizer_chunk_len(text, n, i);
        bool inserted;
        size_t e = str_map_get(&m, text + i, len, &inserted);
        if (inserted) {
            uint32_t k = encode_chunk(tok, text + i, len, scratch);
            if (e == cache_entries) {
                cache_entries *= 2;
                cache_off = realloc(cache_off, cache_entries * sizeof *cache_off);
                cache_len = realloc(cache_len, cache_entries * sizeof *cache_len);
                CT_ASSERTF(cache_off && cache_len, "out of host memory");
            }
            if (cache_n + k > cache_cap) {
                while (cache_n + k > cache_cap) cache_cap *= 2;
                cache_toks = realloc(cache_toks, cache_cap * sizeof *cache_toks);
                CT_ASSERTF(cache_toks, "out of host memory");
            }
            memcpy(cache_toks + cache_n, scratch, k * sizeof *scratch);
            cache_off[e] = cache_n;
            cache_len[e] = k;
            cache_n += k;
        }
        uint32_t k = cache_len[e];
        if (n_res + k > cap) {
            cap = cap * 2 + k;
            res = realloc(res, cap * sizeof *res);
            CT_ASSERTF(res, "out of host memory (%zu tokens)", cap);
        }
        memcpy(res + n_res, cache_toks + cache_off[e], k * sizeof *res);
        n_res += k;
        i += len;
    }
    str_map_release(&m);
    free(cache_off);
    free(cache_len);
    free(cache_toks);
    *tokens = res;
    return n_res;
}

/* What an id outside the vocabulary decodes to: U+FFFD, the Unicode replacement character. */
static const uint8_t decode_unknown[3] = {0xef, 0xbf, 0xbd};

uint8_t *ct_tokenizer_decode(const ct_tokenizer *tok, const int32_t *tokens, size_t n_tokens,
                             size_t *n_out) {
    /* A model's vocabulary may be larger than the tokenizer's (padding, or a tokenizer that
     * stopped merging early), so sampled ids can be out of range: show them, don't abort. */
    size_t total = 0;
    for (size_t i = 0; i < n_tokens; i++) {
        bool known = tokens[i] >= 0 && tokens[i] < tok->vocab_size;
        total += known ? tok->tok_len[tokens[i]] : sizeof decode_unknown;
    }
    uint8_t *buf = ct_xmalloc(total + 1);
    size_t off = 0;
    for (size_t i = 0; i < n_tokens; i++) {
        const uint8_t *src = decode_unknown;
        size_t len = sizeof decode_unknown;
        if (tokens[i] >= 0 && tokens[i] < tok->vocab_size) {
            src = tok->bytes + tok->tok_off[tokens[i]];
            len = tok->tok_len[tokens[i]];
        }
        memcpy(buf + off, src, len);
        off += len;
    }
    buf[total] = '\0'; /* convenient for printing text; not counted in *n_out */
    *n_out = total;
    return buf;
}

/* ---- file I/O ------------------------------------------------------------------------------- */

ct_status ct_tokenizer_save(const ct_tokenizer *tok, const char *path) {
    size_t bytes = TOK_HEADER_BYTES + (size_t)tok->n_merges * 8;
    uint8_t *buf = ct_xmalloc(bytes);
    memcpy(buf, TOK_MAGIC, 8);
    ct_put_le32(buf + 8, TOK_VERSION);
    ct_put_le32(buf + 12, TOK_BOM);
    ct_put_le32(buf + 16, (uint32_t)tok->vocab_size);
    ct_put_le32(buf + 20, (uint32_t)tok->n_merges);
    for (int i = 0; i < tok->n_merges; i++) {
        ct_put_le32(buf + TOK_HEADER_BYTES + 8 * (size_t)i, tok->merges[2 * i]);
        ct_put_le32(buf + TOK_HEADER_BYTES + 8 * (size_t)i + 4, tok->merges[2 * i + 1]);
    }
    /* Write a temporary file and rename it, so a crash never leaves a half-written tokenizer
     * under the real name. */
    size_t tmp_len = strlen(path) + 8;
    char *tmp = ct_xmalloc(tmp_len);
    snprintf(tmp, tmp_len, "%s.tmp", path);
    ct_status st = CT_OK;
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        st = ct_error(CT_ERR_INPUT, "cannot create tokenizer file %s: %s", tmp, strerror(errno));
        ct_hint("check that the directory exists and is writable");
    } else {
        bool ok = fwrite(buf, 1, bytes, f) == bytes;
        ok = fflush(f) == 0 && ok;
        ok = fsync(fileno(f)) == 0 && ok;
        ok = fclose(f) == 0 && ok;
        st = ct_file_publish(tmp, path, ok, "tokenizer");
    }
    free(tmp);
    free(buf);
    return st;
}

static ct_status corrupt(const char *path, const char *what) {
    ct_error(CT_ERR_INPUT, "tokenizer file %s is corrupt: %s", path, what);
    ct_hint("re-create it with `cooktrain prepare`, or point data.tokenizer at the right file");
    return CT_ERR_INPUT;
}

ct_status ct_tokenizer_load(ct_tokenizer **out, const char *path) {
    *out = NULL;
    int fd;
    int64_t file_size;
    if (ct_open_regular(path, "tokenizer file", &fd, &file_size) != CT_OK) {
        ct_hint("point data.tokenizer at the tokenizer.bin written by `cooktrain prepare`");
        return CT_ERR_INPUT;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        ct_error(CT_ERR_RUNTIME, "cannot read tokenizer file %s: %s", path, strerror(errno));
        return CT_ERR_RUNTIME;
    }
    size_t size = (size_t)file_size;
    uint8_t header[TOK_HEADER_BYTES];
    if (size < TOK_HEADER_BYTES || fread(header, 1, TOK_HEADER_BYTES, f) != TOK_HEADER_BYTES) {
        fclose(f);
        char what[128];
        snprintf(what, sizeof what, "%zu bytes, shorter than the %d-byte header", size,
                 TOK_HEADER_BYTES);
        return corrupt(path, what);
    }
    char what[256];
    if (memcmp(header, TOK_MAGIC, 8) != 0) {
        fclose(f);
        return corrupt(path, "bad magic (expected \"" TOK_MAGIC "\"); not a cooktrain tokenizer");
    }
    uint32_t version = ct_get_le32(header + 8), bom = ct_get_le32(header + 12);
    uint32_t vocab = ct_get_le32(header + 16), n_merges = ct_get_le32(header + 20);
    if (version != TOK_VERSION) {
        fclose(f);
        snprintf(what, sizeof what, "version %u, this build reads version %u", version,
                 TOK_VERSION);
        return corrupt(path, what);
    }
    if (bom != TOK_BOM) {
        fclose(f);
        snprintf(what, sizeof what, "byte-order mark 0x%08x, expected 0x%08x%s", bom, TOK_BOM,
                 bom == 0x04030201u ? " (written with the other byte order)" : "");
        return corrupt(path, what);
    }
    if (n_merges > (uint32_t)TOK_MAX_VOCAB - 256 || vocab != 256 + n_merges) {
        fclose(f);
        snprintf(what, sizeof what, "vocab_size %u does not equal 256 + %u merges (max %d)", vocab,
                 n_merges, TOK_MAX_VOCAB);
        return corrupt(path, what);
    }
    size_t expected = TOK_HEADER_BYTES + (size_t)n_merges * 8;
    if (size != expected) {
        fclose(f);
        snprintf(what, sizeof what, "%zu bytes, but %u merges need exactly %zu (%s)", size,
                 n_merges, expected, size < expected ? "truncated" : "trailing bytes");
        return corrupt(path, what);
    }
    uint8_t *body = ct_xmalloc((size_t)n_merges * 8 + 1);
    bool ok = fread(body, 1, (size_t)n_merges * 8, f) == (size_t)n_merges * 8;
    fclose(f);
    if (!ok) {
        free(body);
        return corrupt(path, "read failed before the end of the merges");
    }
    uint32_t *merges = ct_xmalloc(((size_t)n_merges + 1) * 2 * sizeof *merges);
    for (uint32_t i = 0; i < n_merges; i++) {
        uint32_t l = ct_get_le32(body + 8 * (size_t)i), r = ct_get_le32(body + 8 * (size_t)i + 4);
        if (l >= 256 + i || r >= 256 + i) {
            free(body);
            free(merges);
            snprintf(what, sizeof what,
                     "merge %u (token %u) = (%u, %u) refers to a token that is not defined yet", i,
                     256 + i, l, r);
            return corrupt(path, what);
        }
        merges[2 * i] = l;
        merges[2 * i + 1] = r;
    }
    free(body);
    ct_tokenizer *tok = tok_build(merges, (int)n_merges);
    if (!tok) {
        snprintf(what, sizeof what, "a token is longer than %d bytes", TOK_MAX_TOKEN_BYTES);
        return corrupt(path, what);
    }
    *out = tok;
    return CT_OK;
}
