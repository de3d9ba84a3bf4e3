/*
 * checkpoint.h — the checkpoint format and its directory (core/README.md, Checkpoints), without
 * MPI: what one process writes and reads. parallel/checkpoint_io.h decides which pieces each rank
 * of a layout saves and which it needs on load.
 *
 * A checkpoint is a set of named global tensors — for every parameter its fp32 weights (the
 * master weights in bf16 training, of which the bf16 parameters are the rounding), and AdamW's
 * m and v — stored as pieces, plus the train state. A piece is a run of one tensor's elements:
 * the box [row0, row1) x [col0, col1) of the global (rows, cols) tensor (a 1-D tensor is
 * (n, 1)) that one tensor-parallel rank holds, and within that box, in row-major order, the flat
 * range [lo, hi) that one ZeRO shard holds. Any layout's needs are again (box, range) pairs, so a
 * loader finds every element it needs in whichever pieces overlap, whatever layout wrote them.
 *
 * Directory: ROOT/step-NNNNNNNN/ holds manifest.bin (rank 0) and rank-RRRRR.bin (one per rank
 * that saved pieces); ROOT/latest names the newest complete one. A save writes into
 * step-NNNNNNNN.tmp/, fsyncs every file and the directory, renames it, fsyncs ROOT, then
 * replaces `latest` by rename: a crash at any moment leaves the previous checkpoint complete and
 * `latest` naming a complete checkpoint.
 *
 * Files are little-endian whatever the host, each opening with a magic, a version and the
 * byte-order mark 0x01020304 (read back as 0x04030201 when written with the other order).
 *   rank file, 32-byte header: "CTCKDATA", u32 version, u32 byte-order mark, u32 rank,
 *     u32 0, u64 0; then the pieces' values as f32, each at the offset its manifest entry gives.
 *   manifest: 64-byte header: "CTCKPTMF", u32 version, u32 byte-order mark, u32 rank files,
 *     u32 config bytes, u64 pieces, u32 state fields (S), 4 zero bytes, the writing cooktrain's
 *     version (16 bytes, NUL-padded), 8 zero bytes; then S i64 state fields
 *     in the order of ct_ckpt_state; then per piece 152 bytes: name (64, NUL-padded), u32 kind,
 *     u32 rank file, i64 rows, cols, row0, row1, col0, col1, lo, hi, byte offset, u32 crc32 of
 *     its values' bytes, u32 0; then the resolved config (YAML text); then the crc32 of all of
 *     the above. Checksums are CRC-32 (zlib's crc32; ct_crc32 computes it).
 */
#ifndef CT_CORE_CHECKPOINT_H
#define CT_CORE_CHECKPOINT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/common.h"
#include "core/config/config.h"

enum { CT_CKPT_NAME = 64 };

/* What a saved tensor holds for its parameter. */
typedef enum ct_ckpt_kind {
    CT_CKPT_WEIGHT = 0, /* fp32 weights (bf16 training: the master weights) */
    CT_CKPT_ADAM_M,
    CT_CKPT_ADAM_V,
    CT_CKPT_KIND_COUNT
} ct_ckpt_kind;
const char *ct_ckpt_kind_name(ct_ckpt_kind kind);

/* Elements [lo, hi) (row-major) of the box [row0, row1) x [col0, col1) of global tensor `name`
 * (rows x cols), kind `kind`. */
typedef struct ct_ckpt_box {
    char name[CT_CKPT_NAME];
    int32_t kind;
    int64_t rows, cols;
    int64_t row0, row1, col0, col1;
    int64_t lo, hi;
} ct_ckpt_box;

typedef struct ct_ckpt_piece {
    ct_ckpt_box box;
    int32_t file;   /* the rank file that holds it */
    int64_t offset; /* of its first value in that file */
    uint32_t crc;   /* crc32 of its (hi - lo) little-endian f32 values */
} ct_ckpt_piece;

/* The train state; every field an i64 in the manifest, in this order. */
typedef struct ct_ckpt_state {
    int64_t step;           /* optimizer steps done */
    int64_t samples_seen;   /* global sample index where the next step starts (step · G) */
    int64_t tokens_seen;    /* samples_seen · seq_len */
    int64_t optimizer_step; /* AdamW's step counter (bias correction) */
    int64_t seed, global_batch;
    /* The model's shape: a checkpoint loads only into the same model. */
    int64_t arch, vocab_size, vocab_pad, seq_len, n_layer, d_model, n_head, n_kv_head, d_ff;
    /* The layout and precision that wrote it (informational: any layout loads it). */
    int64_t world_size, tp, pp, dp, zero_stage, virtual_stages, precision;
    int64_t format_version;
    /* crc32 of the data.tokenizer file (0: none): a checkpoint resumes with the same one. The
     * RNG needs no state of its own: every random number is a pure function of (seed, stream,
     * counter) — initialisation, data order, sampling — so seed and step are all of it. */
    int64_t tokenizer_crc;
} ct_ckpt_state;

