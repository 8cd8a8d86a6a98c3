"""The NumPy API (package `kolo`) against references computed here."""

import gc
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import kolo
from kolo_testutil import (all_data, check_controllers, rank_data,
                           reference_reduce, split_rows, tolerance)

DTYPES = [np.uint8, np.int8, np.uint16, np.int16, np.int32, np.int64,
          np.float16, np.float32, np.float64, np.bool_]
OPS = [kolo.Sum, kolo.Average, kolo.Min, kolo.Max, kolo.Product]


def test_basics(rank, size):
    assert kolo.is_initialized()
    # What the launcher said: kolorun's variables, or under mpirun
    # (run-mpi.sh) Open MPI's.
    def launcher(kolo_name, ompi_name):
        return int(os.environ.get(kolo_name) or os.environ[ompi_name])
    assert 0 <= rank < size == launcher("KOLO_SIZE", "OMPI_COMM_WORLD_SIZE")
    assert rank == launcher("KOLO_RANK", "OMPI_COMM_WORLD_RANK")
    assert kolo.local_rank() == launcher("KOLO_LOCAL_RANK",
                                         "OMPI_COMM_WORLD_LOCAL_RANK")
    assert kolo.local_size() == launcher("KOLO_LOCAL_SIZE",
                                         "OMPI_COMM_WORLD_LOCAL_SIZE")
    assert kolo.cross_rank() == 0 and kolo.cross_size() == 1
    assert kolo.is_homogeneous()
    check_controllers(kolo)
    assert kolo.global_process_set.ranks == list(range(size))
    assert kolo.global_process_set.size() == size
    assert kolo.global_process_set.rank() == rank
    kolo.init()  # a second init is harmless
    assert kolo.size() == size


def test_allreduce_every_dtype_and_op(rank, size):
    handles = []
    for d, dtype in enumerate(DTYPES):
        for op in OPS:
            if dtype == np.bool_ and op == kolo.Average:
                continue
            x = rank_data(d, rank, (3, 5), dtype)
            handles.append((dtype, op, d, x.copy(), x,
                            kolo.allreduce_async(x, op=op, name="ar.%d.%d"
                                                 % (d, op))))
    for dtype, op, d, before, x, h in handles:
        got = kolo.synchronize(h)
        want = reference_reduce(all_data(d, (3, 5), dtype), op)
        assert got.dtype == np.dtype(dtype) and got.shape == (3, 5)
        np.testing.assert_allclose(got.astype(np.float64),
                                   want.astype(np.float64),
                                   err_msg="%s %s" % (np.dtype(dtype),
                                                      kolo._core.op_name(op)),
                                   **tolerance(dtype))
        np.testing.assert_array_equal(x, before)  # input untouched


def test_allreduce_default_is_average(rank, size):
    got = kolo.allreduce(np.full(4, float(rank + 1)))
    np.testing.assert_allclose(got, np.full(4, (size + 1) / 2.0))


def test_allreduce_in_place_is_zero_copy(rank, size):
    x = rank_data(1, rank, (64,), np.float32)
    addr = x.ctypes.data
    h = kolo.allreduce_async_(x, op=kolo.Sum, name="inplace")
    out = kolo.synchronize(h)
    assert out is x and x.ctypes.data == addr
    np.testing.assert_allclose(x, reference_reduce(
        all_data(1, (64,), np.float32), kolo.Sum), rtol=1e-5)
    y = rank_data(2, rank, (8,), np.int64)
    assert kolo.allreduce_(y, op=kolo.Max, name="inplace2") is y
    np.testing.assert_array_equal(y, reference_reduce(
        all_data(2, (8,), np.int64), kolo.Max))


def test_allreduce_non_contiguous_input(rank, size):
    base = rank_data(3, rank, (6, 4), np.float64)
    view = base[:, ::2]
    assert not view.flags.c_contiguous
    got = kolo.allreduce(view, op=kolo.Sum, name="noncontig")
    want = sum(a[:, ::2] for a in all_data(3, (6, 4), np.float64))
    np.testing.assert_allclose(got, want)
    with pytest.raises(ValueError, match="C-contiguous"):
        kolo.allreduce_(view)


