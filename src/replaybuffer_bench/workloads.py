"""Benchmark workloads: add_batch, get_next and as_dataset against the plain numpy limit.

The numpy limit is measured in the same process on the same data, one contiguous
array per leaf: for reads, ``leaf.take(positions, 0, out=preallocated, mode="clip")``
per leaf with precomputed random positions (the bytes a sample must move, with no
bookkeeping at all); for writes, one numpy row assignment per leaf. Reads are also
timed against the record layout (small leaves interleaved in one structured array,
one ``take`` for all of them), which this project's numpy storage uses: it moves the
same bytes with fewer cache misses, so it is the stricter limit.
"""

from __future__ import annotations

import functools
import itertools
import tempfile
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from replaybuffer import nest
from replaybuffer_bench.timing import compare
from replaybuffer.buffers import UniformReplayBuffer
from replaybuffer.specs import ArraySpec
from replaybuffer.storage.numpy_storage import packed_leaves, record_dtype


@dataclass
class Result:
    workload: str
    storage: str
    op: str
    items_per_call: int
    seconds: float
    limit_seconds: float | None
    record_limit_seconds: float | None = None
    """The same reads from the record layout: small leaves interleaved in one array."""

    @property
    def items_per_second(self) -> float:
        return self.items_per_call / self.seconds

    @property
    def ratio(self) -> float | None:
        return None if self.limit_seconds is None else self.seconds / self.limit_seconds

    @property
    def record_ratio(self) -> float | None:
        return (None if self.record_limit_seconds is None
                else self.seconds / self.record_limit_seconds)


def control_spec() -> dict[str, ArraySpec]:
    """Control-size steps: float32 observation[17], action[6], reward, discount; int32 step type."""
    return {"observation": ArraySpec((17,), np.float32), "action": ArraySpec((6,), np.float32),
            "reward": ArraySpec((), np.float32), "discount": ArraySpec((), np.float32),
            "step_type": ArraySpec((), np.int32)}


def frames_spec() -> dict[str, ArraySpec]:
    """Atari-size steps: uint8 observation[84, 84, 4] and the control scalars."""
    spec = control_spec()
    spec["observation"] = ArraySpec((84, 84, 4), np.uint8)
    spec["action"] = ArraySpec((), np.int32)
    return spec


def random_items(spec: Any, outer: tuple[int, ...], rng: np.random.Generator) -> Any:
    def leaf(s: ArraySpec) -> np.ndarray:
        shape = outer + s.shape
        if s.dtype.kind == "f":
            return rng.standard_normal(shape, dtype=np.float32).astype(s.dtype)
        return rng.integers(0, 100, size=shape).astype(s.dtype)
    return nest.map_structure(leaf, spec)


def fill(buffer: UniformReplayBuffer, rng: np.random.Generator, chunk: int = 1000) -> None:
    """Fill every slot of ``buffer`` with random data (so reads touch real pages)."""
    data = random_items(buffer.data_spec, (buffer.batch_size, chunk), rng)
    remaining = buffer.max_length
    while remaining > 0:
        n = min(chunk, remaining)
        buffer.extend(data if n == chunk else nest.map_structure(lambda a, n=n: a[:, :n], data))
        remaining -= n


def limit_arrays(buffer: UniformReplayBuffer) -> list[np.ndarray]:
    """The storage's leaves as contiguous numpy arrays, one per leaf: what the plain
    numpy limit reads and writes.

    Contiguous leaves are used in place; packed leaves (fields of the storage's
    record array, strided views that ``take`` would first copy whole) are copied, and
    so are TensorFlow variables (a view would pin the variable's buffer, and
    TensorFlow then copies the variable before every write).
    """
    arrays = buffer.store.arrays
    if buffer.storage == "tensorflow":
        return [np.array(a.numpy()) for a in arrays]
    return [np.ascontiguousarray(a if isinstance(a, np.ndarray) else a.numpy())
            for a in arrays]


