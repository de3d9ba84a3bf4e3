/* export.c — a checkpoint as a Hugging Face GPT-2 or Llama safetensors file. See export.h. */
#include "export.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/io/checkpoint.h"
#include "core/io/hf.h"

typedef ct_hf_tensor hf_tensor;

static const ct_ckpt_box *find_tensor(const ct_ckpt_manifest *m, const char *name) {
    for (int64_t i = 0; i < m->n_pieces; i++)
        if (m->pieces[i].box.kind == CT_CKPT_WEIGHT && !strcmp(m->pieces[i].box.name, name))
            return &m->pieces[i].box;
    return NULL;
}

/* Fills in rows and cols from the checkpoint's shapes. */
static ct_status shape_of(const char *dir, const ct_ckpt_manifest *m, hf_tensor *t,
                          int64_t keep_rows) {
    t->rows = 0;
    for (int s = 0; s < t->n_src; s++) {
        const ct_ckpt_box *b = find_tensor(m, t->src[s]);
        if (!b) {
            ct_error(CT_ERR_INPUT, "checkpoint '%s' has no tensor %s", dir, t->src[s]);
            ct_hint("export reads checkpoints of cooktrain's GPT-2 model (`cooktrain inspect` "
                    "lists what one holds)");
            return CT_ERR_INPUT;
        }
        t->rows += b->rows;
        t->cols = b->cols;
    }
    if (keep_rows > 0) t->rows = CT_MIN(t->rows, keep_rows);
    t->vector = t->cols == 1;
    return CT_OK;
}

/* The HF tensor's values, row-major in HF's shape: (cols, rows) when transposed. */
static ct_status load_values(const char *dir, const ct_ckpt_manifest *m, const hf_tensor *t,
                             float *out) {
    float *stacked = ct_xmalloc((size_t)(t->rows * t->cols) * sizeof(float));
    int64_t row = 0;
    ct_status st = CT_OK;
    for (int s = 0; s < t->n_src && st == CT_OK && row < t->rows; s++) {
        const ct_ckpt_box *b = find_tensor(m, t->src[s]);
        ct_ckpt_box want = *b;
        want.row0 = 0;
        want.row1 = CT_MIN(b->rows, t->rows - row);
        want.col0 = 0;
        want.col1 = b->cols;
        want.lo = 0;
        want.hi = want.row1 * b->cols;
        st = ct_ckpt_read_box(dir, m, &want, stacked + row * t->cols);
        row += want.row1;
    }
    if (st == CT_OK && t->rope_hd > 0) {
        /* within each head, HF row j·hd/2 + i is our row 2i + j (j = 0, 1; i < hd/2) */
        const int64_t hd = t->rope_hd, half = hd / 2;
        float *head = ct_xmalloc((size_t)(hd * t->cols) * sizeof(float));
        for (int64_t h0 = 0; h0 + hd <= t->rows; h0 += hd) {
            memcpy(head, stacked + h0 * t->cols, (size_t)(hd * t->cols) * sizeof(float));
            for (int64_t i = 0; i < half; i++)
                for (int64_t j = 0; j < 2; j++)
                    memcpy(stacked + (h0 + j * half + i) * t->cols, head + (2 * i + j) * t->cols,
                           (size_t)t->cols * sizeof(float));
        }
        free(head);
    }
    if (st == CT_OK) {
        if (t->transpose)
            for (int64_t i = 0; i < t->rows; i++)
                for (int64_t j = 0; j < t->cols; j++)
                    out[j * t->rows + i] = stacked[i * t->cols + j];
        else
            memcpy(out, stacked, (size_t)(t->rows * t->cols) * sizeof(float));
    }
    free(stacked);
    return st;
}

/* config.json beside the safetensors file, for transformers' LlamaConfig. */
static ct_status write_llama_config(FILE *f, const char *dir, const ct_ckpt_manifest *m,
                                    bool tied) {
    const ct_ckpt_state *s = &m->state;
    ct_model_config mc;
    CT_TRY(ct_ckpt_model_config(dir, m, &mc));
    char scaling[320] = "null";
    if (mc.rope_scaling_factor > 0)
        snprintf(scaling, sizeof scaling,
                 "{\"rope_type\": \"llama3\", \"factor\": %.17g, \"low_freq_factor\": %.17g, "
                 "\"high_freq_factor\": %.17g, \"original_max_position_embeddings\": %lld}",
                 mc.rope_scaling_factor, mc.rope_low_freq_factor, mc.rope_high_freq_factor,
                 (long long)mc.rope_original_max_pos);
    const bool mixtral = mc.moe_experts > 0;
    fprintf(f, "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n",
            mixtral ? "MixtralForCausalLM" : "LlamaForCausalLM", mixtral ? "mixtral" : "llama");
    if (mixtral)
        fprintf(f,
                "  \"num_local_experts\": %lld,\n  \"num_experts_per_tok\": %lld,\n"
                "  \"router_aux_loss_coef\": %.17g,\n  \"sliding_window\": null,\n",
                (long long)mc.moe_experts, (long long)mc.moe_top_k, mc.moe_aux_alpha);
    fprintf(f,
            "  \"vocab_size\": %lld,\n  \"max_position_embeddings\": %lld,\n"
            "  \"hidden_size\": %lld,\n  \"intermediate_size\": %lld,\n"
            "  \"num_hidden_layers\": %lld,\n  \"num_attention_heads\": %lld,\n"
            "  \"num_key_value_heads\": %lld,\n  \"hidden_act\": \"silu\",\n"
            "  \"rms_norm_eps\": %.17g,\n  \"rope_theta\": %.17g,\n  \"rope_scaling\": %s,\n"
            "  \"attention_bias\": false,\n"
            "  \"mlp_bias\": false,\n  \"tie_word_embeddings\": %s,\n"
            "  \"torch_dtype\": \"float32\"\n}\n",
            (long long)s->vocab_size, (long long)s->seq_len, (long long)s->d_model,
            (long long)(mixtral ? (mc.moe_d_ff ? mc.moe_d_ff : s->d_ff) : s->d_ff),
            (long long)s->n_layer, (long long)s->n_head, (long long)s->n_kv_head, mc.norm_eps,
            mc.rope_theta, scaling, tied ? "true" : "false");
    return CT_OK;
}

