"""Replay beyond one process: :class:`SharedReplayBuffer` (processes on one machine,
shared memory; standard library and numpy only)."""

from replaybuffer.distributed.shared import BufferClosedError, SharedReplayBuffer

__all__ = ["SharedReplayBuffer", "BufferClosedError"]
