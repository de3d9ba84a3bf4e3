/*
 * config_internal.h — what the config room's files share (config_keys.c, config_load.c,
 * config_validate.c, config_print.c); not for use outside core/config/config_*.c. The public
 * interface is config.h.
 *
 * The key table (config_keys[]) describes every key: section, name, type, where it is stored in
 * ct_config, default, allowed range and one line of documentation.
 */
#ifndef CT_CONFIG_INTERNAL_H
#define CT_CONFIG_INTERNAL_H

#include "config.h"

#include <stddef.h>

typedef enum key_type {
    KEY_INT,    /* int64_t */
    KEY_UINT64, /* uint64_t */
    KEY_FLOAT,  /* double */
    KEY_BOOL,   /* bool */
    KEY_STRING, /* char[size], NUL-terminated */
    KEY_ENUM,   /* a C enum (int-sized); choices[value] is its name */
} key_type;

typedef struct config_key {
    const char *section;
    const char *name;
    key_type type;
    size_t offset;              /* into ct_config */
    size_t size;                /* of the field; for strings the buffer size including the NUL */
    const char *const *choices; /* KEY_ENUM: NULL-terminated, indexed by the enum value */
    const char *def;            /* default as text: it goes through the same parser as the file */
    bool has_min, min_open;     /* min_open: value must be > min instead of >= min */
    bool has_max, max_open;
    double min, max; /* exact for every bound used below (all < 2^53) */
    bool nonempty;   /* KEY_STRING: "" is not allowed */
    bool auto_zero;  /* KEY_INT: the word "auto" is accepted and stored as 0 (resolved by
                        ct_config_validate; see micro_batch_auto in config.h) */
    const char *doc;
} config_key;

/* A converted value, before it is stored (so a failed range check leaves the config as it was). */
typedef struct key_value {
    int64_t i;
    uint64_t u;
    double f;
    bool b;
    int e;
    const char *s; /* KEY_STRING: points into the caller's text */
    bool typed;    /* KEY_INT: converted from digits (so an auto_zero key's 0 is a typed 0,
                      out of range, not the word auto) */
    size_t slen;
} key_value;

/* The sections, in the order a printed config shows them. */
#define N_SECTIONS 6
extern const char *const config_sections[N_SECTIONS];
/* The key table (config_keys.c) and its length; CONFIG_MAX_KEYS bounds it for the loader's
 * per-key arrays (checked by ct_config_defaults). */
#define CONFIG_MAX_KEYS 128
extern const config_key config_keys[];
extern const int config_n_keys;
#define N_KEYS config_n_keys

/* Enum names of parallel.schedule and train.precision, indexed by the enum value. */
extern const char *const schedule_names[];
extern const char *const precision_names[];

/* Sets the hint and passes the status through: `return with_hint(ct_error(...), "...")`. */
__attribute__((format(printf, 2, 3))) ct_status with_hint(ct_status st, const char *fmt, ...);
/* "section.name" of k into buf. */
const char *key_full_name(const config_key *k, char *buf, size_t cap);
/* A user value made safe to put in a message: printable bytes only, at most ~60 of them. */
const char *shown(const char *text, size_t len, char *buf, size_t cap);
/* Shortest of %.15g..%.17g that reads back to the same double. */
void format_double(double v, char *buf, size_t cap);
/* Appends printf output to buf (bounded; truncates silently). */
__attribute__((format(printf, 3, 4))) void append(char *buf, size_t cap, const char *fmt, ...);

/* Lookups, and the errors for an unknown name with a suggestion of a near one. */
int find_section(const char *name);
const config_key *find_key(const char *section, const char *name);
const config_key *suggest_full_key(const char *section, const char *name);
void list_section_keys(const char *section, char *buf, size_t cap);
ct_status unknown_key_error(const char *where, const char *section, const char *name);
ct_status unknown_section_error(const char *where, const char *name);

/* A key's range in words: "in [1, 65536]", ">= 0", "anything". */
void describe_range(const config_key *k, char *buf, size_t cap);
/* Checks a converted value against the key's constraints. `where` prefixes the message. */
ct_status key_check(const config_key *k, const key_value *v, const char *where);
/* An empty, ~ or null scalar. */
bool is_null_text(const char *s);
/* The value of key k in cfg. */
key_value key_load(const ct_config *cfg, const config_key *k);
/* Converts text (len bytes) for k, checks it and stores it in cfg; cfg is untouched on error. */
ct_status key_assign(ct_config *cfg, const config_key *k, const char *text, size_t len,
                     bool is_null, const char *where);
/* Whether an auto_zero key was resolved from auto by ct_config_validate. */
bool resolved_from_auto(const ct_config *cfg, const config_key *k);

#endif /* CT_CONFIG_INTERNAL_H */
