/*
 * backend_ops.h — the list of backend ops, written once: every place that must name every op is
 * generated from it, so adding an op is one line here plus the code that is really about the op.
 *
 * CT_BACKEND_OPS(X) calls X(name, need, queue, (type, param), ...) once per op slot of
 * struct ct_backend_i, in table order, with the slot's parameters after `void *ctx`. Everything
 * that must name every op is generated from it:
 *   - the op slots of struct ct_backend_i (backend.h);
 *   - the asynchronous stream's command kinds, argument structs, queueing slots, dispatch and
 *     table (backend_async.c);
 *   - check mode (backend_check.c, check_ops.h): its table, which names ct_check_<op> for every
 *     required and feature op, so an op without its checker (check_ops.c) does not compile,
 *     and run_<op>, the forwarding every checker calls (the op on the backend under test, then
 *     on the CPU with the buffers' CPU copies);
 *   - ct_backend_missing_op (backend.c), which the registry asserts on every backend it makes
 *     (a backend whose table lacks a required op is a bug, reported with the op's name);
 *   - the dispatch at the end of every ct_<op> wrapper (backend_ops.c, op_call_<op>: the
 *     profile's and the device-idle audit's brackets around the slot);
 *   - the slot functions' declarations and the table entries of the backends that name them by
 *     the op (CT_OP_DECLARE, CT_OP_SLOT below): the CPU backend's ct_cpu_<op> (cpu/cpu.h), the
 *     CUDA backend's ct_cuda_<op> (cuda/ct_cuda_ctx.h) and check mode's ct_check_<op>.
 * Adding an op: its line here, its ct_<op> wrapper (backend.h, backend_ops.c), its CPU kernel
 * (cpu/<family>.c), its checker (check_ops.c), its CUDA launcher (cuda/<family>.cu), its tests.
 * core/backend/BACKENDS.md walks through it.
 *
 * Columns:
 *   name   the slot's name (the member of struct ct_backend_i);
 *   need   CT_OP_REQUIRED: every backend fills it; CT_OP_OPTIONAL: may be NULL, its ct_ wrapper
 *          then runs the reference composition of other ops (check mode hides an optional slot,
 *          so that the composition is checked op by op); CT_OP_FEATURE: may be NULL, and then
 *          the backend lacks a feature (ct_backend_has_feature_ops), which configuration
 *          validation refuses with exit 2 before a run starts (check mode checks it, and
 *          hides it when the backend under test lacks it);
 *   queue  CT_OP_ARGS: every argument is a value or backend memory, which the asynchronous
 *          stream copies into its command as given; CT_OP_HOST: the op also reads host memory the
 *          caller may reuse as soon as the slot returns (AdamW's segments and hyperparameters,
 *          sumsq's arrays), which backend_async.c copies and frees by hand (own_<op> and
 *          release_<op>, a compile error if missing);
 *   then the parameters, (type, name) each, at most 16.
 * `need` and `queue` are tokens pasted onto macro names by the users of the list, not macros.
 *
 * The contract of each op (precision, what accumulates) is in backend.h, above the slots and at
 * the ct_ wrappers; a line here says only what the parameters are.
 */
#ifndef CT_BACKEND_OPS_H
#define CT_BACKEND_OPS_H

