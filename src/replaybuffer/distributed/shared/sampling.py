"""The read path of a shared buffer: windows drawn from the rows, copied, and kept only
when every step was whole while copied.

A reader reads the versions of the positions it drew, copies the data, reads the
versions again, and keeps a sample only when both reads show exactly the steps it
meant (a window's consecutive ids): a step half written, overwritten while copied, or
left half written by a writer that was killed is never returned; such draws are drawn
again (a round redraws only those; in practice one or two rounds).

No lock. A uniform draw reads the row heads, the versions and the data as they are, with
an order fence after the first version loads (so the data loads come after them) and
one after the data loads (so the second version loads come after them): the reader's
half of the seqlock argued in :mod:`.writer`. Writers never wait for a reader and a
reader never waits for a writer; a draw that met a write in progress is drawn again.
A prioritized draw reads the sum tree under the lock (:mod:`.priorities`), then copies
and checks the data outside it, as a uniform draw does.
"""

from __future__ import annotations

import os
from typing import Callable

import numpy as np

from replaybuffer.distributed.shared.frame_ring import SharedFrameRing
from replaybuffer.distributed.shared.layout import ATTACHED, SharedLayout
from replaybuffer.distributed.shared.memory_fences import check_available, order_fence
from replaybuffer.distributed.shared.priorities import SharedPriorities
from replaybuffer.distributed.shared.process_lock import ProcessLock
from replaybuffer.distributed.shared.windows import WindowChoice
from replaybuffer.errors import EmptyBufferError
from replaybuffer.sampling.sampler import make_rng
from replaybuffer.storage.shared_storage import SharedStorage

MAX_REDRAWS = 10_000
"""Rounds of redrawing samples that met steps being written before giving up (a
round redraws only those; in practice one or two rounds)."""


