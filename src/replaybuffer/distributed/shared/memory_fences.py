"""Memory fences for the shared buffer's lock-free protocol, on any processor.

The shared buffer's writers and readers exchange data through plain numpy loads and
stores on memory that several processes map (versions, row heads, counters, data). A
processor may make a core's stores visible to other cores in another order than the
program made them, and may perform its loads out of order, unless a fence says
otherwise. Two fences are used:

- :func:`order_fence` orders every load and store before it before every load and store
  after it, *except* a store before it against a load after it. It is what a seqlock
  needs: a writer's "odd version" store before its data stores and its data stores before
  its "even version" store (release), a reader's version loads before its data loads and
  its data loads before its second version loads (acquire).
- :func:`full_fence` orders everything, a store before it against a load after it too
  (Dekker's pattern: publish my reservation, then read everyone's): the rate limiter's
  exact admission (:mod:`.counters`).

Where each comes from:

- x86-64 (and 32-bit x86) keep stores in program order and loads in program order (Intel
  SDM volume 3A, 9.2.2 "Memory Ordering in P6 and More Recent Processor Families"; AMD
  APM volume 2, 7.2): the only reordering is a later load before an earlier store. So
  :func:`order_fence` is a no-op there; the compiler cannot move numpy's stores across
  each other either, since each is a separate call into numpy's C loops, opaque to it.
- Elsewhere (aarch64, POWER, RISC-V: weakly ordered), and for :func:`full_fence`
  everywhere, the fence is C11's ``atomic_thread_fence(memory_order_seq_cst)`` (ISO C11
  7.17.4.1), called through ``ctypes`` from GCC's runtime library ``libatomic`` (which
  exports it as a function): ``dmb ish`` on aarch64, ``sync`` on POWER, ``fence rw,rw``
  on RISC-V, ``mfence`` on x86-64. A call costs about 0.5 us from Python.

A processor without total store order whose system lacks ``libatomic`` (package
``libatomic1`` on Debian and Ubuntu, part of the GCC runtime elsewhere) cannot run the
protocol correctly: :func:`check_available` raises then, at the buffer's construction,
rather than let a reader return a torn step.

Aligned 8-byte loads and stores (every int64 the protocol shares is 8-byte aligned in
its ``.npy`` file) are single-copy atomic on x86-64 and aarch64, so a version or head is
never read half old, half new; a torn read of a version could only make the reader
reject a step, never accept one. numpy's item store and a ``memoryview``'s (the writer's
plain step uses both) each copy one int64 with one 8-byte access, each from its own
call into C, which the compiler cannot move across another.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform
import threading
from typing import Callable

TOTAL_STORE_ORDER = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686", "x86")
"""Whether this processor keeps stores, and loads, in program order (x86)."""

MEMORY_ORDER_SEQ_CST = 5
"""``memory_order_seq_cst`` in C11's ``memory_order`` enum (GCC's ``__ATOMIC_SEQ_CST``)."""


def _load_fence() -> Callable[[], None] | None:
    """libatomic's ``atomic_thread_fence`` bound to ``seq_cst``, or ``None`` if absent."""
    for name in ("libatomic.so.1", ctypes.util.find_library("atomic")):
        if not name:
            continue
        try:
            library = ctypes.CDLL(name)
            fence = library.atomic_thread_fence
        except (OSError, AttributeError):
            continue
        fence.argtypes = [ctypes.c_int]
        fence.restype = None
        seq_cst_fence: Callable[[], None] = functools.partial(fence, MEMORY_ORDER_SEQ_CST)
        return seq_cst_fence
    return None


_SEQ_CST_FENCE = _load_fence()
_X86_LOCK = threading.Lock()  # the full fence's fallback on x86 without libatomic


def _unavailable() -> None:
    check_available()


def _nothing() -> None:
    """x86's order fence: stores and loads already keep program order."""


def check_available() -> None:
    """Raise if this processor needs a fence that this system cannot give.

    Raises:
        RuntimeError: a processor without total store order and no ``libatomic``.
    """
    if _SEQ_CST_FENCE is None and not TOTAL_STORE_ORDER:
        raise RuntimeError(
            f"SharedReplayBuffer needs memory fences on this {platform.machine()} "
            "processor and could not load libatomic's atomic_thread_fence: install the "
            "GCC runtime's libatomic (Debian/Ubuntu: apt-get install libatomic1)")


def _full_fence_on_x86_without_libatomic() -> None:
    """A full fence on x86 without libatomic: CPython's lock takes a ``lock cmpxchg``
    (glibc's semaphores), and a locked instruction is a full barrier on x86 (Intel SDM
    3A, 9.2.2: "reads or writes cannot be reordered with locked instructions")."""
    _X86_LOCK.acquire()
    _X86_LOCK.release()


def _pick_full_fence() -> Callable[[], None]:
    if _SEQ_CST_FENCE is not None:
        return _SEQ_CST_FENCE
    return _full_fence_on_x86_without_libatomic if TOTAL_STORE_ORDER else _unavailable



order_fence: Callable[[], None] = _nothing if TOTAL_STORE_ORDER else \
    (_SEQ_CST_FENCE or _unavailable)
"""Orders loads and stores before it before loads and stores after it (all but store
then load): a no-op on x86, a ``seq_cst`` fence elsewhere (see the module)."""

full_fence: Callable[[], None] = _pick_full_fence()
"""Orders every load and store before it before every one after it (see the module)."""
