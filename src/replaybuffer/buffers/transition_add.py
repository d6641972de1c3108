"""The write paths of a transition buffer: ``add``, its shortcut for the usual step,
and one env's step without the env axis.

:class:`TransitionAdds` is the part of :class:`~replaybuffer.TransitionReplayBuffer`
that adds. ``add`` takes the usual step (every leaf a numpy array of its spec's dtype
and shape, the observation the previous step's next observation) through one call
of the storage's fused writer (:meth:`TransitionAdds._add_exact`), and anything else
through the general path, which converts, checks and handles every case
(:meth:`TransitionAdds._add_general`). Both write the same bytes
(tests/test_transitions.py compares them). Adapters (compat.pearl) call the shortcut
alone (:meth:`TransitionAdds.add_usual`) and one env's step as the env gives it
(:meth:`TransitionAdds.add_single`), or take the whole usual step as one compiled call
(:meth:`TransitionAdds.step_adder`, :mod:`replaybuffer.buffers.step_adder`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence

import numpy as np

from replaybuffer import nest
from replaybuffer.buffers.side_observations import COPY_COMPARE_MAX, SideObservations
from replaybuffer.buffers.step_adder import AdderParts, argument_names, build_step_adder
from replaybuffer.buffers.transition_fields import ACTION, OBS, REWARD, TERMINATED, TRUNCATED
from replaybuffer.errors import SpecError
from replaybuffer.storage.base import LeafChecker, to_numpy
from replaybuffer.storage.exact_writer import ExactWriter, record_layout, reordered
from replaybuffer.storage.numpy_storage import NumpyStorage

if TYPE_CHECKING:
    from replaybuffer.specs import BoundedArraySpec

SINGLE_FLAGS = (np.array(False), np.array(True))
"""One env's flags (false, true) as :meth:`TransitionAdds.add_single` takes them at
least cost: bool 0-d arrays (``tobytes()`` costs a sixth of a numpy scalar's), read-only
since every caller shares them."""
for _flag in SINGLE_FLAGS:
    _flag.flags.writeable = False


def single_reward(reward: Any) -> Any:
    """One env's reward with the env axis: a Python float as float32 ``[1]`` (numpy's
    cast), anything else ``reward[None]``."""
    return np.array((reward,), np.float32) if type(reward) is float else reward[None]


class TransitionAdds(SideObservations):
    """The write paths of a transition buffer (see the module).

    A part of :class:`~replaybuffer.TransitionReplayBuffer`, which sets the state
    declared here when it is built.
    """

    # Set by TransitionReplayBuffer.__init__.
    _obs_structure: Any
    _obs_is_leaf: bool
    _obs_flatten: Callable[[Any], Sequence[Any] | None] | None
    _reward: int
    _terminated: int
    _truncated: int
    _int_checks: list[tuple[int, BoundedArraySpec]]
    _scalar_ranges: list[tuple[int, int, int]]
    _add_names: str
    _add_order: Callable[[Any], Any] | None
    _next_checks: list[tuple[LeafChecker, int, tuple[int, ...], str]]
    _no_truncation: np.ndarray
    _head_bytes: list[memoryview]
    _single_shape: tuple[int, ...]
    _tracks_adds: bool
    # Whether adds take the policy's value and log-probability (RolloutBuffer's).
    _adds_policy: ClassVar[bool] = False

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
        self._exact_order: list[int] = []  # the storage leaf of each leaf in add order
        if (self._obs_is_leaf or self._obs_flatten is not None) \
                and self._write_exact is not None:
            n = len(self._obs_leaves)
            template = {OBS: self._obs_structure.unflatten(list(range(n))),
                        **nest.map_structure(lambda k: k + n - 1, rest)}
            taken_from = nest.flatten(template)[0]  # storage leaf i is flat[taken_from[i]]
            if sorted(taken_from) == list(range(len(self._paths))):
                order = np.argsort(taken_from).tolist()  # flat[k] is storage leaf order[k]
                self._exact_order = order
                self._write_parts = reordered(self._write_exact, order)
                if self._ring.batch_size == 1 and self._obs_is_leaf:
                    # add_single's: one env's leaves as they come, without the env axis.
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
                and sum(h.nbytes for h in self._head_next) <= COPY_COMPARE_MAX
                and len(self._scalar_ranges) == len(self._int_checks)
                and not self._custom_write)


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

    def add_usual(self, observation: Any, action: Any, reward: Any, next_observation: Any,
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

    def add_single(self, observation: np.ndarray, action: Any, reward: Any,
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
        self.add(observation[None], action[None], single_reward(reward), next_observation[None],
                 terminated[None], truncated[None])

    def step_adder(self, fallback: Callable[..., Any], env_axis: bool = True,
                   names: Sequence[str] | None = None) -> Callable[..., Any] | None:
        """One function that adds the usual step in one call, with this buffer's parts
        bound in it (:mod:`replaybuffer.buffers.step_adder`), for adapters whose add is
        called once per env step (compat.pearl's ``add_trajectory``).

        ``add(observation, action, reward, next_observation, terminated,
        truncated=None)`` (a rollout's also ``value=None, log_prob=None``; named
        ``names`` where given, in that order) writes the usual step as :meth:`add`
        (``env_axis``: every leaf ``[num_envs, ...]``) or :meth:`add_single` (one env's
        step without the axis; the flags also Python bools, the reward also a float64
        scalar) would: the same bytes and bookkeeping; it returns ``None``. Any other
        step (see :meth:`_add_exact`; also under a rate limiter or while a save's
        snapshot is open) it hands, as it came and with nothing written, to
        ``fallback`` with the same arguments positionally, and returns what that
        returns. ``None`` where this buffer has no such shortcut (see
        :meth:`_exact_add_possible`; an observation of several leaves; one env's step
        where ``num_envs`` is not 1). Built once: what changes (the write head, the
        rate limiter, a save's pause) it reads from the buffer on every call.
        """
        single = not env_axis
        write = self._write_single if single else self._write_parts
        if write is None or not self._exact_add or self._obs_flatten is not None:
            return None
        policy = self._adds_policy
        names = argument_names(names, policy)
        storage = self._storage
        records = record_layout(storage.arrays, storage.checker.dtypes) \
            if type(storage) is NumpyStorage else None
        if records is not None and len(records[1]) != len(self._specs):
            records = None  # some leaves in arrays of their own: the fused writer's
        return build_step_adder(AdderParts(
            buffer=self, names=names, single=single, policy=policy, specs=self._specs,
            order=self._exact_order, write=write, records=records, ring=self._ring,
            lock=self._lock, head=self._head_next[0], head_bytes=self._head_bytes[0],
            owns=self._owns, no_flag=SINGLE_FLAGS[0] if single else self._no_truncation,
            ranges=self._exact_ranges,
            tracks_adds=self._tracks_adds, written_hook=self._written_hook,
            fallback=fallback))

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
        axis (``_write_single``, for :meth:`add_single`), which also checks the next
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
                ended = self._keep_ended(step_id, start, slot, terminated, truncated,
                                         next_observations)
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

    def _keep_ended(self, step_id: int, start: int, slot: int, terminated: Any,
                    truncated: Any, next_observations: Sequence[np.ndarray]) -> np.ndarray:
        """Keep in the side store the next observations of the rows whose episode
        ended with step ``step_id`` (written at positions ``start ..``, step slot
        ``slot``), as the shortcut adds them (lock held): flags bool ``[num_envs]``, or
        ``()`` for one env's step, and the next observations' leaves as they came.
        Returns the rows that ended, bool ``[num_envs]``."""
        ended: np.ndarray = (terminated | truncated).reshape(self._ring.batch_size)
        self._side_ref[start + self._rows[ended]] = self._put_side(
            step_id, ended, [n.reshape(h.shape)[ended]
                             for n, h in zip(next_observations, self._head_next)])
        self._owns[slot] = 1
        return ended

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
