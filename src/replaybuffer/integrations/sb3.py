"""Stable-Baselines3 replay buffers backed by replaybuffer's transition buffers.

Pass a class from here as ``replay_buffer_class`` of an off-policy algorithm (DQN, SAC,
TD3, DDPG); everything else stays as it was::

    from stable_baselines3 import DQN
    from replaybuffer.integrations.sb3 import ReplayBuffer

    model = DQN("MlpPolicy", "CartPole-v1", replay_buffer_class=ReplayBuffer)

* :class:`ReplayBuffer`: uniform replay (SB3's ``ReplayBuffer``/``DictReplayBuffer``/
  ``NStepReplayBuffer`` in one: ``replay_buffer_kwargs={"n_steps": 3, "gamma": 0.99}``
  for n-step returns, ``{"frame_stack": True}`` for stacked image frames).
* :class:`PrioritizedReplayBuffer`: proportional prioritized replay; its samples carry
  importance ``weights`` and ``indices``. :class:`PrioritizedDQN` is SB3's DQN with the
  weights in its loss and ``|TD error| + priority_eps`` fed back as priorities.
* :class:`HerReplayBuffer`: hindsight relabelling for goal envs, in place of SB3's.

Each class subclasses SB3's (so ``load_replay_buffer`` and the algorithms accept it) and
holds one of ours in ``.core`` (a :class:`~replaybuffer.TransitionReplayBuffer`,
:class:`~replaybuffer.PrioritizedTransitionReplayBuffer` or
:class:`~replaybuffer.HERBuffer`), which stores and samples everything; the class only
translates SB3's calls:

* ``__init__(buffer_size, observation_space, action_space, device, n_envs,
  optimize_memory_usage, handle_timeout_termination, **replay_buffer_kwargs)``: a core
  of ``buffer_size // n_envs`` steps per env (as SB3's), one ring row per env.
* ``add(obs, next_obs, action, reward, done, infos)``: ``truncated = done &
  infos[i]["TimeLimit.truncated"]`` and ``terminated = done & ~truncated`` (every done
  is a termination with ``handle_timeout_termination=False``); actions reshaped to
  ``[n_envs, action_dim]`` and Discrete observations to ``[n_envs, 1]`` as SB3 does.
* ``sample(batch_size, env)``: SB3's ``ReplayBufferSamples`` (``DictReplayBufferSamples``
  for Dict observations) of tensors on ``device``: observations ``[B, *obs_shape]`` in the
  space's dtype, actions ``[B, action_dim]`` (float64 stored as float32), ``rewards``
  and ``dones`` float32 ``[B, 1]``, ``dones`` 1 where the episode *terminated* only,
  ``discounts`` ``None`` (float32 ``[B, 1]`` with ``n_steps > 1``). ``env`` (SB3 passes
  its ``VecNormalize``) normalizes observations and rewards at sample time, as SB3's do.
* ``size()``, ``pos``, ``full``, ``buffer_size``, ``n_envs``, ``device`` as SB3's (steps
  per env, write slot, wrapped); ``reset()`` empties the core.
* ``model.save_replay_buffer``/``load_replay_buffer`` pickle: the pickle holds a
  checkpoint of the core (``core.save``'s files, each CRC-checked on load).

Where these differ from SB3's buffers:

* **Exact next observations, observations stored once.** SB3's buffer stores
  ``next_obs`` beside ``obs`` (two copies of every observation). Its
  ``optimize_memory_usage=True`` stores one copy but then reads the next observation
  from the following slot, which at an episode end holds the next episode's first
  observation (DLR-RM/stable-baselines3#934), and it refuses timeout handling, so a
  time-limit truncation neither bootstraps nor sees its final observation. Here each
  observation is stored once and every next observation is exactly the ``next_obs``
  that was added: episode ends (terminated or truncated) keep theirs beside the ring.
  That halves SB3's memory; ``optimize_memory_usage=True`` is refused as pointless.
  (Both buffers take the final observation from the ``next_obs`` SB3's algorithm hands
  them, patched from ``infos[i]["terminal_observation"]``; a VecEnv that does not report
  it leaves the next episode's first observation there for both.)
* **Stacked frames.** ``frame_stack=True`` (an image observation of stacked frames,
  e.g. uint8 ``[4, 84, 84]`` after ``VecFrameStack``; ``stack_axis`` names the stacking
  axis of the observation the buffer sees, 0 after SB3's channel-first transpose) stores
  one frame per transition and rebuilds stacks byte-exact, next observations at
  episode ends included: for 4-frame stacks about 1/8 of SB3's default buffer and 1/4
  of its ``optimize_memory_usage``.
* **terminated vs truncated** are stored apart; ``dones`` in samples is ``terminated``,
  as SB3's is with ``handle_timeout_termination=True``.
* **Adds that do not follow on** (``learn()`` resets the env at every call, with no
  ``done``) keep the previous step's ``next_obs`` and end n-step returns there; in
  :class:`HerReplayBuffer` they also end the episode, so no goal crosses into the next.
* **Checked input.** A wrong shape, a batch that is not ``n_envs`` long, a dtype of
  another kind (a float into an integer space) or a Discrete/MultiDiscrete/MultiBinary
  action outside its space raises :class:`~replaybuffer.SpecError` naming the field,
  what was expected and what came, and nothing is stored (SB3's broadcasts or casts).
  Box actions are not range-checked: SB3 stores them scaled to ``[-1, 1]``.
* **Randomness.** Sampling uses the core's own generator. With ``seed=`` in
  ``replay_buffer_kwargs`` it is seeded with that and nothing else reseeds it but
  :meth:`ReplayBuffer.reseed`. Left ``None``, the buffer follows the algorithm's
  seeding, as SB3's buffers do by drawing from numpy's global generator: its seed is
  drawn from that generator when the buffer is built (after the algorithm's ``seed=``
  has seeded it), and again at the first sample after each ``model.set_random_seed``
  (seen as the new generator that seeds the action space the algorithm handed the
  buffer), so the same seed reproduces a run bit for bit on the CPU. A buffer loaded
  with ``load_replay_buffer`` holds its own copy of the action space: it continues the
  generator it was saved with, and only ``buffer.reseed(seed)`` reseeds it.
* **n-step returns** (SB3 >= 2.7, whose samples have ``discounts``; ``gamma`` in the
  kwargs must be the algorithm's). ``discounts`` is ``gamma ** m`` (``m`` the steps
  summed), 0 where ``dones`` is 1 (SB3 has ``gamma ** m`` there; ``(1 - dones) *
  discounts`` is the same). ``VecNormalize`` scales the summed return: the same as
  SB3's per-step scaling except where ``clip_reward`` clips.
* **HER.** Rewards of relabelled goals come from the env's ``compute_reward`` as SB3
  computes them, with empty info dicts: ``copy_info_dict=True`` is refused (no infos
  are stored). Sampling before any episode completed raises
  :class:`~replaybuffer.EmptyBufferError` (SB3's: ``RuntimeError``). Once the ring
  overwrites the start of a completed episode, SB3 stops sampling the whole episode;
  here its retained steps stay samplable (their goals are later steps, which are
  retained; ``"episode"`` draws from the retained ones). ``truncate_last_trajectory``
  (called by ``load_replay_buffer``) ends the episodes in progress without marking
  their last step done; SB3 marks it done and timed out, which bootstraps the same.
* **Not kept:** SB3's raw arrays (``observations``, ``next_observations``, ``dones``,
  ``timeouts``...) and ``_get_samples(batch_inds)``; read ``core.all()``/``core.last(k)``
  instead. Storage is host RAM (numpy); samples are moved to ``device``.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch as th
import torch.nn.functional as F
from gymnasium import spaces
from stable_baselines3.common.buffers import ReplayBuffer as _SB3ReplayBuffer
from stable_baselines3.common.preprocessing import get_action_dim, get_obs_shape
from stable_baselines3.common.type_aliases import DictReplayBufferSamples, ReplayBufferSamples
from stable_baselines3.common.utils import get_device
from stable_baselines3.common.vec_env import VecNormalize
from stable_baselines3.dqn import DQN
from stable_baselines3.her.goal_selection_strategy import (KEY_TO_GOAL_STRATEGY,
                                                           GoalSelectionStrategy)
from stable_baselines3.her.her_replay_buffer import HerReplayBuffer as _SB3HerReplayBuffer

from replaybuffer.buffers.her import HERBuffer
from replaybuffer.buffers.transitions import (PrioritizedTransitionReplayBuffer,
                                              TransitionReplayBuffer)
from replaybuffer.errors import SpecError
from replaybuffer.integrations import sb3_spaces
from replaybuffer.integrations.sb3_seeding import AlgorithmSeeding
from replaybuffer.persist import load as _load_checkpoint

_HAS_DISCOUNTS = "discounts" in ReplayBufferSamples._fields
"""Whether this SB3's samples carry n-step discounts (2.7 on); before, algorithms use gamma."""

