"""The sampler protocol: which (id, row) pairs to read next.

A sampler never touches data. Given the ring it returns
``(SampleIndices(start_ids, start_positions), info)`` where ``info`` maps names to arrays
of shape ``[sample_batch_size]`` (at least ``"probabilities"``). Each sampler
owns a seeded ``numpy.random.Generator`` whose state is in its state dict, so
a restored sampler draws exactly what the original would have.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import numpy as np

from replaybuffer.protocols import Checkpointable
from replaybuffer.sampling.episodes import EpisodeIndex
from replaybuffer.sampling.ring import Ring


class SampleIndices(NamedTuple):
    """Where sampled windows start, as logical ids and as storage positions.

    Attributes:
        start_ids: int64 ``[S]``, the logical id of each window's first step.
        start_positions: int64 ``[S]``, its storage position
            (``ring.positions(start_ids, rows)``); the row is ``position % batch_size``.
    """

    start_ids: np.ndarray
    start_positions: np.ndarray


class Sampler(Checkpointable, Protocol):
    """Which windows a read takes: index arithmetic over the ring, never data, and
    :class:`~replaybuffer.protocols.Checkpointable` (a restored sampler draws exactly
    what the original would have)."""

    def sample(self, ring: Ring, sample_batch_size: int, num_steps: int,
               rng: np.random.Generator | None = None,
               episodes: EpisodeIndex | None = None
               ) -> tuple[SampleIndices, dict[str, np.ndarray]]:
        """Draw ``sample_batch_size`` windows of ``num_steps`` valid steps.

        ``rng`` overrides the sampler's own generator (datasets use one per element
        for a reproducible order with parallel workers). The caller has checked that
        rows hold ``num_steps`` steps. With ``episodes``, only windows within one
        episode are valid (samplers that cannot do that raise ``ValueError``).
        """

    def spawn_rng(self) -> np.random.Generator:
        """A new generator seeded from this sampler's, advancing its state."""

    def on_add(self, ring: Ring, first_id: int, num_steps: int) -> None:
        """Steps ``first_id .. first_id + num_steps - 1`` were just written."""

    def on_clear(self, ring: Ring) -> None:
        """The buffer is about to be emptied (``ring`` still shows what it held)."""

    def state_dict(self) -> dict[str, Any]:
        """The sampler's whole state: numpy arrays and Python scalars, no aliases."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output into a sampler built alike."""


def make_rng(seed: int | np.random.SeedSequence | None) -> np.random.Generator:
    """A PCG64 generator; ``None`` draws fresh entropy."""
    return np.random.Generator(np.random.PCG64(seed))


def check_seed(seed: Any, name: str = "seed") -> int:
    """``seed`` as an int in ``[0, 2**64)`` (what numpy's and torch's generators both
    take).

    Raises:
        TypeError: ``seed`` is not an int (a bool counts as not one).
        ValueError: it is negative or ``>= 2**64``.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"{name}: expected an int in [0, 2**64), got {type(seed).__name__} "
                        f"{seed!r}")
    if not 0 <= int(seed) < 2**64:
        raise ValueError(f"{name}: expected an int in [0, 2**64), got {int(seed)}")
    return int(seed)


def reseeded_state(state: dict[str, Any], seed: int) -> dict[str, Any]:
    """A sampler's :meth:`~Sampler.state_dict` with its host generator (``"rng"``) put
    in the state a sampler built with ``seed=seed`` starts in; everything else (trees,
    priorities, an epoch's order) as it was. A device generator (``"device_rng"``) is
    left to the caller, who knows the device.

    Every sampler's generator is :func:`make_rng`'s PCG64, whose state is ``"rng"``;
    samplers without one (FIFO) are returned unchanged.
    """
    out = dict(state)
    if "rng" in out:
        out["rng"] = make_rng(check_seed(seed)).bit_generator.state
    return out