def test_prescale_postscale(rank, size):
    x = rank_data(4, rank, (10,), np.float64)
    got = kolo.allreduce(x, op=kolo.Sum, prescale_factor=0.5,
                         postscale_factor=3.0, name="scaled")
    want = 3.0 * sum(0.5 * a for a in all_data(4, (10,), np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    avg = kolo.allreduce(x, op=kolo.Average, postscale_factor=2.0)
    np.testing.assert_allclose(avg, 2.0 * sum(all_data(4, (10,), np.float64))
                               / size, rtol=1e-12)


@pytest.mark.parametrize("wire", ["float16", "bfloat16"])
def test_wire_compression(rank, size, wire):
    x = rank_data(5, rank, (1000,), np.float32)
    got = kolo.allreduce(x, op=kolo.Sum, wire_dtype=wire, name="wire." + wire)
    want = sum(a.astype(np.float64) for a in all_data(5, (1000,), np.float32))
    tol = 2e-2 if wire == "float16" else 8e-2
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    assert got.dtype == np.float32
    with pytest.raises(ValueError):
        kolo.allreduce(np.ones(3), wire_dtype="float16")


def test_many_async_in_flight_any_order(rank, size):
    arrays = {i: rank_data(10 + i, rank, (i + 1,), np.float32)
              for i in range(20)}
    order = list(arrays)
    if rank % 2:
        order.reverse()  # ranks enqueue in different orders
    handles = {i: kolo.allreduce_async(arrays[i], op=kolo.Sum,
                                       name="flight.%d" % i) for i in order}
    while not all(kolo.poll(h) for h in handles.values()):
        time.sleep(0.001)
    for i, h in handles.items():
        np.testing.assert_allclose(
            kolo.synchronize(h),
            reference_reduce(all_data(10 + i, (i + 1,), np.float32), kolo.Sum),
            rtol=1e-5)


def test_keeps_buffers_alive(rank, size):
    # The caller keeps no reference: the binding must.
    h1 = kolo.allreduce_async(np.full(100000, rank, np.float64), op=kolo.Sum,
                              name="alive.1")
    h2 = kolo.allreduce_async_(np.full(100000, 1.0), op=kolo.Sum,
                               name="alive.2")
    gc.collect()
    junk = [np.full(100000, -7.0) for _ in range(10)]  # reuse freed memory
    np.testing.assert_array_equal(kolo.synchronize(h1),
                                  np.full(100000, sum(range(size))))
    np.testing.assert_array_equal(kolo.synchronize(h2), np.full(100000, size))
    del junk


def test_wait_releases_the_gil(rank, size):
    """A thread blocked in synchronize() lets Python run: rank 0 waits for
    an allreduce that the other ranks enqueue 0.3 s later, and counts
    meanwhile."""
    x = np.ones(4)
    if rank == 0:
        h = kolo.allreduce_async(x, op=kolo.Sum, name="gil")
        done = threading.Event()
        result = {}

        def wait():
            result["out"] = kolo.synchronize(h)
            done.set()
        t = threading.Thread(target=wait)
        t.start()
        count = 0
        start = time.time()
        while not done.is_set() and time.time() - start < 30:
            count += 1
        t.join()
        assert count > 10000, "the main thread was starved (%d)" % count
        np.testing.assert_array_equal(result["out"], np.full(4, size))
    else:
        time.sleep(0.3)
        kolo.allreduce(x, op=kolo.Sum, name="gil")


def test_grouped_allreduce(rank, size):
    arrays = [rank_data(20 + i, rank, (i + 2, 3), np.float64)
              for i in range(4)]
    outs = kolo.grouped_allreduce(arrays, op=kolo.Sum, name="grp")
    for i, o in enumerate(outs):
        np.testing.assert_allclose(o, reference_reduce(
            all_data(20 + i, (i + 2, 3), np.float64), kolo.Sum))
    ints = [rank_data(30 + i, rank, (5,), np.int32) for i in range(3)]
    res = kolo.grouped_allreduce_(ints, op=kolo.Min)
    for i, a in enumerate(ints):
        assert res[i] is a
        np.testing.assert_array_equal(a, reference_reduce(
            all_data(30 + i, (5,), np.int32), kolo.Min))
    h = kolo.grouped_allreduce_async([np.ones(3), np.ones(2)])
    assert [o.tolist() for o in kolo.synchronize(h)] == [[1.0] * 3, [1.0] * 2]
    with pytest.raises(TypeError, match="one dtype"):
        kolo.grouped_allreduce([np.ones(2), np.ones(2, np.int32)])


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8, np.bool_])
def test_allgather(rank, size, dtype):
    x = rank_data(40, rank, (rank + 1, 2, 3), dtype)
    got = kolo.allgather(x, name="ag." + np.dtype(dtype).name)
    want = np.concatenate([rank_data(40, r, (r + 1, 2, 3), dtype)
                           for r in range(size)])
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.dtype(dtype)


