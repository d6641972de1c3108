"""Datasets of a buffer: the arguments of ``as_dataset`` checked and the iterable
chosen (:mod:`replaybuffer.dataset`), and the two reads a deterministic pass makes:
its plan of blocks over the retained steps, and each block gathered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, cast

import numpy as np

from replaybuffer import nest
from replaybuffer.arguments import positive_or_none
from replaybuffer.buffers.rate_limiting import RateLimiting
from replaybuffer.buffers.reads import ReadPath
from replaybuffer.dataset import DeterministicPass, RandomStream
from replaybuffer.protocols import BufferInfo
from replaybuffer.sampling.deterministic import plan
from replaybuffer.sampling.ring import table_rows

if TYPE_CHECKING:
    from replaybuffer.sampling.deterministic import Index


class Datasets(ReadPath, RateLimiting):
    """:meth:`as_dataset`, and :meth:`deterministic_plan` and :meth:`read_block`, which
    :class:`~replaybuffer.dataset.DeterministicPass` iterates. Random datasets draw
    through the read path (:meth:`ReadPath.draw`), paced by the rate limiter."""

    def as_dataset(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                   num_parallel_calls: int | None = None,
                   single_deterministic_pass: bool = False, *,
                   prefetch: int | None = None, drop_remainder: bool = False,
                   window_shift: int | None = None, within_episodes: bool = False
                   ) -> Iterable[tuple[Any, BufferInfo]]:
        """An iterable of ``(items, BufferInfo)`` elements.

        Random mode (default) is infinite: each element is a fresh :meth:`get_next`
        with ``time_stacked=True``. With ``num_parallel_calls=k`` that many worker
        threads sample ahead into a bounded queue of ``prefetch`` elements (default
        ``2 * k``); element order is still deterministic for a seeded buffer. Without
        workers every element is drawn when it is pulled, so it sees the buffer as it
        is at that moment.

        ``single_deterministic_pass=True`` visits every retained step once, row by
        row, oldest first (see :mod:`replaybuffer.sampling.deterministic` for the
        order with ``sample_batch_size``/``num_steps``). ``window_shift`` sets the
        steps between window starts (default ``num_steps``: disjoint windows);
        ``drop_remainder`` drops partial windows and a partial last row group.
        The index range is read when iteration starts.

        ``within_episodes=True`` (random mode, buffers built with ``track_episodes``)
        keeps every window inside one episode, as in :meth:`get_next`.

        Raises:
            ValueError: the data spec contains Python lists (use tuples), or
                ``drop_remainder`` would drop all data.
        """
        if nest.contains_lists(self._data_spec):
            raise ValueError("as_dataset needs a data_spec without Python lists: convert "
                             f"them to tuples (data_spec={self._data_spec!r})")
        sample_batch_size = positive_or_none(sample_batch_size, "sample_batch_size")
        num_steps = positive_or_none(num_steps, "num_steps")
        if within_episodes and self._episodes is None:
            raise self.untracked_error()
        if single_deterministic_pass:
            if within_episodes:
                raise ValueError("within_episodes applies to random sampling; the "
                                 "deterministic pass reads every step in order")
            window_shift = positive_or_none(window_shift, "window_shift")
            return DeterministicPass(self, sample_batch_size, num_steps, window_shift,
                                     drop_remainder)
        num_parallel_calls = positive_or_none(num_parallel_calls, "num_parallel_calls")
        if getattr(self._sampler, "consumes", False) and (num_parallel_calls or prefetch):
            raise ValueError(f"{type(self).__name__} reads each window once, in order: its "
                             "dataset samples on pull (no num_parallel_calls or prefetch), "
                             "since prefetched windows would be reordered or lost")
        if num_steps is not None and num_steps > self._ring.max_length:
            raise self.empty_error(num_steps)
        return RandomStream(self, sample_batch_size, num_steps, num_parallel_calls, prefetch,
                            within_episodes)

    def deterministic_plan(self, sample_batch_size: int | None, num_steps: int | None,
                           shift: int | None, drop_remainder: bool
                           ) -> Iterable[tuple[Index, Index]]:
        """The blocks of a single deterministic pass over the steps retained now: pairs
        ``(ids, rows)`` of int64 step ids and rows that broadcast to one element's outer
        shape (``[S]``, ``[S, T]``, ``[T]`` or scalars), in the order of
        :func:`replaybuffer.sampling.deterministic.plan`; read each with
        :meth:`read_block`. Arguments as for ``as_dataset``'s deterministic pass
        (``shift``: ``window_shift``).

        Raises:
            EmptyBufferError: the buffer is empty.
        """
        ring = self._ring
        with self._lock:
            if ring.last_id < 0:
                raise self.empty_error(action="asking the buffer for data")
            first, n = ring.oldest_id, ring.items_per_row
        return plan(first, n, ring.batch_size, sample_batch_size, num_steps, shift,
                    drop_remainder)

    def read_block(self, ids: Index, rows: Index) -> tuple[Any, BufferInfo]:
        """One element of a deterministic pass: the steps at step ids ``ids`` of rows
        ``rows`` (a block of :meth:`deterministic_plan`), as ``(items, BufferInfo)``
        with items of the block's outer shape plus each leaf's spec shape, and
        ``BufferInfo(ids=physical row indices, row * max_length + slot, int64;
        probabilities=())``."""
        ring = self._ring
        # An element with neither a batch nor a time dimension has scalar ids and rows:
        # its position is a numpy integer, which storages index as a 0-d array.
        ids_array = cast(np.ndarray, ids)
        with self._lock:
            leaves = self._gather(ring.positions(ids_array, rows))
        physical = np.broadcast_to(table_rows(ids_array, rows, ring.max_length),
                                   np.broadcast_shapes(np.shape(ids), np.shape(rows)))
        info = BufferInfo(self._storage.from_numpy(np.array(physical)), ())
        return self._structure.unflatten(leaves), info
