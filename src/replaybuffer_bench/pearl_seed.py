"""Pearl 0.4.1's own buffers against ``replaybuffer.compat.pearl``, on Pearl's workload.

    .venv-pearl/bin/python -m replaybuffer_bench.pearl_seed [--calls 500] [--envs 1,4]
                                                            [--json FILE] [--markdown FILE]

Pearl (``pearll``) needs gym 0.19 and numpy<2, so it lives in its own virtualenv
(``benchmarks/setup_pearl.sh`` builds ``.venv-pearl``, with this project installed
beside it); both buffers are timed in that one process, call by call interleaved.
``replaybuffer bench --peers`` runs this module there as the ``pearl`` workload
(:func:`peer_rows`) and reports ``not installed`` rows when the venv is missing.

The workload is the buffers tutorial's (``2_Buffers.ipynb``) at a control task's size:
float32 observation[17], float32 action[6] (a continuous-control env), ``buffer_size``
10,000 rows, ``batch_size`` 256; one env, and a vector env of 4 (Pearl takes gym's
batched spaces: ``[buffer_size, num_envs, ...]`` arrays). Inputs are what an env
gives: a fresh observation array per step (the next step's observation *is* the
previous step's next observation), a float32 action array, a Python float reward and
bool flags (numpy arrays of them for the vector env). Episodes last 50-300 steps and
end by termination or truncation; Pearl gets ``done = terminated or truncated``, ours
``terminated, truncated``. Both buffers are filled past ``buffer_size`` before timing
(the ring has wrapped), and adds keep going between reads.

Each op is timed per call (``perf_counter_ns``) for ``calls`` rounds after ``warmup``
rounds; in each round every op of one buffer class runs once, Pearl's then ours, so
drift hits both alike. Reported: the median microseconds per call of each, and the
ratio ours / Pearl's (below 1: ours is faster). ``torch`` reads go to the CPU (Pearl's
``settings.DEVICE`` here) with one torch thread.

What differs in what the two return (the ratio compares unequal work where it says):

* Pearl's next observation of an episode's last step is the next episode's first
  observation; ours is the one that was added. Pearl's ``last``, ``all()`` and
  ``RolloutBuffer`` reads return views of its arrays (which later adds overwrite);
  ours return views of a cache of recent steps in Pearl's layout, each step copied in
  once when a read first needs it (here ``last(256)``, the first read after an add
  that includes the newest step; ``RolloutBuffer.sample``'s random run of older steps
  needs no copy unless it reaches the newest), and never overwritten. Pearl's ``all()`` of a wrapped buffer returns only what was written
  since the wrap (``[:pos]``); ours returns every stored transition.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from replaybuffer_bench.seed_venv import (NotInstalled, comparison_table, run_report,
                                         venv_python)

__all__ = ["OPS", "run", "peer_rows", "pearl_python", "format_table", "main"]

OBS_SHAPE, ACTION_SHAPE = (17,), (6,)
BUFFER_SIZE, BATCH = 10_000, 256

# (buffer class, op): the calls timed for each env count, in this order.
OPS = (("ReplayBuffer", "add_trajectory"), ("ReplayBuffer", "sample(256) numpy"),
       ("ReplayBuffer", "sample(256) torch"), ("ReplayBuffer", "last(256) torch"),
       ("ReplayBuffer", "all() torch"),
       ("RolloutBuffer", "add_trajectory"), ("RolloutBuffer", "sample(256) numpy"),
       ("RolloutBuffer", "sample(256) torch"), ("RolloutBuffer", "last(256) torch"),
       ("RolloutBuffer", "all() torch"))


def op_name(cls: str, op: str, envs: int) -> str:
    """The op's name in tables and peer rows: ``ReplayBuffer.add_trajectory [4 envs]``."""
    return f"{cls}.{op}" + ("" if envs == 1 else f" [{envs} envs]")