/* The train state of a run of `cfg` after `step` steps, as one process (world_size, tp, pp, dp
 * 1; tokenizer_crc 0): callers that know the layout and the tokenizer fill those in. */
ct_ckpt_state ct_ckpt_state_of(const ct_config *cfg, int64_t step, int64_t optimizer_step);

/* Names of the state fields, in order (inspect prints them; the manifest stores the count). */
extern const char *const ct_ckpt_state_names[];
enum { CT_CKPT_STATE_FIELDS = (int)(sizeof(ct_ckpt_state) / sizeof(int64_t)) };

typedef struct ct_ckpt_manifest {
    ct_ckpt_state state;
    int n_files;
    int64_t n_pieces;
    ct_ckpt_piece *pieces;
    char *config_text; /* NUL-terminated */
    char version[17];  /* the cooktrain that wrote it (read back; writing uses CT_VERSION) */
} ct_ckpt_manifest;

void ct_ckpt_manifest_release(ct_ckpt_manifest *manifest);

/* ---- writing ----------------------------------------------------------------------------- */

/* One rank's data file, DIR/rank-RRRRR.bin: pieces are appended, each checksummed. */
typedef struct ct_ckpt_writer ct_ckpt_writer;
ct_status ct_ckpt_writer_open(ct_ckpt_writer **out, const char *dir, int rank);
/* Appends piece->box's (hi - lo) values from `data` (host fp32) and fills piece->file, offset
 * and crc. */
ct_status ct_ckpt_writer_add(ct_ckpt_writer *w, ct_ckpt_piece *piece, const float *data);
/* Flushes, fsyncs and closes (also on failure; then the file is left for the caller's cleanup). */
ct_status ct_ckpt_writer_close(ct_ckpt_writer *w);

/* A rank file written in place through a shared mapping (a local checkpoint's, kept in node
 * memory and rewritten save after save): DIR/rank-RRRRR.bin made at its full size with its space
 * reserved (a full file system fails here, not at a store into the mapping) and its header
 * written. The caller stores the values, in file order (ct_ckpt_mapped_to_file_order), then
 * checksums its pieces and syncs. */
typedef struct ct_ckpt_mapped ct_ckpt_mapped;
ct_status ct_ckpt_mapped_open(ct_ckpt_mapped **out, const char *dir, int rank, int64_t values);
/* Whether m is still DIR/rank-RRRRR.bin (the same file, not one made since) for `values`
 * values; if so its header is written again. */
bool ct_ckpt_mapped_reuse(ct_ckpt_mapped *m, const char *dir, int rank, int64_t values);
float *ct_ckpt_mapped_values(ct_ckpt_mapped *m);
int64_t ct_ckpt_mapped_count(const ct_ckpt_mapped *m); /* its values */
int ct_ckpt_mapped_rank(const ct_ckpt_mapped *m);
/* Host floats to the file's little-endian bytes, in place (nothing to do on such a host). */
void ct_ckpt_mapped_to_file_order(ct_ckpt_mapped *m);
/* Fills piece->file, offset and crc for the piece's values, which start at value `at`. */
void ct_ckpt_mapped_piece(const ct_ckpt_mapped *m, ct_ckpt_piece *piece, int64_t at);
/* Writes the mapping back (msync, fsync): a no-op in memory, a write on a disk. */
ct_status ct_ckpt_mapped_sync(ct_ckpt_mapped *m);
/* Unmaps and closes; with `remove`, removes the file too. Accepts NULL. */
void ct_ckpt_mapped_close(ct_ckpt_mapped *m, bool remove);

/* DIR/manifest.bin, fsynced. */
ct_status ct_ckpt_manifest_write(const char *dir, const ct_ckpt_manifest *manifest);

/* ---- the directory ----------------------------------------------------------------------- */

