"""Each writer's writes applied in the order it sent them (:class:`WriteOrder`).

A threaded Ray actor may start calls in another order than they were sent, so every
write carries its writer's name and number (``seq``, from 0) and the shard holds one
that arrives early until those before it came. Each write also carries the writer's
``base``: the lowest number it had not yet seen settled when it sent the write. Every
write below ``base`` was applied or is lost for good (it went to a shard process that
died), so nothing below it is waited for: after a restart, the new shard process
starts a writer at the ``base`` its writes bring, never at 0. A writer's ``flush``
ends with :meth:`WriteOrder.release` once all its writes are settled, so writes held
for one lost on the way are applied before ``flush`` returns. :data:`GAP_S` is the
last resort for a writer that never flushes.
"""

from __future__ import annotations

import time
from typing import Generic, TypeVar

GAP_S = 5.0
"""How long a shard holds a writer's early writes for a missing earlier one."""

Payload = TypeVar("Payload")


class WriteOrder(Generic[Payload]):
    """Per writer: the next number to apply and the writes held until it comes."""

    def __init__(self) -> None:
        self.next_seq: dict[str, int] = {}
        self.held: dict[str, dict[int, Payload]] = {}
        self.since: dict[str, float] = {}

    def arrive(self, writer: str, seq: int, base: int, payload: Payload) -> list[Payload]:
        """Write ``seq`` of ``writer`` came; the payloads now due, in order (possibly
        none: it is held)."""
        held = self.held.setdefault(writer, {})
        expected = max(self.next_seq.get(writer, 0), base)
        # Held writes the base has moved past (the one they waited for was lost):
        # due now, in order, before anything after them.
        due = [held.pop(k) for k in sorted(k for k in held if k < expected)]
        if seq < expected:  # a duplicate, or one already given up on: apply it now
            return due + [payload]
        held[seq] = payload
        if expected not in held:
            since = self.since.setdefault(writer, time.monotonic())
            if time.monotonic() - since > GAP_S:
                expected = min(held)
        while expected in held:
            due.append(held.pop(expected))
            expected += 1
        if due:
            self.since.pop(writer, None)
        self.next_seq[writer] = expected
        return due

    def waiting(self, writer: str) -> int:
        """How many of ``writer``'s writes are held."""
        return len(self.held.get(writer, ()))

    def release(self, writer: str) -> list[Payload]:
        """Every held write of ``writer``, in order: it has seen all its writes
        settled, so the ones missing were lost and will never come."""
        held = self.held.pop(writer, {})
        self.since.pop(writer, None)
        if held:
            self.next_seq[writer] = max(held) + 1
        return [held[seq] for seq in sorted(held)]
