"""TF-Agents' constructor options on the TensorFlow buffer: those it keeps, those it
refuses.

TF-Agents' ``TFUniformReplayBuffer`` takes ``scope``, ``table_fn`` and
``stateful_dataset`` and has a ``_clear(clear_all_variables)``; code written for it
reads them back. :class:`TFAgentsOptions` gives them back as TF-Agents does, and
:func:`refuse_unsupported` refuses, with a ``ValueError`` naming the option, those that
the buffer cannot honour (another storage, a ``table_fn``, frame stacks, episodes).
"""

from __future__ import annotations

from typing import Any, Protocol


def refuse_unsupported(name: str, storage: str, table_fn: Any, frame_stack: str | None,
                       track_episodes: bool) -> None:
    """Raise ``ValueError`` for the constructor options the buffer ``name`` cannot
    honour: another storage, TF-Agents' ``table_fn``, frame stacks, episode tracking."""
    if storage != "tensorflow":
        raise ValueError(f"{name} keeps its data in TensorFlow variables: "
                         f"storage must be 'tensorflow', got {storage!r}")
    if table_fn is not None:
        raise ValueError("table_fn is not supported: the buffer keeps one tf.Variable "
                         "per leaf (see replaybuffer.tf.TFStorage)")
    if frame_stack is not None:
        raise ValueError(f"frame_stack needs storage='numpy', got {storage!r}")
    if track_episodes:
        raise ValueError("track_episodes keeps episode starts in Python, which "
                         f"{name} cannot; use UniformReplayBuffer(..., "
                         "storage='tensorflow', track_episodes=True) for an eager "
                         "buffer with tensorflow storage")


class _Clears(Protocol):
    def clear(self, zero_storage: bool = False) -> None: ...


class TFAgentsOptions:
    """``scope``, ``table_fn``, ``stateful_dataset`` and ``_clear`` as TF-Agents' buffer
    has them (the constructor stores ``_scope`` and ``_stateful_dataset``)."""

    _scope: str
    _stateful_dataset: bool

    @property
    def scope(self) -> str:
        """The name scope of the variables (``<scope>/<slot>``)."""
        return self._scope

    @property
    def table_fn(self) -> None:
        """Always ``None``: one ``tf.Variable`` per leaf, no TF-Agents table."""
        return None

    @property
    def stateful_dataset(self) -> bool:
        """As given (``tf.data`` in TF 2 needs nothing of it)."""
        return self._stateful_dataset

    def _clear(self: _Clears, clear_all_variables: bool = False) -> None:
        """TF-Agents' name: ``clear`` with ``zero_storage=clear_all_variables``."""
        self.clear(zero_storage=clear_all_variables)
