/* generate.c — `cooktrain sample DIR`: text from a checkpoint. See generate.h. */
#include "generate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/checkpoint.h"
#include "core/config.h"
#include "core/model.h"
#include "core/tokenizer.h"
#include "parallel/checkpoint_io.h"
#include "parallel/context.h"
#include "parallel/data_parallel.h"
#include "parallel/sampler.h"

typedef struct generate_args {
    const char *dir, *prompt, *tokenizer;
    int64_t tokens;
    uint64_t seed;
    ct_sample_options opt;
} generate_args;

static ct_status usage(const char *what, const char *value) {
    ct_error(CT_ERR_INPUT, "sample: %s '%s'", what, value);
    ct_hint("usage: cooktrain sample DIR [--prompt TEXT] [--tokens N] [--temperature T] "
            "[--top-k K] [--seed S] [--tokenizer FILE]");
    return CT_ERR_INPUT;
}

/* A number option's value, range-checked. */
static ct_status number(const char *opt, const char *text, double lo, double hi, double *out) {
    char *end;
    double v = strtod(text, &end);
    if (end == text || *end || !(v >= lo && v <= hi)) return usage(opt, text);
    *out = v;
    return CT_OK;
}

static ct_status parse(int argc, char **argv, generate_args *a) {
    *a = (generate_args){.prompt = "", .tokens = 64, .seed = 1234, .opt = {1.0, 0}};
    for (int i = 0; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x;
        if (o[0] != '-' && !a->dir) {
            a->dir = o;
            continue;
        }
        if (!v) return usage("unknown option or missing value", o);
        i++;
        if (!strcmp(o, "--prompt")) {
            a->prompt = v;
        } else if (!strcmp(o, "--tokenizer")) {
            a->tokenizer = v;
        } else if (!strcmp(o, "--tokens")) {
            CT_TRY(number("--tokens must be 0..1000000, got", v, 0, 1e6, &x));
            a->tokens = (int64_t)x;
        } else if (!strcmp(o, "--temperature")) {
            CT_TRY(number("--temperature must be in (0, 100], got", v, 1e-6, 100, &x));
            a->opt.temperature = x;
        } else if (!strcmp(o, "--top-k")) {
            CT_TRY(number("--top-k must be 0 (off) or more, got", v, 0, 1e9, &x));
            a->opt.top_k = (int64_t)x;
        } else if (!strcmp(o, "--seed")) {
            CT_TRY(number("--seed must be a non-negative integer, got", v, 0, 9e15, &x));
            a->seed = (uint64_t)x;
        } else {
            return usage("unknown option", o);
        }
    }
    if (!a->dir) return usage("needs a checkpoint directory, got", "");
    return CT_OK;
}

/* The checkpoint's config on one process: the same model, no parallelism. */
static ct_status config_of(const char *dir, const ct_ckpt_manifest *m, ct_config *cfg) {
    CT_TRY(ct_config_load_string(cfg, m->config_text, dir));
    cfg->parallel.tp = cfg->parallel.pp = cfg->parallel.dp = 1;
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

ct_status ct_generate_run(int argc, char **argv) {
    generate_args a;
    CT_TRY(parse(argc, argv, &a));
    ct_ckpt_manifest m;
    CT_TRY(ct_ckpt_open(a.dir, &m));
    ct_config cfg;
    ct_status st = config_of(a.dir, &m, &cfg);
    ct_ckpt_manifest_release(&m);
    if (st != CT_OK) return st;
    const char *tok_path = a.tokenizer ? a.tokenizer : cfg.data.tokenizer;
    if (!tok_path[0]) {
        ct_error(CT_ERR_INPUT, "sample: the checkpoint's config names no tokenizer "
                               "(data.tokenizer)");
        ct_hint("pass the tokenizer the training data was made with: --tokenizer FILE");
        return CT_ERR_INPUT;
    }
    ct_tokenizer *tok = NULL;
    CT_TRY(ct_tokenizer_load(&tok, tok_path));
    ct_backend *be = NULL;
    ct_pctx *pctx = ct_pctx_local_new();
    ct_model *model = NULL;
    ct_dp *dp = NULL;
    st = ct_backend_new(&be, "cpu", (int)cfg.train.threads, NULL, 0);
    if (st == CT_OK) {
        ct_model_layout layout = ct_model_layout_single(&cfg);
        layout.tp = pctx->tp_comm;
        st = ct_model_new(&model, &cfg, be, &layout);
    }
    if (st == CT_OK)
        st = ct_dp_new(&dp, model, pctx->dp_comm, 0, &cfg.train,
                       ct_precision_dtype(cfg.parallel.grad_reduce_dtype));
    ct_ckpt_state state;
    if (st == CT_OK) st = ct_ckpt_load(a.dir, &cfg, model, dp, pctx, &state, NULL);
    if (st == CT_OK) {
        printf("checkpoint %s: step %lld, %lld layers, d_model %lld; temperature %g, top-k %lld, "
               "seed %llu\n",
               a.dir, (long long)state.step, (long long)cfg.model.n_layer,
               (long long)cfg.model.d_model, a.opt.temperature, (long long)a.opt.top_k,
               (unsigned long long)a.seed);
        st = ct_sample_print(model, dp, pctx, tok, a.prompt, a.tokens, a.seed, &a.opt);
    }
    ct_dp_free(dp);
    ct_model_free(model);
    ct_pctx_free(pctx);
    ct_backend_free(be);
    ct_tokenizer_free(tok);
    return st;
}
