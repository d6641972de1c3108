"""Rate limiting: a buffer's inserts and samples admitted by its
:class:`~replaybuffer.RateLimiter` (Reverb's pacing of learners against collectors).

The limiter is a part of its own (:mod:`replaybuffer.rate_limiter`); this module wires
it to the buffer's lock and length: attaching and detaching it, and the two admission
checks the write and read paths call with the lock held.
"""

from __future__ import annotations

from replaybuffer.buffers.wiring import BufferParts
from replaybuffer.rate_limiter import RateLimiter, RateLimiterStats


class RateLimiting(BufferParts):
    """The :attr:`rate_limiter` property, :meth:`stats`, and admission of inserts
    (:meth:`_admit`) and samples (:meth:`_admit_sample`)."""

    _limiter: RateLimiter | None = None

    @property
    def rate_limiter(self) -> RateLimiter | None:
        """The :class:`~replaybuffer.RateLimiter` pacing inserts and samples, or ``None``.

        Set it to attach one (its counters start from zero); ``None`` detaches it. Inserts
        (``add_batch``, ``extend``, ``add``) and samples (``get_next``, ``sample``, random
        datasets) then wait as it says, each with ``timeout=`` and ``block=``.

        Raises:
            ValueError: the limiter could never let a sample through in this buffer
                (``min_size_to_sample`` above the capacity), or serves another buffer.
        """
        return self._limiter

    @rate_limiter.setter
    def rate_limiter(self, limiter: RateLimiter | None) -> None:
        with self._lock:
            if limiter is not None:
                limiter.attach(self._lock, self.capacity)
            if self._limiter is not None:
                self._limiter.detach()
            self._limiter = limiter

    def stats(self) -> RateLimiterStats | None:
        """The rate limiter's counters (items inserted and sampled, seconds blocked), or
        ``None`` without a limiter."""
        with self._lock:
            return None if self._limiter is None else self._limiter.stats(len(self))

    def _admit(self, n: int, timeout: float | None, block: bool) -> bool:
        """Wait until the rate limiter lets ``n`` items in (the caller holds the lock)."""
        limiter = self._limiter
        assert limiter is not None  # callers check first
        return limiter.await_insert(n, self.__len__, timeout, block)

    def _admit_sample(self, n: int, timeout: float | None, block: bool) -> bool:
        """Wait until the rate limiter lets ``n`` items be sampled (lock held)."""
        limiter = self._limiter
        assert limiter is not None  # callers check first
        return limiter.await_sample(n, self.__len__, timeout, block)
