# test/fuzz/fuzz.mk — the libFuzzer targets of test/fuzz/ (README.md there), included by the
# Makefile. They need clang with its fuzzer runtime (scripts/setup.sh installs clang and
# libclang-rt-14-dev); where it is missing they are not built and test/cli/cli_fuzz.sh skips.
#
#   $(BUILD)/fuzz/fuzz_NAME   one target per parser: config, shard, tokenizer, manifest, rankfile,
#                             safetensors, hfconfig (Hugging Face's config.json)
#   make fuzz                 every target for FUZZ_SECONDS (300) each; crashes land in
#                             $(BUILD)/fuzz/crashes/ (move each into test/fuzz/regressions/NAME/)
#
# The parsers (core's files that read outside bytes) and the targets are compiled by clang with
# ASan, UBSan (every report fatal) and the fuzzer's coverage; the rest of core comes from the
# ordinary $(CORE_LIB), uninstrumented.

FUZZ_CC ?= clang
FUZZ_SECONDS ?= 300
FUZZ_RT := $(shell $(FUZZ_CC) -print-file-name=libclang_rt.fuzzer-x86_64.a 2>/dev/null)
HAVE_FUZZ := $(if $(wildcard $(FUZZ_RT)),yes)
FUZZ_NAMES := config shard tokenizer manifest rankfile safetensors hfconfig
FUZZ_BINS := $(FUZZ_NAMES:%=$(BUILD)/fuzz/fuzz_%)

ifeq ($(SAN),1)
  FUZZ_WHY := not in a SAN=1 build (the targets carry their own sanitizers): run it without SAN=1
else ifneq ($(HAVE_FUZZ),yes)
  FUZZ_WHY := no clang with a fuzzer runtime ($(FUZZ_CC)); hint: bash scripts/setup.sh
endif

ifeq ($(FUZZ_WHY),)
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_CFLAGS := -std=gnu11 -O1 -g -I. -Wall -Wextra -Wno-unused-parameter -Wno-unknown-pragmas \
               $(shell pkg-config --cflags $(PKG_REQUIRED) 2>/dev/null) $(FUZZ_SAN) -MMD -MP
FUZZ_PARSERS := $(patsubst %.c,$(BUILD)/fuzz/%.o,core/common.c $(wildcard core/config/config_*.c) \
                  core/data/data.c core/data/tokenizer.c core/io/checkpoint.c core/rng.c \
                  core/io/safetensors.c core/io/hf.c)
FUZZ_HARNESS := $(BUILD)/fuzz/test/fuzz/fuzz.o

$(BUILD)/fuzz/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(BUILD)/fuzz/test/fuzz/fuzz_rankfile.o: test/fuzz/fuzz_ckpt.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -DFUZZ_RANKFILE -c $< -o $@
$(BUILD)/fuzz/test/fuzz/fuzz_manifest.o: test/fuzz/fuzz_ckpt.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(BUILD)/fuzz/fuzz_%: $(BUILD)/fuzz/test/fuzz/fuzz_%.o $(FUZZ_HARNESS) $(FUZZ_PARSERS) $(CORE_LIB)
	$(FUZZ_CC) -fsanitize=fuzzer $(FUZZ_SAN) $^ -o $@ $(LDLIBS) -lgomp

all: $(FUZZ_BINS)

fuzz: $(FUZZ_BINS)
	@CT_FUZZ_SECONDS=$(FUZZ_SECONDS) CT_FUZZ_CRASHES=$(BUILD)/fuzz/crashes BUILD=$(BUILD) \
	    bash test/cli/cli_fuzz.sh
else
fuzz:
	@echo "make fuzz: $(FUZZ_WHY)"; exit 2
endif
.PHONY: fuzz
