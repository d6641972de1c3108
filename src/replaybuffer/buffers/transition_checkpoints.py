"""What a transition buffer's checkpoint keeps beside the ring, and how a restore
rebuilds the buffer.

:class:`TransitionCheckpoints` is the part of
:class:`~replaybuffer.TransitionReplayBuffer` that saves and restores: the constructor's
arguments (:meth:`~TransitionCheckpoints.constructor_config`: every argument but
``storage`` and ``device``, which the checkpoint keeps beside them, and
``rate_limiter``, a live object set on the loaded buffer again; arguments added later
are saved only where they differ from their default, so that a checkpoint written
before them loads as a buffer built without them), and the next-observation
bookkeeping (the side store, sized by what is held).

``sample_on_device`` (and a prioritized buffer's ``device_search``) come back where the
buffer is loaded into torch storage; loaded into other storage, it samples on the host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from replaybuffer.buffers.device_sampling import for_storage
from replaybuffer.buffers.transition_reads import TransitionReads

if TYPE_CHECKING:
    from typing_extensions import Self

    from replaybuffer.buffers.device_transition_reads import DeviceTransitionReads
    from replaybuffer.storage.frozen import FrozenRows


class TransitionCheckpoints(TransitionReads):
    """Save and restore of a transition buffer (see the module).

    A part of :class:`~replaybuffer.TransitionReplayBuffer`, which sets the state
    declared here when it is built.
    """

    # Set by TransitionReplayBuffer.__init__.
    _config_values: dict[str, Any]  # the constructor's keywords, specs unencoded
    _device_reads: DeviceTransitionReads | None

    def constructor_config(self) -> dict[str, Any]:
        from replaybuffer.persist import encode_spec

        config = dict(self._config_values)
        config["observation_spec"] = encode_spec(config["observation_spec"])
        config["action_spec"] = encode_spec(config["action_spec"])
        return config

    @classmethod
    def rebuild(cls, data_spec: Any, batch_size: int, max_length: int, storage: str,
                device: Any, config: dict[str, Any]) -> Self:
        from replaybuffer.persist import decode_spec

        config = for_storage(dict(config), storage)  # other storage: on the host
        obs, act = decode_spec(config.pop("observation_spec")), \
            decode_spec(config.pop("action_spec"))
        return cls(obs, act, config.pop("capacity"), storage=storage, device=device, **config)

    def snapshot(self) -> tuple[dict[str, Any], dict[str, FrozenRows]]:
        state, arrays = super().snapshot()
        state.update(self._side_state())  # sized by what is held, not by the capacity
        return state, arrays

    def restore_state(self, state: dict[str, Any], arrays: list[np.ndarray] | None) -> None:
        self._check_side_state(state)  # before anything changes
        super().restore_state(state, arrays)

    def _restore_own_parts(self, state: dict[str, Any]) -> None:
        super()._restore_own_parts(state)
        self._restore_side(state, self._check_side_state(state))
        if self._device_reads is not None:  # the device copy of the side state too
            self._device_reads.mirror.invalidate()
