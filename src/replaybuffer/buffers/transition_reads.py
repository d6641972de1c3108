"""The read path of a transition buffer: transitions, with ``n``-step returns, of
given steps.

:class:`TransitionReads` is the part of :class:`~replaybuffer.TransitionReplayBuffer`
that turns storage positions into :class:`~replaybuffer.Transitions`: the stored
leaves, the next observations (:class:`~replaybuffer.buffers.side_observations.SideObservations`),
and for ``n_step > 1`` the discounted returns of each step's window, which stop at
episode ends, at out-of-sequence adds and at the newest step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaybuffer.buffers.transition_add import TransitionAdds
from replaybuffer.buffers.transition_fields import Transitions
from replaybuffer.errors import EmptyBufferError
from replaybuffer.storage.base import to_numpy


class TransitionReads(TransitionAdds):
    """The read path of a transition buffer (see the module).

    A part of :class:`~replaybuffer.TransitionReplayBuffer`, which sets the state
    declared here when it is built.
    """

    # Set by TransitionReplayBuffer.__init__.
    n_step: int
    gamma: float
    _steps: np.ndarray  # int64 [n_step]: offsets of an n-step window
    _step_discounts: np.ndarray  # float64 [n_step]: gamma ** k
    _action_leaves: list[int]
    _action_structure: Any

    def read_steps(self, ids: np.ndarray) -> Transitions:
        """The transitions of steps ``ids`` (int64 ``[K]``) of every env: leaves
        ``[num_envs, K, ...]``. No ids: no rows, in the fields' shapes and dtypes.

        Raises:
            EmptyBufferError: a step is not stored (or nothing is).
        """
        rows = np.arange(self.num_envs, dtype=np.int64)[:, None]
        with self._lock:
            ring = self._ring
            if len(ids):
                if ring.last_id < 0:
                    raise self.empty_error()
                if ids.min() < ring.oldest_id or ids.max() > ring.last_id:
                    raise EmptyBufferError(f"steps {ids.min()}..{ids.max()} are not stored "
                                           f"(held: {ring.oldest_id}..{ring.last_id})")
            return self._read(np.broadcast_to(ids, (self.num_envs, len(ids))),
                              ring.positions(ids[None, :], rows))

    def _read(self, ids: np.ndarray, positions: np.ndarray) -> Transitions:
        """Gather transitions (with ``n``-step returns) at steps ``ids``/``positions``."""
        leaves = self._gather(positions)  # stacks rebuilt from frame references
        if self.n_step == 1:
            # One-step transitions (the common case) need no windows: a step's reward,
            # terminated and truncated come with its other leaves (one take of the
            # packed records), and its next observation is the following step's unless
            # the side store or the newest step's own says otherwise.
            rewards = leaves[self._reward]
            end_term, end_trunc = leaves[self._terminated], leaves[self._truncated]
            if not self._host:
                end_term, end_trunc = to_numpy(end_term), to_numpy(end_trunc)
            discounts = np.float32(self.gamma) * ~end_term  # gamma, 0 after termination
            next_obs = self._next_observations(positions, ids)
        else:
            rewards, end_term, end_trunc, discounts, next_obs = self._n_step_returns(ids,
                                                                                     positions)
        to_backend = self._storage.from_numpy
        return Transitions(
            observations=self._obs_structure.unflatten([leaves[i] for i in self._obs_leaves]),
            actions=self._unflatten_action(leaves),
            rewards=rewards,
            next_observations=self._obs_structure.unflatten(next_obs),
            terminated=to_backend(end_term), truncated=to_backend(end_trunc),
            dones=to_backend(end_term | end_trunc), discounts=to_backend(discounts))

    def _n_step_returns(self, ids: np.ndarray, positions: np.ndarray) -> tuple[Any, ...]:
        """``(returns, terminated, truncated, discounts, next observation leaves)`` of
        the ``n``-step windows starting at steps ``ids``/``positions``."""
        ring, B = self._ring, self.num_envs
        n = self.n_step
        steps = self._steps
        window_ids = ids[..., None] + steps
        window_positions = (positions[..., None] + steps * B) % ring.capacity
        held = window_ids <= ring.last_id
        gathered = self._storage.gather(np.where(held, window_positions, positions[..., None]),
                                        [self._reward, self._terminated, self._truncated])
        rewards, terminated, truncated = (to_numpy(g) for g in gathered)
        ended = (terminated | truncated) & held
        # A step whose next observation is in the side store ends the window too: the
        # step after it (if any) is not its successor (an out-of-sequence add).
        breaks = ended | (self._side_ref[window_positions] >= 0) & held
        # Step k counts if it is stored and no earlier step of the window broke it.
        before_end = np.cumsum(breaks, axis=-1) - breaks == 0
        counted = held & before_end
        m = counted.sum(-1)
        returns = (rewards * counted * self._step_discounts).sum(-1).astype(np.float32)
        last_k = m - 1
        last_id = ids + last_k
        # Each window's last counted step, as flat indices into the [..., n] arrays (one
        # fancy index each, where take_along_axis builds index grids on every call).
        last = np.arange(0, m.size * n, n).reshape(m.shape) + last_k
        last_pos = window_positions.reshape(-1)[last]
        end_term = terminated.reshape(-1)[last]  # counted, being the last counted step
        end_trunc = truncated.reshape(-1)[last]
        discounts = np.where(end_term, 0.0, self.gamma ** m).astype(np.float32)
        return (self._storage.from_numpy(returns), end_term, end_trunc, discounts,
                self._next_observations(last_pos, last_id))

    def _unflatten_action(self, leaves: list[Any]) -> Any:
        return self._action_structure.unflatten([leaves[i] for i in self._action_leaves])