/* config.json beside the safetensors file, for transformers' GPT2Config or LlamaConfig. */
static ct_status write_hf_config(const char *out, const char *dir, const ct_ckpt_manifest *m,
                                 bool tied) {
    const ct_ckpt_state *s = &m->state;
    char path[CT_PATH_MAX + 32], tmp[CT_PATH_MAX + 48];
    const char *slash = strrchr(out, '/');
    snprintf(path, sizeof path, "%.*sconfig.json", slash ? (int)(slash - out + 1) : 0, out);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        ct_error(CT_ERR_INPUT, "cannot create '%s': %s", tmp, strerror(errno));
        ct_hint("check that the directory of --out exists and is writable");
        return CT_ERR_INPUT;
    }
    ct_status st = CT_OK;
    if (s->arch != 0) /* llama (the train state's model.arch: gpt2 is 0) */
        st = write_llama_config(f, dir, m, tied);
    else
        fprintf(
            f,
            "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
            "  \"vocab_size\": %lld,\n  \"n_positions\": %lld,\n  \"n_ctx\": %lld,\n"
            "  \"n_embd\": %lld,\n  \"n_layer\": %lld,\n  \"n_head\": %lld,\n  \"n_inner\": %lld,\n"
            "  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": 1e-05,\n"
            "  \"tie_word_embeddings\": %s,\n  \"torch_dtype\": \"float32\"\n}\n",
            (long long)s->vocab_size, (long long)s->seq_len, (long long)s->seq_len,
            (long long)s->d_model, (long long)s->n_layer, (long long)s->n_head, (long long)s->d_ff,
            tied ? "true" : "false");
    bool ok = fflush(f) == 0 && !ferror(f);
    ok = fclose(f) == 0 && ok;
    if (st != CT_OK) {
        remove(tmp);
        return st;
    }
    return ct_file_publish(tmp, path, ok, "config.json");
}

/* A Mixture-of-Experts checkpoint exports as Mixtral when it is one: a Llama whose every layer's
 * MLP is routed by softmax-then-top-k to SwiGLU experts, no shared experts, no selection biases
 * (Mixtral has none). *experts: the experts a layer (0: a dense model). */
static ct_status check_moe(const char *dir, const ct_ckpt_manifest *m, int64_t *experts) {
    const char *moe = NULL;
    for (int64_t i = 0; i < m->n_pieces && !moe; i++)
        if (strstr(m->pieces[i].box.name, ".moe.")) moe = m->pieces[i].box.name;
    *experts = 0;
    if (!moe) return CT_OK;
    ct_model_config mc;
    CT_TRY(ct_ckpt_model_config(dir, m, &mc));
    const char *why = m->state.arch == 0   ? "GPT-2 experts have no Hugging Face layout"
                      : mc.moe_every != 1  ? "Mixtral's every layer is sparse, this "
                                             "model's model.moe_every is not 1"
                      : mc.moe_shared != 0 ? "Mixtral has no shared experts"
                      : mc.moe_router != CT_MOE_TOPK_SOFTMAX ? "Mixtral routes by softmax then "
                                                               "top-k (moe_router topk_softmax)"
                      : mc.moe_bias_rate > 0                 ? "Mixtral has no selection biases "
                                                               "(model.moe_bias_rate)"
                                                             : NULL;
    if (why) {
        ct_error(CT_ERR_INPUT,
                 "checkpoint '%s' holds a Mixture-of-Experts model (%s) that export cannot write: "
                 "%s",
                 dir, moe, why);
        ct_hint("export writes Mixture-of-Experts Llamas as Mixtral; cooktrain eval and sample "
                "read this checkpoint as it is");
        return CT_ERR_INPUT;
    }
    *experts = mc.moe_experts;
    return CT_OK;
}

