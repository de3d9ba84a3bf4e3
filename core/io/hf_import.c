/* hf_import.c — `cooktrain import`: a Hugging Face model as a cooktrain checkpoint. See hf.h. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/io/checkpoint.h"
#include "core/io/hf.h"
#include "core/model/model.h"

/* The config of a run of this model: defaults, the model's keys, fp32, one process. */
static ct_status import_config(const ct_hf_model *h, int64_t seq_len, ct_config *cfg) {
    ct_config_defaults(cfg);
    ct_hf_model_config(&h->config, &cfg->model);
    if (seq_len > 0 && h->config.arch == CT_ARCH_GPT2 && seq_len > h->config.max_positions) {
        ct_error(CT_ERR_INPUT, "--seq-len %lld is above the model's %lld learned positions",
                 (long long)seq_len, (long long)h->config.max_positions);
        ct_hint("a GPT-2 model reads positions up to n_positions (config.json)");
        return CT_ERR_INPUT;
    }
    if (seq_len > 0) cfg->model.seq_len = seq_len;
    cfg->train.precision = CT_PRECISION_FP32;
    return ct_config_validate(cfg, 1);
}

/* ---- ROOT: trusted with nothing ------------------------------------------------------------- */

/* A step directory's name: step-<digits>, then nothing, .tmp or .old. */
static bool step_name(const char *name) {
    if (strncmp(name, "step-", 5) != 0 || name[5] < '0' || name[5] > '9') return false;
    const char *p = name + 5;
    while (*p >= '0' && *p <= '9') p++;
    return !*p || !strcmp(p, ".tmp") || !strcmp(p, ".old");
}

/* Whether dir/name is there (a link counts, dangling or not). */
static bool holds(const char *dir, const char *name) {
    char path[PATH_MAX + 64];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return lstat(path, &sb) == 0;
}

static ct_status refuse_out(const char *root, const char *why, const char *where) {
    ct_error(CT_ERR_INPUT, "--out '%s' %s%s%s%s", root, why, where ? " '" : "", where ? where : "",
             where ? "'" : "");
    ct_hint("import into a new directory, or an empty one, outside any checkpoint: import never "
            "replaces or removes what is there");
    return CT_ERR_INPUT;
}

/* A checkpoint step among dir and its parents (dir resolved, absolute): a directory that holds
 * manifest.bin, or one named step-N[.tmp|.old] in a root that holds `latest`. */
static ct_status outside_steps(const char *root, char *dir) {
    for (;;) {
        char *slash = strrchr(dir, '/');
        const char *name = slash ? slash + 1 : dir;
        char parent[PATH_MAX];
        snprintf(parent, sizeof parent, "%.*s", slash && slash != dir ? (int)(slash - dir) : 1,
                 slash ? dir : ".");
        if (holds(dir, "manifest.bin") || (step_name(name) && holds(parent, "latest")))
            return refuse_out(root, "is in the checkpoint step", dir);
        if (!slash || slash == dir) return CT_OK;
        *slash = '\0';
    }
}

/* ROOT as import may use it: a path that fits, a directory or nothing yet (then made, with its
 * missing parents), holding no checkpoint entry (latest, step-*), not in a checkpoint step (it
 * would add a step to that checkpoint, or write into one). *existing: the deepest part of ROOT
 * that is there (what a failed import leaves; "." when none of a relative path is). */
