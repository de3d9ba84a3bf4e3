/* hf.c — Hugging Face names, config.json, and reading a model into our tensors. See hf.h. */
#include "hf.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/model/model_arch.h"

/* ---- names ---------------------------------------------------------------------------------- */

/* Each architecture's names are its entry's (core/model/model_arch.h, ct_arch_hf); here they are
 * spelled out for every layer and expert of one model. */

static void add(ct_hf_tensor *t, const char *hf, bool transpose, const char *const *src,
                int n_src) {
    snprintf(t->name, sizeof t->name, "%s", hf);
    t->transpose = transpose;
    t->n_src = n_src;
    for (int s = 0; s < n_src; s++) snprintf(t->src[s], sizeof t->src[s], "%s", src[s]);
}

/* "<fmt of index>" + suffix: a name of layer `l` (and expert `e` in fmt2 when not NULL). */
static void layer_name(char *out, size_t size, const char *fmt, long long l, const char *fmt2,
                       long long e, const char *suffix) {
    char pre[64] = "", pre2[64] = "";
    snprintf(pre, sizeof pre, fmt, l);
    if (fmt2) snprintf(pre2, sizeof pre2, fmt2, e);
    snprintf(out, size, "%s%s%s", pre, pre2, suffix);
}

/* A layer's router and experts, in place of its MLP's tensors (ct_arch_hf: Mixtral's layout). */
static void add_moe_layer(ct_hf_tensor *t, int *n, const ct_arch_hf *hf, int64_t l,
                          int64_t experts) {
    char name[96], src[CT_CKPT_NAME], sfx[CT_CKPT_NAME];
    layer_name(name, sizeof name, hf->layer, l, NULL, 0, hf->router);
    snprintf(src, sizeof src, "layers.%lld.moe.router", (long long)l);
    add(&t[(*n)++], name, false, (const char *[]){src}, 1);
    for (int64_t e = 0; e < experts; e++)
        for (int k = 0; k < hf->n_expert_tensors; k++) {
            const ct_arch_hf_tensor *x = &hf->expert_tensors[k];
            layer_name(name, sizeof name, hf->layer, l, hf->expert, e, x->hf);
            snprintf(sfx, sizeof sfx, "moe.experts.%lld.%s", (long long)e, x->src[0]);
            layer_name(src, sizeof src, "layers.%lld.", l, NULL, 0, sfx);
            add(&t[(*n)++], name, x->transpose, (const char *[]){src}, 1);
        }
}

ct_hf_tensor *ct_hf_tensors(ct_arch arch, int64_t L, int64_t hd, bool untied, int64_t experts,
                            int *count) {
    const ct_arch_hf *hf = &ct_model_arch_of(arch)->hf;
    const bool moe = hf->router && experts > 0;
    const int per_layer = hf->n_layer_tensors + (moe ? 1 + hf->n_expert_tensors * (int)experts : 0);
    ct_hf_tensor *t = ct_xcalloc((size_t)(5 + per_layer * L), sizeof *t);
    int n = 0;
    add(&t[n++], hf->wte, false, (const char *[]){"wte"}, 1);
    if (hf->wpe) add(&t[n++], hf->wpe, false, (const char *[]){"wpe"}, 1);
    for (int64_t l = 0; l < L; l++) {
        bool mlp_done = false;
        for (int k = 0; k < hf->n_layer_tensors; k++) {
            const ct_arch_hf_tensor *x = &hf->layer_tensors[k];
            if (moe && !strncmp(x->src[0], "mlp.", 4)) { /* the MLP's become the experts' */
                if (!mlp_done) add_moe_layer(t, &n, hf, l, experts);
                mlp_done = true;
                continue;
            }
            char name[96], src[3][CT_CKPT_NAME];
            const char *srcs[3];
            int n_src = 0;
            layer_name(name, sizeof name, hf->layer, l, NULL, 0, x->hf);
            for (; n_src < 3 && x->src[n_src]; n_src++) {
                layer_name(src[n_src], sizeof src[n_src], "layers.%lld.", l, NULL, 0,
                           x->src[n_src]);
                srcs[n_src] = src[n_src];
            }
            add(&t[n], name, x->transpose, srcs, n_src);
            t[n++].rope_hd = x->rope ? hd : 0;
        }
    }
    add(&t[n++], hf->lnf_w, false, (const char *[]){"lnf.weight"}, 1);
    if (hf->lnf_b) add(&t[n++], hf->lnf_b, false, (const char *[]){"lnf.bias"}, 1);
    if (untied) add(&t[n++], "lm_head.weight", false, (const char *[]){"lm_head"}, 1);
    *count = n;
    return t;
}

