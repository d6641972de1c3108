"""How the SB3 plug-in buffers take their sampling seed from the algorithm.

SB3's own buffers draw their indices from numpy's global generator, which the
algorithm's ``seed=`` and ``model.set_random_seed(seed)`` seed. Ours sample with the
core's own generator (:meth:`replaybuffer.ReplayBuffer.reseed` restarts it); left
without a seed, a plug-in buffer reseeds that generator from numpy's global one when it
is built and again after each seeding of the algorithm, so that one seed repeats a run.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class Reseedable(Protocol):
    def reseed(self, seed: int) -> None: ...


class AlgorithmSeeding:
    """Follows an algorithm's seeding for one buffer (``follows=False``: a fixed seed).

    A seeding is seen as a new generator object of ``action_space`` (the algorithm hands
    the buffer its own space, and ``set_random_seed`` calls ``action_space.seed(seed)``,
    which makes one even for the same seed). A process-wide mark such as torch's
    initial seed would also see other models' seedings.

    Args:
        action_space: the gymnasium space the algorithm gave the buffer.
        follows: whether to follow (``seed=None``) or keep the seed given.
    """

    def __init__(self, action_space: Any, follows: bool):
        self.action_space = action_space
        self.follows = follows
        self.seen = action_space.np_random

    @staticmethod
    def draw_seed() -> int:
        """A seed from numpy's global generator (which the algorithm's seeding seeds)."""
        return int(np.random.randint(2**31 - 1))

    def before_sample(self, core: Reseedable) -> None:
        """Reseed ``core`` from numpy's global generator if the algorithm was seeded since
        the last sample (and this buffer follows it)."""
        if self.follows and self.action_space.np_random is not self.seen:
            self.seen = self.action_space.np_random
            core.reseed(self.draw_seed())

    def rebase(self) -> None:
        """Take the space's generator as seen (after unpickling: the checkpoint's
        generator state continues; the unpickled space is the buffer's own copy, which no
        algorithm's seeding reaches)."""
        self.seen = self.action_space.np_random
