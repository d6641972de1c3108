"""The seams between the library's layers, as typed protocols.

- :class:`Checkpointable`: state out, state in. Every buffer, storage, sampler and rate
  limiter implements it publicly; :mod:`replaybuffer.persist` saves and restores through
  it alone.
- :class:`Buffer`: the surface a learner and its collectors use (add, extend, sample,
  iterate, stats, length, save, clear). The local buffers
  (:class:`~replaybuffer.ReplayBuffer` and its kinds), the shared-memory buffer
  (:class:`~replaybuffer.distributed.SharedReplayBuffer`) and the Ray buffer
  (:class:`~replaybuffer.distributed.RayReplayBuffer`) all satisfy it; one
  conformance suite (``tests/test_conformance.py``) runs the same tests over each.
  A buffer that cannot do something yet refuses it with an error that says so,
  never by missing the method.
- :class:`PrioritizedBuffer`: a :class:`Buffer` whose reads can be re-weighted.
- :class:`SampleSource`: what a random dataset stream reads from
  (:class:`~replaybuffer.dataset.RandomStream`): a seeded generator per stream and a
  draw that takes it.

This module sits at the bottom of the layers: it imports nothing of the library, so
every layer may name these types.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, NamedTuple, Protocol, runtime_checkable

import numpy as np


class BufferInfo(NamedTuple):
    """What a read returns beside the items.

    Attributes:
        ids: int64 step ids of the items read, the same outer shape as the items
            (``[S]``, ``[S, T]``, ...). In uniform buffers they are TF-Agents' logical
            add ids (shared by the rows of one add; +1 along a window). Prioritized
            buffers return item ids, unique per step and row (see
            :class:`~replaybuffer.PrioritizedReplayBuffer`), to pass back to
            ``update_priorities``. In a deterministic pass they are TF-Agents' physical
            row indices (``row * max_length + slot``).
        probabilities: float32 ``[S]`` (or a scalar): the probability with which each
            sample was drawn. ``()`` in a deterministic pass.
        weights: float32 ``[S]`` importance weights from prioritized buffers (the
            largest possible weight is 1); ``None`` elsewhere.
    """

    ids: Any
    probabilities: Any
    weights: Any = None


@runtime_checkable
class Checkpointable(Protocol):
    """A part whose whole state can be taken out and put back.

    ``state_dict()`` returns a nest of Python scalars, strings and numpy arrays (no
    live objects, nothing that aliases the part's memory); ``load_state_dict(state)``
    on a part built with the same configuration makes it behave exactly as the
    original did when the state was taken (same draws from its generator, same
    bookkeeping). Large data (a storage's arrays) is streamed separately by
    :mod:`replaybuffer.persist`.
    """

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class Buffer(Protocol):
    """The buffer surface: what collectors and learners call, on any implementation.

    Leaves of ``items`` are shaped ``[batch_size, *spec.shape]`` for :meth:`add_batch`
    and ``[batch_size, T, *spec.shape]`` for :meth:`extend`; reads return
    ``(items, BufferInfo)`` with leaves ``[sample_batch_size, num_steps, *spec.shape]``
    (each outer dimension dropped when its argument is ``None``).
    """

    @property
    def data_spec(self) -> Any: ...

    @property
    def capacity(self) -> int: ...

    def __len__(self) -> int: ...

    def add_batch(self, items: Any, *, timeout: float | None = None,
                  block: bool = True) -> bool: ...

    def extend(self, items: Any, *, timeout: float | None = None,
               block: bool = True) -> bool: ...

    def get_next(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                 time_stacked: bool = True, *, timeout: float | None = None,
                 block: bool = True) -> Any: ...

    def as_dataset(self, sample_batch_size: int | None = None,
                   num_steps: int | None = None,
                   num_parallel_calls: int | None = None,
                   *args: Any, **kwargs: Any) -> Iterable[tuple[Any, BufferInfo]]: ...

    def stats(self) -> Any: ...

    def clear(self) -> None: ...

    def save(self, path: str | os.PathLike[str], keep: int = 1) -> Path: ...


@runtime_checkable
class PrioritizedBuffer(Buffer, Protocol):
    """A :class:`Buffer` whose reads carry importance weights and whose items'
    priorities the learner sets (``ids`` as a read returned them)."""

    def update_priorities(self, ids: Any, priorities: Any) -> int: ...


class SampleSource(Protocol):
    """What :class:`~replaybuffer.dataset.RandomStream` draws from.

    ``spawn_rng()`` gives each stream (and each prefetch worker) a generator seeded
    from the buffer's, so a seeded buffer's dataset yields a reproducible order.
    ``draw(...)`` is :meth:`Buffer.get_next` after its argument checks, with that
    generator (``rng``) and, for buffers that track episodes, ``within_episodes``.
    """

    def spawn_rng(self) -> np.random.Generator: ...

    def draw(self, sample_batch_size: int | None, num_steps: int | None,
             time_stacked: bool = True, rng: np.random.Generator | None = None,
             within_episodes: bool = False, timeout: float | None = None,
             block: bool = True) -> tuple[Any, BufferInfo] | None: ...
