"""What the local buffers have and a shared buffer refuses, by name: frame dedup
(``frame_stack``) and n-step transitions (``n_step``).

Frame dedup stores each frame once and steps as references into a frame ring whose
slots a writer recycles (:mod:`replaybuffer.storage.frames`); across writer processes
that ring would need its own version protocol, which the shared buffer does not have.
n-step transitions are :class:`~replaybuffer.TransitionReplayBuffer`'s, which folds
rewards as steps arrive in one process. Use those local buffers (one per process, or a
:class:`~replaybuffer.distributed.RayReplayBuffer` of them).
"""

from __future__ import annotations

from replaybuffer.distributed.errors import NotSupportedError, not_supported


def refuse_local_only(cls: type, frame_stack: str | None, n_step: int | None) -> None:
    """Raise :class:`NotSupportedError` naming ``frame_stack`` or ``n_step`` when given.

    Raises:
        NotSupportedError: ``frame_stack`` or ``n_step`` is not ``None``.
    """
    if frame_stack is not None:
        raise not_supported(cls, f"frame_stack={frame_stack!r} (frame dedup)",
                            "use a ReplayBuffer with frame_stack in each process, or a "
                            "RayReplayBuffer of them")
    if n_step is not None:
        raise not_supported(cls, f"n_step={n_step!r} (n-step transitions)",
                            "use a TransitionReplayBuffer, or sample windows of "
                            "num_steps=n + 1 and fold the rewards")


__all__ = ["NotSupportedError", "refuse_local_only"]
