"""Elastic training, framework-neutral: the state a training loop commits,
and the loop that recovers it when the job's membership changes (Horovod's
horovod.common.elastic; kolo.torch.elastic adds the PyTorch states).

    state = kolo.elastic.ObjectState(epoch=0, batch=0)

    @kolo.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()      # a save, then a look at the membership

    train(state)

How a job changes (kolorun --min-np/--host-discovery-script; the runtime
reads the generations kolorun publishes, see kolo.h):

 * A rank fails or vanishes: every pending and later collective of the
   survivors fails with KoloError (HorovodInternalError) of status
   KOLO_ERR_MEMBERSHIP. run() restores the state of the last commit,
   shuts kolo down and initializes it again (joining the next generation),
   runs the reset callbacks, synchronizes the state from the new rank 0 and
   calls the function again.
 * Hosts are added or removed: commit() (or check_host_updates()) raises
   HostsUpdatedInterrupt on every rank at the same point; run() re-forms the
   job without restoring (the state was just saved), and skips the
   synchronization when workers were only removed.

Make no collective call in the function before the state's first use: new
workers synchronize inside run() while the old ones do the same.
"""

import functools

from . import _core, _lib
from ._core import HostsUpdatedInterrupt, KoloError

__all__ = ["State", "ObjectState", "run", "run_fn", "HostsUpdatedInterrupt"]


class State:
    """The state of a training loop that run() keeps across membership
    changes. Subclasses define save(), restore() and sync().

    bcast_object(obj): rank 0's obj on every rank (a collective).
    get_rank(): this rank."""

    def __init__(self, bcast_object, get_rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Functions of no argument that run, in order, each time the job
        re-formed (after init, before the state's synchronization): to
        scale the learning rate with the new size(), say."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        """Called by run() once the job re-formed: reset(), then the reset
        callbacks."""
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def reset(self):
        """A hook for subclasses, run before the reset callbacks."""

    def commit(self):
        """Saves the state (what restore() goes back to), then looks at the
        job's membership: raises HostsUpdatedInterrupt, on every rank, if
        workers were added or removed. A collective: every rank commits at
        the same point of the loop."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt on every rank when the job's
        membership changed since this rank joined it (skip_sync when
        workers were only removed). Every rank looks (kolo_hosts_updated);
        rank 0's answer is broadcast, so that all decide alike: a
        collective, called by every rank at the same point."""
        mine = _core.hosts_updated()
        update = self._bcast_object(mine)
        if update < 0:
            raise KoloError("check_host_updates: rank 0 could not read the "
                            "job's membership: %s" % _lib.strerror(update),
                            update)
        if update != 0:
            raise HostsUpdatedInterrupt(skip_sync=(update == 1))

    def save(self):
        """Takes a snapshot of the state (restore() goes back to it)."""
        raise NotImplementedError()

    def restore(self):
        """Goes back to the last snapshot (after a failed collective)."""
        raise NotImplementedError()

    def sync(self):
        """Makes every rank's state rank 0's (a collective)."""
        raise NotImplementedError()


class ObjectState(State):
    """A State of plain Python attributes: ObjectState(bcast_object,
    get_rank, epoch=0, batch=0) has .epoch and .batch.

    save() records the current value of each attribute named at
    construction (a reference, not a copy; attributes added later are not
    part of the state); restore() sets them back; sync() broadcasts rank 0's
    last saved values (not its current ones) and sets them on every rank.

    bcast_object and get_rank default to kolo's (NumPy) broadcast_object
    and rank."""

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        if bcast_object is None:
            bcast_object = _numpy_broadcast_object
        if get_rank is None:
            get_rank = _core.rank
        self._saved_state = dict(kwargs)
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def _set_attrs(self):
        for name, value in self._saved_state.items():
            setattr(self, name, value)

    def save(self):
        self._saved_state = {name: getattr(self, name)
                             for name in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()


def _numpy_broadcast_object(obj):
    from . import _numpy  # needs NumPy
    return _numpy.broadcast_object(obj, 0)


def _reset_job(reset):
    """reset() (shutdown, then init), again while init fails because a newer
    generation was published while it joined one (KOLO_ERR_MEMBERSHIP). Any
    other failure, KOLO_ERR_REMOVED included (this worker is not part of the
    job any more), propagates: the process ends."""
    while True:
        try:
            reset()
            return
        except KoloError as e:
            if _lib.ERR_MEMBERSHIP is None or e.code != _lib.ERR_MEMBERSHIP:
                raise


def run_fn(func, reset):
    """Wraps func(state, *args, **kwargs) in Horovod's elastic loop:
    synchronize the state, call func; when a collective fails (KoloError,
    i.e. HorovodInternalError) restore the state; when HostsUpdatedInterrupt
    is raised keep it; then reset() (shutdown and init), state.on_reset(),
    and go round again (synchronizing unless the interrupt said skip_sync).
    Any other exception propagates."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except KoloError:
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as e:
                skip_sync = e.skip_sync
            _reset_job(reset)
            state.on_reset()
    return wrapper


def _reset():
    _core.shutdown()
    _core.init()


def run(func):
    """Horovod's hvd.elastic.run: a decorator for func(state, ...), the
    training function, which recovers from membership changes (see the
    module's docstring)."""
    return run_fn(func, _reset)
