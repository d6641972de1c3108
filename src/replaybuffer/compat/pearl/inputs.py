"""Pearl's inputs as the core buffer takes them: one add per env step, the usual
step written by one call.

``add_trajectory`` of :class:`~replaybuffer.compat.pearl.ReplayBuffer` and
:class:`~replaybuffer.compat.pearl.RolloutBuffer` is, on each buffer, the core's
one-call adder (:meth:`~replaybuffer.TransitionReplayBuffer.step_adder`, set as an
attribute of the buffer by :meth:`PearlInputs._compile_add`, where the core's leaves are
the env's arrays): a step as the env gives it (observations and action arrays of the
stored dtypes and shapes, the reward a Python or numpy float, the flags bools; a
vector env's as arrays with the env axis) is checked, compared and written in that one
call, with no call to the adapter's methods or the core's. A call less matters: in a
training loop an add runs between other work, with cold caches, where every frame and
attribute read costs several times what it costs in a loop of adds (Pearl 0.4.1's whole
add is one method). Any other step goes, with nothing written, to the class's own
``add_trajectory``, whose :meth:`PearlInputs._add` hands what it can to the core's
``add_single`` or ``add_usual`` (``_add_single``, ``_add_usual``: passed as the core
takes them, a float64 reward as a Python float, the flags as ``FLAGS[flag]``) and
converts the rest. A subclass that defines its own
``add_trajectory`` keeps it (only a class that sets ``_compiled_add`` gets the adder).
"""

from __future__ import annotations

import inspect
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from replaybuffer.buffers.transition_add import SINGLE_FLAGS
from replaybuffer.storage.base import to_numpy

if TYPE_CHECKING:
    from replaybuffer.buffers.transitions import TransitionReplayBuffer
    from replaybuffer.specs import ArraySpec

ndarray = np.ndarray
REWARD_TYPES = (float, np.float64, np.float32)  # Python and numpy scalars a reward comes as
FLAG_TYPES = (bool, np.bool_)
FLAGS = SINGLE_FLAGS  # one env's flags as add_single takes them: FLAGS[done]


