/*
 * plan_search.h — `cooktrain plan --search N`: a hardware model, and the layouts of a config on N
 * devices ranked by estimated step time (plan_search.c states the model; parallel/README.md,
 * Plan search); and with the same model, parallel.auto_layout's layout for a new world size.
 */
#ifndef CT_PARALLEL_PLAN_SEARCH_H
#define CT_PARALLEL_PLAN_SEARCH_H

#include <stdio.h>

#include "core/config/config.h"

/* A device and its links: dense peak FLOP/s per precision, the fraction of it GEMMs reach, memory
 * per device and its bandwidth, devices per node, and per device the node's links and the
 * network's (bytes/s each way, latency in s). */
typedef struct ct_hardware {
    char name[64];
    double peak_bf16, peak_fp32, gemm_efficiency, memory_bytes, memory_bandwidth;
    int devices_per_node;
    double intra_bw, intra_lat, inter_bw, inter_lat;
} ct_hardware;

/* A built-in profile (h100-sxm, h200, a100; cpu: this machine, measured now) or a YAML file. */
ct_status ct_hardware_load(const char *name_or_path, ct_hardware *hw);
/* This machine as a profile: a device is a core running one single-threaded rank; peaks and the
 * GEMM rate measured as the trainer measures them, memory bandwidth and the ranks' shared-memory
 * link by a 64 MiB copy, memory per device the machine's over its cores. */
ct_status ct_hardware_measure_cpu(ct_hardware *hw);
void ct_hardware_print_yaml(const ct_hardware *hw, FILE *out);

/* Every valid (tp, cp, pp, dp, ep, ZeRO stage, schedule and virtual stages, micro-batch,
 * recompute) of `cfg` on n devices — nodes of hw->devices_per_node, the last one what is left —
 * those that fit, the best `top` printed with their estimated costs and why (json: one object
 * per layout). CT_ERR_INPUT when none is valid (naming the factor of n that the model's sizes
 * do not hold) or none fits. */
ct_status ct_plan_search(const ct_config *cfg, int n, const ct_hardware *hw, int top, bool json,
                         FILE *out);

/* parallel.auto_layout: `cfg` did not validate on n ranks (the pending error says why); the
 * layout for n of the search above that keeps its tp, cp, ep, ZeRO stage, schedule and virtual
 * stages, sequence parallelism, recompute, precision and global batch — pp over the divisors of
 * n / (tp·cp), dp the rest, the micro-batch over the powers of two that divide a rank's share —
 * and fits, the fastest by estimated step time on hw. On CT_OK cfg is that layout, validated for
 * n, and derived.layout_chosen says what was chosen and why; CT_ERR_INPUT when none is valid
 * (with the first reason) or none fits. The same inputs give the same choice on every rank. */
ct_status ct_plan_choose_layout(ct_config *cfg, int n, const ct_hardware *hw);

#endif
