"""SyncBatchNorm: batch normalization over the global batch, Horovod's
horovod.torch.SyncBatchNorm, on CPU tensors as well as CUDA ones (Horovod:
CUDA only, through torch's undocumented CUDA kernels).

What the ranks compute, per channel c, for inputs (N_r, C, ...) of any
size on each rank r (a rank may even have no rows):

 * forward, training (or track_running_stats=False): every rank computes
   its count n_r (rows times the other dimensions), its mean m_r and the
   sum of squared deviations from it, M2_r, and allgathers the three (one
   tensor of 2C + 1 float64 values). Each rank then combines them the same
   way (Chan's parallel variance: mean = sum n_r m_r / N, M2 = sum M2_r +
   n_r (m_r - mean)^2, var = M2 / N), which avoids the cancellation of
   E[x^2] - E[x]^2, and normalizes its rows with the global mean and
   biased variance: the output is the rows of BatchNorm over the
   concatenated batch. running_mean and running_var move as torch's
   BatchNorm moves them over that batch, with the unbiased variance
   M2 / (N - 1) (momentum=None: the cumulative average, by
   num_batches_tracked). Fewer than 2 values per channel in the whole
   batch raise a ValueError on every rank, as BatchNorm does on one.
 * backward: the input's gradient depends on the whole batch through the
   mean and the variance: the ranks allreduce (Sum) the per-channel sums of
   dy and of dy * (x - mean), 2C values, and each computes
   dx = w / sigma * (dy - sum(dy) / N - (x - mean) / sigma^2 *
   sum(dy (x - mean)) / N). The gradients of weight and bias are this
   rank's own (sum dy * xhat, sum dy), as in Horovod: the
   DistributedOptimizer reduces them with the other gradients (their sum
   over the ranks is BatchNorm's gradient over the global batch).
 * eval with track_running_stats=True: the running statistics, locally,
   no communication (as Horovod).

Statistics are computed in float32 for float16, bfloat16 and float32
inputs (float64 for float64), combined in float64, and travel through host
memory for CUDA inputs too (2C + 1 values: a device-to-host copy, which
waits for the input as the allgather would; no NCCL needed). The
collectives are named "sync_batch_norm.<C>.stats" and
"sync_batch_norm.<C>.grads": every rank must run the layers in the same
order (as for any collective), and a rank whose input needs no gradient
must agree with the others on that (a model's layers do).
"""

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from .. import _core
from .._core import Sum, global_process_set
from . import mpi_ops


def _acc_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _channels_last(x):
    """x (N, C, ...) as a (C, N * ...) matrix of the accumulation dtype."""
    c = x.size(1)
    return x.transpose(0, 1).reshape(c, -1).to(_acc_dtype(x.dtype))


