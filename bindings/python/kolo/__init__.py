"""kolo: data-parallel distributed training, in the spirit of Horovod.

This package is the NumPy API; kolo.torch mirrors horovod.torch, and
kolo.run(func, np=N) runs a function on the ranks of a new job, as
horovod.run does; kolo.elastic (run, State, ObjectState) is elastic
training.

    import numpy as np, kolo
    kolo.init()                               # every rank (run under kolorun)
    g = np.ones(4, np.float32) * kolo.rank()
    avg = kolo.allreduce(g, name="g")          # op=kolo.Average by default
    h = kolo.allreduce_async_(g, op=kolo.Sum)  # in place, returns at once
    kolo.synchronize(h)                        # blocks (the GIL is released)
    kolo.shutdown()

The runtime reads and writes the arrays' own memory; the binding keeps
every array it handed to the runtime alive until its handle is
synchronized. A failed collective raises kolo.KoloError (a RuntimeError)
with the runtime's message; a call refused at once (a bad argument, a name
already in flight) raises kolo.KoloValueError (a ValueError).
"""

from ._lib import path as library_path  # noqa: F401
from ._core import *  # noqa: F401,F403  (the API kolo.torch shares)
from ._core import __all__ as _shared_all
from ._core import barrier, join, poll, synchronize  # noqa: F401

from .run import run, RunError  # noqa: F401  (horovod.run)
from . import elastic  # noqa: F401  (kolo.elastic.run, State, ObjectState)

__version__ = "0.1.0"

__all__ = _shared_all + [
    "library_path", "barrier", "join", "poll", "synchronize", "run",
    "RunError", "elastic"
]

try:
    import numpy as _np  # noqa: F401
except ImportError:  # kolo.torch works without the NumPy API
    _np = None

if _np is not None:
    from ._numpy import *  # noqa: F401,F403  (the collectives on arrays)
    from ._numpy import __all__ as _numpy_all
    __all__ += _numpy_all
