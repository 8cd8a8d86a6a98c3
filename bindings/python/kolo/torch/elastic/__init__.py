"""kolo.torch.elastic: Horovod's horovod.torch.elastic (hvd.elastic).

    import kolo.torch as hvd
    hvd.init()
    ...
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler,
                                   epoch=0, batch=0)
    state.register_reset_callbacks([lambda: scale_lr(hvd.size())])

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch, (x, y) in enumerate(loader, state.batch): ...
                state.sampler.record_batch(state.batch, batch_size)
                state.commit()
            state.batch = 0
            state.sampler.set_epoch(state.epoch + 1)
            state.commit()

    train(state)

run, State and ObjectState are kolo.elastic's (framework-neutral; here
ObjectState broadcasts with kolo.torch.broadcast_object); TorchState and
ElasticSampler are PyTorch's. See kolo/elastic.py for the loop.
"""

from ... import elastic as _elastic
from ..._core import rank as _rank
from ..functions import broadcast_object as _broadcast_object
from ...elastic import State, run, run_fn  # noqa: F401
from .sampler import ElasticSampler  # noqa: F401
from .state import TorchState  # noqa: F401


class ObjectState(_elastic.ObjectState):
    """kolo.elastic.ObjectState whose bcast_object and get_rank default to
    kolo.torch's broadcast_object and rank."""

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        super().__init__(bcast_object or _broadcast_object,
                         get_rank or _rank, **kwargs)


__all__ = ["run", "run_fn", "State", "ObjectState", "TorchState",
           "ElasticSampler"]