/* clang-format off */
#define CT_BACKEND_OPS(X)                                                                          \
    /* dst[0, n) = value as dtype (f32, bf16, i32 or u8) */                                        \
    X(fill, CT_OP_REQUIRED, CT_OP_ARGS,                                                            \
      (void *, dst), (ct_dtype, dtype), (int64_t, n), (float, value))                              \
    /* device to device */                                                                         \
    X(copy, CT_OP_REQUIRED, CT_OP_ARGS,                                                            \
      (void *, dst), (const void *, src), (size_t, bytes))                                         \
    X(gemm, CT_OP_REQUIRED, CT_OP_ARGS,                                                            \
      (bool, trans_a), (bool, trans_b), (int64_t, M), (int64_t, N), (int64_t, K), (float, alpha),  \
      (const void *, A), (int64_t, lda), (const void *, B), (int64_t, ldb), (float, beta),         \
      (void *, C), (int64_t, ldc), (ct_dtype, ab_dtype), (ct_dtype, c_dtype))                      \
    /* count GEMMs of one call; mnk[3i..3i+2] and ptrs[3i..3i+2] (A, B, C) are host arrays */   \
    X(gemm_grouped, CT_OP_OPTIONAL, CT_OP_HOST,                                                    \
      (int, count), (bool, trans_a), (bool, trans_b), (const int64_t *, mnk), (float, alpha),      \
      (void *const *, ptrs), (float, beta), (ct_dtype, ab_dtype), (ct_dtype, c_dtype))             \
    X(gemm_bias_gelu, CT_OP_OPTIONAL, CT_OP_ARGS,                                                  \
      (int64_t, M), (int64_t, N), (int64_t, K), (const void *, A), (int64_t, lda),                 \
      (const void *, B), (int64_t, ldb), (const void *, bias), (void *, pre), (int64_t, ldpre),    \
      (void *, out), (int64_t, ldout), (ct_dtype, dt))                                             \
    X(bias_add, CT_OP_REQUIRED, CT_OP_ARGS,                                                        \
      (ct_dtype, dt), (void *, out), (const void *, bias), (int64_t, N), (int64_t, C))             \
    /* residual may be NULL */                                                                     \
    X(bias_init, CT_OP_REQUIRED, CT_OP_ARGS,                                                       \
      (ct_dtype, dt), (void *, out), (const void *, bias), (const void *, residual), (int64_t, N), \
      (int64_t, C))                                                                                \
    X(bias_grad, CT_OP_REQUIRED, CT_OP_ARGS,                                                       \
      (ct_dtype, dt), (float *, dbias), (const void *, dout), (int64_t, N), (int64_t, C))          \
    X(axpy, CT_OP_REQUIRED, CT_OP_ARGS,                                                            \
      (ct_dtype, dt), (void *, dst), (const void *, src), (float, alpha), (int64_t, n))            \
    X(scale, CT_OP_REQUIRED, CT_OP_ARGS,                                                           \
      (ct_dtype, dt), (void *, x), (float, s), (int64_t, n))                                       \
    X(embedding_fwd, CT_OP_REQUIRED, CT_OP_ARGS,                                                   \
      (ct_dtype, dt), (void *, out), (const int32_t *, tokens), (const void *, table),             \
      (int64_t, N), (int64_t, C), (int64_t, rows), (int64_t, row_offset))                          \
    X(embedding_bwd, CT_OP_REQUIRED, CT_OP_ARGS,                                                   \
      (ct_dtype, dt), (float *, dtable), (const void *, dout), (const int32_t *, tokens),          \
      (int64_t, N), (int64_t, C), (int64_t, rows), (int64_t, row_offset))                          \
    /* Mixture of Experts: rows moved between tokens and experts (backend.h, ct_gather_rows) */   \
    X(gather_rows, CT_OP_REQUIRED, CT_OP_ARGS,                                                     \
      (ct_dtype, dt), (void *, out), (const void *, in), (const int32_t *, idx),                   \
      (const float *, w), (int64_t, N), (int64_t, slots), (int64_t, C), (int64_t, in_rows))        \
    X(gather_dot, CT_OP_REQUIRED, CT_OP_ARGS,                                                      \
      (ct_dtype, dt), (float *, out), (const void *, a), (const int32_t *, ia), (const void *, b), \
      (const int32_t *, ib), (int64_t, R), (int64_t, C), (int64_t, a_rows), (int64_t, b_rows))     \
    X(posemb_fwd, CT_OP_REQUIRED, CT_OP_ARGS,                                                      \
      (ct_dtype, dt), (void *, out), (const void *, wpe), (int64_t, B), (int64_t, T),              \
      (int64_t, C), (int64_t, pos_offset))                                                         \
    X(posemb_bwd, CT_OP_REQUIRED, CT_OP_ARGS,                                                      \
      (ct_dtype, dt), (float *, dwpe), (const void *, dout), (int64_t, B), (int64_t, T),           \
      (int64_t, C), (int64_t, pos_offset))                                                         \
    /* residual may be NULL; else inp += residual first, in place (the norms' residual add) */    \
    X(layernorm_fwd, CT_OP_REQUIRED, CT_OP_ARGS,                                                   \
      (ct_dtype, dt), (void *, out), (float *, mean), (float *, rstd), (void *, inp),              \
      (const void *, residual), (const void *, w), (const void *, b), (int64_t, N), (int64_t, C))  \
    X(layernorm_bwd, CT_OP_REQUIRED, CT_OP_ARGS,                                                   \
      (ct_dtype, dt), (void *, dinp), (float *, dw), (float *, db), (const void *, dout),          \
      (const void *, inp), (const void *, w), (const float *, mean), (const float *, rstd),        \
      (int64_t, N), (int64_t, C))                                                                  \
    X(gelu_fwd, CT_OP_REQUIRED, CT_OP_ARGS,                                                        \
      (ct_dtype, dt), (void *, out), (const void *, inp), (int64_t, n))                            \
    /* dbias may be NULL */                                                                        \
    X(gelu_bwd, CT_OP_REQUIRED, CT_OP_ARGS,                                                        \
      (ct_dtype, dt), (void *, dinp), (float *, dbias), (const void *, inp), (const void *, dout), \
      (int64_t, N), (int64_t, C))                                                                  \
    /* residual as in layernorm_fwd */                                                            \
    X(rmsnorm_fwd, CT_OP_REQUIRED, CT_OP_ARGS,                                                     \
      (ct_dtype, dt), (void *, out), (float *, rstd), (void *, inp), (const void *, residual),     \
      (const void *, w), (int64_t, N), (int64_t, C), (float, eps))                                 \
    X(rmsnorm_bwd, CT_OP_REQUIRED, CT_OP_ARGS,                                                     \
      (ct_dtype, dt), (void *, dinp), (float *, dw), (const void *, dout), (const void *, inp),    \
      (const void *, w), (const float *, rstd), (int64_t, N), (int64_t, C))                        \
    /* x: B·T rows of stride ld, rotated in place in columns [0, n_rot_head·head_dim) */           \
    X(rope, CT_OP_REQUIRED, CT_OP_ARGS,                                                            \
      (ct_dtype, dt), (void *, x), (const float *, cos_sin), (int64_t, B), (int64_t, T),           \
      (int64_t, n_rot_head), (int64_t, head_dim), (int64_t, ld), (int64_t, pos_offset),            \
      (bool, inverse))                                                                             \
    /* gate and up (and dgate and dup): N rows of H at row stride ld; out (and dout): (N, H) */    \
    X(swiglu_fwd, CT_OP_REQUIRED, CT_OP_ARGS,                                                      \
      (ct_dtype, dt), (void *, out), (const void *, gate), (const void *, up), (int64_t, N),       \
      (int64_t, H), (int64_t, ld))                                                                 \
    X(swiglu_bwd, CT_OP_REQUIRED, CT_OP_ARGS,                                                      \
      (ct_dtype, dt), (void *, dgate), (void *, dup), (const void *, gate), (const void *, up),    \
      (const void *, dout), (int64_t, N), (int64_t, H), (int64_t, ld))                             \
    X(attention_fwd, CT_OP_REQUIRED, CT_OP_ARGS,                                                   \
      (ct_dtype, dt), (void *, out), (float *, lse), (const void *, qkv), (int64_t, B),            \
      (int64_t, T), (int64_t, n_head), (int64_t, n_kv_head), (int64_t, head_dim))                  \
    /* dbias may be NULL */                                                                        \
    X(attention_bwd, CT_OP_REQUIRED, CT_OP_ARGS,                                                   \
      (ct_dtype, dt), (void *, dqkv), (float *, dbias), (const void *, dout), (const void *, qkv), \
      (const void *, out), (const float *, lse), (int64_t, B), (int64_t, T), (int64_t, n_head),    \
      (int64_t, n_kv_head), (int64_t, head_dim))                                                   \
    /* one position against a key/value cache kv (B, T_max, 2·n_kv_head·hd), its row pos written */ \
    X(attention_decode, CT_OP_REQUIRED, CT_OP_ARGS,                                                \
      (ct_dtype, dt), (void *, out), (void *, kv), (const void *, qkv), (int64_t, B),              \
      (int64_t, T_max), (int64_t, pos), (int64_t, n_head), (int64_t, n_kv_head),                   \
      (int64_t, head_dim))                                                                         \
    /* context parallelism (backend.h, ct_attention_part_fwd): chunks packed by CT_ATT_CHUNKS */ \
    /* rows of cols elements at row strides ld_dst and ld_src, each converted as by cast */       \
    X(cast_cols, CT_OP_FEATURE, CT_OP_ARGS,                                                        \
      (void *, dst), (ct_dtype, dst_dtype), (int64_t, ld_dst), (const void *, src),                \
      (ct_dtype, src_dtype), (int64_t, ld_src), (int64_t, rows), (int64_t, cols))                  \
    X(attention_part_fwd, CT_OP_FEATURE, CT_OP_ARGS,                                               \
      (ct_dtype, dt), (float *, o_acc), (float *, lse_acc), (const void *, qkv),                   \
      (const void *, kv), (int64_t, B), (int64_t, T), (int64_t, n_head), (int64_t, n_kv_head),     \
      (int64_t, head_dim), (int64_t, chunks))                                                      \
    X(attention_part_bwd, CT_OP_FEATURE, CT_OP_ARGS,                                               \
      (ct_dtype, dt), (float *, dq_acc), (float *, dkv_acc), (const void *, dout),                 \
      (const void *, qkv), (const void *, out), (const float *, lse), (const void *, kv),          \
      (int64_t, B), (int64_t, T), (int64_t, n_head), (int64_t, n_kv_head), (int64_t, head_dim),    \
      (int64_t, chunks))                                                                           \
    X(xent_rowmax, CT_OP_REQUIRED, CT_OP_ARGS,                                                     \
      (ct_dtype, dt), (float *, rowmax), (const void *, logits), (int64_t, N), (int64_t, V),       \
      (int64_t, n_valid))                                                                          \
    X(xent_sumexp, CT_OP_REQUIRED, CT_OP_ARGS,                                                     \
      (ct_dtype, dt), (float *, sumexp), (float *, target_logit), (void *, logits),                \
      (const int32_t *, targets), (const float *, rowmax), (int64_t, N), (int64_t, V),             \
      (int64_t, n_valid), (int64_t, col_offset), (bool, keep_exp))                                 \
    X(xent_finish, CT_OP_REQUIRED, CT_OP_ARGS,                                                     \
      (ct_dtype, dt), (float *, losses), (void *, logits_to_grad), (const int32_t *, targets),     \
      (const float *, rowmax), (const float *, sumexp), (const float *, target_logit),             \
      (int64_t, N), (int64_t, V), (int64_t, n_valid), (int64_t, col_offset), (float, dloss),       \
      (bool, write_grad))                                                                          \
    /* segments[n_segments] and *hp are host memory */                                             \
    X(adamw, CT_OP_REQUIRED, CT_OP_HOST,                                                           \
      (float *, param), (const float *, grad), (float *, m), (float *, v),                         \
      (const ct_adamw_segment *, segments), (int, n_segments), (const ct_adamw_hparams *, hp),     \
      (void *, param_copy), (ct_dtype, copy_dtype))                                                \
    /* the arrays x[count] and n[count] are host memory */                                         \
    X(sumsq, CT_OP_REQUIRED, CT_OP_HOST,                                                           \
      (float *, out), (const float *const *, x), (const int64_t *, n), (int, count))               \
    X(cast, CT_OP_REQUIRED, CT_OP_ARGS,                                                            \
      (void *, dst), (ct_dtype, dst_dtype), (const void *, src), (ct_dtype, src_dtype),            \
      (int64_t, n))
