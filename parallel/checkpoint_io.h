/*
 * checkpoint_io.h — saving and loading a training run's state in any layout (DESIGN §8); the
 * format and the directory are core/checkpoint.h.
 *
 * What a rank saves: for every parameter that meets the range [lo, lo + n) of its unit that this
 * rank's optimizer updates (the whole unit without ZeRO, the rank's shard with it), the box of
 * the global tensor its tensor-parallel slice covers and the part of that range inside it, as
 * three pieces: fp32 weights (master weights in bf16), AdamW m and v. Each element is saved
 * once in the job: tensors replicated over tp only by tp rank 0, unsharded optimizer state only
 * by dp rank 0, and the last stage's twin of the tied embedding not at all (it equals wte).
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

#include "core/checkpoint.h"
#include "core/config.h"
#include "core/model.h"
#include "parallel/context.h"
#include "parallel/data_parallel.h"

/*
 * Saves the state after `step` optimizer steps into checkpoint.dir/step-N (atomically: see
 * checkpoint.h) and prunes to checkpoint.keep. Collective over the world; every rank returns the
 * same status. *blocked_s (may be NULL) gets the seconds training waited.
 */
ct_status ct_ckpt_save(const ct_config *cfg, ct_model *model, ct_dp *dp, ct_pctx *pctx,
                       int64_t step, double *blocked_s);

/*
 * Loads checkpoint directory `path` into this layout: refuses (CT_ERR_INPUT, naming the field)
 * a checkpoint of another model shape, seed or global batch; fills *state (the step to continue
 * from is state->step). Collective; every rank returns the same status.
 */
ct_status ct_ckpt_load(const char *path, const ct_config *cfg, ct_model *model, ct_dp *dp,
                       ct_pctx *pctx, ct_ckpt_state *state);

#endif /* CT_PARALLEL_CHECKPOINT_IO_H */