static ct_status check_out(const char *root, char existing[CT_PATH_MAX]) {
    CT_TRY(ct_hf_check_path("--out", root));
    snprintf(existing, CT_PATH_MAX, "%s", root);
    size_t n = strlen(existing);
    while (n > 1 && existing[n - 1] == '/') existing[--n] = '\0';
    char first_missing[CT_PATH_MAX] = "";
    struct stat sb;
    int rc;
    while ((rc = stat(existing, &sb)) != 0 && (errno == ENOENT)) {
        char *slash = strrchr(existing, '/');
        if (slash && slash[1]) snprintf(first_missing, CT_PATH_MAX, "%s", slash + 1);
        if (!slash) snprintf(first_missing, CT_PATH_MAX, "%s", existing);
        if (!slash || slash == existing) {
            snprintf(existing, CT_PATH_MAX, "%s", slash ? "/" : ".");
            continue;
        }
        *slash = '\0';
    }
    if (rc != 0) {
        char why[160];
        snprintf(why, sizeof why, "cannot be used: %s", strerror(errno));
        return refuse_out(root, why, NULL);
    }
    if (!first_missing[0] && !S_ISDIR(sb.st_mode)) {
        char why[96];
        snprintf(why, sizeof why, "is %s, not a directory", ct_file_kind(sb.st_mode));
        return refuse_out(root, why, NULL);
    }
    if (!first_missing[0]) {
        DIR *d = opendir(existing);
        if (!d) return refuse_out(root, "cannot be read", NULL);
        struct dirent *e;
        char name[300] = "";
        while ((e = readdir(d)) && !name[0])
            if (!strcmp(e->d_name, "latest") || !strcmp(e->d_name, "latest.tmp") ||
                !strncmp(e->d_name, "step-", 5))
                snprintf(name, sizeof name, "%s", e->d_name);
        closedir(d);
        if (name[0]) return refuse_out(root, "already holds", name);
    }
    char *real = realpath(existing, NULL);
    if (!real) {
        char why[160];
        snprintf(why, sizeof why, "cannot be resolved: %s", strerror(errno));
        return refuse_out(root, why, NULL);
    }
    ct_status st = CT_OK;
    if (first_missing[0] && step_name(first_missing) && holds(real, "latest"))
        st = refuse_out(root, "would be a step of the checkpoints in", real);
    if (st == CT_OK) st = outside_steps(root, real);
    free(real);
    return st;
}

/* Removes the directories of ROOT below `existing` (those import made), deepest first; rmdir
 * leaves any that is not empty. */
static void remove_made(const char *root, const char *existing) {
    char dir[CT_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", root);
    const size_t keep = strcmp(existing, ".") ? strlen(existing) : 0;
    for (size_t n = strlen(dir); n > keep;) {
        rmdir(dir);
        char *slash = strrchr(dir, '/');
        if (!slash) break;
        *slash = '\0';
        for (n = strlen(dir); n > 1 && dir[n - 1] == '/';) dir[--n] = '\0';
    }
}

/* ---- the checkpoint ------------------------------------------------------------------------- */

static ct_status write_pieces(const ct_hf_model *h, const ct_config *cfg, const char *dir,
                              ct_ckpt_manifest *m) {
    int n = 0;
    ct_param *params = ct_model_registry(cfg, &n);
    m->pieces = ct_xcalloc((size_t)n, sizeof *m->pieces);
    ct_ckpt_writer *w = NULL;
    ct_status st = ct_ckpt_writer_open(&w, dir, 0);
    float *values = NULL;
    int64_t cap = 0;
    for (int i = 0; i < n && st == CT_OK; i++) {
        const ct_param *p = &params[i];
        ct_ckpt_piece *piece = &m->pieces[m->n_pieces];
        ct_ckpt_box *b = &piece->box;
        snprintf(b->name, sizeof b->name, "%s", p->name);
        b->kind = CT_CKPT_WEIGHT;
        b->rows = b->row1 = p->global_shape[0];
        b->cols = b->col1 = p->global_shape[1];
        b->hi = b->rows * b->cols;
        if (b->hi > cap) { /* the headers were checked: the files hold tensors this large */
            free(values);
            values = malloc((size_t)b->hi * sizeof(float));
            cap = values ? b->hi : 0;
            if (!values) {
                st = ct_error(CT_ERR_RUNTIME, "out of host memory: %lld bytes for tensor %s",
                              (long long)b->hi * 4, p->name);
                ct_hint("import holds one Hugging Face tensor and one of ours at a time");
                break;
            }
        }
        st = ct_hf_read(h, p->name, b->rows, b->cols, values);
        if (st == CT_OK) st = ct_ckpt_writer_add(w, piece, values);
        if (st == CT_OK) m->n_pieces++;
    }
    if (w) {
        ct_status closed = ct_ckpt_writer_close(w);
        if (st == CT_OK) st = closed;
    }
    free(values);
    free(params);
    return st;
}

/* The fewest significant digits that print x so that it reads back as x. */
static int shortest(double x) {
    char buf[40];
    int digits = 1;
    for (; digits < 17; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, x);
        if (strtod(buf, NULL) == x) break;
    }
    return digits;
}