__all__ = ["HerReplayBuffer", "PrioritizedDQN", "PrioritizedReplayBuffer",
           "PrioritizedReplayBufferSamples", "ReplayBuffer"]


class PrioritizedReplayBufferSamples(NamedTuple):
    """SB3's ``ReplayBufferSamples`` fields (observations a dict of tensors for Dict
    spaces) plus what prioritized replay hands the learner.

    Attributes:
        observations, actions, next_observations, dones, rewards, discounts: as in
            :class:`ReplayBuffer`'s samples.
        weights: float32 ``[B, 1]`` importance weights on ``device`` (the batch's
            largest is 1 with ``normalize="batch"``): multiply per-sample losses by them.
        indices: int64 ``[B]`` numpy item ids: pass them back to
            :meth:`PrioritizedReplayBuffer.update_priorities`.
    """

    observations: Any
    actions: th.Tensor
    next_observations: Any
    dones: th.Tensor
    rewards: th.Tensor
    discounts: th.Tensor | None
    weights: th.Tensor
    indices: np.ndarray


class ReplayBuffer(_SB3ReplayBuffer):
    """Uniform replay for SB3's off-policy algorithms, backed by a
    :class:`~replaybuffer.TransitionReplayBuffer` in ``.core`` (see the module docstring
    for how SB3's calls map and what differs).

    Args:
        buffer_size: transitions held over all envs (``buffer_size // n_envs`` per env).
        observation_space: Box, Discrete, MultiDiscrete, MultiBinary or a Dict of them.
        action_space: Box, Discrete, MultiDiscrete or MultiBinary.
        device: torch device of the sampled tensors (``"auto"``: CUDA when available).
        n_envs: environments of the VecEnv (every added leaf is ``[n_envs, ...]``).
        optimize_memory_usage: must be False: observations are always stored once.
        handle_timeout_termination: True (SB3's default): a done with
            ``infos[i]["TimeLimit.truncated"]`` is a truncation, which bootstraps;
            False: every done is a termination.
        n_steps, gamma: n-step returns (SB3's ``NStepReplayBuffer`` keywords).
        frame_stack, stack_axis: store a stacked-frame image observation one frame per
            transition (see the module docstring).
        seed: seeds sampling (None: follow the algorithm's seeding, see the module
            docstring).
        memory: ``"warn"`` or ``"strict"``: what to do when the memory the core needs
            exceeds what is available.

    Raises:
        ValueError: ``optimize_memory_usage=True`` or a bad keyword value.
        SpecError: a space the core cannot store (named).
    """

    core: TransitionReplayBuffer
    _not_pickled: tuple[str, ...] = ("core",)

    def __init__(self, buffer_size: int, observation_space: spaces.Space[Any],
                 action_space: spaces.Space[Any], device: th.device | str = "auto",
                 n_envs: int = 1, optimize_memory_usage: bool = False,
                 handle_timeout_termination: bool = True, *, n_steps: int = 1,
                 gamma: float = 0.99, frame_stack: bool = False, stack_axis: int = 0,
                 seed: int | None = None, memory: str = "warn"):
        # SB3's constructors allocate their arrays; this class keeps none, so it sets
        # the attributes SB3 reads itself. pos and full come from the core.
        if optimize_memory_usage:
            raise ValueError(
                f"optimize_memory_usage: expected False, got {optimize_memory_usage!r}. "
                f"{type(self).__name__} always stores each observation once with exact next "
                "observations; leave the algorithm's optimize_memory_usage off (and pass "
                "replay_buffer_kwargs={'frame_stack': True} for stacked image frames)")
        if isinstance(n_envs, bool) or not isinstance(n_envs, (int, np.integer)) or n_envs < 1:
            raise ValueError(f"n_envs must be a positive int, got {n_envs!r}")
        obs_spec, self._discrete_obs = sb3_spaces.observation_spec(observation_space)
        action_spec = sb3_spaces.action_spec(action_space)
        self.observation_space, self.action_space = observation_space, action_space
        self.obs_shape = get_obs_shape(observation_space)  # type: ignore[assignment]
        self.action_dim = get_action_dim(action_space)
        self.device = get_device(device)
        self.n_envs = int(n_envs)
        self.buffer_size = max(int(buffer_size) // self.n_envs, 1)
        self.optimize_memory_usage = False
        self.handle_timeout_termination = bool(handle_timeout_termination)
        if n_steps != 1 and not _HAS_DISCOUNTS:
            raise ValueError(f"n_steps={n_steps!r} needs stable-baselines3>=2.7, whose "
                             "algorithms read samples.discounts; this one has none")
        self.n_steps, self.gamma = n_steps, gamma
        self._seeding = AlgorithmSeeding(action_space, follows=seed is None)
        if seed is None:  # numpy's global generator is what the algorithm's seed= seeds
            seed = self._seeding.draw_seed()
        self.core = self._make_core(obs_spec, action_spec, self.buffer_size * self.n_envs,
                                    num_envs=self.n_envs, n_step=n_steps, gamma=gamma,
                                    frame_stack=frame_stack, stack_axis=stack_axis,
                                    seed=seed, memory=memory)

    def _make_core(self, observation_spec: Any, action_spec: Any, capacity: int,
                   **kwargs: Any) -> TransitionReplayBuffer:
        return TransitionReplayBuffer(observation_spec, action_spec, capacity, **kwargs)

    def reseed(self, seed: int) -> None:
        """Sample from now on as a buffer built with ``seed=seed`` and the same
        transitions would (:meth:`replaybuffer.ReplayBuffer.reseed`); seedings of the
        algorithm no longer reseed it.

        Raises:
            TypeError, ValueError: ``seed`` is not an int in ``[0, 2**64)``.
        """
        self.core.reseed(seed)
        self._seeding.follows = False

    # ------------------------------------------------------------ SB3's bookkeeping
    @property
    def pos(self) -> int:  # type: ignore[override]
        """The slot (per env) the next add writes, in ``[0, buffer_size)``."""
        return (self.core.last_id + 1) % self.buffer_size

    @property
    def full(self) -> bool:  # type: ignore[override]
        """Whether ``buffer_size`` steps per env have been added since the last reset."""
        return self.core.last_id + 1 >= self.buffer_size

    def reset(self) -> None:
        """Forget every transition."""
        self.core.clear()

    # ------------------------------------------------------------------- writing
    def add(self, obs: np.ndarray | dict[str, np.ndarray], next_obs: np.ndarray |
            dict[str, np.ndarray], action: np.ndarray, reward: np.ndarray, done: np.ndarray,
            infos: list[dict[str, Any]]) -> None:
        """Add one transition per env: ``obs``/``next_obs`` ``[n_envs, *obs_shape]``
        (dicts of them), ``action`` ``[n_envs, action_dim]`` (or ``[n_envs]``),
        ``reward`` and ``done`` ``[n_envs]``, ``infos`` ``n_envs`` dicts.

        Raises:
            SpecError: a field that does not fit (named, with the expected and the
                got); nothing is stored then.
        """
        n = self.n_envs
        done = np.asarray(done)
        if done.shape != (n,):
            raise SpecError(f"add: done: expected shape ({n},) (one flag per env), got "
                            f"{done.shape}")
        if len(infos) != n:
            raise SpecError(f"add: infos: expected {n} dicts (one per env), got {len(infos)}")
        done = done.astype(bool)
        if self.handle_timeout_termination:
            timeouts = np.fromiter((bool(i.get("TimeLimit.truncated", False)) for i in infos),
                                   bool, n)
            truncated = done & timeouts
        else:
            truncated = np.zeros(n, bool)
        action = np.asarray(action)
        if action.shape != (n, self.action_dim) and action.size == n * self.action_dim:
            action = action.reshape(n, self.action_dim)  # Discrete actions come as [n_envs]
        self.core.add(self._shaped(obs), action, reward, self._shaped(next_obs),
                      done & ~truncated, truncated)

    def _shaped(self, obs: Any) -> Any:
        """Discrete observations (``[n_envs]``) as SB3 stores them: ``[n_envs, 1]``; SB3's
        VecEnvs' OrderedDicts as the plain dicts of the core's spec."""
        if isinstance(obs, Mapping) and isinstance(self._discrete_obs, frozenset):
            return {k: self._column(v) if k in self._discrete_obs else v for k, v in obs.items()}
        return self._column(obs) if self._discrete_obs else obs

    def _column(self, value: Any) -> Any:
        value = np.asarray(value)
        return value.reshape(self.n_envs, 1) if value.size == self.n_envs else value

    # ------------------------------------------------------------------- reading
    def sample(  # type: ignore[override]  # SB3's DictReplayBuffer narrows it alike
            self, batch_size: int, env: VecNormalize | None = None
            ) -> ReplayBufferSamples | DictReplayBufferSamples:
        """``batch_size`` transitions drawn uniformly (with replacement) over every
        stored (step, env), as tensors on ``device`` (shapes in the module docstring);
        ``env`` normalizes observations and rewards.

        Raises:
            EmptyBufferError: nothing is stored.
        """
        self._seeding.before_sample(self.core)
        batch, _ = self.core.sample(batch_size)
        return self._samples(batch, env)

    def _samples(self, batch: Any, env: VecNormalize | None
                 ) -> ReplayBufferSamples | DictReplayBufferSamples:
        """SB3's samples of a core batch."""
        rewards = np.asarray(batch.rewards, np.float32).reshape(-1, 1)
        discounts = None
        if self.n_steps > 1:
            discounts = self._tensor(np.asarray(batch.discounts, np.float32).reshape(-1, 1))
        fields = dict(
            observations=self._tensors(self._normalize_obs(batch.observations, env)),
            actions=self._tensor(batch.actions),
            next_observations=self._tensors(self._normalize_obs(batch.next_observations, env)),
            dones=self._tensor(np.asarray(batch.terminated, np.float32).reshape(-1, 1)),
            rewards=self._tensor(self._normalize_reward(rewards, env)))
        if _HAS_DISCOUNTS:  # stable-baselines3 >= 2.7
            fields["discounts"] = discounts
        if isinstance(fields["observations"], dict):
            return DictReplayBufferSamples(**fields)
        return ReplayBufferSamples(**fields)

    def _tensor(self, array: np.ndarray) -> th.Tensor:
        # The core's reads are fresh arrays, shared rather than copied again on the CPU;
        # fields of its packed records are strided views, made contiguous first.
        return th.as_tensor(np.ascontiguousarray(array), device=self.device)

    def _tensors(self, obs: Any) -> Any:
        if isinstance(obs, dict):
            return {k: self._tensor(v) for k, v in obs.items()}
        return self._tensor(obs)

    def _get_samples(self, batch_inds: np.ndarray, env: VecNormalize | None = None) -> Any:
        raise NotImplementedError(f"{type(self).__name__} samples through sample(batch_size, "
                                  "env); it keeps no slot-indexed arrays")

    # ------------------------------------------------------------------- pickling
    def __getstate__(self) -> dict[str, Any]:
        # The core holds a lock and pickles nothing; its checkpoint files travel instead.
        state = {k: v for k, v in self.__dict__.items() if k not in self._not_pickled}
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "core"
            self.core.save(root)
            state["core"] = {str(p.relative_to(root)): p.read_bytes()
                             for p in sorted(root.rglob("*")) if p.is_file()}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        files = state.pop("core")
        self.__dict__.update(state)
        for name in self._not_pickled:
            if name != "core":
                setattr(self, name, None)
        with tempfile.TemporaryDirectory() as tmp:
            for name, data in files.items():
                path = Path(tmp) / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            core = _load_checkpoint(tmp)
            assert isinstance(core, TransitionReplayBuffer)  # what _make_core built
            self.core = core
        self._seeding.rebase()
        self._attach_core()

    def _attach_core(self) -> None:
        """Give a restored core what its checkpoint does not keep."""


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay (Schaul et al., 2016) for SB3's off-policy
    algorithms, backed by a :class:`~replaybuffer.PrioritizedTransitionReplayBuffer`.

    Samples are :class:`PrioritizedReplayBufferSamples`: SB3's fields plus ``weights``
    (float32 ``[B, 1]`` on ``device``) and ``indices`` (int64 ``[B]``). SB3's own
    ``train()`` ignores both: use :class:`PrioritizedDQN`, or weigh your loss by
    ``weights`` and call ``update_priorities(indices, |td_error| + eps)`` yourself. New
    transitions enter at the largest priority seen.

    Args:
        alpha: prioritization exponent (0 samples uniformly).
        beta, beta_final, beta_steps: importance-sampling exponent, annealed linearly
            to ``beta_final`` over ``beta_steps`` sample calls.
        normalize: ``"batch"`` (each batch's largest weight is 1) or ``"buffer"``.
        Others: as for :class:`ReplayBuffer`.
    """

    core: PrioritizedTransitionReplayBuffer

    def __init__(self, buffer_size: int, observation_space: spaces.Space[Any],
                 action_space: spaces.Space[Any], device: th.device | str = "auto",
                 n_envs: int = 1, optimize_memory_usage: bool = False,
                 handle_timeout_termination: bool = True, *, alpha: float = 0.6,
                 beta: float = 0.4, beta_final: float | None = None, beta_steps: int = 0,
                 normalize: str = "batch", **kwargs: Any):
        self._priority_options: dict[str, Any] = dict(alpha=alpha, beta=beta, beta_final=beta_final,
                                      beta_steps=beta_steps, normalize=normalize)
        super().__init__(buffer_size, observation_space, action_space, device, n_envs,
                         optimize_memory_usage, handle_timeout_termination, **kwargs)

    def _make_core(self, observation_spec: Any, action_spec: Any, capacity: int,
                   **kwargs: Any) -> PrioritizedTransitionReplayBuffer:
        return PrioritizedTransitionReplayBuffer(observation_spec, action_spec, capacity,
                                                 **self._priority_options, **kwargs)

    def sample(  # type: ignore[override]  # SB3's samples plus weights and indices
            self, batch_size: int, env: VecNormalize | None = None
            ) -> PrioritizedReplayBufferSamples:
        """``batch_size`` transitions drawn in proportion to ``priority ** alpha``."""
        self._seeding.before_sample(self.core)
        batch, info = self.core.sample(batch_size)
        weights = np.asarray(info.weights, np.float32).reshape(-1, 1)
        samples = self._samples(batch, env)
        return PrioritizedReplayBufferSamples(
            samples.observations, samples.actions, samples.next_observations, samples.dones,
            samples.rewards, getattr(samples, "discounts", None), weights=self._tensor(weights),
            indices=np.asarray(info.ids, np.int64))

    def update_priorities(self, indices: Any, priorities: Any) -> int:
        """Set the priorities (``[B]`` finite, >= 0: e.g. ``|td_error| + eps``) of the
        transitions ``indices`` (a sample's ``indices``); returns how many were applied
        (transitions overwritten since are skipped).

        Raises:
            ValueError: mismatched shapes, or a NaN, infinite or negative priority.
        """
        return self.core.update_priorities(indices, priorities)


class PrioritizedDQN(DQN):
    """SB3's DQN learning from a :class:`PrioritizedReplayBuffer` (the default
    ``replay_buffer_class`` here): each sample's Huber loss is multiplied by its
    importance weight before the mean, and after each gradient step the sampled
    transitions get priority ``|TD error| + priority_eps``.

    Args:
        priority_eps: added to ``|TD error|`` so that no transition's priority is 0.
        Others: as for ``stable_baselines3.DQN``.
    """

    def __init__(self, policy: Any, env: Any, *args: Any, priority_eps: float = 1e-6,
                 **kwargs: Any):
        kwargs.setdefault("replay_buffer_class", PrioritizedReplayBuffer)
        self.priority_eps = float(priority_eps)
        super().__init__(policy, env, *args, **kwargs)

    def td_loss(self, samples: PrioritizedReplayBufferSamples
                ) -> tuple[th.Tensor, th.Tensor]:
        """``(loss, td_errors)`` of a batch: ``loss`` (a scalar) is the mean over ``i``
        of ``weights[i] * huber(Q(s_i, a_i) - y_i)`` with ``y_i = r_i + (1 - d_i) *
        discount_i * max_a Q_target(s'_i, a)``; ``td_errors`` float32 ``[B]`` is
        ``y - Q(s, a)``, detached."""
        discounts = samples.discounts if samples.discounts is not None else self.gamma
        with th.no_grad():
            next_q = self.q_net_target(samples.next_observations).max(dim=1).values
            targets = samples.rewards + (1 - samples.dones) * discounts * next_q.reshape(-1, 1)
        q = self.q_net(samples.observations).gather(1, samples.actions.long())
        loss = (samples.weights * F.smooth_l1_loss(q, targets, reduction="none")).mean()
        return loss, (targets - q).detach().reshape(-1)

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        buffer = self.replay_buffer
        if not isinstance(buffer, PrioritizedReplayBuffer):
            raise TypeError(f"PrioritizedDQN: replay_buffer: expected a "
                            f"replaybuffer.integrations.sb3.PrioritizedReplayBuffer, got "
                            f"{type(buffer).__name__}")
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        losses = []
        for _ in range(gradient_steps):
            samples = buffer.sample(batch_size, env=self._vec_normalize_env)
            loss, td_errors = self.td_loss(samples)
            self.policy.optimizer.zero_grad()
            loss.backward()
            th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
            self.policy.optimizer.step()
            buffer.update_priorities(samples.indices,
                                     td_errors.abs().cpu().numpy() + self.priority_eps)
            losses.append(loss.item())
        self._n_updates += gradient_steps
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/loss", float(np.mean(losses)))


class HerReplayBuffer(ReplayBuffer, _SB3HerReplayBuffer):
    """Hindsight experience replay in place of SB3's ``HerReplayBuffer``, backed by a
    :class:`~replaybuffer.HERBuffer`. A subclass of SB3's: algorithms hand it the env,
    and ``load_replay_buffer`` calls ``set_env`` and ``truncate_last_trajectory``.

    Samples are SB3's ``DictReplayBufferSamples``; the first ``int(batch_size *
    her_ratio)`` carry a goal achieved later in the same episode (``"future"``, inclusive
    of the transition itself, as SB3's), the episode's final one (``"final"``) or any of
    it (``"episode"``), and the reward ``env.env_method("compute_reward", next achieved
    goal, goal, infos, indices=[0])`` in one call, as SB3 computes it. Only transitions of
    completed episodes are drawn; each env's episodes are kept apart.

    Args:
        env: the VecEnv (given by the algorithm); not pickled: ``set_env`` after loading.
        n_sampled_goal, goal_selection_strategy: as SB3's.
        copy_info_dict: must be False: infos are not stored (``compute_reward`` gets
            empty info dicts, as SB3's default).
        seed, memory, others: as for :class:`ReplayBuffer` (no ``n_steps`` and no
            ``frame_stack``: goal observations are dicts).
    """

    core: HERBuffer
    _not_pickled = ("core", "env")

    def __init__(self, buffer_size: int, observation_space: spaces.Dict,
                 action_space: spaces.Space[Any], env: Any, device: th.device | str = "auto",
                 n_envs: int = 1, optimize_memory_usage: bool = False,
                 handle_timeout_termination: bool = True, n_sampled_goal: int = 4,
                 goal_selection_strategy: GoalSelectionStrategy | str = "future",
                 copy_info_dict: bool = False, *, seed: int | None = None,
                 memory: str = "warn"):
        if copy_info_dict:
            raise ValueError(f"copy_info_dict: expected False, got {copy_info_dict!r}: this "
                             "buffer stores no infos; compute_reward gets empty info dicts")
        if isinstance(goal_selection_strategy, GoalSelectionStrategy):
            goal_selection_strategy = goal_selection_strategy.name.lower()
        self.env = env
        self.copy_info_dict = False
        self._her_options: dict[str, Any] = dict(goal_selection_strategy=goal_selection_strategy,
                                 n_sampled_goal=n_sampled_goal)
        super().__init__(buffer_size, observation_space, action_space, device, n_envs,
                         optimize_memory_usage, handle_timeout_termination, seed=seed,
                         memory=memory)
        self.goal_selection_strategy = KEY_TO_GOAL_STRATEGY[self.core.goal_selection_strategy]
        self.n_sampled_goal = self.core.n_sampled_goal
        self.her_ratio = self.core.her_ratio

    def _make_core(self, observation_spec: Any, action_spec: Any, capacity: int,
                   **kwargs: Any) -> HERBuffer:
        for unused in ("n_step", "frame_stack", "stack_axis"):
            kwargs.pop(unused)
        return HERBuffer(observation_spec, action_spec, capacity,
                         compute_reward=self._compute_reward, **self._her_options, **kwargs)

    def _attach_core(self) -> None:
        self.core.compute_reward = self._compute_reward

    def _compute_reward(self, achieved_goal: np.ndarray, desired_goal: np.ndarray,
                        info: Any) -> np.ndarray:
        """Rewards ``[K]`` of goals ``[K, ...]`` from the first env, as SB3's buffer asks."""
        if self.env is None:
            raise ValueError("HerReplayBuffer has no env to compute rewards with: call "
                             "set_env(env) after unpickling (load_replay_buffer does)")
        infos: list[dict[str, Any]] = [{} for _ in range(len(achieved_goal))]
        rewards = self.env.env_method("compute_reward", achieved_goal, desired_goal, infos,
                                      indices=[0])
        return np.asarray(rewards[0], np.float32)

    def sample(  # type: ignore[override]  # goal observations are dicts, as in SB3's
            self, batch_size: int, env: VecNormalize | None = None
            ) -> DictReplayBufferSamples:
        """``batch_size`` transitions of completed episodes, relabelled first.

        Raises:
            EmptyBufferError: no episode has completed yet (SB3's raises RuntimeError).
        """
        self._seeding.before_sample(self.core)
        batch, _ = self.core.sample(batch_size)
        samples = self._samples(batch, env)
        assert isinstance(samples, DictReplayBufferSamples)  # goal observations: dicts
        return samples

    def truncate_last_trajectory(self) -> None:
        """End every env's episode in progress at its newest step (``load_replay_buffer``
        calls this unless ``truncate_last_traj=False``). Stored done flags stay as added:
        those last transitions bootstrap from their exact next observations, as SB3's
        marked timeouts do."""
        ended = self.core.end_episodes()
        if ended:
            warnings.warn(f"HerReplayBuffer: the episodes in progress in {ended} env(s) were "
                          "ended at their last step; load with truncate_last_traj=False to "
                          "continue them instead", stacklevel=2)