/* clang-format on */

/* ---- a backend's slot functions, named by the op ---------------------------------------------
 *
 * A backend whose slot function for op <op> is <prefix><op> declares them all and fills its table
 * from the list, for every required and feature op (optional ops, which may be NULL, it declares
 * and lists by hand where it has them):
 *
 *     #define MY_DECL_(...) CT_OP_DECLARE(ct_my_, __VA_ARGS__)
 *     CT_BACKEND_OPS(MY_DECL_)      // void ct_my_<op>(void *ctx, <the op's parameters>);
 *     #define MY_SLOT_(...) CT_OP_SLOT(ct_my_, __VA_ARGS__)
 *     static const struct ct_backend_i my_iface = {..., CT_BACKEND_OPS(MY_SLOT_)};
 *
 * A missing function is then a link error, one with other parameters a compile error. */
#define CT_OP_DECLARE(prefix, name, need, queue, ...)                                              \
    CT_OP_IF_FILLED_##need(void prefix##name(void *ctx, CT_OP_PARAMS(__VA_ARGS__));)
#define CT_OP_SLOT(prefix, name, need, queue, ...) CT_OP_IF_FILLED_##need(.name = prefix##name, )
#define CT_OP_IF_FILLED_CT_OP_REQUIRED(...) __VA_ARGS__
#define CT_OP_IF_FILLED_CT_OP_OPTIONAL(...)
#define CT_OP_IF_FILLED_CT_OP_FEATURE(...) __VA_ARGS__

