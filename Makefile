# cooktrain — plain Makefile, out-of-tree build in $(BUILD).
#
#   make            build build/cooktrain and the tests
#   make run        set up, build, prepare the default corpus, train configs/tiny.yaml
#   make data       prepare both corpora: data/fortunes (BPE, tiny.yaml) and data/fortunes-bytes
#                   (byte-level, test-tiny.yaml)
#   make test       set up, build, run the whole suite (ends with the checks skipped here, each
#                   with its reason, and "tests: N passed, N failed, N skipped")
#   make test-quick the unit binaries and the smoke suites (about a minute): the first check
#   make test-long  the suites' long parts too (SAMPLE=N: N of those suites, as CI runs them)
#   make test SAN=1 the readers of outside bytes (config, data, tokenizer, checkpoints, export)
#                   built with ASan + UBSan in build-san and tested there (CI runs it)
#   make mutants    plant each bug of test/tools/mutants.txt in a scratch copy and check a test
#                   catches it (test/tools/mutants.py; CI runs it after make test)
#   make bench      scripts/bench_cpu.sh
#   make fuzz       every libFuzzer target of test/fuzz/ for FUZZ_SECONDS (300) each
#
# Knobs: SAN=1  BUILD=dir  OPT="-O3"  ARCH_FLAGS="-march=native"  CUDA=0|1  CUDA_ARCHS="80 90a"
#        TEST_JOBS=2 (single-process tests run in parallel)

# SAN=1: the suite's readers of outside bytes under ASan + UBSan, in a build folder of its own
# (build-san), without CUDA: `make test SAN=1` runs SAN_TESTS there.
ifeq ($(SAN),1)
  BUILD ?= build-san
  OPT   ?= -O1
  CUDA  := 0
  SAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
  SAN_TESTS ?= test_config test_data test_tokenizer test_units test_checkpoint cli_errors cli_hostile \
               cli_checkpoint cli_import
endif
BUILD      ?= build
OPT        ?= -O3
ARCH_FLAGS ?= -march=native
CUDA_ARCHS ?= 80 90a
TEST_JOBS  ?= 2

CC      ?= cc
CFLAGS  ?=
CFLAGS  += -std=gnu11 $(OPT) $(ARCH_FLAGS) -g -Wall -Wextra -Wno-unused-parameter -fopenmp \
           -fno-math-errno -I. -MMD -MP $(SAN_FLAGS)
LDLIBS  += -lm -lpthread

# ---- required libraries (checked, with an install hint) ----------------------------------------
PKG_REQUIRED := openblas yaml-0.1 ompi-c libisal jansson
HAVE_PKGS := $(shell pkg-config --exists $(PKG_REQUIRED) 2>/dev/null && echo yes)
ifeq ($(HAVE_PKGS),yes)
  CFLAGS += $(shell pkg-config --cflags $(PKG_REQUIRED))
  LDLIBS += $(shell pkg-config --libs $(PKG_REQUIRED))
else
  $(info make: required libraries missing (libopenblas-openmp-dev, libyaml-dev, libopenmpi-dev, libisal-dev, libjansson-dev).)
  $(info hint: run `bash scripts/setup.sh` (or `make setup`) to install them with apt-get)
endif
HAVE_CMOCKA := $(shell pkg-config --exists cmocka 2>/dev/null && echo yes)
# oneDNN (bf16 GEMMs, core/backend/cpu/gemm_onednn.c) ships no pkg-config file in Debian: look for its
# header.
HAVE_DNNL := $(if $(wildcard /usr/include/oneapi/dnnl/dnnl.h),yes)
ifneq ($(HAVE_DNNL),yes)
  $(info make: required library missing: oneDNN (libdnnl-dev; /usr/include/oneapi/dnnl/dnnl.h).)
  $(info hint: run `bash scripts/setup.sh` (or `make setup`) to install it with apt-get)
endif
LDLIBS  += -ldnnl

# ---- optional: CUDA (chosen here and nowhere else) ------------------------------------------------
NVCC := $(shell command -v nvcc 2>/dev/null)
ifeq ($(CUDA),)
  CUDA := $(if $(NVCC),1,0)
endif

CORE_SRC := $(wildcard core/*.c core/*/*.c core/*/*/*.c)
CORE_OBJ := $(CORE_SRC:%.c=$(BUILD)/%.o)
CORE_LIB := $(BUILD)/libctcore.a
PAR_SRC  := $(wildcard parallel/*.c)
PAR_OBJ  := $(PAR_SRC:%.c=$(BUILD)/%.o)
PAR_LIB  := $(BUILD)/libctpar.a
# test_*.c are single-process tests; mpi_test_*.c run under mpirun (test/cli_mpi_*.sh).
# (test_cuda_*.c link the emulated CUDA backend: cuda/cuda.mk builds them)
# Sources live in test/unit/ and test/mpi/; every binary is $(BUILD)/test/NAME.
TEST_SRC := $(filter-out test/unit/test_cuda_%.c,$(wildcard test/unit/test_*.c)) \
            $(wildcard test/mpi/mpi_test_*.c)
TEST_BIN := $(patsubst %.c,$(BUILD)/test/%,$(notdir $(TEST_SRC)))
# cmd/: the entry point and its argument parser (one set of objects for every binary); its
# rooms (the training loop, generation, the offline tools) a library the tests link too
CMD_OBJ  := $(patsubst %.c,$(BUILD)/%.o,$(wildcard cmd/*.c))
CMD_LIB_SRC := $(wildcard cmd/*/*.c)
CMD_LIB  := $(BUILD)/libctcmd.a

