"""Rate limiters: keep the ratio of samples to inserts where an algorithm needs it.

A limiter counts items: an ``add_batch`` inserts ``batch_size`` of them (``extend``,
``batch_size * num_steps``), a ``get_next(S, ...)`` samples ``S``. It tracks

    diff = inserts * samples_per_insert - samples

and lets a call through when, after it, the diff stays within ``[min_diff, max_diff]``:

- an insert of ``n`` items goes ahead while the buffer would hold at most
  ``min_size_to_sample`` items (stage 1: filling up), or when
  ``(inserts + n) * samples_per_insert - samples <= max_diff``;
- a sample of ``S`` goes ahead when the buffer holds at least ``min_size_to_sample``
  items and ``inserts * samples_per_insert - (samples + S) >= min_diff``.

Otherwise the caller waits (on the buffer's lock, so a writer and a learner in two
threads pace each other), up to ``timeout`` seconds, then :class:`RateLimitedError`;
``block=False`` returns at once instead. The arithmetic lives in :meth:`RateLimiter.
can_insert` and :meth:`RateLimiter.can_sample`, pure functions of the counters.

The counters run for as long as the limiter is attached: a buffer's ``clear()`` empties
the buffer (the size goes to 0, so samples wait for ``min_size_to_sample`` items again)
but keeps ``inserts``, ``samples`` and the diff, so the run's ratio holds across it.

Configurations that could leave both sides waiting for each other are refused: by the
constructors (a window narrower than one item each way, as Reverb refuses), when the
limiter is attached (a ``min_size_to_sample`` larger than the buffer can hold), and at
call time (a call too large for the window, given the largest call seen on the other
side). A refusal says why.

Calls waiting on both sides can still block each other: in a window ``[0, 20]`` at
diff 10, a sample of 15 waits for the diff to reach 15 and an insert of 15 waits for it
to fall to 5. Only inserts raise the diff and only samples lower it, so once every
waiting insert and every waiting sample is held back (the smallest of each, as a
smaller call is the likelier to go), none of them can ever go ahead on its own. Such a
deadlock (:meth:`RateLimiter.deadlocked`) is refused rather than waited out: the call
that finds it, arriving or woken, raises ``ValueError`` naming the call it waits on;
the other keeps waiting and goes ahead once another call moves the diff.
"""

from __future__ import annotations

import math
import numbers
import threading
import time
import warnings
from typing import Any, Callable, NamedTuple

from replaybuffer.arguments import check_timeout
from replaybuffer.errors import ReplayBufferError


class RateLimitedError(ReplayBufferError, TimeoutError):
    """An insert or sample waited ``timeout`` seconds (or was told not to wait) and the
    rate limiter still held it back. Nothing was written or read."""


class RateLimiterStats(NamedTuple):
    """Counters of a rate-limited buffer (``buffer.stats()``).

    Attributes:
        inserts, samples: items inserted and sampled since the limiter was attached.
        size: items the buffer holds now.
        insert_blocked_s, sample_blocked_s: seconds callers spent waiting.
        inserts_blocked, samples_blocked: calls that had to wait (or were refused).
        diff: ``inserts * samples_per_insert - samples``.
    """

    inserts: int
    samples: int
    size: int
    insert_blocked_s: float
    sample_blocked_s: float
    inserts_blocked: int
    samples_blocked: int
    diff: float