/* ---- parameter lists -------------------------------------------------------------------------
 *
 * CT_OP_PARAMS(...) turns an op's (type, name) pairs into a parameter list "type name, ...",
 * CT_OP_NAMES(...) into the argument list "name, ...", CT_OP_MEMBERS(...) into struct members
 * "type name; ...". CT_PP_LIST(f, ...) / CT_PP_SEQ(f, ...) apply f to each pair, with and without
 * commas between, for users that need another form. */
#define CT_OP_PARAM_(type, name) type name
#define CT_OP_NAME_(type, name) name
#define CT_OP_MEMBER_(type, name) type name;
#define CT_OP_PARAMS(...) CT_PP_LIST(CT_OP_PARAM_, __VA_ARGS__)
#define CT_OP_NAMES(...) CT_PP_LIST(CT_OP_NAME_, __VA_ARGS__)
#define CT_OP_MEMBERS(...) CT_PP_SEQ(CT_OP_MEMBER_, __VA_ARGS__)

/* clang-format off */
#define CT_PP_CAT(a, b) CT_PP_CAT_(a, b)
#define CT_PP_CAT_(a, b) a##b
#define CT_PP_NARG(...) CT_PP_NARG_(__VA_ARGS__, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1)
#define CT_PP_NARG_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, n, ...) n

