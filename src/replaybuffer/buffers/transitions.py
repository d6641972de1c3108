"""Off-policy transition replay that stores each observation once.

Agents add transitions ``(observation, action, reward, next_observation, terminated,
truncated)``, one per environment (a leading ``num_envs`` axis), and sample them back
with their next observations. The buffer is the shared ring of ``num_envs`` rows:
step ``t`` of a row holds ``observation_t``; the next observation of step ``t`` is the
observation of step ``t + 1`` of the same row. Where that is not the
``next_observation`` that was added (at the end of every episode, terminated or
truncated, and wherever transitions were added out of sequence) the true one is kept
in a small side store owned by the step, and the newest step of each row keeps its
own. Every sampled next observation is therefore exactly the one that was added
(unlike SB3's ``optimize_memory_usage``, DLR-RM/stable-baselines3#934).

With ``frame_stack=True`` a stacked image observation (uint8 ``[4, 84, 84]``, say) is
stored one frame per transition (:mod:`replaybuffer.storage.frames`): both
observation and next observation stacks are rebuilt byte-exact at sample time, and an
episode's true final observation costs one side frame (the frames it shares with the
last step's observation are referenced, not copied).

``terminated`` and ``truncated`` stay apart. ``discounts`` in a sample is the factor
of the value of ``next_observations`` in a TD target: ``gamma ** m`` for an ``m``-step
return that ends by time limit or by the ``n_step`` horizon, 0 after termination.

The class is built of parts, one concept per module, each a base class of the next:
:mod:`~replaybuffer.buffers.side_observations` (the next-observation bookkeeping of
every write), :mod:`~replaybuffer.buffers.transition_add` (``add``, its shortcut for
the usual step, one env's step without the env axis) and
:mod:`~replaybuffer.buffers.transition_reads` (transitions and ``n``-step returns of
given steps), :mod:`~replaybuffer.buffers.transition_checkpoints` (what a checkpoint
keeps); this module wires them and samples. With ``sample_on_device``
the draws made on the device are read there
(:mod:`~replaybuffer.buffers.device_transition_reads`, the device twin of the reads).
:meth:`TransitionReplayBuffer.flat_reads` hands adapters lean reads
(:mod:`~replaybuffer.buffers.flat_reads`, with the cache of recent steps of
:mod:`~replaybuffer.buffers.recent_steps`).
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NoReturn, overload

import numpy as np

from replaybuffer import nest
from replaybuffer.rate_limiter import RateLimiter
from replaybuffer.buffers.device_sampling import (device_prioritized_sampler,
                                                  device_search_for, samples_on_device)
from replaybuffer.buffers.flat_reads import FlatReads
from replaybuffer.buffers.prioritized import PrioritizedMixin
from replaybuffer.buffers.recent_steps import NextObservations
from replaybuffer.buffers.side_observations import COPY_COMPARE_MAX, rows_differ
from replaybuffer.buffers.transition_add import SINGLE_FLAGS, single_reward
from replaybuffer.buffers.transition_checkpoints import TransitionCheckpoints
from replaybuffer.buffers.transition_fields import (ACTION, OBS, REWARD, TERMINATED,
                                                    TRUNCATED, Transitions)
from replaybuffer.errors import EmptyBufferError, SpecError
from replaybuffer.protocols import BufferInfo
from replaybuffer.sampling import Ring, UniformSampler
from replaybuffer.sampling.prioritized import PrioritizedSampler
from replaybuffer.specs import ArraySpec, BoundedArraySpec, as_data_spec, spec_from_space
from replaybuffer.storage.base import LeafChecker, identity
from replaybuffer.storage.memory import check_memory
from replaybuffer.storage.numpy_storage import NumpyStorage
from replaybuffer.storage.side_store import SideStore

if TYPE_CHECKING:
    from typing_extensions import Self

    from replaybuffer.buffers.device_transition_reads import DeviceTransitionReads


class TransitionReplayBuffer(TransitionCheckpoints):
    """Uniform replay of transitions, observations stored once.

    Args:
        observation_spec, action_spec: specs (or gymnasium spaces) of one environment's
            observation and action.
        capacity: transitions held, counted over all environments (rounded down to a
            multiple of ``num_envs``).
        num_envs: environments per add (the leading axis of every added leaf).
        n_step: steps summed into each sampled return; returns stop at episode ends
            and at the newest step.
        gamma: discount of the returns and of ``discounts``.
        storage, device, seed: as for :class:`~replaybuffer.UniformReplayBuffer`.
        memory: ``"warn"`` (default) or ``"strict"``: what to do when the memory the
            buffer needs (computed up front) exceeds what is available.
        frame_stack: store the observation, one array of stacked frames (e.g. uint8
            ``[4, 84, 84]`` from a frame-stack wrapper), deduplicated: one frame per
            transition, stacks rebuilt on read. Numpy storage only.
        stack_axis: the axis of the observation's shape that stacks frames (0 for
            ``[K, H, W]``, -1 for ``[H, W, K]``).
        rate_limiter: a :class:`~replaybuffer.RateLimiter` pacing adds and samples (the
            same as setting :attr:`rate_limiter` afterwards).
        sample_on_device: ``True`` draws and reads samples on the torch storage's
            device (:mod:`replaybuffer.buffers.device_sampling`): ids, probabilities
            (and a prioritized buffer's weights), every transition's fields, next
            observations and ``n``-step returns are computed there, without waiting
            for the device (:mod:`replaybuffer.buffers.device_transition_reads`; the
            next-observation bookkeeping is copied to the device as a sample needs
            it). Off by default (``None``), also on a GPU.

    A checkpoint keeps every argument but ``storage``, ``device`` (saved beside them)
    and ``rate_limiter`` (:mod:`~replaybuffer.buffers.transition_checkpoints`).
    """

    # Whether sample() serves draws made on the device; a subclass whose reads differ
    # (HER, RolloutBuffer) says so in its body, or refuses sample_on_device=True.
    _samples_on_device: ClassVar[bool] = True

    # Whether flat_reads() serves this class: a subclass whose reads return what this
    # class's do says so in its body (RolloutBuffer); any other gets None.
    _serves_flat_reads: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "_serves_flat_reads" not in vars(cls):
            cls._serves_flat_reads = False
        if "_samples_on_device" not in vars(cls):
            cls._samples_on_device = False

    def __init__(self, observation_spec: Any, action_spec: Any, capacity: int, *,
                 num_envs: int = 1, n_step: int = 1, gamma: float = 0.99,
                 storage: str = "numpy", device: Any = None, seed: int | None = None,
                 memory: str = "warn", frame_stack: bool = False, stack_axis: int = 0,
                 rate_limiter: RateLimiter | None = None, sample_on_device: bool | None = None,
                 _sampler: Any = None):
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or \
                capacity < num_envs:
            raise ValueError(f"capacity must be an int >= num_envs={num_envs}, got {capacity!r}")
        if isinstance(n_step, bool) or not isinstance(n_step, int) or n_step < 1:
            raise ValueError(f"n_step must be a positive int, got {n_step!r}")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
        if memory not in ("warn", "strict"):
            raise ValueError(f"memory must be 'warn' or 'strict', got {memory!r}")
        if not isinstance(frame_stack, (bool, np.bool_)):
            raise ValueError(f"frame_stack must be True or False, got {frame_stack!r}")
        obs_spec, act_spec = as_data_spec(observation_spec), as_data_spec(action_spec)
        if frame_stack and not isinstance(obs_spec, ArraySpec):
            raise SpecError(f"frame_stack needs an observation that is one array of stacked "
                            f"frames, got {nest.describe(nest.flatten(obs_spec)[1])}")
        spec = {OBS: obs_spec, ACTION: act_spec, REWARD: ArraySpec((), np.float32, REWARD),
                TERMINATED: ArraySpec((), np.bool_, TERMINATED),
                TRUNCATED: ArraySpec((), np.bool_, TRUNCATED)}
        max_length = int(capacity) // num_envs
        obs_leaves, self._obs_structure = nest.flatten(obs_spec)
        per_step = sum(s.nbytes for s in nest.flatten(spec)[0])
        if frame_stack and -len(obs_spec.shape) <= stack_axis < len(obs_spec.shape):
            stack = max(obs_spec.shape[stack_axis], 1)  # one frame, K references, a frame id
            per_step += obs_spec.nbytes // stack + 8 * stack + 8 - obs_spec.nbytes
        needed = per_step * max_length * num_envs + \
            sum(s.nbytes for s in obs_leaves) * num_envs
        check_memory(needed, f"{type(self).__name__}(capacity={capacity})",
                     strict=memory == "strict")
        super().__init__(spec, num_envs, max_length, storage=storage, device=device,
                         sampler=_sampler or UniformSampler(seed),
                         frame_stack=OBS if frame_stack else None, stack_axis=stack_axis,
                         rate_limiter=rate_limiter)
        # None is the host here, also on a GPU (see sample_on_device above).
        on_device = sample_on_device is not None and samples_on_device(
            self.storage, device, sample_on_device, False)
        if on_device:
            if not self._samples_on_device:
                raise ValueError(f"sample_on_device=True: {type(self).__name__} samples on "
                                 "the host")
            self._sampler = self._device_sampler(seed)
        self.n_step, self.gamma = n_step, float(gamma)
        self._steps = np.arange(n_step)  # offsets of an n-step window
        self._step_discounts = self.gamma ** self._steps  # float64 gamma ** k
        self._config_values = {"observation_spec": obs_spec, "action_spec": act_spec,
                               "capacity": int(capacity), "num_envs": num_envs,
                               "n_step": n_step, "gamma": gamma, "seed": seed}
        if frame_stack:  # only then: subclasses without these arguments save as before
            self._config_values.update(frame_stack=True, stack_axis=stack_axis)
        # Saved only where they differ from the default, so a checkpoint of a buffer
        # built without them reads as before (and one written before they were saved
        # loads as such a buffer).
        if on_device:
            self._config_values["sample_on_device"] = True
        if memory != "warn":
            self._config_values["memory"] = memory
        names = self._paths_by_name()
        self._obs_leaves = [i for i, p in enumerate(self._paths) if p.startswith(f"['{OBS}']")]
        self._action_leaves = [i for i, p in enumerate(self._paths)
                               if p.startswith(f"['{ACTION}']")]
        self._action_structure = nest.flatten(self._data_spec[ACTION])[1]
        self._reward, self._terminated, self._truncated = (names[REWARD], names[TERMINATED],
                                                           names[TRUNCATED])
        self._obs_specs = [self._specs[i] for i in self._obs_leaves]
        # With frame_stack the side store keeps the frame references of next observations
        # (their frames live in the codec), not whole stacks.
        self._side = SideStore([self._codec.ref_spec if self._codec is not None else s
                                for s in self._obs_specs])
        self._rows = np.arange(num_envs)
        capacity_positions = self._ring.capacity
        self._side_ref = np.full(capacity_positions, -1, np.int64)  # next obs in side store
        # Per step slot (position // num_envs): 1 where some row's _side_ref is set. An
        # add asks it whether the step it overwrites owns side observations: one byte,
        # where reading the slot's num_envs references from a ring larger than the
        # cache cost ~0.7 us at 256 envs.
        self._owns = bytearray(max_length)
        self._head_next = [np.zeros((num_envs,) + s.shape, s.dtype) for s in self._obs_specs]
        self._int_checks = [(i, s) for i, s in enumerate(self._specs)
                            if isinstance(s, BoundedArraySpec) and s.dtype.kind in "iub"]
        # Constants of the hot paths: adding one small transition costs a few us, and
        # every numpy call (~0.5 us) or string built per call shows.
        self._add_names = f"[num_envs={num_envs}]"
        # With one leaf each for observation and action, add's items flatten in a fixed
        # order (dict keys sorted, as the base class's flatten shortcut takes them).
        self._add_order = None if self._fast_flatten is None else operator.itemgetter(
            *nest.flatten({OBS: 0, ACTION: 1, REWARD: 2, TERMINATED: 3, TRUNCATED: 4})[0])
        self._host = self._storage.from_numpy is identity  # storage arrays are numpy
        self._obs_is_leaf = self._obs_structure.is_leaf()
        prefix = len(f"['{OBS}']")
        leaf_checker = LeafChecker(self._specs)  # the storage's rules, for next observations
        self._next_checks = []  # (checker, its leaf index, full shape, path) per obs leaf
        for i in self._obs_leaves:
            # A deduplicated leaf holds frame references in storage: check whole stacks.
            checker, k = (self._frame_checker, 0) if self._codec is not None else \
                (leaf_checker, i)
            self._next_checks.append((checker, k, self._outer + self._specs[i].shape,
                                      "['next_observation']" + self._paths[i][prefix:]))
        # A whole add's flags are tested with one bytes comparison against this.
        self._no_ends = bytes(num_envs)  # bool [num_envs], all false
        # add's shortcut copies through memoryviews: a slice of one costs less than a
        # numpy slice or item assignment.
        self._head_bytes = [h.data.cast("B") for h in self._head_next]
        # The shortcut's copy of one observation leaf's head as bytes (what it compares
        # the next observation with); None where the general path or a restore wrote
        # the head since.
        self._head_raw: bytes | None = None
        self._no_truncation = np.zeros(num_envs, np.bool_)
        self._no_truncation.flags.writeable = False
        # add_single's next observation: one observation leaf's own shape.
        self._single_shape = self._head_next[0].shape[1:] if self._head_next else ()
        # Discrete actions: their range as Python ints, checked on one value without
        # numpy calls when the leaf holds one value (one env, a scalar action).
        self._scalar_ranges = [(i, int(s.minimum), int(s.maximum)) for i, s in self._int_checks
                               if np.ndim(s.minimum) == 0 and np.ndim(s.maximum) == 0]
        # add's shortcut (_add_exact): the observation's leaves without optree (one
        # leaf, or a one-level dict such as a goal env's), and the fused writer also
        # for the nested specs that leave the base class without one (the writer takes
        # any leaf order).
        self._obs_flatten = None if self._obs_is_leaf else nest.fast_flattener(obs_spec)
        if self._write_exact is None and self._episodes is None:
            self._write_exact = self._storage.exact_writer(self._outer)
        self._use_exact_order({ACTION: 1, REWARD: 2, TERMINATED: 3, TRUNCATED: 4})
        # A call the shortcut skips where it would do nothing: on_add of the uniform
        # sampler (and _written where no subclass overrides it: _written_hook).
        self._tracks_adds = type(self._sampler).on_add is not UniformSampler.on_add
        # sample_on_device: transitions read on the device (None: on the host).
        self._device_reads = self._device_transition_reads(memory == "strict") \
            if on_device else None

    @classmethod
    def from_env(cls, env: Any, capacity: int, **kwargs: Any) -> Self:
        """A buffer shaped by a gymnasium env or vector env (``num_envs`` from it).

        Raises:
            ValueError: a vector env with ``NEXT_STEP`` autoreset (gymnasium's default),
                whose step after an episode's end is no transition (see
                :func:`refuse_next_step_autoreset`).
        """
        import gymnasium as gym

        if isinstance(env, gym.vector.VectorEnv):
            refuse_next_step_autoreset(env, f"{cls.__name__}.from_env")
            return cls(spec_from_space(env.single_observation_space),
                       spec_from_space(env.single_action_space), capacity,
                       num_envs=env.num_envs, **kwargs)
        return cls(spec_from_space(env.observation_space), spec_from_space(env.action_space),
                   capacity, **kwargs)

    @property
    def nbytes(self) -> int:
        """Bytes the buffer takes: its storage at full capacity, the next-observation
        bookkeeping (the side store as large as it has grown) and, with
        ``sample_on_device``, the bookkeeping's copy on the storage's device (8 bytes per
        position and the side store's rows: ``DeviceSideMirror.nbytes``, counted on
        that device by the check at construction)."""
        mirror = 0 if self._device_reads is None else self._device_reads.mirror.nbytes
        return super().nbytes + self._side.nbytes + self._side_ref.nbytes + \
            sum(a.nbytes for a in self._head_next) + mirror

    def add_batch(self, items: Any, *, timeout: float | None = None,
                  block: bool = True) -> NoReturn:
        raise TypeError(f"{type(self).__name__} takes transitions through add(observation, "
                        "action, reward, next_observation, terminated, truncated)")

    extend = add_batch

    # ---------------------------------------------------------------- reading
    @overload
    def sample(self, batch_size: int, *, timeout: float | None = None,
               block: Literal[True] = True) -> tuple[Transitions, BufferInfo]: ...

    @overload
    def sample(self, batch_size: int, *, timeout: float | None = None, block: bool = True
               ) -> tuple[Transitions, BufferInfo] | None: ...

    def sample(self, batch_size: int, *, timeout: float | None = None, block: bool = True
               ) -> tuple[Transitions, BufferInfo] | None:
        """``batch_size`` transitions, uniformly (or by priority) over those stored.

        ``timeout`` and ``block`` apply when a :attr:`rate_limiter` holds the sample back
        (as for :meth:`get_next`); ``None`` means nothing was drawn (``block=False``).

        Raises:
            EmptyBufferError: nothing is stored yet.
            RateLimitedError: ``timeout`` passed with the sample held back.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or \
                batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        with self._lock:
            if self._limiter is not None and not self._admit_sample(int(batch_size), timeout,
                                                                    block):
                return None
            if self._ring.last_id < 0:
                raise self.empty_error()
            (ids, positions), info = self._sampler.sample(self._ring, int(batch_size), 1)
            info_ids = self._info_ids(ids, positions)
            if isinstance(ids, np.ndarray):
                batch = self._read(ids, positions)
            else:  # drawn on the device (sample_on_device): read there
                batch = self._device_reads.read(ids, positions, self._generation)
            if self._limiter is not None:
                self._limiter.sampled(int(batch_size))
        to_backend = self._storage.from_numpy
        return batch, BufferInfo(to_backend(info_ids), to_backend(info["probabilities"]),
                                 None if info.get("weights") is None
                                 else to_backend(info["weights"]))

    def _device_sampler(self, seed: int | None) -> Any:
        """The sampler of ``sample_on_device=True``: uniform draws on the device."""
        from replaybuffer.sampling.torch_uniform import TorchUniformSampler

        return TorchUniformSampler(self.device, seed)

    def _device_transition_reads(self, strict: bool) -> DeviceTransitionReads:
        """The reads of ``sample_on_device=True`` (a torch storage's), their device copy
        of the next-observation bookkeeping checked against the device's free memory
        first (``strict``: raise where it does not fit, else warn)."""
        from replaybuffer.buffers.device_side_mirror import (check_device_memory,
                                                             mirror_nbytes)
        from replaybuffer.buffers.device_transition_reads import DeviceTransitionReads

        needed = mirror_nbytes(len(self._side_ref), [h[0] for h in self._head_next],
                               len(self._side.arrays[0]), self.num_envs)
        check_device_memory(needed, f"{type(self).__name__}(sample_on_device=True)",
                            self._storage.device, strict)  # type: ignore[attr-defined]

        leaves = {OBS: self._obs_leaves, ACTION: self._action_leaves, REWARD: self._reward,
                  TERMINATED: self._terminated, TRUNCATED: self._truncated}
        return DeviceTransitionReads(
            self._storage, self._ring, (self._side_ref, self._side, self._head_next),  # type: ignore[arg-type]
            leaves, (self._obs_structure, self._action_structure), self.n_step, self.gamma)

    def last(self, count: int) -> Transitions:
        """The ``count`` most recent transitions of every env, oldest first: leaves
        ``[num_envs, count, ...]`` (``[count, ...]`` for one env)."""
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
            raise ValueError(f"count must be a positive int, got {count!r}")
        with self._lock:
            held = self._ring.items_per_row
            if count > held:
                raise EmptyBufferError(f"last({count}) asks for more transitions than each "
                                       f"env holds ({held})")
            ids = np.arange(self._ring.last_id - count + 1, self._ring.last_id + 1)
            rows = np.arange(self.num_envs)[:, None]
            batch = self._read(np.broadcast_to(ids, (self.num_envs, count)),
                               self._ring.positions(ids[None, :], rows))
        return batch if self.num_envs > 1 else nest.map_structure(lambda x: x[0], batch)

    def all(self) -> Transitions:
        """Every stored transition, oldest first: ``[num_envs, held, ...]``."""
        with self._lock:
            held = self._ring.items_per_row
        if held == 0:
            raise self.empty_error(action="asking the buffer for data")
        return self.last(held)

    # ---------------------------------------------------------------- the parts
    @property
    def observation_spec(self) -> Any:
        """The spec of one environment's observation (a nest of ArraySpecs)."""
        return self._config_values["observation_spec"]

    @property
    def action_spec(self) -> Any:
        """The spec of one environment's action, as given to the constructor."""
        return self._config_values["action_spec"]

    def flat_reads(self, action_path: str, env_axis: bool) -> FlatReads | None:
        """Lean reads of the fields observation, action (the leaf at ``action_path`` of
        the stored nest, e.g. ``"['action']"``), reward, next observation and
        terminated as numpy arrays (:class:`~replaybuffer.buffers.flat_reads.FlatReads`),
        for adapters that return those (compat.pearl). Its runs of consecutive steps
        carry the env axis when ``env_axis``.

        ``None`` where they do not apply: a subclass that changes what a read returns
        (HER; :class:`~replaybuffer.RolloutBuffer` reads the same), storage other than
        numpy, ``n_step > 1``, an observation that is not one array, frame stacking,
        an episode index, or no leaf at ``action_path``."""
        storage = self._storage
        if not self._serves_flat_reads or type(storage) is not NumpyStorage or \
                self._codec is not None or self.n_step != 1 or self._episodes is not None \
                or not self._obs_is_leaf or len(self._obs_leaves) != 1 or \
                action_path not in self._paths:
            return None
        read = [self._obs_leaves[0], self._paths.index(action_path), self._reward,
                self._terminated]
        next_obs = NextObservations(self._side, self._side_ref, self._head_next[0])
        return FlatReads(self, storage, self._ring, self._lock, next_obs, read, env_axis)


class PrioritizedTransitionReplayBuffer(PrioritizedMixin, TransitionReplayBuffer):
    """:class:`TransitionReplayBuffer` sampled by priority; ``update_priorities`` as for
    :class:`~replaybuffer.PrioritizedReplayBuffer` (ids from ``BufferInfo.ids``)."""

    _sampler: PrioritizedSampler

    _samples_on_device = True

    def __init__(self, observation_spec: Any, action_spec: Any, capacity: int, *,
                 alpha: float = 0.6, beta: float = 0.4, beta_final: float | None = None,
                 beta_steps: int = 0, num_envs: int = 1, seed: int | None = None,
                 normalize: str = "batch", device_search: str | None = None, **kwargs: Any):
        positions = Ring(num_envs, max(1, int(capacity) // num_envs)).capacity
        sampler = PrioritizedSampler(positions, alpha, beta, beta_final=beta_final,
                                     beta_steps=beta_steps, seed=seed, normalize=normalize)
        # Read by _device_sampler (sample_on_device=True): device_search as for
        # PrioritizedReplayBuffer, checked here either way.
        on_device = bool(kwargs.get("sample_on_device"))
        device_search_for(device_search, positions, on_device)
        self._device_search = device_search
        super().__init__(observation_spec, action_spec, capacity, num_envs=num_envs,
                         seed=seed, _sampler=sampler, **kwargs)
        self._device_update = getattr(self._sampler, "update_on_device", None)
        self._id_step = self.num_envs
        self._config_values.update(alpha=alpha, beta=beta, beta_final=beta_final,
                                   beta_steps=beta_steps, normalize=normalize)
        if device_search is not None:  # the default (by capacity) saves nothing
            self._config_values["device_search"] = device_search

    def _device_sampler(self, seed: int | None) -> Any:
        """Prioritized draws on the device, with this buffer's schedule."""
        host = self._sampler
        return device_prioritized_sampler(
            host.capacity, host.alpha, host.beta_start, beta_final=host.beta_final,
            beta_steps=host.beta_steps, seed=seed, normalize=host.normalize,
            device=self.device, search=self._device_search)


__all__ = ["COPY_COMPARE_MAX", "SINGLE_FLAGS", "PrioritizedTransitionReplayBuffer",
           "TransitionReplayBuffer", "Transitions", "rows_differ", "single_reward"]


def refuse_next_step_autoreset(env: Any, caller: str) -> None:
    """Raise ``ValueError`` for a vector env that resets with ``NEXT_STEP`` autoreset.

    Under it the step after an episode's end only resets that env: it is no transition,
    yet ``add`` takes every env's step together and cannot leave one out, so a usual
    collection loop would store, silently, a transition from the final observation to
    the reset one with reward 0. ``SAME_STEP`` reports the final observation in
    ``info["final_obs"]`` of the step that ends the episode, which ``add`` takes."""
    import gymnasium as gym

    modes = getattr(gym.vector, "AutoresetMode", None)
    if modes is None:  # gymnasium 1.0: every vector env resets with NEXT_STEP
        raise ValueError(
            f"{caller}: gymnasium {gym.__version__}'s vector envs reset with NEXT_STEP "
            "autoreset, whose step after an episode's end is no transition, and add() "
            "takes every env's step together: use gymnasium >= 1.1 and build the env "
            "with autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP "
            "(docs/buffers/transitions.md)")
    mode = env.metadata.get("autoreset_mode", modes.NEXT_STEP)
    # A mode given by its value ("NextStep"), as gymnasium's constructors take it.
    if getattr(mode, "value", mode) == modes.NEXT_STEP.value:
        raise ValueError(
            f"{caller}: the vector env resets with autoreset_mode NEXT_STEP (gymnasium's "
            "default), whose step after an episode's end is no transition, and add() "
            "takes every env's step together: build it with autoreset_mode="
            "gymnasium.vector.AutoresetMode.SAME_STEP and add each ended episode's "
            "info['final_obs'] as its next observation (docs/buffers/transitions.md)")
