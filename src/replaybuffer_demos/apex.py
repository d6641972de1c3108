"""Ape-X's parts for the Ray demo (``replaybuffer demo --ray --prioritized``): shards that
take steps with their initial priorities, the actors' priorities, the learner's
importance weights.

In Ape-X (Horgan et al., 2018) each actor computes the priority of the steps it sends
from its own copy of the network, so that a new step enters replay at a priority that
says something about it, instead of at the largest priority seen (which makes every new
step the most likely to be drawn until the learner has looked at it once). The learner
then samples by priority, weights its loss by importance weights, and sets the
priorities of what it sampled to its own |TD errors|.

Here:

- :class:`ActorPrioritizedBuffer` is a shard's buffer: a
  :class:`~replaybuffer.PrioritizedReplayBuffer` whose ``add(items, priorities)``
  appends steps and sets their priorities in one write (a
  :class:`~replaybuffer.distributed.ShardWriter`'s ``add`` reaches it in the shard);
- :func:`initial_priorities` is what an actor computes for a chunk of its steps;
- :func:`importance_weights` gives the learner's weights with the demo's annealed beta.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

import replaybuffer as rb
from replaybuffer import nest
from replaybuffer.buffers.prioritized import checked_priorities
from replaybuffer.collect import to_transition


class ActorPrioritizedBuffer(rb.PrioritizedReplayBuffer):
    """A :class:`~replaybuffer.PrioritizedReplayBuffer` of one row (``batch_size=1``) that
    takes steps together with their priorities: :meth:`add`. Its other methods are the
    prioritized buffer's."""

    def __init__(self, data_spec: Any, max_length: int, **kwargs: Any):
        super().__init__(data_spec, 1, max_length, **kwargs)
        # Item ids are (adds before the last clear + add id) for one row; clear() keeps
        # the count so that ids stay those of update_priorities.
        self._adds_before_clear = 0

    def add(self, items: Any, priorities: Any) -> int:
        """Append ``T`` steps (leaves ``[1, T, ...]``, as ``extend``) whose windows get
        ``priorities`` (float ``[T]``, finite and >= 0: the window starting at step ``t``
        gets ``priorities[t]``). Returns how many priorities were set (``T`` unless the
        steps were overwritten by the time they were set: ``T > max_length``).

        Raises:
            ValueError: ``priorities`` is not ``[T]``, or holds a NaN, infinite or
                negative value (the error names it); nothing is written.
            SpecError: the items do not match the spec; nothing is written.
        """
        shape = np.shape(nest.flatten(items)[0][0])
        values = np.asarray(priorities, np.float64)
        if len(shape) < 2 or values.shape != shape[1:2]:
            raise ValueError(f"add: priorities must be [T] for items of T steps (leaves "
                             f"[1, T, ...]); got priorities of shape {values.shape} for a "
                             f"first leaf of shape {shape}")
        first = self._adds_before_clear + self.last_id + 1
        ids = np.arange(first, first + len(values), dtype=np.int64)  # the steps' item ids
        checked_priorities(ids, values)  # bad values raise before anything is written
        self.extend(items)
        return self.update_priorities(ids, values)

    def clear(self, zero_storage: bool = False) -> None:
        self._adds_before_clear += self.last_id + 1
        super().clear(zero_storage)


def initial_priorities(q_values: Callable[[np.ndarray], np.ndarray], steps: Any,
                       gamma: float, epsilon: float) -> np.ndarray:
    """An actor's priorities for ``T`` consecutive steps of one environment.

    Args:
        q_values: the actor's copy of the Q-network, float32 ``[N, obs_dim]`` to
            ``[N, num_actions]``.
        steps: a :class:`~replaybuffer.collect.Trajectory` whose leaves are
            ``[1, T + 1, ...]``: the ``T`` steps to send and the one after them.
        gamma: the discount factor.
        epsilon: added to every priority, so that no step is never drawn.

    Returns:
        float64 ``[T]``: ``|r + gamma * discount * max_a Q(s', a) - Q(s, a)| + epsilon``
        for the window starting at each step, ``epsilon`` where the step is an episode
        boundary (the learner masks those windows out: they teach nothing). The actor
        has no target network, so its target takes the max of its own network's values,
        as Ape-X's actors do.
    """
    windows = nest.map_structure(
        lambda x: np.stack([x[0, :-1], x[0, 1:]], axis=1), steps)  # [T, 2, ...]
    current, following, valid = to_transition(windows)
    obs = np.asarray(current.observation[:, 0], np.float32)
    next_obs = np.asarray(following.observation[:, 0], np.float32)
    q = q_values(np.concatenate([obs, next_obs]))
    count = len(obs)
    taken = q[np.arange(count), np.asarray(current.action[:, 0], np.int64)]
    target = (np.asarray(current.reward[:, 0], np.float64) + gamma
              * np.asarray(current.discount[:, 0], np.float64) * q[count:].max(1))
    td = np.abs(target - taken) * np.asarray(valid[:, 0], np.float64)
    out: np.ndarray = td + epsilon
    return out


def importance_weights(probabilities: np.ndarray, beta: float) -> np.ndarray:
    """float32 ``[S]`` importance weights ``(P_min / P) ** beta`` of a batch drawn with
    probabilities ``[S]`` (over the whole buffer), so the batch's largest is 1 (as a
    :class:`~replaybuffer.PrioritizedReplayBuffer` normalises them)."""
    p = np.asarray(probabilities, np.float64)
    out: np.ndarray = np.power(p.min() / p, beta).astype(np.float32)
    return out


def annealed_beta(beta: float, done: int, total: int) -> float:
    """``beta`` annealed linearly to 1 over ``total`` gradient steps, ``done`` of them
    done (as the single-process demo's buffer anneals it)."""
    return beta + (1.0 - beta) * min(1.0, done / max(1, total))
