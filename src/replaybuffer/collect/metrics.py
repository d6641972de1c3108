"""Observers that measure collection: episode returns, lengths and counts.

Each is a callable taking batched :class:`Trajectory` s, vectorised over the env
axis, with a ``result()`` over the last ``window`` completed episodes.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from replaybuffer.collect.trajectory import Trajectory


class _EpisodeMetric:
    """Accumulates a per-env quantity over each episode; keeps the last ``window``."""

    def __init__(self, window: int = 10):
        self.window = window
        self.values: collections.deque[float] = collections.deque(maxlen=window)
        self.episodes = 0
        self._running: np.ndarray | None = None

    def _increment(self, trajectory: Trajectory) -> np.ndarray:
        raise NotImplementedError

    def __call__(self, trajectory: Trajectory) -> None:
        boundary = np.asarray(trajectory.is_boundary())
        if self._running is None:
            self._running = np.zeros(boundary.shape, np.float64)
        elif self._running.shape != boundary.shape:
            raise ValueError(f"{type(self).__name__} saw {self._running.shape[0]} envs, now "
                             f"{boundary.shape[0]}: use one metric per driver, or reset() it")
        self._running += np.where(boundary, 0.0, self._increment(trajectory))
        ended = np.asarray(trajectory.is_last()) & ~boundary
        if ended.any():
            self.values.extend(self._running[ended].tolist())
            self.episodes += int(ended.sum())
            self._running[ended] = 0.0

    def result(self) -> float:
        """Mean over the last ``window`` episodes (NaN before the first one ends)."""
        return float(np.mean(self.values)) if self.values else float("nan")

    def reset(self) -> None:
        self.values.clear()
        self.episodes = 0
        self._running = None


class AverageReturn(_EpisodeMetric):
    """Average undiscounted return of the last ``window`` episodes."""

    def _increment(self, trajectory: Trajectory) -> Any:
        return np.asarray(trajectory.reward, np.float64)


class AverageEpisodeLength(_EpisodeMetric):
    """Average length (in environment steps) of the last ``window`` episodes."""

    def _increment(self, trajectory: Trajectory) -> Any:
        return 1.0


class EnvironmentSteps:
    """Counts environment steps (boundary steps excluded)."""

    def __init__(self) -> None:
        self.steps = 0

    def __call__(self, trajectory: Trajectory) -> None:
        self.steps += int((~np.asarray(trajectory.is_boundary())).sum())

    def result(self) -> int:
        return self.steps