.PHONY: all setup run data test test-quick test-long mutants bench clean report print-ldlibs FORCE
.SECONDARY:
.DEFAULT_GOAL := all
# the CUDA backend, real (nvcc) and emulated: sets CUDA_LIB and CUDA_LDLIBS, adds its targets to all
include cuda/cuda.mk
# the libFuzzer targets (clang): adds them to all, and `make fuzz`
include test/fuzz/fuzz.mk
all: report $(BUILD)/cooktrain $(TEST_BIN)

report:
	@echo "make: required: $(PKG_REQUIRED) $(if $(HAVE_PKGS),found,NOT FOUND); cmocka $(if $(HAVE_CMOCKA),found,NOT FOUND); oneDNN $(if $(HAVE_DNNL),found,NOT FOUND (libdnnl-dev))"
	@echo "make: optional: nvcc $(if $(NVCC),found ($(NVCC)),not found); $(CUDA_REPORT)"

setup:
	@bash scripts/setup.sh

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(CORE_LIB): $(CORE_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(CMD_LIB): $(CMD_LIB_SRC:%.c=$(BUILD)/%.o)
	@rm -f $@
	ar rcs $@ $^

$(PAR_LIB): $(PAR_OBJ)
	@rm -f $@
	ar rcs $@ $^

# `cooktrain --version` names the commit: `git describe --always --dirty`, "unknown" outside a
# git checkout. The stamp file changes only when the description does, and cmd/cooktrain.o with it.
GIT_COMMIT := $(shell git describe --always --dirty 2>/dev/null || echo unknown)
$(BUILD)/cmd/cooktrain.o: CFLAGS += -DCT_GIT_COMMIT='"$(GIT_COMMIT)"'
$(BUILD)/cmd/cooktrain.o: $(BUILD)/cmd/git-commit
$(BUILD)/cmd/git-commit: FORCE
	@mkdir -p $(dir $@)
	@[ "$$(cat $@ 2>/dev/null)" = "$(GIT_COMMIT)" ] || echo "$(GIT_COMMIT)" >$@

$(BUILD)/cooktrain: $(CMD_OBJ) $(CMD_LIB) $(PAR_LIB) $(CUDA_LIB) $(CORE_LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) $(CUDA_LDLIBS)

$(BUILD)/test/%.o: test/unit/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/test/%.o: test/mpi/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/test/%: $(BUILD)/test/%.o $(CMD_LIB) $(PAR_LIB) $(CORE_LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) -lcmocka

# `make run`: set up, build, prepare the default corpus once, train the tiny model.
RUN_DATA := data/fortunes
run: setup
	@$(MAKE) --no-print-directory $(BUILD)/cooktrain
	@bash scripts/prepare_corpus.sh $(BUILD)/cooktrain $(RUN_DATA)
	$(BUILD)/cooktrain train --config configs/tiny.yaml

data: setup
	@$(MAKE) --no-print-directory $(BUILD)/cooktrain
	@bash scripts/prepare_corpus.sh $(BUILD)/cooktrain $(RUN_DATA)
	@bash scripts/prepare_corpus.sh --byte-level $(BUILD)/cooktrain data/fortunes-bytes

test: setup
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) TEST_JOBS=$(TEST_JOBS) CT_TESTS="$(SAN_TESTS)" bash test/run_tests.sh

# `make test-quick`: the unit binaries and the quick suites (test/README.md, Quick and long).
test-quick: setup
	@$(MAKE) --no-print-directory report $(BUILD)/cooktrain $(TEST_BIN) $(CUDA_TEST_BIN)
	@BUILD=$(BUILD) TEST_JOBS=$(TEST_JOBS) CT_QUICK=1 bash test/run_tests.sh

# `make test-long`: the suites with long parts, with them; SAMPLE=N runs N of those suites, drawn
# with the checked-out commit's id as the seed (CI).
test-long: setup
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) TEST_JOBS=$(TEST_JOBS) CT_LONG=1 CT_TESTS="$(if $(SAMPLE),$(shell \
	    python3 test/tools/sample_long.py $(SAMPLE)))" bash test/run_tests.sh

mutants: setup
	@$(MAKE) --no-print-directory all
	@python3 test/tools/mutants.py

bench: all
	@bash scripts/bench_cpu.sh

# The link libraries, for scripts that build a program against the libraries (bench_comm.sh).
print-ldlibs:
	@echo $(LDLIBS)

clean:
	rm -rf $(BUILD)

# -H: a build folder that is a symlink (test/cli/cli_readme.sh's scratch tree) is searched too
-include $(shell find -H $(BUILD) -name '*.d' 2>/dev/null)