#define CT_PP_LIST(f, ...) CT_PP_CAT(CT_PP_LIST_, CT_PP_NARG(__VA_ARGS__))(f, __VA_ARGS__)
#define CT_PP_LIST_1(f, p) f p
#define CT_PP_LIST_2(f, p, ...) f p, CT_PP_LIST_1(f, __VA_ARGS__)
#define CT_PP_LIST_3(f, p, ...) f p, CT_PP_LIST_2(f, __VA_ARGS__)
#define CT_PP_LIST_4(f, p, ...) f p, CT_PP_LIST_3(f, __VA_ARGS__)
#define CT_PP_LIST_5(f, p, ...) f p, CT_PP_LIST_4(f, __VA_ARGS__)
#define CT_PP_LIST_6(f, p, ...) f p, CT_PP_LIST_5(f, __VA_ARGS__)
#define CT_PP_LIST_7(f, p, ...) f p, CT_PP_LIST_6(f, __VA_ARGS__)
#define CT_PP_LIST_8(f, p, ...) f p, CT_PP_LIST_7(f, __VA_ARGS__)
#define CT_PP_LIST_9(f, p, ...) f p, CT_PP_LIST_8(f, __VA_ARGS__)
#define CT_PP_LIST_10(f, p, ...) f p, CT_PP_LIST_9(f, __VA_ARGS__)
#define CT_PP_LIST_11(f, p, ...) f p, CT_PP_LIST_10(f, __VA_ARGS__)
#define CT_PP_LIST_12(f, p, ...) f p, CT_PP_LIST_11(f, __VA_ARGS__)
#define CT_PP_LIST_13(f, p, ...) f p, CT_PP_LIST_12(f, __VA_ARGS__)
#define CT_PP_LIST_14(f, p, ...) f p, CT_PP_LIST_13(f, __VA_ARGS__)
#define CT_PP_LIST_15(f, p, ...) f p, CT_PP_LIST_14(f, __VA_ARGS__)
#define CT_PP_LIST_16(f, p, ...) f p, CT_PP_LIST_15(f, __VA_ARGS__)