def test_allgather_empty_rows_and_async(rank, size):
    x = np.arange(rank * 2, dtype=np.float64).reshape(rank, 2)  # rank 0: 0 rows
    h = kolo.allgather_async(x, name="ag.empty")
    got = kolo.synchronize(h)
    want = np.concatenate([np.arange(r * 2, dtype=np.float64).reshape(r, 2)
                           for r in range(size)])
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="dimension"):
        kolo.allgather(np.float64(1.0))


def test_grouped_allgather(rank, size):
    xs = [rank_data(41, rank, (rank + 1,), np.int32),
          rank_data(42, rank, (size - rank, 3), np.int32)]
    outs = kolo.grouped_allgather(xs, name="gag")
    want0 = np.concatenate([rank_data(41, r, (r + 1,), np.int32)
                            for r in range(size)])
    want1 = np.concatenate([rank_data(42, r, (size - r, 3), np.int32)
                            for r in range(size)])
    np.testing.assert_array_equal(outs[0], want0)
    np.testing.assert_array_equal(outs[1], want1)


def test_allgather_shape_mismatch_fails_everywhere(rank, size):
    x = np.zeros((2, 2 + (rank == size - 1)), np.float32)
    with pytest.raises(kolo.KoloError) as e:
        kolo.allgather(x, name="ag.mismatch")
    assert isinstance(e.value, RuntimeError)
    assert "ag.mismatch" in str(e.value)


@pytest.mark.parametrize("root", [0, 1, 2])
def test_broadcast(rank, size, root):
    if root >= size:
        root = size - 1
    x = rank_data(50 + root, rank, (4, 3), np.float64)
    got = kolo.broadcast(x, root, name="bc.%d" % root)
    np.testing.assert_array_equal(got, rank_data(50 + root, root, (4, 3),
                                                 np.float64))
    np.testing.assert_array_equal(x, rank_data(50 + root, rank, (4, 3),
                                               np.float64))
    y = np.full(5, rank, np.int16)
    assert kolo.broadcast_(y, root, name="bc_.%d" % root) is y
    np.testing.assert_array_equal(y, np.full(5, root, np.int16))
    h = kolo.broadcast_async_(y, 0)
    assert kolo.synchronize(h) is y and (y == root).all()


def test_broadcast_bad_root(rank, size):
    with pytest.raises(ValueError, match="root"):
        kolo.broadcast(np.ones(2), size + 3)


def test_alltoall(rank, size):
    # rank r sends j+1 rows to rank j; row values encode (sender, receiver)
    splits = [j + 1 for j in range(size)]
    x = np.concatenate([np.full((j + 1, 2), 100 * rank + j, np.int64)
                        for j in range(size)])
    out, rsplits = kolo.alltoall(x, splits=splits, name="a2a")
    assert list(rsplits) == [rank + 1] * size
    want = np.concatenate([np.full((rank + 1, 2), 100 * r + rank, np.int64)
                           for r in range(size)])
    np.testing.assert_array_equal(out, want)
    even = np.arange(size * 2, dtype=np.float32) + 10 * rank
    out = kolo.alltoall(even)  # no splits: even, returns the tensor only
    want = np.concatenate([np.arange(size * 2, dtype=np.float32)[
        2 * rank:2 * rank + 2] + 10 * r for r in range(size)])
    np.testing.assert_array_equal(out, want)


def test_alltoall_errors(rank, size):
    with pytest.raises(ValueError, match="split"):
        kolo.alltoall(np.ones((size * 2 + 1, 1)))  # does not divide
    with pytest.raises(ValueError, match="splits"):
        kolo.alltoall(np.ones((4, 1)), splits=[1] * (size + 1))
    with pytest.raises(ValueError):
        kolo.alltoall(np.ones((4, 1)), splits=[5] + [0] * (size - 1))


