/*
 * param_stream.h — the model's parameters as global tensors, streamed to world rank 0 one tensor
 * at a time, with a check that every replica holds the same bytes.
 *
 * Order and shapes are those of a world-size-1 run (core/README.md, Determinism: every layout
 * trains the same model): the embeddings, then layer 0 .. L−1, then the final norm, each group's
 * tensors in registry order; tensor-parallel slices are assembled into the global tensor, ZeRO-3
 * units are gathered, pipeline stages send their tensors to rank 0, and the tied embedding appears
 * once. Memory: a stage holds one unit on the host plus one tensor; rank 0 one tensor.
 *
 * Replicas: every copy of a tensor must be the same bytes — its data-parallel replicas (every
 * rank of the dp group), its tensor-parallel replicas when it is not split over tp (norms,
 * row-parallel biases, position embeddings), and the tied embedding's twin on the last pipeline
 * stage. Each copy's CRC-32 (ct_crc32) is compared over its group; a difference is a bug (replicas
 * that drift apart train different models) and is reported as CT_ERR_RUNTIME naming the tensor
 * and the group.
 */
#ifndef CT_PARALLEL_PARAM_STREAM_H
#define CT_PARALLEL_PARAM_STREAM_H

#include "core/model/model.h"
#include "parallel/context.h"
#include "parallel/data_parallel.h"

/* Receives one global tensor (row-major f32, rows × cols; cols = 1 for vectors) on world rank 0.
 * A non-OK status stops further calls (the stream still runs to the end on every rank). */
typedef ct_status (*ct_param_sink_fn)(void *ctx, const char *name, int64_t rows, int64_t cols,
                                      const float *data);

/*
 * Streams every parameter to `sink` on world rank 0 (sink may be NULL elsewhere) and checks the
 * replicas. Collective over the world. Every rank returns the same status: a sink failure
 * (its status and message) or a replica mismatch (CT_ERR_RUNTIME) or CT_OK. n_checked (may be
 * NULL) gets the number of replica comparisons made by this rank's groups.
 */
ct_status ct_param_stream(ct_model *model, ct_dp *dp, ct_pctx *pctx, ct_param_sink_fn sink,
                          void *ctx, int64_t *n_checked);

/*
 * A sink that writes a parameter dump: `path` gets every tensor's raw little-endian f32 back to
 * back, and `path`.index.json a JSON array of {"name", "shape": [rows, cols], "offset"} (offset in
 * elements). Open on rank 0 only; ct_param_dump_close finishes the index and reports any write
 * error (a full disk) as CT_ERR_RUNTIME.
 */
typedef struct ct_param_dump ct_param_dump;
ct_status ct_param_dump_open(ct_param_dump **out, const char *path);
ct_status ct_param_dump_sink(void *dump, const char *name, int64_t rows, int64_t cols,
                             const float *data);
ct_status ct_param_dump_close(ct_param_dump *dump); /* frees; accepts NULL (returns CT_OK) */

/* Streams the parameters to a dump file written by world rank 0 (ct_param_stream with the dump
 * sink). Collective; every rank returns the same status. */
ct_status ct_param_dump_write(ct_model *model, ct_dp *dp, ct_pctx *pctx, const char *path);

#endif /* CT_PARALLEL_PARAM_STREAM_H */
