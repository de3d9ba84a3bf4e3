/*
 * checkpoint_io.h — saving and loading a training run's state in any layout (core/README.md,
 * Checkpoints); the format and the directory are core/io/checkpoint.h.
 *
 * What a rank saves: for every parameter that meets the range [lo, lo + n) of its unit that this
 * rank's optimizer updates (the whole unit without ZeRO, the rank's shard with it), the box of
 * the global tensor its tensor-parallel slice covers and the part of that range inside it, as
 * three pieces: fp32 weights (master weights in bf16), AdamW m and v. Each element is saved
 * once in the job: tensors replicated over tp only by tp rank 0, and the last stage's twin of the
 * tied embedding not at all (it equals wte); optimizer state that every data-parallel replica
 * holds whole (ZeRO 0, or an expert's over the ranks holding it) is cut into contiguous shares
 * of its unit, one a replica, so every rank stages and writes about the same bytes.
 *
 * What a rank loads: the same (box, range) pairs for its own layout, without those exclusions
 * (every replica loads its copy; the twin loads wte), read from whichever pieces hold them, a
 * piece at a time in bounded chunks: no rank holds more than its own state plus one chunk. The
 * bf16 parameters follow from the master weights, and ZeRO-1/2 ranks gather the parameters
 * outside their shard, exactly as after an optimizer step — so a run resumed in the same layout
 * continues bit for bit.
 */
#ifndef CT_PARALLEL_CHECKPOINT_IO_H
#define CT_PARALLEL_CHECKPOINT_IO_H

#include "core/io/checkpoint.h"
#include "core/config/config.h"
#include "core/model/model.h"
#include "parallel/context.h"
#include "parallel/data_parallel.h"

/*
 * A save of the state after `step` optimizer steps into checkpoint.dir/step-N (atomically: see
 * checkpoint.h), in two halves so that training can go on in between:
 *   ct_ckpt_save_begin copies this rank's pieces to a host staging buffer — the only part
 *     training waits for — and writes its rank file: on a background thread with
 *     checkpoint.async, else before returning;
 *   ct_ckpt_save_end waits for the file, gathers every rank's piece list, and rank 0 writes the
 *     manifest, publishes the checkpoint and prunes to checkpoint.keep.
 * Both are collective over the world and return the same status on every rank; a caller ends a
 * save before beginning the next (so saves complete in order) and before the run ends.
 * ct_ckpt_save_written says, without blocking, whether this rank's file is done, so a caller can
 * end the save at the first step boundary where every rank's is.
 */
typedef struct ct_ckpt_saver ct_ckpt_saver;
typedef struct ct_ckpt_save_stats {
    double blocked_s; /* training waited: staging */
    double write_s;   /* writing and fsyncing this rank's file (in the background if async) */
    double total_s;   /* begin to published */
    double bytes;     /* this rank's values */
    bool async;
} ct_ckpt_save_stats;

ct_status ct_ckpt_save_begin(ct_ckpt_saver **out, const ct_config *cfg, ct_model *model, ct_dp *dp,
                             ct_pctx *pctx, int64_t step);
bool ct_ckpt_save_written(ct_ckpt_saver *saver);
ct_status ct_ckpt_save_end(ct_ckpt_saver *saver, ct_ckpt_save_stats *stats); /* frees saver */
/* Drops a save without publishing it (after a failure elsewhere): joins its writer, frees it;
 * step-N.tmp stays behind, which no loader takes for a checkpoint. Not collective. */
void ct_ckpt_save_abandon(ct_ckpt_saver *saver);
/* Makes and touches the host staging buffer a save of this rank's state needs, so that no save
 * pays for fresh pages (call at start when checkpoints are on); kept until ct_ckpt_release.
 * Collective (agrees on an out-of-memory failure). */
ct_status ct_ckpt_prepare(ct_model *model, ct_dp *dp, ct_pctx *pctx);
/* Frees that buffer and unmaps the local saves' files (which stay where they are). */
void ct_ckpt_release(void);
/* Begin and end at once. */
ct_status ct_ckpt_save(const ct_config *cfg, ct_model *model, ct_dp *dp, ct_pctx *pctx,
                       int64_t step, ct_ckpt_save_stats *stats);

/*
 * Loads checkpoint directory `path` into this layout: refuses (CT_ERR_INPUT, naming the field)
 * a checkpoint of another model shape, seed or global batch; fills *state (the step to continue
 * from is state->step). Collective; every rank returns the same status.
 */
typedef struct ct_ckpt_load_stats {
    double state_bytes;  /* this rank's state, read */
    double buffer_bytes; /* the most host memory the load held at once: the largest parameter
                            slice of this rank plus the reader's chunk buffers */
} ct_ckpt_load_stats;
ct_status ct_ckpt_load(const char *path, const ct_config *cfg, ct_model *model, ct_dp *dp,
                       ct_pctx *pctx, ct_ckpt_state *state, ct_ckpt_load_stats *stats);