def host_arrays(buffer: UniformReplayBuffer) -> list[np.ndarray]:
    """The storage's leaves as numpy arrays, views where the storage allows (numpy and
    CPU torch storage), for inspecting sizes."""
    if buffer.storage == "tensorflow":
        return [np.array(a.numpy()) for a in buffer.store.arrays]
    return [a if isinstance(a, np.ndarray) else a.numpy() for a in buffer.store.arrays]


def record_arrays(specs: list[ArraySpec], arrays: list[np.ndarray]
                  ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The record layout in plain numpy, holding a copy of ``arrays`` (one per leaf):
    ``(per-leaf arrays to write, arrays to gather)``.

    Leaves of at most ``PACK_MAX_BYTES`` per item become fields of one structured
    array (their per-leaf arrays are field views); the arrays to gather are a void
    view of the records (a plain byte copy per item) followed by the larger leaves'
    arrays, which are used as they are.
    """
    small = packed_leaves(specs)
    if not small:
        return arrays, arrays
    dtype = record_dtype([specs[i] for i in small])
    records = np.zeros(len(arrays[0]), dtype)
    out = list(arrays)
    for k, i in enumerate(small):
        out[i] = records[f"f{k}"]
        out[i][...] = arrays[i]
    gathered = [records.view(np.dtype((np.void, dtype.itemsize)))]
    return out, gathered + [a for i, a in enumerate(arrays) if i not in small]


def add_limit(arrays: list[np.ndarray], items: list[np.ndarray]) -> Callable[[], None]:
    batch = len(items[0])
    capacity = len(arrays[0])
    state = {"slot": 0}

    def assign() -> None:
        s = state["slot"]
        for dst, src in zip(arrays, items):
            dst[s:s + batch] = src
        state["slot"] = (s + batch) % (capacity - batch)
    return assign


def gather_limit(arrays: list[np.ndarray], position_sets: list[np.ndarray]
                 ) -> Callable[[], None]:
    """Gather the next precomputed set of positions into preallocated outputs.

    The sets together cover the whole buffer, so that the limit, like a real sample,
    pays for cache misses: reusing one index set would read from cache.
    """
    outs = [np.empty(position_sets[0].shape + a.shape[1:], a.dtype) for a in arrays]
    cycle = itertools.cycle(position_sets)

    def take() -> None:
        positions = next(cycle)
        # The method form with mode="clip" is numpy's fastest gather: np.take() adds
        # dispatch overhead, and mode="raise" with out= gathers into a temporary first.
        for src, out in zip(arrays, outs):
            src.take(positions, 0, out, "clip")
    return take


def position_sets(rng: np.random.Generator, capacity: int, shape: tuple[int, ...]
                  ) -> list[np.ndarray]:
    count = min(4096, max(16, capacity // int(np.prod(shape))))
    return [rng.integers(0, capacity, size=shape) for _ in range(count)]


def warmed(fn: Callable[[], object], calls: int = 3) -> Callable[[], object]:
    """``fn`` after a few untimed calls: the first calls of a TensorFlow buffer trace and
    optimise its graph functions, which would otherwise skew the loop calibration."""
    for _ in range(calls):
        fn()
    return fn


def run_workload(name: str, spec: Any, batch_size: int, capacity: int, storage: str,
                 sample_sizes: tuple[int, ...], min_time: float) -> Iterator[Result]:
    if storage != "mmap":
        yield from _run_workload(name, spec, batch_size, capacity, storage, sample_sizes,
                                 min_time)
        return
    # Files in a temporary directory (page cache, as a buffer that fits in RAM sees it).
    with tempfile.TemporaryDirectory(prefix="rb-bench-mmap-") as directory:
        yield from _run_workload(name, spec, batch_size, capacity, storage, sample_sizes,
                                 min_time, path=Path(directory) / "buffer")


def _run_workload(name: str, spec: Any, batch_size: int, capacity: int, storage: str,
                  sample_sizes: tuple[int, ...], min_time: float, path: Path | None = None
                  ) -> Iterator[Result]:
    rng = np.random.default_rng(0)
    buffer = UniformReplayBuffer(spec, batch_size=batch_size,
                                 max_length=capacity // batch_size, storage=storage, seed=0,
                                 path=path)
    fill(buffer, rng)
    label = f"{name} B={batch_size}"
    step = random_items(spec, (batch_size,), rng)
    arrays = limit_arrays(buffer)
    _, records = record_arrays(list(buffer.store.specs), arrays)
    step_leaves = nest.flatten(step)[0]
    t = compare({"ours": warmed(functools.partial(buffer.add_batch, step)),
                 "limit": add_limit(arrays, step_leaves)}, min_time)
    yield Result(label, storage, "add_batch", batch_size, t["ours"], t["limit"])
    for size in sample_sizes:
        for num_steps in (None, 2):
            steps = num_steps or 1
            shape = (size,) if num_steps is None else (size, steps)
            sets = position_sets(rng, buffer.capacity, shape)
            t = compare({"ours": warmed(functools.partial(buffer.get_next, size, num_steps)),
                         "limit": gather_limit(arrays, sets),
                         "records": gather_limit(records, sets)}, min_time)
            op = f"get_next({size}{'' if num_steps is None else f', num_steps={num_steps}'})"
            yield Result(label, storage, op, size * steps, t["ours"], t["limit"],
                         t["records"])
    # The learner's read path: a dataset sampling ahead on two parallel calls (worker
    # threads for numpy and torch storage, tf.data for tensorflow storage), timed as
    # the consumer waits for it: each timed round pulls from a fresh iterator.
    size = sample_sizes[-1]
    dataset = buffer.as_dataset(size, num_steps=2, num_parallel_calls=2)
    sync_seconds = t["ours"]  # get_next(size, num_steps=2), the last row above
    pulls = max(16, int(min_time / max(sync_seconds, 1e-9)))
    sets = position_sets(rng, buffer.capacity, (size, 2))
    ours = FreshPulls(dataset, pulls)
    ours()  # untimed: the first iterator of a TensorFlow buffer traces its graph
    ours.seconds.clear()
    t = compare({"ours": ours, "limit": gather_limit(arrays, sets),
                 "records": gather_limit(records, sets)}, min_time)
    yield Result(label, storage, f"as_dataset({size}, 2, parallel=2)", size * 2,
                 statistics.median(ours.seconds), t["limit"], t["records"])


class FreshPulls:
    """A call pulls ``pulls`` elements from a fresh iterator of ``dataset`` and appends
    the seconds per pull to ``seconds``.

    The queue is empty when the clock starts and the clock stops at the last pull, so
    the time is what a consumer waits for: the producers' sampling and the hand-over
    (and the workers' start, once per ``pulls``). Timing ``next`` on one long-lived
    iterator would be wrong: its workers fill the queue while the other contenders are
    timed, and the next round pulls ready elements for free. After the clock stops the
    iterator is closed and its workers joined, so that none takes CPU from the next
    contender.
    """

    def __init__(self, dataset: Any, pulls: int):
        self.dataset = dataset
        self.pulls = pulls
        self.seconds: list[float] = []

    def __call__(self) -> None:
        before = set(threading.enumerate())
        start = time.perf_counter()
        iterator = iter(self.dataset)
        try:
            for _ in range(self.pulls):
                next(iterator)
            self.seconds.append((time.perf_counter() - start) / self.pulls)
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()
            for thread in set(threading.enumerate()) - before:
                if thread.name.startswith("replaybuffer-prefetch-"):
                    thread.join()


def run(workloads: list[str], storages: list[str], quick: bool) -> Iterator[Result]:
    """Yield results for each workload and storage backend."""
    min_time = 0.05 if quick else 0.25
    for storage in storages:
        if "control" in workloads:
            for batch_size in (1, 32):
                yield from run_workload("control", control_spec(), batch_size,
                                        100_000 if quick else 1_000_000, storage, (256,),
                                        min_time)
        if "frames" in workloads:
            yield from run_workload("frames[84,84,4]", frames_spec(), 1,
                                    5_000 if quick else 100_000, storage, (32, 256), min_time)
