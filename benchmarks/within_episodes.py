"""Within-episode sampling in a training loop, at one capacity, in one process.

    PYTHONPATH=<tree>/src python benchmarks/within_episodes.py CAPACITY [ROUNDS] [KIND]

KIND is ``prioritized`` (default) or ``uniform``. One full row of control-size steps
(``replaybuffer_bench.scale``: episodes of 20 to 400 steps, log-normal priorities),
then ROUNDS (default 7) rounds of two loops: ``get_next(256, num_steps=3,
within_episodes=True)`` alone, and one ``add_batch`` of a step, that sample and
``update_priorities`` of the batch (a training step). Prints the median and the
fastest round's microseconds per call.

It uses only the public API and what ``replaybuffer_bench.scale`` has had since the
``episodes`` row, so it runs against an older checkout too: to compare two trees,
run it alternately with each one's ``src`` on ``PYTHONPATH``.
"""

import statistics
import sys
import time

import numpy as np

from replaybuffer import nest
from replaybuffer_bench import scale
from replaybuffer.buffers import PrioritizedReplayBuffer, UniformReplayBuffer


def main() -> None:
    capacity = int(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    kind = sys.argv[3] if len(sys.argv) > 3 else "prioritized"
    prioritized = kind == "prioritized"
    rng = np.random.default_rng(0)
    spec = scale.control_spec()
    cls = PrioritizedReplayBuffer if prioritized else UniformReplayBuffer
    buffer = cls(spec, 1, capacity, seed=0, track_episodes=True)
    chunk = min(scale.CHUNK, capacity)
    data = scale.random_items(spec, (1, chunk), rng)
    for start in range(0, capacity, chunk):
        n = min(chunk, capacity - start)
        part = nest.map_structure(lambda a, n=n: a[:, :n], data)
        part["step_type"] = scale.episode_step_types(n, rng)[None]
        buffer.extend(part)
    if prioritized:  # one row: an item's id is its step id
        for start in range(0, capacity, scale.CHUNK):
            ids = np.arange(start, min(start + scale.CHUNK, capacity))
            buffer.update_priorities(ids, rng.lognormal(0.0, 1.0, len(ids)))
    item = {k: v[:, 0] for k, v in scale.random_items(spec, (1, 1), rng).items()}
    types = scale.episode_step_types(1 << 20, rng)
    added = [0]

    def sample() -> None:
        buffer.get_next(256, 3, within_episodes=True)

    def train() -> None:
        item["step_type"] = types[added[0]:added[0] + 1]
        added[0] += 1
        buffer.add_batch(item)
        _, info = buffer.get_next(256, 3, within_episodes=True)
        if prioritized:
            buffer.update_priorities(info.ids, rng.lognormal(0.0, 1.0, 256))

    calls = 200 if capacity < 5_000_000 else 100
    times: dict[str, list[float]] = {"sample": [], "add+sample+update": []}
    for fn in (sample, train):  # warm
        for _ in range(20):
            fn()
    for _ in range(rounds):
        for name, fn in zip(times, (sample, train)):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - start) / calls * 1e6)
    print(kind, capacity, "  ".join(f"{name}: median {statistics.median(t):.1f} us, "
                                    f"min {min(t):.1f} us" for name, t in times.items()))


if __name__ == "__main__":
    main()
