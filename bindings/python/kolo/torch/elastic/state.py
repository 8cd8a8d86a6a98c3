"""TorchState: the state of a PyTorch training loop that elastic.run
keeps (Horovod's horovod.torch.elastic.TorchState).

A value of the state whose type has a handler (a model, an optimizer, an
ElasticSampler, an LR scheduler) is saved, restored and synchronized by the
handler; every other value is a plain attribute of the ObjectState beneath.

    state = TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)

 * save (commit): a deep copy of model.state_dict(), optimizer.state_dict(),
   sampler.state_dict() and scheduler.state_dict() (so a commit costs a
   copy of the model and its optimizer state: commit every few batches).
 * A ZeroRedundancyOptimizer's state is sharded: a commit copies this
   rank's share and that of the same local rank on the next host (so the
   loss of any one host loses nothing), and after the job re-forms every
   rank lays the optimizer out for the new number of ranks and rebuilds
   its share from the copies.
 * restore: load_state_dict of those copies (a DistributedOptimizer's
   load_state_dict also forgets the allreduces in flight and the counted
   backward passes, as Horovod's).
 * sync: rank 0's *current* model (broadcast_parameters), optimizer
   (broadcast_optimizer_state), sampler and scheduler positions, then rank
   0's *last saved* plain attributes (ObjectState). Optimizers, samplers and
   schedulers are synchronized before models: broadcast_optimizer_state
   makes the state of an optimizer that has none with one step of zero
   gradients, which moves its parameters where there is weight decay; a
   worker that just joined would keep those moved parameters if the model
   came first (as in Horovod, whose order is that of the arguments).
"""

import copy

import torch

from ... import elastic as _elastic
from ..._core import rank
from ..._core import size as hvd_size
from ..functions import (broadcast_object, broadcast_optimizer_state,
                         broadcast_parameters)
from ..zero import ZeroRedundancyOptimizer
from .sampler import ElasticSampler


class StateHandler:
    """Saves, restores and synchronizes one value of a TorchState. `name`
    is the attribute's (it names the handler's broadcasts)."""

    def __init__(self, value, name):
        self.name = name
        self.value = value
        self.save()

    def _abstract(self):
        raise NotImplementedError()

    # A handler saves, restores and syncs its value: subclasses say how.
    save = restore = sync = _abstract

    def set_value(self, value):
        """The attribute was given a new value: it becomes the state (and
        its snapshot)."""
        self.value = value
        self.save()


class ModelStateHandler(StateHandler):
    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)  # copies into the tensors

    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(StateHandler):
    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        # A copy: the optimizer may keep the loaded tensors (newer torch
        # does not copy them) and update them in place; the snapshot must
        # stay what was committed.
        self.value.load_state_dict(copy.deepcopy(self._saved))

    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)


class ZeroOptimizerStateHandler(StateHandler):
    """A ZeroRedundancyOptimizer, whose state is sharded: a commit keeps a
    copy of this rank's blocks' state and of another rank's (the same
    local rank on the next host; an alltoall of one block per rank), so
    that the committed state survives the loss of any one host; after the
    job re-forms, the optimizer is laid out for the new number of ranks and
    every rank rebuilds its blocks' state from the copies the ranks hold
    (see kolo.torch.zero)."""

    def __init__(self, value, name):
        if value.process_set.ranks != list(range(hvd_size())):
            raise ValueError("elastic training shards a "
                             "ZeroRedundancyOptimizer over every rank: "
                             "build it with the global process set")
        self._first = True
        super().__init__(value, name)

    def save(self):
        # The first copy is made when the state is made, maybe on one
        # worker alone (a worker added to a running job): no collective.
        self.value._kolo_snapshot(exchange=not self._first)
        self._first = False

    def restore(self):
        # The copies are the committed state; the optimizer forgets the
        # step in flight and takes its state back from them after the
        # job re-forms.
        self.value._kolo_drain()
        self.value._kolo_reset()

    def on_reset(self):
        self.value._kolo_relayout()

    def sync(self):
        self.value._kolo_rebuild_state()


class _StateDictHandler(StateHandler):
    """A value with state_dict/load_state_dict whose state is small and
    picklable: synchronized by broadcasting rank 0's state_dict."""

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(copy.deepcopy(self._saved))

    def sync(self):
        state = broadcast_object(self.value.state_dict(), 0,
                                 name="elastic.state." + self.name)
        self.value.load_state_dict(state)


class SamplerStateHandler(_StateDictHandler):
    """An ElasticSampler: its epoch and processed_num (loading them
    repartitions the rest of the epoch among the ranks of the job)."""


class LRSchedulerStateHandler(_StateDictHandler):
    """A torch.optim.lr_scheduler scheduler (its learning rates themselves
    are part of the optimizer's state)."""


_LRScheduler = getattr(torch.optim.lr_scheduler, "LRScheduler",
                       torch.optim.lr_scheduler._LRScheduler)

_handler_registry = [
    (torch.nn.Module, ModelStateHandler),
    (ZeroRedundancyOptimizer, ZeroOptimizerStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
    (_LRScheduler, LRSchedulerStateHandler),
]


def get_handler_registry():
    """The (type, handler class) pairs, tried in order."""
    return _handler_registry


def set_handler_registry(registry):
    global _handler_registry
    _handler_registry = list(registry)


def _handler_for(name, value):
    for cls, handler in _handler_registry:
        if isinstance(value, cls):
            return handler(value, name)
    return None


class TorchState(_elastic.ObjectState):
    """TorchState(model=None, optimizer=None, **kwargs): see the module's
    docstring. Every value is an attribute (state.model, state.epoch);
    assigning a new model, optimizer, sampler or scheduler to its attribute
    makes it the state's, and saves it."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        handlers, plain = {}, {}
        for name, value in kwargs.items():
            handler = _handler_for(name, value)
            if handler is None:
                plain[name] = value
            else:
                handlers[name] = handler
        object.__setattr__(self, "_handlers", handlers)
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rank,
                         **plain)

    def save(self):
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def reset(self):
        """After the job re-formed, before the reset callbacks: handlers
        that lay out something by the number of ranks (a
        ZeroRedundancyOptimizer) do it again."""
        for handler in self._handlers.values():
            if hasattr(handler, "on_reset"):
                handler.on_reset()
        super().reset()

    def sync(self):
        handlers = list(self._handlers.values())
        # models last (see the module's docstring); the same order on
        # every rank
        for handler in handlers:
            if not isinstance(handler, ModelStateHandler):
                handler.sync()
        for handler in handlers:
            if isinstance(handler, ModelStateHandler):
                handler.sync()
        super().sync()

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].set_value(value)
        object.__setattr__(self, name, value)