/*
 * model.init_from: this layout's weights from `path` — a checkpoint directory of any layout (or
 * a checkpoint.dir root: its latest), or a Hugging Face model (core/io/hf.h) — with AdamW's
 * moments zero and its step 0, as a fresh run. A checkpoint must hold the same model and
 * tokenizer (not the same seed or batch); a Hugging Face model's config.json must describe the
 * run's model keys (ct_hf_check_config). Each rank reads what its slice needs; from a Hugging
 * Face model a whole tensor at a time (stats->buffer_bytes says how much). Collective; every
 * rank returns the same status.
 */
typedef struct ct_ckpt_init_info {
    bool hf;                    /* a Hugging Face model (else a checkpoint) */
    ct_arch arch;               /* its model family */
    int64_t step;               /* the checkpoint's step (0 for a Hugging Face model) */
    char dir[CT_PATH_MAX + 32]; /* what was read (a root resolved to its latest) */
} ct_ckpt_init_info;
ct_status ct_ckpt_init_from(const char *path, const ct_config *cfg, ct_model *model, ct_dp *dp,
                            ct_pctx *pctx, ct_ckpt_init_info *info, ct_ckpt_load_stats *stats);

/*
 * Local checkpoints (checkpoint.local_interval): every rank saves its file into its own folder
 * on its node (ct_ckpt_local_root: checkpoint.local_dir, "%h" as the rank's host index, a folder
 * per checkpoint.dir and one per rank), sends a copy to its partner (ct_ckpt_partner: the rank of
 * the same index on the next host; on one host the next rank), which keeps it in its own folder,
 * and each folder gets the manifest: a checkpoint directory of the format above, kept to its two
 * newest steps. A save runs in the background, in three calls:
 *   ct_ckpt_local_begin stages this rank's state straight into its file, mapped (training
 *     waits for this copy only; the files of a folder are reused save after save, see
 *     local_slot_begin), posts the transfer to the partner and the receives of the copies this
 *     rank keeps, straight into their files, and starts a thread that checksums and syncs this
 *     rank's file, then each copy as it arrives (collective);
 *   ct_ckpt_local_progress (main thread, not collective) completes the transfers that are done
 *     and says whether all of this rank's files are written; `wait` blocks until they are;
 *   ct_ckpt_local_end, once every rank's progress said so (or to finish one now), gathers the
 *     piece lists, and every rank writes its folder's manifest and publishes the step
 *     (collective). One local save at a time; ct_ckpt_local_abandon drops one after a failure.
 */
typedef struct ct_ckpt_local_saver ct_ckpt_local_saver;
void ct_ckpt_local_root(const ct_config *cfg, int rank, char *out, size_t n);
int ct_ckpt_partner(int rank, int world);
ct_status ct_ckpt_local_begin(ct_ckpt_local_saver **out, const ct_config *cfg, ct_model *model,
                              ct_dp *dp, ct_pctx *pctx, int64_t step);
bool ct_ckpt_local_progress(ct_ckpt_local_saver *saver, bool wait);
ct_status ct_ckpt_local_end(ct_ckpt_local_saver *saver, ct_ckpt_save_stats *stats); /* frees */
void ct_ckpt_local_abandon(ct_ckpt_local_saver *saver); /* accepts NULL */
/* Removes the local folders this rank looks after on its node (see ct_ckpt_local_restore): a
 * run that ended with a persistent checkpoint no longer needs them, and node memory is given
 * back. Every rank calls it. */
ct_status ct_ckpt_local_forget(const ct_config *cfg, const ct_pctx *pctx);
/*
 * A restart's agreement: the rank folders on a node are split among its ranks (each reads its
 * share: its own folder, and the folders of ranks of an earlier run that this one does not have
 * or numbers anew), every rank lists the steps of its folders whose manifest and rank files check
 * whole (a torn or corrupt copy counts as absent), the lists are gathered, and the newest step
 * after `after` (the newest in checkpoint.dir, -1 for none) of which every rank file is held
 * somewhere — in its writer's folder or as a partner's copy — is gathered into
 * checkpoint.dir/step-N and published there, so that resume: auto loads it like any other (in any
 * layout). Never a mix of steps: every file is of that one step. Collective; info->step is -1 when
 * no local step is newer and complete.
 */
typedef struct ct_ckpt_local_info {
    int64_t step;          /* the step gathered, or -1 */
    int64_t files;         /* its rank files */
    int64_t from_partners; /* of them, copies a partner kept (their writer's folder had none) */
} ct_ckpt_local_info;
ct_status ct_ckpt_local_restore(const ct_config *cfg, ct_pctx *pctx, int64_t after,
                                ct_ckpt_local_info *info);

#endif /* CT_PARALLEL_CHECKPOINT_IO_H */