/* The JSON header, padded with spaces to a multiple of 8 bytes. */
static char *safetensors_header(const hf_tensor *t, int n, ct_dtype dtype, size_t *len) {
    size_t cap = 256 + (size_t)n * 160, used = 0;
    char *h = ct_xmalloc(cap);
    used += (size_t)snprintf(h, cap,
                             "{\"__metadata__\":{\"format\":\"pt\",\"producer\":\"cooktrain\"}");
    int64_t offset = 0;
    const size_t esize = ct_dtype_size(dtype);
    for (int i = 0; i < n; i++) {
        int64_t bytes = t[i].rows * t[i].cols * (int64_t)esize;
        char shape[64];
        if (t[i].vector)
            snprintf(shape, sizeof shape, "[%lld]", (long long)t[i].rows);
        else if (t[i].transpose)
            snprintf(shape, sizeof shape, "[%lld,%lld]", (long long)t[i].cols,
                     (long long)t[i].rows);
        else
            snprintf(shape, sizeof shape, "[%lld,%lld]", (long long)t[i].rows,
                     (long long)t[i].cols);
        used +=
            (size_t)snprintf(h + used, cap - used,
                             ",\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%lld,%lld]}",
                             t[i].name, dtype == CT_DTYPE_BF16 ? "BF16" : "F32", shape,
                             (long long)offset, (long long)(offset + bytes));
        offset += bytes;
    }
    used += (size_t)snprintf(h + used, cap - used, "}");
    while (used % 8) h[used++] = ' ';
    h[used] = '\0';
    *len = used;
    return h;
}

ct_status ct_export_safetensors(const char *dir, const char *out, ct_dtype dtype) {
    ct_ckpt_manifest m;
    CT_TRY(ct_ckpt_open(dir, &m));
    ct_status st = CT_OK;
    const bool llama = m.state.arch != 0; /* model.arch gpt2 is 0 in the train state */
    if (!llama && m.state.n_kv_head != m.state.n_head) {
        ct_error(CT_ERR_INPUT,
                 "checkpoint '%s' has n_kv_head=%lld < n_head=%lld (GQA), which "
                 "GPT-2's safetensors layout cannot hold",
                 dir, (long long)m.state.n_kv_head, (long long)m.state.n_head);
        ct_hint("export is for GPT-2 models with n_kv_head = n_head");
        st = CT_ERR_INPUT;
    }
    int64_t experts = 0;
    if (st == CT_OK) st = check_moe(dir, &m, &experts);
    int n = 0;
    const bool untied = find_tensor(&m, "lm_head") != NULL;
    hf_tensor *t = ct_hf_tensors(llama ? CT_ARCH_LLAMA : CT_ARCH_GPT2, m.state.n_layer,
                                 m.state.d_model / m.state.n_head, untied, experts, &n);
    int64_t largest = 0;
    for (int i = 0; i < n && st == CT_OK; i++) {
        const bool vocab = !strcmp(t[i].src[0], "wte") || !strcmp(t[i].src[0], "lm_head");
        st = shape_of(dir, &m, &t[i], vocab ? m.state.vocab_size : 0);
        largest = CT_MAX(largest, t[i].rows * t[i].cols);
    }
    char tmp[CT_PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    if (st == CT_OK) st = ct_mkdir_parents(out);
    FILE *f = st == CT_OK ? fopen(tmp, "wb") : NULL;
    if (st == CT_OK && !f) {
        ct_error(CT_ERR_INPUT, "cannot create '%s': %s", tmp, strerror(errno));
        ct_hint("check that the directory of --out exists and is writable");
        st = CT_ERR_INPUT;
    }
    if (st == CT_OK) {
        size_t hlen;
        char *header = safetensors_header(t, n, dtype, &hlen);
        uint8_t len8[8];
        ct_put_le64(len8, (uint64_t)hlen);
        bool ok = fwrite(len8, 1, 8, f) == 8 && fwrite(header, 1, hlen, f) == hlen;
        free(header);
        float *values = ct_xmalloc((size_t)largest * sizeof(float));
        uint8_t *bytes = ct_xmalloc((size_t)largest * 4);
        for (int i = 0; i < n && ok && st == CT_OK; i++) {
            st = load_values(dir, &m, &t[i], values);
            const int64_t k = t[i].rows * t[i].cols;
            if (st == CT_OK && dtype == CT_DTYPE_BF16) {
                for (int64_t j = 0; j < k; j++) {
                    uint16_t b = ct_f32_to_bf16(values[j]);
                    bytes[2 * j] = (uint8_t)b, bytes[2 * j + 1] = (uint8_t)(b >> 8);
                }
            } else if (st == CT_OK) {
                ct_put_le_floats(bytes, values, k);
            }
            if (st == CT_OK) ok = fwrite(bytes, ct_dtype_size(dtype), (size_t)k, f) == (size_t)k;
        }
        free(values);
        free(bytes);
        ok = fflush(f) == 0 && ok;
        ok = fclose(f) == 0 && ok;
        if (st == CT_OK)
            st = ct_file_publish(tmp, out, ok, "safetensors");
        else
            remove(tmp);
    }
    if (st == CT_OK) st = write_hf_config(out, dir, &m, !untied);
    free(t);
    ct_ckpt_manifest_release(&m);
    return st;
}
