"""One buffer, many processes: writers and samplers on one machine, data in shared memory.

:class:`SharedReplayBuffer` keeps its steps in ``.npy`` files mapped by every process
that uses it (:class:`~replaybuffer.storage.shared_storage.SharedStorage`, by default
under ``/dev/shm``, so in RAM). Hand the buffer to a ``multiprocessing.Process`` (it
pickles as its directory and spec, never its data) and call ``add_batch``/``extend``/
``get_next``/``as_dataset``/``update_priorities`` there: batches go straight into and
out of the shared arrays, never through a pipe.

Layout and writers. The buffer has ``num_rows`` rows of ``max_length`` steps, as
TF-Agents' buffers do. A process's first ``add_batch`` of ``B`` items claims ``B``
adjacent free rows for that process (an env worker with ``B`` envs owns ``B`` rows);
each row has one writer, so writes need no lock against each other. Rows of a process
that ended (however it ended) are free again, with their steps, for the next claim.

Torn steps. Every position carries a version: ``2 * id + 1`` while step ``id`` is being
written there, ``2 * id + 2`` once written. A reader reads the versions of the positions
it drew, copies the data, reads the versions again, and keeps a sample only when both
reads show exactly the steps it meant (a window's consecutive ids): a step half written,
overwritten while copied, or left half written by a writer that was killed is never
returned; such draws are drawn again. The version stores and the row heads are
published under the buffer's lock (an ``flock``, released by the kernel when a holder
dies), whose system calls order the data stores before them; readers' loads are
ordered by the processor (x86-64 keeps loads in order).

Priorities (``prioritized=True``): a flat sum tree of ``priority ** alpha`` in shared
memory (:mod:`replaybuffer.sampling.flat_tree`), read and written under the lock. A
position's priority is 0 while it is rewritten, so it is not drawn; then the largest
priority seen. ``update_priorities`` ignores ids whose step was overwritten since.

Rate limiters: any :class:`~replaybuffer.RateLimiter` except :class:`~replaybuffer.
Queue` (whose items must be consumed by reads); its counters live in shared memory, so
every writer and sampler is paced by the same totals. A held-back call polls (50 us,
doubling to 2 ms) until it may go, ``timeout`` passes, or, with ``block=False``, at once.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Sequence, overload

import numpy as np

from replaybuffer.protocols import BufferInfo
from replaybuffer import nest
from replaybuffer.arguments import positive_or_none
from replaybuffer.buffers.base import package
from replaybuffer.buffers.prioritized import checked_priorities
from replaybuffer.dataset import RandomStream
from replaybuffer.errors import EmptyBufferError, ReplayBufferError, SpecError
from replaybuffer.rate_limiter import Queue, RateLimitedError, RateLimiter, RateLimiterStats
from replaybuffer.sampling import flat_tree
from replaybuffer.sampling.sampler import make_rng
from replaybuffer.specs import ArraySpec, as_data_spec
from replaybuffer.storage.base import identity
from replaybuffer.storage.shared_storage import SharedStorage

__all__ = ["SharedReplayBuffer", "BufferClosedError"]

(INSERTS, SAMPLES, LARGEST_INSERT, LARGEST_SAMPLE, INSERTS_BLOCKED, SAMPLES_BLOCKED,
 INSERT_BLOCKED_NS, SAMPLE_BLOCKED_NS, CLOSED, ATTACHED) = range(10)
"""Fields of the shared int64 ``control`` array."""

MAX_REDRAWS = 10_000
"""Rounds of redrawing samples that met steps being written before giving up (a
round redraws only those; in practice one or two rounds)."""


class BufferClosedError(ReplayBufferError, RuntimeError):
    """The shared buffer was closed by the process that made it."""


class _ProcessLock:
    """An exclusive ``flock`` on a file, per process (reopened after a fork: a forked
    child shares its parent's open file, and with it the lock), plus a thread lock
    (``flock`` does not exclude threads sharing a descriptor). The kernel releases the
    ``flock`` of a process that dies, so a killed holder never deadlocks the others."""

    def __init__(self, file: Path):
        self._file = file
        self._pid = -1
        self._fd = -1
        self._threads = threading.Lock()

    def _open(self) -> None:
        self._fd = os.open(self._file, os.O_RDWR | os.O_CREAT, 0o600)
        self._threads = threading.Lock()
        self._pid = os.getpid()

    def __enter__(self) -> None:
        if self._pid != os.getpid():
            self._open()
        self._threads.acquire()
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._threads.release()
            raise

    def __exit__(self, *exc: Any) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._threads.release()

    def close(self) -> None:
        if self._pid == os.getpid() and self._fd >= 0:
            os.close(self._fd)
        self._fd, self._pid = -1, -1


def _process_ended(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie, not yet reaped, has ended too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return False


def _remove(path: str, creator: int) -> None:
    if os.getpid() == creator:  # never from a forked child that inherited the finalizer
        shutil.rmtree(path, ignore_errors=True)


class SharedReplayBuffer:
    """A replay buffer that processes on one machine write to and sample from at once.

    Args:
        data_spec: a nest of :class:`ArraySpec` (or anything :func:`as_data_spec`
            takes) describing one item.
        num_rows: rows of the ring; each writing process claims as many as its
            ``add_batch`` has items (so the rows bound the total envs writing).
        max_length: steps per row. Capacity is ``num_rows * max_length`` items.
        prioritized: sample in proportion to ``priority ** alpha`` (see the module
            docstring); ``update_priorities`` sets them.
        alpha, beta: the prioritization and importance-sampling exponents.
        rate_limiter: paces every process's inserts and samples (not a ``Queue``).
        path: a new or empty directory for the files (default: a fresh one under
            ``/dev/shm``, removed by :meth:`close`; a given path is left in place).
        seed: seeds the sampling generators: process ``k`` to attach (the creator is
            0) draws from ``SeedSequence(seed, spawn_key=(k,))``.

    The object pickles as a handle: unpickled in another process (a
    ``multiprocessing.Process`` argument) it maps the same files.

    Raises:
        ValueError: a bad size, exponent or limiter (a ``Queue``, or a
            ``min_size_to_sample`` above the capacity), or a path in use.
    """

    def __init__(self, data_spec: Any, num_rows: int, max_length: int, *,
                 prioritized: bool = False, alpha: float = 0.6, beta: float = 0.4,
                 rate_limiter: RateLimiter | None = None,
                 path: str | os.PathLike[str] | None = None, seed: int | None = None):
        for name, value in (("num_rows", num_rows), ("max_length", max_length)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
                    or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        for name, number in (("alpha", alpha), ("beta", beta)):
            if not (isinstance(number, (int, float)) and np.isfinite(number) and number >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {number!r}")
        if rate_limiter is not None:
            if not isinstance(rate_limiter, RateLimiter):
                raise ValueError(f"rate_limiter must be a RateLimiter, got "
                                 f"{type(rate_limiter).__name__}")
            if isinstance(rate_limiter, Queue):
                raise ValueError("a Queue rate limiter needs reads that consume items "
                                 "(FIFOReplayBuffer); a SharedReplayBuffer's samples do not")
            rate_limiter.check_capacity(int(num_rows) * int(max_length))
        if path is None:
            shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
            directory, temporary = Path(tempfile.mkdtemp(prefix="replaybuffer-", dir=shm)), True
        else:
            directory, temporary = Path(path), False
            if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
                raise ValueError(f"{directory} is not a new or empty directory")
            directory.mkdir(parents=True, exist_ok=True)
        self._config: dict[str, Any] = {
            "data_spec": as_data_spec(data_spec), "num_rows": int(num_rows),
            "max_length": int(max_length), "prioritized": bool(prioritized),
            "alpha": float(alpha), "beta": float(beta), "rate_limiter": rate_limiter,
            "seed": seed, "path": str(directory)}
        self._map(create=True)
        self._creator = os.getpid()
        self._remover = (weakref.finalize(self, _remove, str(directory), os.getpid())
                         if temporary else None)

    # ----------------------------------------------------------------- mapping
    def _map(self, create: bool) -> None:
        config = self._config
        self._data_spec = config["data_spec"]
        specs, self._structure = nest.flatten(self._data_spec)
        self._specs: tuple[ArraySpec, ...] = tuple(specs)
        self._leaf_paths = nest.leaf_paths(self._data_spec)
        self._fast_flatten = nest.fast_flattener(self._data_spec)
        self._rows_total: int = config["num_rows"]
        self._length: int = config["max_length"]
        capacity = self._rows_total * self._length
        self.path = Path(config["path"])
        self._storage = SharedStorage(self._specs, capacity, self.path, create)
        shared = self._storage.map
        self._version = shared("version", (capacity,), np.int64)
        self._next_id = shared("next_id", (self._rows_total,), np.int64)
        self._owner = shared("owner", (self._rows_total,), np.int64)
        self._control = shared("control", (16,), np.int64)
        self._lock = _ProcessLock(self.path / "lock")
        self._prioritized = config["prioritized"]
        if self._prioritized:
            self._tree = shared("priorities", (flat_tree.tree_nodes(capacity),), np.float64)
            self._max_priority = shared("max_priority", (1,), np.float64)
            if create:
                self._max_priority[0] = 1.0
        self._alpha, self._beta = config["alpha"], config["beta"]
        self._limiter: RateLimiter | None = config["rate_limiter"]
        # A limiter that can never hold an insert back (max_diff = inf, as MinSize)
        # needs no admission: inserts are counted in the commit's critical section.
        self._counts_at_commit = self._limiter is not None and \
            self._limiter.max_diff == float("inf")
        self._admits_inserts = self._limiter is not None and not self._counts_at_commit
        self._rows: tuple[int, int] | None = None  # (first row, count) this process owns
        self._owner_pid = -1
        self._rng_pid = -1
        self._process_rng()

    def _process_rng(self) -> np.random.Generator:
        """This process's generator: a process that attached, or was forked, numbers
        itself in the shared count and seeds from it (so two samplers never draw alike)."""
        if self._rng_pid != os.getpid():
            with self._lock:
                attached = int(self._control[ATTACHED])
                self._control[ATTACHED] += 1
            seed = self._config["seed"]
            self._rng = make_rng(None if seed is None
                                 else np.random.SeedSequence(seed, spawn_key=(attached,)))
            self._rng_pid = os.getpid()
        return self._rng

    def __reduce__(self) -> tuple[Callable[..., "SharedReplayBuffer"], tuple[Any, ...]]:
        return _attach, (self._config,)

    # -------------------------------------------------------------- properties
    @property
    def data_spec(self) -> Any:
        """The nest of :class:`ArraySpec` describing one item (no batch dimension)."""
        return self._data_spec

    @property
    def num_rows(self) -> int:
        return self._rows_total

    @property
    def max_length(self) -> int:
        return self._length

    @property
    def capacity(self) -> int:
        """``num_rows * max_length`` items."""
        return self._rows_total * self._length

    @property
    def rows(self) -> tuple[int, int] | None:
        """``(first row, count)`` this process writes to, once it has added."""
        return self._rows if self._owner_pid == os.getpid() else None

    @property
    def rate_limiter(self) -> RateLimiter | None:
        return self._limiter

    @property
    def max_priority(self) -> float:
        """The largest priority seen (``prioritized`` buffers); new steps enter with it."""
        if not self._prioritized:
            raise ValueError("max_priority: the buffer is not prioritized")
        return float(self._max_priority[0])

    def __len__(self) -> int:
        """Items held: the steps of every row, up to ``max_length`` each."""
        return int(np.minimum(self._next_id, self._length).sum())

    def __repr__(self) -> str:
        return (f"SharedReplayBuffer(num_rows={self._rows_total}, "
                f"max_length={self._length}, items={len(self)}, path='{self.path}')")

    # ----------------------------------------------------------------- writing
    def _check_open(self) -> None:
        if self._control[CLOSED]:
            raise BufferClosedError(f"the shared buffer in {self.path} was closed by the "
                                    "process that made it")

    def _leaves(self, items: Any, method: str) -> Sequence[Any]:
        leaves = None if self._fast_flatten is None else self._fast_flatten(items)
        if leaves is not None:
            return leaves
        leaves, structure = nest.flatten(items)
        if structure != self._structure:
            raise SpecError(f"{method}: items do not match the data_spec structure: "
                            f"expected {nest.describe(self._structure)}, got "
                            f"{nest.describe(structure)}")
        return leaves

    def _outer_size(self, leaves: Sequence[Any], method: str, axes: int) -> tuple[int, ...]:
        shape = np.shape(leaves[0])
        spec = self._specs[0]
        if len(shape) != axes + len(spec.shape):
            raise SpecError(f"{method}: {self._leaf_paths[0]} has shape {shape}; expected "
                            f"{'[B, T]' if axes == 2 else '[B]'} + {list(spec.shape)}")
        return tuple(shape[:axes])

    def steps_written(self) -> np.ndarray:
        """Steps written so far to each row, int64 ``[num_rows]`` (a copy): the next
        step of a row gets this id."""
        steps: np.ndarray = self._next_id.copy()
        return steps

    def claim_rows(self, count: int) -> tuple[int, int]:
        """The rows this process writes, ``(first, count)``: claimed by its first add
        (or this call) as ``count`` adjacent rows that no live process owns and whose
        step counts agree. Later calls return the same rows.

        Raises:
            SpecError: this process owns a different number of rows, or ``count`` is
                more than the buffer has.
            ValueError: no such rows are free now.
        """
        pid = os.getpid()
        if self._owner_pid == pid and self._rows is not None:
            first, owned = self._rows
            if owned != count:
                raise SpecError(f"add_batch: this process writes {owned} rows "
                                f"({first}..{first + owned - 1}); got a batch of {count}")
            return self._rows
        if count > self._rows_total:
            raise SpecError(f"add_batch: a batch of {count} needs {count} rows; the buffer "
                            f"has {self._rows_total}")
        with self._lock:
            owner, heads = self._owner, self._next_id
            free = [owner[r] == 0 or owner[r] == pid or _process_ended(int(owner[r]))
                    for r in range(self._rows_total)]
            self._repair_heads([r for r in range(self._rows_total) if free[r] and owner[r]])
            unowned = [bool(owner[r] == 0) for r in range(self._rows_total)]
            # Rows no process held first (a new writer starts on its own rows), then
            # the rows of ended writers, whose steps it continues.
            for usable in (unowned, free):
                for first in range(self._rows_total - count + 1):
                    block = slice(first, first + count)
                    if all(usable[block]) and (heads[block] == heads[first]).all():
                        owner[block] = pid
                        self._rows, self._owner_pid = (first, count), pid
                        return self._rows
        raise ValueError(f"add_batch: no {count} adjacent free rows (with equal step "
                         f"counts) among {self._rows_total}; rows are owned by processes "
                         f"{sorted({int(p) for p in owner if p})}: give the buffer more "
                         "rows, or end a writer")

    def _repair_heads(self, rows: list[int]) -> None:
        """Advance the head of each of ``rows`` (of ended writers) past a step written
        whole whose head update its writer did not finish: a writer killed while
        publishing a step may have moved some of its rows' heads and not others."""
        for row in rows:
            head = int(self._next_id[row])
            position = (head % self._length) * self._rows_total + row
            if self._version[position] == 2 * head + 2:
                self._next_id[row] = head + 1

    def add_batch(self, items: Any, *, timeout: float | None = None,
                  block: bool = True) -> bool:
        """Append one step to each of this process's rows.

        Args:
            items: a nest matching ``data_spec``, leaves ``[B, *spec.shape]``; the first
                call claims ``B`` rows for this process, later calls must keep ``B``.
            timeout, block: as :meth:`replaybuffer.ReplayBuffer.add_batch`, with the
                rate limiter.

        Returns:
            ``True`` once written; ``False`` with ``block=False`` when held back.

        Raises:
            SpecError: wrong structure, shape, dtype or batch size (naming the leaf);
                nothing is written.
            RateLimitedError: ``timeout`` passed with the insert held back.
            BufferClosedError: the buffer was closed.
        """
        self._check_open()
        leaves = self._leaves(items, "add_batch")
        (count,) = self._outer_size(leaves, "add_batch", 1)
        arrays = self._storage.convert(leaves, self._leaf_paths, (count,),
                                       f"[batch={count}]")
        first, _ = self.claim_rows(count)
        if self._admits_inserts and not self._admit(True, count, timeout, block):
            return False
        self._write_step(first, count, arrays)
        return True

    def extend(self, items: Any, *, timeout: float | None = None,
               block: bool = True) -> bool:
        """Append ``T`` steps to each of this process's rows: leaves ``[B, T, *shape]``
        (the rate limiter admits ``B * T`` items at once). As :meth:`add_batch`."""
        self._check_open()
        leaves = self._leaves(items, "extend")
        count, steps = self._outer_size(leaves, "extend", 2)
        arrays = self._storage.convert(leaves, self._leaf_paths, (count, steps),
                                       f"[batch={count}, steps={steps}]")
        first, _ = self.claim_rows(count)
        if self._admits_inserts and not self._admit(True, count * steps, timeout, block):
            return False
        for t in range(steps):
            self._write_step(first, count, [a[:, t] for a in arrays])
        return True

    def _write_step(self, first: int, count: int, arrays: Any) -> None:
        """Write one step to rows ``first ..`` under the version protocol."""
        step = int(self._next_id[first])
        start = (step % self._length) * self._rows_total + first
        span = slice(start, start + count)
        if self._prioritized:  # not drawn while rewritten
            with self._lock:
                self._version[span] = 2 * step + 1
                flat_tree.update(self._tree, np.arange(start, start + count),
                                 np.zeros(count))
        else:
            self._version[span] = 2 * step + 1
        self._storage.write(start, arrays)
        with self._lock:
            self._version[span] = 2 * step + 2
            self._next_id[first:first + count] = step + 1
            if self._counts_at_commit:
                self._control[INSERTS] += count
                self._control[LARGEST_INSERT] = max(int(self._control[LARGEST_INSERT]),
                                                    count)
            if self._prioritized:
                flat_tree.update(self._tree, np.arange(start, start + count),
                                 np.full(count, self._max_priority[0] ** self._alpha))

    # ---------------------------------------------------------------- sampling
    @overload
    def get_next(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                 time_stacked: bool = True, *, timeout: float | None = None,
                 block: Literal[True] = True) -> tuple[Any, BufferInfo]: ...

    @overload
    def get_next(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                 time_stacked: bool = True, *, timeout: float | None = None,
                 block: bool = True) -> tuple[Any, BufferInfo] | None: ...

    def get_next(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                 time_stacked: bool = True, *, timeout: float | None = None,
                 block: bool = True) -> tuple[Any, BufferInfo] | None:
        """Sample items as :meth:`replaybuffer.ReplayBuffer.get_next` does (same shapes).

        ``BufferInfo.ids`` are item ids (``step * num_rows + row``), unique per step and
        row, for :meth:`update_priorities`; ``probabilities`` are float32 ``[S]``;
        prioritized buffers add ``weights`` (``(P_min / P(i)) ** beta`` over the batch,
        so the batch's largest is 1). A window lies in one row, consecutive steps,
        never across the write head.

        Raises:
            EmptyBufferError: no row holds ``num_steps`` steps (nothing with a positive
                priority, for prioritized buffers).
            RateLimitedError: ``timeout`` passed with the sample held back.
            BufferClosedError: the buffer was closed.
        """
        sample_batch_size = positive_or_none(sample_batch_size, "sample_batch_size")
        num_steps = positive_or_none(num_steps, "num_steps")
        return self.draw(sample_batch_size, num_steps, time_stacked, timeout=timeout,
                            block=block)

    @overload
    def draw(self, sample_batch_size: int | None, num_steps: int | None,
             time_stacked: bool = True, rng: np.random.Generator | None = None,
             within_episodes: bool = False, timeout: float | None = None,
             block: Literal[True] = True) -> tuple[Any, BufferInfo]: ...

    @overload
    def draw(self, sample_batch_size: int | None, num_steps: int | None,
             time_stacked: bool = True, rng: np.random.Generator | None = None,
             within_episodes: bool = False, timeout: float | None = None,
             block: bool = True) -> tuple[Any, BufferInfo] | None: ...

    def draw(self, sample_batch_size: int | None, num_steps: int | None,
             time_stacked: bool = True, rng: np.random.Generator | None = None,
             within_episodes: bool = False, timeout: float | None = None,
             block: bool = True) -> tuple[Any, BufferInfo] | None:
        if within_episodes:
            raise ValueError("within_episodes: a SharedReplayBuffer does not track episodes")
        self._check_open()
        count = sample_batch_size or 1
        steps = num_steps or 1
        if steps > self._length:
            raise EmptyBufferError(f"num_steps={steps} is longer than a row "
                                   f"(max_length={self._length})")
        if self._limiter is not None and not self._admit(False, count, timeout, block):
            return None
        rng = self._process_rng() if rng is None else rng
        leaves, ids, info = self._draw(count, steps, rng)
        if num_steps is None:
            leaves = [leaf[:, 0] for leaf in leaves]
            ids = ids[:, 0]
        return package(self._structure, identity, leaves, ids, info, sample_batch_size,
                       num_steps, time_stacked)

    def _draw(self, count: int, steps: int, rng: np.random.Generator
              ) -> tuple[list[np.ndarray], np.ndarray, dict[str, np.ndarray]]:
        """``count`` windows of ``steps`` whose every step was whole while copied:
        leaves ``[count, steps, ...]``, item ids ``[count, steps]``, ``info``."""
        rows_total, length = self._rows_total, self._length
        offsets = np.arange(steps, dtype=np.int64)
        todo = np.arange(count)
        leaves: list[np.ndarray] | None = None
        ids = np.empty((count, steps), np.int64)
        chance = np.empty(count, np.float64)
        for _ in range(MAX_REDRAWS):
            rows, starts, p = (self._draw_prioritized if self._prioritized
                               else self._draw_uniform)(len(todo), steps, rng)
            step_ids = starts[:, None] + offsets
            positions = (step_ids % length) * rows_total + rows[:, None]
            expected = 2 * step_ids + 2
            before = self._version.take(positions)
            got = self._storage.gather(positions)
            whole = ((before == expected) & (self._version.take(positions) == expected)
                     ).all(1) & (p > 0)
            if leaves is None:  # the first round fills every slot, whole or not
                leaves = got
                if whole.all():  # the usual case: nothing to draw again
                    ids = step_ids * rows_total + rows[:, None]
                    chance = p
                    break
            else:
                for out, new in zip(leaves, got):
                    out[todo[whole]] = new[whole]
            ids[todo[whole]] = step_ids[whole] * rows_total + rows[whole, None]
            chance[todo[whole]] = p[whole]
            todo = todo[~whole]
            if not len(todo):
                break
        else:
            raise RuntimeError(f"get_next: {len(todo)} of {count} samples met steps being "
                               f"written in {MAX_REDRAWS} rounds of drawing")
        info: dict[str, np.ndarray] = {"probabilities": chance.astype(np.float32)}
        if self._prioritized:
            weights = np.power(chance.min() / chance, self._beta).astype(np.float32)
            info["weights"] = weights
        assert leaves is not None
        return leaves, ids, info

    def _draw_uniform(self, count: int, steps: int, rng: np.random.Generator
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows, first step ids and probabilities of ``count`` windows drawn uniformly
        among the windows the rows hold now."""
        heads = self._next_id.copy()
        windows = np.maximum(np.minimum(heads, self._length) - steps + 1, 0)
        ends = np.cumsum(windows)
        total = int(ends[-1])
        if total == 0:
            raise EmptyBufferError(f"get_next: no row holds {steps} step(s) yet (the most "
                                   f"any row holds: {int(heads.max())})")
        draws = rng.integers(0, total, count)
        rows = np.searchsorted(ends, draws, side="right")
        oldest = np.maximum(heads - self._length, 0)
        starts = oldest[rows] + draws - (ends[rows] - windows[rows])
        return rows, starts, np.full(count, 1.0 / total)

    def _draw_prioritized(self, count: int, steps: int, rng: np.random.Generator
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows, first step ids and probabilities of ``count`` steps drawn by priority;
        a draw whose window would run past its row's head gets probability 0 (so it is
        drawn again)."""
        with self._lock:
            total = float(self._tree[1])
            if not total > 0:
                raise EmptyBufferError("get_next: no step with a positive priority (the "
                                       "buffer is empty, or every priority is 0)")
            positions = flat_tree.find_prefix(self._tree, rng.random(count) * total)
            p = flat_tree.leaves_of(self._tree, positions) / total
            heads = self._next_id.copy()
        rows = positions % self._rows_total
        slots = positions // self._rows_total
        row_heads = heads[rows]
        # The newest step id at each slot: the last id below the head with that slot.
        starts = slots + self._length * ((row_heads - 1 - slots) // self._length)
        bad = (starts < 0) | (starts + steps > row_heads)
        p[bad] = 0.0  # rejected by the caller, as zero leaves rounding may land on
        starts[bad] = 0
        return rows, starts, p

    # -------------------------------------------------------------- priorities
    def update_priorities(self, ids: Any, priorities: Any) -> int:
        """Set the priorities of sampled items (``BufferInfo.ids``: ``[S]``, or
        ``[S, T]`` windows, whose first step carries the priority).

        Returns:
            How many were applied: ids of steps overwritten since they were drawn are
            ignored.

        Raises:
            ValueError: not prioritized; mismatched shapes; a NaN, infinite or
                negative priority; an id no sample could have returned. Nothing is
                changed then.
        """
        if not self._prioritized:
            raise ValueError("update_priorities: the buffer was built without "
                             "prioritized=True")
        self._check_open()
        id_array, values, largest = checked_priorities(ids, priorities)
        if len(id_array) and (id_array.min() < 0):
            i = int(np.argmin(id_array))
            raise ValueError(f"update_priorities: ids[{i}] = {int(id_array[i])} is no item "
                             "id (they are >= 0)")
        steps, rows = np.divmod(id_array, self._rows_total)
        positions = (steps % self._length) * self._rows_total + rows
        if largest is None and len(values):
            largest = float(values.max())
        with self._lock:
            current = self._version[positions] == 2 * steps + 2
            flat_tree.update(self._tree, positions[current],
                             np.power(values[current], self._alpha))
            if largest is not None and largest > self._max_priority[0]:
                self._max_priority[0] = largest
        return int(current.sum())

    # ----------------------------------------------------------------- pacing
    def _admit(self, insert: bool, n: int, timeout: float | None, block: bool) -> bool:
        """Wait until the rate limiter lets ``n`` items be inserted (or sampled); count
        them in the shared counters. See the module docstring."""
        limiter = self._limiter
        assert limiter is not None
        control = self._control
        deadline = None if timeout is None else time.monotonic() + timeout
        pause, started, checked = 50e-6, None, False
        while True:
            with self._lock:
                limiter.inserts, limiter.samples = int(control[INSERTS]), int(control[SAMPLES])
                limiter.largest_insert = max(1, int(control[LARGEST_INSERT]))
                limiter.largest_sample = max(1, int(control[LARGEST_SAMPLE]))
                size = len(self)
                ready = limiter.can_insert(n, size) if insert else limiter.can_sample(n, size)
                if not checked and not ready:  # a call too large for the window
                    (limiter.check_insert_size if insert else limiter.check_sample_size)(n)
                    control[INSERTS_BLOCKED if insert else SAMPLES_BLOCKED] += 1
                    checked = True
                if ready:
                    field, largest = (INSERTS, LARGEST_INSERT) if insert else \
                        (SAMPLES, LARGEST_SAMPLE)
                    control[field] += n
                    control[largest] = max(int(control[largest]), n)
                    if started is not None:
                        control[INSERT_BLOCKED_NS if insert else SAMPLE_BLOCKED_NS] += \
                            time.monotonic_ns() - started
                    return True
            if started is None:
                started = time.monotonic_ns()
            if not block:
                return False
            if deadline is not None and time.monotonic() >= deadline:
                with self._lock:
                    control[INSERT_BLOCKED_NS if insert else SAMPLE_BLOCKED_NS] += \
                        time.monotonic_ns() - started
                stats = self.stats()
                assert stats is not None  # there is a limiter
                raise RateLimitedError(
                    f"{'insert' if insert else 'sample'} of {n} items held back by "
                    f"{limiter!r} for {timeout} s: {stats.inserts} inserts, "
                    f"{stats.samples} samples (diff {stats.diff:g}), {stats.size} items held")
            self._check_open()
            time.sleep(pause)
            pause = min(2 * pause, 2e-3)

    def stats(self) -> RateLimiterStats | None:
        """The rate limiter's counters over every process (``None`` without one)."""
        if self._limiter is None:
            return None
        c = self._control
        inserts, samples = int(c[INSERTS]), int(c[SAMPLES])
        return RateLimiterStats(inserts, samples, len(self), c[INSERT_BLOCKED_NS] / 1e9,
                                c[SAMPLE_BLOCKED_NS] / 1e9, int(c[INSERTS_BLOCKED]),
                                int(c[SAMPLES_BLOCKED]),
                                inserts * self._limiter.samples_per_insert - samples)

    # -------------------------------------------------------------- iteration
    def spawn_rng(self) -> np.random.Generator:
        return make_rng(np.random.SeedSequence(self._process_rng().integers(0, 2**63 - 1)))

    def as_dataset(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                   num_parallel_calls: int | None = None,
                   prefetch: int | None = None) -> Iterable[tuple[Any, BufferInfo]]:
        """An endless stream of ``get_next(sample_batch_size, num_steps)`` elements,
        sampled ahead by ``num_parallel_calls`` threads of this process (see
        :class:`~replaybuffer.dataset.RandomStream`)."""
        sample_batch_size = positive_or_none(sample_batch_size, "sample_batch_size")
        num_steps = positive_or_none(num_steps, "num_steps")
        return RandomStream(self, sample_batch_size, num_steps, num_parallel_calls, prefetch)

    # ---------------------------------------------------------------- closing
    def close(self) -> None:
        """Give up this process's rows. In the process that made the buffer, also mark
        it closed for every process and remove its temporary directory."""
        if self._owner_pid == os.getpid() and self._rows is not None and \
                not self._control[CLOSED]:
            first, count = self._rows
            with self._lock:
                mine = self._owner[first:first + count] == os.getpid()
                self._owner[first:first + count][mine] = 0
            self._rows = None
        if self._creator == os.getpid():
            self._control[CLOSED] = 1
            if self._remover is not None:
                self._remover()
        self._lock.close()

    def __enter__(self) -> "SharedReplayBuffer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _attach(config: dict[str, Any]) -> SharedReplayBuffer:
    """A :class:`SharedReplayBuffer` mapping the files another process made."""
    buffer = SharedReplayBuffer.__new__(SharedReplayBuffer)
    buffer._config = config
    buffer._creator, buffer._remover = -1, None
    buffer._map(create=False)
    return buffer
