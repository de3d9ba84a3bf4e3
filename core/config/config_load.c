/*
 * config_load.c — reading a config: the YAML file (libyaml) and `--set section.key=value`, both
 * through the key table's conversion and range checks (config_keys.c). On any error the config is
 * left exactly as it was.
 */
#include "config_internal.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

/* ---- YAML loading ---------------------------------------------------------------------------- */

typedef struct loader {
    yaml_parser_t parser;
    const char *origin;
    ct_config *cfg;                   /* the working copy; committed only on success */
    size_t section_line[N_SECTIONS];  /* line where each section was opened (0 = not seen) */
    size_t key_line[CONFIG_MAX_KEYS]; /* line where each key was set (0 = not seen) */
} loader;

/* "origin:line:col: " for messages about the element at `mark`. */
static const char *where_at(const loader *ld, yaml_mark_t mark, char *buf, size_t cap) {
    snprintf(buf, cap, "%s:%zu:%zu: ", ld->origin, mark.line + 1, mark.column + 1);
    return buf;
}

static ct_status syntax_error(const loader *ld) {
    const yaml_parser_t *p = &ld->parser;
    const char *problem = p->problem ? p->problem : "malformed YAML";
    if (p->error == YAML_MEMORY_ERROR)
        return ct_error(CT_ERR_RUNTIME, "%s: out of memory while parsing YAML", ld->origin);
    if (p->error == YAML_READER_ERROR)
        return with_hint(ct_error(CT_ERR_INPUT, "%s: cannot read YAML at byte %zu: %s", ld->origin,
                                  p->problem_offset, problem),
                         "a config must be UTF-8 text without control characters");
    size_t line = p->problem_mark.line + 1, col = p->problem_mark.column + 1;
    ct_error(CT_ERR_INPUT, "%s:%zu:%zu: YAML syntax error: %s", ld->origin, line, col, problem);
    if (p->context)
        return with_hint(CT_ERR_INPUT, "%s (line %zu); check indentation and quoting near line %zu",
                         p->context, p->context_mark.line + 1, line);
    return with_hint(CT_ERR_INPUT, "check indentation (spaces, not tabs) and quoting near line %zu",
                     line);
}

static ct_status next_event(loader *ld, yaml_event_t *ev) {
    if (!yaml_parser_parse(&ld->parser, ev)) return syntax_error(ld);
    return CT_OK;
}

static bool event_is_null(const yaml_event_t *ev) {
    return ev->type == YAML_SCALAR_EVENT && ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
           is_null_text((const char *)ev->data.scalar.value);
}

static const char *event_kind(const yaml_event_t *ev) {
    switch (ev->type) {
    case YAML_MAPPING_START_EVENT: return "a mapping";
    case YAML_SEQUENCE_START_EVENT: return "a list";
    case YAML_ALIAS_EVENT: return "an alias";
    default: return "a value";
    }
}

/* Value of one key: must be a scalar. */
static ct_status load_key_value(loader *ld, const config_key *k, yaml_event_t *ev) {
    char where[CT_PATH_MAX + 64], full[96];
    where_at(ld, ev->start_mark, where, sizeof where);
    key_full_name(k, full, sizeof full);
    if (ev->type == YAML_SCALAR_EVENT)
        return key_assign(ld->cfg, k, (const char *)ev->data.scalar.value, ev->data.scalar.length,
                          event_is_null(ev), where);
    ct_error(CT_ERR_INPUT, "%s%s: expected a single value, got %s", where, full, event_kind(ev));
    if (ev->type == YAML_ALIAS_EVENT)
        return with_hint(CT_ERR_INPUT,
                         "YAML anchors and aliases are not supported; write the value");
    if (k->type == KEY_STRING)
        return with_hint(CT_ERR_INPUT,
                         "write lists as one comma-separated string, e.g. %s: \"4,4\"", full);
    return with_hint(CT_ERR_INPUT, "write '%s: <value>' on one line (%s; default %s)", k->name,
                     k->doc, k->def);
}