class SharedSampler:
    """Draws whole windows from a shared buffer: uniformly over the windows the rows
    hold, or by priority (``priorities`` given).

    Args:
        layout: the buffer's control arrays.
        storage: its data.
        lock: its process lock.
        num_rows, max_length: its shape.
        priorities: the prioritized tree (``None``: uniform).
        beta: the importance-sampling exponent (prioritized).
        seed: the buffer's seed (see :meth:`process_rng`).
        frames: the frame ring of a stacked leaf (:mod:`.frame_ring`), whose stacks are
            rebuilt from the copied references before the second version loads.

    Raises:
        RuntimeError: this processor needs memory fences and ``libatomic`` is missing
            (:func:`~.memory_fences.check_available`).
    """

    def __init__(self, layout: SharedLayout, storage: SharedStorage, lock: ProcessLock,
                 num_rows: int, max_length: int, priorities: SharedPriorities | None,
                 beta: float, seed: int | None, frames: SharedFrameRing | None = None):
        check_available()  # a processor that needs fences this system cannot give
        self._version, self._next_id = layout.version, layout.next_id
        self._control = layout.control
        self._storage = storage
        self._lock = lock
        self._rows_total, self._length = num_rows, max_length
        self._priorities = priorities
        self._beta = beta
        self._seed = seed
        self._rng_pid = -1
        self._frames = frames

    def process_rng(self) -> np.random.Generator:
        """This process's generator: a process that attached, or was forked, numbers
        itself in the shared count and seeds from it (so two samplers never draw alike):
        process ``k`` draws from ``SeedSequence(seed, spawn_key=(k,))``."""
        if self._rng_pid != os.getpid():
            with self._lock:
                attached = int(self._control[ATTACHED])
                self._control[ATTACHED] += 1
            self._rng = make_rng(None if self._seed is None
                                 else np.random.SeedSequence(self._seed, spawn_key=(attached,)))
            self._rng_pid = os.getpid()
        return self._rng

    def draw(self, count: int, steps: int, rng: np.random.Generator,
             choice: WindowChoice | None = None,
             recheck: Callable[[], WindowChoice | None] | None = None
             ) -> tuple[list[np.ndarray], np.ndarray, dict[str, np.ndarray]]:
        """``count`` windows of ``steps`` whose every step was whole while copied:
        leaves ``[count, steps, ...]``, int64 item ids ``[count, steps]``, ``info``
        (float32 ``probabilities [count]``; prioritized: float32 ``weights [count]``).
        ``choice``: the windows to draw instead of any below a row's head (a cleared
        buffer, episodes, a queue; see :mod:`.windows`). ``recheck``: asked again for
        the choice before a redraw while it is ``None`` (a clear since the read began
        narrows the redraws to the steps since it).

        Raises:
            EmptyBufferError: no row holds ``steps`` steps (no positive priority).
            RuntimeError: samples kept meeting steps being written.
        """
        rows_total, length = self._rows_total, self._length
        draw_positions = self._draw_uniform if self._priorities is None \
            else self._priorities.draw
        if choice is not None:  # issue 24 parity hook: clear, episodes, Queue (.windows)
            draw_positions = choice.positions
        offsets = np.arange(steps, dtype=np.int64)
        todo = np.arange(count)
        leaves: list[np.ndarray] | None = None
        ids = np.empty((count, steps), np.int64)
        chance = np.empty(count, np.float64)
        for round_ in range(MAX_REDRAWS):
            if round_ and choice is None and recheck is not None:
                choice = recheck()
                if choice is not None:
                    draw_positions = choice.positions
            rows, starts, p = draw_positions(len(todo), steps, rng)
            step_ids = starts[:, None] + offsets
            positions = (step_ids % length) * rows_total + rows[:, None]
            expected = 2 * step_ids + 2
            before = self._version.take(positions)
            order_fence()  # the versions before the data
            got = self._storage.gather(positions)
            if self._frames is not None:  # the frames too, before the versions again
                leaf = self._frames.leaf
                got[leaf] = self._frames.decode(got[leaf], positions % rows_total)
            order_fence()  # the data before the versions again
            whole = ((before == expected) & (self._version.take(positions) == expected)
                     ).all(1) & (p > 0)
            kept = None if choice is None else choice.keeps(got)  # issue 24 parity hook
            if kept is not None:
                whole &= kept
            if leaves is None:  # the first round fills every slot, whole or not
                leaves = got
                if whole.all():  # the usual case: nothing to draw again
                    ids = step_ids * rows_total + rows[:, None]
                    chance = p
                    break
            else:
                for out, new in zip(leaves, got):
                    out[todo[whole]] = new[whole]
            ids[todo[whole]] = step_ids[whole] * rows_total + rows[whole, None]
            chance[todo[whole]] = p[whole]
            todo = todo[~whole]
            if not len(todo):
                break
        else:
            raise RuntimeError(f"get_next: {len(todo)} of {count} samples met steps being "
                               f"written in {MAX_REDRAWS} rounds of drawing")
        info: dict[str, np.ndarray] = {"probabilities": chance.astype(np.float32)}
        if self._priorities is not None:
            weights = np.power(chance.min() / chance, self._beta).astype(np.float32)
            info["weights"] = weights
        assert leaves is not None
        return leaves, ids, info

    def _draw_uniform(self, count: int, steps: int, rng: np.random.Generator
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows, first step ids and probabilities of ``count`` windows drawn uniformly
        among the windows the rows hold now."""
        heads = self._next_id.copy()
        windows = np.maximum(np.minimum(heads, self._length) - steps + 1, 0)
        ends = np.cumsum(windows)
        total = int(ends[-1])
        if total == 0:
            raise EmptyBufferError(f"get_next: no row holds {steps} step(s) yet (the most "
                                   f"any row holds: {int(heads.max())})")
        draws = rng.integers(0, total, count)
        rows = np.searchsorted(ends, draws, side="right")
        oldest = np.maximum(heads - self._length, 0)
        starts = oldest[rows] + draws - (ends[rows] - windows[rows])
        return rows, starts, np.full(count, 1.0 / total)
