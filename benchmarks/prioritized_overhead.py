"""The Python and small-call overhead of a prioritized sample+update, in CPU time.

A :class:`~replaybuffer.PrioritizedReplayBuffer` of 2,000 steps (one row; an
observation of 4 float32, an int64 action and a float32 reward) is sampled
(``get_next(256)``) and updated (``update_priorities(ids, p)``) in rounds. At this size
everything is in cache, so nearly all of a call is calls and Python. Two priority
profiles, interleaved round by round:

- ``even``: priorities uniform in [0.5, 1.5] (draws by rejection);
- ``skewed``: log-normal priorities (sigma 2), which draw by descent.

For each profile it prints the CPU time (``time.thread_time``: the machine may be
shared with other jobs, so the best and the median of many rounds) of a sample+update
(a ``get_next`` and the update of its ids, as a learner's loop makes them), of a sample
and an update each in a loop of its own, and of the compiled kernels alone on the same
inputs, and the overhead: sample+update less kernels (less the storage gather too, which is data work, on its own line). The
kernels of a path: its draw (the descent; the compiled rejection where this tree has
one, else the numpy rejection counts as overhead; both timed on random numbers given
to them, so drawing those, by ``rng.random`` or inside the call, counts as overhead), the wide root's running sums (a
descent after an update reads them) and the update's tree write (without the total:
that stays in the overhead, as the ``np.add.reduce`` it replaces). Then the Python
function calls (``sys.setprofile``: Python frames, and C calls such as numpy's) per
sample and per update. Run it with each tree's ``src`` on ``PYTHONPATH`` in turn to
compare them.

Run: ``python benchmarks/prioritized_overhead.py [ROUNDS] [CALLS_PER_ROUND] [STEPS]``
(``STEPS`` other than 2,000: e.g. 1,000,000, where cache misses join the calls; the
kernels, timed on a few inputs over and over, then run warmer than in the loop).
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any, Callable

import numpy as np

from replaybuffer import PrioritizedReplayBuffer
from replaybuffer.sampling import fused_descent, fused_update, tree_kernels
from replaybuffer.sampling.priority_scale import scaled_bound
from replaybuffer.sampling.rejection import pool_size

fused_rejection: Any
try:  # (added with the rejection kernel: absent from older trees)
    from replaybuffer.sampling import fused_rejection
except ImportError:
    fused_rejection = None

STEPS = 2_000
BATCH = 256


def build(profile: str, seed: int = 0) -> tuple[PrioritizedReplayBuffer, list[np.ndarray]]:
    """A full buffer with the profile's priorities, and a cycle of update values."""
    spec = {"obs": np.zeros(4, np.float32), "action": np.int64(0), "reward": np.float32(0)}
    buf = PrioritizedReplayBuffer(spec, batch_size=1, max_length=STEPS, seed=seed)
    rng = np.random.default_rng(seed)
    buf.extend({"obs": rng.random((1, STEPS, 4), dtype=np.float32),
                "action": rng.integers(0, 4, (1, STEPS)),
                "reward": rng.random((1, STEPS), dtype=np.float32)})
    draw = ((lambda n: rng.uniform(0.5, 1.5, n)) if profile == "even"
            else (lambda n: rng.lognormal(0.0, 2.0, n)))
    buf.update_priorities(np.arange(STEPS), draw(STEPS))
    return buf, [draw(BATCH) for _ in range(64)]


def per_call(fn: Callable[[int], Any], calls: int) -> float:
    """CPU microseconds per call of ``fn(i)`` over ``calls`` calls."""
    start = time.thread_time()
    for i in range(calls):
        fn(i)
    return (time.thread_time() - start) / calls * 1e6