class PearlInputs:
    """The add of compat.pearl's buffers (a part of
    :class:`~replaybuffer.compat.pearl.BaseBuffer`, which sets the state declared
    here)."""

    core: TransitionReplayBuffer
    vector: bool  # inputs carry an env axis
    _direct: bool  # an env's arrays may go to the core as they come
    _add_single: Any  # the core's add_single where one env's step may go to it, or None
    _add_usual: Any  # the core's add_usual where a vector env's step may, or None
    _step_add: Any  # the core's one-call adder standing in for add_trajectory, or None
    _action_path: str
    _paths: list[str]  # the core's stored leaves
    _specs: list[ArraySpec]

    def _compile_add(self) -> Any:
        """The core's one-call adder (:meth:`~replaybuffer.TransitionReplayBuffer.step_adder`)
        under ``add_trajectory``'s names, its fallback this class's ``add_trajectory``;
        ``None`` where the core has none, or where ``add_trajectory`` is not the one of a
        class that says it may be compiled (``_compiled_add``: a subclass's own
        ``add_trajectory`` is kept)."""
        owner = next(c for c in type(self).__mro__ if "add_trajectory" in vars(c))
        if not vars(owner).get("_compiled_add", False):
            return None
        method = vars(owner)["add_trajectory"]
        # The adder stands in for add_trajectory on this adapter, so it must not hold
        # the adapter itself: that would be a reference cycle, and a deleted adapter
        # (and its core's memory) would wait for the garbage collector.
        adapter = weakref.ref(self)

        def fallback(*args: Any) -> Any:
            owner = adapter()
            if owner is None:  # held on its own, it outlived the adapter it stands for
                raise ReferenceError(
                    f"{method.__qualname__}: the adapter it belongs to was deleted; "
                    "keep the adapter alive while its add_trajectory is in use (this "
                    "add_trajectory does not hold it, so that a deleted adapter and its "
                    "memory are freed at once)")
            return method(owner, *args)
        names = tuple(inspect.signature(method).parameters)[1:]
        adder = self.core.step_adder(fallback, env_axis=self.vector, names=names)
        if adder is not None:
            adder.__name__, adder.__qualname__ = method.__name__, method.__qualname__
            adder.__doc__, adder.__annotations__ = method.__doc__, method.__annotations__
        return adder

    def _add(self, observation: Any, action: Any, reward: Any, next_observation: Any,
             done: Any, truncated: Any = None, *policy: Any) -> None:
        """Give the core one transition per env: the route of a step the one-call adder
        handed back, or of every step where there is none (see the module). What it
        can goes to the core's ``add_single`` (one env's arrays as they come, a float64
        reward as a Python float, the flags as ``FLAGS[flag]``) or ``add_usual`` (a
        vector env's, which takes or refuses it); the rest is converted
        (:meth:`_core_leaves`). ``policy``: the rollout's ``value`` and ``log_prob``,
        passed on positionally (keywords would cost a dict per add)."""
        single = self._add_single
        if single is not None:
            if type(observation) is ndarray and type(action) is ndarray and \
                    type(next_observation) is ndarray and type(reward) in REWARD_TYPES \
                    and type(done) in FLAG_TYPES and \
                    (truncated is None or type(truncated) in FLAG_TYPES):
                # A float64 scalar as the float it holds; a float32 one as it is
                # (exactly its bytes, where a round trip could change a NaN's).
                single(observation, action,
                       float(reward) if type(reward) is np.float64 else reward,
                       next_observation, FLAGS[1 if done else 0],
                       None if truncated is None else FLAGS[1 if truncated else 0], *policy)
                return
        elif (usual := self._add_usual) is not None and usual(
                observation, action, reward, next_observation, done, truncated, *policy):
            return
        self.core.add(*self._core_leaves(observation, action, reward, next_observation,
                                         done, truncated), *policy)

    def _core_leaves(self, observation: Any, action: Any, reward: Any, next_observation: Any,
                     done: Any, truncated: Any) -> tuple[Any, Any, Any, Any, Any, Any]:
        """Pearl's inputs of one add as the core's ``add`` takes them (observation,
        action, reward, next observation, terminated, truncated; each ``[num_envs, ...]``).

        For a step the core's shortcut did not take (:meth:`_add`). What a vector env
        gives passes as it came (arrays; float rewards of any width, cast by the core):
        the core's ``add`` checks and converts them on its general path (an episode's
        first observation after a reset is not the previous next observation). Other
        inputs (lists, tensors, dicts, Pearl's trailing 1 of scalar fields) are
        converted leaf by leaf (``_batched``).
        """
        ndarray = np.ndarray
        if self._direct and self.vector and type(observation) is ndarray and \
                type(action) is ndarray and type(next_observation) is ndarray and \
                type(reward) is ndarray and reward.dtype.kind == "f" and reward.ndim == 1 \
                and type(done) is ndarray and done.ndim == 1 and \
                (truncated is None or type(truncated) is ndarray and truncated.ndim == 1):
            return observation, action, reward, next_observation, done, truncated
        return (self._batched(observation), self._batched(action, self._action_path),
                self._batched(reward, "scalar"), self._batched(next_observation),
                self._batched(done, "scalar"),
                None if truncated is None else self._batched(truncated, "scalar"))

    def _batched(self, value: Any, scalar: str | None = None) -> Any:
        """``value`` with a leading env axis; Pearl's trailing 1 of scalar fields dropped."""
        def one(leaf: Any) -> Any:
            arr = to_numpy(leaf)
            if not self.vector:
                arr = arr[None]
            if scalar is not None and arr.ndim == 2 and arr.shape[1] == 1 and \
                    self._scalar(scalar):
                arr = arr[:, 0]
            return arr
        if isinstance(value, dict):
            return {key: one(v) for key, v in value.items()}
        return one(value)

    def _scalar(self, which: str) -> bool:
        if which == "scalar":
            return True
        index = self._paths.index(which) if which in self._paths else None
        return index is not None and self._specs[index].shape == ()