/* The keys of one section, after its MAPPING_START. */
static ct_status load_section(loader *ld, int section) {
    const char *sec = config_sections[section];
    for (;;) {
        yaml_event_t ev;
        CT_TRY(next_event(ld, &ev));
        if (ev.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&ev);
            return CT_OK;
        }
        char where[CT_PATH_MAX + 64];
        where_at(ld, ev.start_mark, where, sizeof where);
        if (ev.type != YAML_SCALAR_EVENT) {
            ct_status st = with_hint(ct_error(CT_ERR_INPUT,
                                              "%sa key of section %s must be a plain name, got %s",
                                              where, sec, event_kind(&ev)),
                                     "write 'key: value' lines under '%s:'", sec);
            yaml_event_delete(&ev);
            return st;
        }
        const char *name = (const char *)ev.data.scalar.value;
        const config_key *k = find_key(sec, name);
        if (!k) {
            ct_status st = unknown_key_error(where, sec, name);
            yaml_event_delete(&ev);
            return st;
        }
        size_t line = ev.start_mark.line + 1;
        yaml_event_delete(&ev);
        int idx = (int)(k - config_keys);
        if (ld->key_line[idx])
            return with_hint(ct_error(CT_ERR_INPUT, "%sduplicate key %s.%s (first set on line %zu)",
                                      where, sec, k->name, ld->key_line[idx]),
                             "keep one '%s:' line in the %s section", k->name, sec);
        ld->key_line[idx] = line;

        CT_TRY(next_event(ld, &ev));
        ct_status st = load_key_value(ld, k, &ev);
        yaml_event_delete(&ev);
        CT_TRY(st);
    }
}

/* The top-level mapping of section -> mapping, after its MAPPING_START. */
static ct_status load_sections(loader *ld) {
    for (;;) {
        yaml_event_t ev;
        CT_TRY(next_event(ld, &ev));
        if (ev.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&ev);
            return CT_OK;
        }
        char where[CT_PATH_MAX + 64];
        where_at(ld, ev.start_mark, where, sizeof where);
        if (ev.type != YAML_SCALAR_EVENT) {
            ct_status st =
                with_hint(ct_error(CT_ERR_INPUT, "%sa section name must be a plain word, got %s",
                                   where, event_kind(&ev)),
                          "valid sections: model, parallel, train, data, checkpoint, log");
            yaml_event_delete(&ev);
            return st;
        }
        int s = find_section((const char *)ev.data.scalar.value);
        if (s < 0) {
            ct_status st = unknown_section_error(where, (const char *)ev.data.scalar.value);
            yaml_event_delete(&ev);
            return st;
        }
        size_t line = ev.start_mark.line + 1;
        yaml_event_delete(&ev);
        if (ld->section_line[s])
            return with_hint(ct_error(CT_ERR_INPUT,
                                      "%sduplicate section %s (first opened on line %zu)", where,
                                      config_sections[s], ld->section_line[s]),
                             "merge the two '%s:' blocks into one", config_sections[s]);
        ld->section_line[s] = line;

        CT_TRY(next_event(ld, &ev));
        ct_status st = CT_OK;
        if (ev.type == YAML_MAPPING_START_EVENT) {
            yaml_event_delete(&ev);
            CT_TRY(load_section(ld, s));
            continue;
        }
        if (!event_is_null(&ev)) { /* `data:` with nothing under it is an empty section */
            char show[80];
            where_at(ld, ev.start_mark, where, sizeof where);
            if (ev.type == YAML_SCALAR_EVENT)
                ct_error(CT_ERR_INPUT, "%ssection %s must hold 'key: value' lines, got '%s'", where,
                         config_sections[s],
                         shown((const char *)ev.data.scalar.value, ev.data.scalar.length, show,
                               sizeof show));
            else
                ct_error(CT_ERR_INPUT, "%ssection %s must hold 'key: value' lines, got %s", where,
                         config_sections[s], event_kind(&ev));
            char list[1024];
            list_section_keys(config_sections[s], list, sizeof list);
            st = with_hint(CT_ERR_INPUT, "indent the keys under '%s:'; its keys: %s",
                           config_sections[s], list);
        }
        yaml_event_delete(&ev);
        CT_TRY(st);
    }
}

