"""The read path: windows drawn by the sampler, gathered from storage, and shaped as
``get_next`` returns them.

:meth:`ReadPath.draw` is the one way a random read goes: under the buffer's lock the
rate limiter admits the sample, the sampler picks window starts (``ids`` and
``positions``), they are widened into windows, and the storage gathers them (frame
stacks rebuilt from their references); :func:`package` then shapes the leaves and the
:class:`~replaybuffer.BufferInfo` outside the lock.
"""

from __future__ import annotations

from typing import Any, Callable, Literal, overload

import numpy as np

from replaybuffer.arguments import check_timeout, positive_or_none
from replaybuffer.buffers.wiring import BufferParts
from replaybuffer.errors import EmptyBufferError
from replaybuffer.protocols import BufferInfo
from replaybuffer.sampling.ring import windows
from replaybuffer.storage.base import identity


class ReadPath(BufferParts):
    """``get_next`` (and ``draw``, the same after argument checks), ``gather_all``, and
    the hooks subclasses override: :meth:`_info_ids` (what ``BufferInfo.ids`` hold) and
    :meth:`_gather` (positions to leaves)."""

    def empty_error(self, num_steps: int = 1, action: str = "sampling the buffer"
                     ) -> EmptyBufferError:
        """The error for a read that needs ``num_steps`` steps per row, which rows lack."""
        name = type(self).__name__
        if num_steps > self._ring.max_length:
            return EmptyBufferError(f"num_steps={num_steps} can never be read from {name}: it "
                                    f"exceeds max_length={self._ring.max_length}")
        if self._ring.last_id < 0:
            return EmptyBufferError(f"{name} is empty. Make sure to add items before {action}.")
        # Data is held, but rows are shorter than the window: adding items is not the
        # advice; the window is too long for what the rows hold so far.
        held = self._ring.items_per_row
        return EmptyBufferError(
            f"num_steps={num_steps} is longer than a row of {name} holds: each row holds "
            f"{held} steps so far (max_length={self._ring.max_length}). Ask for "
            f"num_steps <= {held}, or read once rows hold {num_steps} steps.")

    def _sample_arrays(self, sample_batch_size: int, num_steps: int | None,
                       rng: np.random.Generator | None = None, within_episodes: bool = False,
                       timeout: float | None = None, block: bool = True
                       ) -> tuple[list[Any], np.ndarray, dict[str, np.ndarray]] | None:
        """Draw and gather under the lock: ``(leaves, ids, info)``, batched; ``None`` if
        the rate limiter held the sample back and ``block`` is false."""
        ring = self._ring
        steps = num_steps or 1
        episodes = self._episodes if within_episodes else None
        if within_episodes and episodes is None:
            raise self.untracked_error()
        if steps > ring.max_length:  # never readable: refused before the limiter waits
            raise self.empty_error(steps)
        with self._lock:
            # Admitted first (the wait lets go of the lock, and inserts may come), then
            # drawn; the limiter counts the sample only once it is gathered, so a draw
            # refused here (or failing) is never counted.
            if self._limiter is not None and not self._admit_sample(sample_batch_size,
                                                                    timeout, block):
                return None
            if ring.last_id + 1 < steps:  # no window this long yet
                raise self.empty_error(steps)
            (ids, positions), info = self._sampler.sample(ring, sample_batch_size, steps, rng,
                                                          episodes)
            info_ids = self._info_ids(ids, positions)
            if num_steps is not None:
                id_windows = windows(info_ids, num_steps, self._id_step)
                if ring.batch_size == 1 and info_ids is ids and self._id_step == 1:
                    # One row: a step's position is its id modulo the capacity, which the
                    # storage takes as it reads, so the id windows serve as positions.
                    positions = id_windows
                else:  # unwrapped: a window past the last position is wrapped by the storage
                    positions = windows(positions, num_steps, ring.batch_size)
                info_ids = id_windows
            leaves = self._gather(positions)
            if self._limiter is not None:
                self._limiter.sampled(sample_batch_size)
        return leaves, info_ids, info

    def _gather(self, positions: np.ndarray) -> list[Any]:
        """Read ``positions`` from storage, rebuilding deduplicated frame stacks."""
        leaves = self._storage.gather(positions)
        if self._codec is not None:
            i = self._codec_leaf
            leaves[i] = self._codec.decode(leaves[i], positions % self._ring.batch_size)
        return leaves

    _id_step = 1
    """How much ``BufferInfo.ids`` grow from one step of a window to the next."""

    def _info_ids(self, start_ids: np.ndarray, start_positions: np.ndarray) -> np.ndarray:
        """The ``BufferInfo.ids`` of sampled window starts (int64 ``[S]``, from the
        sampler's start ids and positions): here their logical add ids; prioritized
        buffers return item ids."""
        return start_ids

    @overload
    def get_next(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                 time_stacked: bool = True, *, within_episodes: bool = False,
                 timeout: float | None = None, block: Literal[True] = True
                 ) -> tuple[Any, BufferInfo]: ...

    @overload
    def get_next(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                 time_stacked: bool = True, *, within_episodes: bool = False,
                 timeout: float | None = None, block: bool = True
                 ) -> tuple[Any, BufferInfo] | None: ...

    def get_next(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                 time_stacked: bool = True, *, within_episodes: bool = False,
                 timeout: float | None = None, block: bool = True
                 ) -> tuple[Any, BufferInfo] | None:
        """Sample items (with replacement) and return ``(items, BufferInfo)``.

        Shapes, with ``D`` the spec shape of a leaf:

        ==================  ============  =====================================
        sample_batch_size   num_steps     items leaf shape
        ==================  ============  =====================================
        None                None          ``[D]``
        S                   None          ``[S, D]``
        None                T             ``[T, D]`` (a T-tuple of ``[D]`` unstacked)
        S                   T             ``[S, T, D]`` (a T-tuple of ``[S, D]``)
        ==================  ============  =====================================

        Every step of one sample comes from the same row; a window never crosses the
        write head (it may wrap physically). ``BufferInfo.ids`` has the items' outer
        shape; ``probabilities`` is float32 ``[S]`` (a scalar without ``S``).

        With ``within_episodes=True`` (buffers built with ``track_episodes=True``) every
        window lies inside one episode, drawn from those windows only (uniformly, or by
        priority); ``probabilities`` are relative to them.

        With a :attr:`rate_limiter` that holds the sample back, wait up to ``timeout``
        seconds (``None``: as long as it takes), or with ``block=False`` return ``None``.

        Raises:
            EmptyBufferError: the buffer is empty, or holds fewer than ``num_steps``
                steps per row (or within one episode).
            RateLimitedError: ``timeout`` passed with the sample held back.
            ValueError: a bad ``sample_batch_size``, ``num_steps`` or ``timeout`` (NaN
                or negative); nothing is counted.
        """
        sample_batch_size = positive_or_none(sample_batch_size, "sample_batch_size")
        num_steps = positive_or_none(num_steps, "num_steps")
        if timeout is not None:  # a hot path: no call for the usual None
            check_timeout(timeout)
        return self.draw(sample_batch_size, num_steps, time_stacked,
                            within_episodes=within_episodes, timeout=timeout, block=block)

    @overload
    def draw(self, sample_batch_size: int | None, num_steps: int | None,
             time_stacked: bool = True, rng: np.random.Generator | None = None,
             within_episodes: bool = False, timeout: float | None = None,
             block: Literal[True] = True) -> tuple[Any, BufferInfo]: ...

    @overload
    def draw(self, sample_batch_size: int | None, num_steps: int | None,
             time_stacked: bool = True, rng: np.random.Generator | None = None,
             within_episodes: bool = False, timeout: float | None = None,
             block: bool = True) -> tuple[Any, BufferInfo] | None: ...

    def draw(self, sample_batch_size: int | None, num_steps: int | None,
             time_stacked: bool = True, rng: np.random.Generator | None = None,
             within_episodes: bool = False, timeout: float | None = None,
             block: bool = True) -> tuple[Any, BufferInfo] | None:
        """:meth:`get_next` after argument checks; ``rng`` overrides the sampler's."""
        drawn = self._sample_arrays(sample_batch_size or 1, num_steps, rng, within_episodes,
                                    timeout, block)
        if drawn is None:
            return None
        leaves, ids, info = drawn
        return self._package(leaves, ids, info, sample_batch_size, num_steps, time_stacked)

    def spawn_rng(self) -> np.random.Generator:
        """A new generator seeded from the sampler's (advancing its state): one per
        dataset stream or prefetch worker, so a seeded buffer's streams reproduce."""
        with self._lock:
            return self._sampler.spawn_rng()

    def window_mass(self, num_steps: int) -> float:
        """What this buffer weighs in a draw of windows of ``num_steps`` across several
        buffers (shards): its priority total over valid window starts (prioritized
        samplers), else the number of valid windows it holds."""
        with self._lock:
            ring, sampler = self._ring, self._sampler
            valid_mass = getattr(sampler, "valid_mass", None)
            if valid_mass is not None:
                return float(valid_mass(ring, num_steps))
            return float(ring.batch_size * max(0, ring.items_per_row - num_steps + 1))

    def _package(self, leaves: list[Any], ids: np.ndarray, info: dict[str, np.ndarray],
                 sample_batch_size: int | None, num_steps: int | None,
                 time_stacked: bool) -> tuple[Any, BufferInfo]:
        """:func:`package` with this buffer's structure and backend."""
        return package(self._structure, self._storage.from_numpy, leaves, ids, info,
                       sample_batch_size, num_steps, time_stacked)

    def gather_all(self) -> Any:
        """Every retained step, ``[batch_size, items_per_row, D]`` per leaf.

        Rows are in chronological order, oldest first; an empty buffer gives
        ``[batch_size, 0, D]``.
        """
        ring = self._ring
        with self._lock:
            first, n = ring.oldest_id, ring.items_per_row
            ids = np.arange(first, first + n, dtype=np.int64)
            rows = np.arange(ring.batch_size, dtype=np.int64)[:, None]
            leaves = self._gather(ring.positions(ids[None, :], rows))
        return self._structure.unflatten(leaves)


