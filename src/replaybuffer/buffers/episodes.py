"""Episodes: where they start, so that reads can keep windows inside one.

With ``track_episodes=True`` the buffer keeps an
:class:`~replaybuffer.sampling.episodes.EpisodeIndex` (a part of its own: the ids and
rows of ``FIRST`` steps) up to date as steps arrive, and hands it to the sampler for
reads with ``within_episodes=True``. This module holds that recording: from the step
types of new steps, and, after a reopen, from the step types the files hold.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaybuffer.buffers.wiring import BufferParts
from replaybuffer.storage.base import to_numpy


class EpisodeRecording(BufferParts):
    """Keeps the buffer's episode index (``_episodes``, or ``None`` without
    ``track_episodes``) in step with its writes."""

    @property
    def tracks_episodes(self) -> bool:
        """Whether the buffer was built with ``track_episodes=True`` (so reads take
        ``within_episodes=True``)."""
        return self._episodes is not None

    def untracked_error(self) -> ValueError:
        """The error for ``within_episodes=True`` on a buffer that does not track
        episodes."""
        return ValueError(f"within_episodes=True needs a buffer built with "
                          f"track_episodes=True ({type(self).__name__} was not)")

    def _record_episodes(self, first_id: int, step_types: Any, num_steps: int) -> None:
        """Note the FIRST steps among ``num_steps`` new steps (``[num_steps * B]`` step types)."""
        episodes = self._episodes
        assert episodes is not None  # callers check first
        starts = to_numpy(step_types).reshape(num_steps, self.batch_size) == 0  # FIRST
        episodes.record(first_id, starts, self._ring.oldest_id)

    def _record_stored_episodes(self, first: int, last_id: int) -> None:
        """Note the FIRST steps among the stored steps ``first..last_id`` (those the ring
        still holds), reading their step types back from storage (the lock held)."""
        ring = self._ring
        first = max(first, ring.oldest_id)
        ids = np.arange(first, last_id + 1, dtype=np.int64)
        rows = np.arange(ring.batch_size, dtype=np.int64)
        positions = ring.positions(ids[:, None], rows[None, :]).ravel()
        step_types = self._storage.gather(positions, [self._step_type_leaf])[0]
        self._record_episodes(first, step_types, len(ids))
