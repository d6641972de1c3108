"""What :mod:`replaybuffer.persist` needs of a buffer: the seam it saves and restores
through.

Every :class:`~replaybuffer.ReplayBuffer` satisfies :class:`SavableBuffer`. A save takes,
under :attr:`~SavableBuffer.lock`, the buffer's state and copy-on-write views of its
large arrays (:meth:`~SavableBuffer.snapshot`), streams those out chunk by chunk, and
releases them; a restore builds an empty buffer of the saved class
(:meth:`~SavableBuffer.rebuild`), streams the arrays in where
:meth:`~SavableBuffer.stream_targets` says, and puts the state back
(:meth:`~SavableBuffer.restore_state`). The state is a nest of the parts'
:meth:`~replaybuffer.protocols.Checkpointable.state_dict` s (ring, sampler, episodes,
frame codec, ...).
"""

from __future__ import annotations

from typing import Any, Callable, ContextManager, Mapping, NamedTuple, Protocol, Sequence

import numpy as np

from replaybuffer.protocols import Buffer
from replaybuffer.specs import ArraySpec
from replaybuffer.storage.frozen import FrozenRows


class StreamTarget(NamedTuple):
    """Where a restore writes one stream: its arrays' specs, its positions, a function
    writing arrays ``[n, *spec.shape]`` at positions ``[start, start + n)``, and the
    arrays that are read in place instead (:mod:`replaybuffer.persist.in_place`)."""

    specs: Sequence[ArraySpec]
    positions: int
    write: Callable[[int, list[Any]], None]
    """``write(start, arrays)``: ``arrays[k]`` is ``None`` where ``in_place[k]`` is given
    (its data are there already), an array ``[n, *spec.shape]`` otherwise."""
    in_place: Sequence[np.ndarray | None] = ()
    """Empty, or per array the block ``[positions, *spec.shape]`` (C-contiguous,
    writable) that its file is read into directly, or ``None``."""


class SavableBuffer(Buffer, Protocol):
    """A buffer that :func:`replaybuffer.persist.save` and
    :func:`~replaybuffer.persist.load` handle: the :class:`~replaybuffer.protocols.Buffer`
    surface, its layout, and the snapshot and restore hooks."""

    @property
    def lock(self) -> ContextManager[Any]:
        """The lock every read and write of the buffer holds (a ``threading.Lock``)."""

    @property
    def batch_size(self) -> int: ...

    @property
    def max_length(self) -> int: ...

    @property
    def storage(self) -> str:
        """The storage backend's name (``"numpy"``, ``"torch"``, ``"mmap"``, ...)."""

    @property
    def store(self) -> Any:
        """The storage object (an :class:`~replaybuffer.storage.mmap_storage.MmapStorage`
        for ``storage="mmap"``)."""

    @property
    def device(self) -> Any: ...

    def constructor_config(self) -> dict[str, Any]:
        """Constructor keywords a restored buffer needs besides spec and layout."""

    @classmethod
    def rebuild(cls, data_spec: Any, batch_size: int, max_length: int, storage: str,
                device: Any, config: dict[str, Any]) -> Any:
        """An empty buffer of this class, for a restore."""

    def snapshot(self) -> tuple[dict[str, Any], dict[str, FrozenRows]]:
        """``(state, streams)``, the caller holding :attr:`lock`."""

    def release_snapshot(self) -> None:
        """End what :meth:`snapshot` started, the caller holding :attr:`lock`."""

    def stream_targets(self, state: dict[str, Any]) -> Mapping[str, StreamTarget]:
        """Where a restore of ``state`` writes each stream of :meth:`snapshot`."""

    def restore_state(self, state: dict[str, Any], arrays: list[np.ndarray] | None) -> None:
        """Put ``state`` back (``arrays``: the storage's leaves, or ``None`` where they
        were streamed in already)."""

    def catch_up(self, last_id: int, stale: bool) -> None:
        """After a reopen: take in the steps the files committed after the saved state."""
