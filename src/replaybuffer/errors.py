"""The exceptions replaybuffer raises.

Every error subclasses both :class:`ReplayBufferError` (so one ``except`` catches
everything this library raises on purpose) and the built-in exception a Python
user would expect (``ValueError`` for bad values, ``TypeError`` for bad types).
"""

from __future__ import annotations


class ReplayBufferError(Exception):
    """Base class of every error raised on purpose by replaybuffer."""


class SpecError(ReplayBufferError, ValueError):
    """Data does not match a spec: nest structure, shape, dtype or batch size.

    The message names the leaf path (``[1][0]`` or ``['observation']``), what was
    expected and what came.
    """


class EmptyBufferError(ReplayBufferError, ValueError):
    """A read needs more data than the buffer holds.

    Raised when sampling an empty buffer, and when ``num_steps`` is longer than
    what each row holds (TF-Agents raises its "is empty" error in both cases).
    """


class CheckpointError(ReplayBufferError, ValueError):
    """A directory is not a complete, uncorrupted, matching save of a buffer."""
