"""Peer-library benchmarks: the same workloads through cpprb, SB3, TorchRL and Tianshou.

    python -m replaybuffer_bench.peers [--quick] [--workloads control,frames,prioritized]
                                       [--peers cpprb,sb3,...] [--retries N]
                                       [--json FILE] [--markdown FILE]

The peers are optional and heavy (``benchmarks/setup_peers.sh`` installs them into a
separate virtualenv); each adapter imports its peer lazily, inside the run, and a
missing or broken peer becomes rows with status ``not installed`` or
``failed: <reason>``, never a crash and never a missing row. A workload a peer has no
API for gets ``unsupported: <why>``. See ``benchmarks/PEERS.md`` for the figures.

Workloads (capacities in full mode; ``quick`` shrinks them for a smoke run):

- ``control``: float32 obs[17], action[6], reward, next obs, done; capacity 1M.
  ``add(1)``, ``add(256)`` (a batch of 256 transitions per call) and
  ``sample(256)+next`` (uniform, next observations included).
- ``frames``: uint8 obs[4, 84, 84], int action, reward, next obs, done; capacity 200k.
  ``add(1)``, ``sample(32)+next``, ``sample(256)+next`` and ``bytes/transition``: the
  process's resident-memory growth from constructing the buffer to having filled it,
  divided by capacity (every field, measured the same way for every peer), and where
  the peer's arrays can be inspected, the observation storage alone
  (``obs_bytes_per_transition``). Layouts measured for memory only (next observations
  stored twice) are filled at a small capacity: bytes per transition do not depend on it.
- ``prioritized``: float32 obs[4] (and int action, reward, next obs, done); capacity 1M,
  full, priorities randomised before timing; ``sample(256)+weights`` (alpha 0.6,
  beta 0.4), ``update(256)`` of sampled indices and ``sample+update(256)``.
- ``pearl``: Pearl 0.4.1's own ``ReplayBuffer`` and ``RolloutBuffer`` (a seed system:
  ``replaybuffer.compat.pearl`` reproduces its API) against ours through that module,
  on its tutorial's workload (:mod:`replaybuffer_bench.pearl_seed`). Pearl needs gym
  0.19 and numpy<2, so it runs in its own venv (``benchmarks/setup_pearl.sh``), with
  ours timed beside it in the same process; without that venv the rows say
  ``not installed``.
- ``tf-agents``: TF-Agents 0.19's own ``TFUniformReplayBuffer`` and
  ``PyUniformReplayBuffer`` against ``compat.tf_agents`` on its tutorial's workload, both
  in ``.venv-tfagents`` (``benchmarks/setup_tf_agents.sh``: TensorFlow 2.15, numpy 1.26),
  one process, interleaved; see :mod:`replaybuffer_bench.tf_agents_seed`. Without that
  venv its rows say ``not installed``.

Every buffer is filled completely before anything is timed, so reads touch real pages
and writes overwrite (the steady state). One peer's buffer at a time exists: it is
dropped and garbage-collected before the next is built (200k frames are 5.6 GB a copy).
Timings are :func:`replaybuffer_bench.timing.compare` medians, the ops of one buffer
interleaved. Torch runs with one intra-op thread by default (``torch_threads``), as the
numpy peers do: on a small shared machine torch's OpenMP pool otherwise stalls for
milliseconds whenever another process holds a core. Each timed row records
``others_cores``, the cores other processes kept busy meanwhile; ``--retries N`` runs a
contended peer again once the machine is quiet and keeps the least contended attempt.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import importlib
import itertools
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Generator, Iterator

import numpy as np

from replaybuffer_bench import pearl_seed, seed_venv, tf_agents_seed
from replaybuffer_bench.timing import compare
from replaybuffer_bench.workloads import fill, host_arrays, random_items
from replaybuffer.specs import ArraySpec

_Rows = Generator[dict[str, Any], None, None]
"""What a peer's run function yields: one result row per op."""

__all__ = ["WORKLOADS", "PEERS", "Sizes", "run_peers", "format_rows", "format_markdown", "main"]

BUFFER_WORKLOADS = ("control", "frames", "prioritized", "prioritized-skewed")
WORKLOADS = BUFFER_WORKLOADS + ("pearl", "tf-agents")

OPS = {
    "control": ("add(1)", "add(256)", "sample(256)+next"),
    "frames": ("add(1)", "sample(32)+next", "sample(256)+next", "bytes/transition"),
    "prioritized": ("sample(256)+weights", "update(256)", "sample+update(256)"),
}
OPS["prioritized-skewed"] = OPS["prioritized"]
OPS["pearl"] = pearl_seed.peer_ops()
OPS["tf-agents"] = tf_agents_seed.peer_ops()
MEMORY_ONLY = ("bytes/transition",)

ALPHA, BETA = 0.6, 0.4
FRAME_SHAPE = (4, 84, 84)
FILL_CHUNK = 1000


@dataclass(frozen=True)
class Sizes:
    control: int
    frames: int
    prioritized: int
    frames_memory_only: int  # layouts measured for bytes/transition alone
    min_time: float
    repeats: int


FULL = Sizes(control=1_000_000, frames=200_000, prioritized=1_000_000,
             frames_memory_only=20_000, min_time=0.25, repeats=7)
QUICK = Sizes(control=20_000, frames=2_000, prioritized=20_000,
              frames_memory_only=2_000, min_time=0.02, repeats=3)


class Unsupported(Exception):
    """The peer has no API for this workload (reported as ``unsupported: ...``)."""


NotInstalled = seed_venv.NotInstalled
"""The peer lives in a venv of its own that is missing (``not installed (...)``)."""


# --------------------------------------------------------------------------- helpers
_TORCH_THREADS: list[int | None] = [1]


def _torch() -> Any:
    import torch
    threads = _TORCH_THREADS[0]
    if threads is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return torch