/* ---- config.json ---------------------------------------------------------------------------- */

typedef struct jconfig {
    const char *path;
    json_t *root;
    const char *prefix; /* of the keys in messages: "" or "rope_scaling." */
} jconfig;

static ct_status bad_key(const jconfig *j, const char *key, const char *want) {
    ct_error(CT_ERR_INPUT, "config.json '%s': %s%s %s", j->path, j->prefix ? j->prefix : "", key,
             want);
    ct_hint("cooktrain reads the config.json of Hugging Face GPT-2, Llama and Mixtral models "
            "(transformers' GPT2Config, LlamaConfig, MixtralConfig)");
    return CT_ERR_INPUT;
}

/* An integer in [lo, hi]; absent or null gives def (required: an error). */
static ct_status get_int(const jconfig *j, const char *key, bool required, int64_t def, int64_t lo,
                         int64_t hi, int64_t *out) {
    json_t *v = json_object_get(j->root, key);
    char want[96];
    if (!v || json_is_null(v)) {
        if (required) return bad_key(j, key, "is missing");
        *out = def;
        return CT_OK;
    }
    snprintf(want, sizeof want, "is not an integer in [%lld, %lld]", (long long)lo, (long long)hi);
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return bad_key(j, key, want);
    *out = (int64_t)json_integer_value(v);
    return CT_OK;
}

/* A number in (lo, hi]; absent or null gives def. */
static ct_status get_num(const jconfig *j, const char *key, double def, double lo, double hi,
                         double *out) {
    json_t *v = json_object_get(j->root, key);
    char want[96];
    if (!v || json_is_null(v)) {
        *out = def;
        return CT_OK;
    }
    snprintf(want, sizeof want, "is not a number in (%g, %g]", lo, hi);
    if (!json_is_number(v) || !(json_number_value(v) > lo && json_number_value(v) <= hi))
        return bad_key(j, key, want);
    *out = json_number_value(v);
    return CT_OK;
}

/* Absent, or one of the strings in `ok` (NULL-terminated; ok[0] is the default). */
static ct_status expect_str(const jconfig *j, const char *key, const char *const *ok) {
    json_t *v = json_object_get(j->root, key);
    if (!v || json_is_null(v)) return CT_OK;
    for (int i = 0; ok[i] && json_is_string(v); i++)
        if (!strcmp(json_string_value(v), ok[i])) return CT_OK;
    char want[128];
    snprintf(want, sizeof want, "is not \"%s\", the only value cooktrain supports", ok[0]);
    return bad_key(j, key, want);
}

/* Absent (meaning def), or the boolean `want`. */
static ct_status expect_bool(const jconfig *j, const char *key, bool def, bool want,
                             const char *why) {
    json_t *v = json_object_get(j->root, key);
    if (!v || json_is_null(v) ? def == want : json_is_boolean(v) && json_is_true(v) == want)
        return CT_OK;
    return bad_key(j, key, why);
}

/* A boolean; absent or null gives def. */
static ct_status get_bool(const jconfig *j, const char *key, bool def, bool *out) {
    json_t *v = json_object_get(j->root, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return CT_OK;
    }
    if (!json_is_boolean(v)) return bad_key(j, key, "is not true or false");
    *out = json_is_true(v);
    return CT_OK;
}

