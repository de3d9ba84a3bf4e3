# cuda/cuda.mk — the CUDA backend's two builds (included by the Makefile; cuda/README.md).
#
#   real      the .cu files by nvcc for CUDA_ARCHS (sm_80 and sm_90a by default: Hopper with its
#             arch-specific instructions, wgmma, which run on every sm_90 GPU) with ptxas's
#             resource report kept beside each object ($(BUILD)/cuda/*.o.ptxas) and its spill,
#             local-memory and front-end warnings as errors; the whole backend linked with cudart
#             cuBLAS(Lt) and NCCL into $(BUILD)/libcooktrain-cuda.so, which $(BUILD)/cooktrain opens
#             only when a run asks for CUDA (cuda/plugin.c says why). Needs nvcc.
#   emulated  the same .cu files by g++ against cuda/emu/ (each CUDA thread a fiber), linked with
#             the stand-ins of cudart, cuBLAS(Lt) and NCCL: $(BUILD)/cooktrain-cuemu and the
#             CUDA op tests ($(BUILD)/test/test_cuda_*). Needs only the CUDA headers, no GPU.
#
# CUDA=0 skips both. The host C files (cuda/*.c but the plugin loader) are compiled once, as
# position-independent code, and linked into both builds: the host code is identical, only the
# link line differs. Sets CUDA_LIB and CUDA_LDLIBS for the cooktrain link and CUDA_REPORT for
# `make report`.

