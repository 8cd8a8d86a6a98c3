"""Memory in flight: what keeps the memory of the tensors an operation
handed to the runtime alive and unmoved until its handle is synchronized,
and what copies a result back into a tensor that was given other memory
meanwhile.

From enqueue to completion the runtime reads and writes the tensors'
memory by address. Meanwhile a program may give a tensor other memory:
t.set_(...), t.data = ..., t.resize_(...) to more elements. What keeps
that from freeing the memory under the runtime (a crash, or another
tensor's data overwritten):

 * Each operation holds a detached alias of every tensor it hands over
   (_Held): the alias holds the tensor's storage, so set_() and .data =
   cannot free it. The result goes to that memory; at synchronize an
   in-place operation copies it into the tensor when the tensor has new
   memory but the shape, dtype and device it was enqueued with, and
   raises a RuntimeError naming the tensor when it has not (Horovod, which
   also holds the tensor, writes into whatever memory it has when the
   operation runs, and says nothing).
 * Growing a storage reallocates it in place: its memory is freed,
   whoever holds the storage. So Tensor.resize_ and Tensor.resize_as_
   refuse, with a RuntimeError naming the operation, to grow a storage
   that an operation in flight uses; resizing within the storage, and any
   resize once the handle is synchronized, work as always. Growth that
   bypasses these two methods (Tensor.storage().resize_(), an out=
   argument of another size) is not seen; synchronize then says that the
   memory moved under the operation, and raises.

The fast path of an in-place allreduce (_fast_allreduce.py) holds its
tensor in an _InPlace, defined here so that the resize guard finds it.
"""

import functools
import threading

import torch

from .. import _core
from ._tensors import _describe


def _copy_back(pairs):
    with torch.no_grad():
        for dst, src in pairs:
            if dst is not src:
                dst.copy_(src)
                if src.is_cuda:
                    # src (a contiguous copy made at enqueue, maybe on
                    # another stream) is freed after this: the caching
                    # allocator must not reuse it before the copy has read it
                    src.record_stream(torch.cuda.current_stream(src.device))


_in_flight = {}  # storage address -> [operations using it, the first's name]
_in_flight_lock = threading.Lock()


def _storage_address(t):
    return t.data_ptr() - t.storage_offset() * t.element_size()


class _Held:
    """The memory of the tensors an operation hands to the runtime, held
    until its handle is synchronized (release)."""

    __slots__ = ("what", "aliases", "addresses", "storages")

    def __init__(self, what, tensors):
        self.what = what
        self.aliases = [t.detach() for t in tensors]
        self.addresses = [a.data_ptr() for a in self.aliases]
        # (no memory, nothing to guard: empty tensors all sit at 0)
        self.storages = [_storage_address(a) for a in self.aliases
                         if a.data_ptr()]
        with _in_flight_lock:
            for s in self.storages:
                entry = _in_flight.setdefault(s, [0, what])
                entry[0] += 1

    def release(self):
        with _in_flight_lock:
            for s in self.storages:
                entry = _in_flight.get(s)
                if entry is not None:
                    entry[0] -= 1
                    if entry[0] <= 0:
                        del _in_flight[s]
        self.storages = []
        self.aliases = []

    def check(self):
        """Raises if the memory of a held tensor was reallocated while the
        operation was in flight (by a path the resize guard does not see):
        the runtime then used memory that had been freed."""
        for a, address in zip(self.aliases, self.addresses):
            if a.data_ptr() != address:
                raise RuntimeError(
                    "%s: the memory of a tensor handed to it was reallocated "
                    "while it was in flight (Tensor.storage().resize_(), or "
                    "an out= argument of another size): the operation used "
                    "memory that had been freed, and its result is lost. "
                    "Synchronize the handle before resizing the tensor"
                    % self.what)


def _held(what, tensors, enqueue, results=False):
    """Holds the tensors' memory (_Held), then enqueues: enqueue(handles)
    appends the kolo handles to the list it is given. If enqueuing fails
    half-way, what was enqueued keeps the memory until it completes.
    Returns (held, handles)."""
    held = _Held(what, tensors)
    done = []
    try:
        enqueue(done)
    except Exception:
        if done:
            _core.register(done, held, None, results=results, what=what,
                           release=held.release)
        else:
            held.release()
        raise
    return held, done


