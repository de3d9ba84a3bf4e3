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

/* As ct_comm_nccl_new (comm_nccl.h), through the plugin, with the job's abort for the watchdog.
 * Only after the backend was made (the plugin is loaded). */
struct ct_comm;
struct ct_backend;
struct ct_comm *ct_cuda_plugin_nccl_new(struct ct_comm *boot, struct ct_backend *be,
                                        double timeout_s, bool p2p_channels,
                                        void (*abort_job)(int));

#endif /* CT_CUDA_PLUGIN_H */
