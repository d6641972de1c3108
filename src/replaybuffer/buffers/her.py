"""Hindsight experience replay (HER, Andrychowicz et al. 2017) for goal-conditioned envs.

Goal-conditioned environments observe a dict with ``observation``, ``achieved_goal`` and
``desired_goal`` and score any goal with ``compute_reward(achieved_goal, desired_goal,
info)``. A :class:`HERBuffer` stores their transitions in a
:class:`~replaybuffer.TransitionReplayBuffer` (observations stored once, exact next
observations at episode ends, one ring row per env of a vector env) and, when sampling,
replaces the desired goal of a share ``1 - 1 / (n_sampled_goal + 1)`` of the batch by a
goal the agent achieved later, recomputing those rewards in one vectorised
``compute_reward`` call.

Goal selection strategies, for a sampled transition ``t`` of an episode whose
retained steps are ``s .. e`` (goals are achieved goals of *next* observations, so the
goal of step ``j`` is what the agent reached by acting at ``j``):

* ``"final"``: the goal of ``e``, the episode's last step;
* ``"future"``: the goal of a step drawn uniformly from ``t .. e``;
* ``"episode"``: the goal of a step drawn uniformly from ``s .. e``.

Only transitions of *completed* episodes are sampled, so the goals always exist and
always come from the transition's own episode, whatever the ring has overwritten (the
steps from ``t`` to the episode's end are newer than ``t``, so they are retained).
Each env row keeps its own episode bookkeeping (two int64 per stored step and one per
env), so vector envs work. An add whose observation is not its row's previous next
observation (an env reset that no ``terminated``/``truncated`` reported) ends the
episode in progress there at the previous step; :meth:`HERBuffer.end_episodes` ends
them all on request. Vector envs must report each episode's true final
observation as the ``next_observation`` of its last step (gymnasium's
``AutoresetMode.SAME_STEP`` with ``info["final_obs"]``): with ``NEXT_STEP`` autoreset,
the reset step is not a transition and must not be added.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any, Callable, Literal, NamedTuple, overload

import numpy as np

from replaybuffer.rate_limiter import RateLimiter
from replaybuffer.protocols import BufferInfo
from replaybuffer import nest
from replaybuffer.buffers.side_observations import rows_differ
from replaybuffer.buffers.transition_fields import OBS, Transitions
from replaybuffer.buffers.transitions import TransitionReplayBuffer
from replaybuffer.errors import EmptyBufferError, SpecError
from replaybuffer.sampling.sampler import make_rng
from replaybuffer.specs import ArraySpec, as_data_spec
from replaybuffer.storage.base import to_numpy
from replaybuffer.storage.frozen import FrozenRows

if TYPE_CHECKING:
    from typing_extensions import Self

FINAL, FUTURE, EPISODE = "final", "future", "episode"
STRATEGIES = (FINAL, FUTURE, EPISODE)
GOAL_KEYS = ("observation", "achieved_goal", "desired_goal")


class HERTransitions(NamedTuple):
    """A sampled batch, as :class:`~replaybuffer.Transitions` plus ``relabelled``.

    Attributes:
        observations, next_observations: dicts with ``observation``, ``achieved_goal``
            and ``desired_goal`` (``[S, ...]``); a relabelled transition carries its new
            goal as ``desired_goal`` in both.
        actions: ``[S, ...]`` as the action spec.
        rewards: float32 ``[S]``: ``compute_reward`` of the relabelled goal, the stored
            reward otherwise.
        terminated, truncated, dones: bool ``[S]``, as stored (not recomputed).
        discounts: float32 ``[S]``: ``gamma``, or 0 after termination.
        relabelled: bool ``[S]``, true for the first ``int(S * her_ratio)`` samples.
    """

    observations: Any
    actions: Any
    rewards: Any
    next_observations: Any
    terminated: Any
    truncated: Any
    dones: Any
    discounts: Any
    relabelled: Any


def parse_goal_selection_strategy(strategy: Any) -> str:
    """``"final"``, ``"future"`` or ``"episode"`` from a string (any case) or an enum
    whose value is one of them; ``ValueError`` for anything else."""
    value = strategy.value if isinstance(strategy, Enum) else strategy
    if isinstance(value, str) and value.lower() in STRATEGIES:
        return value.lower()
    raise ValueError(f"unknown goal_selection_strategy {strategy!r}; expected one of "
                     f"{STRATEGIES}")


def compute_reward_of(env: Any) -> Callable[[Any, Any, Any], Any]:
    """The vectorised ``compute_reward(achieved_goal, desired_goal, info)`` of a
    goal-conditioned gymnasium env or synchronous vector env."""
    import gymnasium as gym

    target = env
    if isinstance(env, gym.vector.VectorEnv):
        envs = getattr(env, "envs", None)  # SyncVectorEnv; async envs live elsewhere
        if not envs:
            raise ValueError(f"cannot reach compute_reward of {type(env).__name__}: pass "
                             "compute_reward= (a vectorised function of one env)")
        target = envs[0]
    fn = getattr(getattr(target, "unwrapped", target), "compute_reward", None)
    if not callable(fn):
        raise ValueError(f"{type(target).__name__} has no compute_reward(achieved_goal, "
                         "desired_goal, info): HER needs a goal-conditioned env, or pass "
                         "compute_reward=")
    compute_reward: Callable[[Any, Any, Any], Any] = fn
    return compute_reward


class HERBuffer(TransitionReplayBuffer):
    """Transition replay with hindsight goal relabelling.

    Args:
        observation_spec: a dict spec (or gymnasium ``Dict`` space) with keys
            ``observation``, ``achieved_goal`` and ``desired_goal``; the two goals are
            single leaves of one shape and dtype.
        action_spec: spec (or space) of one env's action.
        capacity: transitions held over all envs.
        compute_reward: ``compute_reward(achieved_goal [K, ...], desired_goal [K, ...],
            info)`` returning ``K`` rewards (called with ``info={}``, once per sample).
            Required before sampling relabelled goals; ``from_env`` takes the env's.
            A save holds no function: set ``compute_reward`` on a loaded buffer again.
        goal_selection_strategy: ``"final"``, ``"future"`` (default) or ``"episode"``.
        n_sampled_goal: relabelled goals per real one: ``her_ratio = 1 - 1/(n + 1)``
            of each batch is relabelled (0 turns HER off).
        num_envs, gamma, storage, device, seed, memory, rate_limiter: as for
            :class:`~replaybuffer.TransitionReplayBuffer`.

    Raises:
        ValueError: an unknown strategy or a negative ``n_sampled_goal``.
        SpecError: an observation spec that is not such a dict.
    """

    def __init__(self, observation_spec: Any, action_spec: Any, capacity: int, *,
                 compute_reward: Callable[[Any, Any, Any], Any] | None = None,
                 goal_selection_strategy: Any = FUTURE, n_sampled_goal: int = 4,
                 num_envs: int = 1, gamma: float = 0.99, storage: str = "numpy",
                 device: Any = None, seed: int | None = None, memory: str = "warn",
                 rate_limiter: RateLimiter | None = None):
        strategy = parse_goal_selection_strategy(goal_selection_strategy)
        if isinstance(n_sampled_goal, bool) or not isinstance(n_sampled_goal, (int, np.integer)) \
                or n_sampled_goal < 0:
            raise ValueError(f"n_sampled_goal must be an int >= 0, got {n_sampled_goal!r}")
        obs_spec = as_data_spec(observation_spec)
        _check_goal_spec(obs_spec)
        super().__init__(obs_spec, action_spec, capacity, num_envs=num_envs, gamma=gamma,
                         storage=storage, device=device, seed=seed, memory=memory,
                         rate_limiter=rate_limiter)
        self.compute_reward = compute_reward
        self.goal_selection_strategy = strategy
        self.n_sampled_goal = int(n_sampled_goal)
        self.her_ratio = 1.0 - 1.0 / (self.n_sampled_goal + 1)
        self._config_values.pop("n_step")
        self._config_values.update(goal_selection_strategy=strategy,
                                   n_sampled_goal=self.n_sampled_goal)
        obs_paths = [self._paths[i] for i in self._obs_leaves]
        self._achieved = obs_paths.index(f"['{OBS}']['achieved_goal']")
        self._desired = obs_paths.index(f"['{OBS}']['desired_goal']")
        self._rng = make_rng(seed)  # draws which transitions and goals (the sampler's is unused)
        positions = self._ring.capacity
        # Per storage position: the id of its episode's first step, and of its last one
        # (-1 while the episode goes on). Per env: where the current episode began.
        self._episode_start = np.zeros(positions, np.int64)
        self._episode_end = np.full(positions, -1, np.int64)
        self._current_start = np.zeros(self.num_envs, np.int64)
        # _written marks every step through memoryviews of these (a slice assignment
        # of one costs a fraction of numpy's).
        self._episode_starts, self._episode_ends, self._current_starts, self._no_ends_yet = (
            a.data for a in (self._episode_start, self._episode_end, self._current_start,
                             np.full(self.num_envs, -1, np.int64)))

    @classmethod
    def from_env(cls, env: Any, capacity: int, **kwargs: Any) -> Self:
        """A buffer shaped by a goal-conditioned env or vector env, with its
        ``compute_reward`` (unless given)."""
        if kwargs.get("compute_reward") is None:
            kwargs["compute_reward"] = compute_reward_of(env)
        return super().from_env(env, capacity, **kwargs)

    @property
    def nbytes(self) -> int:
        return super().nbytes + self._episode_start.nbytes + self._episode_end.nbytes

    # ---------------------------------------------------------------- writing
    def _keep_previous_next(self, host: list[np.ndarray]) -> None:
        # A row whose observation is not its previous next observation starts a new
        # episode (a reset that was not reported: a new learn() call, a reloaded
        # buffer): close the one in progress there, so no goal crosses into it. Only
        # the general path gets here (add's shortcut takes steps that follow on).
        cut = np.zeros(self.num_envs, bool)
        for i, head in zip(self._obs_leaves, self._head_next):
            cut |= rows_differ(host[i], head)
        self._close_episodes(cut & (self._current_start <= self._ring.last_id))
        super()._keep_previous_next(host)

    def _written(self, start: int, ended: np.ndarray | None) -> None:
        # Every step of a row belongs to the episode in progress there; the episodes
        # that ended with it become samplable. Both add paths come here, so the
        # shortcut serves goal-conditioned steps too.
        stop = start + self._ring.batch_size
        self._episode_starts[start:stop] = self._current_starts
        self._episode_ends[start:stop] = self._no_ends_yet
        if ended is not None:
            self._close_episodes(ended)

    def _close_episodes(self, rows: np.ndarray) -> None:
        """End at the newest step the episodes in progress in ``rows`` (bool
        ``[num_envs]``): their retained steps become samplable."""
        ring = self._ring
        step = ring.last_id
        for row in np.flatnonzero(rows):  # mark the retained steps of each ended episode
            first = max(int(self._current_start[row]), ring.oldest_id)
            ids = np.arange(first, step + 1, dtype=np.int64)
            self._episode_end[ring.positions(ids, row)] = step
        self._current_start[rows] = step + 1

    def end_episodes(self) -> int:
        """End every env's episode in progress at its newest step, as if it had been
        truncated there (stored ``terminated``/``truncated`` flags are left as added, so
        its last transition still bootstraps from its exact next observation). Its
        steps can then be sampled and relabelled; the next add starts a new episode.

        Returns:
            How many envs had an episode in progress.
        """
        with self._lock:
            in_progress = self._current_start <= self._ring.last_id
            self._close_episodes(in_progress)
            return int(np.count_nonzero(in_progress))

    # ---------------------------------------------------------------- reading
    def completed(self) -> int:
        """Stored transitions of completed episodes: those :meth:`sample` draws from."""
        with self._lock:
            return int(self._completed_per_row().sum())

    def _completed_per_row(self) -> np.ndarray:
        # A row's steps from its current episode's start on are in progress: a suffix.
        return np.maximum(self._current_start - self._ring.oldest_id, 0)

    # Samples are HERTransitions (Transitions plus ``relabelled``), not Transitions.
    @overload  # type: ignore[override]
    def sample(self, batch_size: int, *, timeout: float | None = None,
               block: Literal[True] = True) -> tuple[HERTransitions, BufferInfo]: ...

    @overload
    def sample(self, batch_size: int, *, timeout: float | None = None, block: bool = True
               ) -> tuple[HERTransitions, BufferInfo] | None: ...

    def sample(self, batch_size: int, *, timeout: float | None = None, block: bool = True
               ) -> tuple[HERTransitions, BufferInfo] | None:
        """``batch_size`` transitions drawn uniformly from completed episodes (with
        replacement); the first ``int(batch_size * her_ratio)`` are relabelled.

        Returns:
            ``(HERTransitions, BufferInfo)``; ``info.ids`` are the transitions' step ids,
            ``info.probabilities`` ``1 / completed()``.

        Raises:
            EmptyBufferError: no episode has completed (in the retained steps).
            ValueError: relabelling is due and ``compute_reward`` was not given.
            RateLimitedError: a :attr:`rate_limiter` held the sample back ``timeout``
                seconds (``block=False``: ``None`` is returned at once instead).
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or \
                batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        k = int(batch_size * self.her_ratio)
        if k and self.compute_reward is None:
            raise ValueError("HERBuffer needs compute_reward to relabel goals: pass it to the "
                             "constructor or set buffer.compute_reward")
        with self._lock:
            if self._limiter is not None and not self._admit_sample(int(batch_size), timeout,
                                                                    block):
                return None
            ring = self._ring
            if ring.last_id < 0:
                raise self.empty_error()
            counts = self._completed_per_row()
            n = int(counts.sum())
            if n == 0:
                raise EmptyBufferError(
                    f"{type(self).__name__} holds no completed episode: HER samples only "
                    "transitions whose episode has ended. Make sure to add whole episodes "
                    "before sampling the buffer.")
            draws = self._rng.integers(0, n, batch_size)
            cumulative = np.cumsum(counts)
            rows = np.searchsorted(cumulative, draws, side="right")
            ids = ring.oldest_id + draws - (cumulative[rows] - counts[rows])
            positions = ring.positions(ids, rows)
            stored = self._read(ids, positions)
            goals = None
            if k:
                goal_ids = self._goal_ids(ids[:k], positions[:k])
                goals = to_numpy(self._next_observations(ring.positions(goal_ids, rows[:k]),
                                                          goal_ids)[self._achieved])
            if self._limiter is not None:
                self._limiter.sampled(int(batch_size))
        batch = self._relabel(stored, k, goals)
        probabilities = np.full(batch_size, 1.0 / n, np.float32)
        to_backend = self._storage.from_numpy
        return batch, BufferInfo(to_backend(ids), to_backend(probabilities))

    def _goal_ids(self, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Step ids whose next achieved goal relabels the transitions at ``ids``."""
        ends: np.ndarray = self._episode_end[positions]
        if self.goal_selection_strategy == FINAL:
            return ends
        if self.goal_selection_strategy == FUTURE:
            lo = ids
        else:  # EPISODE: the episode's retained steps only
            lo = np.maximum(self._episode_start[positions], self._ring.oldest_id)
        goal_ids: np.ndarray = self._rng.integers(lo, ends + 1)
        return goal_ids

    def _relabel(self, batch: Transitions, k: int, goals: np.ndarray | None
                 ) -> HERTransitions:
        """Put ``goals`` in the first ``k`` transitions and recompute their rewards."""
        size = len(to_numpy(batch.rewards))
        to_backend = self._storage.from_numpy
        relabelled = to_backend(np.arange(size) < k)
        if not k:
            return HERTransitions(*batch, relabelled=relabelled)
        achieved = to_numpy(batch.next_observations["achieved_goal"])[:k]
        compute_reward = self.compute_reward
        assert compute_reward is not None  # sample() checked
        rewards = np.asarray(compute_reward(achieved, goals, {}), np.float32)
        if rewards.size != k:
            raise ValueError(f"compute_reward returned {rewards.size} rewards for a batch of "
                             f"{k} goals; it must be vectorised over the leading axis")
        all_rewards = to_numpy(batch.rewards).copy()
        all_rewards[:k] = rewards.reshape(k)

        def with_goal(obs: dict[str, Any]) -> dict[str, Any]:
            desired = to_numpy(obs["desired_goal"]).copy()
            desired[:k] = goals
            return {**obs, "desired_goal": to_backend(desired)}

        return HERTransitions(with_goal(batch.observations), batch.actions,
                              to_backend(all_rewards), with_goal(batch.next_observations),
                              batch.terminated, batch.truncated, batch.dones,
                              batch.discounts, relabelled)

    def last_completed(self, count: int) -> Any:
        """The last ``count`` transitions of each env's most recent completed episodes,
        oldest first, as stored (not relabelled): ``[num_envs, count, ...]`` leaves
        (``[count, ...]`` for one env).

        Raises:
            EmptyBufferError: an env holds fewer than ``count`` transitions of completed
                episodes.
        """
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
            raise ValueError(f"count must be a positive int, got {count!r}")
        with self._lock:
            ring = self._ring
            held = self._completed_per_row()
            if ring.last_id < 0 or held.min() < count:
                raise EmptyBufferError(
                    f"last_completed({count}) asks for more transitions than each env holds "
                    f"in completed episodes ({held.tolist()})")
            ids = (self._current_start - count)[:, None] + np.arange(count, dtype=np.int64)
            rows = np.arange(self.num_envs, dtype=np.int64)[:, None]
            batch = self._read(ids, ring.positions(ids, rows))
        return batch if self.num_envs > 1 else nest.map_structure(lambda x: x[0], batch)

    def next_achieved_goals(self) -> np.ndarray:
        """The achieved goal of each stored step's next observation, by storage position
        (step ``t`` of env ``e`` at ``t % max_length * num_envs + e``): a numpy copy
        ``[capacity, *goal_shape]``, zeros where nothing is stored."""
        spec = self._obs_specs[self._achieved]
        out = np.zeros((self._ring.capacity,) + spec.shape, spec.dtype)
        with self._lock:
            ring = self._ring
            if ring.last_id >= 0:
                ids = np.arange(ring.oldest_id, ring.last_id + 1, dtype=np.int64)
                positions = ring.positions(ids[:, None], np.arange(self.num_envs)[None, :])
                goals = self._next_observations(positions.ravel(),
                                                np.repeat(ids, self.num_envs))[self._achieved]
                out[positions.ravel()] = to_numpy(goals)
        return out

    def _clear_state(self) -> None:
        super()._clear_state()
        self._episode_end[:] = -1
        self._current_start[:] = 0

    def _reseed_own(self, seed: int) -> None:
        self._rng = make_rng(seed)  # as a buffer built with seed=seed draws its own

    # ---------------------------------------------------------------- persistence
    def snapshot(self) -> tuple[dict[str, Any], dict[str, FrozenRows]]:
        state, arrays = super().snapshot()
        state["her"] = {"episode_start": self._episode_start.copy(),
                        "episode_end": self._episode_end.copy(),
                        "current_start": self._current_start.copy(),
                        "rng": self._rng.bit_generator.state}
        return state, arrays

    def _restore_own_parts(self, state: dict[str, Any]) -> None:
        super()._restore_own_parts(state)
        her = state["her"]
        self._episode_start[:] = her["episode_start"]
        self._episode_end[:] = her["episode_end"]
        self._current_start[:] = her["current_start"]
        self._rng.bit_generator.state = her["rng"]


def _check_goal_spec(spec: Any) -> None:
    if not isinstance(spec, dict) or set(spec) != set(GOAL_KEYS):
        keys = sorted(spec) if isinstance(spec, dict) else type(spec).__name__
        raise SpecError(f"HERBuffer needs a dict observation with keys {list(GOAL_KEYS)} "
                        f"(a goal-conditioned env), got {keys}")
    achieved, desired = spec["achieved_goal"], spec["desired_goal"]
    if not (isinstance(achieved, ArraySpec) and isinstance(desired, ArraySpec)):
        raise SpecError("achieved_goal and desired_goal must be single arrays")
    if achieved.shape != desired.shape or achieved.dtype != desired.dtype:
        raise SpecError(f"achieved_goal {achieved.shape} {achieved.dtype.name} and desired_goal "
                        f"{desired.shape} {desired.dtype.name} must have one shape and dtype: "
                        "a relabelled goal is an achieved goal")
