"""Dynamic loss scaling whose decisions are the same on every rank.

GradScaler has the interface of torch.cuda.amp.GradScaler (scale, unscale_,
step, update, get_scale, state_dict, load_state_dict) and works on CPU
tensors. What it adds for distributed training:

 * The decision to skip a step is global: unscale_() checks this rank's
   (allreduced) gradients for Inf/NaN, then the ranks agree with an
   allreduce MAX of the flag, so if any rank saw an overflow, every rank
   skips the update and lowers the scale the same way; the scales never
   diverge.
 * With a ZeroRedundancyOptimizer, unscale_() synchronizes it and
   checks this rank's blocks of the averaged gradients; the agreement
   below makes every rank skip or take the step together.
 * With a DistributedOptimizer, unscale_() first synchronizes it (the
   gradients are allreduced while still scaled: build the optimizer with
   compression=Compression.fp16 to allreduce the scaled gradients in
   float16), and step() applies the update without synchronizing again.
 * It reports the loss scale, the overflow frequency and the learning
   rate (stats()).

With the defaults (growth_factor 2, backoff_factor 0.5) the scale moves in
steps of one in log2: halved at every overflow, doubled after
growth_interval steps without one.

    scaler = kolo.torch.GradScaler()
    opt = hvd.DistributedOptimizer(opt, model.named_parameters(),
                                   compression=hvd.Compression.fp16)
    for x, y in data:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)                     # optional: to clip
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)                    # skipped on every rank or none
        scaler.update()
"""

import collections
import math

import torch

from .. import _core
from .._core import global_process_set
from . import mpi_ops
from .adasum import _DistributedAdasum
from .optimizer import _Distributed
from .zero import ZeroRedundancyOptimizer

_READY, _UNSCALED, _STEPPED = 0, 1, 2


