"""The errors of the multi-process and multi-machine buffers.

Each subclasses :class:`~replaybuffer.errors.ReplayBufferError` and the built-in
exception a Python user would expect, as every error of the library does.
"""

from __future__ import annotations

from replaybuffer.errors import ReplayBufferError


class BufferClosedError(ReplayBufferError, RuntimeError):
    """The shared buffer was closed by the process that made it."""


class ShardsUnavailableError(ReplayBufferError, RuntimeError):
    """Every shard is down (restarting, or out of restarts)."""


class ShardStartError(ReplayBufferError, RuntimeError):
    """A shard could not start: its factory raised, or its actor died starting."""


class NotSupportedError(ReplayBufferError, NotImplementedError):
    """A method of the buffer surface (:class:`~replaybuffer.protocols.Buffer`) that this
    buffer cannot do yet. The message names the buffer class and what to use instead;
    the conformance suite (``tests/test_conformance.py``) lists each such gap."""


def not_supported(cls: type, what: str, instead: str) -> NotSupportedError:
    """The error for ``cls`` lacking ``what``: ``"SharedReplayBuffer does not support
    clear() yet; use ..."``."""
    return NotSupportedError(f"{cls.__name__} does not support {what} yet; {instead}")
