"""Iterating a buffer: the infinite random stream and the single deterministic pass.

Both are plain Python iterables of ``(items, BufferInfo)`` elements; :func:`to_torch`
wraps either in a ``torch.utils.data.IterableDataset``.
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Protocol

import numpy as np

from replaybuffer import nest
from replaybuffer.protocols import SampleSource
from replaybuffer.rate_limiter import RateLimitedError
from replaybuffer.sampling.deterministic import check_not_all_dropped
from replaybuffer.sampling.sampler import make_rng

if TYPE_CHECKING:
    from replaybuffer.protocols import BufferInfo
    from replaybuffer.rate_limiter import RateLimiter
    from replaybuffer.sampling.deterministic import Index

Element = tuple[Any, "BufferInfo"]
_Produced = tuple[bool, Any]
"""What a prefetch worker queues: ``(True, element)``, or ``(False, the exception)``."""

# Prefetch workers still running at interpreter exit are stopped and joined first:
# a daemon thread inside numpy or torch while they tear down can abort the process.
_LIVE_STOPS: "weakref.WeakSet[threading.Event]" = weakref.WeakSet()
_LIVE_WORKERS: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()


class PacedSource(SampleSource, Protocol):
    """What a :class:`RandomStream` samples: a
    :class:`~replaybuffer.protocols.SampleSource` (a
    :class:`~replaybuffer.ReplayBuffer`,
    :class:`~replaybuffer.distributed.SharedReplayBuffer` or
    :class:`~replaybuffer.distributed.RayReplayBuffer`) that may be paced by a rate
    limiter, which prefetch workers wait on in short rounds."""

    @property
    def rate_limiter(self) -> RateLimiter | None: ...


class BlockSource(Protocol):
    """What a :class:`DeterministicPass` reads: a buffer's layout, its plan of blocks
    over the retained steps, and each block read (a :class:`~replaybuffer.ReplayBuffer`'s
    ``deterministic_plan`` and ``read_block``)."""

    @property
    def batch_size(self) -> int: ...

    @property
    def max_length(self) -> int: ...

    def deterministic_plan(self, sample_batch_size: int | None, num_steps: int | None,
                           shift: int | None, drop_remainder: bool
                           ) -> Iterable[tuple[Index, Index]]: ...

    def read_block(self, ids: Index, rows: Index) -> Element: ...


@atexit.register
def _stop_all_workers() -> None:
    for stop in list(_LIVE_STOPS):
        stop.set()
    for worker in list(_LIVE_WORKERS):
        worker.join(timeout=1.0)


class RandomStream:
    """An infinite stream of independent samples from a buffer.

    Each ``iter()`` starts a new iterator with its own generator, seeded from the
    buffer's sampler (so a seeded buffer gives the same stream every run).

    Args:
        buffer: the buffer to sample.
        sample_batch_size, num_steps: as in ``get_next`` (time-stacked).
        num_parallel_calls: worker threads sampling ahead; ``None`` samples on pull.
        prefetch: elements buffered ahead in total (default ``2 * num_parallel_calls``).
    """

    def __init__(self, buffer: PacedSource, sample_batch_size: int | None,
                 num_steps: int | None, num_parallel_calls: int | None = None,
                 prefetch: int | None = None, within_episodes: bool = False):
        if prefetch is not None and (isinstance(prefetch, bool) or prefetch < 0):
            raise ValueError(f"prefetch must be a non-negative int or None, got {prefetch!r}")
        self.buffer = buffer
        self.sample_batch_size = sample_batch_size
        self.num_steps = num_steps
        self.within_episodes = within_episodes
        self.workers = num_parallel_calls or (1 if prefetch else 0)
        self.prefetch = (2 * self.workers if prefetch is None else prefetch)

    def __iter__(self) -> Iterator[Element]:
        if self.workers == 0:
            return _SyncIterator(self)
        return _PrefetchIterator(self)

    def to_torch(self) -> Any:
        """This stream as a ``torch.utils.data.IterableDataset``."""
        return to_torch(self, _holds_tf_tensors(self.buffer))


class _SyncIterator:
    def __init__(self, stream: RandomStream):
        self._stream = stream
        self._rng = stream.buffer.spawn_rng()

    def __iter__(self) -> "_SyncIterator":
        return self

    def __next__(self) -> Element:
        s = self._stream
        element = s.buffer.draw(s.sample_batch_size, s.num_steps, True, self._rng,
                                s.within_episodes)
        assert element is not None  # a blocking draw (block=True) always returns one
        return element


class _PrefetchIterator:
    """Worker ``w`` produces elements ``w, w + k, w + 2k, ...`` with its own generator
    into its own queue; the consumer reads the queues round-robin, so the element
    order does not depend on thread scheduling.

    An error in a worker (sampling an empty buffer, say) reaches the consumer in
    order; the workers then stop and the elements they had prefetched are dropped,
    so the next pull starts fresh ones that see the buffer as it is by then.
    """

    def __init__(self, stream: RandomStream):
        self._stream = stream
        self._seed = int(stream.buffer.spawn_rng().integers(0, 2**63 - 1))
        self._generation = 0
        self._closed = False
        self._threads: list[threading.Thread] = []
        self._start()

    def _start(self) -> None:
        stream, k = self._stream, self._stream.workers
        per_worker = max(1, -(-stream.prefetch // k))
        self._queues: list[queue.Queue[_Produced]] = [queue.Queue(per_worker)
                                                      for _ in range(k)]
        self._stop = threading.Event()
        self._next = 0
        self._threads = []
        for w in range(k):
            rng = make_rng(np.random.SeedSequence([self._seed, self._generation, w]))
            t = threading.Thread(target=_produce, name=f"replaybuffer-prefetch-{w}",
                                 args=(stream, rng, self._queues[w], self._stop), daemon=True)
            t.start()
            self._threads.append(t)
            _LIVE_WORKERS.add(t)
        _LIVE_STOPS.add(self._stop)
        # Workers hold no reference to the iterator, so dropping it stops them.
        weakref.finalize(self, self._stop.set)

    def __iter__(self) -> "_PrefetchIterator":
        return self

    def __next__(self) -> Element:
        if self._closed:
            raise StopIteration
        if not self._threads:  # stopped by an error: start over
            self._generation += 1
            self._start()
        q = self._queues[self._next % len(self._queues)]
        while True:
            try:
                ok, value = q.get(timeout=0.1)
                break
            except queue.Empty:
                if self._closed:
                    raise StopIteration from None
        if not ok:
            self._stop.set()
            self._threads = []
            raise value
        self._next += 1
        element: Element = value
        return element

    def close(self) -> None:
        """Stop the worker threads (also done when the iterator is garbage collected)."""
        self._closed = True
        self._stop.set()

    def __enter__(self) -> "_PrefetchIterator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _produce(stream: RandomStream, rng: np.random.Generator, out: queue.Queue[_Produced],
             stop: threading.Event) -> None:
    buffer = stream.buffer
    # A rate limiter may hold a sample back for as long as the inserts take: wait in
    # short rounds, so that closing the iterator stops the worker.
    wait = None if buffer.rate_limiter is None and not getattr(buffer, "paced", False) \
        else 0.1
    while not stop.is_set():
        try:
            item: _Produced = (True, buffer.draw(stream.sample_batch_size,
                                                    stream.num_steps, True, rng,
                                                    stream.within_episodes, wait))
        except RateLimitedError:
            continue
        except BaseException as exc:  # handed to the consumer, which re-raises it
            item = (False, exc)
        while not stop.is_set():
            try:
                out.put(item, timeout=0.1)
                break
            except queue.Full:
                continue
        if not item[0]:
            return


class DeterministicPass:
    """One pass over every retained step; see :mod:`replaybuffer.sampling.deterministic`.

    The range of retained steps is read when iteration starts, not at construction.
    Elements carry ``BufferInfo(ids=physical row indices, probabilities=())``.
    Adding to the buffer while iterating may skip or repeat steps.
    """

    def __init__(self, buffer: BlockSource, sample_batch_size: int | None,
                 num_steps: int | None, shift: int | None, drop_remainder: bool):
        check_not_all_dropped(buffer.batch_size, buffer.max_length, sample_batch_size,
                              num_steps, drop_remainder)
        self.buffer = buffer
        self.sample_batch_size = sample_batch_size
        self.num_steps = num_steps
        self.shift = shift
        self.drop_remainder = drop_remainder

    def __iter__(self) -> Iterator[Element]:
        buffer = self.buffer
        blocks = buffer.deterministic_plan(self.sample_batch_size, self.num_steps,
                                           self.shift, self.drop_remainder)
        for ids, rows in blocks:
            yield buffer.read_block(ids, rows)

    def to_torch(self) -> Any:
        """This pass as a ``torch.utils.data.IterableDataset``."""
        return to_torch(self, _holds_tf_tensors(self.buffer))


_TORCH_DATASET_CLASS: Any = None


def _holds_tf_tensors(buffer: Any) -> bool:
    """Whether a buffer's reads return TensorFlow tensors (its storage is TensorFlow's),
    which torch's data loading does not convert by itself."""
    return getattr(buffer, "storage", None) == "tensorflow"


