"""One buffer, many processes on one machine, data in shared memory:
:class:`SharedReplayBuffer` (:mod:`.buffer`) and its parts."""

from replaybuffer.distributed.errors import BufferClosedError
from replaybuffer.distributed.shared.buffer import SharedReplayBuffer
from replaybuffer.distributed.shared.frame_ring import SideFramesFullError

__all__ = ["SharedReplayBuffer", "BufferClosedError", "SideFramesFullError"]
