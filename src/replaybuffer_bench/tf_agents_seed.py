"""TF-Agents 0.19's own replay buffers against ``replaybuffer.compat.tf_agents``, on the
tutorial's workload, in one process on the same TensorFlow.

    TF_USE_LEGACY_KERAS=1 .venv-tfagents/bin/python -m replaybuffer_bench.tf_agents_seed \\
        [--calls 500] [--warmup 50] [--max-length 10000] [--json FILE] [--markdown FILE]

TF-Agents 0.19 needs TensorFlow 2.15, tf-keras and numpy<2, so it lives in its own
virtualenv (``benchmarks/setup_tf_agents.sh`` builds ``.venv-tfagents`` with this
project installed beside it). ``replaybuffer bench --peers`` runs this module there as
the ``tf-agents`` workload (:func:`peer_rows`) and reports ``not installed`` rows when
the venv is missing.

The workload is the replay-buffer tutorial's, at a control task's size: a data spec of
observation float32[17], action float32[6] and reward float32; ``TFUniformReplayBuffer``
with ``batch_size=32``, ``max_length=10000``, filled completely before timing (adds
keep going between reads); ``PyUniformReplayBuffer`` with the same capacity
(``32 * max_length``), filled with ``add_batch`` of one item as TF-Agents requires.
Reads are ``sample_batch_size=256, num_steps=2`` (a transition and its next step).

Ops of the TF buffer: ``add_batch`` of 32 rows and ``get_next`` eagerly and inside a
``tf.function`` (the user's, around the call); ``as_dataset`` per batch (``next`` on
an iterator made once), plain and as TF-Agents' DQN tutorial writes it
(``num_parallel_calls=3`` then ``.prefetch(3)``); ``gather_all``; and the single
deterministic pass per batch (``sample_batch_size=32`` rows, windows of 2 steps).
Ops of the Python buffer: ``add_batch`` of one item, ``get_next``, ``as_dataset`` per
batch.

Each op is timed per call (``perf_counter``) in rounds: a round runs a block of calls
of one library, then a block of the other's (which goes first alternates), so drift
hits both alike and a pipelined dataset is timed at its steady state (its first calls
of each block, which may find elements prepared while the other library ran, are not
counted). Reported, after ``warmup`` calls of each: for a direct call, the median
microseconds per call over ``calls`` calls; for a dataset (``per batch``), the time per
batch: the mean over a block of consecutive pulls, the median over the blocks. A
pipelined dataset's pulls are bimodal (an element made ahead comes at once, the next
waits for the producer), so its median pull understates its time per batch (TF-Agents'
plain ``as_dataset``: median pull 160 us, mean 400 us on the machine of the README).
Both figures are in the JSON. The ratio is ours / TF-Agents' (below 1: ours is faster).

What differs in what the two return (the ratio compares unequal work where it says):

* ours returns ``(items, BufferInfo)`` from the Python buffer's ``get_next``, TF-Agents
  bare items; ours returns numpy arrays from the Python buffer's ``as_dataset`` (it is a
  Python iterable), TF-Agents ``tf.Tensor`` s through ``tf.data``.
* Both plain ``as_dataset`` s run ahead: ``tf.data`` injects an autotuned prefetch after
  TF-Agents' map, and ours draws the next element on a prefetch thread of its own, so
  elements are sampled before they are asked for and miss the adds made meanwhile.
  Ours checks a draw ahead at the pull (drawn again after a ``clear()``, a restore or
  while rows held no window), which TF-Agents does not (the timing is each as its users get it).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from replaybuffer_bench.seed_venv import (NotInstalled, comparison_table, run_report,
                                         venv_python)

__all__ = ["OPS", "NotInstalled", "run", "peer_rows", "tf_agents_python", "versions",
           "format_table", "main"]

OBS_SHAPE, ACTION_SHAPE = (17,), (6,)
BATCH_SIZE, MAX_LENGTH, SAMPLE, STEPS = 32, 10_000, 256, 2
TF, PY = "TFUniformReplayBuffer", "PyUniformReplayBuffer"

# (buffer class, op, items per call), timed in this order.
OPS: tuple[tuple[str, str, int | None], ...] = (
    (TF, "add_batch(32)", BATCH_SIZE),
    (TF, "add_batch(32) in tf.function", BATCH_SIZE),
    (TF, "get_next(256, num_steps=2)", SAMPLE),
    (TF, "get_next(256, num_steps=2) in tf.function", SAMPLE),
    (TF, "as_dataset(256, num_steps=2) per batch", SAMPLE),
    (TF, "as_dataset(256, num_steps=2, num_parallel_calls=3).prefetch(3) per batch", SAMPLE),
    (TF, "gather_all()", None),  # every stored step: 32 * max_length
    (TF, "single_deterministic_pass(32, num_steps=2) per batch", BATCH_SIZE * STEPS),
    (PY, "add_batch(1)", 1),
    (PY, "get_next(256, num_steps=2)", SAMPLE),
    (PY, "as_dataset(256, num_steps=2) per batch", SAMPLE),
)

Call = Callable[[], Any]


class Fresh:
    """A dataset op: each block of calls pulls from a fresh iterator of ``dataset()``,
    so that no iterator of the library not being timed works in the background (a
    prefetching one refills while the other library's block runs, and would start its
    next block with elements made in the other's time)."""

    def __init__(self, dataset: Callable[[], Any]):
        self.dataset = dataset

    def start(self) -> Call:
        it = iter(self.dataset())

        def pull() -> Any:
            nonlocal it
            try:
                return next(it)
            except StopIteration:  # a deterministic pass ended: start another
                it = iter(self.dataset())
                return next(it)
        return pull


Side = Call | Fresh


def _pipelined(op: str) -> bool:
    """Dataset ops: timed per batch over consecutive pulls."""
    return op.endswith("per batch")


def op_name(cls: str, op: str) -> str:
    return f"{'TF' if cls == TF else 'Py'} {op}"


# ----------------------------------------------------------------------- the buffers
def _tensor_spec() -> Any:
    import tensorflow as tf

    return (tf.TensorSpec(OBS_SHAPE, tf.float32, "observation"),
            tf.TensorSpec(ACTION_SHAPE, tf.float32, "action"),
            tf.TensorSpec((), tf.float32, "reward"))


def _batches(outer: int, count: int = 16, seed: int = 0) -> list[tuple[np.ndarray, ...]]:
    """``count`` different steps with leading dimension ``outer``, as numpy arrays."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((outer,) + OBS_SHAPE, dtype=np.float32),
             rng.standard_normal((outer,) + ACTION_SHAPE, dtype=np.float32),
             rng.standard_normal((outer,), dtype=np.float32)) for _ in range(count)]


def _cycle(values: list[Any]) -> Call:
    state = {"i": 0}

    def take() -> Any:
        i = state["i"]
        state["i"] = (i + 1) % len(values)
        return values[i]
    return take


def _tf_ops(theirs: Any, mine: Any, max_length: int) -> dict[str, tuple[Side, Side]]:
    """``{op: (theirs, ours)}`` for the TF buffers, both filled."""
    import tensorflow as tf

    steps = [tuple(tf.constant(a) for a in step) for step in _batches(BATCH_SIZE)]
    for t in range(max_length):
        theirs.add_batch(steps[t % len(steps)])
        mine.add_batch(steps[t % len(steps)])
    out: dict[str, tuple[Side, Side]] = {}

    def pair(op: str, make: Callable[[Any], Side]) -> None:
        out[op] = (make(theirs), make(mine))

    def add(buf: Any) -> Call:
        step = _cycle(steps)
        return lambda: buf.add_batch(step())

    def add_fn(buf: Any) -> Call:
        def add_batch(items: Any) -> None:  # TF-Agents returns an op: tf.function refuses it
            buf.add_batch(items)
        fn = tf.function(add_batch)
        step = _cycle(steps)
        return lambda: fn(step())

    def get_next(buf: Any) -> Call:
        return lambda: buf.get_next(sample_batch_size=SAMPLE, num_steps=STEPS)

    def get_next_fn(buf: Any) -> Call:
        fn: Call = tf.function(lambda: buf.get_next(sample_batch_size=SAMPLE, num_steps=STEPS))
        return fn

    def dataset(buf: Any) -> Fresh:
        return Fresh(lambda: buf.as_dataset(sample_batch_size=SAMPLE, num_steps=STEPS))

    def dataset_tutorial(buf: Any) -> Fresh:
        return Fresh(lambda: buf.as_dataset(sample_batch_size=SAMPLE, num_steps=STEPS,
                                            num_parallel_calls=3).prefetch(3))

    def deterministic(buf: Any) -> Fresh:
        return Fresh(lambda: buf.as_dataset(sample_batch_size=BATCH_SIZE, num_steps=STEPS,
                                            single_deterministic_pass=True))

    pair("add_batch(32)", add)
    pair("add_batch(32) in tf.function", add_fn)
    pair("get_next(256, num_steps=2)", get_next)
    pair("get_next(256, num_steps=2) in tf.function", get_next_fn)
    pair("as_dataset(256, num_steps=2) per batch", dataset)
    pair("as_dataset(256, num_steps=2, num_parallel_calls=3).prefetch(3) per batch",
         dataset_tutorial)
    pair("gather_all()", lambda buf: buf.gather_all)
    pair("single_deterministic_pass(32, num_steps=2) per batch", deterministic)
    return out


def _py_ops(theirs: Any, mine: Any, capacity: int) -> dict[str, tuple[Side, Side]]:
    """``{op: (theirs, ours)}`` for the Python buffers, both filled."""
    ones = _batches(1, 1024)
    for t in range(capacity):
        theirs.add_batch(ones[t % len(ones)])
    chunk = tuple(np.concatenate(leaf) for leaf in zip(*ones))
    for start in range(0, capacity, len(ones)):
        n = min(len(ones), capacity - start)
        mine.add_batch(tuple(leaf[:n] for leaf in chunk))
    out: dict[str, tuple[Side, Side]] = {}
    for_theirs, for_ours = _cycle(ones), _cycle(ones)
    out["add_batch(1)"] = (lambda: theirs.add_batch(for_theirs()),
                           lambda: mine.add_batch(for_ours()))
    out["get_next(256, num_steps=2)"] = (
        lambda: theirs.get_next(sample_batch_size=SAMPLE, num_steps=STEPS),
        lambda: mine.get_next(sample_batch_size=SAMPLE, num_steps=STEPS))
    out["as_dataset(256, num_steps=2) per batch"] = (
        Fresh(lambda: theirs.as_dataset(sample_batch_size=SAMPLE, num_steps=STEPS)),
        Fresh(lambda: mine.as_dataset(sample_batch_size=SAMPLE, num_steps=STEPS)))
    return out


# --------------------------------------------------------------------------- timing
def _time(pairs: dict[str, tuple[Side, Side]], calls: int, warmup: int, block: int,
          skip: int) -> dict[str, dict[str, Any]]:
    """Per op and library: the median seconds per call, the median over blocks of the
    block's mean per call, and the mean; or the error that stopped it."""
    out: dict[str, dict[str, Any]] = {}

    def start(side: Side) -> Call:
        return side.start() if isinstance(side, Fresh) else side

    def failure(err: Exception) -> str:
        return f"{type(err).__name__}: {' '.join(str(err).split())[:160]}"

    for op, sides in pairs.items():
        blocks: list[list[list[float]]] = [[], []]
        errors: list[str | None] = [None, None]
        for i, side in enumerate(sides):
            try:
                fn = start(side)
                for _ in range(warmup):
                    fn()
            except Exception as err:  # noqa: BLE001 - reported in the row
                errors[i] = failure(err)
            fn = None  # type: ignore[assignment]  # a fresh iterator stops here
        rounds = max(1, -(-calls // block))
        for r in range(rounds):
            n = min(block, calls - r * block)
            for i in ((0, 1) if r % 2 == 0 else (1, 0)):
                if errors[i] is not None:
                    continue
                got: list[float] = []
                gc.collect()
                try:
                    fn = start(sides[i])
                    for _ in range(skip):
                        fn()
                    for _ in range(n):
                        begin = time.perf_counter()
                        fn()
                        got.append(time.perf_counter() - begin)
                except Exception as err:  # noqa: BLE001 - reported in the row
                    errors[i] = failure(err)
                fn = None  # type: ignore[assignment]
                blocks[i].append(got)
        row: dict[str, Any] = {}
        for i, key in ((0, "theirs"), (1, "ours")):
            per_call = [x for b in blocks[i] for x in b]
            ok = errors[i] is None and bool(per_call)
            row[f"{key}_median_seconds"] = statistics.median(per_call) if ok else None
            row[f"{key}_block_seconds"] = statistics.median(
                [statistics.fmean(b) for b in blocks[i] if b]) if ok else None
            row[f"{key}_mean_seconds"] = statistics.fmean(per_call) if ok else None
            row[f"{key}_status"] = "ok" if ok else f"failed: {errors[i] or 'no calls'}"
        out[op] = row
    return out


def _machine_cpu() -> float | None:
    try:
        with open("/proc/stat") as fh:
            values = [int(v) for v in fh.readline().split()[1:9]]
        return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for dist in ("tf-agents", "tensorflow", "tensorflow-cpu", "tf-keras", "numpy"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            pass
    import replaybuffer

    out["replaybuffer"] = replaybuffer.__version__
    return out


def run(calls: int = 500, warmup: int = 50, max_length: int = MAX_LENGTH, block: int = 50,
        skip: int = 10, seed: int = 0, only: str | None = None) -> dict[str, Any]:
    """Fill both libraries' buffers and time every op of :data:`OPS`.

    Returns ``{"versions", "config", "rows"}``; each row has ``buffer``, ``op``, ``name``,
    ``items_per_call``, ``theirs_seconds`` / ``ours_seconds`` (medians per call),
    ``theirs_mean_seconds`` / ``ours_mean_seconds``, ``ratio`` (ours / theirs),
    ``others_cores`` (cores other processes kept busy while the buffer class was timed)
    and ``status`` (``ok`` or why a side has no figure). ``only``: time just the ops
    whose name contains it.
    """
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")  # TF-Agents' deprecation notes
    from tf_agents.replay_buffers import py_uniform_replay_buffer as tfa_py
    from tf_agents.replay_buffers import tf_uniform_replay_buffer as tfa_tf
    from tf_agents.specs import tensor_spec

    from replaybuffer.compat import tf_agents as ours

    np.random.seed(seed)  # TF-Agents' Python buffer samples from numpy's global state
    tf.random.set_seed(seed)
    rows: list[dict[str, Any]] = []
    spec = _tensor_spec()
    for cls in (TF, PY):
        wanted = [op for c, op, _ in OPS if c == cls and (only is None or only in op_name(c, op))]
        if not wanted:
            continue
        if cls == TF:
            theirs = tfa_tf.TFUniformReplayBuffer(spec, batch_size=BATCH_SIZE,
                                                  max_length=max_length)
            mine = ours.TFUniformReplayBuffer(spec, batch_size=BATCH_SIZE,
                                              max_length=max_length, seed=seed)
            pairs = _tf_ops(theirs, mine, max_length)
        else:
            array_spec = tensor_spec.to_nest_array_spec(spec)
            capacity = BATCH_SIZE * max_length
            theirs = tfa_py.PyUniformReplayBuffer(array_spec, capacity)
            mine = ours.PyUniformReplayBuffer(array_spec, capacity, seed=seed)
            pairs = _py_ops(theirs, mine, capacity)
        wall, cpu, machine = time.perf_counter(), time.process_time(), _machine_cpu()
        timed = _time({op: pairs[op] for op in wanted}, calls, warmup, block, skip)
        end = _machine_cpu()
        others = None if machine is None or end is None else round(max(
            0.0, (end - machine - (time.process_time() - cpu))
            / max(time.perf_counter() - wall, 1e-9)), 2)
        for c, op, items in OPS:
            if c != cls or op not in wanted:
                continue
            row = timed[op]
            # A dataset's element may be made ahead of the pull (TF-Agents' always are,
            # by the prefetch tf.data injects): time per batch is the mean over a block
            # of consecutive pulls, not the median pull.
            figure = "block" if _pipelined(op) else "median"
            t, o = row[f"theirs_{figure}_seconds"], row[f"ours_{figure}_seconds"]
            bad = [f"{who}: {row[k]}" for who, k in (("tf-agents", "theirs_status"),
                                                     ("ours", "ours_status"))
                   if row[k] != "ok"]
            rows.append({"buffer": cls, "op": op, "name": op_name(cls, op),
                         "items_per_call": items or BATCH_SIZE * max_length,
                         "theirs_seconds": t, "ours_seconds": o, "figure": figure,
                         **{k: v for k, v in row.items() if not k.endswith("_status")},
                         "ratio": None if not t or o is None else o / t,
                         "others_cores": others,
                         "status": "; ".join(bad) if bad else "ok"})
        del theirs, mine, pairs
        gc.collect()
    return {"versions": versions(),
            "config": {"calls": calls, "warmup": warmup, "max_length": max_length,
                       "batch_size": BATCH_SIZE, "block": block, "skip": skip},
            "rows": rows}


# -------------------------------------------------------------------------- the peer
def tf_agents_python() -> Path | None:
    """The TF-Agents venv's Python (``VENV_TFAGENTS`` or ``<repo>/.venv-tfagents``)."""
    return venv_python("VENV_TFAGENTS", ".venv-tfagents")


def peer_rows(quick: bool = False) -> Iterator[dict[str, Any]]:
    """Rows for ``replaybuffer_bench.peers``: this module run in the TF-Agents venv, one
    row per op for ``tf-agents`` and one for ``replaybuffer`` (compat.tf_agents, timed
    in the same process). Raises :class:`NotInstalled` when the venv is missing."""
    python = tf_agents_python()
    if python is None:
        raise NotInstalled(".venv-tfagents: bash benchmarks/setup_tf_agents.sh")
    args = ["--calls", "100", "--warmup", "10", "--max-length", "1000"] if quick else []
    report = run_report(python, "replaybuffer_bench.tf_agents_seed", args,
                        {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"})
    v = report["versions"]
    tf_version = v.get("tensorflow-cpu") or v.get("tensorflow", "?")
    where = f".venv-tfagents: tensorflow {tf_version}, numpy {v.get('numpy', '?')}"
    for row in report["rows"]:
        for peer, key, what in (
                ("tf-agents", "theirs_seconds", f"tf-agents {v.get('tf-agents', '?')}"),
                ("replaybuffer", "ours_seconds",
                 f"compat.tf_agents, interleaved with tf-agents {v.get('tf-agents', '?')}")):
            yield {"op": row["name"], "peer": peer, "seconds_per_call": row[key],
                   "items_per_call": row["items_per_call"], "status": row["status"]
                   if row[key] is None else "ok", "others_cores": row["others_cores"],
                   "detail": f"{what}; {where}"}


def peer_ops() -> tuple[str, ...]:
    """The op names :func:`peer_rows` yields, in order."""
    return tuple(op_name(cls, op) for cls, op, _ in OPS)


# ------------------------------------------------------------------------ reporting
def format_table(report: dict[str, Any], markdown: bool = False) -> str:
    return comparison_table([(r["name"], r["theirs_seconds"], r["ours_seconds"], r["ratio"],
                              r["status"]) for r in report["rows"]], "TF-Agents", markdown)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replaybuffer_bench.tf_agents_seed",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=500, help="timed calls per op and side")
    parser.add_argument("--warmup", type=int, default=50, help="untimed calls first")
    parser.add_argument("--max-length", type=int, default=MAX_LENGTH)
    parser.add_argument("--block", type=int, default=50,
                        help="calls of one side in a row (a round is a block of each)")
    parser.add_argument("--only", help="time just the ops whose name contains this")
    parser.add_argument("--json", help="write the report here ('-': stdout, alone)")
    parser.add_argument("--markdown", help="write a markdown table here")
    parser.add_argument("--quiet", action="store_true", help="no table on stdout")
    args = parser.parse_args(argv)
    report = run(args.calls, args.warmup, args.max_length, args.block, only=args.only)
    if args.json == "-":
        json.dump(report, sys.stdout)
        sys.stdout.write("\n")
    elif args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(format_table(report, markdown=True) + "\n")
    if not args.quiet and args.json != "-":
        v = report["versions"]
        print(f"# TF-Agents seed: {', '.join(f'{k} {x}' for k, x in v.items())}; "
              f"{os.cpu_count()} cpus; median of {args.calls} calls after {args.warmup}; "
              f"batch_size {BATCH_SIZE}, max_length {args.max_length}")
        print(format_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
