"""Lean reads of a transition buffer with one array observation and one array action:
plain numpy arrays of the fields adapters return, without the nests of the general read.

:meth:`replaybuffer.TransitionReplayBuffer.flat_reads` builds a :class:`FlatReads` for
the buffers it serves (numpy storage, one-step transitions, one observation leaf, no
frame stacking, no episode index). Its reads give exactly the bytes of the buffer's
own (``sample``, ``read_steps``, ``last``), which tests/test_compat_pearl_fast.py checks
on random scripts, at a fraction of the cost: random samples gather the leaves asked
for (one ``take`` of the packed records) and the next observations, patching those
that the side store or the newest step's own keep; runs of consecutive steps are views
of a :class:`~replaybuffer.buffers.recent_steps.RecentSteps` cache.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np

from replaybuffer.buffers.recent_steps import NextObservations, RecentSteps

if TYPE_CHECKING:
    from replaybuffer.buffers.transitions import TransitionReplayBuffer
    from replaybuffer.sampling import Ring
    from replaybuffer.storage.numpy_storage import NumpyStorage

Fields = tuple[np.ndarray, ...]
"""Observations, actions, rewards, next observations and terminated flags."""


class FlatReads:
    """Reads of the fields observation, action, reward, next observation and terminated
    as numpy arrays (see the module); built by
    :meth:`~replaybuffer.TransitionReplayBuffer.flat_reads`, which hands it the buffer's
    parts.

    Attributes:
        recent: the cache of recent steps behind ``run``.
        run: :meth:`RecentSteps.run <replaybuffer.buffers.recent_steps.RecentSteps.run>`:
            views of runs of consecutive steps.
        check_held: ``EmptyBufferError`` unless steps ``low..high`` are stored.
        obs_scalar, act_scalar: whether the observation (action) spec is a scalar.
    """

    def __init__(self, core: TransitionReplayBuffer, storage: NumpyStorage, ring: Ring,
                 lock: threading.Lock, next_obs: NextObservations, read: list[int],
                 env_axis: bool):
        """``read``: the storage leaves of the observation, action, reward and
        terminated flag; ``env_axis``: runs carry the env axis."""
        self.core, self.storage, self.ring, self.lock = core, storage, ring, lock
        self.next_obs = next_obs
        self.B = ring.batch_size
        self.rows = np.arange(self.B, dtype=np.int64)
        self.read = read
        self.obs_only = read[:1]
        specs = storage.specs
        self.obs_scalar = specs[read[0]].shape == ()
        self.act_scalar = specs[read[1]].shape == ()
        self.recent = RecentSteps(core, ring, lock, storage.arrays, specs, read, next_obs,
                                  env_axis)
        # run(first, steps, window, writable) -> fields: views of steps
        # first .. first + steps - 1 (first None: the newest; steps None: all stored) of
        # every env, [steps, num_envs, ...] ([steps, ...] without the env axis), scalar
        # observations and actions, rewards and dones (float32) with a trailing axis of
        # 1; read-only unless writable; the cache keeps window steps from now on. The
        # cache's own method (RecentSteps.run), bound: reads of runs cost a few us, and
        # a call through this class would add one.
        self.run = self.recent.run
        self.check_held = self.recent.check_held

    def gather(self, ids: np.ndarray, positions: np.ndarray) -> Fields:
        """The fields of the steps ``ids`` at ``positions`` (``[K]``, or ``[K, num_envs]``
        with ``ids`` ``[K]``; the lock held): fresh arrays ``[*positions.shape, ...]``."""
        next_obs = self.next_obs
        obs, act, rew, term = self.storage.gather(positions, self.read)
        # (a fresh gather: patched in place)
        nxt = self.storage.gather(positions + self.B, self.obs_only)[0]  # gather wraps
        side = next_obs.side_ref.take(positions)
        from_side = side >= 0
        newest = ids == self.ring.last_id
        if np.count_nonzero(newest):
            if newest.shape != positions.shape:  # every env of the newest step
                newest = np.broadcast_to(newest[:, None], positions.shape)
            own = newest & ~from_side
            nxt[own] = next_obs.head[positions[own] % self.B]
        if np.count_nonzero(from_side):
            nxt[from_side] = next_obs.side.take(side[from_side])[0]
        return obs, act, rew, nxt, term

    def sample(self, batch_size: int) -> Fields | None:
        """The buffer's ``sample(batch_size)`` (its sampler, drawing as it does): fields
        ``[batch_size, ...]``; ``None`` where the buffer must do it (a rate limiter, or
        nothing stored)."""
        core, ring = self.core, self.ring
        with self.lock:
            if core.rate_limiter is not None or ring.last_id < 0:
                return None
            (ids, positions), _ = core.sampler.sample(ring, batch_size, 1)
            return self.gather(ids, positions)

    def steps(self, ids: np.ndarray) -> Fields:
        """Steps ``ids`` (``[K]``) of every env: ``[num_envs, K]``, gathered time-major
        (a step's envs are neighbours in storage) and seen env-major through
        ``swapaxes``: strided views.

        Raises:
            EmptyBufferError: a step is not stored (or nothing is).
        """
        ring = self.ring
        positions = (ids % ring.max_length * self.B)[:, None] + self.rows[None, :]
        with self.lock:
            self.check_held(int(ids.min()), int(ids.max()))
            fields = self.gather(ids, positions)
        return tuple(x.swapaxes(0, 1) for x in fields)
