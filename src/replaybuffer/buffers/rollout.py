"""On-policy rollouts: transitions with values and log-probabilities, GAE, minibatches.

A :class:`RolloutBuffer` is a :class:`~replaybuffer.TransitionReplayBuffer` (the same ring
of ``num_envs`` rows, observations stored once, exact next observations at episode ends)
whose steps also carry the policy's ``value`` ``V(observation_t)`` and ``log_prob``
``log pi(action_t | observation_t)``. After a rollout:

* :meth:`RolloutBuffer.compute_returns_and_advantages` computes generalised advantage
  estimates (GAE, Schulman et al. 2016) per env, oldest step first::

      delta_t = reward_t + gamma * V(next_observation_t) * (1 - terminated_t) - value_t
      A_t     = delta_t + gamma * lambda * A_{t+1}   (only while the episode goes on)
      R_t     = A_t + value_t

  A terminated step does not bootstrap. A step whose next observation is not the next
  stored step's observation (a truncated episode end, or an out-of-sequence add)
  bootstraps from ``V`` of its *true* next observation, which the buffer kept: those
  observations are handed to ``value_fn`` in one batch. The newest step of each env
  bootstraps from ``last_values`` unless its episode ended.
* :meth:`RolloutBuffer.minibatches` yields shuffled minibatches over several epochs; every
  stored transition is in exactly one minibatch per epoch.
* :meth:`RolloutBuffer.reset` empties the buffer for the next rollout.

The values and log-probabilities are stored as extra leaves of the action nest of the
underlying transition buffer (``{"action", "value", "log_prob"}``), so rollouts use the
same storage, validation, ring and persistence as every other buffer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal, NamedTuple, overload

import numpy as np

from replaybuffer.rate_limiter import RateLimiter
from replaybuffer.protocols import BufferInfo
from replaybuffer import nest
from replaybuffer.buffers.gae import generalized_advantages
from replaybuffer.buffers.transition_add import SINGLE_FLAGS, single_reward
from replaybuffer.buffers.transition_fields import ACTION, REWARD, TERMINATED, TRUNCATED
from replaybuffer.buffers.transitions import TransitionReplayBuffer
from replaybuffer.errors import SpecError
from replaybuffer.sampling.sampler import make_rng
from replaybuffer.specs import ArraySpec, as_data_spec, as_leaf_array
from replaybuffer.storage.base import to_numpy
from replaybuffer.storage.frozen import FrozenRows

VALUE, LOG_PROB = "value", "log_prob"
_FLOAT32 = np.dtype(np.float32)
_ZERO = 0.0  # add_single's default value and log_prob (packed as float32)

# Paths of the wrapped action nest as users see them (they never see the wrapping).
_PUBLIC_PATHS = ((f"['{ACTION}']['{ACTION}']", f"['{ACTION}']"),
                 (f"['{ACTION}']['{VALUE}']", f"['{VALUE}']"),
                 (f"['{ACTION}']['{LOG_PROB}']", f"['{LOG_PROB}']"))


class RolloutBatch(NamedTuple):
    """Rollout transitions; every field has the read's leading dims (``[S]``,
    ``[num_envs, T]`` or ``[T]``).

    Attributes:
        observations, actions, next_observations: nests as the specs.
        rewards, values, log_probs: float32.
        terminated, truncated, dones: bool (``dones = terminated | truncated``).
        returns, advantages: float32 from the last
            :meth:`RolloutBuffer.compute_returns_and_advantages`; ``None`` when they
            have not been computed since the buffer last changed.
    """

    observations: Any
    actions: Any
    rewards: Any
    next_observations: Any
    terminated: Any
    truncated: Any
    dones: Any
    values: Any
    log_probs: Any
    returns: Any
    advantages: Any


class RolloutBuffer(TransitionReplayBuffer):
    """Transitions of on-policy rollouts, with GAE and shuffled minibatches.

    Args:
        observation_spec, action_spec: specs (or gymnasium spaces) of one environment's
            observation and action.
        capacity: transitions held over all environments (a rollout of ``T`` steps of
            ``num_envs`` envs needs ``T * num_envs``); older steps are overwritten.
        num_envs: environments per add.
        storage, device, seed, memory, rate_limiter: as for
            :class:`~replaybuffer.TransitionReplayBuffer`
            (``seed`` also seeds the minibatch shuffles).
    """

    _serves_flat_reads = True  # its reads' transition fields are the base class's
    _adds_policy = True  # step_adder's adds take value and log_prob

    def __init__(self, observation_spec: Any, action_spec: Any, capacity: int, *,
                 num_envs: int = 1, storage: str = "numpy", device: Any = None,
                 seed: int | None = None, memory: str = "warn",
                 rate_limiter: RateLimiter | None = None):
        act_spec = as_data_spec(action_spec)
        policy_spec = {ACTION: act_spec, VALUE: ArraySpec((), np.float32, VALUE),
                       LOG_PROB: ArraySpec((), np.float32, LOG_PROB)}
        super().__init__(observation_spec, policy_spec, capacity, num_envs=num_envs,
                         storage=storage, device=device, seed=seed, memory=memory,
                         rate_limiter=rate_limiter)
        self._config_values["action_spec"] = act_spec
        for fixed in ("n_step", "gamma"):  # one-step transitions; GAE takes its own gamma
            self._config_values.pop(fixed)
        self._value = self._paths.index(_PUBLIC_PATHS[1][0])
        positions = self._ring.capacity
        # Derived per step, indexed by storage position like the side-store references.
        self._returns = np.zeros(positions, np.float32)
        self._advantages = np.zeros(positions, np.float32)
        self._gae_ready = False
        self._version = 0  # bumped by every write and clear: stale readers notice
        # The default value and log_prob: one read-only array, since the writers copy
        # it (a fresh np.zeros per add cost ~0.3 us each).
        self._zero_values = np.zeros(self._ring.batch_size, np.float32)
        self._zero_values.flags.writeable = False
        # add's shortcut: the policy's leaves go straight to the fused writer, taken in
        # add's order (observation, action, value, log_prob, reward, terminated,
        # truncated).
        self._use_exact_order({ACTION: {ACTION: 1, VALUE: 2, LOG_PROB: 3}, REWARD: 4,
                               TERMINATED: 5, TRUNCATED: 6})

    @property
    def nbytes(self) -> int:
        return super().nbytes + self._returns.nbytes + self._advantages.nbytes

    # ---------------------------------------------------------------- writing
    # Not a drop-in for TransitionReplayBuffer.add: it takes value and log_prob, and
    # a rollout is collected without a rate limiter (no timeout or block).
    def add(self, observation: Any, action: Any, reward: Any,  # type: ignore[override]
            next_observation: Any, terminated: Any, truncated: Any = None, value: Any = None,
            log_prob: Any = None) -> None:
        """Add one transition per environment.

        Args:
            observation, next_observation: nests of ``[num_envs, ...]`` leaves.
            action: ``[num_envs, ...]`` leaves as the action spec.
            reward, terminated, truncated: ``[num_envs]`` (``truncated`` defaults to
                false).
            value: ``V(observation)`` per env: ``num_envs`` floats in any shape
                (``[num_envs]`` or a critic's ``[num_envs, 1]``, array or tensor).
                Defaults to 0, which makes the returns plain discounted returns.
            log_prob: ``log pi(action | observation)`` per env, as ``value``.

        Raises:
            SpecError: a leaf that does not fit its spec or a batch that is not
                ``num_envs`` long. Nothing is written.
        """
        if self.add_usual(observation, action, reward, next_observation, terminated,
                           truncated, value, log_prob):
            return
        policy = {ACTION: action, VALUE: self._per_env(value, VALUE, "add"),
                  LOG_PROB: self._per_env(log_prob, LOG_PROB, "add")}
        try:
            self._add_general(observation, policy, reward, next_observation, terminated,
                              self._no_truncation if truncated is None else truncated,
                              None, True)
        except SpecError as exc:
            raise SpecError(_public(str(exc))) from None

    def add_usual(self, observation: Any, action: Any, reward: Any,
                   next_observation: Any, terminated: Any, truncated: Any = None,
                   value: Any = None, log_prob: Any = None) -> bool:
        """:meth:`add`'s shortcut alone, as :meth:`TransitionReplayBuffer.add_usual
        <replaybuffer.TransitionReplayBuffer>`; ``value`` and ``log_prob`` as
        :meth:`add` takes them."""
        # The default (None) inline: _per_env's call costs ~0.1 us of a ~3 us add.
        value = self._zero_values if value is None else self._per_env(value, VALUE, "add")
        log_prob = self._zero_values if log_prob is None else \
            self._per_env(log_prob, LOG_PROB, "add")
        if truncated is None:
            truncated = self._no_truncation
        return self._exact_add and self._limiter is None and self._add_exact(
            observation, (observation, action, value, log_prob, reward, terminated,
                          truncated), next_observation, terminated, truncated)

    def add_single(self, observation: np.ndarray, action: Any, reward: Any,
                   next_observation: np.ndarray, terminated: Any, truncated: Any = None,
                   value: Any = None, log_prob: Any = None) -> None:
        """:meth:`add` of one env's transition without the env axis, as
        :meth:`TransitionReplayBuffer.add_single <replaybuffer.TransitionReplayBuffer>`;
        ``value`` and ``log_prob`` Python floats or float32 of shape ``()`` (or ``None``:
        0) for the shortcut, anything :meth:`add` takes otherwise."""
        if truncated is None:
            truncated = SINGLE_FLAGS[0]
        write = self._write_single
        if write is not None and self._exact_add and self._limiter is None and \
                self._add_exact(observation, (
                    observation, action, _ZERO if value is None else value,
                    _ZERO if log_prob is None else log_prob, reward, terminated, truncated),
                    next_observation, terminated, truncated, write):
            return
        self.add(observation[None], action[None], single_reward(reward),
                 next_observation[None], terminated[None], truncated[None], value=value,
                 log_prob=log_prob)

    def _per_env(self, values: Any, name: str, method: str) -> np.ndarray:
        """``num_envs`` float32 values from any array-like holding that many."""
        B = self._ring.batch_size
        if type(values) is not np.ndarray:
            if values is None:
                return self._zero_values
            # A critic's output: a CPU tensor of B values. Read it directly (np.asarray
            # of a tensor goes through __array__, several times slower), and detach only
            # a tensor that needs it (detach() alone costs ~0.3 us).
            if getattr(values, "is_cpu", False) and hasattr(values, "numpy"):
                if getattr(values, "requires_grad", False):
                    values = values.detach()
                values = values.numpy()
        if type(values) is np.ndarray and values.dtype is _FLOAT32 and values.size == B:
            return values if values.shape == self._outer else values.reshape(B)
        if isinstance(values, (list, tuple)):  # plain numbers are unambiguous here
            values = np.asarray(values)
        arr = as_leaf_array(values, f"['{name}']")
        if arr.size != B or arr.dtype.kind not in "fiub":
            raise SpecError(f"{method}: leaf ['{name}']: expected {B} numbers (one per env, "
                            f"[num_envs={B}]), got shape {arr.shape} of {arr.dtype.name}")
        return arr.reshape(B).astype(np.float32, copy=False)

    def _written(self, start: int, ended: np.ndarray | None) -> None:
        self._gae_ready = False
        self._version += 1

    # ---------------------------------------------------------------- GAE
    def compute_returns_and_advantages(
            self, last_values: Any, gamma: float = 0.99, gae_lambda: float = 0.95,
            value_fn: Callable[[Any], Any] | None = None) -> tuple[Any, Any]:
        """Compute and keep the GAE advantages and returns of every stored step.

        Args:
            last_values: ``V`` of each env's current observation (the
                ``next_observation`` of its newest step): ``num_envs`` floats. Used
                for envs whose newest step did not end an episode.
            gamma: discount in ``[0, 1]``.
            gae_lambda: GAE's ``lambda`` in ``[0, 1]`` (1: Monte-Carlo returns
                bootstrapped at the end; 0: one-step TD).
            value_fn: called once with the true next observations of the steps that
                must bootstrap from them (truncated episode ends and out-of-sequence
                adds): a nest of ``[K, ...]`` leaves in the storage's array type;
                returns ``K`` values. Needed only when such steps are stored.

        Returns:
            ``(returns, advantages)``: float32 ``[num_envs, T]`` (``[T]`` for one env),
            oldest step first, as :meth:`all` orders them. Also returned by later
            reads (``returns``/``advantages`` fields) until the buffer changes.

        Raises:
            EmptyBufferError: nothing is stored.
            ValueError: bad ``gamma``/``gae_lambda``, or truncated steps and no
                ``value_fn``.
            RuntimeError: the buffer changed while ``value_fn`` ran.
        """
        for name, x in (("gamma", gamma), ("gae_lambda", gae_lambda)):
            if not 0.0 <= float(x) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {x!r}")
        last_values = self._per_env(last_values, "last_values",
                                    "compute_returns_and_advantages").astype(np.float64)
        B = self.num_envs
        with self._lock:
            ring = self._ring
            if ring.last_id < 0:
                raise self.empty_error(action="computing advantages")
            ids = np.arange(ring.oldest_id, ring.last_id + 1, dtype=np.int64)
            positions = ring.positions(ids[None, :], np.arange(B, dtype=np.int64)[:, None])
            rewards, terminated, truncated, values = (
                to_numpy(a) for a in self._storage.gather(
                    positions, [self._reward, self._terminated, self._truncated,
                                self._value]))
            # Where the next observation is not the next stored step's (an episode end or
            # an out-of-sequence add), the side store holds the true one.
            detached = self._side_ref[positions] >= 0
            bootstrap = detached & ~terminated
            final_obs = None
            if bootstrap.any():
                if value_fn is None:
                    raise ValueError(
                        f"{int(bootstrap.sum())} stored step(s) end by truncation (or were "
                        "added out of sequence) and must bootstrap from V of their true "
                        "next observation: pass value_fn")
                final_obs = self._obs_structure.unflatten(self._next_observations(
                    positions[bootstrap], np.broadcast_to(ids, positions.shape)[bootstrap]))
            version = self._version
        next_values = np.empty(positions.shape, np.float64)
        next_values[:, :-1] = values[:, 1:]
        next_values[:, -1] = last_values
        if final_obs is not None:  # user code runs outside the lock
            assert value_fn is not None  # checked when final_obs was gathered
            boot = to_numpy(value_fn(final_obs)).astype(np.float64)
            if boot.size != int(bootstrap.sum()):
                raise ValueError(f"value_fn returned {boot.size} values for "
                                 f"{int(bootstrap.sum())} observations")
            next_values[bootstrap] = boot.reshape(-1)
        returns, advantages = generalized_advantages(rewards, values, next_values, terminated,
                                                     truncated | detached, gamma, gae_lambda)
        with self._lock:
            if self._version != version:
                raise RuntimeError("the buffer changed while advantages were computed")
            self._returns[positions] = returns
            self._advantages[positions] = advantages
            self._gae_ready = True
        to_backend = self._storage.from_numpy
        if B == 1:
            returns, advantages = returns[0], advantages[0]
        return to_backend(returns), to_backend(advantages)

    # ---------------------------------------------------------------- reading
    def minibatches(self, batch_size: int, epochs: int = 1, *, shuffle: bool = True,
                    seed: int | None = None, drop_last: bool = False
                    ) -> Iterator[RolloutBatch]:
        """Minibatches of every stored transition, ``epochs`` times.

        Each epoch is a permutation of all ``num_envs * T`` transitions (env axis
        flattened) cut into minibatches of ``batch_size`` (the last one shorter unless
        ``drop_last``), so every transition is in exactly one minibatch per epoch.
        Fields are ``[batch_size, ...]``, as numpy arrays or tensors on the storage's
        device.

        The permutations come from a generator spawned (when this is called) from the
        buffer's, whose state a save keeps: ``minibatches()`` on a restored buffer yields
        what it would have yielded on the original. An iterator part-way through is not
        part of the buffer's state: after a restore, call ``minibatches()`` again.

        Args:
            shuffle: ``False`` keeps time-major order (step, then env).
            seed: seeds the permutations; by default they come from the buffer's seed.

        Raises:
            ValueError: advantages were not computed since the buffer last changed
                (call :meth:`compute_returns_and_advantages` first).
            RuntimeError: (while iterating) the buffer changed.
        """
        for name, x in (("batch_size", batch_size), ("epochs", epochs)):
            if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1:
                raise ValueError(f"{name} must be a positive int, got {x!r}")
        with self._lock:
            if not self._gae_ready:
                raise ValueError("returns and advantages are not up to date: call "
                                 "compute_returns_and_advantages(...) after the last add")
            ring = self._ring
            ids = np.repeat(np.arange(ring.oldest_id, ring.last_id + 1, dtype=np.int64),
                            self.num_envs)
            rows = np.tile(np.arange(self.num_envs, dtype=np.int64), ring.items_per_row)
            rng = make_rng(seed) if seed is not None else self._sampler.spawn_rng()
            version = self._version
        return self._minibatches(ids, ring.positions(ids, rows), int(batch_size),
                                 int(epochs), shuffle, drop_last, rng, version)

    def _minibatches(self, ids: np.ndarray, positions: np.ndarray, batch_size: int,
                     epochs: int, shuffle: bool, drop_last: bool, rng: np.random.Generator,
                     version: int) -> Iterator[RolloutBatch]:
        count = len(ids)
        stop = count - count % batch_size if drop_last else count
        for _ in range(epochs):
            order = rng.permutation(count) if shuffle else np.arange(count)
            # One read of the epoch's transitions in minibatch order, then each
            # minibatch is a slice of it (a view): one gather per field per epoch
            # instead of one per minibatch.
            chosen = order[:stop]
            with self._lock:
                if self._version != version:
                    raise _changed_during_minibatches()
                epoch = self._read(ids[chosen], positions[chosen])
            for start in range(0, stop, batch_size):
                with self._lock:
                    if self._version != version:
                        raise _changed_during_minibatches()
                yield RolloutBatch(*(_rows(field, start, start + batch_size)
                                     for field in epoch))

    # Reads return RolloutBatch, not Transitions (see the readers declared below).
    def _read(self, ids: np.ndarray,  # type: ignore[override]
              positions: np.ndarray) -> RolloutBatch:
        t = super()._read(ids, positions)
        policy = t.actions
        returns = advantages = None
        if self._gae_ready:
            to_backend = self._storage.from_numpy
            returns = to_backend(self._returns[positions])
            advantages = to_backend(self._advantages[positions])
        return RolloutBatch(t.observations, policy[ACTION], t.rewards, t.next_observations,
                            t.terminated, t.truncated, t.dones, policy[VALUE],
                            policy[LOG_PROB], returns, advantages)

    if TYPE_CHECKING:
        # The readers inherited from TransitionReplayBuffer return _read's RolloutBatch.
        @overload  # type: ignore[override]
        def sample(self, batch_size: int, *, timeout: float | None = None,
                   block: Literal[True] = True) -> tuple[RolloutBatch, BufferInfo]: ...

        @overload
        def sample(self, batch_size: int, *, timeout: float | None = None,
                   block: bool = True) -> tuple[RolloutBatch, BufferInfo] | None: ...

        def sample(self, batch_size: int, *, timeout: float | None = None,
                   block: bool = True) -> tuple[RolloutBatch, BufferInfo] | None: ...

        def last(self, count: int) -> RolloutBatch: ...  # type: ignore[override]

        def all(self) -> RolloutBatch: ...  # type: ignore[override]

    def reset(self) -> None:
        """Empty the buffer for the next rollout (``clear()``)."""
        self.clear()

    def _clear_state(self) -> None:
        super()._clear_state()
        self._gae_ready = False
        self._version += 1

    # ---------------------------------------------------------------- persistence
    def snapshot(self) -> tuple[dict[str, Any], dict[str, FrozenRows]]:
        state, arrays = super().snapshot()
        state.update(returns=self._returns.copy(), advantages=self._advantages.copy(),
                     gae_ready=self._gae_ready)
        return state, arrays

    def _restore_own_parts(self, state: dict[str, Any]) -> None:
        super()._restore_own_parts(state)
        self._returns[:] = state["returns"]
        self._advantages[:] = state["advantages"]
        self._gae_ready = bool(state["gae_ready"])


def _public(message: str) -> str:
    """An error message with the wrapped action nest's paths as users know them."""
    for internal, public in _PUBLIC_PATHS:
        message = message.replace(internal, public)
    return message


def _rows(field: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of a batch field: an array, a tensor, a nest of them, or None."""
    if field is None:
        return None
    if hasattr(field, "shape"):  # one array or tensor: a view
        return field[start:stop]
    return nest.map_structure(lambda x: x[start:stop], field)


def _changed_during_minibatches() -> RuntimeError:
    return RuntimeError("the buffer changed during minibatches(): collect the next "
                        "rollout after the update")