static ct_status parse_gpt2(const jconfig *j, ct_hf_config *c) {
    CT_TRY(get_int(j, "vocab_size", true, 0, 1, 2147483647, &c->vocab_size));
    CT_TRY(get_int(j, "n_positions", true, 0, 1, 1048576, &c->max_positions));
    CT_TRY(get_int(j, "n_embd", true, 0, 1, 1048576, &c->d_model));
    CT_TRY(get_int(j, "n_layer", true, 0, 1, 65536, &c->n_layer));
    CT_TRY(get_int(j, "n_head", true, 0, 1, 65536, &c->n_head));
    CT_TRY(get_int(j, "n_inner", false, 4 * c->d_model, 1, 16777216, &c->d_ff));
    c->n_kv_head = c->n_head;
    double eps;
    CT_TRY(get_num(j, "layer_norm_epsilon", 1e-5, 0, 1, &eps));
    if (eps != 1e-5) return bad_key(j, "layer_norm_epsilon", "is not 1e-5, GPT-2's (and ours)");
    CT_TRY(expect_str(j, "activation_function",
                      (const char *const[]){"gelu_new", "gelu_pytorch_tanh", NULL}));
    return get_bool(j, "tie_word_embeddings", true, &c->tied);
}

static ct_status parse_llama(const jconfig *j, ct_hf_config *c) {
    c->arch = CT_ARCH_LLAMA;
    CT_TRY(get_int(j, "vocab_size", true, 0, 1, 2147483647, &c->vocab_size));
    CT_TRY(get_int(j, "max_position_embeddings", true, 0, 1, 1048576, &c->max_positions));
    CT_TRY(get_int(j, "hidden_size", true, 0, 1, 1048576, &c->d_model));
    CT_TRY(get_int(j, "intermediate_size", true, 0, 1, 16777216, &c->d_ff));
    CT_TRY(get_int(j, "num_hidden_layers", true, 0, 1, 65536, &c->n_layer));
    CT_TRY(get_int(j, "num_attention_heads", true, 0, 1, 65536, &c->n_head));
    CT_TRY(get_int(j, "num_key_value_heads", false, c->n_head, 1, 65536, &c->n_kv_head));
    CT_TRY(get_num(j, "rms_norm_eps", 1e-6, 0, 1, &c->norm_eps));
    CT_TRY(get_num(j, "rope_theta", 10000, 1, 1e12, &c->rope_theta));
    CT_TRY(expect_str(j, "hidden_act", (const char *const[]){"silu", NULL}));
    int64_t head_dim;
    CT_TRY(get_int(j, "head_dim", false, c->d_model / c->n_head, 1, 1048576, &head_dim));
    if (head_dim * c->n_head != c->d_model)
        return bad_key(j, "head_dim", "is not hidden_size / num_attention_heads");
    json_t *scaling = json_object_get(j->root, "rope_scaling");
    if (scaling && !json_is_null(scaling)) {
        /* Llama 3.1's scaling; its keys read as the top level's are (get_* take j->root) */
        jconfig r = {.path = j->path, .root = scaling, .prefix = "rope_scaling."};
        json_t *type = json_object_get(scaling, "rope_type");
        if (!type) type = json_object_get(scaling, "type"); /* older transformers */
        if (!json_is_object(scaling) || !json_is_string(type) ||
            strcmp(json_string_value(type), "llama3"))
            return bad_key(j, "rope_scaling",
                           "is not of rope_type \"llama3\", the only scaling cooktrain reads");
        CT_TRY(get_num(&r, "factor", 0, 0, 1024, &c->rope_factor));
        CT_TRY(get_num(&r, "low_freq_factor", 0, 0, 1e6, &c->rope_low));
        CT_TRY(get_num(&r, "high_freq_factor", 0, c->rope_low, 1e6, &c->rope_high));
        CT_TRY(get_int(&r, "original_max_position_embeddings", true, 0, 1, 1048576,
                       &c->rope_original));
        if (c->rope_factor == 0 || c->rope_low == 0)
            return bad_key(j, "rope_scaling", "lacks factor or low_freq_factor");
    }
    CT_TRY(expect_bool(j, "attention_bias", false, false, "is true: Llama has no biases"));
    CT_TRY(expect_bool(j, "mlp_bias", false, false, "is true: Llama has no biases"));
    return get_bool(j, "tie_word_embeddings", false, &c->tied);
}