/* ROOT/step-NNNNNNNN (final) and ROOT/step-NNNNNNNN.tmp (being written), into buf. */
void ct_ckpt_step_path(char *buf, size_t n, const char *root, int64_t step, bool tmp);
/* Makes ROOT (mkdir -p) and an empty step-N.tmp, removing a stale one from a crashed save (a
 * step-N.tmp, or a step-N.old in ct_ckpt_publish, that is not a directory — a symbolic link, a
 * file — is CT_ERR_INPUT, left alone). */
ct_status ct_ckpt_begin(const char *root, int64_t step);
/* Removes step-N.tmp of a save that failed (not ROOT: the caller knows whether it made it). */
void ct_ckpt_discard(const char *root, int64_t step);
/* step-N.tmp → step-N (after fsyncing it), then `latest` → step-N, each fsynced. */
ct_status ct_ckpt_publish(const char *root, int64_t step);
/* A checkpoint directory from what a user names: PATH itself when it holds manifest.bin, else
 * the step its `latest` names when PATH is a checkpoint.dir root (else PATH unchanged, for the
 * reader to report). Into out (n bytes). */
void ct_ckpt_resolve(const char *path, char *out, size_t n);
/* Deletes the oldest complete checkpoints beyond `keep` (never the one `latest` names) and any
 * step-*.tmp left by a crashed save older than the newest complete one. */
ct_status ct_ckpt_prune(const char *root, int64_t keep);

/* Test hook: with COOKTRAIN_CKPT_CRASH=POINT (any save) or POINT@STEP (the save of that step),
 * a save that reaches POINT kills its process with SIGKILL, as a node failure would; tests then
 * check that the checkpoints before it survive. Points: mid-file, before-manifest,
 * before-rename, before-latest. */
void ct_ckpt_crash_point(const char *point, int64_t step);

/* ---- reading ----------------------------------------------------------------------------- */

/*
 * Reads and checks DIR's manifest (magic, version, byte order, checksum, piece bounds) and that
 * every rank file it names exists with its header and is long enough for its pieces. Does not
 * read the values (ct_ckpt_read_box checks each piece's checksum as it reads it). CT_ERR_INPUT
 * with a message naming the file and the problem.
 */
ct_status ct_ckpt_open(const char *dir, ct_ckpt_manifest *manifest);
/* The manifest alone, checked as ct_ckpt_open checks it, whatever rank files DIR holds (a local
 * checkpoint's folder holds some of them). */
ct_status ct_ckpt_open_manifest(const char *dir, ct_ckpt_manifest *manifest);

/* Host memory ct_ckpt_read_box holds while it reads (its chunk buffers). */
#define CT_CKPT_READ_BUFFER_BYTES ((double)(8 << 20))

/*
 * Fills out[0 .. want.hi - want.lo) with the elements `want` describes, from every piece of the
 * same tensor and kind that overlaps it, reading each such piece whole in bounded chunks and
 * checking its checksum. CT_ERR_INPUT naming the file and tensor on a checksum mismatch, a short
 * read, or elements no piece holds.
 */
ct_status ct_ckpt_read_box(const char *dir, const ct_ckpt_manifest *manifest,
                           const ct_ckpt_box *want, float *out);

/*
 * The checkpoints a run may resume from, to try in order (paths malloc'd, as is the array;
 * returns the count): `resume` "never" gives none, a PATH itself, "auto" every complete
 * step-N of ROOT, newest first (none when ROOT has none). The caller loads the first that loads
 * (ct_ckpt_open and the checksums pass), saying which it skipped.
 */
int ct_ckpt_candidates(const char *root, const char *resume, char ***out);
/* The steps of ROOT's complete checkpoints (step-N, no suffix), ascending, malloc'd (NULL when
 * none); returns the count. */
int ct_ckpt_steps(const char *root, int64_t **steps);

/* The model keys of the config the checkpoint was written with (its manifest's config text,
 * parsed as a config file is, over the defaults): norm_eps, rope_theta, the RoPE scaling, which
 * the train state does not hold. CT_ERR_INPUT naming the checkpoint when it has none or it does
 * not parse. */
ct_status ct_ckpt_model_config(const char *dir, const ct_ckpt_manifest *manifest,
                               ct_model_config *out);

/* Reads every piece of rank file `file` of checkpoint `dir` and checks its checksum (a torn or
 * corrupt file fails, CT_ERR_INPUT, naming it). */
ct_status ct_ckpt_verify_file(const char *dir, const ct_ckpt_manifest *manifest, int file);
/* `cooktrain inspect DIR`: prints the manifest's summary and checks every piece's checksum. */
ct_status ct_ckpt_inspect(const char *dir, FILE *out);

#endif /* CT_CORE_CHECKPOINT_H */