/* One YAML stream: zero documents (empty file) or one whose root is the section mapping. */
static ct_status load_stream(loader *ld) {
    yaml_event_t ev;
    CT_TRY(next_event(ld, &ev)); /* STREAM_START */
    yaml_event_delete(&ev);
    for (int docs = 0;; docs++) {
        CT_TRY(next_event(ld, &ev));
        if (ev.type == YAML_STREAM_END_EVENT) {
            yaml_event_delete(&ev);
            return CT_OK;
        }
        char where[CT_PATH_MAX + 64];
        where_at(ld, ev.start_mark, where, sizeof where);
        yaml_event_delete(&ev); /* DOCUMENT_START */
        if (docs > 0)
            return with_hint(ct_error(CT_ERR_INPUT,
                                      "%sa second YAML document ('---'); a config is one document",
                                      where),
                             "remove the '---' line and merge the documents");
        CT_TRY(next_event(ld, &ev));
        where_at(ld, ev.start_mark, where, sizeof where);
        if (ev.type == YAML_MAPPING_START_EVENT) {
            yaml_event_delete(&ev);
            CT_TRY(load_sections(ld));
        } else if (event_is_null(&ev)) {
            yaml_event_delete(&ev); /* "---" alone: an empty document */
        } else {
            ct_status st = with_hint(
                ct_error(CT_ERR_INPUT, "%sthe top level must be a mapping of sections, got %s",
                         where, ev.type == YAML_SCALAR_EVENT ? "a plain value" : event_kind(&ev)),
                "start with a section line such as 'model:' and indent its keys below it");
            yaml_event_delete(&ev);
            return st;
        }
        CT_TRY(next_event(ld, &ev)); /* DOCUMENT_END */
        yaml_event_delete(&ev);
    }
}

static ct_status load_buffer(ct_config *cfg, const char *data, size_t len, const char *origin) {
    /* Parse into a copy so that a failure halfway leaves the caller's config untouched. */
    loader *ld = ct_xcalloc(1, sizeof *ld);
    ct_config *work = ct_xmalloc(sizeof *work);
    memcpy(work, cfg, sizeof *work);
    ld->origin = origin ? origin : "<config>";
    ld->cfg = work;
    ct_status st;
    if (!yaml_parser_initialize(&ld->parser)) {
        st = ct_error(CT_ERR_RUNTIME, "%s: cannot initialise the YAML parser (out of memory)",
                      ld->origin);
    } else {
        yaml_parser_set_input_string(&ld->parser, (const unsigned char *)data, len);
        st = load_stream(ld);
        yaml_parser_delete(&ld->parser);
    }
    if (st == CT_OK) memcpy(cfg, work, sizeof *cfg);
    free(work);
    free(ld);
    return st;
}

ct_status ct_config_load_string(ct_config *cfg, const char *yaml, const char *origin) {
    return load_buffer(cfg, yaml, strlen(yaml), origin);
}