def _per_channel(v, x):
    """A (C,) vector shaped to broadcast against x (N, C, ...)."""
    return v.view((1, -1) + (1,) * (x.dim() - 2))


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps,
                momentum, process_set):
        x = input.contiguous()
        c = x.size(1)
        xc = _channels_last(x)
        n = xc.size(1)
        if n > 0:
            mean = xc.mean(1)
            m2 = (xc - mean[:, None]).square().sum(1)
        else:
            mean = torch.zeros(c, dtype=xc.dtype, device=x.device)
            m2 = torch.zeros(c, dtype=xc.dtype, device=x.device)
        mine = torch.cat([torch.tensor([float(n)], dtype=torch.float64),
                          mean.to("cpu", torch.float64),
                          m2.to("cpu", torch.float64)]).unsqueeze(0)
        every = mpi_ops.allgather(mine, name="sync_batch_norm.%d.stats" % c,
                                  process_set=process_set)
        counts = every[:, 0]
        total = float(counts.sum())
        if total <= 1:
            raise ValueError("Expected more than 1 value per channel when "
                             "training, got %d in the global batch (input "
                             "size %s on this rank)"
                             % (total, list(input.shape)))
        means, m2s = every[:, 1:c + 1], every[:, c + 1:]
        gmean = (counts[:, None] * means).sum(0) / total
        gm2 = m2s.sum(0) + (counts[:, None] *
                            (means - gmean).square()).sum(0)
        var = gm2 / total
        invstd = (var + eps).rsqrt()
        if running_mean is not None and momentum:
            with torch.no_grad():
                upd_mean = gmean.to(running_mean.device, running_mean.dtype)
                upd_var = (gm2 / (total - 1)).to(running_var.device,
                                                 running_var.dtype)
                running_mean.mul_(1.0 - momentum).add_(upd_mean,
                                                       alpha=momentum)
                running_var.mul_(1.0 - momentum).add_(upd_var,
                                                      alpha=momentum)
        acc = _acc_dtype(x.dtype)
        mean_d = gmean.to(x.device, acc)
        invstd_d = invstd.to(x.device, acc)
        xhat = (x.to(acc) - _per_channel(mean_d, x)) * \
            _per_channel(invstd_d, x)
        y = xhat
        if weight is not None:
            y = y * _per_channel(weight.to(acc), x)
        if bias is not None:
            y = y + _per_channel(bias.to(acc), x)
        ctx.save_for_backward(x, weight, mean_d, invstd_d)
        ctx.total = total
        ctx.process_set = process_set
        return y.to(input.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        x, weight, mean, invstd = ctx.saved_tensors
        acc = _acc_dtype(x.dtype)
        dy = grad_output.contiguous().to(acc)
        xmu = x.to(acc) - _per_channel(mean, x)
        dims = [0] + list(range(2, x.dim()))
        sum_dy = dy.sum(dims)
        sum_dy_xmu = (dy * xmu).sum(dims)
        need_input, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_input = grad_weight = grad_bias = None
        if need_input:
            c = x.size(1)
            both = torch.cat([sum_dy, sum_dy_xmu]).to("cpu", torch.float64)
            both = mpi_ops.allreduce(both, op=Sum,
                                     name="sync_batch_norm.%d.grads" % c,
                                     process_set=ctx.process_set)
            g_dy = both[:c].to(x.device, acc) / ctx.total
            g_dy_xmu = both[c:].to(x.device, acc) / ctx.total
            scale = invstd if weight is None else invstd * weight.to(acc)
            grad_input = (dy - _per_channel(g_dy, x) - xmu *
                          _per_channel(invstd * invstd * g_dy_xmu, x)) * \
                _per_channel(scale, x)
            grad_input = grad_input.to(x.dtype)
        if weight is not None and need_weight:
            grad_weight = (sum_dy_xmu * invstd).to(weight.dtype)
        if weight is not None and need_bias:
            grad_bias = sum_dy.to(weight.dtype)
        return (grad_input, grad_weight, grad_bias, None, None, None, None,
                None)


class SyncBatchNorm(_BatchNorm):
    """Batch normalization whose statistics are those of the global batch:
    the concatenation of every rank's input (the ranks of process_set).
    In training, and whenever track_running_stats=False, the output and
    the input's gradient are those of BatchNorm over the global batch, and
    running_mean / running_var move as BatchNorm's would over it (unbiased
    variance); in eval mode with running statistics each rank normalizes
    with them, without communication.

    Arguments (horovod.torch.SyncBatchNorm's, then kolo's):
        num_features: C of inputs (N, C) or (N, C, ...)
        eps: added to the variance (1e-5)
        momentum: of the running statistics (0.1); None: cumulative average
        affine: learnable weight and bias (True)
        track_running_stats: keep running statistics (True)
        process_set (kolo): the ranks whose batches are one batch (all)
        device, dtype (kolo, as torch's BatchNorm): of the parameters

    Inputs may be on the CPU or a CUDA device (Horovod: CUDA only), and the
    ranks' batches may differ in size (a rank may have none).
    kolo/torch/sync_batch_norm.py says how the ranks compute it.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_set=global_process_set,
                 device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine,
                         track_running_stats, device=device, dtype=dtype)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got {}D input)"
                             .format(input.dim()))

    def forward(self, input):
        self._check_input_dim(input)
        if input.size(1) != self.num_features:
            raise ValueError("SyncBatchNorm(%d): the input has %d channels "
                             "(dimension 1 of %s)" % (self.num_features,
                                                      input.size(1),
                                                      list(input.shape)))
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        if not self.training and self.track_running_stats:
            return F.batch_norm(input, self.running_mean, self.running_var,
                                self.weight, self.bias, False, 0.0, self.eps)
        # batch statistics; running statistics are updated in training only
        update = self.training and self.track_running_stats
        running_mean = self.running_mean if update else None
        running_var = self.running_var if update else None
        ps = self.process_set
        if not _core.is_initialized() or not ps.included() or \
                _core.set_size(ps) == 1:
            return F.batch_norm(input, running_mean, running_var,
                                self.weight, self.bias, True, factor,
                                self.eps)
        return _SyncBatchNormFunction.apply(
            input, self.weight, self.bias, running_mean, running_var,
            self.eps, factor, ps)
