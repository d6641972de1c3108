"""Thread CPU of ``PrioritizedReplayBuffer.update_priorities(256)`` under variants of
``sampling/priority_writes.py``, interleaved (the defects round's items 3 and 4).

Variants are made from commit 324fdec's priority_writes.py by text substitution
(``base``: the sampler's last-size memo in front of ``exponent_row``'s lru_cache;
``lru_only``: the lru_cache call at every update; ``+dtype``: the int64 id test) and
from this tree's (``new``, ``new-dtype``); one buffer runs them all, its sampler's class
set to the variant's for each block of 500 calls, in a shuffled order each round.
Run from the repository root, with git: ``PYTHONPATH=src python
benchmarks/exponent_row_variants.py base new new-dtype --rounds 400 --size 2000``.
Note: ``lru_only`` measures an lru_cache only where exponent_row has one (324fdec).
"""
import random, subprocess, sys, time, types
import numpy as np
from replaybuffer import PrioritizedReplayBuffer
from replaybuffer.sampling.prioritized import PrioritizedSampler

BASE = subprocess.run(["git", "show", "324fdec:src/replaybuffer/sampling/priority_writes.py"],
                      capture_output=True, text=True, check=True).stdout
OLD_CACHE = """            kept = self._alpha_row
            if kept[0] != alpha or kept[1] != count:  # (alpha is a plain attribute)
                kept = self._alpha_row = (alpha, count, exponent_row(alpha, np.float64,
                                                                      count))
"""
assert OLD_CACHE in BASE
LRU = "            kept = (None, None, exponent_row(alpha, np.float64, count))\n"
DTYPE_OLD = "        if self._pending:\n            self._flush()\n        B = ring.batch_size\n"
assert DTYPE_OLD in BASE
DTYPE_NEW = ("        if item_ids.dtype is not _INT64:\n            item_ids = item_ids.astype(np.int64)\n"
             + DTYPE_OLD)
NEW = open("src/replaybuffer/sampling/priority_writes.py").read()
VARIANTS = {
    "new": NEW,
    "new-dtype": NEW.replace("""        if item_ids.dtype is not _INT64:  # (one identity test on the usual call)
            item_ids = int64_item_ids(item_ids)
""", ""),
    "base": BASE,
    "lru_only": BASE.replace(OLD_CACHE, LRU),
    "base+dtype": BASE.replace(DTYPE_OLD, DTYPE_NEW) + "\n_INT64 = np.dtype(np.int64)\n",
    "lru+dtype": BASE.replace(OLD_CACHE, LRU).replace(DTYPE_OLD, DTYPE_NEW)
                 + "\n_INT64 = np.dtype(np.int64)\n",
}
names = [n for n in VARIANTS if n in sys.argv[1:]] or list(VARIANTS)
SIZE = int(sys.argv[sys.argv.index("--size") + 1]) if "--size" in sys.argv else 2000
SPEC = {"obs": np.zeros(4, np.float32)}
classes = {}
for name in names:
    mod = types.ModuleType("pw_" + name.replace("+", "_").replace("-", "_"))
    exec(compile(VARIANTS[name], mod.__name__, "exec"), mod.__dict__)
    classes[name] = type("S_" + mod.__name__, (PrioritizedSampler,),
                         {"update_priorities": mod.PriorityWrites.update_priorities})
# One buffer for all: each block sets its sampler's class to the variant's, so every
# variant writes the same memory.
buf = PrioritizedReplayBuffer(SPEC, 1, SIZE, alpha=0.6, seed=0)
buf.extend({"obs": np.random.default_rng(0).random((1, SIZE, 4), dtype=np.float32)})
ids = buf.get_next(256)[1].ids
pr = np.random.default_rng(1).lognormal(0.0, 1.0, 256)
CALLS, ROUNDS = 500, int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 60
for cls in classes.values():  # warm: compile, rows, scratch
    buf._sampler.__class__ = cls
    for _ in range(200):
        buf.update_priorities(ids, pr)
per = {n: [] for n in names}
rng = random.Random(0)
up = buf.update_priorities
for _ in range(ROUNDS):
    order = names[:]; rng.shuffle(order)
    for n in order:
        buf._sampler.__class__ = classes[n]
        t0 = time.thread_time_ns()
        for _ in range(CALLS):
            up(ids, pr)
        per[n].append((time.thread_time_ns() - t0) / CALLS)
base = np.array(per[names[0]])
for n in names:
    a = np.array(per[n])
    d = a - base
    q = np.percentile(d, [25, 50, 75])
    print(f"{n:12s} median {np.median(a):7.0f} ns/call  vs {names[0]}: median diff "
          f"{q[1]:+6.0f} ns (IQR {q[0]:+.0f}..{q[2]:+.0f}), diff<0 in {np.mean(d < 0):.0%} of rounds")
