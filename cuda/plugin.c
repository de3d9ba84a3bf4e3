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

#include "core/backend/backend.h"
#include "cuda/backend_cuda.h"
#include "core/comm/comm.h"

#define CT_CUDA_PLUGIN_NAME "libcooktrain-cuda.so"

typedef bool (*usable_fn)(char *why, size_t cap);
typedef ct_backend *(*backend_new_fn)(int device);
typedef int (*device_count_fn)(char *why, size_t cap);
typedef ct_comm *(*nccl_new_fn)(ct_comm *boot, ct_backend *be, double timeout_s, bool p2p_channels);
typedef void (*nccl_set_abort_fn)(void (*abort_job)(int));

static struct {
    bool tried;
    usable_fn usable;
    backend_new_fn backend_new;
    device_count_fn device_count;
    nccl_new_fn nccl_new;
    nccl_set_abort_fn nccl_set_abort;
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
        snprintf(plugin.error, sizeof plugin.error,
                 "the CUDA backend library cannot be loaded (%s)", dlerror());
        return false;
    }
    plugin.usable = (usable_fn)dlsym(lib, "ct_cuda_usable");
    plugin.backend_new = (backend_new_fn)dlsym(lib, "ct_cuda_backend_new");
    plugin.device_count = (device_count_fn)dlsym(lib, "ct_cuda_device_count");
    plugin.nccl_new = (nccl_new_fn)dlsym(lib, "ct_comm_nccl_new");
    plugin.nccl_set_abort = (nccl_set_abort_fn)dlsym(lib, "ct_comm_nccl_set_abort");
    if (!plugin.usable || !plugin.backend_new || !plugin.device_count || !plugin.nccl_new ||
        !plugin.nccl_set_abort) {
        snprintf(plugin.error, sizeof plugin.error, "%.400s lacks the backend's entry points",
                 path);
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
    return plugin.backend_new(ct_backend_device()); /* the registry asked plugin_usable first */
}

static int plugin_device_count(char *why, size_t cap) {
    if (!plugin_load()) {
        snprintf(why, cap, "%s", plugin.error);
        return 0;
    }
    return plugin.device_count(why, cap);
}

ct_comm *ct_cuda_plugin_nccl_new(ct_comm *boot, ct_backend *be, double timeout_s, bool p2p_channels,
                                 void (*abort_job)(int)) {
    CT_ASSERTF(plugin_load(), "NCCL groups without the CUDA plugin: %s", plugin.error);
    plugin.nccl_set_abort(abort_job);
    return plugin.nccl_new(boot, be, timeout_s, p2p_channels);
}

void ct_cuda_plugin_register(void) {
    static const ct_backend_desc desc = {.name = "cuda",
                                         .create = plugin_create,
                                         .usable = plugin_usable,
                                         .accelerator = true,
                                         .device_count = plugin_device_count,
                                         .native_bf16 = ct_cuda_native_bf16};
    ct_backend_register(&desc);
}