# ------------------------------------------------------------------------ workload
def stream(envs: int, length: int = 4096, seed: int = 0) -> list[tuple[Any, ...]]:
    """``length`` transitions ``(obs, action, reward, next_obs, terminated, truncated)``
    as an env gives them; ``obs`` of step ``t + 1`` is ``next_obs`` of step ``t`` (the
    same array) unless step ``t`` ended an episode. The last step ends every env's
    episode, so cycling the stream is a sequence of whole episodes."""
    rng = np.random.default_rng(seed)
    shape = (envs,) if envs > 1 else ()
    left = rng.integers(50, 300, shape or (1,))
    obs = rng.standard_normal(shape + OBS_SHAPE, np.float32)
    out = []
    reward: float | np.ndarray  # one env: Python scalars; a vector env: arrays
    terminated: bool | np.ndarray
    truncated: bool | np.ndarray
    for t in range(length):
        left -= 1
        ends = (left == 0) | (t == length - 1)
        term = ends & (rng.random(len(ends)) < 0.5)
        trunc = ends & ~term
        next_obs = rng.standard_normal(shape + OBS_SHAPE, np.float32)
        action = rng.uniform(-1, 1, shape + ACTION_SHAPE).astype(np.float32)
        if envs == 1:
            reward, terminated, truncated = float(rng.standard_normal()), bool(term[0]), \
                bool(trunc[0])
        else:
            reward, terminated, truncated = rng.standard_normal(envs), term, trunc
        out.append((obs, action, reward, next_obs, terminated, truncated))
        if ends.any():  # reset: a fresh first observation where an episode ended
            obs = next_obs.copy()
            fresh = rng.standard_normal(shape + OBS_SHAPE, np.float32)
            if envs == 1:
                obs = fresh
            else:
                obs[ends] = fresh[ends]
            left[ends] = rng.integers(50, 300, int(ends.sum()))
        else:
            obs = next_obs
    return out


def _pearl_env(envs: int) -> Any:
    import gym

    # gym is Any to mypy (not installed where it runs: see pyproject's overrides).
    class ControlEnv(gym.Env):  # type: ignore[misc]  # spaces: all Pearl's buffers read
        observation_space = gym.spaces.Box(-np.inf, np.inf, OBS_SHAPE, np.float32)
        action_space = gym.spaces.Box(-1.0, 1.0, ACTION_SHAPE, np.float32)

    if envs == 1:
        return ControlEnv()

    class ControlVectorEnv(gym.vector.VectorEnv):  # type: ignore[misc]  # (gym is Any)
        # gym 0.19 batches the spaces itself.
        def __init__(self) -> None:
            super().__init__(envs, ControlEnv.observation_space, ControlEnv.action_space)

        def close_extras(self, **kwargs: Any) -> None:  # nothing to close (gym raises)
            pass

    return ControlVectorEnv()


def _ours_spaces() -> dict[str, Any]:
    from gymnasium import spaces

    return {"observation_space": spaces.Box(-np.inf, np.inf, OBS_SHAPE, np.float32),
            "action_space": spaces.Box(-1.0, 1.0, ACTION_SHAPE, np.float32)}


def _adder(buffer: Any, data: list[tuple[Any, ...]], pearl: bool) -> Callable[[], None]:
    """A call that adds the stream's next transition (cycling)."""
    add = buffer.add_trajectory
    n, i = len(data), [0]
    if pearl:  # Pearl's one flag: done = terminated or truncated
        items = [(o, a, r, no, te | tr if isinstance(te, np.ndarray) else te or tr)
                 for o, a, r, no, te, tr in data]
    else:
        items = data

    def call() -> None:
        k = i[0]
        add(*items[k])
        i[0] = k + 1 if k + 1 < n else 0
    return call


def _buffers(cls_name: str, envs: int, buffer_size: int, seed: int) -> tuple[Any, Any]:
    import pearll.buffers as theirs

    from replaybuffer.compat import pearl as ours

    np.random.seed(seed)  # Pearl draws from numpy's global generator
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pearl = getattr(theirs, cls_name)(_pearl_env(envs), buffer_size)
    mine = getattr(ours, cls_name)(buffer_size=buffer_size, seed=seed,
                                   num_envs=envs if envs > 1 else None, **_ours_spaces())
    return pearl, mine