def package(structure: Any, to_backend: Callable[[np.ndarray], Any], leaves: list[Any],
            ids: np.ndarray, info: dict[str, np.ndarray], sample_batch_size: int | None,
            num_steps: int | None, time_stacked: bool) -> tuple[Any, BufferInfo]:
    """Gathered leaves (``[S, ...]`` or ``[S, T, ...]``) and their ids and ``info``
    (``probabilities``, maybe ``weights``) as ``get_next`` returns them: the outer
    ``S`` dropped when ``sample_batch_size`` is None, a T-tuple of steps when not
    ``time_stacked``, arrays in the storage's backend (``to_backend``)."""
    probabilities, weights = info["probabilities"], info.get("weights")
    if sample_batch_size is None:
        leaves = [leaf[0] for leaf in leaves]
        ids, probabilities = ids[0], probabilities[0]
        weights = None if weights is None else weights[0]
    # Backends other than numpy take numpy scalars (and, the torch storage, tensors
    # from device-side sampling) as they are.
    host = to_backend is identity
    if weights is not None:
        weights = to_backend(np.asarray(weights) if host else weights)
    if num_steps is not None and not time_stacked:
        axis_t = 0 if sample_batch_size is None else 1
        items = tuple(structure.unflatten([_take_step(leaf, t, axis_t) for leaf in leaves])
                      for t in range(num_steps))
        ids_out: Any = tuple(to_backend(_copy(_take_step(ids, t, axis_t)))
                             for t in range(num_steps))
        return items, BufferInfo(ids_out, to_backend(np.asarray(probabilities) if host
                                                     else probabilities), weights)
    if host:
        return structure.unflatten(leaves), BufferInfo(ids, probabilities, weights)
    return structure.unflatten(leaves), BufferInfo(to_backend(ids), to_backend(probabilities),
                                                   weights)


def _copy(array: Any) -> Any:
    """A numpy array (or scalar) copied; a tensor as it is (a view of ids not returned)."""
    return np.array(array) if isinstance(array, (np.ndarray, np.generic)) else array


def _take_step(array: Any, t: int, axis: int) -> Any:
    return array[t] if axis == 0 else array[:, t]