/* What a config file is not: named in the message when --config gets something else. */
ct_status ct_config_load_file(ct_config *cfg, const char *path) {
    /* O_NONBLOCK: opening a pipe for reading would otherwise wait for a writer forever. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return with_hint(
            ct_error(CT_ERR_INPUT, "cannot open config file '%s': %s", path, strerror(errno)),
            "check the path given to --config");
    struct stat st_file;
    if (fstat(fd, &st_file) != 0) {
        int err = errno;
        close(fd);
        return with_hint(
            ct_error(CT_ERR_INPUT, "cannot stat config file '%s': %s", path, strerror(err)),
            "check the path given to --config");
    }
    if (!S_ISREG(st_file.st_mode)) {
        close(fd);
        /* A device such as /dev/zero never ends, a pipe may never be written: refuse both. */
        return with_hint(
            ct_error(CT_ERR_INPUT, "config file '%s' is %s%s", path, ct_file_kind(st_file.st_mode),
                     S_ISDIR(st_file.st_mode) ? " (Is a directory)" : ""),
            "--config takes a regular YAML file of at most %d KiB", CT_CONFIG_MAX_BYTES / 1024);
    }
    if (st_file.st_size > CT_CONFIG_MAX_BYTES) {
        close(fd);
        return with_hint(ct_error(CT_ERR_INPUT,
                                  "config file '%s' is %lld bytes, over the %d KiB "
                                  "a config may have",
                                  path, (long long)st_file.st_size, CT_CONFIG_MAX_BYTES / 1024),
                         "--config takes a YAML config; is '%s' the right file?", path);
    }
    /* Read at most the cap plus one byte: a file that grows while we read is still bounded. */
    size_t cap = CT_CONFIG_MAX_BYTES + 1, len = 0;
    char *data = ct_xmalloc(cap);
    int read_errno = 0;
    while (len < cap) {
        ssize_t n = read(fd, data + len, cap - len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) read_errno = errno;
        if (n <= 0) break;
        len += (size_t)n;
    }
    close(fd);
    if (read_errno || len > CT_CONFIG_MAX_BYTES) {
        free(data);
        return with_hint(
            ct_error(CT_ERR_INPUT, "cannot read config file '%s': %s", path,
                     read_errno ? strerror(read_errno) : "it grew past the size cap while read"),
            "--config takes a YAML file");
    }
    ct_status st = load_buffer(cfg, data, len, path);
    free(data);
    return st;
}

/* ---- --set ----------------------------------------------------------------------------------- */

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
    return s;
}

ct_status ct_config_set(ct_config *cfg, const char *assignment) {
    char show[80];
    shown(assignment, strlen(assignment), show, sizeof show);
    char *copy = ct_xstrdup(assignment);
    char *eq = strchr(copy, '=');
    char *dot = eq ? memchr(copy, '.', (size_t)(eq - copy)) : NULL;
    ct_status st = CT_OK;
    if (!eq || !dot) {
        st = with_hint(ct_error(CT_ERR_INPUT, "--set '%s': expected section.key=value", show),
                       "write --set section.key=value, e.g. --set train.lr=3e-4");
        goto done;
    }
    *eq = '\0';
    *dot = '\0';
    char *section = trim(copy), *name = trim(dot + 1), *value = trim(eq + 1);
    if (!section[0] || !name[0]) {
        st = with_hint(ct_error(CT_ERR_INPUT, "--set '%s': expected section.key=value", show),
                       "write --set section.key=value, e.g. --set train.lr=3e-4");
        goto done;
    }
    size_t vlen = strlen(value);
    if (vlen >= 2 && (value[0] == '"' || value[0] == '\'') && value[vlen - 1] == value[0]) {
        value[vlen - 1] = '\0';
        value++;
        vlen -= 2;
    }
    if (find_section(section) < 0) {
        char show_section[80];
        ct_error(CT_ERR_INPUT, "--set: unknown section '%s' in '%s'",
                 shown(section, strlen(section), show_section, sizeof show_section), show);
        const config_key *s = suggest_full_key(section, name);
        if (s)
            st = with_hint(CT_ERR_INPUT, "did you mean %s.%s?", s->section, s->name);
        else
            st = with_hint(CT_ERR_INPUT,
                           "valid sections: model, parallel, train, data, checkpoint, log");
        goto done;
    }
    const config_key *k = find_key(section, name);
    if (!k) {
        st = unknown_key_error("--set: ", section, name);
        goto done;
    }
    st = key_assign(cfg, k, value, vlen, false, "--set: ");
done:
    free(copy);
    return st;
}