#define CT_PP_SEQ(f, ...) CT_PP_CAT(CT_PP_SEQ_, CT_PP_NARG(__VA_ARGS__))(f, __VA_ARGS__)
#define CT_PP_SEQ_1(f, p) f p
#define CT_PP_SEQ_2(f, p, ...) f p CT_PP_SEQ_1(f, __VA_ARGS__)
#define CT_PP_SEQ_3(f, p, ...) f p CT_PP_SEQ_2(f, __VA_ARGS__)
#define CT_PP_SEQ_4(f, p, ...) f p CT_PP_SEQ_3(f, __VA_ARGS__)
#define CT_PP_SEQ_5(f, p, ...) f p CT_PP_SEQ_4(f, __VA_ARGS__)
#define CT_PP_SEQ_6(f, p, ...) f p CT_PP_SEQ_5(f, __VA_ARGS__)
#define CT_PP_SEQ_7(f, p, ...) f p CT_PP_SEQ_6(f, __VA_ARGS__)
#define CT_PP_SEQ_8(f, p, ...) f p CT_PP_SEQ_7(f, __VA_ARGS__)
#define CT_PP_SEQ_9(f, p, ...) f p CT_PP_SEQ_8(f, __VA_ARGS__)
#define CT_PP_SEQ_10(f, p, ...) f p CT_PP_SEQ_9(f, __VA_ARGS__)
#define CT_PP_SEQ_11(f, p, ...) f p CT_PP_SEQ_10(f, __VA_ARGS__)
#define CT_PP_SEQ_12(f, p, ...) f p CT_PP_SEQ_11(f, __VA_ARGS__)
#define CT_PP_SEQ_13(f, p, ...) f p CT_PP_SEQ_12(f, __VA_ARGS__)
#define CT_PP_SEQ_14(f, p, ...) f p CT_PP_SEQ_13(f, __VA_ARGS__)
#define CT_PP_SEQ_15(f, p, ...) f p CT_PP_SEQ_14(f, __VA_ARGS__)
#define CT_PP_SEQ_16(f, p, ...) f p CT_PP_SEQ_15(f, __VA_ARGS__)
/* clang-format on */

#endif /* CT_BACKEND_OPS_H */