/* Mixtral: Llama's attention and norms, every layer's MLP a sparse MoE of num_local_experts
 * SwiGLU experts of width intermediate_size, num_experts_per_tok a token by softmax-then-top-k,
 * renormalised (cooktrain's topk_softmax router); full attention (no sliding window shorter than
 * the context). */
static ct_status parse_mixtral(const jconfig *j, ct_hf_config *c) {
    CT_TRY(parse_llama(j, c));
    CT_TRY(get_int(j, "num_local_experts", true, 0, 1, 4096, &c->moe_experts));
    CT_TRY(get_int(j, "num_experts_per_tok", true, 0, 1, c->moe_experts, &c->moe_top_k));
    CT_TRY(get_num(j, "router_aux_loss_coef", 0.001, -1, 1000, &c->moe_aux_alpha));
    if (c->moe_aux_alpha < 0) return bad_key(j, "router_aux_loss_coef", "is negative");
    int64_t window;
    CT_TRY(get_int(j, "sliding_window", false, c->max_positions, 1, 1 << 30, &window));
    if (window < c->max_positions)
        return bad_key(j, "sliding_window",
                       "is shorter than max_position_embeddings: cooktrain's attention sees the "
                       "whole context");
    return CT_OK;
}

ct_status ct_hf_config_parse(const char *path, const char *json, size_t len, ct_hf_config *out) {
    memset(out, 0, sizeof *out);
    json_error_t err;
    jconfig j = {.path = path, .root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &err)};
    ct_status st = CT_OK;
    if (!j.root || !json_is_object(j.root)) {
        ct_error(CT_ERR_INPUT, "config.json '%s' is not a JSON object (%s)", path,
                 j.root ? "another JSON value" : err.text);
        ct_hint("a Hugging Face model's config.json, as transformers writes it");
        st = CT_ERR_INPUT;
    }
    json_t *type = st == CT_OK ? json_object_get(j.root, "model_type") : NULL;
    if (st == CT_OK && json_is_string(type) && !strcmp(json_string_value(type), "gpt2"))
        st = parse_gpt2(&j, out);
    else if (st == CT_OK && json_is_string(type) && !strcmp(json_string_value(type), "llama"))
        st = parse_llama(&j, out);
    else if (st == CT_OK && json_is_string(type) && !strcmp(json_string_value(type), "mixtral"))
        st = parse_mixtral(&j, out);
    else if (st == CT_OK)
        st = bad_key(&j, "model_type", "is not \"gpt2\", \"llama\" or \"mixtral\"");
    json_decref(j.root);
    return st;
}

/* ---- a model -------------------------------------------------------------------------------- */

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static bool exists(const char *dir, const char *name) {
    char path[CT_PATH_MAX + 64];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &sb) == 0;
}

bool ct_hf_is_model(const char *path) {
    return ends_with(path, ".safetensors") ||
           (exists(path, "config.json") && !exists(path, "manifest.bin"));
}

/* The files a sharded model's model.safetensors.index.json names (weight_map's values), each
 * a plain file name in dir, at most MAX_FILES of them; *names malloc'd, each entry CT_PATH_MAX
 * bytes. */
