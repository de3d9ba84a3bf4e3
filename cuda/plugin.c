/*
 * plugin.c — the CUDA backend as a plugin of the cooktrain executable, loaded only when a run asks
 * for it (--backend cuda, or auto).
 *
 * Why: cuBLAS(Lt) is a ~500 MB library whose loading costs every process ~0.1 s and ~220 MB of
 * resident memory (measured on the development machine: a program linked with -lcublasLt -lcublas
 * but doing nothing takes 0.08 s and 218 MB, against 0.00 s and 1.5 MB with cudart alone). A CPU
 * run of 8 ranks would pay that 8 times for nothing. So the real build (cuda/cuda.mk) puts the
 * whole backend — kernels, cuBLASLt GEMMs, the slot table — into libcooktrain-cuda.so beside the
 * executable, linked with cudart and cuBLAS(Lt), and the executable links only this file. The
 * emulated build links the backend itself (ct_cuda_register is then defined and this file is not
 * used).
 *
 * The plugin resolves its calls into the core (ct_backend_apply_env, ct_xcalloc, ...) against
 * the executable, which exports its symbols (-rdynamic).
 */
#include "cuda/plugin.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/backend.h"

#define CT_CUDA_PLUGIN_NAME "libcooktrain-cuda.so"

typedef bool (*usable_fn)(char *why, size_t cap);
typedef ct_backend *(*backend_new_fn)(int device);

static struct {
    bool tried;
    usable_fn usable;
    backend_new_fn backend_new;
    char error[512];
} plugin;

/* Opens the plugin beside the executable once; false with plugin.error set when it cannot. */
static bool plugin_load(void) {
    if (plugin.tried) return plugin.usable != NULL;
    plugin.tried = true;
    char path[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    if (n <= 0) {
        snprintf(plugin.error, sizeof plugin.error, "cannot find the executable's directory");
        return false;
    }
    path[n] = '\0';
    char *slash = strrchr(path, '/');
    size_t dir = slash ? (size_t)(slash - path + 1) : 0;
    snprintf(path + dir, sizeof path - dir, "%s", CT_CUDA_PLUGIN_NAME);
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(plugin.error, sizeof plugin.error, "the CUDA backend library cannot be loaded (%s)",
                 dlerror());
        return false;
    }
    plugin.usable = (usable_fn)dlsym(lib, "ct_cuda_usable");
    plugin.backend_new = (backend_new_fn)dlsym(lib, "ct_cuda_backend_new");
    if (!plugin.usable || !plugin.backend_new) {
        snprintf(plugin.error, sizeof plugin.error, "%.400s lacks the backend's entry points", path);
        plugin.usable = NULL;
        return false;
    }
    return true;
}

static bool plugin_usable(char *why, size_t cap) {
    if (!plugin_load()) {
        snprintf(why, cap, "%s", plugin.error);
        return false;
    }
    return plugin.usable(why, cap);
}

static ct_backend *plugin_create(int n_threads) {
    (void)n_threads;
    return plugin.backend_new(0); /* the registry asked plugin_usable first */
}

bool ct_cuda_plugin_usable(char *why, size_t cap) {
    return plugin_usable(why, cap);
}

void ct_cuda_plugin_register(void) {
    static const ct_backend_desc desc = {
        .name = "cuda", .create = plugin_create, .usable = plugin_usable, .accelerator = true};
    ct_backend_register(&desc);
}