class RateLimiter:
    """Keeps ``inserts * samples_per_insert - samples`` within ``[min_diff, max_diff]``
    once ``min_size_to_sample`` items are held (see the module docstring).

    Args:
        samples_per_insert: how many times, on average, each item should be sampled.
        min_size_to_sample: items the buffer must hold before any sample.
        min_diff, max_diff: the window the diff is kept in (``-inf``/``inf`` for none).

    Raises:
        ValueError: a non-positive ratio or size, ``min_diff > max_diff``, or a window
            that would deadlock (see :class:`SampleToInsertRatio`).
    """

    def __init__(self, samples_per_insert: float, min_size_to_sample: int,
                 min_diff: float, max_diff: float):
        if not (isinstance(samples_per_insert, (int, float)) and samples_per_insert > 0
                and math.isfinite(samples_per_insert)):
            raise ValueError(f"samples_per_insert must be a positive number, got "
                             f"{samples_per_insert!r}")
        if isinstance(min_size_to_sample, bool) or not isinstance(min_size_to_sample, int) \
                or min_size_to_sample < 1:
            raise ValueError(f"min_size_to_sample ({min_size_to_sample!r}) must be a "
                             "positive integer")
        if math.isnan(min_diff) or math.isnan(max_diff) or min_diff > max_diff:
            raise ValueError(f"min_diff ({min_diff}) must not exceed max_diff ({max_diff})")
        if max_diff - min_diff < 2 * max(1.0, samples_per_insert):
            raise ValueError(
                f"the window [min_diff, max_diff] = [{min_diff}, {max_diff}] must be at least "
                f"2 * max(1, samples_per_insert) = {2 * max(1.0, samples_per_insert)} wide: "
                "a narrower one can hold back an insert and a sample at the same time, and "
                "each would wait for the other forever")
        if min_diff > samples_per_insert * min_size_to_sample:
            raise ValueError(
                f"min_diff ({min_diff}) is above samples_per_insert * min_size_to_sample "
                f"({samples_per_insert * min_size_to_sample}): once min_size_to_sample items "
                "are in, no sample could ever go ahead, and inserts would wait for samples "
                "forever")
        if max_diff < samples_per_insert * min_size_to_sample:
            warnings.warn(
                f"max_diff ({max_diff}) is below samples_per_insert * min_size_to_sample "
                f"({samples_per_insert * min_size_to_sample}): inserts will wait for samples "
                "as soon as min_size_to_sample items are in, which deadlocks a program that "
                "inserts and samples from one thread", stacklevel=3)
        self.samples_per_insert = float(samples_per_insert)
        self.min_size_to_sample = min_size_to_sample
        self.min_diff, self.max_diff = float(min_diff), float(max_diff)
        self.inserts = self.samples = 0
        self.insert_blocked_s = self.sample_blocked_s = 0.0
        self.inserts_blocked = self.samples_blocked = 0
        # The largest insert and sample seen: a call that could never go ahead beside
        # them (the window too narrow) is refused instead of waiting forever. A shared
        # buffer's limiter reads them from the shared control block before each check.
        self.largest_insert = self.largest_sample = 1
        # The sizes of the calls waiting now (not state: they end with their callers),
        # for the deadlock check; changed under the buffer's lock.
        self._waiting: dict[str, list[int]] = {"insert": [], "sample": []}
        self._condition: threading.Condition | None = None

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(samples_per_insert={self.samples_per_insert}, "
                f"min_size_to_sample={self.min_size_to_sample}, min_diff={self.min_diff}, "
                f"max_diff={self.max_diff})")

    # ------------------------------------------------------------- the arithmetic
    @property
    def diff(self) -> float:
        return self.inserts * self.samples_per_insert - self.samples

    def can_insert(self, n: int, size: int) -> bool:
        """Whether inserting ``n`` items into a buffer holding ``size`` may go ahead."""
        if size + n <= self.min_size_to_sample:
            return True
        return (self.inserts + n) * self.samples_per_insert - self.samples <= self.max_diff

    def can_sample(self, n: int, size: int) -> bool:
        """Whether sampling ``n`` items from a buffer holding ``size`` may go ahead."""
        if size < self.min_size_to_sample:
            return False
        return self.inserts * self.samples_per_insert - (self.samples + n) >= self.min_diff

    def check_insert_size(self, n: int) -> None:
        """Raise ``ValueError`` if an insert of ``n`` items, held back, could never go
        ahead beside samples as large as the largest seen."""
        window = self.max_diff - self.min_diff
        if n * self.samples_per_insert + self.largest_sample > window:
            raise ValueError(
                f"an insert of {n} items at {self.samples_per_insert} samples per insert "
                f"needs a window of {n * self.samples_per_insert + self.largest_sample} "
                f"beside samples of {self.largest_sample}; {self!r} has {window}: it "
                "would wait forever")

    def check_sample_size(self, n: int) -> None:
        """Raise ``ValueError`` if a sample of ``n`` items, held back, could never go
        ahead beside inserts as large as the largest seen."""
        window = self.max_diff - self.min_diff
        if n + self.largest_insert * self.samples_per_insert > window:
            raise ValueError(
                f"a sample of {n} items needs a window of "
                f"{n + self.largest_insert * self.samples_per_insert} beside inserts of "
                f"{self.largest_insert}; {self!r} has {window}: it would wait forever")

    def deadlocked(self, insert: int, sample: int, size: int) -> bool:
        """Whether an insert of ``insert`` items and a sample of ``sample`` items, both
        waiting (the smallest waiting on each side), are both held back in a buffer
        holding ``size``: then neither can ever go ahead unless some other call moves
        the counters (a smaller call held back means every larger one is too)."""
        return not self.can_insert(insert, size) and not self.can_sample(sample, size)

    def deadlock_error(self, what: str, n: int, other: int, size: int) -> ValueError:
        """The refusal of a ``what`` (``"insert"`` or ``"sample"``) of ``n`` items that
        would wait forever beside a waiting call of ``other`` items on the other side."""
        waits_for, other_kind = ("samples", "sample") if what == "insert" else \
            ("inserts", "insert")
        return ValueError(
            f"deadlock: the {what} of {n} items waits for {waits_for} and the {other_kind} "
            f"of {other} items waiting waits for {what}s; {self!r} holds both back "
            f"({self.inserts} inserts, {self.samples} samples, diff {self.diff:g}, {size} "
            f"items held), so neither could ever go ahead: it would wait forever. The "
            f"{what} is refused; use smaller calls or a wider window")

    def check_capacity(self, capacity: int) -> None:
        """Raise ``ValueError`` if a buffer of ``capacity`` items could never hold
        ``min_size_to_sample``."""
        if self.min_size_to_sample > capacity:
            raise ValueError(f"min_size_to_sample ({self.min_size_to_sample}) is more than "
                             f"the buffer can hold ({capacity}): no sample could ever go "
                             "ahead")

    # ----------------------------------------------------------------- attaching
    def attach(self, lock: Any, capacity: int) -> None:
        """Bind to a buffer's lock (waits happen on it) and check it can fill up."""
        if self._condition is not None:
            raise ValueError(f"{self!r} is attached to a buffer already: give each buffer "
                             "a limiter of its own")
        self.check_capacity(capacity)
        self._condition = threading.Condition(lock)

    def detach(self) -> None:
        self._condition = None

    # ------------------------------------------------------------------- waiting
    def await_insert(self, n: int, size: Callable[[], int], timeout: float | None,
                     block: bool) -> bool:
        """Wait (holding the buffer's lock) until ``n`` items may be inserted; ``size()``
        gives the buffer's size. ``False`` if ``block`` is false and they may not now.

        Raises:
            RateLimitedError: ``timeout`` passed first.
            ValueError: an insert this large could never go ahead; it and a waiting
                sample hold each other back (a deadlock, see the module docstring);
                ``timeout`` is NaN or negative.
        """
        if self.can_insert(n, size()):
            return True
        self.check_insert_size(n)
        return self._wait(lambda: self.can_insert(n, size()), "insert", n, timeout, block,
                          size)

    def await_sample(self, n: int, size: Callable[[], int], timeout: float | None,
                     block: bool) -> bool:
        """Wait (holding the buffer's lock) until ``n`` items may be sampled. As
        :meth:`await_insert` otherwise."""
        if self.can_sample(n, size()):
            return True
        self.check_sample_size(n)
        return self._wait(lambda: self.can_sample(n, size()), "sample", n, timeout, block,
                          size)

    def _wait(self, ready: Callable[[], bool], what: str, n: int, timeout: float | None,
              block: bool, size: Callable[[], int]) -> bool:
        condition = self._condition
        assert condition is not None, "await_* needs an attached limiter"
        # Buffers check at their entry points; this covers every other caller before
        # a NaN (never reached by any deadline) could make the wait endless.
        timeout = check_timeout(timeout)
        if what == "insert":
            self.inserts_blocked += 1
        else:
            self.samples_blocked += 1
        if not block:
            return False
        mine = self._waiting[what]
        others = self._waiting["sample" if what == "insert" else "insert"]
        start = time.perf_counter()
        # An infinite timeout is no deadline (Condition.wait refuses one that large).
        deadline = None if timeout is None or timeout == math.inf else start + timeout
        mine.append(n)
        try:
            # Checked on arrival and at every wake-up (the counters moved): a deadlock
            # with the calls waiting on the other side is refused, not waited out.
            while not ready():
                if others:
                    other = min(others)
                    pair = (n, other) if what == "insert" else (other, n)
                    if self.deadlocked(*pair, size()):
                        raise self.deadlock_error(what, n, other, size())
                left = None if deadline is None else deadline - time.perf_counter()
                if left is not None and left <= 0:
                    raise RateLimitedError(
                        f"{what} of {n} items held back by {self!r} for {timeout} s: "
                        f"{self.inserts} inserts, {self.samples} samples (diff "
                        f"{self.diff:g}), {size()} items held")
                condition.wait(left)
        finally:
            mine.remove(n)
            waited = time.perf_counter() - start
            if what == "insert":
                self.insert_blocked_s += waited
            else:
                self.sample_blocked_s += waited
        return True

    # ------------------------------------------------------------------ counting
    def inserted(self, n: int) -> None:
        """Count ``n`` inserted items (holding the buffer's lock) and wake waiters."""
        self.inserts += n
        self.largest_insert = max(self.largest_insert, n)
        if self._condition is not None:
            self._condition.notify_all()

    def sampled(self, n: int) -> None:
        """Count ``n`` sampled items (holding the buffer's lock) and wake waiters."""
        self.samples += n
        self.largest_sample = max(self.largest_sample, n)
        if self._condition is not None:
            self._condition.notify_all()

    def stats(self, size: int) -> RateLimiterStats:
        return RateLimiterStats(self.inserts, self.samples, size, self.insert_blocked_s,
                                self.sample_blocked_s, self.inserts_blocked,
                                self.samples_blocked, self.diff)

    # ------------------------------------------------------------- checkpointing
    def state_dict(self) -> dict[str, Any]:
        """The counters (:class:`~replaybuffer.protocols.Checkpointable`): ``inserts``,
        ``samples``, ``inserts_blocked``, ``samples_blocked``, ``largest_insert``,
        ``largest_sample`` (ints) and ``insert_blocked_s``, ``sample_blocked_s``
        (floats). The configuration (ratio, window) is the constructor's, not state."""
        return {name: getattr(self, name) for name in _COUNTERS}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put the counters of :meth:`state_dict` back (a restarted shard's limiter
        resumes where the lost one stood). On an attached limiter, call it holding the
        buffer's lock; waiters see the new counters at their next wake-up.

        Raises:
            ValueError: a counter is missing or not a number of its kind (nothing is
                changed then).
        """
        values: dict[str, float] = {}
        for name in _COUNTERS:
            value = state.get(name)
            kind = float if name.endswith("_s") else int
            number = float(value) if isinstance(value, numbers.Real) and \
                not isinstance(value, bool) else math.nan
            if not (math.isfinite(number) and number >= 0) or \
                    (kind is int and not number.is_integer()):
                raise ValueError(f"rate limiter state: {name} must be a non-negative "
                                 f"{kind.__name__}, got {value!r}")
            values[name] = kind(number)
        for name, value in values.items():
            setattr(self, name, value)


_COUNTERS = ("inserts", "samples", "insert_blocked_s", "sample_blocked_s", "inserts_blocked",
             "samples_blocked", "largest_insert", "largest_sample")
"""The attributes of a :class:`RateLimiter` that change as it is used."""


class MinSize(RateLimiter):
    """No sample until the buffer holds ``min_size_to_sample`` items; no other limit."""

    def __init__(self, min_size_to_sample: int):
        super().__init__(1.0, min_size_to_sample, -math.inf, math.inf)


class SampleToInsertRatio(RateLimiter):
    """Keeps ``samples_per_insert`` samples per inserted item, within ``error_buffer``.

    Until ``min_size_to_sample`` items are in, inserts go and samples wait (as
    :class:`MinSize`). From then on the diff is kept within
    ``samples_per_insert * min_size_to_sample +- error_buffer``; ``error_buffer`` may be
    a ``(min_diff, max_diff)`` pair instead, used as it is.

    Raises:
        ValueError: ``error_buffer < max(1, samples_per_insert)`` (or a pair narrower than
            twice that): an insert and a sample could each wait for the other forever.
    """

    def __init__(self, samples_per_insert: float, min_size_to_sample: int,
                 error_buffer: float | tuple[float, float]):
        if isinstance(error_buffer, tuple):
            min_diff, max_diff = error_buffer
        else:
            offset = samples_per_insert * min_size_to_sample
            min_diff, max_diff = offset - error_buffer, offset + error_buffer
        super().__init__(samples_per_insert, min_size_to_sample, min_diff, max_diff)


class Queue(RateLimiter):
    """Each item sampled once, at most ``size`` waiting: inserts wait while ``size``
    items are unread, samples wait for unread items. Pair it with a
    :class:`~replaybuffer.FIFOReplayBuffer` (whose reads consume) of capacity at least
    ``size``."""

    def __init__(self, size: int):
        if isinstance(size, bool) or not isinstance(size, int) or size < 2:
            raise ValueError(f"a Queue's size must be an int >= 2, got {size!r}")
        super().__init__(1.0, 1, 0.0, float(size))
