"""The peer table (:data:`PEERS`: each peer's family, modules, run function, layout and
workloads) and :func:`run_peers`, which runs it into rows, whatever each peer does."""

from __future__ import annotations

import contextlib
import importlib
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from replaybuffer_bench import pearl_seed, tf_agents_seed
from replaybuffer_bench.peers.cpprb_peer import cpprb_rows
from replaybuffer_bench.peers.measuring import TORCH_THREADS, machine_cpu_seconds, release_memory
from replaybuffer_bench.peers.ours import numpy_limit_rows, ours_rows
from replaybuffer_bench.peers.sb3_peer import sb3_rows
from replaybuffer_bench.peers.tianshou_peer import tianshou_rows
from replaybuffer_bench.peers.torchrl_peer import torchrl_rows
from replaybuffer_bench.peers.workloads_spec import (BUFFER_WORKLOADS, FULL, MEMORY_ONLY, OPS,
                                                     QUICK, WORKLOADS, NotInstalled, Rows, Sizes,
                                                     Unsupported)


def pearl_rows(workload: str, sizes: Sizes, layout: str = "seed") -> Rows:
    """Pearl's buffers and ours through compat.pearl, timed together in .venv-pearl:
    rows of peer ``pearl`` and of peer ``replaybuffer`` for every op."""
    yield from pearl_seed.peer_rows(quick=sizes is QUICK)


def tf_agents_rows(workload: str, sizes: Sizes, layout: str = "seed") -> Rows:
    """TF-Agents 0.19's TFUniformReplayBuffer and PyUniformReplayBuffer and ours through
    compat.tf_agents, timed together in .venv-tfagents (TensorFlow 2.15): rows of peer
    ``tf-agents`` and of peer ``replaybuffer`` for every op."""
    yield from tf_agents_seed.peer_rows(quick=sizes is QUICK)




@dataclass(frozen=True)
class Peer:
    """One line of the peer table: a peer library (or ours, or a numpy limit) in one layout."""

    label: str
    family: str  # the name --peers selects
    modules: tuple[str, ...]  # imported first: ImportError means "not installed"
    run: Callable[..., Rows]
    layout: str
    workloads: tuple[str, ...]
    memory_only: bool = False

    def ops(self, workload: str) -> tuple[str, ...]:
        return MEMORY_ONLY if self.memory_only else OPS[workload]

    def distribution(self) -> str:
        return {"sb3": "stable-baselines3"}.get(self.family, self.family)


PEERS: tuple[Peer, ...] = (
    Peer("numpy limit", "numpy", ("numpy",), numpy_limit_rows, "plain", ("control", "frames")),
    Peer("numpy limit[records]", "numpy", ("numpy",), numpy_limit_rows, "records",
         ("control", "frames")),
    Peer("replaybuffer", "replaybuffer", ("replaybuffer",), ours_rows, "plain", BUFFER_WORKLOADS),
    Peer("replaybuffer[transitions]", "replaybuffer", ("replaybuffer",), ours_rows,
         "transitions", ("control",)),
    Peer("replaybuffer[frame_stack]", "replaybuffer", ("replaybuffer",), ours_rows,
         "frame_stack", ("frames",)),
    Peer("cpprb", "cpprb", ("cpprb",), cpprb_rows, "next_of", BUFFER_WORKLOADS),
    Peer("cpprb[stack_compress]", "cpprb", ("cpprb",), cpprb_rows, "stack", ("frames",)),
    Peer("cpprb[no next_of]", "cpprb", ("cpprb",), cpprb_rows, "plain", ("frames",), True),
    Peer("sb3", "sb3", ("stable_baselines3", "gymnasium", "torch"), sb3_rows, "default",
         ("control", "prioritized", "prioritized-skewed")),
    Peer("sb3[optimize_memory]", "sb3", ("stable_baselines3", "gymnasium", "torch"), sb3_rows,
         "optimize_memory", ("frames",)),
    Peer("sb3", "sb3", ("stable_baselines3", "gymnasium", "torch"), sb3_rows, "default",
         ("frames",), True),
    Peer("torchrl", "torchrl", ("torchrl", "tensordict", "torch"), torchrl_rows, "td",
         BUFFER_WORKLOADS),
    Peer("torchrl[pytree]", "torchrl", ("torchrl", "torch"), torchrl_rows, "pytree",
         ("control", "prioritized", "prioritized-skewed")),
    Peer("tianshou", "tianshou", ("tianshou", "torch"), tianshou_rows, "default",
         ("control", "prioritized", "prioritized-skewed")),
    Peer("tianshou[ignore_obs_next]", "tianshou", ("tianshou", "torch"), tianshou_rows,
         "ignore_obs_next", ("frames",)),
    Peer("tianshou[atari]", "tianshou", ("tianshou", "torch"), tianshou_rows, "atari",
         ("frames",)),
    Peer("tianshou", "tianshou", ("tianshou", "torch"), tianshou_rows, "default", ("frames",),
         True),
    Peer("pearl", "pearl", ("replaybuffer",), pearl_rows, "seed", ("pearl",)),
    Peer("tf-agents", "tf-agents", ("replaybuffer",), tf_agents_rows, "seed", ("tf-agents",)),
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
            release_memory()
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
    TORCH_THREADS[0] = torch_threads
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
        cpu, machine = time.process_time(), machine_cpu_seconds()
        time.sleep(probe)
        end = machine_cpu_seconds()
        if machine is None or end is None:
            return
        if (end - machine - (time.process_time() - cpu)) / probe <= threshold:
            return

