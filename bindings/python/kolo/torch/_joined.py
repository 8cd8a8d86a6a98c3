"""What stands in for a rank that has joined (hvd.join()).

A rank that has run out of data calls join(): from then on the runtime
contributes zeros to the other ranks' allreduces, until every rank has
joined. Zeros are not always all the others need from it. A
ZeroRedundancyOptimizer's rank owns blocks of the parameters that only it
updates and allgathers: the ranks that still train wait for that rank's
part of every step. So an object that holds such a part registers here,
and join() runs, beside the runtime's join, each registered object's
stand-in, one thread each (the others may step them in any order), until
every rank has joined.

The collectives (join() in _completion.py) and what stands in (zero.py)
both sit on this module and know nothing of each other.

A registered object provides two methods:

  _kolo_joining()          True when it has a part to play now (it trains
                           with other ranks, in a process set that is
                           still registered);
  _kolo_stand_in_all()     takes part in the steps of the ranks that
                           still train until every rank has joined (a
                           collective: each rank's objects run in the
                           same order, the order of their keys), and
                           raises where it cannot (a step half done).
"""

import threading
import weakref

_stand_ins = weakref.WeakValueDictionary()  # key -> object


def register(key, obj):
    """Registers obj, under an integer key every rank gives the same
    object, for as long as the program keeps obj alive."""
    _stand_ins[key] = obj


def join(runtime_join):
    """Joins in the runtime (runtime_join(): the others' allreduces get
    this rank's zeros) while every registered object that has a part to
    play stands in, each on a thread of its own; returns runtime_join()'s
    answer, or raises the first error of any of them once all are done."""
    active = [o for _, o in sorted(_stand_ins.items()) if o._kolo_joining()]
    if not active:
        return runtime_join()
    out, errors = {}, []

    def joined():
        try:
            out["last"] = runtime_join()
        except BaseException as e:  # noqa: B902 (re-raised below)
            errors.append(e)

    def stand_in(o):
        try:
            o._kolo_stand_in_all()
        except BaseException as e:  # noqa: B902
            errors.append(e)

    threads = [threading.Thread(target=joined, daemon=True)]
    threads += [threading.Thread(target=stand_in, args=(o,), daemon=True)
                for o in active]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out["last"]
