/*
 * args.h — the one command-line parser of cmd/, used by every subcommand. A subcommand walks its
 * arguments with ct_args_next and asks for each option's value with ct_args_string / _int /
 * _double; every refusal is CT_ERR_INPUT (exit 2) with a message that names the subcommand and
 * the argument, and a hint with the subcommand's usage line and where its --help is.
 *
 *   ct_args a;
 *   ct_args_init(&a, "export", export_help, argc, argv);
 *   while (st == CT_OK && ct_args_next(&a)) {
 *       if (a.positional && !dir) dir = a.arg;
 *       else if (ct_args_is(&a, "--out")) st = ct_args_string(&a, &out);
 *       else st = ct_args_unknown(&a);
 *   }
 *   if (a.help) → print a.help_text, exit 0
 *
 * Options are "--name VALUE" or "--name=VALUE"; "--help" and "-h" anywhere stop the walk with
 * a.help set (the caller prints the help and succeeds). An argument that does not start with '-'
 * is positional. "--" is not special: no subcommand takes positionals that start with '-'.
 */
#ifndef CT_CMD_ARGS_H
#define CT_CMD_ARGS_H

#include <stdbool.h>
#include <stdint.h>

#include "core/common.h"

typedef struct ct_args {
    int argc;
    char **argv;
    int i;                 /* the index of the current argument */
    const char *command;   /* "export": messages say "export: unknown option '--x'" */
    const char *help_text; /* the subcommand's --help text; its first line is the usage line */
    /* the current argument, set by ct_args_next */
    const char *arg;   /* the option's name ("--out" of "--out=x"), or the positional argument */
    const char *value; /* "x" of "--out=x", else NULL (the value is the next argument) */
    bool positional;
    bool help; /* --help or -h was given */
    char name[64];
} ct_args;

/* Starts a walk over argv[0..argc) (the arguments after the subcommand's name). */
void ct_args_init(ct_args *a, const char *command, const char *help_text, int argc, char **argv);

/* Steps to the next argument: true with a->arg set; false at the end, or at --help / -h (then
 * a->help is true). */
bool ct_args_next(ct_args *a);

/* True when the current argument is the option `name` ("--out" matches --out and --out=x). */
bool ct_args_is(const ct_args *a, const char *name);

/* The current option's value: the "=x" part, or the next argument (consumed). An option at the
 * end of the line with no value is refused: "export: --out needs a value". */
ct_status ct_args_string(ct_args *a, const char **out);

/* The current option's values, appended to out[*n]: its "=x" part, or every argument that
 * follows it up to the next one starting with "--" ("--input a.txt b.txt --out d"). Refused when
 * there is none: "prepare: --input needs at least one value". out has room for argc entries. */
ct_status ct_args_list(ct_args *a, const char **out, int *n);

/* The value as an integer in [lo, hi], or as a number in [lo, hi] (NaN refused). */
ct_status ct_args_int(ct_args *a, int64_t lo, int64_t hi, int64_t *out);
ct_status ct_args_double(ct_args *a, double lo, double hi, double *out);

/* The current option is a flag (no value): refused when given one ("--json=1"). */
ct_status ct_args_flag(const ct_args *a);

/* Refuses the current argument: "export: unknown option '--x'" (or "unexpected argument 'x'" for
 * a positional one), with the usage hint. */
ct_status ct_args_unknown(const ct_args *a);

/* A usage error in the subcommand's words: "COMMAND: <message>", with the usage hint. */
ct_status ct_args_error(const ct_args *a, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif /* CT_CMD_ARGS_H */
