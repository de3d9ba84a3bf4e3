/*
 * plugin.h — the CUDA backend loaded on demand from libcooktrain-cuda.so beside the executable
 * (plugin.c says why). Needs no CUDA headers or libraries: the CPU-only parts of the real build
 * link it in place of the backend itself.
 */
#ifndef CT_CUDA_PLUGIN_H
#define CT_CUDA_PLUGIN_H

#include <stdbool.h>
#include <stddef.h>

/* Adds "cuda" to the backend registry; the library is opened the first time the registry asks
 * whether the backend is usable (--backend cuda or auto), never for a CPU run. */
void ct_cuda_plugin_register(void);

/* As ct_cuda_usable (backend_cuda.h), through the plugin; false with the reason when the
 * library cannot be loaded. */
bool ct_cuda_plugin_usable(char *why, size_t cap);

#endif /* CT_CUDA_PLUGIN_H */