CUDA_HOME    ?= $(if $(NVCC),$(patsubst %/bin/,%,$(dir $(realpath $(NVCC)))),/usr/local/cuda)
CUDA_HEADERS := $(wildcard $(CUDA_HOME)/include/cuda_runtime.h)
CUDA_KERNELS := $(wildcard cuda/*.cu)
CUDA_HOST    := $(filter-out cuda/plugin.c,$(wildcard cuda/*.c))
CUDA_HOST_OBJ := $(CUDA_HOST:%.c=$(BUILD)/%.o)
CUDA_LIB     :=
CUDA_LDLIBS  :=
CUDA_REPORT  := CUDA backend: not built (CUDA=0)

ifneq ($(CUDA),0)
ifeq ($(CUDA_HEADERS),)
CUDA_REPORT := CUDA backend: not built (no $(CUDA_HOME)/include/cuda_runtime.h)
else

$(CUDA_HOST_OBJ) $(BUILD)/cmd/cooktrain.o: CFLAGS += -I$(CUDA_HOME)/include
$(CUDA_HOST_OBJ): CFLAGS += -fPIC

# ---- real: nvcc ----------------------------------------------------------------------------------
ifneq ($(NVCC),)
NVCC_GENCODE := $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a))
NVCCFLAGS ?= -O3
NVCCFLAGS += -std=c++17 -I. $(NVCC_GENCODE) -Xcompiler -fPIC -Werror all-warnings \
             -Xptxas -v,-warn-spills,-warn-lmem-usage,-Werror -MMD -MP
CUDA_KERNEL_OBJ := $(CUDA_KERNELS:%.cu=$(BUILD)/%.o)
CUDA_PLUGIN := $(BUILD)/libcooktrain-cuda.so
# cooktrain links the loader and exports its symbols, which the plugin calls back into
CUDA_LIB := $(BUILD)/cuda/plugin.o
CUDA_LDLIBS := -rdynamic -ldl
CUDA_REPORT := CUDA backend: built for $(foreach a,$(CUDA_ARCHS),sm_$(a)) (nvcc; cudart, cuBLASLt, NCCL; $(notdir $(CUDA_PLUGIN))) and emulated (g++, cuda/emu)

# ptxas's resource report (-v) goes to stderr: kept beside the object, shown on failure.
$(BUILD)/cuda/%.o: cuda/%.cu
	@mkdir -p $(dir $@)
	@$(NVCC) $(NVCCFLAGS) -c $< -o $@ 2>$@.ptxas || { cat $@.ptxas; exit 1; }
	@echo "nvcc $< -> $@ ($(words $(CUDA_ARCHS)) architectures; resource usage in $@.ptxas)"

$(CUDA_PLUGIN): $(CUDA_HOST_OBJ) $(CUDA_KERNEL_OBJ)
	$(CC) -shared $^ -o $@ -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 \
	    -lcublasLt -lcublas -lnccl -lcudart -lstdc++ -lm

all: $(CUDA_PLUGIN)
else
CUDA_REPORT := CUDA backend: emulated build only (g++, cuda/emu; no nvcc for the real one)
endif

# ---- emulated: g++ ------------------------------------------------------------------------------
CUEMU_CXXFLAGS := -std=c++17 $(OPT) -g -Wall -Wextra -Wno-unused-parameter -I. \
                  -I$(CUDA_HOME)/include -MMD -MP
CUEMU_KERNEL_OBJ := $(CUDA_KERNELS:%.cu=$(BUILD)/cuemu/%.o)
CUEMU_LIB := $(BUILD)/libctcuda-emu.a
# the backend sits in an archive that cmd/ reaches only through a weak reference
CUEMU_LDLIBS := -Wl,-u,ct_cuda_register -Wl,-u,ct_comm_nccl_new $(LDLIBS) -lstdc++

$(BUILD)/cuemu/%.o: %.cu
	@mkdir -p $(dir $@)
	$(CXX) $(CUEMU_CXXFLAGS) -x c++ -c $< -o $@

# the backend (host objects + emulated kernels); the emulator and its stand-ins: cuda/emu/emu.mk
$(CUEMU_LIB): $(CUDA_HOST_OBJ) $(CUEMU_KERNEL_OBJ)
	@rm -f $@
	ar rcs $@ $^

# the emulator and the cudart stand-in; the cuBLAS(Lt) stand-ins (they call the emulator, so
# they come first on the link line) and the GEMM's own test
include cuda/emu/emu.mk
include cuda/cublas.mk
CUEMU_RUNTIME_LIB := $(BUILD)/libctcublasemu.a $(BUILD)/libctncclemu.a $(BUILD)/libctcudaemu.a

$(BUILD)/cooktrain-cuemu: $(CMD_OBJ) $(CMD_LIB) $(PAR_LIB) $(CUEMU_LIB) $(CUEMU_RUNTIME_LIB) \
                          $(CORE_LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(CUEMU_LDLIBS)

$(BUILD)/test/test_cuda_%: $(BUILD)/test/test_cuda_%.o $(CMD_LIB) $(PAR_LIB) $(CUEMU_LIB) \
                           $(CUEMU_RUNTIME_LIB) $(CORE_LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(CUEMU_LDLIBS) -lcmocka

$(BUILD)/test/test_cuda_%.o: CFLAGS += -I$(CUDA_HOME)/include

# the comm tests again, through the NCCL comm on emulated devices (test/mpi/mpi_test_comm.c says how)
$(BUILD)/test/mpi_test_comm_nccl.o: test/mpi/mpi_test_comm.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I$(CUDA_HOME)/include -DCT_TEST_NCCL -c $< -o $@

$(BUILD)/test/mpi_test_comm_nccl: $(BUILD)/test/mpi_test_comm_nccl.o $(CMD_LIB) $(PAR_LIB) $(CUEMU_LIB) \
                                  $(CUEMU_RUNTIME_LIB) $(CORE_LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(CUEMU_LDLIBS)

# ring attention again, on the CUDA backend's part ops over an NCCL cp group (test/mpi/mpi_test_cp.c)
$(BUILD)/test/mpi_test_cp_nccl.o: test/mpi/mpi_test_cp.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I$(CUDA_HOME)/include -DCT_TEST_NCCL -c $< -o $@

$(BUILD)/test/mpi_test_cp_nccl: $(BUILD)/test/mpi_test_cp_nccl.o $(CMD_LIB) $(PAR_LIB) $(CUEMU_LIB) \
                                $(CUEMU_RUNTIME_LIB) $(CORE_LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(CUEMU_LDLIBS)

CUDA_TEST_BIN := $(patsubst test/unit/%.c,$(BUILD)/test/%,$(wildcard test/unit/test_cuda_*.c)) \
                 $(BUILD)/test/mpi_test_comm_nccl $(BUILD)/test/mpi_test_cp_nccl
all: $(BUILD)/cooktrain-cuemu $(CUDA_TEST_BIN)

endif
endif