def _sample(buffer: Any, kind: str) -> Callable[[], Any]:
    """``buffer.sample(BATCH, dtype=kind)`` as a call of no arguments."""
    return lambda: buffer.sample(BATCH, dtype=kind)


def _ops(cls_name: str, pearl: Any, mine: Any, data: list[tuple[Any, ...]]
         ) -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    """``{op: (Pearl's call, ours)}`` for one buffer class."""
    calls: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
        "add_trajectory": (_adder(pearl, data, True), _adder(mine, data, False))}
    for kind in ("numpy", "torch"):
        calls[f"sample({BATCH}) {kind}"] = (_sample(pearl, kind), _sample(mine, kind))
    calls[f"last({BATCH}) torch"] = (lambda: pearl.last(BATCH), lambda: mine.last(BATCH))
    calls["all() torch"] = (lambda: pearl.all(), lambda: mine.all())
    return calls


def _time(calls: dict[str, tuple[Callable[[], Any], Callable[[], Any]]], rounds: int,
          warmup: int) -> dict[str, tuple[float, float]]:
    """Median seconds per call ``{op: (Pearl's, ours)}``, every call timed alone, the
    ops interleaved call by call."""
    clock = time.perf_counter_ns
    samples: dict[str, tuple[list[int], list[int]]] = {op: ([], []) for op in calls}
    order = [(samples[op][side], fn) for op, pair in calls.items()
             for side, fn in enumerate(pair)]
    gc_was = gc.isenabled()
    gc.disable()  # a collection inside one call would land on whichever ran then
    try:
        for r in range(warmup + rounds):
            for out, fn in order:
                start = clock()
                fn()
                elapsed = clock() - start
                if r >= warmup:
                    out.append(elapsed)
            if r % 64 == 63:
                gc.collect()
    finally:
        if gc_was:
            gc.enable()
    return {op: (statistics.median(p) * 1e-9, statistics.median(o) * 1e-9)
            for op, (p, o) in samples.items()}


