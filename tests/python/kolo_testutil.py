"""Helpers shared by the Python tests: every rank can compute every rank's
input, so every test checks the collectives against references it computes
on its own."""

import numpy as np

import kolo


def rank_data(seed, r, shape, dtype):
    """Rank r's input for a test: deterministic, small values (so that sums
    and products stay exact in every integer type)."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng([seed, r])
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if dtype.kind == "u":
        return rng.integers(0, 4, shape).astype(dtype)
    if dtype.kind == "i":
        return rng.integers(-4, 5, shape).astype(dtype)
    return rng.uniform(-2.0, 2.0, shape).astype(dtype)


def all_data(seed, shape, dtype, n=None, ranks=None):
    ranks = range(n if n is not None else kolo.size()) if ranks is None \
        else ranks
    return [rank_data(seed, r, shape, dtype) for r in ranks]


def reference_reduce(arrays, op):
    """The reduction kolo computes, done here with NumPy."""
    dtype = arrays[0].dtype
    n = len(arrays)
    if dtype == np.bool_:
        if op in (kolo.Sum, kolo.Max):
            return np.logical_or.reduce(arrays)
        if op in (kolo.Min, kolo.Product):
            return np.logical_and.reduce(arrays)
        raise ValueError("no average of bool")
    wide = [a.astype(np.float64 if dtype.kind == "f" else np.int64)
            for a in arrays]
    if op == kolo.Sum:
        out = sum(wide)
    elif op == kolo.Average:
        s = sum(wide)
        if dtype.kind == "f":
            out = s / n
        else:  # integers truncate toward zero
            out = np.sign(s) * (np.abs(s) // n)
    elif op == kolo.Min:
        out = np.minimum.reduce(wide)
    elif op == kolo.Max:
        out = np.maximum.reduce(wide)
    elif op == kolo.Product:
        out = wide[0]
        for a in wide[1:]:
            out = out * a
    else:
        raise ValueError(op)
    return np.asarray(out).astype(dtype)


def tolerance(dtype):
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        return dict(rtol=2e-2, atol=2e-2)
    if dtype == np.float32:
        return dict(rtol=1e-5, atol=1e-5)
    if dtype == np.float64:
        return dict(rtol=1e-12, atol=1e-12)
    return dict(rtol=0, atol=0)


def split_rows(rows, n):
    """kolo's reducescatter split: rank r gets rows // n (+1 if r < rows % n)."""
    return [rows // n + (1 if r < rows % n else 0) for r in range(n)]


def check_controllers(api):
    """Which controller carries the job, as horovodrun --gloo and mpirun
    decide it: Gloo unless MPI started the job (no KOLO_RANK: kolorun did
    not) and no one asked for Gloo (KOLO_CONTROLLER, KOLO_CPU_OPERATIONS).
    `api` is kolo or kolo.torch."""
    import os
    under_mpi = "KOLO_RANK" not in os.environ
    asked = {os.environ.get("KOLO_CONTROLLER"),
             os.environ.get("KOLO_CPU_OPERATIONS")}
    assert api.gloo_built()
    assert api.gloo_enabled() == (not under_mpi or "gloo" in asked)
    assert isinstance(api.mpi_built(), bool)
    assert api.mpi_enabled() == under_mpi
