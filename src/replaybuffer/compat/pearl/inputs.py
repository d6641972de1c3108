"""Pearl's inputs as the core buffer takes them: one add per env step, the usual
step handed to the core's shortcut as it came."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from replaybuffer.buffers.transition_add import SINGLE_FLAGS
from replaybuffer.storage.base import to_numpy

if TYPE_CHECKING:
    from replaybuffer.buffers.transitions import TransitionReplayBuffer
    from replaybuffer.specs import ArraySpec

_FLOATS = (float, np.float64, np.float32)  # Python and numpy scalars a reward comes as
_FLAGS = (bool, np.bool_)


class PearlInputs:
    """The add of compat.pearl's buffers (a part of
    :class:`~replaybuffer.compat.pearl.BaseBuffer`, which sets the state declared
    here)."""

    core: TransitionReplayBuffer
    vector: bool  # inputs carry an env axis
    _direct: bool  # an env's arrays may go to the core as they come
    _action_path: str
    _paths: list[str]  # the core's stored leaves
    _specs: list[ArraySpec]

    def _add(self, observation: Any, action: Any, reward: Any, next_observation: Any,
             done: Any, truncated: Any = None, *policy: Any) -> None:
        """Give the core one transition per env; ``policy``: the rollout's ``value`` and
        ``log_prob``, passed on positionally (keywords would cost a dict per add).

        A vector env's step goes to the core's shortcut as it came (the usual step:
        arrays of the stored dtypes, float64 rewards included, checked once by the
        fused writer) and is converted (:meth:`_core_leaves`) only when the shortcut did
        not take it; one env's step to the core's ``add_single``
        (:meth:`_single_leaves`)."""
        core = self.core
        if self.vector:
            if not (self._direct and core.add_usual(observation, action, reward,
                                                    next_observation, done, truncated,
                                                    *policy)):
                core.add(*self._core_leaves(observation, action, reward, next_observation,
                                            done, truncated), *policy)
            return
        single = self._single_leaves(observation, action, reward, next_observation, done,
                                     truncated)
        if single is not None:
            core.add_single(*single, *policy)
        else:
            core.add(*self._core_leaves(observation, action, reward, next_observation,
                                        done, truncated), *policy)

    def _single_leaves(self, observation: Any, action: Any, reward: Any,
                       next_observation: Any, done: Any, truncated: Any
                       ) -> tuple[Any, Any, Any, Any, Any, Any] | None:
        """One env's inputs as the core's ``add_single`` takes them (no env axis:
        arrays as they come, the reward a Python float, the flags bool 0-d arrays), when
        they are what an env gives (array observations and actions, a float reward,
        bool flags); ``None`` otherwise (and for a vector env), for
        :meth:`_core_leaves`. The core then takes its shortcut for the usual step
        without the views of an added axis, or adds the axis and checks everything."""
        ndarray = np.ndarray
        if self._direct and not self.vector and type(observation) is ndarray and \
                type(action) is ndarray and type(next_observation) is ndarray and \
                type(reward) in _FLOATS and type(done) in _FLAGS and \
                (truncated is None or type(truncated) in _FLAGS):
            flags = SINGLE_FLAGS
            # A float64 scalar as the float it holds; a float32 one as it is (exactly
            # its bytes, where a round trip through float could change a NaN's).
            return (observation, action,
                    float(reward) if type(reward) is np.float64 else reward,
                    next_observation, flags[1 if done else 0],
                    None if truncated is None else flags[1 if truncated else 0])
        return None

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
