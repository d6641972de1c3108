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
"""

from __future__ import annotations

import operator
from typing import (TYPE_CHECKING, Any, Literal, NamedTuple, NoReturn, Sequence,
                    overload)

import numpy as np

from replaybuffer.protocols import BufferInfo
from replaybuffer import nest
from replaybuffer.buffers.base import ReplayBuffer
from replaybuffer.buffers.prioritized import PrioritizedMixin
from replaybuffer.errors import EmptyBufferError, SpecError
from replaybuffer.sampling import Ring, UniformSampler
from replaybuffer.sampling.prioritized import PrioritizedSampler
from replaybuffer.specs import ArraySpec, BoundedArraySpec, as_data_spec, spec_from_space
from replaybuffer.storage.base import identity, to_numpy
from replaybuffer.storage.exact_writer import ExactWriter, reordered
from replaybuffer.storage.frozen import FrozenRows
from replaybuffer.storage.memory import check_memory
from replaybuffer.storage.side_store import SideStore

if TYPE_CHECKING:
    from typing_extensions import Self


class Transitions(NamedTuple):
    """A batch of transitions; every field has the leading sample dims (``[S]``).

    Attributes:
        observations, actions: at ``t`` (nests as the specs).
        rewards: float32; the discounted ``n``-step return when ``n_step > 1``.
        next_observations: the observation the value is bootstrapped from.
        terminated, truncated: bool, how the episode ended within the return's steps.
        dones: ``terminated | truncated`` (Pearl's field).
        discounts: float32 factor of ``V(next_observations)`` in the TD target.
    """

    observations: Any
    actions: Any
    rewards: Any
    next_observations: Any
    terminated: Any
    truncated: Any
    dones: Any
    discounts: Any


OBS, ACTION, REWARD, TERMINATED, TRUNCATED = ("observation", "action", "reward",
                                              "terminated", "truncated")


class TransitionReplayBuffer(ReplayBuffer):
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
    """

    def __init__(self, observation_spec: Any, action_spec: Any, capacity: int, *,
                 num_envs: int = 1, n_step: int = 1, gamma: float = 0.99,
                 storage: str = "numpy", device: Any = None, seed: int | None = None,
                 memory: str = "warn", frame_stack: bool = False, stack_axis: int = 0,
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
                         frame_stack=OBS if frame_stack else None, stack_axis=stack_axis)
        self.n_step, self.gamma = n_step, float(gamma)
        self._steps = np.arange(n_step)  # offsets of an n-step window
        self._step_discounts = self.gamma ** self._steps  # float64 gamma ** k
        self._config_values = {"observation_spec": obs_spec, "action_spec": act_spec,
                               "capacity": int(capacity), "num_envs": num_envs,
                               "n_step": n_step, "gamma": gamma, "seed": seed}
        if frame_stack:  # only then: subclasses without these arguments save as before
            self._config_values.update(frame_stack=True, stack_axis=stack_axis)
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
        self._next_checks = []  # (checker, its leaf index, full shape, path) per obs leaf
        for i in self._obs_leaves:
            # A deduplicated leaf holds frame references in storage: check whole stacks.
            checker, k = (self._frame_checker, 0) if self._codec is not None else \
                (self._storage._checker, i)
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
        # _add_single's next observation: one observation leaf's own shape.
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
        # Calls the shortcut skips where they would do nothing: _written of this class,
        # on_add of the uniform sampler.
        self._written_hook = type(self)._written is not TransitionReplayBuffer._written
        self._tracks_adds = type(self._sampler).on_add is not UniformSampler.on_add

    def _use_exact_order(self, rest: dict[str, Any]) -> None:
        """Set up add's shortcut for ``parts`` (see :meth:`_add_exact`) of the
        observation and the fields in ``rest``, which gives the index in ``parts`` of
        every other top-level field (a nest of indices for a nested field; the
        observation is at 0). The shortcut hands the fused writer
        ``(*observation leaves, *parts[1:])`` (for one observation leaf that is ``parts``
        itself), so it gets a writer that takes its leaves in that order
        (``_write_parts``), and the discrete ranges by their place there. No shortcut
        when the observation is neither one leaf nor a one-level dict, a field is not
        one leaf, or the storage's writer is not a fused one."""
        self._write_parts: ExactWriter | None = None
        self._write_single: ExactWriter | None = None
        self._exact_ranges: list[tuple[int, int, int]] = []
        if (self._obs_is_leaf or self._obs_flatten is not None) \
                and self._write_exact is not None:
            n = len(self._obs_leaves)
            template = {OBS: self._obs_structure.unflatten(list(range(n))),
                        **nest.map_structure(lambda k: k + n - 1, rest)}
            taken_from = nest.flatten(template)[0]  # storage leaf i is flat[taken_from[i]]
            if sorted(taken_from) == list(range(len(self._paths))):
                order = np.argsort(taken_from).tolist()  # flat[k] is storage leaf order[k]
                self._write_parts = reordered(self._write_exact, order)
                if self._ring.batch_size == 1 and self._obs_is_leaf:
                    # _add_single's: one env's leaves as they come, without the env axis.
                    self._write_single = reordered(self._write_exact, order, ())
                self._exact_ranges = [(taken_from[i], low, high)
                                      for i, low, high in self._scalar_ranges]
        self._exact_add = self._exact_add_possible()

    def _exact_add_possible(self) -> bool:
        """Whether add may take :meth:`_add_exact`: an observation of one leaf or a
        one-level dict, compared as copies; storage written by the fused writer (numpy,
        or torch on the CPU) with the leaves in a known order (``_write_parts``); no
        frame codec; integer ranges that are scalars; and no subclass that does more
        per write than :meth:`_written` (HER keeps its episodes there) and
        :meth:`_keep_previous_next` (never called on the shortcut)."""
        return (self._codec is None and self._write_parts is not None
                and sum(h.nbytes for h in self._head_next) <= _COPY_COMPARE_MAX
                and len(self._scalar_ranges) == len(self._int_checks)
                and type(self)._write_transition is TransitionReplayBuffer._write_transition)

    def _written(self, start: int, ended: np.ndarray | None) -> None:
        """Called (lock held) after every write of a step, by either path: the step's
        positions are ``start .. start + num_envs``; ``ended`` (bool ``[num_envs]``) marks
        the rows whose episode ended with it, ``None`` when none did."""

    @classmethod
    def from_env(cls, env: Any, capacity: int, **kwargs: Any) -> Self:
        """A buffer shaped by a gymnasium env or vector env (``num_envs`` from it)."""
        import gymnasium as gym

        if isinstance(env, gym.vector.VectorEnv):
            return cls(spec_from_space(env.single_observation_space),
                       spec_from_space(env.single_action_space), capacity,
                       num_envs=env.num_envs, **kwargs)
        return cls(spec_from_space(env.observation_space), spec_from_space(env.action_space),
                   capacity, **kwargs)

    @property
    def num_envs(self) -> int:
        return self._ring.batch_size

    @property
    def nbytes(self) -> int:
        return super().nbytes + self._side.nbytes + self._side_ref.nbytes + \
            sum(a.nbytes for a in self._head_next)

    # ---------------------------------------------------------------- writing
    def add(self, observation: Any, action: Any, reward: Any, next_observation: Any,
            terminated: Any, truncated: Any = None, *, timeout: float | None = None,
            block: bool = True) -> bool:
        """Add one transition per environment (every leaf ``[num_envs, ...]``).

        ``timeout`` and ``block`` apply when a :attr:`rate_limiter` holds the insert back
        (as for :meth:`add_batch`); ``False`` means it was not added (``block=False``).

        Raises:
            SpecError: a leaf that does not fit its spec, a batch that is not
                ``num_envs`` long, or an integer (discrete) value outside its space.
                Nothing is written.
            RateLimitedError: ``timeout`` passed with the insert held back.
        """
        if truncated is None:
            truncated = self._no_truncation
        if self._exact_add and self._limiter is None and self._add_exact(
                observation, (observation, action, reward, terminated, truncated),
                next_observation, terminated, truncated):
            return True
        return self._add_general(observation, action, reward, next_observation, terminated,
                                 truncated, timeout, block)

    def _add_usual(self, observation: Any, action: Any, reward: Any, next_observation: Any,
                   terminated: Any, truncated: Any = None) -> bool:
        """:meth:`add`'s shortcut alone (:meth:`_add_exact`): ``True`` having added the
        usual step, ``False`` having written nothing. For adapters (compat.pearl) that
        convert their inputs only when the step as it came was not taken (checking them
        first would repeat the fused writer's checks, ~0.5 us of a ~4 us add)."""
        if truncated is None:
            truncated = self._no_truncation
        return self._exact_add and self._limiter is None and self._add_exact(
            observation, (observation, action, reward, terminated, truncated),
            next_observation, terminated, truncated)

    def _add_single(self, observation: np.ndarray, action: Any, reward: Any,
                    next_observation: np.ndarray, terminated: Any, truncated: Any = None
                    ) -> None:
        """:meth:`add` of one env's transition as the env gives it, without the env axis
        (``num_envs`` 1): observation and next observation ``[*spec.shape]``, the action
        as its spec, ``reward`` a Python float (or float32 of shape ``()``) and the flags
        bool of shape ``()`` (0-d arrays such as :data:`SINGLE_FLAGS`, or numpy scalars),
        as compat adapters get them from a single env.

        The usual step goes to :meth:`_add_exact` as it is (adding the axis costs a view
        per leaf and converting the reward an array, ~0.6 us of a ~3 us add); anything
        else, and a buffer without that shortcut, to :meth:`add` with the axis added
        (``x[None]`` of every leaf, the reward cast to float32 ``[1]``), which converts,
        checks and raises as for any add. Without a rate limiter.
        """
        if truncated is None:
            truncated = SINGLE_FLAGS[0]
        write = self._write_single
        if write is not None and self._exact_add and self._limiter is None and \
                self._add_exact(observation, (observation, action, reward, terminated,
                                              truncated), next_observation, terminated,
                                truncated, write):
            return
        self.add(observation[None], action[None], _single_reward(reward), next_observation[None],
                 terminated[None], truncated[None])

    def _add_general(self, observation: Any, action: Any, reward: Any, next_observation: Any,
                     terminated: Any, truncated: Any, timeout: float | None, block: bool
                     ) -> bool:
        """:meth:`add` by the path that converts, checks and handles every case."""
        if self._add_order is not None:
            leaves = self._add_order((observation, action, reward, terminated, truncated))
        else:
            leaves = self.flatten_items({OBS: observation, ACTION: action, REWARD: reward,
                                          TERMINATED: terminated, TRUNCATED: truncated}, "add")
        arrays = self.convert_leaves(leaves, self._outer, self._add_names)
        next_obs = self._convert_next(next_observation)
        host = arrays if self._host else [to_numpy(a) for a in arrays]
        self._check_ranges(host)
        ended = host[self._terminated] | host[self._truncated]  # bool leaves: bool arrays
        with self._lock:
            if self._limiter is not None and not self._admit(self.num_envs, timeout, block):
                return False
            self._write_transition(arrays, host, next_obs, ended)
            if self._limiter is not None:
                self._limiter.inserted(self.num_envs)
        return True

    def _add_exact(self, observation: Any, parts: tuple[Any, ...], next_observation: Any,
                   terminated: Any, truncated: Any, single: ExactWriter | None = None
                   ) -> bool:
        """:meth:`add` of the usual step, or ``False`` having written nothing. ``parts``
        are the add's arguments, observation first, in the order that
        :meth:`_use_exact_order` set up (``(observation, action, reward, terminated,
        truncated)`` here). ``single``: the writer of one env's leaves without the env
        axis (``_write_single``, for :meth:`_add_single`), which also checks the next
        observation for that shape.

        The usual step: every leaf a numpy array of exactly its spec's dtype and shape,
        the observation the previous step's next observation (byte for byte), and a
        discrete action (if any) a single value inside its range. Then an add is the
        fused writer's call, a copy of the next observation and a handful of bytes
        comparisons: the general path's checks and branches, decided at once. Episode
        ends keep their next observations in the side store, and the side
        observations of the overwritten step are released, as the general path does.
        Anything else returns ``False`` for the general path to handle (or reject).
        """
        # The fused writer checks every stored leaf (observation, flags) for its exact
        # type, dtype and shape; before it, the bytes comparisons need only objects
        # with tobytes() (anything else than an ndarray is then refused by the writer,
        # before it writes anything). The next observation is checked here. One
        # observation leaf (the common case) is handled without loops: each costs
        # ~0.1 us, and this whole shortcut about 2 us.
        heads = self._head_next
        flatten = self._obs_flatten
        if flatten is None:  # one observation leaf
            head = heads[0]
            if type(next_observation) is not np.ndarray \
                    or next_observation.dtype is not head.dtype \
                    or next_observation.shape != (head.shape if single is None
                                                  else self._single_shape):
                return False
            observations: Sequence[Any] | None = None
            next_observations: Sequence[Any] = (next_observation,)
            flat = parts
        else:
            observations, next_leaves = flatten(observation), flatten(next_observation)
            if observations is None or next_leaves is None:
                return False
            next_observations = next_leaves
            for nxt, head in zip(next_observations, heads):
                if type(nxt) is not np.ndarray or nxt.dtype is not head.dtype \
                        or nxt.shape != head.shape:
                    return False
            flat = (*observations, *parts[1:])
        ring, lock = self._ring, self._lock
        lock.acquire()  # not `with`: its __exit__ call costs more than release()
        try:
            step_id = ring.last_id + 1
            if self._write_exact is None:  # paused while a checkpoint's snapshot is open
                return False
            if step_id:  # the observation must be the previous next observation
                try:
                    if observations is None:
                        raw = self._head_raw
                        if observation.tobytes() != (head.tobytes() if raw is None else raw):
                            return False
                    else:
                        for obs, head in zip(observations, heads):
                            if obs.tobytes() != head.tobytes():
                                return False
                except AttributeError:  # not an array: the general path converts it
                    return False
            B = ring.batch_size
            slot = step_id % ring.max_length
            start = slot * B
            for k, low, high in self._exact_ranges:
                values = flat[k]
                if type(values) is not np.ndarray or values.dtype.kind not in "iu":
                    return False  # the general path converts or refuses
                if values.size == 1:
                    if not low <= values.item() <= high:
                        return False  # the general path refuses, naming the leaf
                elif values.min() < low or values.max() > high:
                    return False
            write = self._write_parts if single is None else single
            if not write(start, flat):  # type: ignore[misc]  # _exact_add: set
                return False
            # Written: terminated and truncated are bool [B], the next observations
            # were checked above. The rest is the general path's bookkeeping.
            owns = self._owns
            if owns[slot]:  # the overwritten step releases its side observations
                self._release(start, slot)
            ended = None
            no_ends = self._no_ends
            if terminated.tobytes() != no_ends or truncated.tobytes() != no_ends:
                ended = (terminated | truncated).reshape(B)  # [B] also from single's ()
                self._side_ref[start + self._rows[ended]] = self._put_side(
                    step_id, ended, [n.reshape(h.shape)[ended]
                                     for n, h in zip(next_observations, heads)])
                owns[slot] = 1
            if observations is None:
                raw = next_observation.tobytes()
                self._head_bytes[0][:] = raw
                self._head_raw = raw
            else:
                for head_bytes, nxt in zip(self._head_bytes, next_observations):
                    head_bytes[:] = nxt.tobytes()
            ring.last_id = step_id
            if self._tracks_adds:
                self._sampler.on_add(ring, step_id, 1)
            if self._written_hook:
                self._written(start, ended)
        finally:
            lock.release()
        return True

    def _convert_next(self, next_observation: Any) -> list[np.ndarray]:
        """The leaves of ``next_observation`` as numpy arrays, validated with the
        observation leaves' rules."""
        outer, names = self._outer, self._add_names
        if self._obs_is_leaf and type(next_observation) is np.ndarray:  # no optree walk
            checker, k, shape, path = self._next_checks[0]
            return [checker.numpy_leaf(k, next_observation, shape, path, outer, names)]
        next_leaves, structure = nest.flatten(next_observation)
        if structure != self._obs_structure:
            raise SpecError(f"add: next_observation has structure {nest.describe(structure)}, "
                            f"expected {nest.describe(self._obs_structure)}")
        return [checker.numpy_leaf(k, to_numpy(leaf), shape, path, outer, names)
                for leaf, (checker, k, shape, path) in zip(next_leaves, self._next_checks)]

    def _check_ranges(self, host: list[np.ndarray]) -> None:
        for i, spec in self._int_checks:
            values = host[i]
            if values.size and ((values < spec.minimum).any() or (values > spec.maximum).any()):
                raise SpecError(f"add: leaf {self._paths[i]} has values outside its space "
                                f"[{spec.minimum.min()}, {spec.maximum.max()}]: "
                                f"{values.ravel()[:8].tolist()}")

    def _write_transition(self, arrays: list[Any], host: list[np.ndarray],
                          next_obs: list[np.ndarray], ended: np.ndarray) -> None:
        # The common case (the observation is the previous next observation, nothing
        # ends, the overwritten step owns no side observation) costs a few whole-add
        # bytes comparisons; only the rare cases look at rows.
        ring = self._ring
        B, L = ring.batch_size, ring.max_length
        if ring.last_id >= 0 and not self._follows_on(host):
            self._keep_previous_next(host)
        step_id = ring.last_id + 1
        slot = step_id % L
        start = slot * B
        if self._owns[slot]:  # overwritten steps release side observations
            self._release(start, slot)
        codec = self._codec
        if codec is not None:  # the stacks become frame references (validated already)
            arrays = list(arrays)
            arrays[self._codec_leaf], frame_writes = codec.encode(step_id,
                                                                  arrays[self._codec_leaf])
        self._storage.write(start, arrays)
        if codec is not None:  # also releases the side frames of the overwritten steps
            codec.commit(frame_writes, step_id, 1)
        ended_rows = None
        if ended.tobytes() != self._no_ends:
            ended_rows = ended
            self._side_ref[start + self._rows[ended]] = self._put_side(
                step_id, ended, [n[ended] for n in next_obs])
            self._owns[slot] = 1
        for head, new in zip(self._head_next, next_obs):
            head[...] = new
        self._head_raw = None
        ring.last_id = step_id
        self._sampler.on_add(ring, step_id, 1)
        self._written(start, ended_rows)

    def _follows_on(self, host: list[np.ndarray]) -> bool:
        """Whether every row's observation is, byte for byte, the next observation of
        the row's previous step (see :func:`_rows_differ`), tested for all rows at once.
        False also when a leaf came in another dtype than the spec's (rows then decide)."""
        for i, head in zip(self._obs_leaves, self._head_next):
            new = host[i]
            if new.dtype is not head.dtype:
                return False
            # Two copies and a memcmp beat any numpy reduction on small arrays; large
            # bytes objects cost fresh pages, so images are compared in place.
            if new.nbytes <= _COPY_COMPARE_MAX:
                if new.tobytes() != head.tobytes():
                    return False
            elif _rows_differ(new, head).any():
                return False
        return True

    def _keep_previous_next(self, host: list[np.ndarray]) -> None:
        """Keep in the side store the next observation of the previous step in every row
        whose new observation does not follow on from it (an out-of-sequence add, or a
        reset), unless the step keeps one already (it ended)."""
        ring, B = self._ring, self._ring.batch_size
        previous = (ring.last_id % ring.max_length) * B
        unkept = self._side_ref[previous:previous + B] < 0
        if not np.count_nonzero(unkept):  # after an episode end in every row, say
            return
        differs = np.zeros(B, bool)
        for i, head in zip(self._obs_leaves, self._head_next):
            differs |= _rows_differ(host[i], head)
        moved = differs & unkept
        if moved.any():
            self._side_ref[previous + self._rows[moved]] = self._put_side(
                ring.last_id, moved, [h[moved] for h in self._head_next])
            self._owns[ring.last_id % ring.max_length] = 1

    def _release(self, start: int, slot: int) -> None:
        """Free the side observations of the steps at positions ``start ..
        start + num_envs`` (slot ``slot``), which are being overwritten."""
        owned = self._side_ref[start:start + self._ring.batch_size]  # a view
        self._side.free(owned[owned >= 0])
        owned[...] = -1
        self._owns[slot] = 0

    def _put_side(self, step_id: int, rows: np.ndarray, leaves: list[np.ndarray]
                  ) -> np.ndarray:
        """Keep next observations (leaves ``[n, *spec.shape]``) of step ``step_id`` in the
        rows where ``rows`` (bool ``[num_envs]``) is set; their side-store slots ``[n]``.

        A deduplicated stack is kept as frame references: the frames it shares with the
        step's own observation are referenced, the rest become side frames owned by the
        step (``step_id`` must be written already)."""
        if self._codec is not None:
            j = self._obs_leaves.index(self._codec_leaf)
            which = np.flatnonzero(rows)
            refs, extras = self._codec.encode_side(np.full(len(which), step_id), which,
                                                   leaves[j])
            self._codec.commit_side(extras)
            leaves = list(leaves)
            leaves[j] = refs
        return self._side.put(leaves)

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
            batch = self._read(ids, positions)
            info_ids = self._info_ids(ids, positions)
            if self._limiter is not None:
                self._limiter.sampled(int(batch_size))
        to_backend = self._storage.from_numpy
        return batch, BufferInfo(to_backend(info_ids), to_backend(info["probabilities"]),
                                 None if info.get("weights") is None
                                 else to_backend(info["weights"]))

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

    def _next_observations(self, positions: np.ndarray, ids: np.ndarray) -> list[Any]:
        """Next observations of the steps at ``positions`` (int64, ids ``ids`` of the same
        shape): the following step's observation, the side store's, or the newest step's
        own. Deduplicated stacks are rebuilt from whichever frame references apply."""
        ring = self._ring
        B = ring.batch_size
        following = (positions + B) % ring.capacity
        out = self._storage.gather(following, self._obs_leaves)
        side = self._side_ref[positions]
        from_side = side >= 0
        newest = ids == ring.last_id
        # Most reads patch nothing, or only a few side observations: count_nonzero costs
        # a fraction of .any() on small arrays, and every masked step is skipped when
        # nothing needs it.
        any_side, any_newest = np.count_nonzero(from_side), np.count_nonzero(newest)
        codec = self._codec
        if codec is None and not (any_side or any_newest):
            return out
        newest &= ~from_side
        patched = []
        for i, leaf, side_leaf, head in zip(self._obs_leaves, out,
                                            self._side.take(side[from_side]),
                                            self._head_next):
            leaf = to_numpy(leaf).copy()
            if any_side:
                leaf[from_side] = side_leaf
            if codec is not None and i == self._codec_leaf:
                # The slot after the newest step holds no successor (an old step, or
                # nothing since a clear): read zero frames there instead of its refs.
                leaf[newest] = -1
                leaf = codec.decode(leaf, positions % B)
            if any_newest:
                leaf[newest] = head[positions[newest] % B]
            patched.append(self._storage.from_numpy(leaf))
        return patched

    def _clear_state(self) -> None:
        self._side.clear()
        self._side_ref[:] = -1
        self._owns[:] = bytes(len(self._owns))

    # ---------------------------------------------------------------- persistence
    def constructor_config(self) -> dict[str, Any]:
        from replaybuffer.persist import encode_spec

        config = dict(self._config_values)
        config["observation_spec"] = encode_spec(config["observation_spec"])
        config["action_spec"] = encode_spec(config["action_spec"])
        return config

    @classmethod
    def rebuild(cls, data_spec: Any, batch_size: int, max_length: int, storage: str,
                   device: Any, config: dict[str, Any]) -> "TransitionReplayBuffer":
        from replaybuffer.persist import decode_spec

        config = dict(config)
        obs, act = decode_spec(config.pop("observation_spec")), \
            decode_spec(config.pop("action_spec"))
        return cls(obs, act, config.pop("capacity"), storage=storage, device=device, **config)

    def snapshot(self) -> tuple[dict[str, Any], dict[str, FrozenRows]]:
        state, arrays = super().snapshot()
        state["side"] = self._side.state_dict()
        state["side_ref"] = self._side_ref.copy()
        state["head_next"] = [h.copy() for h in self._head_next]
        return state, arrays

    def restore_state(self, state: dict[str, Any], arrays: list[np.ndarray] | None) -> None:
        super().restore_state(state, arrays)
        with self._lock:
            self._side.load_state_dict(state["side"])
            self._side_ref[:] = state["side_ref"]
            self._owns[:] = (self._side_ref.reshape(len(self._owns), -1) >= 0).any(1).tobytes()
            for head, saved in zip(self._head_next, state["head_next"]):
                head[...] = saved
            self._head_raw = None


class PrioritizedTransitionReplayBuffer(PrioritizedMixin, TransitionReplayBuffer):
    """:class:`TransitionReplayBuffer` sampled by priority; ``update_priorities`` as for
    :class:`~replaybuffer.PrioritizedReplayBuffer` (ids from ``BufferInfo.ids``)."""

    _sampler: PrioritizedSampler

    def __init__(self, observation_spec: Any, action_spec: Any, capacity: int, *,
                 alpha: float = 0.6, beta: float = 0.4, beta_final: float | None = None,
                 beta_steps: int = 0, num_envs: int = 1, seed: int | None = None,
                 normalize: str = "batch", **kwargs: Any):
        positions = Ring(num_envs, max(1, int(capacity) // num_envs)).capacity
        sampler = PrioritizedSampler(positions, alpha, beta, beta_final=beta_final,
                                     beta_steps=beta_steps, seed=seed, normalize=normalize)
        super().__init__(observation_spec, action_spec, capacity, num_envs=num_envs,
                         seed=seed, _sampler=sampler, **kwargs)
        self._id_step = self.num_envs
        self._config_values.update(alpha=alpha, beta=beta, beta_final=beta_final,
                                   beta_steps=beta_steps, normalize=normalize)


SINGLE_FLAGS = (np.array(False), np.array(True))
"""One env's flags (false, true) as :meth:`TransitionReplayBuffer._add_single` takes them
at least cost: bool 0-d arrays (``tobytes()`` costs a sixth of a numpy scalar's),
read-only since every caller shares them."""
for _flag in SINGLE_FLAGS:
    _flag.flags.writeable = False


def _single_reward(reward: Any) -> Any:
    """One env's reward with the env axis: a Python float as float32 ``[1]`` (numpy's
    cast), anything else ``reward[None]``."""
    return np.array((reward,), np.float32) if type(reward) is float else reward[None]


_COPY_COMPARE_MAX = 1 << 16
"""Bytes up to which :meth:`TransitionReplayBuffer._follows_on` compares copies."""


def _rows_differ(new: np.ndarray, head: np.ndarray) -> np.ndarray:
    """bool ``[num_envs]``: rows of ``new`` whose bytes differ from ``head``'s (both
    ``[num_envs, *spec.shape]``). Bytes, not values: -0.0 is not 0.0, and a NaN is
    itself, so a next observation read from the following step is the one added."""
    new = np.ascontiguousarray(new, head.dtype)
    rows = len(head)
    differ: np.ndarray = (new.view(np.uint8).reshape(rows, -1)
                          != head.view(np.uint8).reshape(rows, -1)).any(1)
    return differ