def run(envs: tuple[int, ...] = (1, 4), calls: int = 500, warmup: int = 50,
        buffer_size: int = BUFFER_SIZE, seed: int = 0,
        progress: Callable[[dict[str, Any]], None] | None = None,
        ops: tuple[tuple[str, str], ...] = OPS) -> list[dict[str, Any]]:
    """Time every op of ``ops`` (default :data:`OPS`) for each env count.

    Returns rows ``{envs, buffer, op, name, pearl_seconds, ours_seconds, ratio, status,
    detail}`` (``ratio`` = ours / Pearl's); a case that fails (Pearl or ours) gives rows
    with ``status`` ``failed: ...`` and no times, never a missing row.
    """
    import torch

    torch.set_num_threads(1)
    rows = []
    for n in envs:
        data = stream(n)
        for cls_name in dict.fromkeys(c for c, _ in ops):
            base = {"envs": n, "buffer": cls_name, "pearl_seconds": None,
                    "ours_seconds": None, "ratio": None, "status": "ok", "detail": ""}
            names = [op for c, op in ops if c == cls_name]
            try:
                pearl, mine = _buffers(cls_name, n, buffer_size, seed)
                fill_pearl, fill_mine = _adder(pearl, data, True), _adder(mine, data, False)
                for _ in range(buffer_size + buffer_size // 3):  # wrapped, steady state
                    fill_pearl()
                    fill_mine()
                calls_of = _ops(cls_name, pearl, mine, data)
                times = _time({op: calls_of[op] for op in names}, calls, warmup)
            except Exception as err:  # noqa: BLE001 - reported as the case's status
                reason = " ".join(f"{type(err).__name__}: {err}".split())[:200]
                got = [dict(base, op=op, name=op_name(cls_name, op, n),
                            status=f"failed: {reason}") for op in names]
            else:
                got = [dict(base, op=op, name=op_name(cls_name, op, n), pearl_seconds=p,
                            ours_seconds=o, ratio=o / p) for op, (p, o) in times.items()]
            finally:
                pearl = mine = None
                gc.collect()
            for row in got:
                rows.append(row)
                if progress is not None:
                    progress(row)
    return rows


def versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {"python": platform.python_version()}
    for dist in ("pearll", "replaybuffer", "torch", "numpy", "gym", "gymnasium"):
        try:
            out[dist] = version(dist)
        except Exception:  # noqa: BLE001 - not installed
            out[dist] = "-"
    return out


# ------------------------------------------------------------------ peers table
def pearl_python() -> Path | None:
    """The interpreter of Pearl's venv: ``$VENV_PEARL`` or ``.venv-pearl`` at the root
    of this checkout; ``None`` when there is none."""
    return venv_python("VENV_PEARL", ".venv-pearl")


def peer_rows(quick: bool = False) -> Iterator[dict[str, Any]]:
    """Rows for ``replaybuffer_bench.peers``: this module run in Pearl's venv, one row
    per op for ``pearl`` and one for ``replaybuffer`` (compat.pearl, timed in the same
    process). Raises :class:`NotInstalled` when the venv is missing."""
    python = pearl_python()
    if python is None:
        raise NotInstalled(".venv-pearl: bash benchmarks/setup_pearl.sh")
    args = ["--calls", "50", "--warmup", "10", "--buffer-size", "2000"] if quick else []
    report = run_report(python, "replaybuffer_bench.pearl_seed", args)
    v = report["versions"]
    for row in report["rows"]:
        for peer, key, what in (("pearl", "pearl_seconds", f"pearll {v['pearll']}"),
                                ("replaybuffer", "ours_seconds",
                                 f"compat.pearl, interleaved with pearll {v['pearll']}")):
            seconds = row[key]
            yield {"op": row["name"], "peer": peer, "seconds_per_call": seconds,
                   "items_per_call": _items(row["op"], row["envs"]),
                   "status": row["status"],
                   "detail": f"{what}; .venv-pearl: numpy {v['numpy']}, torch {v['torch']}"}


def _items(op: str, envs: int) -> int:
    if op.startswith(("sample", "last")):
        return BATCH * envs
    if op.startswith("all"):
        return 1  # what all() holds differs (see the module's docstring)
    return envs


def peer_ops() -> tuple[str, ...]:
    """The op names of the peers table's ``pearl`` workload."""
    return tuple(op_name(c, op, n) for n in (1, 4) for c, op in OPS)


# ------------------------------------------------------------------------ report
def format_table(rows: list[dict[str, Any]], markdown: bool = False) -> str:
    return comparison_table([(r["name"], r["pearl_seconds"], r["ours_seconds"], r["ratio"],
                              r["status"]) for r in rows], "Pearl", markdown)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replaybuffer_bench.pearl_seed",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", default="1,4", help="comma-separated env counts")
    parser.add_argument("--calls", type=int, default=500, help="timed calls per op")
    parser.add_argument("--warmup", type=int, default=50, help="untimed rounds first")
    parser.add_argument("--buffer-size", type=int, default=BUFFER_SIZE)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ops", default="",
                        help="only the ops whose 'Buffer.op' name contains one of these "
                             "comma-separated strings")
    parser.add_argument("--json", help="write rows and versions to this file ('-': stdout)")
    parser.add_argument("--markdown", help="write a markdown table to this file")
    parser.add_argument("--quiet", action="store_true", help="no table on stdout")
    args = parser.parse_args(argv)
    envs = tuple(int(e) for e in args.envs.split(",") if e)
    v = versions()
    head = (f"# Pearl's buffers against replaybuffer.compat.pearl: buffer_size "
            f"{args.buffer_size}, median of {args.calls} calls; "
            + ", ".join(f"{k} {x}" for k, x in v.items()))
    wanted = [w for w in args.ops.split(",") if w]
    ops = tuple((c, op) for c, op in OPS
                if not wanted or any(w in f"{c}.{op}" for w in wanted))
    rows = run(envs, args.calls, args.warmup, args.buffer_size, args.seed, ops=ops)
    if not args.quiet:
        print(head + "\n")
        print(format_table(rows))
    report = {"versions": v, "calls": args.calls, "buffer_size": args.buffer_size,
              "rows": rows}
    if args.json == "-":
        json.dump(report, sys.stdout)
    elif args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(head + "\n\n" + format_table(rows, markdown=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