class GradScaler:
    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0,
                 backoff_factor=0.5, growth_interval=2000, enabled=True,
                 min_scale=2.0 ** -24, max_scale=2.0 ** 24,
                 process_set=global_process_set, window=100):
        if growth_factor <= 1.0:
            raise ValueError("growth_factor must be > 1")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError("backoff_factor must be in (0, 1)")
        if growth_interval < 1:
            raise ValueError("growth_interval must be >= 1")
        self._enabled = bool(enabled)
        self._scale = float(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._min_scale = float(min_scale)
        self._max_scale = float(max_scale)
        self._growth_tracker = 0
        self._process_set = process_set
        self._per_opt = {}
        self._steps = 0
        self._skipped = 0
        self._recent = collections.deque(maxlen=window)
        self._last_found_inf = False

    # ---- scaling -----------------------------------------------------------

    def is_enabled(self):
        return self._enabled

    def scale(self, outputs):
        """outputs (a tensor, or lists/tuples of them) times the scale."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            return outputs * self._scale
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise ValueError("outputs must be a tensor or an iterable of tensors")

    def _state(self, optimizer):
        if isinstance(optimizer, _DistributedAdasum):
            raise ValueError(
                "GradScaler cannot unscale the gradients of a "
                "DistributedOptimizer(op=Adasum): it applies each update "
                "during the backward pass, from the gradient as it is (as in "
                "Horovod, loss scaling is not supported with Adasum)")
        return self._per_opt.setdefault(id(optimizer),
                                        {"stage": _READY, "found_inf": False})

    def _agree(self, flag):
        """True if any rank of the process set raised the flag."""
        if not _core.is_initialized() or \
                _core.set_size(self._process_set) == 1:
            return flag
        t = torch.tensor([1 if flag else 0], dtype=torch.uint8)
        mpi_ops.allreduce_(t, op=_core.Max, name="GradScaler.found_inf",
                           process_set=self._process_set)
        return bool(t.item())

    def unscale_(self, optimizer):
        """Synchronizes a DistributedOptimizer, divides the gradients by the
        scale and decides, with the other ranks, whether they overflowed."""
        if not self._enabled:
            return
        state = self._state(optimizer)
        if state["stage"] == _UNSCALED:
            raise RuntimeError("unscale_() has already been called on this "
                               "optimizer since the last update().")
        if state["stage"] == _STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        if isinstance(optimizer, (_Distributed, ZeroRedundancyOptimizer)):
            optimizer.synchronize()
        inv = 1.0 / self._scale
        finite = []
        if isinstance(optimizer, ZeroRedundancyOptimizer):
            # The averaged gradients are this rank's blocks; the agreement
            # below makes an overflow in any rank's blocks skip the step
            # on every rank.
            grads = [(None, g) for g in optimizer._kolo_block_grads()]
        else:
            grads = [(p, p.grad) for group in optimizer.param_groups
                     for p in group["params"]]
        with torch.no_grad():
            for p, g in grads:
                if g is None:
                    continue
                if g.is_sparse:
                    g = g.coalesce()
                    p.grad = g
                    vals = g._values()
                    vals.mul_(inv)
                    finite.append(torch.isfinite(vals).all())
                else:
                    g.mul_(inv)
                    finite.append(torch.isfinite(g).all())
        local_inf = bool(finite) and not bool(torch.stack(finite).all())
        if isinstance(optimizer, ZeroRedundancyOptimizer):
            # (a rank that has joined unscales and checks its blocks too)
            state["found_inf"] = optimizer._kolo_agree_inf(
                local_inf, self._agree, inv)
        else:
            state["found_inf"] = self._agree(local_inf)
        state["stage"] = _UNSCALED

    def step(self, optimizer, *args, **kwargs):
        """Unscales (if unscale_ was not called), then applies the update
        unless some rank found Inf/NaN; returns what optimizer.step returns
        (None when skipped)."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if "
                               "GradScaler is enabled.")
        state = self._state(optimizer)
        if state["stage"] == _STEPPED:
            raise RuntimeError("step() has already been called since the last "
                               "update().")
        if state["stage"] == _READY:
            self.unscale_(optimizer)
        ret = None
        if not state["found_inf"]:
            if isinstance(optimizer, (_Distributed, ZeroRedundancyOptimizer)):
                with optimizer.skip_synchronize():
                    ret = optimizer.step(*args, **kwargs)
            else:
                ret = optimizer.step(*args, **kwargs)
        elif isinstance(optimizer, ZeroRedundancyOptimizer):
            optimizer._kolo_skip_step()  # on every rank: the flag agreed
        elif isinstance(optimizer, _Distributed):
            optimizer._synchronized = False  # the skipped step consumed it
        state["stage"] = _STEPPED
        return ret

    def update(self, new_scale=None):
        """Adjusts the scale after the step: backoff on an overflow (on any
        rank), growth after growth_interval clean steps."""
        if not self._enabled:
            return
        if new_scale is not None:
            self._scale = float(new_scale)
            self._per_opt.clear()
            return
        found = any(s["found_inf"] for s in self._per_opt.values()
                    if s["stage"] != _READY)
        self._steps += 1
        self._recent.append(found)
        self._last_found_inf = found
        if found:
            self._skipped += 1
            self._scale = max(self._scale * self._backoff_factor,
                              self._min_scale)
            self._growth_tracker = 0
        else:
            self._growth_tracker += 1
            if self._growth_tracker >= self._growth_interval:
                self._scale = min(self._scale * self._growth_factor,
                                  self._max_scale)
                self._growth_tracker = 0
        self._per_opt.clear()

    # ---- reporting ---------------------------------------------------------

    def get_scale(self):
        return self._scale if self._enabled else 1.0

    @property
    def loss_scale(self):
        return self.get_scale()

    @property
    def log2_loss_scale(self):
        return math.log2(self.get_scale())

    @property
    def overflow_frequency(self):
        """Skipped steps / steps since the scaler was made."""
        return self._skipped / self._steps if self._steps else 0.0

    @property
    def recent_overflow_frequency(self):
        """The same over the last `window` steps."""
        return sum(self._recent) / len(self._recent) if self._recent else 0.0

    @property
    def skipped_steps(self):
        return self._skipped

    @property
    def last_step_skipped(self):
        return self._last_found_inf

    def stats(self, optimizer=None):
        """loss_scale, overflow frequencies, steps, skipped steps and (given
        the optimizer) the learning rate of its first parameter group."""
        out = {
            "loss_scale": self.get_scale(),
            "overflow_frequency": self.overflow_frequency,
            "recent_overflow_frequency": self.recent_overflow_frequency,
            "steps": self._steps,
            "skipped_steps": self._skipped,
        }
        if optimizer is not None and optimizer.param_groups:
            out["lr"] = optimizer.param_groups[0].get("lr")
        return out

    def get_growth_factor(self):
        return self._growth_factor

    def set_growth_factor(self, f):
        self._growth_factor = float(f)

    def get_backoff_factor(self):
        return self._backoff_factor

    def set_backoff_factor(self, f):
        self._backoff_factor = float(f)

    def get_growth_interval(self):
        return self._growth_interval

    def set_growth_interval(self, n):
        self._growth_interval = int(n)

    def state_dict(self):
        if not self._enabled:
            return {}
        return {"scale": self._scale, "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval,
                "_growth_tracker": self._growth_tracker,
                "steps": self._steps, "skipped_steps": self._skipped}

    def load_state_dict(self, state):
        if not self._enabled:
            return
        if not state:
            raise RuntimeError("The source state dict is empty, possibly "
                               "because it was saved from a disabled instance "
                               "of GradScaler.")
        self._scale = float(state["scale"])
        self._growth_factor = float(state["growth_factor"])
        self._backoff_factor = float(state["backoff_factor"])
        self._growth_interval = int(state["growth_interval"])
        self._growth_tracker = int(state["_growth_tracker"])
        self._steps = int(state.get("steps", 0))
        self._skipped = int(state.get("skipped_steps", 0))


DynamicLossScaler = GradScaler
