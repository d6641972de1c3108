"""A growable store of observations that do not follow from the next stored step.

Transition buffers keep one observation per step and read a transition's next
observation from the step after it. That is wrong at an episode's end (the next slot
holds the next episode's first observation) and wherever transitions were added out
of sequence. Those next observations are kept here instead, each owned by the storage
position of its transition and freed when that position is overwritten, so memory is
proportional to the episode ends retained.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from replaybuffer.specs import ArraySpec


class SideStore:
    """Observations (one array per leaf) addressed by int64 slots, allocated on demand.

    Args:
        specs: leaf specs of one observation.
        capacity: initial slots (doubles when full).
    """

    def __init__(self, specs: Sequence[ArraySpec], capacity: int = 64):
        self.specs = tuple(specs)
        self.arrays = [np.zeros((capacity,) + s.shape, s.dtype) for s in self.specs]
        self._free = list(range(capacity - 1, -1, -1))

    def __len__(self) -> int:
        """Slots in use."""
        return len(self.arrays[0]) - len(self._free)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)

    def put(self, leaves: Sequence[np.ndarray]) -> np.ndarray:
        """Store ``K`` observations (leaves ``[K, *spec.shape]``); their slots ``[K]``."""
        count = len(leaves[0])
        while len(self._free) < count:
            self._grow()
        split = len(self._free) - count
        slots = np.array(self._free[split:][::-1], np.int64)  # as pop() would take them
        del self._free[split:]
        for dst, src in zip(self.arrays, leaves):
            dst[slots] = src
        return slots

    def free(self, slots: np.ndarray) -> None:
        self._free.extend(np.asarray(slots, np.int64).tolist())

    def take(self, slots: np.ndarray) -> list[np.ndarray]:
        return [a[slots] for a in self.arrays]

    def _grow(self) -> None:
        old = len(self.arrays[0])
        self.arrays = [np.concatenate([a, np.zeros_like(a)]) for a in self.arrays]
        self._free.extend(range(2 * old - 1, old - 1, -1))

    def clear(self) -> None:
        self._free = list(range(len(self.arrays[0]) - 1, -1, -1))

    def state_dict(self) -> dict[str, Any]:
        """``slots`` int64 ``[n]`` in use, their ``leaves`` (``[n, *spec.shape]`` each), the
        ``capacity``, and the free list in the order :meth:`put` takes from it (from the
        end), so that a restored store hands out the same slots as the original would.

        The free list is written as its runs of descending slots, ``free`` int64
        ``[r, 2]`` of ``(first slot, length)``: the slots never handed out since the
        store grew or was cleared form a few long runs, so a store grown large once and
        nearly empty now writes about what it holds, not its capacity.
        """
        free = np.array(self._free, np.int64)
        capacity = len(self.arrays[0])
        used = np.setdiff1d(np.arange(capacity), free)
        return {"slots": used, "leaves": [a[used] for a in self.arrays],
                "capacity": capacity, "free": descending_runs(free)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`, or an older save: ``free`` the whole list (int64
        ``[k]``), or no free list at all. Checked (:meth:`check_state`) before anything
        changes."""
        free = self.check_state(state)
        capacity = int(state["capacity"])
        slots = np.asarray(state["slots"], np.int64)
        self.arrays = [np.zeros((capacity,) + s.shape, s.dtype) for s in self.specs]
        for dst, src in zip(self.arrays, state["leaves"]):
            dst[slots] = src
        if free is not None:
            self._free = free.tolist()
        else:  # saves from before the free list was kept: any order restores the data
            used = set(slots.tolist())
            self._free = [i for i in range(capacity - 1, -1, -1) if i not in used]

    @staticmethod
    def check_state(state: dict[str, Any]) -> np.ndarray | None:
        """The free list of ``state`` (int64 ``[k]``; ``None`` in saves without one).

        Raises:
            ValueError: the free list and the slots in use do not partition the
                capacity's slots.
        """
        if "free" not in state:
            return None
        capacity = int(state["capacity"])
        slots = np.asarray(state["slots"], np.int64)
        free = np.asarray(state["free"], np.int64)
        if free.ndim == 2 and free.shape[1] == 2:
            free = expand_runs(free)
        if free.ndim != 1 or len(free) + len(slots) != capacity or \
                len(np.union1d(free, slots)) != capacity or \
                (capacity and (free.min(initial=0) < 0 or free.max(initial=0) >= capacity)):
            raise ValueError(f"side store state: the free list and the {len(slots)} "
                             f"slots in use do not partition {capacity} slots")
        return free


def descending_runs(values: np.ndarray) -> np.ndarray:
    """``values`` (int64 ``[k]``) as runs of consecutive descending integers: int64
    ``[r, 2]`` of ``(first value, length)``, in order; :func:`expand_runs` inverts it."""
    if len(values) == 0:
        return np.zeros((0, 2), np.int64)
    firsts = np.concatenate([[0], np.flatnonzero(np.diff(values) != -1) + 1])
    lengths = np.diff(np.append(firsts, len(values)))
    return np.stack([values[firsts], lengths], 1).astype(np.int64)


def expand_runs(runs: np.ndarray) -> np.ndarray:
    """The int64 ``[sum of lengths]`` values of :func:`descending_runs`' ``runs``."""
    firsts, lengths = runs[:, 0], runs[:, 1]
    if (lengths < 0).any():
        raise ValueError(f"side store state: a run of the free list has a negative "
                         f"length ({int(lengths.min())})")
    offsets = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out: np.ndarray = np.repeat(firsts, lengths) - offsets
    return out