enum { MAX_FILES = 4096 };
static ct_status index_files(const char *dir, char (**names)[CT_PATH_MAX], int *n) {
    char path[CT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    uint8_t *text;
    size_t len;
    CT_TRY(ct_read_regular(path, "safetensors index", 64 << 20, &text, &len));
    json_error_t err;
    json_t *root = json_loadb((const char *)text, len, JSON_REJECT_DUPLICATES, &err);
    free(text);
    json_t *map = root ? json_object_get(root, "weight_map") : NULL;
    *names = NULL;
    *n = 0;
    ct_status st = CT_OK;
    if (!json_is_object(map)) {
        ct_error(CT_ERR_INPUT, "safetensors index '%s' has no weight_map object", path);
        st = CT_ERR_INPUT;
    }
    const char *key;
    json_t *v;
    int cap = 0;
    if (st == CT_OK) {
        json_object_foreach(map, key, v) {
            const char *f = json_string_value(v);
            if (!f || !f[0] || strchr(f, '/') || !strcmp(f, "..") || strlen(f) >= CT_PATH_MAX ||
                !ends_with(f, ".safetensors")) {
                ct_error(CT_ERR_INPUT,
                         "safetensors index '%s': tensor %.96s maps to a file that is not a "
                         ".safetensors file beside the index",
                         path, key);
                st = CT_ERR_INPUT;
                break;
            }
            int i = 0;
            while (i < *n && strcmp((*names)[i], f)) i++;
            if (i < *n) continue;
            if (*n == MAX_FILES) { /* the names grow with distinct files, not with entries */
                ct_error(CT_ERR_INPUT, "safetensors index '%s' names more than %d files", path,
                         MAX_FILES);
                st = CT_ERR_INPUT;
                break;
            }
            if (*n == cap) {
                cap = cap ? 2 * cap : 8;
                *names = realloc(*names, (size_t)cap * sizeof **names);
                CT_ASSERT(*names != NULL);
            }
            snprintf((*names)[(*n)++], CT_PATH_MAX, "%s", f);
        }
    }
    if (st != CT_OK) ct_hint("the index must be as transformers writes it, beside its files");
    json_decref(root);
    return st;
}

/* A tensor by its Hugging Face name, in whichever file holds it; also with the architecture's
 * state-dict prefix where it has one (GPT2LMHeadModel's "transformer."). */
static const ct_st_tensor *find(const ct_hf_model *m, const char *name, int *file) {
    const char *prefix = ct_model_arch_of(m->config.arch)->hf.state_prefix;
    char prefixed[160];
    snprintf(prefixed, sizeof prefixed, "%s%s", prefix ? prefix : "", name);
    for (int f = 0; f < m->n_files; f++) {
        const ct_st_tensor *t = ct_safetensors_find(&m->files[f], name);
        if (!t && prefix) t = ct_safetensors_find(&m->files[f], prefixed);
        if (t) {
            *file = f;
            return t;
        }
    }
    return NULL;
}

ct_status ct_hf_open(const char *path, ct_hf_model *m) {
    memset(m, 0, sizeof *m);
    char(*names)[CT_PATH_MAX] = NULL;
    int n = 0;
    ct_status st = CT_OK;
    if (ends_with(path, ".safetensors")) {
        const char *slash = strrchr(path, '/');
        snprintf(m->dir, sizeof m->dir, "%.*s", slash ? (int)(slash - path) : 1,
                 slash ? path : ".");
        names = ct_xcalloc(1, sizeof *names);
        snprintf(names[0], CT_PATH_MAX, "%s", slash ? slash + 1 : path);
        n = 1;
    } else {
        snprintf(m->dir, sizeof m->dir, "%s", path);
        if (exists(path, "model.safetensors")) {
            names = ct_xcalloc(1, sizeof *names);
            snprintf(names[0], CT_PATH_MAX, "model.safetensors");
            n = 1;
        } else if (exists(path, "model.safetensors.index.json")) {
            st = index_files(path, &names, &n);
        } else {
            ct_error(CT_ERR_INPUT,
                     "'%s' holds neither model.safetensors nor model.safetensors.index.json", path);
            ct_hint("name a Hugging Face model directory (config.json and safetensors) or its "
                    ".safetensors file");
            st = CT_ERR_INPUT;
        }
    }
    char file[CT_PATH_MAX * 2 + 8];
    if (st == CT_OK) {
        snprintf(file, sizeof file, "%s/config.json", m->dir);
        uint8_t *text;
        size_t len;
        st = ct_read_regular(file, "config.json", 1 << 20, &text, &len);
        if (st == CT_OK) {
            st = ct_hf_config_parse(file, (const char *)text, len, &m->config);
            free(text);
        }
    }
    if (st == CT_OK) m->files = ct_xcalloc((size_t)CT_MAX(n, 1), sizeof *m->files);
    for (int i = 0; i < n && st == CT_OK; i++) {
        snprintf(file, sizeof file, "%s/%s", m->dir, names[i]);
        st = ct_safetensors_open(file, &m->files[i]);
        if (st == CT_OK) m->n_files++;
        for (int k = 0; k < m->files[i].n && st == CT_OK; k++) {
            int other = i;
            const ct_st_tensor *t = find(m, m->files[i].tensors[k].name, &other);
            if (other != i) {
                ct_error(CT_ERR_INPUT, "tensor %s is in both '%s' and '%s'", t->name,
                         m->files[other].path, file);
                ct_hint("a sharded model holds each tensor in one file");
                st = CT_ERR_INPUT;
            }
        }
    }
    free(names);
    if (st == CT_OK)
        m->names =
            ct_hf_tensors(m->config.arch, m->config.n_layer, m->config.d_model / m->config.n_head,
                          !m->config.tied, m->config.moe_experts, &m->n_names);
    if (st != CT_OK) ct_hf_close(m);
    return st;
}

void ct_hf_close(ct_hf_model *m) {
    for (int i = 0; i < m->n_files; i++) ct_safetensors_close(&m->files[i]);
    free(m->files);
    free(m->names);
    memset(m, 0, sizeof *m);
}

void ct_hf_model_config(const ct_hf_config *hf, ct_model_config *mc) {
    mc->arch = hf->arch;
    mc->vocab_size = hf->vocab_size;
    mc->seq_len = hf->max_positions;
    mc->n_layer = hf->n_layer;
    mc->d_model = hf->d_model;
    mc->n_head = hf->n_head;
    mc->n_kv_head = hf->n_kv_head;
    mc->d_ff = hf->d_ff;
    mc->tie_embeddings = hf->tied;
    if (hf->moe_experts > 0) { /* mixtral */
        mc->moe_experts = hf->moe_experts;
        mc->moe_top_k = hf->moe_top_k;
        mc->moe_every = 1;
        mc->moe_d_ff = hf->d_ff;
        mc->moe_router = CT_MOE_TOPK_SOFTMAX;
        mc->moe_shared = 0;
        mc->moe_aux_alpha = hf->moe_aux_alpha;
    }
    if (hf->arch == CT_ARCH_LLAMA) {
        mc->norm_eps = hf->norm_eps;
        mc->rope_theta = hf->rope_theta;
        mc->rope_scaling_factor = hf->rope_factor;
        if (hf->rope_factor > 0) {
            mc->rope_low_freq_factor = hf->rope_low;
            mc->rope_high_freq_factor = hf->rope_high;
            mc->rope_original_max_pos = hf->rope_original;
        }
    }
}

ct_status ct_hf_check_config(const ct_hf_model *m, const ct_config *cfg) {
    const ct_hf_config *h = &m->config;
    const ct_model_config *mc = &cfg->model;
    const bool llama = h->arch == CT_ARCH_LLAMA, moe = h->moe_experts > 0;
    const struct {
        const char *key, *theirs;
        double hf, ours;
        bool differ;
    } keys[] = {
        {"arch", "model_type", h->arch, mc->arch, h->arch != mc->arch},
        {"vocab_size", "vocab_size", h->vocab_size, mc->vocab_size,
         h->vocab_size != mc->vocab_size},
        {"n_layer", llama ? "num_hidden_layers" : "n_layer", h->n_layer, mc->n_layer,
         h->n_layer != mc->n_layer},
        {"d_model", llama ? "hidden_size" : "n_embd", h->d_model, mc->d_model,
         h->d_model != mc->d_model},
        {"n_head", llama ? "num_attention_heads" : "n_head", h->n_head, mc->n_head,
         h->n_head != mc->n_head},
        {"n_kv_head", "num_key_value_heads", h->n_kv_head, cfg->derived.n_kv_head,
         h->n_kv_head != cfg->derived.n_kv_head},
        {"d_ff", llama ? "intermediate_size" : "n_inner", h->d_ff, cfg->derived.d_ff,
         !moe && h->d_ff != cfg->derived.d_ff},
        {"moe_experts", "num_local_experts", h->moe_experts, mc->moe_experts,
         h->moe_experts != mc->moe_experts},
        {"moe_top_k", "num_experts_per_tok", h->moe_top_k, mc->moe_top_k,
         moe && h->moe_top_k != mc->moe_top_k},
        {"moe_d_ff", "intermediate_size", h->d_ff, cfg->derived.moe_d_ff,
         moe && h->d_ff != cfg->derived.moe_d_ff},
        {"norm_eps", "rms_norm_eps", h->norm_eps, mc->norm_eps,
         llama && h->norm_eps != mc->norm_eps},
        {"rope_theta", "rope_theta", h->rope_theta, mc->rope_theta,
         llama && h->rope_theta != mc->rope_theta},
        {"rope_scaling_factor", "rope_scaling.factor", h->rope_factor, mc->rope_scaling_factor,
         llama && h->rope_factor != mc->rope_scaling_factor},
        {"rope_low_freq_factor", "rope_scaling.low_freq_factor", h->rope_low,
         mc->rope_low_freq_factor,
         llama && h->rope_factor > 0 && h->rope_low != mc->rope_low_freq_factor},
        {"rope_high_freq_factor", "rope_scaling.high_freq_factor", h->rope_high,
         mc->rope_high_freq_factor,
         llama && h->rope_factor > 0 && h->rope_high != mc->rope_high_freq_factor},
        {"rope_original_max_pos", "rope_scaling.original_max_position_embeddings",
         (double)h->rope_original, (double)mc->rope_original_max_pos,
         llama && h->rope_factor > 0 && h->rope_original != mc->rope_original_max_pos},
        {"tie_embeddings", "tie_word_embeddings", h->tied, mc->tie_embeddings,
         h->tied != mc->tie_embeddings},
        {"seq_len", "n_positions", h->max_positions, mc->seq_len,
         !llama && mc->seq_len > h->max_positions},
    };
    if (moe &&
        (mc->moe_every != 1 || mc->moe_shared != 0 || mc->moe_router != CT_MOE_TOPK_SOFTMAX)) {
        ct_error(CT_ERR_INPUT,
                 "model.init_from '%s' is a Mixtral model (every layer's MLP sparse, no shared "
                 "experts, softmax-then-top-k routing), this run has model.moe_every=%lld, "
                 "moe_shared=%lld, moe_router=%s",
                 m->dir, (long long)mc->moe_every, (long long)mc->moe_shared,
                 ct_moe_router_names[mc->moe_router]);
        ct_hint("set model.moe_every: 1, model.moe_shared: 0 and model.moe_router: topk_softmax "
                "(`cooktrain import` prints the keys of a model)");
        return CT_ERR_INPUT;
    }
    for (size_t i = 0; i < CT_ARRAY_LEN(keys); i++) {
        const bool differ = keys[i].differ;
        if (!differ) continue;
        if (i == 0)
            ct_error(CT_ERR_INPUT,
                     "model.init_from '%s' is a %s model, this run's model.arch is %s", m->dir,
                     llama ? "llama" : "gpt2", llama ? "gpt2" : "llama");
        else if (i + 1 == CT_ARRAY_LEN(keys))
            ct_error(CT_ERR_INPUT,
                     "model.init_from '%s' has %.17g learned positions (n_positions), this run's "
                     "model.seq_len is %.17g",
                     m->dir, keys[i].hf, keys[i].ours);
        else
            ct_error(CT_ERR_INPUT,
                     "model.init_from '%s' has %s %.17g in its config.json, this run's "
                     "model.%s is %.17g",
                     m->dir, keys[i].theirs, keys[i].hf, keys[i].key, keys[i].ours);
        ct_hint("the run's model keys must describe the model it starts from: set model.%s "
                "(`cooktrain import` prints the keys of a model)",
                keys[i].key);
        return CT_ERR_INPUT;
    }
    return CT_OK;
}

ct_status ct_hf_read(const ct_hf_model *m, const char *name, int64_t rows, int64_t cols,
                     float *out) {
    const ct_hf_tensor *e = NULL;
    int s = 0;
    for (int i = 0; i < m->n_names && !e; i++)
        for (s = 0; s < m->names[i].n_src; s++)
            if (!strcmp(m->names[i].src[s], name)) {
                e = &m->names[i];
                break;
            }
    CT_ASSERTF(e != NULL, "%s has no Hugging Face tensor", name);
    int file = 0;
    const ct_st_tensor *t = find(m, e->name, &file);
    if (!t) {
        ct_error(CT_ERR_INPUT, "Hugging Face model '%s' has no tensor %s", m->dir, e->name);
        ct_hint("the safetensors files must hold every tensor of the model config.json "
                "describes");
        return CT_ERR_INPUT;
    }
    /* The stacked tensor's shape in our orientation: rows_hf x cols. */
    const bool wte = !strcmp(name, "wte") || !strcmp(name, "lm_head"), wpe = !strcmp(name, "wpe");
    const int64_t rows_hf = wte   ? m->config.vocab_size
                            : wpe ? m->config.max_positions
                                  : e->n_src * rows;
    const int64_t keep = wte ? m->config.vocab_size : rows; /* rows of ours from the file */
    const bool vector = cols == 1;
    const int ndim = vector ? 1 : 2;
    const int64_t want0 = e->transpose ? cols : rows_hf, want1 = e->transpose ? rows_hf : cols;
    if (t->ndim != ndim || t->shape[0] != want0 || (ndim == 2 && t->shape[1] != want1) ||
        keep > rows || s * rows + keep > rows_hf) {
        ct_error(CT_ERR_INPUT,
                 "safetensors '%s': tensor %s has shape [%lld, %lld] (%d dims), the model its "
                 "config.json describes needs [%lld, %lld] (%d dims)",
                 m->files[file].path, t->name, (long long)t->shape[0], (long long)t->shape[1],
                 t->ndim, (long long)want0, (long long)(ndim == 2 ? want1 : 1), ndim);
        ct_hint("config.json and the safetensors files must belong to the same model");
        return CT_ERR_INPUT;
    }
    float *hf = ct_xmalloc((size_t)t->numel * sizeof(float));
    ct_status st = ct_safetensors_read(&m->files[file], t, hf);
    if (st != CT_OK) {
        free(hf);
        return st;
    }
    /* Row r of ours (stack row s·rows + r) in Hugging Face's tensor, as element (row, col). */
    const int64_t hd = e->rope_hd, half = hd / 2;
    for (int64_t r = 0; r < keep; r++) {
        int64_t row = (int64_t)s * rows + r;
        if (hd > 0) /* our row 2i + j of a head is Hugging Face's row j·hd/2 + i (export.h) */
            row = row / hd * hd + (row % hd % 2) * half + row % hd / 2;
        for (int64_t c = 0; c < cols; c++)
            out[r * cols + c] = e->transpose ? hf[c * rows_hf + row] : hf[row * cols + c];
    }
    memset(out + keep * cols, 0, (size_t)((rows - keep) * cols) * sizeof(float));
    free(hf);
    return CT_OK;
}
