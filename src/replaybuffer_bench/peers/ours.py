"""This project's rows in the peer table: its buffers on every workload, and the plain
numpy limits (one array per leaf, and interleaved records) they are measured against."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from replaybuffer_bench.peers.measuring import MemoryGrowth, cycling, release_memory, timed_rows
from replaybuffer_bench.peers.workloads_spec import (ALPHA, BETA, FILL_CHUNK, FRAME_SHAPE, Rows,
                                                     Sizes, Unsupported, control_transition_spec,
                                                     fill_chunks, frames_transition_spec,
                                                     is_prioritized, priority_pool,
                                                     prioritized_transition_spec, random_priorities)
from replaybuffer_bench.workloads import fill, host_arrays, random_items

def frame_stream(length: int = FILL_CHUNK, seed: int = 4) -> np.ndarray:
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


def ours_rows(workload: str, sizes: Sizes, layout: str = "plain") -> Rows:
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
    if is_prioritized(workload):
        cls = getattr(replaybuffer, "PrioritizedReplayBuffer", None)
        if cls is None:
            raise Unsupported("this replaybuffer version has no PrioritizedReplayBuffer")
        capacity = sizes.prioritized
        spec = {k: v for k, v in prioritized_transition_spec().items() if k != "next_obs"}
        buf = cls(spec, batch_size=1, max_length=capacity, alpha=ALPHA, beta=BETA, seed=0)
        fill(buf, rng)
        for start in range(0, capacity, 100_000):  # item ids are add ids (one row)
            ids = np.arange(start, min(capacity, start + 100_000))
            applied = buf.update_priorities(ids, random_priorities(workload, rng, len(ids)))
            if applied != len(ids):
                raise RuntimeError(f"update_priorities applied {applied} of {len(ids)}")
        prios = priority_pool(workload)
        next_prio = cycling(prios)
        sampled_ids = [buf.get_next(256, 2)[1].ids for _ in range(len(prios))]
        pairs = cycling(list(zip(sampled_ids, prios)))

        def sample_update() -> None:
            _, info = buf.get_next(256, 2)  # info.weights: importance weights
            buf.update_priorities(info.ids, next_prio())

        yield from timed_rows({"sample(256)+weights": (lambda: buf.get_next(256, 2), 256),
                           "update(256)": (lambda: buf.update_priorities(*pairs()), 256),
                           "sample+update(256)": (sample_update, 256)}, sizes)
        return

    if layout == "transitions":
        yield from _ours_transitions(sizes)
        return
    full = control_transition_spec() if workload == "control" else frames_transition_spec()
    spec = {k: v for k, v in full.items() if k != "next_obs"}  # steps, not transitions
    capacity = sizes.control if workload == "control" else sizes.frames
    step = random_items(spec, (1,), rng)
    if workload == "control":
        buf = UniformReplayBuffer(spec, batch_size=1, max_length=capacity, seed=0)
        fill(buf, rng)
        yield from timed_rows({"add(1)": (lambda: buf.add_batch(step), 1),
                           "sample(256)+next": (lambda: buf.get_next(256, 2), 256)}, sizes)
        buf = None  # freed before the next buffer is built
        release_memory()
        wide = UniformReplayBuffer(spec, batch_size=256, max_length=capacity // 256, seed=0)
        fill(wide, rng)
        batch = random_items(spec, (256,), rng)
        yield from timed_rows({"add(256)": (lambda: wide.add_batch(batch), 256)}, sizes)
        return

    if layout == "plain":
        mem = MemoryGrowth(capacity)
        buf = UniformReplayBuffer(spec, batch_size=1, max_length=capacity, seed=0)
        fill(buf, rng)
        obs = max(a.nbytes for a in host_arrays(buf))
        yield mem.row(obs, "one obs array; next obs is the next slot")
        add1: Callable[[], object] = lambda: buf.add_batch(step)  # noqa: E731
    else:
        stream = frame_stream()
        chunk = random_items(spec, (1, len(stream)), rng)
        chunk["obs"] = stream[None]
        steps = [{k: v[:, t] for k, v in chunk.items()} for t in range(len(stream))]
        mem = MemoryGrowth(capacity)
        buf = UniformReplayBuffer(spec, batch_size=1, max_length=capacity, seed=0,
                                  frame_stack="obs", stack_axis=0)
        for n in fill_chunks(capacity, len(stream)):
            buf.extend(chunk if n == len(stream) else {k: v[:, :n] for k, v in chunk.items()})
        yield mem.row(None, "one frame per step plus 4 int64 references")
        next_step = cycling(steps[capacity % len(steps):] + steps[:capacity % len(steps)])
        add1 = lambda: buf.add_batch(next_step())  # noqa: E731
    yield from timed_rows({"add(1)": (add1, 1),
                       "sample(32)+next": (lambda: buf.get_next(32, 2), 32),
                       "sample(256)+next": (lambda: buf.get_next(256, 2), 256)}, sizes)


def _ours_transitions(sizes: Sizes) -> Rows:
    """The control workload through ``TransitionReplayBuffer``, the SB3-style API:
    ``add(obs, action, reward, next_obs, terminated)`` of one env (of 256 envs for
    ``add(256)``), fed a consistent stream (each observation is the previous next
    observation, as from an env), and ``sample(256)`` returning ``Transitions``."""
    from replaybuffer import TransitionReplayBuffer

    spec = control_transition_spec()
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
    yield from timed_rows({"add(1)": (add1, 1),
                       "sample(256)+next": (lambda: buf.sample(256), 256)}, sizes)
    buf = None
    release_memory()
    wide, add256 = build(256)
    yield from timed_rows({"add(256)": (add256, 256)}, sizes)




def numpy_limit_rows(workload: str, sizes: Sizes, layout: str = "plain"
                 ) -> Rows:
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

    spec = {k: v for k, v in (control_transition_spec() if workload == "control"
                              else frames_transition_spec()).items() if k != "next_obs"}
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
    yield from timed_rows(ops, sizes)
    if workload == "frames":
        step_bytes = sum(a.nbytes for a in gathered) / capacity
        yield {"op": "bytes/transition", "items_per_call": None,
               "bytes_per_transition": step_bytes, "obs_bytes_per_transition": None,
               "detail": "computed: the arrays' bytes per step"}