def to_torch(dataset: Any, tf_tensors: bool = False) -> Any:
    """Wrap an iterable of elements in a ``torch.utils.data.IterableDataset``.

    Use it with ``DataLoader(ds, batch_size=None, num_workers=0)``: elements are
    already batched, and worker processes would each copy the buffer. Parallel
    sampling comes from ``num_parallel_calls`` instead. ``tf_tensors``: the elements'
    leaves are TensorFlow tensors, copied into torch tensors (through numpy) on the way.
    """
    global _TORCH_DATASET_CLASS
    if _TORCH_DATASET_CLASS is None:
        from torch.utils.data import IterableDataset

        class ReplayIterableDataset(IterableDataset[Element]):
            """A replaybuffer dataset seen by torch's data loading."""

            def __init__(self, source: Any, tf_tensors: bool):
                super().__init__()
                self.source = source
                self.tf_tensors = tf_tensors

            def __iter__(self) -> Iterator[Element]:
                if not self.tf_tensors:
                    return iter(self.source)
                import torch

                return (nest.map_structure(
                    lambda t: torch.from_numpy(np.array(t)) if hasattr(t, "numpy") else t,
                    element) for element in self.source)

        _TORCH_DATASET_CLASS = ReplayIterableDataset
    return _TORCH_DATASET_CLASS(dataset, tf_tensors)
