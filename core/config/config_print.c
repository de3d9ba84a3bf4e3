/*
 * config_print.c — the resolved config written as YAML that loads again (--print-config, the run
 * directory's config.yaml), and the Markdown table of every key for configs/README.md.
 */
#include "config_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- printing -------------------------------------------------------------------------------- */

static void format_count(int64_t n, char *buf, size_t cap) {
    if (n < 1000)
        snprintf(buf, cap, "%lld", (long long)n);
    else if (n < 1000000)
        snprintf(buf, cap, "%.2fK", (double)n / 1e3);
    else if (n < 1000000000)
        snprintf(buf, cap, "%.2fM", (double)n / 1e6);
    else
        snprintf(buf, cap, "%.2fB", (double)n / 1e9);
}

/* A double-quoted YAML scalar that libyaml reads back byte for byte (for UTF-8 text; a path
 * that is not UTF-8 cannot be written in YAML at all). Returns the characters written. */
static int print_yaml_string(FILE *out, const char *s) {
    int n = 2;
    fputc('"', out);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            n += fprintf(out, "\\%c", *c);
        else if (*c == '\n')
            n += fprintf(out, "\\n");
        else if (*c == '\t')
            n += fprintf(out, "\\t");
        else if (*c < 0x20 || *c == 0x7f)
            n += fprintf(out, "\\x%02x", *c);
        else
            n += fputc(*c, out) != EOF;
    }
    fputc('"', out);
    return n;
}

static void format_value(const ct_config *cfg, const config_key *k, char *buf, size_t cap) {
    key_value v = key_load(cfg, k);
    switch (k->type) {
    case KEY_INT:
        if (k->auto_zero && (v.i == 0 || resolved_from_auto(cfg, k)))
            snprintf(buf, cap, "auto");
        else
            snprintf(buf, cap, "%lld", (long long)v.i);
        break;
    case KEY_UINT64: snprintf(buf, cap, "%llu", (unsigned long long)v.u); break;
    case KEY_FLOAT: format_double(v.f, buf, cap); break;
    case KEY_BOOL: snprintf(buf, cap, "%s", v.b ? "true" : "false"); break;
    case KEY_ENUM: {
        int count = 0;
        while (k->choices[count]) count++;
        snprintf(buf, cap, "%s", v.e >= 0 && v.e < count ? k->choices[v.e] : "?");
        break;
    }
    case KEY_STRING: buf[0] = '\0'; break; /* printed quoted by the caller */
    }
}

void ct_config_print(const ct_config *cfg, FILE *out) {
    fputs("# cooktrain configuration (reload it with --config)\n", out);
    for (int s = 0; s < N_SECTIONS; s++) {
        fprintf(out, "%s:\n", config_sections[s]);
        for (int i = 0; i < N_KEYS; i++) {
            const config_key *k = &config_keys[i];
            if (strcmp(k->section, config_sections[s]) != 0) continue;
            int col = fprintf(out, "  %s: ", k->name);
            if (k->type == KEY_STRING) {
                col += print_yaml_string(out, (const char *)cfg + k->offset);
            } else {
                char val[64];
                format_value(cfg, k, val, sizeof val);
                col += fprintf(out, "%s", val);
            }
            fprintf(out, "%*s# %s\n", col < 34 ? 34 - col : 1, "", k->doc);
        }
    }
    const ct_derived_config *d = &cfg->derived;
    if (d->world_size <= 0) {
        fputs("# derived values: not computed (the config has not been validated)\n", out);
        return;
    }
    char count[32];
    format_count(d->n_params, count, sizeof count);
    fprintf(out,
            "# derived:\n"
            "#   world_size: %lld\n"
            "#   dp: %lld\n"
            "#   vocab_padded: %lld\n"
            "#   head_dim: %lld\n"
            "#   d_ff: %lld\n"
            "#   n_kv_head: %lld\n"
            "#   micro_batch: %lld%s\n"
            "#   grad_accum: %lld\n"
            "#   tokens_per_step: %lld\n"
            "#   n_params: %lld (%s)\n"
            "#   precision: %s (%s)\n",
            (long long)d->world_size, (long long)d->dp, (long long)d->vocab_padded,
            (long long)d->head_dim, (long long)d->d_ff, (long long)d->n_kv_head,
            (long long)cfg->train.micro_batch,
            cfg->train.micro_batch_auto ? " (auto: see train.micro_batch)" : "",
            (long long)d->grad_accum, (long long)d->tokens_per_step, (long long)d->n_params, count,
            d->precision == CT_PRECISION_BF16 ? "bf16" : "fp32", d->precision_why);
}

/* Markdown table cells: a '|' inside a cell would end it. */
static void print_md_cell(FILE *out, const char *s) {
    for (; *s; s++) {
        if (*s == '|')
            fputs("\\|", out);
        else
            fputc(*s, out);
    }
}

void ct_config_write_docs(FILE *out) {
    fputs("| key | type | default | description |\n", out);
    fputs("|---|---|---|---|\n", out);
    for (int i = 0; i < N_KEYS; i++) {
        const config_key *k = &config_keys[i];
        char range[96];
        fprintf(out, "| `%s.%s` | ", k->section, k->name);
        switch (k->type) {
        case KEY_INT:
        case KEY_FLOAT:
            fputs(k->type == KEY_INT ? "integer" : "number", out);
            if (k->has_min || k->has_max) {
                describe_range(k, range, sizeof range);
                fprintf(out, ", %s", range);
            }
            if (k->auto_zero) fputs(", or `auto`", out);
            break;
        case KEY_UINT64: fputs("integer, 0 to 2^64-1", out); break;
        case KEY_BOOL: fputs("bool", out); break;
        case KEY_STRING: fputs(k->nonempty ? "string, not empty" : "string", out); break;
        case KEY_ENUM:
            for (int c = 0; k->choices[c]; c++)
                fprintf(out, "%s`%s`", c ? " \\| " : "", k->choices[c]);
            break;
        }
        if (k->type == KEY_STRING && !k->def[0])
            fputs(" | `\"\"` | ", out);
        else
            fprintf(out, " | `%s` | ", k->def);
        print_md_cell(out, k->doc);
        fputs(" |\n", out);
    }
}
