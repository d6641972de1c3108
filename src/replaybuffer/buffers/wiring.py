"""The wiring a replay buffer's parts share: one declaration of the attributes that
:class:`~replaybuffer.ReplayBuffer` sets in its constructor.

A buffer's concerns (the write path, the read path, datasets, episodes, rate limiting,
the file life cycle, checkpoints) each live in a module of their own, as a class that
:class:`~replaybuffer.ReplayBuffer` combines. They all work on the same composed parts
(a :class:`~replaybuffer.sampling.Ring`, a storage, a sampler, a lock, ...), which the
buffer holds as these attributes. The hot paths (``add_batch``, ``get_next``) read them
straight from the buffer: an object per concern holding its own references would add an
attribute lookup and a call to every add and sample, and would have to follow the
storage that a checkpoint's snapshot swaps for a copy-on-write view.

The names are stable: subclasses in other modules (transitions, rollouts, HER, the
TensorFlow buffer, the compatibility layers) use them.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from replaybuffer.nest import Structure
    from replaybuffer.rate_limiter import RateLimiter
    from replaybuffer.sampling import Ring, Sampler
    from replaybuffer.sampling.episodes import EpisodeIndex
    from replaybuffer.specs import ArraySpec
    from replaybuffer.storage.base import LeafChecker, Storage
    from replaybuffer.storage.exact_writer import ExactWriter
    from replaybuffer.storage.frames import FrameStackCodec


class BufferParts:
    """The attributes every part of a buffer reads (set by ``ReplayBuffer.__init__``).

    Attributes:
        _data_spec: the nest of :class:`~replaybuffer.ArraySpec` of one item.
        _specs: the flattened specs, one per leaf.
        _structure: the nest structure (flatten/unflatten items).
        _paths: one printable path per leaf (``"['obs']"``, ``".action"``), for errors.
        _fast_flatten: flattens items of the usual container types without optree, or
            ``None`` where the spec has no such shortcut.
        _ring: the ring bookkeeping (``batch_size x max_length``, the write head).
        _storage: where the steps live (positions ``slot * batch_size + row``); during
            a save, a copy-on-write view of it.
        _commit: the storage's ``commit(last_id)`` for storages on files, else ``None``.
        _sampler: which windows reads draw.
        _lock: guards every read and write of the above.
        _codec: deduplicates the stacked frames of leaf ``_codec_leaf``, or ``None``.
        _episodes: episode starts, with ``track_episodes=True``; else ``None``.
        _step_type_leaf: the index of the ``step_type`` leaf (with episodes).
        _limiter: the rate limiter, or ``None``.
        _write_exact: the storage's fused check-and-write of one step in the stored
            dtypes and shapes, or ``None`` (paused as ``_paused_writer`` during a save).
        _outer, _outer_names: the leading dimensions of one add (``(batch_size,)``) and
            how errors name them.
        _generation: bumped by ``clear()`` and restores, after which step ids name
            other data (caches keyed by step id check it).
    """

    _data_spec: Any
    _specs: tuple[ArraySpec, ...]
    _structure: Structure
    _paths: list[str]
    _fast_flatten: Callable[[Any], Sequence[Any] | None] | None
    _ring: Ring
    _storage: Storage
    _commit: Callable[[int], None] | None
    _sampler: Sampler
    _lock: threading.Lock
    _codec: FrameStackCodec | None
    _codec_leaf: int
    _frame_checker: LeafChecker
    _stack_shape: tuple[int, ...]
    _episodes: EpisodeIndex | None
    _step_type_leaf: int
    _limiter: RateLimiter | None = None
    _write_exact: ExactWriter | None
    _paused_writer: ExactWriter | None
    _outer: tuple[int, ...]
    _outer_names: str
    _generation: int

    if TYPE_CHECKING:  # defined by the buffer and by the parts that own them
        def __len__(self) -> int: ...

        @property
        def batch_size(self) -> int: ...

        @property
        def max_length(self) -> int: ...

        @property
        def capacity(self) -> int: ...

        def _admit(self, n: int, timeout: float | None, block: bool) -> bool: ...

        def _admit_sample(self, n: int, timeout: float | None, block: bool) -> bool: ...

        def _record_episodes(self, first_id: int, step_types: Any, num_steps: int
                             ) -> None: ...

        def _record_stored_episodes(self, first: int, last_id: int) -> None: ...

        def _gather(self, positions: Any) -> list[Any]: ...

        def empty_error(self, num_steps: int = 1, action: str = "sampling the buffer"
                        ) -> Any: ...

        def untracked_error(self) -> ValueError: ...
