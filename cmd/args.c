/* args.c — the command-line parser of every subcommand (args.h). */
#include "cmd/args.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The usage hint: the help text's first line, and where the rest is. */
static void usage_hint(const char *command, const char *help_text) {
    size_t len = strcspn(help_text, "\n"); /* the usage line */
    ct_hint("%.*s (`cooktrain %s --help` lists every option)", (int)len, help_text, command);
}

void ct_args_init(ct_args *a, const char *command, const char *help_text, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    a->argc = argc;
    a->argv = argv;
    a->i = -1;
    a->command = command;
    a->help_text = help_text;
}

bool ct_args_next(ct_args *a) {
    if (a->help || ++a->i >= a->argc) return false;
    const char *s = a->argv[a->i];
    a->value = NULL;
    a->positional = s[0] != '-' || s[1] == '\0'; /* "-" alone: a positional (stdin) */
    a->arg = s;
    if (a->positional) return true;
    const char *eq = strchr(s, '=');
    if (eq) {
        size_t len = (size_t)(eq - s);
        if (len >= sizeof a->name) len = sizeof a->name - 1;
        memcpy(a->name, s, len);
        a->name[len] = '\0';
        a->arg = a->name;
        a->value = eq + 1;
    }
    if (!strcmp(a->arg, "--help") || !strcmp(a->arg, "-h")) {
        a->help = true;
        return false;
    }
    return true;
}

bool ct_args_is(const ct_args *a, const char *name) {
    return !a->positional && !strcmp(a->arg, name);
}

ct_status ct_args_error(const ct_args *a, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ct_error(CT_ERR_INPUT, "%s: %s", a->command, msg);
    usage_hint(a->command, a->help_text);
    return CT_ERR_INPUT;
}

ct_status ct_args_string(ct_args *a, const char **out) {
    if (a->value) {
        *out = a->value;
        return CT_OK;
    }
    if (a->i + 1 >= a->argc) return ct_args_error(a, "%s needs a value", a->arg);
    *out = a->argv[++a->i];
    return CT_OK;
}

ct_status ct_args_list(ct_args *a, const char **out, int *n) {
    if (a->value) {
        out[(*n)++] = a->value;
        return CT_OK;
    }
    int before = *n;
    while (a->i + 1 < a->argc && strncmp(a->argv[a->i + 1], "--", 2) != 0)
        out[(*n)++] = a->argv[++a->i];
    if (*n == before) return ct_args_error(a, "%s needs at least one value", a->arg);
    return CT_OK;
}

ct_status ct_args_int(ct_args *a, int64_t lo, int64_t hi, int64_t *out) {
    const char *v = NULL;
    CT_TRY(ct_args_string(a, &v));
    char *end = NULL;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        return ct_args_error(a, "%s needs an integer in [%lld, %lld], got '%s'", a->arg,
                             (long long)lo, (long long)hi, v);
    *out = (int64_t)x;
    return CT_OK;
}

ct_status ct_args_double(ct_args *a, double lo, double hi, double *out) {
    const char *v = NULL;
    CT_TRY(ct_args_string(a, &v));
    char *end = NULL;
    double x = strtod(v, &end);
    if (end == v || *end || !(x >= lo && x <= hi))
        return ct_args_error(a, "%s needs a number in [%g, %g], got '%s'", a->arg, lo, hi, v);
    *out = x;
    return CT_OK;
}

ct_status ct_args_flag(const ct_args *a) {
    if (a->value) return ct_args_error(a, "%s takes no value, got '%s'", a->arg, a->value);
    return CT_OK;
}

ct_status ct_args_unknown(const ct_args *a) {
    if (a->positional) return ct_args_error(a, "unexpected argument '%s'", a->arg);
    return ct_args_error(a, "unknown option '%s'", a->argv[a->i]);
}