@pytest.mark.parametrize("op", [kolo.Sum, kolo.Average])
def test_reducescatter(rank, size, op):
    rows = 2 * size + 1  # uneven on purpose
    x = rank_data(60, rank, (rows, 3), np.float64)
    got = kolo.reducescatter(x, op=op, name="rs.%d" % op)
    full = reference_reduce(all_data(60, (rows, 3), np.float64), op)
    split = split_rows(rows, size)
    start = sum(split[:rank])
    np.testing.assert_allclose(got, full[start:start + split[rank]],
                               rtol=1e-12)
    outs = kolo.grouped_reducescatter([x, x[:size]], op=op, name="grs.%d" % op)
    np.testing.assert_allclose(outs[0], got, rtol=1e-12)
    assert outs[1].shape == (1, 3)
    with pytest.raises(ValueError, match="Sum or .*Average"):
        kolo.reducescatter(x, op=kolo.Max)


def test_reducescatter_scaling(rank, size):
    x = np.ones((size, 2))
    got = kolo.reducescatter(x, op=kolo.Sum, prescale_factor=2.0,
                             postscale_factor=0.25)
    np.testing.assert_allclose(got, np.full((1, 2), 0.5 * size))


def test_process_sets(rank, size):
    members = [0, size - 1]
    ps = kolo.add_process_set(members)
    try:
        assert ps.process_set_id > 0
        assert ps.included() == (rank in members)
        if ps.included():
            assert ps.size() == 2 and ps.rank() == members.index(rank)
            got = kolo.allreduce(np.full(3, float(rank)), op=kolo.Sum,
                                 process_set=ps, name="ps.sum")
            np.testing.assert_array_equal(got, np.full(3, float(sum(members))))
            got = kolo.allgather(np.array([rank]), process_set=ps)
            assert got.tolist() == members
            # root_rank is a global rank, as in Horovod
            b = kolo.broadcast(np.array([rank]), members[1], process_set=ps)
            assert b.tolist() == [members[1]]
            assert kolo.broadcast_object(rank, members[1], process_set=ps) \
                == members[1]
            if size > 2:  # a root outside the set is refused
                with pytest.raises(ValueError, match="root rank 1 is not a "
                                   "member of process set %d, whose ranks "
                                   "are 0, %d" % (ps.process_set_id,
                                                  size - 1)):
                    kolo.broadcast(np.array([rank]), 1, process_set=ps)
            kolo.barrier(process_set=ps)
        else:
            assert ps.rank() is None
        kolo.barrier()
    finally:
        assert kolo.remove_process_set(ps)
    assert ps.process_set_id is None
    assert not kolo.remove_process_set(ps)


def test_process_set_validation(rank, size):
    with pytest.raises(ValueError, match="twice"):
        kolo.add_process_set([0, 0])
    with pytest.raises(ValueError, match="not a rank"):
        kolo.add_process_set([0, size + 5])
    with pytest.raises(ValueError):
        kolo.remove_process_set(kolo.global_process_set)
    unregistered = kolo.ProcessSet([0])
    with pytest.raises(ValueError, match="not registered"):
        kolo.allreduce(np.ones(1), process_set=unregistered)


def test_groups_assignment(rank, size):
    groups = [[r] for r in range(size)]
    sets = kolo.add_process_sets_from_groups(groups)
    try:
        mine = [s for s in sets if s.included()]
        assert len(mine) == 1
        got = kolo.allreduce(np.array([rank + 1.0]), op=kolo.Sum,
                             process_set=mine[0], name="tpu.group")
        assert got.tolist() == [rank + 1.0]
    finally:
        for s in sets:
            kolo.remove_process_set(s)
    with pytest.raises(ValueError):
        kolo.add_process_sets_from_groups([[0]] if size > 1 else [[0, 0]])
    if size > 2:
        with pytest.raises(ValueError):  # unequal sizes
            kolo.add_process_sets_from_groups([[0], list(range(1, size))])


