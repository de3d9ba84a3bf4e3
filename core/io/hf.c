/* hf.c — Hugging Face names, config.json, and reading a model into our tensors. See hf.h. */
#include "hf.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/model/model.h"
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

/* How many tensors ct_hf_tensors lists: computed from the counts alone, so that a config.json
 * can be checked against the files before the list is allocated. */
static int64_t tensor_count(ct_arch arch, int64_t L, bool untied, int64_t experts) {
    const ct_arch_hf *hf = &ct_model_arch_of(arch)->hf;
    const bool moe = hf->router && experts > 0;
    int64_t mlp = 0, per_layer;
    for (int k = 0; k < hf->n_layer_tensors; k++)
        mlp += !strncmp(hf->layer_tensors[k].src[0], "mlp.", 4);
    per_layer = hf->n_layer_tensors - (moe ? mlp : 0) +
                (moe && mlp ? 1 + hf->n_expert_tensors * experts : 0);
    return 1 + (hf->wpe != NULL) + per_layer * L + 1 + (hf->lnf_b != NULL) + untied;
}

ct_hf_tensor *ct_hf_tensors(ct_arch arch, int64_t L, int64_t hd, bool untied, int64_t experts,
                            int *count) {
    const ct_arch_hf *hf = &ct_model_arch_of(arch)->hf;
    const bool moe = hf->router && experts > 0;
    ct_hf_tensor *t = ct_xcalloc((size_t)tensor_count(arch, L, untied, experts), sizeof *t);
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
    CT_ASSERT(n == tensor_count(arch, L, untied, experts));
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

ct_status ct_hf_check_path(const char *what, const char *path) {
    const size_t len = strlen(path);
    if (len == 0) {
        ct_error(CT_ERR_INPUT, "%s is an empty path", what);
        ct_hint("name a directory (\".\" for this one)");
        return CT_ERR_INPUT;
    }
    if (len <= CT_HF_PATH_MAX) return CT_OK;
    ct_error(CT_ERR_INPUT,
             "%s '%.48s...' is %zu characters long, longer than the %d cooktrain takes", what, path,
             len, CT_HF_PATH_MAX);
    ct_hint("use a shorter path (a relative one, or a symbolic link to the directory)");
    return CT_ERR_INPUT;
}

/* The files a sharded model's model.safetensors.index.json names (weight_map's values), each
 * a plain file name in dir, at most MAX_FILES of them; *names malloc'd, each entry CT_PATH_MAX
 * bytes. */
enum { MAX_FILES = 4096 };
static ct_status index_files(const char *dir, char (**names)[CT_PATH_MAX], int *n) {
    char path[CT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    *names = NULL;
    *n = 0;
    uint8_t *text;
    size_t len;
    CT_TRY(ct_read_regular(path, "safetensors index", 64 << 20, &text, &len));
    json_error_t err;
    json_t *root = json_loadb((const char *)text, len, JSON_REJECT_DUPLICATES, &err);
    free(text);
    json_t *map = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    ct_status st = CT_OK;
    if (!root) { /* jansson's words: empty, cut, too deep, a duplicate key... */
        ct_error(CT_ERR_INPUT, "safetensors index '%s': JSON error at line %d, column %d: %s", path,
                 err.line, err.column, err.text);
        st = CT_ERR_INPUT;
    } else if (!json_is_object(map)) {
        ct_error(CT_ERR_INPUT, "safetensors index '%s' has no weight_map object%s", path,
                 json_is_object(root) ? "" : " (it is not a JSON object)");
        st = CT_ERR_INPUT;
    }
    const char *key;
    json_t *v;
    int cap = 0;
    if (st == CT_OK) {
        json_object_foreach(map, key, v) {
            const char *f = json_string_value(v);
            if (!f || !f[0] || strchr(f, '/') || !strcmp(f, "..") ||
                !ends_with(f, ".safetensors")) {
                ct_error(CT_ERR_INPUT,
                         "safetensors index '%s': tensor %.96s maps to a file that is not a "
                         ".safetensors file beside the index",
                         path, key);
                st = CT_ERR_INPUT;
                break;
            }
            if (strlen(dir) + 1 + strlen(f) >= CT_PATH_MAX) {
                ct_error(CT_ERR_INPUT,
                         "safetensors index '%s': tensor %.96s maps to '%.48s...', whose path is "
                         "longer than the %d characters cooktrain takes",
                         path, key, f, CT_PATH_MAX - 1);
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

/* ---- the files' tensors by name ------------------------------------------------------------- */

static int entry_by_name(const void *a, const void *b) {
    return strcmp(((const ct_hf_entry *)a)->t->name, ((const ct_hf_entry *)b)->t->name);
}

static int name_vs_entry(const void *name, const void *e) {
    return strcmp(name, ((const ct_hf_entry *)e)->t->name);
}

static ct_hf_entry *lookup(const ct_hf_model *m, const char *name) {
    if (m->n_index == 0) return NULL;
    return bsearch(name, m->index, (size_t)m->n_index, sizeof *m->index, name_vs_entry);
}

/* A tensor by its Hugging Face name, in whichever file holds it; also with the architecture's
 * state-dict prefix where it has one (GPT2LMHeadModel's "transformer."). *twin (when not NULL):
 * the prefixed one when both are there, else NULL. */
static ct_hf_entry *find(const ct_hf_model *m, const char *name, ct_hf_entry **twin) {
    const char *prefix = ct_model_arch_of(m->config.arch)->hf.state_prefix;
    ct_hf_entry *plain = lookup(m, name), *prefixed = NULL;
    if (prefix) {
        char buf[CT_ST_NAME + 32];
        snprintf(buf, sizeof buf, "%s%s", prefix, name);
        prefixed = lookup(m, buf);
    }
    if (twin) *twin = plain ? prefixed : NULL;
    return plain ? plain : prefixed;
}

/* A tensor that could be a weight: floating point, of one or two dimensions. Others (a causal
 * mask of BOOL or of four dimensions, a scalar) are buffers, left alone. */
static bool weight_like(const ct_st_tensor *t) {
    return t->dtype != CT_ST_OTHER && t->ndim >= 1 && t->ndim <= 2;
}

/* Whether `name` begins with the text of the printf format `fmt` (one %lld: "model.layers.%lld."):
 * *index the number there (a number of ten digits or more reads as INT64_MAX) and *rest what
 * follows the format. */
static bool format_index(const char *fmt, const char *name, int64_t *index, const char **rest) {
    const char *at = strstr(fmt, "%lld"), *post = at + 4;
    CT_ASSERT(at != NULL);
    const size_t pre = (size_t)(at - fmt);
    if (strncmp(name, fmt, pre) != 0) return false;
    const char *p = name + pre, *q = p;
    while (*q >= '0' && *q <= '9') q++;
    if (q == p || strncmp(q, post, strlen(post)) != 0) return false;
    *index = q - p < 10 ? strtoll(p, NULL, 10) : INT64_MAX;
    *rest = q + strlen(post);
    return true;
}

/* The key of config.json that counts the layers. */
static const char *layers_key(const ct_hf_config *c) {
    return c->arch == CT_ARCH_LLAMA ? "num_hidden_layers" : "n_layer";
}

/* Before anything is allocated by config.json's counts: the model they describe must have no
 * more tensors than the files hold (each is in them once). A few more (at most MISSING_NAMED)
 * pass, so that index_tensors names the first tensor missing: the name table stays within the
 * files' count plus that. */
enum { MISSING_NAMED = 64 };
static ct_status check_count(const ct_hf_model *m, int64_t total) {
    const ct_hf_config *c = &m->config;
    const int64_t need = tensor_count(c->arch, c->n_layer, !c->tied, c->moe_experts);
    if (need <= total + MISSING_NAMED) return CT_OK;
    char experts[96] = "";
    if (c->moe_experts > 0)
        snprintf(experts, sizeof experts, " of num_local_experts %lld", (long long)c->moe_experts);
    ct_error(CT_ERR_INPUT,
             "config.json '%s/config.json': a model of %s %lld%s has %lld tensors, the "
             "safetensors files hold %lld",
             m->dir, layers_key(c), (long long)c->n_layer, experts, (long long)need,
             (long long)total);
    ct_hint("config.json and the safetensors files must belong to the same model");
    return CT_ERR_INPUT;
}

/* The files' tensors sorted by name, each tensor of the model found once and marked used; a
 * name in two files, a tensor under two names, a missing one, and a layer or an expert past
 * config.json's counts are CT_ERR_INPUT. */
static ct_status index_tensors(ct_hf_model *m, int64_t total) {
    const ct_hf_config *c = &m->config;
    m->index = ct_xcalloc((size_t)CT_MAX(total, 1), sizeof *m->index);
    for (int f = 0; f < m->n_files; f++)
        for (int k = 0; k < m->files[f].n; k++)
            m->index[m->n_index++] = (ct_hf_entry){.t = &m->files[f].tensors[k], .file = f};
    qsort(m->index, (size_t)m->n_index, sizeof *m->index, entry_by_name);
    for (int64_t i = 1; i < m->n_index; i++)
        if (!strcmp(m->index[i].t->name, m->index[i - 1].t->name)) {
            ct_error(CT_ERR_INPUT, "tensor %s is in both '%s' and '%s'", m->index[i].t->name,
                     m->files[m->index[i - 1].file].path, m->files[m->index[i].file].path);
            ct_hint("a sharded model holds each tensor in one file");
            return CT_ERR_INPUT;
        }
    for (int i = 0; i < m->n_names; i++) {
        ct_hf_entry *twin, *e = find(m, m->names[i].name, &twin);
        if (!e) {
            ct_error(CT_ERR_INPUT, "Hugging Face model '%s' has no tensor %s", m->dir,
                     m->names[i].name);
            ct_hint("the safetensors files must hold every tensor of the model config.json "
                    "describes");
            return CT_ERR_INPUT;
        }
        if (twin) {
            ct_error(CT_ERR_INPUT,
                     "Hugging Face model '%s' holds tensor %s under two names: %s in '%s' and "
                     "%s in '%s'",
                     m->dir, m->names[i].name, e->t->name, m->files[e->file].path, twin->t->name,
                     m->files[twin->file].path);
            ct_hint("a model's files hold each tensor once: the whole model's state dict or its "
                    "base model's, not both");
            return CT_ERR_INPUT;
        }
        e->used = true;
    }
    /* What is left: a layer or an expert config.json does not count is a model other than the
     * one it describes (refused: importing part of a model gives another model); anything else
     * is reported by ct_hf_report_unused. */
    const ct_arch_hf *hf = &ct_model_arch_of(c->arch)->hf;
    const size_t plen = hf->state_prefix ? strlen(hf->state_prefix) : 0;
    for (int64_t i = 0; i < m->n_index; i++) {
        const ct_st_tensor *t = m->index[i].t;
        const char *name = t->name, *rest, *rest2;
        int64_t layer, expert;
        if (m->index[i].used) continue;
        if (plen && !strncmp(name, hf->state_prefix, plen)) name += plen;
        if (!format_index(hf->layer, name, &layer, &rest)) continue;
        const bool past_layer = layer >= c->n_layer;
        const bool past_expert = !past_layer && c->moe_experts > 0 && hf->expert &&
                                 format_index(hf->expert, rest, &expert, &rest2) &&
                                 expert >= c->moe_experts;
        if (!past_layer && !past_expert) continue;
        char what[96];
        if (past_layer)
            snprintf(what, sizeof what, "%s is %lld", layers_key(c), (long long)c->n_layer);
        else
            snprintf(what, sizeof what, "num_local_experts is %lld", (long long)c->moe_experts);
        ct_error(CT_ERR_INPUT,
                 "safetensors '%s' holds tensor %s, of a %s past the model of '%s/config.json' "
                 "(its %s)",
                 m->files[m->index[i].file].path, t->name, past_layer ? "layer" : "expert", m->dir,
                 what);
        ct_hint("config.json and the safetensors files must describe the same model: import "
                "does not cut a model to fit its config.json");
        return CT_ERR_INPUT;
    }
    return CT_OK;
}

void ct_hf_report_unused(const ct_hf_model *m, FILE *out) {
    int64_t n = 0;
    bool lm_head = false;
    char list[400] = "";
    for (int64_t i = 0; i < m->n_index; i++) {
        const ct_st_tensor *t = m->index[i].t;
        if (m->index[i].used || !weight_like(t)) continue;
        if (++n <= 3) {
            size_t at = strlen(list);
            snprintf(list + at, sizeof list - at, "%s%s", n > 1 ? ", " : "", t->name);
        }
        lm_head = lm_head || !strcmp(t->name, "lm_head.weight");
    }
    if (n == 0) return;
    fprintf(out,
            "cooktrain: warning: Hugging Face model '%s': %lld tensor%s the model of its "
            "config.json does not use, left out: %s%s\n",
            m->dir, (long long)n, n > 1 ? "s" : "", list, n > 3 ? ", ..." : "");
    if (lm_head && m->config.tied)
        fprintf(out, "hint: tie_word_embeddings is true: the LM head is the embedding, and "
                     "lm_head.weight is not read (set it to false in config.json to use it)\n");
    else
        fprintf(out, "hint: if the model needs them, its config.json describes another model "
                     "(buffers such as rotary_emb.inv_freq are recomputed and can be ignored)\n");
}

/* ---- opening a model ------------------------------------------------------------------------ */

/* A model's path must name something that is there: a directory or a .safetensors file. */
static ct_status check_source(const char *path) {
    struct stat sb;
    const int rc = stat(path, &sb);
    if (rc == 0 && (S_ISDIR(sb.st_mode) || ends_with(path, ".safetensors"))) return CT_OK;
    if (rc != 0 && errno == ENOENT)
        ct_error(CT_ERR_INPUT, "Hugging Face model '%s' does not exist", path);
    else if (rc != 0)
        ct_error(CT_ERR_INPUT, "cannot read Hugging Face model '%s': %s", path, strerror(errno));
    else
        ct_error(CT_ERR_INPUT,
                 "Hugging Face model '%s' is %s, not a directory or a .safetensors file", path,
                 ct_file_kind(sb.st_mode));
    ct_hint("name a Hugging Face model directory (config.json and safetensors) or its "
            ".safetensors file");
    return CT_ERR_INPUT;
}

ct_status ct_hf_open(const char *path, ct_hf_model *m) {
    memset(m, 0, sizeof *m);
    CT_TRY(ct_hf_check_path("Hugging Face model", path));
    CT_TRY(check_source(path));
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
    int64_t total = 0; /* tensors in the files */
    for (int i = 0; i < n && st == CT_OK; i++) {
        snprintf(file, sizeof file, "%s/%s", m->dir, names[i]);
        st = ct_safetensors_open(file, &m->files[i]);
        if (st == CT_OK) total += m->files[m->n_files++].n;
    }
    free(names);
    /* config.json's counts against the files' before anything is allocated by them */
    if (st == CT_OK) st = check_count(m, total);
    if (st == CT_OK)
        m->names =
            ct_hf_tensors(m->config.arch, m->config.n_layer, m->config.d_model / m->config.n_head,
                          !m->config.tied, m->config.moe_experts, &m->n_names);
    if (st == CT_OK) st = index_tensors(m, total);
    if (st != CT_OK) ct_hf_close(m);
    return st;
}

void ct_hf_close(ct_hf_model *m) {
    for (int i = 0; i < m->n_files; i++) ct_safetensors_close(&m->files[i]);
    free(m->files);
    free(m->names);
    free(m->index);
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

/* Where our global tensor `name` (rows x cols) is in the model's files, its header checked
 * against the shape config.json implies: the Hugging Face tensor e that holds it (as stacked
 * source s), the file's tensor x, the rows of the stacked tensor and how many of ours it gives. */
typedef struct located {
    const ct_hf_tensor *e;
    int s;
    const ct_hf_entry *x;
    int64_t rows_hf, keep;
} located;

static ct_status locate(const ct_hf_model *m, const char *name, int64_t rows, int64_t cols,
                        located *at) {
    const ct_hf_tensor *e = NULL;
    int s = 0;
    for (int i = 0; i < m->n_names && !e; i++)
        for (s = 0; s < m->names[i].n_src; s++)
            if (!strcmp(m->names[i].src[s], name)) {
                e = &m->names[i];
                break;
            }
    CT_ASSERTF(e != NULL, "%s has no Hugging Face tensor", name);
    const ct_hf_entry *x = find(m, e->name, NULL);
    if (!x) {
        ct_error(CT_ERR_INPUT, "Hugging Face model '%s' has no tensor %s", m->dir, e->name);
        ct_hint("the safetensors files must hold every tensor of the model config.json "
                "describes");
        return CT_ERR_INPUT;
    }
    const ct_st_tensor *t = x->t;
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
                 "safetensors '%s': tensor %s has shape [%lld, %lld] (%d dims), the model of "
                 "'%s/config.json' needs [%lld, %lld] (%d dims)",
                 m->files[x->file].path, t->name, (long long)t->shape[0], (long long)t->shape[1],
                 t->ndim, m->dir, (long long)want0, (long long)(ndim == 2 ? want1 : 1), ndim);
        ct_hint("config.json and the safetensors files must belong to the same model");
        return CT_ERR_INPUT;
    }
    *at = (located){.e = e, .s = s, .x = x, .rows_hf = rows_hf, .keep = keep};
    return CT_OK;
}

ct_status ct_hf_check_tensors(const ct_hf_model *m, const ct_config *cfg) {
    int n = 0;
    ct_param *params = ct_model_registry(cfg, &n);
    ct_status st = CT_OK;
    located at;
    for (int i = 0; i < n && st == CT_OK; i++)
        st = locate(m, params[i].name, params[i].global_shape[0], params[i].global_shape[1], &at);
    free(params);
    return st;
}

ct_status ct_hf_read(const ct_hf_model *m, const char *name, int64_t rows, int64_t cols,
                     float *out) {
    located at;
    CT_TRY(locate(m, name, rows, cols, &at));
    const ct_hf_tensor *e = at.e;
    const ct_st_tensor *t = at.x->t;
    const ct_safetensors *file = &m->files[at.x->file];
    const int64_t rows_hf = at.rows_hf, keep = at.keep;
    const int s = at.s;
    /* the file's length bounds numel (the header is checked), not the memory there is */
    float *hf = malloc((size_t)t->numel * sizeof(float) + 1);
    if (!hf) {
        ct_error(CT_ERR_RUNTIME, "out of host memory: %lld bytes for tensor %s of '%s'",
                 (long long)t->numel * 4, t->name, file->path);
        ct_hint("reading a Hugging Face model takes one of its tensors as fp32 at a time, and "
                "one of ours");
        return CT_ERR_RUNTIME;
    }
    ct_status st = ct_safetensors_read(file, t, hf);
    for (int64_t i = 0; i < t->numel && st == CT_OK; i++)
        if (!isfinite(hf[i])) {
            ct_error(CT_ERR_INPUT,
                     "safetensors '%s': tensor %s holds a value that is not finite (%g at "
                     "element %lld of %lld)",
                     file->path, t->name, (double)hf[i], (long long)i, (long long)t->numel);
            ct_hint("a model's weights must be finite: the file is damaged, or the model "
                    "diverged before it was saved");
            st = CT_ERR_INPUT;
        }
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