def _write_back(what, items):
    """After an in-place operation: items are (tensor, result, (shape,
    dtype, device) of the tensor at enqueue), result being the held alias of
    what the runtime wrote (the tensor's own memory, or a contiguous copy of
    it). Copies the result into the tensor where it is not already there."""
    pairs = []
    for t, res, (shape, dtype, device) in items:
        if t.data_ptr() == res.data_ptr():
            continue  # in place, in the memory the tensor still has
        if tuple(t.shape) != shape or t.dtype != dtype or t.device != device:
            raise RuntimeError(
                "%s: the tensor was given other memory while the operation "
                "was in flight (set_() or .data =), and is now %s, "
                "not %s: the result, written to the memory it had, cannot be "
                "copied into it. Synchronize the handle before changing the "
                "tensor" % (what, _describe(t), "%s %s on %s" % (
                    list(shape), str(dtype).replace("torch.", ""), device)))
        pairs.append((t, res))
    _copy_back(pairs)


def _resize_numel(args, kwargs):
    """The number of elements Tensor.resize_(*args, **kwargs) asks for, or
    None where the arguments are not sizes (torch will say so)."""
    sizes = args
    if len(args) == 1 and not isinstance(args[0], int):
        sizes = args[0]
    elif not args:
        sizes = kwargs.get("size", kwargs.get("sizes"))
    try:
        n = 1
        for d in sizes:
            n *= int(d)
        return n
    except (TypeError, ValueError):
        return None


def _resize_as_numel(args, kwargs):
    other = args[0] if args else kwargs.get("the_template",
                                            kwargs.get("other"))
    return other.numel() if isinstance(other, torch.Tensor) else None


def _storage_nbytes(t):
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage().nbytes()
    return t.storage().nbytes()


def _in_flight_user(storage):
    """The name of an operation in flight that uses the storage at address
    `storage`, or None. The general path counts its storages in _in_flight;
    the fast path's operations (_InPlace) are found among the pending
    handles, so that enqueuing one costs no table update (this runs only
    when a storage is about to grow)."""
    with _in_flight_lock:
        entry = _in_flight.get(storage)
    if entry is not None:
        return entry[1]
    for p in list(_core._pending.values()):
        if type(p) is _InPlace:
            a = p.alias
            if a is not None and a.data_ptr() and \
                    _storage_address(a) == storage:
                return p.key
    return None


def _guard_resize(method, numel_of):
    """Wraps torch.Tensor.<method> to refuse growing a storage in flight."""
    orig = getattr(torch.Tensor, method)
    if getattr(orig, "_kolo_guarded", False):
        return

    @functools.wraps(orig)
    def guarded(self, *args, **kwargs):
        if _in_flight or _core._pending:
            n = numel_of(args, kwargs)
            if n is not None and (self.storage_offset() + n) * \
                    self.element_size() > _storage_nbytes(self):
                user = _in_flight_user(_storage_address(self))
                if user is not None:
                    raise RuntimeError(
                        "%s(): the tensor's memory is in use by kolo's %s, "
                        "in flight, and growing it to %d elements would "
                        "free that memory under the operation: synchronize "
                        "the handle first" % (method, user, n))
        return orig(self, *args, **kwargs)
    guarded._kolo_guarded = True
    setattr(torch.Tensor, method, guarded)


_guard_resize("resize_", _resize_numel)
_guard_resize("resize_as_", _resize_as_numel)


class _InPlace:
    """An in-place allreduce of a host tensor in flight: holds an alias of
    the tensor (its memory), and is both the finish and the release of its
    _core handle."""

    # (handles, keep, results, what, finish and release: what _core's
    # pending table reads of an entry; this object is its own entry)
    __slots__ = ("key", "tensor", "alias", "address", "spec", "handles",
                 "keep", "stream")
    results = False

    def finish(self, _results):
        t, a = self.tensor, self.alias
        if a.data_ptr() != self.address:
            _Held.check(self)  # raises, naming the operation
        if t.data_ptr() != self.address:
            _write_back(self.key, [(t, a, self.spec)])
        return t

    # _Held.check reads these
    @property
    def what(self):
        return self.key

    @property
    def aliases(self):
        return [self.alias]

    @property
    def addresses(self):
        return [self.address]

    def release(self):
        # (no _in_flight count to undo: _in_flight_user finds this object
        # among the pending handles while it holds the alias)
        self.alias = None
