"""Pearl's (``pearll.buffers`` v0.4.1) buffer names over replaybuffer's buffers.

Code written for Pearl ports by changing its imports and moving to gymnasium's API::

    from replaybuffer.compat.pearl import ReplayBuffer, Trajectories

    buffer = ReplayBuffer(env=env, buffer_size=10_000)         # env: gymnasium (vector) env
    obs, _ = env.reset()
    next_obs, reward, terminated, truncated, _ = env.step(action)
    buffer.add_trajectory(obs, action, reward, next_obs, terminated, truncated)
    batch = buffer.sample(batch_size=64)                       # Trajectories of tensors

Every class here is a thin adapter: it holds a replaybuffer buffer (``.core``: a
:class:`~replaybuffer.TransitionReplayBuffer`, :class:`~replaybuffer.RolloutBuffer` or
:class:`~replaybuffer.HERBuffer`), shapes its inputs and outputs the way Pearl did, and
stores nothing itself. ``buffer_size`` counts Pearl's rows: the core holds
``buffer_size * num_envs`` transitions, and the memory it needs is checked when it is
built. Outputs keep Pearl's shapes: a leading env axis for vector envs
(``[num_envs, batch, ...]``), and a trailing axis of 1 for scalar fields (rewards, dones,
discrete actions). ``dtype`` defaults to ``"torch"`` as in Pearl (tensors on ``device``,
``"auto"``: CUDA when available), so ported agents keep receiving tensors; pass
``dtype="numpy"`` for arrays.

Differences from Pearl, each on purpose:

* gymnasium's API. ``add_trajectory(obs, action, reward, next_obs, done, truncated=False)``
  takes gymnasium's ``terminated`` as ``done`` and an optional ``truncated``. In outputs,
  ``dones`` is 1 where the episode *terminated* only: a time-limit truncation keeps
  ``done=0`` so that ``r + gamma * (1 - done) * V(next_obs)`` bootstraps, and its
  ``next_observations`` is the true final observation. Passing
  ``done=terminated or truncated`` gives Pearl's behaviour.
* Exact next observations. Pearl's ``ReplayBuffer`` and ``HERBuffer`` returned the next
  episode's first observation as the next observation of a terminal transition (and
  any earlier ``next_obs`` of non-sequential adds was silently replaced); here every
  ``next_observations`` is the one that was added, with observations still stored once.
* The newest ``next_obs`` does not overwrite the oldest observation. Pearl's
  ``ReplayBuffer`` lost its oldest slot once full (its raw ``observations`` became
  ``[next_obs[4], next_obs[0..3]]`` after 5 adds into 5 slots) and never sampled it; here
  ``observations`` holds each step's own observation, all ``buffer_size`` transitions
  are sampled, and ``last(buffer_size)`` works.
* ``last(k)`` returns the ``k`` most recent transitions, oldest first, for any ``k`` up
  to what is stored. Asking for more raises ``EmptyBufferError`` (a ``ValueError``)
  instead of ``AssertionError`` (Pearl refused ``k >= buffer_size`` for the replay buffer
  and returned rows of zeros for ``k > pos`` on a buffer that had not wrapped).
* ``all()`` returns every stored transition, oldest first, every field the same length,
  also after the ring wrapped (Pearl's ``next_observations`` was one longer than the
  rest, empty when ``pos + 1 == buffer_size``, and a wrapped buffer returned only what
  was written since the wrap). On an empty buffer (after ``reset()``, say) ``all()``
  and ``last(k)`` return no rows with the right trailing shapes and dtypes, as Pearl's
  slices of an empty range did.
* Runs of consecutive steps (``last``, ``all``, ``RolloutBuffer.sample``) are views, as
  Pearl's were, but of a cache of the recent steps laid out as Pearl returns them (each
  step copied in once, with its exact next observation, when a read first needs it),
  not of the ring: what a read returned never changes, also when later adds wrap the
  ring or end episodes (Pearl's views did). Numpy outputs are read-only; tensors
  share the cache's memory, so clone one before changing it in place (later reads
  return the same rows). Vector envs' ``[num_envs, k, ...]`` outputs are strided
  (not contiguous), as Pearl's ``swapaxes`` made them. The cache holds about 1.25
  times the longest run asked for (``all`` and ``RolloutBuffer.sample``: the whole
  buffer) with two observations per transition. ``ReplayBuffer.sample`` gathers
  fresh contiguous copies.
* ``flatten_env=True`` counts transitions: ``sample(b, flatten_env=True)`` draws exactly
  ``b`` transitions over every (step, env) pair, ``last(k, flatten_env=True)`` gives
  the ``k`` most recent in time-major order, ``all`` keeps everything.
  ``_flatten_env_axis`` reshapes ``[T, num_envs, ...]`` to ``[T * num_envs, ...]``
  without dropping rows (Pearl kept only the last ``T // num_envs`` rows).
* ``RolloutBuffer.sample(k)`` returns ``k`` consecutive transitions in chronological
  order, never straddling the write head (Pearl's block was in storage order once full),
  and raises ``EmptyBufferError`` rather than ``AssertionError`` when ``k`` exceeds what
  is stored. ``add_trajectory`` also takes ``value=`` and ``log_prob=``, and
  ``buffer.core`` computes GAE and minibatches.
* Sampling an empty buffer raises ``EmptyBufferError`` (a ``ValueError``, as Pearl's
  numpy error was) with a message that says so. Bad input (an action outside its
  space, a wrong shape, a batch that is not ``num_envs`` long) raises ``SpecError``
  and writes nothing.
* ``reset()`` empties the buffer and zeroes its arrays (as Pearl's), and keeps HER's
  bookkeeping in int64: Pearl's ``HERBuffer.reset`` reallocated it as int8, which
  overflowed beyond 127 slots or episodes.
* Random draws use the buffer's own generator (``seed=``), not numpy's global state.
* Buffers save and load (Pearl's did not): ``buffer.save(dir)`` and
  ``ReplayBuffer.load(dir, env)`` (likewise ``RolloutBuffer``, ``HERBuffer``), no pickle;
  the restored buffer continues exactly as the saved one would have.
* The memory check warns (``ResourceWarning``) as Pearl's did; ``memory="strict"``
  raises ``InsufficientMemoryError`` instead.
* HER: vector envs work (each env's episodes are tracked separately); goals are shaped
  by the ``achieved_goal``/``desired_goal`` spaces (Pearl assumed the observation's
  shape); the ``"episode"`` strategy is implemented (Pearl raised at sample time); an
  unknown strategy raises ``ValueError`` at construction; only transitions of completed
  episodes are sampled, also once the buffer is full (Pearl then sampled in-progress
  transitions and the stale slot ``pos``); a relabelled goal always comes from the
  transition's own episode (Pearl's "future" fell back to "final" for the whole batch
  when any episode wrapped the buffer's end). As in Pearl, the first
  ``int(batch_size * her_ratio)`` samples are relabelled, their rewards are
  ``compute_reward(next_achieved_goal, goal, {})`` in one call, dones are not
  recomputed, and observations are dicts of ``observation`` and ``desired_goal``.
  ``sample`` ignores ``flatten_env`` (samples are ``[batch_size, ...]`` over all envs).
  ``last(k)`` returns the last ``k`` transitions of each env's last completed episode
  *as stored* (Pearl relabelled part of them with random goals), and ``last``/``all``
  honour ``dtype`` (Pearl's always returned numpy).

The modules: :mod:`~replaybuffer.compat.pearl.trajectories` (Pearl's types),
:mod:`~replaybuffer.compat.pearl.base` (:class:`BaseBuffer`),
:mod:`~replaybuffer.compat.pearl.inputs` (adds), :mod:`~replaybuffer.compat.pearl.outputs`
(reads shaped as Pearl's) and :mod:`~replaybuffer.compat.pearl.buffers` (the three
buffers). The core does the work: the fast add is the core's one-call adder
(``TransitionReplayBuffer.step_adder``), and the fast reads are the core's
(``TransitionReplayBuffer.flat_reads``: gathers, and the cache of recent steps).
"""

from __future__ import annotations

from replaybuffer.compat.pearl.base import BaseBuffer
from replaybuffer.compat.pearl.buffers import HERBuffer, ReplayBuffer, RolloutBuffer
from replaybuffer.compat.pearl.trajectories import (DictTrajectories, GoalSelectionStrategy,
                                                    Observation, Tensor, Trajectories,
                                                    TrajectoryType, get_space_shape)

__all__ = ["BaseBuffer", "DictTrajectories", "GoalSelectionStrategy", "HERBuffer",
           "Observation", "ReplayBuffer", "RolloutBuffer", "Tensor", "Trajectories",
           "TrajectoryType", "get_space_shape"]
