"""What the local buffers have and a shared buffer refuses, by name: n-step transitions
(``n_step``).

n-step transitions are :class:`~replaybuffer.TransitionReplayBuffer`'s, which folds
rewards as steps arrive in one process. Use that local buffer (one per process, or a
:class:`~replaybuffer.distributed.RayReplayBuffer` of them), or sample windows of
``num_steps=n + 1`` and fold the rewards. (Frame dedup, ``frame_stack``, a shared buffer
has: :mod:`.frame_ring`.)
"""

from __future__ import annotations

from replaybuffer.distributed.errors import NotSupportedError, not_supported


def refuse_local_only(cls: type, n_step: int | None) -> None:
    """Raise :class:`NotSupportedError` naming ``n_step`` when given.

    Raises:
        NotSupportedError: ``n_step`` is not ``None``.
    """
    if n_step is not None:
        raise not_supported(cls, f"n_step={n_step!r} (n-step transitions)",
                            "use a TransitionReplayBuffer, or sample windows of "
                            "num_steps=n + 1 and fold the rewards")


__all__ = ["NotSupportedError", "refuse_local_only"]
