/*
 * backend_registry.c — the registry (backend.h, "backends"): the one place backends are made.
 *
 * Built in: "cpu" and "cpu-async" (the CPU backend behind the asynchronous stream). Others
 * (cuda/) register themselves with ct_backend_register before the first ct_backend_new. Every
 * backend made here is checked for completeness (ct_backend_missing_op: each required op of
 * backend_ops.h filled), then wrapped as the environment asks: COOKTRAIN_ASYNC=1 puts it behind
 * the asynchronous stream, CT_CHECK_BACKEND=1 in check mode.
 *
 * This file sits above the backends: it calls cpu/backend_cpu.c, backend_async.c and
 * backend_check.c, which call only the helpers of backend.c, which calls none of them.
 */
#include "backend.h"
#include "core/backend/cpu/gemm_onednn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ct_backend *create_cpu(int n_threads) {
    return ct_backend_cpu_new(n_threads);
}

static ct_backend *create_cpu_async(int n_threads) {
    return ct_backend_async_new(ct_backend_cpu_new(n_threads));
}

enum { MAX_BACKENDS = 8 };
static ct_backend_desc registry[MAX_BACKENDS] = {
    {.name = "cpu", .create = create_cpu, .native_bf16 = ct_cpu_has_native_bf16},
    {.name = "cpu-async", .create = create_cpu_async, .native_bf16 = ct_cpu_has_native_bf16},
};
static int n_registered = 2;

void ct_backend_register(const ct_backend_desc *desc) {
    for (int i = 0; i < n_registered; i++)
        if (!strcmp(registry[i].name, desc->name)) {
            registry[i] = *desc;
            return;
        }
    CT_ASSERTF(n_registered < MAX_BACKENDS, "more than %d backends registered", MAX_BACKENDS);
    registry[n_registered++] = *desc;
}

static const ct_backend_desc *registry_find(const char *name) {
    for (int i = 0; i < n_registered; i++)
        if (!strcmp(registry[i].name, name)) return &registry[i];
    return NULL;
}

/* The registered names, "a, b, c", for hints. */
static void registry_names(char *buf, size_t cap) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n_registered && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%s", i ? ", " : "", registry[i].name);
}

/* What ct_backend_new(name) makes: name's entry, or for "auto" the first usable accelerator
 * (why gets the reason none is) else cpu's. */
static const ct_backend_desc *registry_pick(const char *name, char *why, size_t cap) {
    if (strcmp(name, "auto") != 0) return registry_find(name);
    for (int i = 0; i < n_registered; i++)
        if (registry[i].accelerator && (!registry[i].usable || registry[i].usable(why, cap)))
            return &registry[i];
    return registry_find("cpu");
}

const char *ct_backend_resolve(const char *name) {
    char why[160];
    const ct_backend_desc *desc = registry_pick(name, why, sizeof why);
    return desc ? desc->name : NULL;
}

bool ct_backend_native_bf16(const char *name, char *how, size_t cap) {
    char why[160];
    const ct_backend_desc *desc = registry_pick(name, why, sizeof why);
    if (!desc) {
        snprintf(how, cap, "backend %s is not registered", name);
        return false;
    }
    if (!desc->native_bf16) {
        snprintf(how, cap, "backend %s widens bf16 to fp32", desc->name);
        return false;
    }
    return desc->native_bf16(how, cap);
}

static int selected_device;

void ct_backend_set_device(int device) {
    selected_device = device;
}

int ct_backend_device(void) {
    return selected_device;
}

int ct_backend_device_count(const char *name, char *why, size_t cap) {
    const ct_backend_desc *desc = registry_find(name);
    if (!desc || !desc->device_count) {
        snprintf(why, cap, "backend %s has no devices", name);
        return 0;
    }
    return desc->device_count(why, cap);
}

ct_status ct_backend_new(ct_backend **out, const char *name, int n_threads, char *chosen,
                         size_t cap) {
    *out = NULL;
    char why[160] = "", names[160];
    registry_names(names, sizeof names);
    const ct_backend_desc *desc = registry_pick(name, why, sizeof why);
    if (!strcmp(name, "auto")) {
        if (desc->accelerator)
            snprintf(chosen, cap, "%s (auto)", desc->name);
        else
            snprintf(chosen, cap, "cpu (auto: %s)", why[0] ? why : "this build has no GPU backend");
    } else {
        if (!desc && !strcmp(name, "cuda")) {
            ct_error(CT_ERR_INPUT, "--backend cuda: the CUDA backend is not part of this build");
            ct_hint("use --backend cpu (or auto, which picks cuda where it is built and a GPU is "
                    "usable)");
            return CT_ERR_INPUT;
        }
        if (!desc) {
            ct_error(CT_ERR_INPUT, "--backend '%s' is not a backend", name);
            ct_hint("valid backends: %s, auto", names);
            return CT_ERR_INPUT;
        }
        if (desc->usable && !desc->usable(why, sizeof why)) {
            ct_error(CT_ERR_INPUT, "--backend %s: %s", name, why);
            ct_hint("use --backend cpu, or --backend auto to fall back to it");
            return CT_ERR_INPUT;
        }
        snprintf(chosen, cap, "%s", desc->name);
    }
    ct_backend *be = desc->create(n_threads);
    const char *missing = ct_backend_missing_op(be->iface);
    CT_ASSERTF(missing == NULL,
               "backend %s leaves its slot '%s' NULL (see core/backend/backend_ops.h)",
               be->iface->name, missing);
    const char *async = getenv("COOKTRAIN_ASYNC");
    if (async && !strcmp(async, "1") && strstr(be->iface->name, "-async") == NULL) {
        be = ct_backend_async_new(be);
        size_t used = chosen ? strlen(chosen) : cap; /* chosen may be NULL (cap 0) */
        if (used < cap)
            snprintf(chosen + used, cap - used,
                     " behind the asynchronous stream (COOKTRAIN_ASYNC=1)");
    }
    const char *check = getenv("CT_CHECK_BACKEND");
    if (check && !strcmp(check, "1") && strcmp(be->iface->name, "cpu") != 0) {
        be = ct_backend_check_new(be);
        size_t used = chosen ? strlen(chosen) : cap;
        if (used < cap)
            snprintf(chosen + used, cap - used,
                     ", every op checked against the CPU backend (CT_CHECK_BACKEND=1)");
    }
    *out = be;
    return CT_OK;
}