def _rss() -> int | None:
    """Resident set size of this process in bytes (Linux), else None."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _release() -> None:
    """Collect garbage and hand freed heap back to the OS, so RSS baselines are clean."""
    gc.collect()
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class _Memory:
    """RSS growth from construction to full, per transition."""

    def __init__(self, capacity: int):
        _release()
        self.capacity = capacity
        self.start = _rss()

    def row(self, obs_nbytes: int | None = None, detail: str = "") -> dict[str, Any]:
        _release()  # drop the fill's freed temporaries from the count
        end = _rss()
        grown = None if self.start is None or end is None else (end - self.start)
        return {"op": "bytes/transition", "items_per_call": None,
                "bytes_per_transition": None if grown is None else grown / self.capacity,
                "obs_bytes_per_transition": (None if obs_nbytes is None
                                             else obs_nbytes / self.capacity),
                "detail": f"capacity {self.capacity:,}" + (f"; {detail}" if detail else "")}


def _timed(ops: dict[str, tuple[Callable[[], object], int]], sizes: Sizes
           ) -> Iterator[dict[str, Any]]:
    """Time ``{op: (fn, items_per_call)}`` interleaved; yield one row per op.

    ``others_cores`` is how many cores other processes kept busy meanwhile (machine
    CPU time from /proc/stat less this process's, over the wall time): on a small
    shared machine anything well above 0 means the figures may be inflated.
    """
    wall, cpu, machine = time.perf_counter(), time.process_time(), _machine_cpu()
    seconds = compare({op: fn for op, (fn, _) in ops.items()}, sizes.min_time, sizes.repeats)
    elapsed = max(time.perf_counter() - wall, 1e-9)
    own = time.process_time() - cpu
    end = _machine_cpu()
    others = None if machine is None or end is None else max(0.0, (end - machine - own) / elapsed)
    for op, (_, items) in ops.items():
        yield {"op": op, "seconds_per_call": seconds[op], "items_per_call": items,
               "others_cores": None if others is None else round(others, 2)}


def _machine_cpu() -> float | None:
    """CPU seconds all processes of the machine have used (Linux /proc/stat), else None."""
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()
        # user nice system idle iowait irq softirq steal ...: busy = all but idle, iowait
        values = [int(v) for v in fields[1:9]]
        busy = sum(values) - values[3] - values[4]
        return busy / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _cycle(values: list[Any]) -> Callable[[], Any]:
    it = itertools.cycle(values)
    return lambda: next(it)


def _data(spec: dict[str, ArraySpec], outer: tuple[int, ...], seed: int = 0
          ) -> dict[str, np.ndarray]:
    items: dict[str, np.ndarray] = random_items(spec, outer, np.random.default_rng(seed))
    return items


def _control_spec() -> dict[str, ArraySpec]:
    return {"obs": ArraySpec((17,), np.float32), "act": ArraySpec((6,), np.float32),
            "rew": ArraySpec((), np.float32), "next_obs": ArraySpec((17,), np.float32),
            "done": ArraySpec((), np.float32)}


def _frames_spec(obs_shape: tuple[int, ...] = FRAME_SHAPE) -> dict[str, ArraySpec]:
    return {"obs": ArraySpec(obs_shape, np.uint8), "act": ArraySpec((), np.int64),
            "rew": ArraySpec((), np.float32), "next_obs": ArraySpec(obs_shape, np.uint8),
            "done": ArraySpec((), np.float32)}


def _prioritized_spec() -> dict[str, ArraySpec]:
    return {"obs": ArraySpec((4,), np.float32), "act": ArraySpec((), np.int64),
            "rew": ArraySpec((), np.float32), "next_obs": ArraySpec((4,), np.float32),
            "done": ArraySpec((), np.float32)}


def _transitions(spec: dict[str, ArraySpec], capacity: int) -> dict[str, Any]:
    """One transition, a batch of 256 and a fill chunk, all done=0."""
    chunk = min(FILL_CHUNK, capacity)
    out = {"one": _data(spec, (), 1), "batch": _data(spec, (256,), 2),
           "chunk": _data(spec, (chunk,), 3)}
    for d in out.values():
        d["done"] = np.zeros_like(d["done"])
    return out


def _chunks(capacity: int, chunk: int) -> Iterator[int]:
    """Sizes of the fill calls that add exactly ``capacity`` items."""
    remaining = capacity
    while remaining > 0:
        n = min(chunk, remaining)
        yield n
        remaining -= n


def _prioritized(workload: str) -> bool:
    return workload in ("prioritized", "prioritized-skewed")


def _priorities(workload: str, rng: np.random.Generator, size: int) -> np.ndarray:
    """float32 priorities: uniform in [1e-3, 1 + 1e-3) for ``prioritized``; log-normal
    (sigma 2, so after alpha = 0.6 the largest of 1M is ~300x the mean) for
    ``prioritized-skewed``, the heavy tail of real TD errors, where rejection from the
    largest priority rarely accepts and samplers must search their tree."""
    if workload == "prioritized-skewed":
        return rng.lognormal(0.0, 2.0, size).astype(np.float32)
    return (rng.random(size) + 1e-3).astype(np.float32)


def _priority_pool(workload: str, n: int = 64, size: int = 256) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [_priorities(workload, rng, size) for _ in range(n)]


# --------------------------------------------------------------------- replaybuffer
def _frame_stream(length: int = FILL_CHUNK, seed: int = 4) -> np.ndarray:
    """``[length, 4, 84, 84]`` stacks sliding over one periodic stream of frames.

    Step ``t`` stacks frames ``t .. t+3``; the stream starts with 3 all-zero frames and
    repeats with period ``length``, so cycling through the steps forever is one
    consistent stream: every stack slides on from the one before, as in an Atari
    episode (deduplication stores one frame per step; a stack that did not slide would
    cost side frames).
    """
    k = FRAME_SHAPE[0]
    rng = np.random.default_rng(seed)
    frames = rng.integers(1, 256, size=(length + k - 1,) + FRAME_SHAPE[1:], dtype=np.uint8)
    frames[:k - 1] = 0
    frames[length:] = frames[:k - 1]
    return np.stack([frames[t:t + k] for t in range(length)])


def _ours(workload: str, sizes: Sizes, layout: str = "plain") -> _Rows:
    """This project's buffers (numpy storage); next observations via ``num_steps=2``.

    ``UniformReplayBuffer`` (``PrioritizedReplayBuffer`` for PER) with one row, so a
    window of two steps is (obs, next obs) read from the same storage. ``add(256)``
    goes through a 256-row buffer (one step of 256 envs per call). ``layout``:
    ``frame_stack`` stores the stacked obs deduplicated (``frame_stack="obs"``), fed
    with stacks that slide over one frame stream.
    """
    import replaybuffer
    from replaybuffer.buffers import UniformReplayBuffer

    rng = np.random.default_rng(0)
    if _prioritized(workload):
        cls = getattr(replaybuffer, "PrioritizedReplayBuffer", None)
        if cls is None:
            raise Unsupported("this replaybuffer version has no PrioritizedReplayBuffer")
        capacity = sizes.prioritized
        spec = {k: v for k, v in _prioritized_spec().items() if k != "next_obs"}
        buf = cls(spec, batch_size=1, max_length=capacity, alpha=ALPHA, beta=BETA, seed=0)
        fill(buf, rng)
        for start in range(0, capacity, 100_000):  # item ids are add ids (one row)
            ids = np.arange(start, min(capacity, start + 100_000))
            applied = buf.update_priorities(ids, _priorities(workload, rng, len(ids)))
            if applied != len(ids):
                raise RuntimeError(f"update_priorities applied {applied} of {len(ids)}")
        prios = _priority_pool(workload)
        next_prio = _cycle(prios)
        sampled_ids = [buf.get_next(256, 2)[1].ids for _ in range(len(prios))]
        pairs = _cycle(list(zip(sampled_ids, prios)))

        def sample_update() -> None:
            _, info = buf.get_next(256, 2)  # info.weights: importance weights
            buf.update_priorities(info.ids, next_prio())

        yield from _timed({"sample(256)+weights": (lambda: buf.get_next(256, 2), 256),
                           "update(256)": (lambda: buf.update_priorities(*pairs()), 256),
                           "sample+update(256)": (sample_update, 256)}, sizes)
        return

    if layout == "transitions":
        yield from _ours_transitions(sizes)
        return
    full = _control_spec() if workload == "control" else _frames_spec()
    spec = {k: v for k, v in full.items() if k != "next_obs"}  # steps, not transitions
    capacity = sizes.control if workload == "control" else sizes.frames
    step = random_items(spec, (1,), rng)
    if workload == "control":
        buf = UniformReplayBuffer(spec, batch_size=1, max_length=capacity, seed=0)
        fill(buf, rng)
        yield from _timed({"add(1)": (lambda: buf.add_batch(step), 1),
                           "sample(256)+next": (lambda: buf.get_next(256, 2), 256)}, sizes)
        buf = None  # freed before the next buffer is built
        _release()
        wide = UniformReplayBuffer(spec, batch_size=256, max_length=capacity // 256, seed=0)
        fill(wide, rng)
        batch = random_items(spec, (256,), rng)
        yield from _timed({"add(256)": (lambda: wide.add_batch(batch), 256)}, sizes)
        return

    if layout == "plain":
        mem = _Memory(capacity)
        buf = UniformReplayBuffer(spec, batch_size=1, max_length=capacity, seed=0)
        fill(buf, rng)
        obs = max(a.nbytes for a in host_arrays(buf))
        yield mem.row(obs, "one obs array; next obs is the next slot")
        add1: Callable[[], object] = lambda: buf.add_batch(step)  # noqa: E731
    else:
        stream = _frame_stream()
        chunk = random_items(spec, (1, len(stream)), rng)
        chunk["obs"] = stream[None]
        steps = [{k: v[:, t] for k, v in chunk.items()} for t in range(len(stream))]
        mem = _Memory(capacity)
        buf = UniformReplayBuffer(spec, batch_size=1, max_length=capacity, seed=0,
                                  frame_stack="obs", stack_axis=0)
        for n in _chunks(capacity, len(stream)):
            buf.extend(chunk if n == len(stream) else {k: v[:, :n] for k, v in chunk.items()})
        yield mem.row(None, "one frame per step plus 4 int64 references")
        next_step = _cycle(steps[capacity % len(steps):] + steps[:capacity % len(steps)])
        add1 = lambda: buf.add_batch(next_step())  # noqa: E731
    yield from _timed({"add(1)": (add1, 1),
                       "sample(32)+next": (lambda: buf.get_next(32, 2), 32),
                       "sample(256)+next": (lambda: buf.get_next(256, 2), 256)}, sizes)


def _ours_transitions(sizes: Sizes) -> _Rows:
    """The control workload through ``TransitionReplayBuffer``, the SB3-style API:
    ``add(obs, action, reward, next_obs, terminated)`` of one env (of 256 envs for
    ``add(256)``), fed a consistent stream (each observation is the previous next
    observation, as from an env), and ``sample(256)`` returning ``Transitions``."""
    from replaybuffer import TransitionReplayBuffer

    spec = _control_spec()
    rng = np.random.default_rng(0)

    def stream(envs: int, length: int) -> list[tuple[np.ndarray, ...]]:
        """``length`` steps whose last next observation is the first observation, so
        cycling them is one consistent stream."""
        obs = rng.standard_normal((length, envs) + spec["obs"].shape, dtype=np.float32)
        act = rng.standard_normal((length, envs) + spec["act"].shape, dtype=np.float32)
        rew = rng.standard_normal((length, envs), dtype=np.float32)
        done = np.zeros((length, envs), np.bool_)
        return [(obs[t], act[t], rew[t], obs[(t + 1) % length], done[t])
                for t in range(length)]

    def cycle(buf: Any, steps: list[tuple[np.ndarray, ...]]) -> Callable[[], None]:
        state = {"t": 0}

        def add() -> None:
            t = state["t"]
            buf.add(*steps[t])
            state["t"] = (t + 1) % len(steps)
        return add

    def build(envs: int) -> tuple[Any, Callable[[], None]]:
        buf = TransitionReplayBuffer(spec["obs"], spec["act"], sizes.control, num_envs=envs,
                                     seed=0)
        fill = cycle(buf, stream(envs, FILL_CHUNK))
        for _ in range(sizes.control // envs):
            fill()
        # Timed adds cycle two steps (the second's next observation is the first's
        # observation), so their inputs stay in the cache as the other peers' one
        # repeated batch does; the ring written is as large (and as cold) as theirs.
        # The first timed add jumps from the fill stream (one add of thousands).
        return buf, cycle(buf, stream(envs, 2))

    buf, add1 = build(1)
    yield from _timed({"add(1)": (add1, 1),
                       "sample(256)+next": (lambda: buf.sample(256), 256)}, sizes)
    buf = None
    _release()
    wide, add256 = build(256)
    yield from _timed({"add(256)": (add256, 256)}, sizes)


# ---------------------------------------------------------------------------- cpprb
def _numpy_limit(workload: str, sizes: Sizes, layout: str = "plain"
                 ) -> _Rows:
    """The plain-numpy limit: the same bytes moved by numpy alone, no bookkeeping.

    ``plain``: one contiguous array per field (observations once: the next observation
    is the next row); adds are slice assignments per field, samples
    ``take(positions, 0, out, "clip")`` per field (and the observations again at the
    next positions) into preallocated outputs, with precomputed random positions that
    together cover the buffer, so the limit pays for cache misses as real samples do.

    ``records``: the fields of at most ``PACK_MAX_BYTES`` per item interleaved as one
    record per step (the layout this project's numpy storage uses), larger fields in
    arrays of their own. A sample takes the records of both steps of each
    (step, next step) pair with one ``take``: more bytes than ``plain`` (every field of
    the next step), but one cache miss per step instead of one per field.
    """
    from replaybuffer_bench.workloads import (add_limit, gather_limit, position_sets,
                                              record_arrays)

    spec = {k: v for k, v in (_control_spec() if workload == "control"
                              else _frames_spec()).items() if k != "next_obs"}
    capacity = sizes.control if workload == "control" else sizes.frames
    rng = np.random.default_rng(0)
    specs = list(spec.values())
    arrays = [np.zeros((capacity,) + s.shape, s.dtype) for s in specs]
    gathered = arrays
    if layout == "records":  # the small per-leaf arrays stay untouched (never mapped)
        arrays, gathered = record_arrays(specs, arrays)
    chunk = [v[0] for v in random_items(spec, (1, FILL_CHUNK), rng).values()]
    for start in range(0, capacity, FILL_CHUNK):
        for dst, src in zip(arrays, chunk):
            dst[start:start + FILL_CHUNK] = src[:capacity - start]

    def adder(batch: int) -> Callable[[], None]:
        return add_limit(arrays, [v[0] for v in random_items(spec, (1, batch), rng).values()])

    def sampler(size: int) -> Callable[[], object]:  # every field, plus the next observation
        starts = position_sets(rng, capacity - 1, (size,))
        if layout == "records":  # every gathered array at (step, next step) pairs
            take_pairs = gather_limit(gathered, [np.stack([p, p + 1], 1) for p in starts])
            return take_pairs
        take_all = gather_limit(gathered, starts)
        take_next = gather_limit(gathered[:1], [p + 1 for p in starts])
        return lambda: (take_all(), take_next())

    ops: dict[str, tuple[Callable[[], object], int]] = {"add(1)": (adder(1), 1)}
    if workload == "control":
        ops["add(256)"] = (adder(256), 256)
        ops["sample(256)+next"] = (sampler(256), 256)
    else:
        ops["sample(32)+next"] = (sampler(32), 32)
        ops["sample(256)+next"] = (sampler(256), 256)
    yield from _timed(ops, sizes)
    if workload == "frames":
        step_bytes = sum(a.nbytes for a in gathered) / capacity
        yield {"op": "bytes/transition", "items_per_call": None,
               "bytes_per_transition": step_bytes, "obs_bytes_per_transition": None,
               "detail": "computed: the arrays' bytes per step"}


def _cpprb_env(spec: dict[str, ArraySpec], next_of: bool) -> dict[str, dict[str, Any]]:
    env = {}
    for key, s in spec.items():
        if next_of and key == "next_obs":
            continue
        env[key] = {"shape": s.shape or 1, "dtype": s.dtype}
    return env


def _cpprb_fill(rb: Any, chunk: dict[str, np.ndarray], capacity: int) -> None:
    for n in _chunks(capacity, len(chunk["obs"])):
        rb.add(**{k: v[:n] for k, v in chunk.items()})


def _cpprb(workload: str, sizes: Sizes, layout: str = "next_of") -> _Rows:
    """cpprb ReplayBuffer / PrioritizedReplayBuffer, next_obs via ``next_of='obs'``.

    ``layout``: ``next_of`` (default), ``stack`` (next_of + stack_compress='obs'; cpprb
    wants the stack as the last dimension, so obs is [84, 84, 4]) or ``plain`` (next_obs
    stored as its own array; memory only).
    """
    import cpprb

    next_of = layout != "plain"
    kwargs: dict[str, Any] = {"next_of": "obs"} if next_of else {}
    if _prioritized(workload):
        capacity = sizes.prioritized
        spec = _prioritized_spec()
        data = _transitions(spec, capacity)
        rb = cpprb.PrioritizedReplayBuffer(capacity, _cpprb_env(spec, True), alpha=ALPHA,
                                           **kwargs)
        _cpprb_fill(rb, data["chunk"], capacity)
        rng = np.random.default_rng(1)
        for start in range(0, capacity, 100_000):
            idx = np.arange(start, min(capacity, start + 100_000))
            rb.update_priorities(idx, _priorities(workload, rng, len(idx)))
        prios = _priority_pool(workload)
        next_prio = _cycle(prios)
        indexes = [rb.sample(256, beta=BETA)["indexes"] for _ in range(len(prios))]
        pairs = _cycle(list(zip(indexes, prios)))

        def sample_update() -> None:
            s = rb.sample(256, beta=BETA)
            rb.update_priorities(s["indexes"], next_prio())

        yield from _timed({
            "sample(256)+weights": (lambda: rb.sample(256, beta=BETA), 256),
            "update(256)": (lambda: rb.update_priorities(*pairs()), 256),
            "sample+update(256)": (sample_update, 256)}, sizes)
        return

    if workload == "control":
        capacity = sizes.control
        spec = _control_spec()
        data = _transitions(spec, capacity)
        rb = cpprb.ReplayBuffer(capacity, _cpprb_env(spec, next_of), **kwargs)
        _cpprb_fill(rb, data["chunk"], capacity)
        one, batch = data["one"], data["batch"]
        yield from _timed({"add(1)": (lambda: rb.add(**one), 1),
                           "add(256)": (lambda: rb.add(**batch), 256),
                           "sample(256)+next": (lambda: rb.sample(256), 256)}, sizes)
        return

    # frames
    memory_only = layout == "plain"
    capacity = sizes.frames_memory_only if memory_only else sizes.frames
    shape = (84, 84, 4) if layout == "stack" else FRAME_SHAPE
    spec = _frames_spec(shape)
    data = _transitions(spec, capacity)
    if layout == "stack":
        kwargs["stack_compress"] = "obs"
    mem = _Memory(capacity)
    rb = cpprb.ReplayBuffer(capacity, _cpprb_env(spec, next_of), **kwargs)
    _cpprb_fill(rb, data["chunk"], capacity)
    yield mem.row(None, {"next_of": "obs and next_obs share one array (+1 slot)",
                         "stack": "next_of + stack_compress: frames shared along the stack",
                         "plain": "obs and next_obs stored separately"}[layout])
    if memory_only:
        return
    one = data["one"]
    yield from _timed({"add(1)": (lambda: rb.add(**one), 1),
                       "sample(32)+next": (lambda: rb.sample(32), 32),
                       "sample(256)+next": (lambda: rb.sample(256), 256)}, sizes)


# ----------------------------------------------------------------------- SB3
def _sb3(workload: str, sizes: Sizes, layout: str = "default") -> _Rows:
    """stable_baselines3.common.buffers.ReplayBuffer (samples come back as torch tensors).

    ``layout``: ``default`` (next observations in their own array) or ``optimize_memory``
    (``optimize_memory_usage=True``: next obs is the next slot). Both with
    ``handle_timeout_termination=False`` (required by optimize_memory_usage; saves a
    per-env list comprehension over infos). ``add(256)`` goes through a buffer with
    ``n_envs=256``: SB3 adds one step of every env per call.
    """
    if _prioritized(workload):
        raise Unsupported("SB3 has no prioritized replay buffer")
    _torch()
    from gymnasium import spaces
    from stable_baselines3.common.buffers import ReplayBuffer

    optimize = layout == "optimize_memory"
    obs_space: Any
    if workload == "control":
        obs_space = spaces.Box(-np.inf, np.inf, (17,), np.float32)
        act_space: Any = spaces.Box(-1.0, 1.0, (6,), np.float32)
    else:
        obs_space = spaces.Box(0, 255, FRAME_SHAPE, np.uint8)
        act_space = spaces.Discrete(6)

    def make(capacity: int, n_envs: int = 1) -> Any:
        return ReplayBuffer(capacity, obs_space, act_space, device="cpu", n_envs=n_envs,
                            optimize_memory_usage=optimize, handle_timeout_termination=False)

    def adder(rb: Any, d: dict[str, np.ndarray], n_envs: int) -> Callable[[], None]:
        obs = d["obs"].reshape((n_envs,) + obs_space.shape)
        nxt = d["next_obs"].reshape(obs.shape)
        act = d["act"].reshape(n_envs, -1)
        rew, done = d["rew"].reshape(n_envs), d["done"].reshape(n_envs)
        infos: list[dict[str, Any]] = [{} for _ in range(n_envs)]
        return lambda: rb.add(obs, nxt, act, rew, done, infos)

    def fill_sb3(rb: Any, chunk: dict[str, np.ndarray], capacity: int, n_envs: int) -> None:
        adds = [adder(rb, {k: v[i:i + n_envs] for k, v in chunk.items()}, n_envs)
                for i in range(0, len(chunk["obs"]) - n_envs + 1, n_envs)]
        for i in range(capacity // n_envs):
            adds[i % len(adds)]()

    if workload == "control":
        capacity = sizes.control
        spec = _control_spec()
        data = _transitions(spec, capacity)
        rb = make(capacity)
        fill_sb3(rb, data["chunk"], capacity, 1)
        add1 = adder(rb, {k: v[None] for k, v in data["one"].items()}, 1)
        yield from _timed({"add(1)": (add1, 1),
                           "sample(256)+next": (lambda: rb.sample(256), 256)}, sizes)
        del rb, add1  # freed before the next buffer is built
        _release()
        wide = make(capacity, n_envs=256)
        fill_sb3(wide, data["chunk"], capacity, 256)
        yield from _timed({"add(256)": (adder(wide, data["batch"], 256), 256)}, sizes)
        return

    memory_only = not optimize
    capacity = sizes.frames_memory_only if memory_only else sizes.frames
    spec = _frames_spec()
    data = _transitions(spec, capacity)
    mem = _Memory(capacity)
    rb = make(capacity)
    fill_sb3(rb, data["chunk"], capacity, 1)
    obs_bytes = rb.observations.nbytes + (0 if optimize else rb.next_observations.nbytes)
    yield mem.row(obs_bytes, "next obs is the next slot" if optimize
                  else "observations and next_observations arrays")
    if memory_only:
        return
    add1 = adder(rb, {k: v[None] for k, v in data["one"].items()}, 1)
    yield from _timed({"add(1)": (add1, 1),
                       "sample(32)+next": (lambda: rb.sample(32), 32),
                       "sample(256)+next": (lambda: rb.sample(256), 256)}, sizes)


# ------------------------------------------------------------------------- TorchRL
def _torchrl(workload: str, sizes: Sizes, layout: str = "td") -> _Rows:
    """TorchRL replay buffers over LazyTensorStorage (PrioritizedSampler for PER).

    ``layout``: ``td`` is TensorDictReplayBuffer with TorchRL's transition layout
    (observation, action, ("next", observation/reward/done)); ``pytree`` is ReplayBuffer
    over a plain tuple of tensors. TorchRL stores next observations as their own tensor.
    """
    torch = _torch()
    from torchrl.data import LazyTensorStorage, ReplayBuffer, TensorDictReplayBuffer
    from torchrl.data.replay_buffers.samplers import PrioritizedSampler

    spec = {"control": _control_spec, "frames": _frames_spec,
            "prioritized": _prioritized_spec,
            "prioritized-skewed": _prioritized_spec}[workload]()
    capacity = sizes.prioritized if _prioritized(workload) else getattr(sizes, workload)
    data = _transitions(spec, capacity)

    if layout == "td":
        from tensordict import TensorDict

        def pack(d: dict[str, np.ndarray]) -> Any:
            batch = list(d["rew"].shape)
            t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in d.items()}
            return TensorDict({"observation": t["obs"], "action": t["act"],
                               "next": {"observation": t["next_obs"], "reward": t["rew"],
                                        "done": t["done"].bool()}}, batch)
        cls = TensorDictReplayBuffer
    else:
        def pack(d: dict[str, np.ndarray]) -> Any:
            return tuple(torch.from_numpy(np.ascontiguousarray(d[k]))
                         for k in ("obs", "act", "rew", "next_obs", "done"))
        cls = ReplayBuffer

    sampler = {}
    if _prioritized(workload):
        sampler = {"sampler": PrioritizedSampler(capacity, alpha=ALPHA, beta=BETA)}
    if workload == "frames":
        mem = _Memory(capacity)
    rb = cls(storage=LazyTensorStorage(capacity), **sampler)
    chunk = data["chunk"]
    packed = pack(chunk)
    for n in _chunks(capacity, len(chunk["rew"])):
        rb.extend(packed if n == len(chunk["rew"]) else pack({k: v[:n] for k, v in chunk.items()}))
    if workload == "frames":
        obs_bytes = None
        with contextlib.suppress(Exception):
            # The storage's tensors, whole: the buffer is full, so get(slice(None)) is a
            # view of every slot (basic slicing, no copy).
            st = rb.storage.get(slice(None))
            obs_bytes = st["observation"].nbytes + st["next", "observation"].nbytes
        yield mem.row(obs_bytes, "observation and (next, observation) tensors")
    one, batch = pack(data["one"]), pack(data["batch"])

    if _prioritized(workload):
        rng = np.random.default_rng(1)
        for start in range(0, capacity, 100_000):
            idx = torch.arange(start, min(capacity, start + 100_000))
            rb.update_priority(idx, torch.from_numpy(_priorities(workload, rng, len(idx))))
        prios = [torch.from_numpy(p) for p in _priority_pool(workload)]
        next_prio = _cycle(prios)
        if layout == "td":
            def sample() -> Any:
                return rb.sample(256)  # carries "index" and "priority_weight"

            def index_of(s: Any) -> Any:
                return s["index"]
        else:
            def sample() -> Any:
                return rb.sample(256, return_info=True)  # (data, {"index", "priority_weight"})

            def index_of(s: Any) -> Any:
                return s[1]["index"]
        indexes = [index_of(sample()) for _ in range(len(prios))]
        pairs = _cycle(list(zip(indexes, prios)))

        def sample_update() -> None:
            rb.update_priority(index_of(sample()), next_prio())

        yield from _timed({"sample(256)+weights": (sample, 256),
                           "update(256)": (lambda: rb.update_priority(*pairs()), 256),
                           "sample+update(256)": (sample_update, 256)}, sizes)
        return
    if workload == "control":
        yield from _timed({"add(1)": (lambda: rb.add(one), 1),
                           "add(256)": (lambda: rb.extend(batch), 256),
                           "sample(256)+next": (lambda: rb.sample(256), 256)}, sizes)
        return
    yield from _timed({"add(1)": (lambda: rb.add(one), 1),
                       "sample(32)+next": (lambda: rb.sample(32), 32),
                       "sample(256)+next": (lambda: rb.sample(256), 256)}, sizes)


# ------------------------------------------------------------------------ Tianshou
def _tianshou(workload: str, sizes: Sizes, layout: str = "default"
              ) -> _Rows:
    """Tianshou ReplayBuffer / VectorReplayBuffer / PrioritizedReplayBuffer (numpy Batch).

    ``layout`` (frames): ``default`` stores obs_next (memory only), ``ignore_obs_next``
    reads next obs from the next index, ``atari`` adds ``save_only_last_obs`` and
    ``stack_num=4`` (one frame stored, stacks rebuilt at sample time), the configuration
    of Tianshou's Atari examples. ``add(256)`` goes through ``VectorReplayBuffer`` with
    256 sub-buffers, Tianshou's way of adding a step from each of many envs. Buffers are
    filled through ``update()`` from a chunk-sized buffer (``add`` is one transition).
    """
    _torch()
    from tianshou.data import Batch, PrioritizedReplayBuffer, ReplayBuffer, VectorReplayBuffer

    options: dict[str, Any] = {}
    if layout in ("ignore_obs_next", "atari"):
        options["ignore_obs_next"] = True
    if layout == "atari":
        options.update(save_only_last_obs=True, stack_num=4)

    def batch_of(d: dict[str, np.ndarray]) -> Any:
        return Batch(obs=d["obs"], act=d["act"], rew=d["rew"], terminated=d["done"] > 0,
                     truncated=np.zeros_like(d["done"], bool), obs_next=d["next_obs"])

    def rows(d: dict[str, np.ndarray]) -> list[Any]:
        return [batch_of({k: v[i] for k, v in d.items()}) for i in range(len(d["rew"]))]

    def source_of(chunk: dict[str, np.ndarray]) -> Any:
        source = ReplayBuffer(len(chunk["rew"]), **options)
        for b in rows(chunk):
            source.add(b)
        return source

    def fill_ts(buf: Any, source: Any, capacity: int) -> None:
        for _ in range(capacity // len(source)):
            buf.update(source)
        for i in range(capacity % len(source)):
            buf.add(source[i])

    spec = {"control": _control_spec, "frames": _frames_spec,
            "prioritized": _prioritized_spec,
            "prioritized-skewed": _prioritized_spec}[workload]()
    memory_only = workload == "frames" and layout == "default"
    capacity = sizes.frames_memory_only if memory_only else \
        sizes.prioritized if _prioritized(workload) else getattr(sizes, workload)
    data = _transitions(spec, capacity)
    one = batch_of(data["one"])
    source = source_of(data["chunk"])  # built before any memory baseline

    if _prioritized(workload):
        buf = PrioritizedReplayBuffer(capacity, alpha=ALPHA, beta=BETA)
        fill_ts(buf, source, capacity)
        rng = np.random.default_rng(1)
        buf.update_weight(np.arange(capacity), _priorities(workload, rng, capacity))
        prios = _priority_pool(workload)
        next_prio = _cycle(prios)
        indexes = [buf.sample(256)[1] for _ in range(len(prios))]
        pairs = _cycle(list(zip(indexes, prios)))

        def sample_update() -> None:
            batch, idx = buf.sample(256)  # batch.weight: importance weights
            buf.update_weight(idx, next_prio())

        yield from _timed({"sample(256)+weights": (lambda: buf.sample(256), 256),
                           "update(256)": (lambda: buf.update_weight(*pairs()), 256),
                           "sample+update(256)": (sample_update, 256)}, sizes)
        return

    if workload == "control":
        buf = ReplayBuffer(capacity, **options)
        fill_ts(buf, source, capacity)
        yield from _timed({"add(1)": (lambda: buf.add(one), 1),
                           "sample(256)+next": (lambda: buf.sample(256), 256)}, sizes)
        buf = None  # freed before the next buffer is built
        _release()
        vec = VectorReplayBuffer(capacity, 256, **options)
        batch = batch_of(data["batch"])
        for _ in range(capacity // 256):
            vec.add(batch)
        yield from _timed({"add(256)": (lambda: vec.add(batch), 256)}, sizes)
        return

    mem = _Memory(capacity)
    buf = ReplayBuffer(capacity, **options)
    fill_ts(buf, source, capacity)
    obs_bytes = None
    with contextlib.suppress(Exception):
        obs_bytes = buf.obs.nbytes + (0 if options else buf.obs_next.nbytes)
    yield mem.row(obs_bytes, {"default": "obs and obs_next arrays",
                              "ignore_obs_next": "next obs is the next index",
                              "atari": "last frame only; stacks rebuilt per sample"}[layout])
    if memory_only:
        return
    yield from _timed({"add(1)": (lambda: buf.add(one), 1),
                       "sample(32)+next": (lambda: buf.sample(32), 32),
                       "sample(256)+next": (lambda: buf.sample(256), 256)}, sizes)


def _pearl(workload: str, sizes: Sizes, layout: str = "seed") -> _Rows:
    """Pearl's buffers and ours through compat.pearl, timed together in .venv-pearl:
    rows of peer ``pearl`` and of peer ``replaybuffer`` for every op."""
    yield from pearl_seed.peer_rows(quick=sizes is QUICK)


def _tf_agents(workload: str, sizes: Sizes, layout: str = "seed") -> _Rows:
    """TF-Agents 0.19's TFUniformReplayBuffer and PyUniformReplayBuffer and ours through
    compat.tf_agents, timed together in .venv-tfagents (TensorFlow 2.15): rows of peer
    ``tf-agents`` and of peer ``replaybuffer`` for every op."""
    yield from tf_agents_seed.peer_rows(quick=sizes is QUICK)


# ------------------------------------------------------------------------ registry
@dataclass(frozen=True)
class Peer:
    label: str
    family: str  # the name --peers selects
    modules: tuple[str, ...]  # imported first: ImportError means "not installed"
    run: Callable[..., _Rows]
    layout: str
    workloads: tuple[str, ...]
    memory_only: bool = False

    def ops(self, workload: str) -> tuple[str, ...]:
        return MEMORY_ONLY if self.memory_only else OPS[workload]

    def distribution(self) -> str:
        return {"sb3": "stable-baselines3"}.get(self.family, self.family)


PEERS: tuple[Peer, ...] = (
    Peer("numpy limit", "numpy", ("numpy",), _numpy_limit, "plain", ("control", "frames")),
    Peer("numpy limit[records]", "numpy", ("numpy",), _numpy_limit, "records",
         ("control", "frames")),
    Peer("replaybuffer", "replaybuffer", ("replaybuffer",), _ours, "plain", BUFFER_WORKLOADS),
    Peer("replaybuffer[transitions]", "replaybuffer", ("replaybuffer",), _ours,
         "transitions", ("control",)),
    Peer("replaybuffer[frame_stack]", "replaybuffer", ("replaybuffer",), _ours,
         "frame_stack", ("frames",)),
    Peer("cpprb", "cpprb", ("cpprb",), _cpprb, "next_of", BUFFER_WORKLOADS),
    Peer("cpprb[stack_compress]", "cpprb", ("cpprb",), _cpprb, "stack", ("frames",)),
    Peer("cpprb[no next_of]", "cpprb", ("cpprb",), _cpprb, "plain", ("frames",), True),
    Peer("sb3", "sb3", ("stable_baselines3", "gymnasium", "torch"), _sb3, "default",
         ("control", "prioritized", "prioritized-skewed")),
    Peer("sb3[optimize_memory]", "sb3", ("stable_baselines3", "gymnasium", "torch"), _sb3,
         "optimize_memory", ("frames",)),
    Peer("sb3", "sb3", ("stable_baselines3", "gymnasium", "torch"), _sb3, "default",
         ("frames",), True),
    Peer("torchrl", "torchrl", ("torchrl", "tensordict", "torch"), _torchrl, "td",
         BUFFER_WORKLOADS),
    Peer("torchrl[pytree]", "torchrl", ("torchrl", "torch"), _torchrl, "pytree",
         ("control", "prioritized", "prioritized-skewed")),
    Peer("tianshou", "tianshou", ("tianshou", "torch"), _tianshou, "default",
         ("control", "prioritized", "prioritized-skewed")),
    Peer("tianshou[ignore_obs_next]", "tianshou", ("tianshou", "torch"), _tianshou,
         "ignore_obs_next", ("frames",)),
    Peer("tianshou[atari]", "tianshou", ("tianshou", "torch"), _tianshou, "atari",
         ("frames",)),
    Peer("tianshou", "tianshou", ("tianshou", "torch"), _tianshou, "default", ("frames",),
         True),
    Peer("pearl", "pearl", ("replaybuffer",), _pearl, "seed", ("pearl",)),
    Peer("tf-agents", "tf-agents", ("replaybuffer",), _tf_agents, "seed", ("tf-agents",)),
)


def _reason(err: BaseException) -> str:
    text = " ".join(str(err).split())
    if len(text) > 160:
        text = text[:157] + "..."
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _version(peer: Peer) -> str | None:
    with contextlib.suppress(Exception):
        from importlib.metadata import version
        return version(peer.distribution())
    return None


def _run_one(peer: Peer, workload: str, sizes: Sizes) -> Iterator[dict[str, Any]]:
    """Rows for every op ``peer`` owes ``workload``, whatever happens."""
    base: dict[str, Any] = {
        "workload": workload, "peer": peer.label, "seconds_per_call": None,
        "items_per_call": None, "status": "ok", "bytes_per_transition": None,
        "obs_bytes_per_transition": None, "others_cores": None, "detail": ""}
    expected = list(peer.ops(workload))
    status = None
    try:
        for module in peer.modules:
            importlib.import_module(module)
    except ModuleNotFoundError as err:
        status = f"not installed ({err.name or module})"
    except Exception as err:  # an installed peer that cannot even be imported
        status = f"failed: import {module}: {_reason(err)}"
    if status is None:
        version = _version(peer)
        if version:
            base["detail"] = f"{peer.distribution()} {version}"
        done: set[str] = set()
        gen = peer.run(workload, sizes, peer.layout)
        try:
            for row in gen:
                out = dict(base)
                detail = row.pop("detail", "")
                out.update(row)
                if detail:
                    out["detail"] = f"{base['detail']}; {detail}" if base["detail"] else detail
                done.add(out["op"])
                yield out
        except Unsupported as err:
            status = f"unsupported: {err}"
        except NotInstalled as err:
            status = f"not installed ({err})"
        except (Exception, MemoryError) as err:
            status = f"failed: {_reason(err)}"
        finally:
            gen.close()
            del gen
            _release()
        expected = [op for op in expected if op not in done]
    for op in expected:
        if status is None:
            status = "failed: adapter yielded no row for this op"
        yield dict(base, op=op, status=status)


def run_peers(workloads: list[str] | tuple[str, ...] = WORKLOADS, quick: bool = False, *,
              peers: list[str] | None = None, torch_threads: int | None = 1,
              retries: int = 0, contended: float = 0.25, quiet_wait: float = 120.0,
              progress: Callable[[dict[str, Any]], None] | None = None
              ) -> list[dict[str, Any]]:
    """Run ``workloads`` through every peer (or the families named in ``peers``).

    Returns rows ``{workload, op, peer, seconds_per_call, items_per_call, status,
    bytes_per_transition, obs_bytes_per_transition, others_cores, detail}`` (the memory
    row of a frames layout has ``op="bytes/transition"`` and no seconds); ``status`` is
    ``ok``, ``not installed (...)``, ``unsupported: ...`` or ``failed: ...``. One peer's
    buffer exists at a time. ``torch_threads``: intra-op threads for the torch-based peers
    (None leaves torch's default). ``retries``: run a peer's workload again, after
    waiting up to ``quiet_wait`` s for the machine to quieten, while other processes
    kept more than ``contended`` cores busy during its timings; the least contended
    attempt is kept (its ``detail`` says so).
    """
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown workloads {unknown}; choose from {list(WORKLOADS)}")
    families = {p.family for p in PEERS}
    if peers is not None and set(peers) - families:
        raise ValueError(f"unknown peers {sorted(set(peers) - families)}; "
                         f"choose from {sorted(families)}")
    _TORCH_THREADS[0] = torch_threads
    sizes = QUICK if quick else FULL
    rows = []
    for workload in workloads:
        for peer in PEERS:
            if workload not in peer.workloads or (peers is not None
                                                   and peer.family not in peers):
                continue
            best: list[dict[str, Any]] = []
            best_others = float("inf")
            for attempt in range(retries + 1):
                if attempt:
                    _wait_quiet(contended, quiet_wait)
                got = list(_run_one(peer, workload, sizes))
                others = max((r["others_cores"] or 0.0) for r in got)
                if others < best_others:
                    best, best_others = got, others
                if others <= contended:
                    break
            if attempt:
                for row in best:
                    row["detail"] += ("; " if row["detail"] else "") + \
                        f"least contended of {attempt + 1} runs"
            for row in best:
                rows.append(row)
                if progress is not None:
                    progress(row)
    return rows


def _wait_quiet(threshold: float, max_wait: float, probe: float = 2.0) -> None:
    """Wait (up to ``max_wait`` s) until other processes use at most ``threshold`` cores."""
    deadline = time.monotonic() + max_wait
    while time.monotonic() < deadline:
        cpu, machine = time.process_time(), _machine_cpu()
        time.sleep(probe)
        end = _machine_cpu()
        if machine is None or end is None:
            return
        if (end - machine - (time.process_time() - cpu)) / probe <= threshold:
            return


# --------------------------------------------------------------------------- report
def _cells(r: dict[str, Any], ours: dict[tuple[str, str], float]) -> tuple[str, ...]:
    if r["op"] == "bytes/transition":
        rss = r["bytes_per_transition"]
        obs = r["obs_bytes_per_transition"]
        value = "" if rss is None else f"{rss:,.0f} B"
        if obs is not None:
            value += f" (obs {obs:,.0f} B)"
        return (r["workload"], r["op"], r["peer"], value, "", "", "", r["status"])
    s = r["seconds_per_call"]
    if s is None:
        return (r["workload"], r["op"], r["peer"], "", "", "", "", r["status"])
    others = r.get("others_cores")
    base = ours.get((r["workload"], r["op"]))
    return (r["workload"], r["op"], r["peer"], f"{s * 1e6:,.1f}",
            f"{r['items_per_call'] / s:,.0f}", "" if base is None else f"{s / base:.2f}",
            "" if others is None else f"{others:.2f}", r["status"])


def _ours_seconds(rows: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
    """This project's time per (workload, op): what the ``x ours`` column divides by."""
    return {(r["workload"], r["op"]): r["seconds_per_call"] for r in rows
            if r["peer"] == "replaybuffer" and r.get("seconds_per_call")}


HEADER = ("workload", "op", "peer", "us/call (or bytes)", "items/s", "x ours", "others",
          "status")


def format_rows(rows: list[dict[str, Any]]) -> str:
    """A plain-text table of ``run_peers`` rows."""
    ours = _ours_seconds(rows)
    table = [HEADER] + [_cells(r, ours) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADER))]
    lines = ["  ".join(c.rjust(w) if i in (3, 4, 5, 6) else c.ljust(w)
                       for i, (c, w) in enumerate(zip(row, widths))).rstrip()
             for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_markdown(rows: list[dict[str, Any]]) -> str:
    """A markdown table of ``run_peers`` rows."""
    ours = _ours_seconds(rows)
    lines = ["| " + " | ".join(HEADER) + " |",
             "|" + "|".join(["---"] * 3 + ["---:"] * 4 + ["---"]) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in _cells(r, ours))
                     + " |")
    return "\n".join(lines)


def _load() -> str:
    with contextlib.suppress(OSError):
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    return "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replaybuffer_bench.peers",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small capacities (smoke run)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--peers", default=None,
                        help=f"comma-separated families ({', '.join(sorted({p.family for p in PEERS}))})")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--retries", type=int, default=0,
                        help="re-run a peer's workload up to N times while other processes "
                             "kept more than --contended cores busy during its timings")
    parser.add_argument("--contended", type=float, default=0.25,
                        help="cores used by other processes that count as contention")
    parser.add_argument("--json", help="write the rows to this file")
    parser.add_argument("--markdown", help="write a markdown table to this file")
    args = parser.parse_args(argv)
    workloads = [w for w in args.workloads.split(",") if w]
    peers = None if args.peers is None else [p for p in args.peers.split(",") if p]
    started = time.time()
    print(f"# replaybuffer peer bench ({platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cpus, python {platform.python_version()}, "
          f"{'quick' if args.quick else 'full'}, torch threads "
          f"{args.torch_threads or 'default'}, load {_load()})", flush=True)

    def progress(r: dict[str, Any]) -> None:
        print("  " + "  ".join(_cells(r, {})), flush=True)

    rows = run_peers(workloads, args.quick, peers=peers,
                     torch_threads=args.torch_threads or None, retries=args.retries,
                     contended=args.contended, progress=progress)
    print(f"# {time.time() - started:.0f} s, load {_load()}\n")
    print(format_rows(rows))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(format_markdown(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
