/*
 * test_plan.c — parallel.auto_layout's choice (parallel/plan_search.h, ct_plan_choose_layout):
 * a config whose layout does not fit the world size gets the layout the planner's cost model
 * ranks fastest among those that keep tp, cp, ep, ZeRO, the schedule, recompute and the global
 * batch, on a hardware profile given here (so the answer does not depend on this machine).
 *
 * The cases are built so that the right answer is plain without the model's numbers: 12 ranks of
 * a tp 2 x pp 2 x dp 4 config of 8 layers leave pp 1 (dp 6) and pp 2 (dp 3) valid (3 and 6 do
 * not divide the layers). On links that cost nothing the pipeline's bubble is pure loss: pp 1. On
 * links a million times slower than a GPU's the data-parallel reduction of every parameter
 * dominates, and pp 2 halves the parameters a rank reduces while its sends carry a few KiB of
 * activations: pp 2. A rule that ignores the cost model (the nearest pipeline depth, the first
 * divisor) gives the same answer to both, so one of them fails.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "core/config/config.h"
#include "parallel/plan_search.h"

static const char *yaml = "model:\n  vocab_size: 123\n  vocab_pad: 128\n  seq_len: 32\n"
                          "  n_layer: 8\n  d_model: 64\n  n_head: 8\n"
                          "parallel:\n  tp: 2\n  pp: 2\n  dp: 4\n  auto_layout: true\n"
                          "train:\n  global_batch: 24\n  micro_batch: 2\n";

/* A device of `bw` bytes/s on every link, no latency, 8 to a node, memory `mem` bytes. */
static ct_hardware profile(double bw, double mem) {
    ct_hardware hw = {
        .peak_bf16 = 1e14,
        .peak_fp32 = 5e13,
        .gemm_efficiency = 0.5,
        .memory_bytes = mem,
        .memory_bandwidth = 1e12,
        .devices_per_node = 8,
        .intra_bw = bw,
        .inter_bw = bw,
    };
    snprintf(hw.name, sizeof hw.name, "test-%g", bw);
    return hw;
}

/* The config of `yaml`, refused on n ranks as the trainer finds it (the pending error is the
 * reason the choice quotes), then chosen for on hw. */
static ct_status choose(ct_config *cfg, int n, const ct_hardware *hw, const char *set) {
    ct_config_defaults(cfg);
    assert_int_equal(ct_config_load_string(cfg, yaml, "auto.yaml"), CT_OK);
    if (set) assert_int_equal(ct_config_set(cfg, set), CT_OK);
    ct_config c = *cfg;
    assert_int_equal(ct_config_validate(&c, n), CT_ERR_INPUT);
    return ct_plan_choose_layout(cfg, n, hw);
}

/* The chosen layout keeps what it must, fills n ranks and the global batch exactly, and the
 * log line says so. */
static void check_kept(const ct_config *cfg, int n) {
    assert_int_equal(cfg->parallel.tp, 2);
    assert_int_equal(cfg->parallel.tp * cfg->parallel.pp * cfg->derived.dp, n);
    assert_int_equal(cfg->train.global_batch, 24);
    assert_int_equal(cfg->train.micro_batch * cfg->derived.grad_accum * cfg->derived.dp, 24);
    assert_non_null(
        strstr(cfg->derived.layout_chosen,
               "parallel.auto_layout: tp 2 x pp 2 x dp 4 does not fit 12 ranks; chose "));
    assert_non_null(strstr(cfg->derived.layout_chosen, "by the planner's estimate on test-"));
    /* the config is valid as chosen: validating it again changes nothing that matters */
    ct_config again = *cfg;
    assert_int_equal(ct_config_validate(&again, n), CT_OK);
    assert_int_equal(again.derived.dp, cfg->derived.dp);
}

static void free_links_no_pipeline(void **state) {
    (void)state;
    ct_config cfg;
    const ct_hardware hw = profile(1e18, 1e12);
    assert_int_equal(choose(&cfg, 12, &hw, NULL), CT_OK);
    check_kept(&cfg, 12);
    assert_int_equal(cfg.parallel.pp, 1);
    assert_int_equal(cfg.derived.dp, 6);
    assert_non_null(strstr(cfg.derived.layout_chosen, "chose tp 2 x pp 1 x dp 6"));
    assert_non_null(strstr(cfg.derived.layout_chosen, "the next, pp 2 x dp 3"));
}

static void slow_links_deeper_pipeline(void **state) {
    (void)state;
    ct_config cfg;
    const ct_hardware hw = profile(1e6, 1e12);
    assert_int_equal(choose(&cfg, 12, &hw, NULL), CT_OK);
    check_kept(&cfg, 12);
    assert_int_equal(cfg.parallel.pp, 2);
    assert_int_equal(cfg.derived.dp, 3);
    assert_non_null(strstr(cfg.derived.layout_chosen, "the next, pp 1 x dp 6"));
}

/* ZeRO, the schedule and recompute as configured, whichever layout wins */
static void kept_settings(void **state) {
    (void)state;
    ct_config cfg;
    const ct_hardware hw = profile(1e6, 1e12);
    assert_int_equal(choose(&cfg, 12, &hw, "parallel.zero_stage=2"), CT_OK);
    assert_int_equal(cfg.parallel.zero_stage, 2);
    assert_int_equal(cfg.parallel.schedule, CT_SCHEDULE_1F1B);
    assert_int_equal(cfg.train.recompute, CT_RECOMPUTE_NONE);
    assert_int_equal(choose(&cfg, 12, &hw, "train.recompute=full"), CT_OK);
    assert_int_equal(cfg.train.recompute, CT_RECOMPUTE_FULL);
}

/* 10 ranks: tp 2 leaves 5, which divides neither the 8 layers as pp nor the batch of 24 as dp */
static void none_valid(void **state) {
    (void)state;
    ct_config cfg;
    const ct_hardware hw = profile(1e12, 1e12);
    assert_int_equal(choose(&cfg, 10, &hw, NULL), CT_ERR_INPUT);
    assert_non_null(strstr(ct_error_message(), "parallel.auto_layout: no layout keeping tp=2"));
    /* with the configured layout's own refusal */
    assert_non_null(strstr(ct_error_message(), "(tp 2 x pp 2 x dp 4: "));
    assert_non_null(strstr(ct_error_message(), "but the world size is 10"));
    assert_true(ct_error_hint()[0] != '\0');
    ct_error_clear();
}

/* valid layouts, none of which fits a device of 64 KiB */
static void none_fits(void **state) {
    (void)state;
    ct_config cfg;
    const ct_hardware hw = profile(1e12, 65536);
    assert_int_equal(choose(&cfg, 12, &hw, NULL), CT_ERR_INPUT);
    assert_non_null(strstr(ct_error_message(), "fits in 90% of a device's memory"));
    ct_error_clear();
}

int main(int argc, char **argv) {
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(free_links_no_pipeline),
        cmocka_unit_test(slow_links_deeper_pipeline),
        cmocka_unit_test(kept_settings),
        cmocka_unit_test(none_valid),
        cmocka_unit_test(none_fits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
