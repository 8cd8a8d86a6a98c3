"""Gradient compression for allreduce, with Horovod's interface:
compress(tensor) -> (compressed, ctx) before the allreduce and
decompress(compressed, ctx) -> tensor after it.

A compressor may also name a `wire_dtype`: float32 tensors then skip the
host-side compress/decompress and travel through kolo's own wire
compression (kolo_opts_t.wire_dtype): the fusion buffer is converted once
on its way out, reduced in that dtype (each step computed in float32 and
rounded once) and expanded on the way back, with no extra tensor on the
Python side. Other floating dtypes (float64) use compress/decompress.
"""

import torch

from .. import _lib


class Compressor:
    """The interface: no compression."""

    wire_dtype = None

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class NoneCompressor(Compressor):
    """Sends tensors as they are."""


class _CastCompressor(Compressor):
    dtype = None

    @classmethod
    def compress(cls, tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != cls.dtype:
            return tensor.to(cls.dtype), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class FP16Compressor(_CastCompressor):
    """Allreduces floating-point tensors as float16 (float32 ones through
    the runtime's wire compression)."""
    dtype = torch.float16
    wire_dtype = _lib.FLOAT16


class BF16Compressor(_CastCompressor):
    """Allreduces floating-point tensors as bfloat16 (a kolo extension)."""
    dtype = torch.bfloat16
    wire_dtype = _lib.BFLOAT16


class Compression:
    """Compression.none, Compression.fp16 (Horovod's) and Compression.bf16."""
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


def wire_for(compression, tensor):
    """The wire dtype to use for `tensor`, or None (host compression)."""
    wire = getattr(compression, "wire_dtype", None)
    if wire is not None and tensor.dtype == torch.float32:
        return wire
    return None
