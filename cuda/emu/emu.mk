# cuda/emu/emu.mk — the CUDA emulator (included by the Makefile; cuda/emu/README.md).
#
#   $(BUILD)/libctcudaemu.a              the scheduler (cuemu.cc), the tensor-core instructions
#                                        (mma_emu.cc) and the cudart stand-in (cudart_emu.cc),
#                                        linked instead of libcudart by the emulated build
#                                        (cuda/cuda.mk)
#   $(BUILD)/libctncclemu.a              the NCCL stand-in (nccl_emu.cc, over MPI), linked
#                                        instead of libnccl
#   $(BUILD)/test/cuemu_selftest         the emulator's own tests (test/cli/cli_cuda_emu.sh runs them)
#   $(BUILD)/test/cuemu_selftest_asan    the same under AddressSanitizer (fibers switch with
#                                        swapcontext there, which ASan can follow)
#   $(BUILD)/test/wgmma_probe_emu        test/unit/wgmma_probe.cu against the emulator
#
# Needs g++ and the CUDA headers only (no nvcc, no GPU); skipped when either is missing.

ifndef CUEMU_MK_INCLUDED # the Makefile and cuda/cuda.mk both include it
CUEMU_MK_INCLUDED := 1

CXX ?= g++
CUDA_HOME ?= /usr/local/cuda
CUEMU_HAVE_HEADERS := $(wildcard $(CUDA_HOME)/include/cuda_runtime.h)
CUEMU_HAVE_CXX := $(shell command -v $(CXX) 2>/dev/null)

ifneq ($(and $(CUEMU_HAVE_HEADERS),$(CUEMU_HAVE_CXX)),)

CUEMU_RT_CXXFLAGS := -std=c++17 -O2 -g -Wall -Wextra -I. -I$(CUDA_HOME)/include -MMD -MP
CUEMU_ASAN_CXXFLAGS := -std=c++17 -O1 -g -fno-omit-frame-pointer -fsanitize=address \
                       -Wall -Wextra -I. -I$(CUDA_HOME)/include -MMD -MP
CUEMU_RT_SRC := cuda/emu/cuemu.cc cuda/emu/cudart_emu.cc cuda/emu/mma_emu.cc
CUEMU_RUNTIME_OBJ := $(CUEMU_RT_SRC:%.cc=$(BUILD)/cuemu-rt/%.o)
CUEMU_RUNTIME_ASAN_OBJ := $(CUEMU_RT_SRC:%.cc=$(BUILD)/cuemu-asan/%.o)

$(BUILD)/cuemu-rt/%.o: %.cc
	@mkdir -p $(dir $@)
	$(CXX) $(CUEMU_RT_CXXFLAGS) -c $< -o $@

$(BUILD)/cuemu-asan/%.o: %.cc
	@mkdir -p $(dir $@)
	$(CXX) $(CUEMU_ASAN_CXXFLAGS) -c $< -o $@

$(BUILD)/libctcudaemu.a: $(CUEMU_RUNTIME_OBJ)
	@rm -f $@
	ar rcs $@ $^

# the NCCL stand-in (over MPI): linked into the emulated cooktrain and the comm tests only
$(BUILD)/cuemu-rt/cuda/emu/nccl_emu.o: CUEMU_RT_CXXFLAGS += $(shell pkg-config --cflags ompi-c)
$(BUILD)/libctncclemu.a: $(BUILD)/cuemu-rt/cuda/emu/nccl_emu.o
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/test/cuemu_selftest: $(BUILD)/cuemu-rt/test/unit/cuemu_selftest.o $(BUILD)/libctcudaemu.a
	@mkdir -p $(dir $@)
	$(CXX) $^ -o $@

$(BUILD)/test/cuemu_selftest_asan: $(BUILD)/cuemu-asan/test/unit/cuemu_selftest.o \
                                   $(CUEMU_RUNTIME_ASAN_OBJ)
	@mkdir -p $(dir $@)
	$(CXX) -fsanitize=address $^ -o $@

# the wgmma layout probe (test/unit/wgmma_probe.cu), emulated; scripts/gpu_check.sh builds it with nvcc
$(BUILD)/cuemu-rt/test/wgmma_probe.o: test/unit/wgmma_probe.cu
	@mkdir -p $(dir $@)
	$(CXX) $(CUEMU_RT_CXXFLAGS) -x c++ -c $< -o $@

$(BUILD)/test/wgmma_probe_emu: $(BUILD)/cuemu-rt/test/wgmma_probe.o $(BUILD)/libctcudaemu.a
	@mkdir -p $(dir $@)
	$(CXX) $^ -o $@

all: $(BUILD)/libctcudaemu.a $(BUILD)/libctncclemu.a $(BUILD)/test/cuemu_selftest $(BUILD)/test/cuemu_selftest_asan \
     $(BUILD)/test/wgmma_probe_emu

endif
endif