def kernel_timers(buf: PrioritizedReplayBuffer, values: list[np.ndarray], calls: int
                  ) -> dict[str, Callable[[int], Any]]:
    """The compiled kernels of a sample and an update called directly, on inputs as the
    buffer's own calls make them (the sampler's tree, a copy of its nodes for writes;
    fresh targets each call, copied in before the timed loop)."""
    sampler = buf._sampler  # a benchmark inspects internals on purpose
    tree = sampler._sum
    ring = buf._ring
    nodes, runs, root_width, height, limit = tree.search_arrays()
    mass = tree.total()
    rng = np.random.default_rng(1)
    # Targets scaled by the mass beforehand (the kernel then scales by 1.0, a no-op):
    # the same targets as the sampler's, and a few rows that stay in cache as a fresh
    # draw would.
    targets = rng.random((8, BATCH)) * mass
    indices = np.empty((2, BATCH), np.int64)
    weighed = np.empty((2, BATCH), np.float32)
    hi = ring.last_id + 1

    # (Newer kernels draw their random numbers themselves unless given no bit
    # generator, (0, 0): timed on given ones, as the older kernels.)
    no_source = (0, 0) if "state" in fused_descent._fused.py_func.__code__.co_varnames \
        else ()

    def draw(i: int) -> None:
        fused_descent._fused(nodes, runs, root_width, height, limit, *no_source,
                             targets[i % 8], 1.0, 0, 0.0, 0.0, 0.0, ring.batch_size,
                             ring.max_length, ring.oldest_id, hi, mass, np.nan, indices,
                             weighed)

    timers = {"kernel: descent": draw}
    if fused_rejection is not None:
        bound = scaled_bound(sampler.max_priority, sampler.alpha, 0.0)
        accept = min(1.0, mass / (STEPS * bound))
        n = pool_size(BATCH, accept)
        pools = rng.random((8, 2 * n))
        # (newer kernel: takes the acceptance and sizes the pool, or, given a pool, its
        # length; older: the pool's size n)
        pool_arg = accept if "accept" in fused_rejection._kept.py_func.__code__.co_varnames \
            else n
        scale = STEPS * (1.0 - 2.0 ** -53)

        def reject(i: int) -> None:
            fused_rejection._kept(tree.leaves, *no_source, pools[i % 8], pool_arg, BATCH, scale,
                                  bound, 0, 0, STEPS, 1, STEPS, 0, mass, np.nan, indices,
                                  weighed)

        timers["kernel: rejection"] = reject
    ids = np.random.default_rng(2).integers(0, STEPS, BATCH)
    scaled = [np.power(v, sampler.alpha) for v in values]
    positions = np.empty(BATCH, np.int64)
    copy = tree.nodes.copy()  # (writable; the buffer's own tree is left alone)
    args = (sampler.key_base, ring.batch_size, ring.oldest_id, ring.last_id,
            ring.max_length, copy, len(copy) // 2, tree.root_width)
    if "total_start" in fused_update.write_live.py_func.__code__.co_varnames:
        # (newer kernel: asked for neither the running sums nor the total here, so it
        # does the older one's work; those two are timed apart, or left in the overhead)
        args += (0, np.empty(0))
    roots, upto = copy[tree.root_width:2 * tree.root_width], np.empty(tree.root_width)
    timers["kernel: running sums"] = lambda i: tree_kernels.running_sums(roots, upto)

    def update(i: int) -> None:
        fused_update.write_live(ids, scaled[i % 64], *args, positions)

    timers["kernel: tree write"] = update
    gather_positions = np.random.default_rng(3).integers(0, STEPS, BATCH)
    timers["storage gather"] = lambda i: buf._storage.gather(gather_positions)
    return timers


def count_calls(fn: Callable[[], Any]) -> tuple[int, int]:
    """(Python calls, C calls) made by one ``fn()``."""
    counts = {"call": 0, "c_call": 0}

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event in counts:
            counts[event] += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return counts["call"] - 1, counts["c_call"]  # (less fn itself)


def main() -> None:
    global STEPS
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    STEPS = int(sys.argv[3]) if len(sys.argv) > 3 else STEPS
    print(f"numba compiled kernels: {tree_kernels.AVAILABLE}; {STEPS} steps, "
          f"get_next({BATCH}) + update_priorities; {rounds} rounds of {calls} calls, "
          "CPU us per call (time.thread_time)", flush=True)
    setups = {p: build(p) for p in ("even", "skewed")}
    timers: dict[str, dict[str, Callable[[int], Any]]] = {}
    last: dict[str, Any] = {}
    for profile, (buf, values) in setups.items():
        info_ids: list[np.ndarray] = [buf.get_next(BATCH)[1].ids]

        def sample(i: int, buf: Any = buf, box: list[np.ndarray] = info_ids) -> None:
            box[0] = buf.get_next(BATCH)[1].ids

        def update(i: int, buf: Any = buf, box: list[np.ndarray] = info_ids,
                   values: list[np.ndarray] = values) -> None:
            buf.update_priorities(box[0], values[i % 64])

        def both(i: int, buf: Any = buf, values: list[np.ndarray] = values) -> None:
            buf.update_priorities(buf.get_next(BATCH)[1].ids, values[i % 64])

        # sample+update: the learner's loop, timed as one; sample and update: each in a
        # loop of its own (an update after an update, a sample after a sample).
        timers[profile] = {"sample+update": both, "sample": sample, "update": update}
        if tree_kernels.AVAILABLE:
            timers[profile].update(kernel_timers(buf, values, calls))
        last[profile] = (sample, update)
        for fn in timers[profile].values():  # warm up (compilation, caches)
            for i in range(20):
                fn(i)
    results: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):  # interleaved: a burst of load hits every figure alike
        for profile, named in timers.items():
            for name, fn in named.items():
                results.setdefault((profile, name), []).append(per_call(fn, calls))
    for profile, named in timers.items():
        print(f"\n[{profile}]            best   median")
        best = {name: min(results[profile, name]) for name in named}
        med = {name: statistics.median(results[profile, name]) for name in named}
        for name in named:
            print(f"  {name:24s} {best[name]:6.1f} {med[name]:8.1f}")
        total = results[profile, "sample+update"]
        if tree_kernels.AVAILABLE:
            kernels = ["kernel: rejection", "kernel: tree write"]
            if profile == "skewed":
                kernels = ["kernel: descent", "kernel: running sums", "kernel: tree write"]
            kernels = [k for k in kernels if k in named]
            kb = sum(best[k] for k in kernels)
            km = sum(med[k] for k in kernels)
            print(f"  {'kernels (this path)':24s} {kb:6.1f} {km:8.1f}   ({', '.join(kernels)})")
            print(f"  {'overhead: s+u - kernels':24s} {min(total) - kb:6.1f} "
                  f"{statistics.median(total) - km:8.1f}")
            gb, gm = best["storage gather"], med["storage gather"]
            print(f"  {'... less the gather':24s} {min(total) - kb - gb:6.1f} "
                  f"{statistics.median(total) - km - gm:8.1f}")
        sample, update = last[profile]
        s_py, s_c = count_calls(lambda fn=sample: fn(0))
        u_py, u_c = count_calls(lambda fn=update: fn(0))
        print(f"  calls per sample: {s_py} Python, {s_c} C; per update: {u_py} Python, "
              f"{u_c} C")


if __name__ == "__main__":
    main()
