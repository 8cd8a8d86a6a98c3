"""ElasticSampler: Horovod's sampler that repartitions what is left of an
epoch when the job's ranks change."""

import math
import random

import torch.utils.data

from ..._core import rank, size


class ElasticSampler(torch.utils.data.Sampler):
    """Partitions a dataset among the ranks, as DistributedSampler does, and
    after a reset partitions only the samples not yet processed this epoch
    among the new ranks.

    The epoch's order is the dataset's indices, shuffled with
    random.Random(seed + epoch) when shuffle (the same on every rank, as in
    Horovod). Rank r of R takes every R-th index of what remains, from the
    r-th, padded by repeating the head of the remainder so that every rank
    gets as many (the padding repeats samples, as DistributedSampler's).
    So after every rank processed k batches of b samples, the
    first k*b*R indices of the remainder are exactly the ones processed:
    record_batch counts them (processed_num, for the whole job), and a new
    partition (load_state_dict, set_epoch, reset) starts after them, for any
    number of ranks.

    Use it as Horovod's: put it in the TorchState (its sync gives every rank
    rank 0's position), call record_batch(batch_idx, batch_size) after each
    batch, before the commit, and set_epoch(epoch + 1) at the end of the
    epoch (not at its start: an epoch cut short would start over)."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self.indices = []
        self._iter_start = 0  # processed_num when self.indices was made
        self.reset()

    def set_epoch(self, epoch):
        """Starts epoch `epoch` from its beginning (a new order when
        shuffle). Call it at the end of the previous epoch."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Counts one batch of batch_size samples on every rank as processed
        (batch_idx is not used: the batches are processed in order)."""
        self.processed_num += batch_size * self.num_replicas

    def get_indices(self, batch_idx, batch_size):
        """This rank's indices of batch batch_idx (of batch_size) of the
        current iteration."""
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, len(self.indices))]

    def record_indices(self, indices):
        """Counts the given indices of this rank as processed. They must be
        the next ones this rank's iteration yields after those recorded
        (kolo records a prefix of the epoch's order, not a set: a batch
        processed out of order is refused with ValueError); every rank must
        record as many."""
        indices = list(indices)
        done = (self.processed_num - self._iter_start) // max(
            1, self.num_replicas)
        expected = self.indices[done:done + len(indices)]
        if indices != expected:
            raise ValueError(
                "record_indices: rank %d's next indices are %s, not %s: the "
                "samples must be recorded in the order the sampler yields "
                "them" % (self.rank, expected, indices))
        self.processed_num += len(indices) * self.num_replicas

    def state_dict(self):
        return dict(epoch=self.epoch, processed_num=self.processed_num)

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self):
        """Partitions what remains of the epoch among the ranks of the job
        as it is now (size(), rank())."""
        self.num_replicas = size()
        self.rank = rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = int(math.ceil(len(self.remaining_indices) /
                                         self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas
        self.indices = []
        self._iter_start = self.processed_num

    def __iter__(self):
        padded = list(self.remaining_indices)
        while len(padded) < self.total_size:  # fewer left than ranks: again
            padded += padded[:self.total_size - len(padded)]
        self.indices = padded[self.rank:self.total_size:self.num_replicas]
        self._iter_start = self.processed_num
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
