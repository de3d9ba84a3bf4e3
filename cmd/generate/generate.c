/* generate.c — `cooktrain sample DIR`: text from a checkpoint. See generate.h. */
#include "generate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend/backend.h"
#include "core/io/checkpoint.h"
#include "core/config/config.h"
#include "core/data/data.h"
#include "core/model/model.h"
#include "core/data/tokenizer.h"
#include "parallel/checkpoint_io.h"
#include "parallel/context.h"
#include "parallel/data_parallel.h"
#include "cmd/generate/sampler.h"

/* The checkpoint's config on one process: the same model, no parallelism. */
static ct_status config_of(const char *dir, const ct_ckpt_manifest *m, ct_config *cfg) {
    CT_TRY(ct_config_load_string(cfg, m->config_text, dir));
    cfg->parallel.tp = cfg->parallel.pp = cfg->parallel.dp = cfg->parallel.cp = 1;
    cfg->parallel.ep = 1;
    cfg->parallel.zero_stage = 0;
    cfg->parallel.virtual_stages = 1;
    cfg->parallel.schedule = CT_SCHEDULE_1F1B;
    cfg->parallel.sequence_parallel = false;
    cfg->parallel.pp_layers[0] = '\0';
    cfg->train.micro_batch = 1;
    cfg->train.micro_batch_auto = false;
    cfg->train.recompute = CT_RECOMPUTE_NONE;
    return ct_config_validate(cfg, 1);
}

/* A checkpoint's model on one process and the CPU backend, weights loaded. */
typedef struct loaded_checkpoint {
    ct_config cfg;
    ct_backend *be;
    ct_pctx *pctx;
    ct_model *model;
    ct_dp *dp;
    ct_ckpt_state state;
} loaded_checkpoint;

static void loaded_free(loaded_checkpoint *l) {
    ct_dp_free(l->dp);
    ct_model_free(l->model);
    ct_pctx_free(l->pctx);
    ct_backend_free(l->be);
    memset(l, 0, sizeof *l);
}

static ct_status load_checkpoint(const char *dir, loaded_checkpoint *l) {
    memset(l, 0, sizeof *l);
    ct_ckpt_manifest m;
    CT_TRY(ct_ckpt_open(dir, &m));
    ct_status st = config_of(dir, &m, &l->cfg);
    ct_ckpt_manifest_release(&m);
    if (st != CT_OK) return st;
    const ct_config *cfg = &l->cfg;
    l->pctx = ct_pctx_local_new();
    st = ct_backend_new(&l->be, "cpu", (int)cfg->train.threads, NULL, 0);
    if (st == CT_OK) {
        ct_model_layout layout = ct_model_layout_single(cfg);
        layout.tp = l->pctx->tp_comm;
        st = ct_model_new(&l->model, cfg, l->be, &layout);
    }
    if (st == CT_OK)
        st = ct_dp_new(&l->dp, l->model, l->pctx->dp_comm, &cfg->train,
                       ct_precision_dtype(cfg->parallel.grad_reduce_dtype));
    if (st == CT_OK) st = ct_ckpt_load(dir, cfg, l->model, l->dp, l->pctx, &l->state, NULL);
    if (st != CT_OK) loaded_free(l);
    return st;
}

ct_status ct_generate_run(const ct_generate_options *o) {
    const ct_generate_options a = *o;
    loaded_checkpoint l;
    CT_TRY(load_checkpoint(a.dir, &l));
    const char *tok_path = a.tokenizer ? a.tokenizer : l.cfg.data.tokenizer;
    ct_tokenizer *tok = NULL;
    ct_status st = CT_OK;
    if (tok_path[0]) {
        st = ct_tokenizer_load(&tok, tok_path);
    } else if (l.cfg.model.vocab_size <= 256) {
        /* a byte-level model (prepare --byte-level): its tokens are bytes */
        printf("sample: the checkpoint's config names no tokenizer and its vocabulary (%lld) "
               "fits in a byte: reading tokens as bytes\n",
               (long long)l.cfg.model.vocab_size);
        st = ct_tokenizer_train(&tok, NULL, 0, 256);
    } else {
        ct_error(CT_ERR_INPUT,
                 "sample: the checkpoint's config names no tokenizer "
                 "(data.tokenizer) and its vocabulary (%lld) is larger than a byte's",
                 (long long)l.cfg.model.vocab_size);
        ct_hint("pass the tokenizer the training data was made with: --tokenizer FILE "
                "(prepare writes DIR/tokenizer.bin)");
        st = CT_ERR_INPUT;
    }
    if (st == CT_OK) {
        printf("checkpoint %s: step %lld, %lld layers, d_model %lld; temperature %g, top-k %lld, "
               "seed %llu\n",
               a.dir, (long long)l.state.step, (long long)l.cfg.model.n_layer,
               (long long)l.cfg.model.d_model, a.sample.temperature, (long long)a.sample.top_k,
               (unsigned long long)a.seed);
        st = ct_sample_print(l.model, l.dp, l.pctx, tok, a.prompt, a.tokens, a.seed, &a.sample);
    }
    ct_tokenizer_free(tok);
    loaded_free(&l);
    return st;
}

/* ---- eval ---------------------------------------------------------------------------------- */

ct_status ct_eval_run(const char *dir, const char *data, int64_t samples) {
    loaded_checkpoint l;
    CT_TRY(load_checkpoint(dir, &l));
    const int64_t T = l.cfg.model.seq_len;
    ct_dataset *ds = NULL;
    ct_acts *acts = NULL;
    int32_t *tokens = ct_xmalloc((size_t)T * sizeof(int32_t));
    int32_t *targets = ct_xmalloc((size_t)T * sizeof(int32_t));
    ct_status st = ct_dataset_open(&ds, data, T, l.cfg.model.vocab_size, 0);
    if (st == CT_OK) st = ct_acts_new(&acts, l.model, 1);
    int64_t n = 0;
    if (st == CT_OK) {
        n = ct_dataset_n_samples(ds);
        if (samples > 0 && samples < n) n = samples;
    }
    /* One sample per forward, summed in double in file order: the value depends on nothing
     * but the weights and the data. */
    double sum = 0.0;
    for (int64_t k = 0; st == CT_OK && k < n; k++) {
        st = ct_dataset_fill_in_order(ds, k, 1, tokens, targets);
        if (st != CT_OK) break;
        ct_model_begin_losses(l.model, 1, 1);
        ct_acts_set_batch(acts, 0, tokens, targets);
        ct_model_forward(l.model, acts, 0.0f);
        sum += ct_model_loss_sum(l.model);
    }
    if (st == CT_OK)
        printf("eval %s (step %lld, %s): %lld samples of %lld tokens from %s in file "
               "order: loss %.7f\n",
               dir, (long long)l.state.step,
               ct_dtype_name(ct_precision_dtype(l.cfg.derived.precision)), (long long)n,
               (long long)T, data, sum / (double)(n * T));
    free(tokens);
    free(targets);
    ct_acts_free(acts);
    ct_dataset_free(ds);
    loaded_free(&l);
    return st;
}