def test_barrier_and_join(rank, size):
    kolo.barrier()
    # The last rank keeps reducing while the others have joined.
    if rank == size - 1:
        got = kolo.allreduce(np.full(2, 3.0), op=kolo.Sum, name="join.ar")
        np.testing.assert_array_equal(got, np.full(2, 3.0))  # others give 0
        got = kolo.allreduce(np.full(2, 3.0), op=kolo.Average, name="join.av")
        np.testing.assert_allclose(got, np.full(2, 3.0 / size))
    assert kolo.join() == size - 1


def test_objects(rank, size):
    obj = kolo.broadcast_object({"rank": rank, "list": list(range(rank))},
                                root_rank=size - 1)
    assert obj == {"rank": size - 1, "list": list(range(size - 1))}
    got = kolo.allgather_object(("r", rank, "x" * rank))
    assert got == [("r", r, "x" * r) for r in range(size)]


def test_duplicate_name_raises_at_once(rank, size):
    x = np.ones(3)
    # Rank 0's "dup" stays in flight until the others enqueue it, which they
    # do only after dup.sync, which rank 0 joins after its check (a fast
    # backend, MPI, completed it before the check otherwise).
    if rank == 0:
        h = kolo.allreduce_async(x, name="dup")
        with pytest.raises(ValueError, match="already in flight") as e:
            kolo.allreduce_async(x, name="dup")
        assert e.value.code == kolo._lib.ERR_DUPLICATE_NAME
        kolo.allreduce(np.ones(1), name="dup.sync")
    else:
        kolo.allreduce(np.ones(1), name="dup.sync")
        h = kolo.allreduce_async(x, name="dup")
    kolo.synchronize(h)


def test_mismatch_fails_on_every_rank(rank, size):
    x = np.ones(3 + (rank == 0))
    with pytest.raises(RuntimeError, match="mm.count") as e:
        kolo.allreduce(x, name="mm.count")
    assert isinstance(e.value, kolo.KoloError)
    assert e.value.code == kolo._lib.ERR_MISMATCH
    y = np.ones(3, np.float32 if rank == 0 else np.float64)
    with pytest.raises(kolo.KoloError, match="mm.dtype"):
        kolo.allreduce(y, name="mm.dtype")
    op = kolo.Sum if rank == 0 else kolo.Max
    with pytest.raises(kolo.KoloError, match="mm.op"):
        kolo.allreduce(np.ones(2), op=op, name="mm.op")
    # and the job goes on
    np.testing.assert_array_equal(kolo.allreduce(np.ones(2), op=kolo.Sum),
                                  np.full(2, size))


def test_argument_errors(rank, size):
    with pytest.raises(TypeError, match="dtype"):
        kolo.allreduce(np.ones(2, np.complex64))
    with pytest.raises(TypeError, match="dtype"):
        kolo.allreduce(np.ones(2, np.uint64))
    with pytest.raises(ValueError, match="average"):
        kolo.allreduce(np.ones(2, np.bool_), op=kolo.Average)
    with pytest.raises(TypeError, match="Adasum"):
        kolo.allreduce(np.ones(2, np.int32), op=kolo.Adasum)
    with pytest.raises(ValueError, match="unknown reduction"):
        kolo.allreduce(np.ones(2), op=42)
    with pytest.raises(ValueError, match="unknown handle"):
        kolo.synchronize(123456789)
    with pytest.raises(ValueError, match="unknown handle"):
        kolo.poll(123456789)
    with pytest.raises(ValueError, match="name"):
        kolo.allreduce(np.ones(2), name="x" * 2000)
    if kolo.rank() == 0:  # the rank that writes the timeline
        with pytest.raises(ValueError, match="timeline"):
            kolo.start_timeline("/nonexistent-dir/t.json")
    with pytest.raises(ValueError, match="comm"):
        kolo.init(comm=[0])


def test_not_initialized_errors(rank, size):
    # A separate process (one rank, never initialized).
    env = {k: v for k, v in os.environ.items() if not k.startswith("KOLO_")
           or k == "KOLO_LIBRARY"}
    code = ("import kolo, numpy as np\n"
            "for f in (kolo.rank, kolo.size, lambda: kolo.allreduce(np.ones(1))):\n"
            "    try:\n"
            "        f()\n"
            "    except ValueError as e:\n"
            "        assert 'not been initialized' in str(e), e\n"
            "    else:\n"
            "        raise SystemExit('no error')\n"
            "assert not kolo.is_initialized()\n"
            "kolo.shutdown()\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr
