/*
 * fuzz_hfconfig.c — a Hugging Face config.json (core/io/hf.c): read as a file, parsed by
 * ct_hf_config_parse (model_type, every size within the config keys' bounds, the supported
 * activation, norm and RoPE settings), then the tensor names of the model it describes built, as
 * import and model.init_from do. Oracle: an accepted config's sizes are positive and within
 * those bounds. Seeds: GPT-2 and Llama configs as transformers writes them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/io/hf.h"
#include "test/fuzz/fuzz.h"

void fuzz_setup(void) {}

static void seed(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    fuzz_write(path, (const uint8_t *)text, strlen(text));
}

void fuzz_seeds(const char *dir) {
    seed(dir, "gpt2.json",
         "{\"model_type\": \"gpt2\", \"vocab_size\": 50257, \"n_positions\": 1024, \"n_embd\": 768,"
         " \"n_layer\": 12, \"n_head\": 12, \"n_inner\": null, \"activation_function\": "
         "\"gelu_new\", \"layer_norm_epsilon\": 1e-05, \"tie_word_embeddings\": true}");
    seed(dir, "llama.json",
         "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", "
         "\"vocab_size\": 32000, \"max_position_embeddings\": 2048, \"hidden_size\": 64, "
         "\"intermediate_size\": 172, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
         "\"num_key_value_heads\": 2, \"hidden_act\": \"silu\", \"rms_norm_eps\": 1e-06, "
         "\"rope_theta\": 500000.0, \"rope_scaling\": null, \"attention_bias\": false, "
         "\"mlp_bias\": false, \"head_dim\": 16, \"tie_word_embeddings\": true}");
    seed(dir, "mixtral.json",
         "{\"architectures\": [\"MixtralForCausalLM\"], \"model_type\": \"mixtral\", "
         "\"vocab_size\": 32000, \"max_position_embeddings\": 4096, \"hidden_size\": 64, "
         "\"intermediate_size\": 96, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
         "\"num_key_value_heads\": 2, \"hidden_act\": \"silu\", \"rms_norm_eps\": 1e-05, "
         "\"rope_theta\": 1000000.0, \"num_local_experts\": 8, \"num_experts_per_tok\": 2, "
         "\"router_aux_loss_coef\": 0.02, \"sliding_window\": null, "
         "\"tie_word_embeddings\": false}");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    const char *path = fuzz_path("config.json");
    fuzz_write(path, data, n);
    uint8_t *text;
    size_t len;
    ct_hf_config c;
    if (ct_read_regular(path, "config.json", 1 << 20, &text, &len) != CT_OK) {
        ct_error_clear();
        return 0;
    }
    ct_status st = ct_hf_config_parse(path, (const char *)text, len, &c);
    free(text);
    if (st != CT_OK) {
        ct_error_clear();
        return 0;
    }
    if (c.vocab_size < 1 || c.vocab_size > 2147483647 || c.n_layer < 1 || c.n_layer > 65536 ||
        c.d_model < 1 || c.d_model > 1048576 || c.n_head < 1 || c.n_head > 65536 ||
        c.n_kv_head < 1 || c.n_kv_head > 65536 || c.d_ff < 1 || c.d_ff > 16777216 ||
        c.max_positions < 1 || c.max_positions > 1048576 || c.moe_experts < 0 ||
        c.moe_experts > 4096 || c.moe_top_k > c.moe_experts || (c.moe_experts && c.moe_top_k < 1) ||
        !(c.moe_aux_alpha >= 0)) {
        fprintf(stderr, "fuzz_hfconfig: an accepted config has a size out of bounds\n");
        abort();
    }
    /* the tensor names of a model of at most 4 layers (larger ones cost time, not coverage) */
    int count;
    ct_hf_tensor *t = ct_hf_tensors(c.arch, c.n_layer < 4 ? c.n_layer : 4, c.d_model / c.n_head,
                                    !c.tied, c.moe_experts < 4 ? c.moe_experts : 4, &count);
    free(t);
    return 0;
}
