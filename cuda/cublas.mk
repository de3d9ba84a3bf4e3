# cuda/cublas.mk — the backend's GEMM (cuda/gemm.c) and the cuBLAS/cuBLASLt stand-ins it links
# against in the emulated build (cuda/emu/cublas_emu.cc). Included by cuda/cuda.mk after
# cuda/emu/emu.mk (it uses $(BUILD)/libctcudaemu.a from the latter); cuda.mk links the stand-ins
# into every emulated program.
#
#   $(BUILD)/libctcublasemu.a            the stand-ins (g++), linked instead of -lcublasLt -lcublas
#                                        by the emulated build, before $(BUILD)/libctcudaemu.a
#   $(BUILD)/test/test_cuda_gemm         test/unit/test_cuda_gemm.c with -DCT_CUDA_EMU: gemm.c + the
#                                        stand-ins + the emulator (cmocka; run by `make test`)
#   $(BUILD)/cuda-real/test_cuda_gemm    the same test against the real libcublasLt, libcublas and
#                                        libcudart: the link check of the real build (outside
#                                        test/, so `make test` does not run it). On a GPU it runs
#                                        the GEMM cases; without one it exits 1 at the first CUDA
#                                        call with CT_CUDA_CHECK's message.
#   make cuda-gemm-real                  builds the last one
#
# Needs the CUDA headers (and the libraries for the real link); CUDA=0 skips everything.

CUDA_HOME ?= /usr/local/cuda
CUBLAS_HAVE_HEADERS := $(wildcard $(CUDA_HOME)/include/cublasLt.h)

ifneq ($(CUDA),0)
ifneq ($(CUBLAS_HAVE_HEADERS),)

CUBLAS_EMU_CXXFLAGS := -std=c++17 -O2 -g -Wall -Wextra -I. -I$(CUDA_HOME)/include -MMD -MP
CUBLAS_EMU_OBJ := $(BUILD)/cuemu-rt/cuda/emu/cublas_emu.o
CUBLAS_EMU_LIB := $(BUILD)/libctcublasemu.a
# The host objects of the GEMM: the same for both builds, only the link line differs.
CUDA_GEMM_OBJ := $(BUILD)/cuda/gemm.o $(BUILD)/cuda/check.o

$(CUDA_GEMM_OBJ): CFLAGS += -I$(CUDA_HOME)/include

$(CUBLAS_EMU_OBJ): cuda/emu/cublas_emu.cc
	@mkdir -p $(dir $@)
	$(CXX) $(CUBLAS_EMU_CXXFLAGS) -c $< -o $@

$(CUBLAS_EMU_LIB): $(CUBLAS_EMU_OBJ)
	@rm -f $@
	ar rcs $@ $^

# Emulated. An explicit rule: it takes precedence over cuda.mk's $(BUILD)/test/test_cuda_% pattern,
# and links only what a GEMM needs (no kernels).
$(BUILD)/test/test_cuda_gemm.o: CFLAGS += -I$(CUDA_HOME)/include -DCT_CUDA_EMU
$(BUILD)/test/test_cuda_gemm: $(BUILD)/test/test_cuda_gemm.o $(CUDA_GEMM_OBJ) $(CUBLAS_EMU_LIB) \
                              $(BUILD)/libctcudaemu.a $(CORE_LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) -lcmocka -lstdc++

# Real (where the libraries are installed).
CUBLAS_HAVE_LIBS := $(wildcard $(CUDA_HOME)/lib64/libcublasLt.so)
ifneq ($(CUBLAS_HAVE_LIBS),)
$(BUILD)/cuda-real/test_cuda_gemm.o: test/unit/test_cuda_gemm.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I$(CUDA_HOME)/include -c $< -o $@

$(BUILD)/cuda-real/test_cuda_gemm: $(BUILD)/cuda-real/test_cuda_gemm.o $(CUDA_GEMM_OBJ) $(CORE_LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) -lcmocka -L$(CUDA_HOME)/lib64 \
	    -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart

.PHONY: cuda-gemm-real
cuda-gemm-real: $(BUILD)/cuda-real/test_cuda_gemm

all: $(BUILD)/cuda-real/test_cuda_gemm
endif

all: $(BUILD)/test/test_cuda_gemm

endif
endif