ct_status ct_hf_import(const char *src, const char *root, int64_t seq_len, FILE *report) {
    char existing[CT_PATH_MAX];
    CT_TRY(check_out(root, existing));
    ct_hf_model h;
    CT_TRY(ct_hf_open(src, &h));
    ct_hf_report_unused(&h, stderr);
    ct_config cfg;
    ct_status st = import_config(&h, seq_len, &cfg);
    /* every shape against the headers before anything is allocated or written */
    if (st == CT_OK) st = ct_hf_check_tensors(&h, &cfg);
    ct_ckpt_manifest m;
    memset(&m, 0, sizeof m);
    char dir[CT_PATH_MAX + 32];
    ct_ckpt_step_path(dir, sizeof dir, root, 0, true);
    const bool began = st == CT_OK;
    if (st == CT_OK) st = ct_ckpt_begin(root, 0);
    if (st == CT_OK) st = write_pieces(&h, &cfg, dir, &m);
    if (st == CT_OK) {
        m.n_files = 1;
        m.state = ct_ckpt_state_of(&cfg, 0, 0); /* one process, fp32, no tokenizer */
        size_t len = 0;
        FILE *mem = open_memstream(&m.config_text, &len);
        CT_ASSERT(mem != NULL);
        ct_config_print(&cfg, mem);
        fclose(mem);
        st = ct_ckpt_manifest_write(dir, &m);
    }
    if (st == CT_OK) st = ct_ckpt_publish(root, 0);
    if (st != CT_OK && began) { /* nothing left behind, nothing that was there touched */
        ct_ckpt_discard(root, 0);
        remove_made(root, existing);
    }
    if (st == CT_OK && report) {
        const ct_model_config *mc = &cfg.model;
        fprintf(report,
                "imported %s (%s, %lld tensors) into %s/step-00000000\n"
                "its model keys, for a run's config (model.init_from: %s):\n"
                "model:\n  arch: %s\n  vocab_size: %lld\n  seq_len: %lld\n  n_layer: %lld\n"
                "  d_model: %lld\n  n_head: %lld\n  n_kv_head: %lld\n  d_ff: %lld\n",
                src,
                mc->moe_experts             ? "mixtral"
                : mc->arch == CT_ARCH_LLAMA ? "llama"
                                            : "gpt2",
                (long long)m.n_pieces, root, root, mc->arch == CT_ARCH_LLAMA ? "llama" : "gpt2",
                (long long)mc->vocab_size, (long long)mc->seq_len, (long long)mc->n_layer,
                (long long)mc->d_model, (long long)mc->n_head, (long long)cfg.derived.n_kv_head,
                (long long)cfg.derived.d_ff);
        if (mc->arch == CT_ARCH_LLAMA)
            fprintf(report, "  norm_eps: %.*g\n  rope_theta: %.*g\n", shortest(mc->norm_eps),
                    mc->norm_eps, shortest(mc->rope_theta), mc->rope_theta);
        if (mc->arch == CT_ARCH_LLAMA && mc->rope_scaling_factor > 0)
            fprintf(report,
                    "  rope_scaling_factor: %.*g\n  rope_low_freq_factor: %.*g\n"
                    "  rope_high_freq_factor: %.*g\n  rope_original_max_pos: %lld\n",
                    shortest(mc->rope_scaling_factor), mc->rope_scaling_factor,
                    shortest(mc->rope_low_freq_factor), mc->rope_low_freq_factor,
                    shortest(mc->rope_high_freq_factor), mc->rope_high_freq_factor,
                    (long long)mc->rope_original_max_pos);
        if (!mc->tie_embeddings) fprintf(report, "  tie_embeddings: false\n");
        if (mc->moe_experts > 0)
            fprintf(report,
                    "  moe_experts: %lld\n  moe_top_k: %lld\n  moe_every: 1\n  moe_d_ff: %lld\n"
                    "  moe_router: topk_softmax\n  moe_aux_alpha: %.*g\n",
                    (long long)mc->moe_experts, (long long)mc->moe_top_k, (long long)mc->moe_d_ff,
                    shortest(mc->moe_aux_alpha), mc->moe_aux_alpha);
    }
    free(m.pieces);
    free(m.config_text);
    ct_hf_close(&h);
    return st;
}
