"""A stand-in for the few parts of PyTorch scripts/gemm_peer.py calls, so that test/cli/cli_gemm_peer.sh
runs its timing code without PyTorch or a GPU. Tensors are shapes, dtypes and strides only; a
product checks its operands as cuBLAS would see them (inner sizes, types) and advances a clock by
a figure that encodes the call: 1e-6 ms per M·N·K, plus 0.1 ms when A is a transposed view and 0.2
when B is, 0.4 for an fp32 output of bf16 operands and 0.8 for a bias or an accumulation, so the
test can tell from the milliseconds what ran. FAKE_TORCH_NO_OUT_DTYPE=1: out_dtype raises
TypeError, as in a PyTorch without it.
"""
import os

__version__ = "0.0-fake"


class version:
    cuda = "fake"


bfloat16, float32 = "bfloat16", "float32"
_clock = [0.0]


class _Flags:
    allow_tf32 = True


class backends:
    class cuda:
        matmul = _Flags()

    cudnn = _Flags()


class Tensor:
    def __init__(self, shape, dtype, transposed=False):
        self.shape, self.dtype, self.transposed = tuple(shape), dtype, transposed

    def t(self):
        assert len(self.shape) == 2
        return Tensor(self.shape[::-1], self.dtype, not self.transposed)

    def to(self, dtype):
        return Tensor(self.shape, dtype, self.transposed)

    def addmm_(self, a, b):
        out = _product(a, b, None, self, accumulate=True)
        assert out.dtype == self.dtype, "addmm_ into %s from %s" % (self.dtype, out.dtype)
        return self


def randn(*shape, device=None, dtype=float32):
    assert device == "cuda"
    return Tensor(shape, dtype)


def _product(a, b, out_dtype, c, accumulate):
    (M, K), (K2, N) = a.shape, b.shape
    assert K == K2, "inner sizes %d and %d" % (K, K2)
    assert a.dtype == b.dtype, "operand types %s and %s" % (a.dtype, b.dtype)
    if out_dtype is not None:
        if os.environ.get("FAKE_TORCH_NO_OUT_DTYPE") == "1":
            raise TypeError("mm() got an unexpected keyword argument 'out_dtype'")
        assert out_dtype == float32 and a.dtype == bfloat16
    dtype = out_dtype or a.dtype
    if c is not None:
        assert c.dtype == dtype, "C %s, product %s" % (c.dtype, dtype)
        assert c.shape in ((M, N), (N,)), "C %s for a %dx%d product" % (c.shape, M, N)
    _clock[0] += (1e-6 * M * N * K + 0.1 * a.transposed + 0.2 * b.transposed +
                  0.4 * (dtype != a.dtype) + 0.8 * (c is not None))
    return Tensor((M, N), dtype)


def mm(a, b, out_dtype=None):
    return _product(a, b, out_dtype, None, False)


def addmm(c, a, b, out_dtype=None):
    return _product(a, b, out_dtype, c, True)


class cuda:
    @staticmethod
    def is_available():
        return True

    @staticmethod
    def synchronize():
        pass

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.at = None

        def record(self):
            self.at = _clock[0]

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return end.at - self.at
