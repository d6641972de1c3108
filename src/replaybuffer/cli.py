"""The ``replaybuffer`` command: ``demo``, ``tutorial``, ``bench`` and ``inspect``.

``inspect`` is part of the library. ``demo``, ``tutorial`` and ``bench`` run the DQN demos
(package ``replaybuffer_demos``) and the benchmark harness (``replaybuffer_bench``), which
live beside the library in the repository's ``src/`` and are not shipped in the wheel: they
are imported by name when the command runs, and from an installed wheel the command exits
with status 2 and says to run it from a checkout.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Sequence

NOT_IN_CHECKOUT = 2
"""Exit status of ``demo``, ``tutorial`` and ``bench`` where the harness is not importable."""


class HarnessMissing(Exception):
    """The demos or the benchmark harness are not importable (an installed wheel)."""


def harness(module: str) -> ModuleType:
    """Import ``module`` of ``replaybuffer_demos`` or ``replaybuffer_bench`` by name (the
    library never imports them statically: they are not in the wheel).

    Raises:
        HarnessMissing: the package itself is not importable. Any other ImportError (a
            missing optional dependency of the harness) propagates unchanged.
    """
    package = module.partition(".")[0]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or (exc.name != package and not exc.name.startswith(package + ".")):
            raise
        raise HarnessMissing(module) from exc


def _not_in_checkout(command: str) -> int:
    print(f"replaybuffer {command} runs from a checkout of the repository: the demos "
          "(replaybuffer_demos) and the benchmark harness (replaybuffer_bench) are not part of "
          "the installed package. Clone the repository and run `make demo` or `make bench` "
          f"there (or `replaybuffer {command} ...` with its src/ installed or on PYTHONPATH).",
          file=sys.stderr)
    return NOT_IN_CHECKOUT


def _demo(args: argparse.Namespace) -> int:
    try:
        dqn = harness("replaybuffer_demos.dqn")
    except HarnessMissing:
        return _not_in_checkout("demo")
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise SystemExit(f"replaybuffer demo needs the demo extra "
                         f"(pip install 'replaybuffer[demo]'): {exc}") from exc
    dqn.main(steps=args.steps, seed=args.seed, out=args.out, progress=not args.no_progress,
             prioritized=args.prioritized, actors=args.actors, ray=args.ray)
    return 0


def _tutorial(args: argparse.Namespace) -> int:
    try:
        tutorial = harness("replaybuffer_demos.tutorial")
    except HarnessMissing:
        return _not_in_checkout("tutorial")
    tutorial.main(storage=args.storage)
    return 0


def _bench(args: argparse.Namespace) -> int:
    try:
        return _run_bench(args)
    except HarnessMissing:
        return _not_in_checkout("bench")


def _run_bench(args: argparse.Namespace) -> int:
    json_argv = ["--json", args.json] if args.json else []
    if args.gpu:  # the torch storage on a GPU against TorchRL and the memory bandwidth
        argv = ["--workloads", args.workloads, "--device", args.device]
        argv += ["--quick"] if args.quick else []
        return int(harness("replaybuffer_bench.gpu").main(argv + json_argv))
    if args.peers:  # the issue-6 workloads through the peer libraries that are installed
        argv = ["--workloads", args.peer_workloads] + (["--quick"] if args.quick else [])
        return int(harness("replaybuffer_bench.peers").main(argv + json_argv))
    if args.sb3:  # on-policy and HER buffers against Stable-Baselines3's
        argv = ["--min-time", "0.05", "--her-capacity", "5000"] if args.quick else []
        return int(harness("replaybuffer_bench.sb3_buffers").main(argv + json_argv))
    if args.scale or args.plot:  # sample cost against capacity, and its plot
        argv = ["--capacities", "10000,100000"] if args.quick else []
        if args.plot:
            argv += ["--plot", args.plot]
        return int(harness("replaybuffer_bench.scale").main(argv + json_argv))
    if args.checkpoint:  # saving and loading a large buffer while it is in use
        argv = ["--size-gb", str(0.2 if args.quick else args.size_gb)]
        return int(harness("replaybuffer_bench.checkpoint").main(argv + json_argv))
    if args.ray:  # shards as Ray actors, collectors as Ray tasks
        argv = ["--seconds", str(1.0 if args.quick else args.seconds)]
        if args.quick:
            argv += ["--shards", "1,2"]
        return int(harness("replaybuffer_bench.ray_bench").main(argv + json_argv))
    if args.processes:  # writer and sampler processes on one shared buffer, and Reverb
        argv = ["--seconds", str(1.0 if args.quick else args.seconds)]
        if args.quick:
            argv += ["--writers", "1,2", "--no-reverb"]
        if args.soak is not None:
            argv += ["--soak", str(args.soak)]
        return int(harness("replaybuffer_bench.processes").main(argv + json_argv))
    return int(harness("replaybuffer_bench").run_and_report(args))


def _inspect(args: argparse.Namespace) -> int:
    from replaybuffer.errors import CheckpointError
    from replaybuffer.persist import TMP, checkpoints, decode_spec, verify
    from replaybuffer.sampling.ring import items_per_row

    path = Path(args.path)
    mmap = (path / "state").is_dir() and (path / "data").is_dir()
    try:
        # A checkpoint: every file read and its checksum checked. An mmap buffer: its
        # state's files checked, and its data files' headers read.
        manifest = verify(path / "state" if mmap else path)
        files = _mmap_files(path, manifest) if mmap else None
    except CheckpointError as exc:
        print(f"corrupt or incomplete: {exc}", file=sys.stderr)
        return 1
    if files is not None:
        header, sizes = files
        print(f"{path}: a buffer on mmap storage; its files hold last_id={header[0]}"
              + (" (a commit to replay on reopen)" if header[1] else "")
              + f"; state from the last flush: last_id={manifest['state']['last_id']}")
        for name, (shape, dtype, nbytes) in sizes.items():
            print(f"  data/{name}: {dtype} {shape} {nbytes:,} bytes")
    directory = Path(manifest["directory"])
    series = checkpoints(path)
    if series:
        partial = sorted(p.name for p in path.iterdir() if p.name.startswith(TMP))
        print(f"{path}: {len(series)} checkpoint(s): {', '.join(p.name for p in series)}"
              + (f"; {len(partial)} incomplete save(s) ignored: {', '.join(partial)}"
                 if partial else ""))
        print(f"newest: {directory.name}")
    state, B, L = manifest["state"], manifest["batch_size"], manifest["max_length"]
    filled = items_per_row(state["last_id"], L) * B
    print(f"{manifest['buffer']}: batch_size={B} max_length={L} capacity={B * L} "
          f"storage={manifest['storage']} format={manifest['version']}")
    print(f"last_id={state['last_id']} frames={filled}/{B * L}")
    print(f"data_spec={decode_spec(manifest['data_spec'])!r}")
    total = 0
    for entry in manifest["leaves"] + [e for es in manifest["streams"].values() for e in es]:
        nbytes = (directory / entry["file"]).stat().st_size
        total += nbytes
        print(f"  {entry['file']}: {entry.get('path', '')} {entry['dtype']} "
              f"{tuple(entry['shape'])} {nbytes:,} bytes crc32={entry['crc32']:08x}")
    print(f"checksums verified: {total:,} bytes of data")
    if args.json:
        print(json.dumps(manifest, indent=1))
    return 0


def _mmap_files(path: Path, manifest: dict[str, Any]
                ) -> tuple[list[int], dict[str, tuple[tuple[int, ...], str, int]]]:
    """The header and the data files (shape, dtype, bytes) of an mmap buffer, each
    file's header read and checked."""
    import numpy as np

    from replaybuffer.errors import CheckpointError

    sizes: dict[str, tuple[tuple[int, ...], str, int]] = {}
    for file in sorted((path / "data").glob("*.npy")):
        try:
            array = np.load(file, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise CheckpointError(f"{file} is not a readable .npy file: {exc}") from exc
        sizes[file.name] = (array.shape, array.dtype.name, file.stat().st_size)
    if "header.npy" not in sizes:
        raise CheckpointError(f"{path / 'data' / 'header.npy'} is missing")
    header: list[int] = np.load(path / "data" / "header.npy").tolist()
    return header, sizes


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="replaybuffer",
                                     description="Experience replay for reinforcement learning.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="the main job: train a DQN on CartPole-v1 from a "
                          "replay buffer fed by a driver, then evaluate it greedily")
    demo.add_argument("--steps", type=int, default=None,
                      help="environment steps to train for (default 50000)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--out", default="demo-out",
                      help="directory for learning_curve.png and result.json")
    demo.add_argument("--prioritized", action="store_true",
                      help="prioritized replay (PrioritizedReplayBuffer) instead of uniform")
    demo.add_argument("--actors", type=int, default=0, metavar="N",
                      help="collect with N actor processes writing into a shared buffer "
                           "(SharedReplayBuffer), the learner in this process")
    demo.add_argument("--ray", action="store_true",
                      help="collect with Ray actors (--actors of them, default 2) into a "
                           "RayReplayBuffer of as many shards")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.set_defaults(func=_demo)

    tutorial = sub.add_parser("tutorial", help="the TF-Agents replay-buffer tutorial, walked "
                              "through in replaybuffer's API")
    tutorial.add_argument("--storage", default="numpy", choices=["numpy", "torch"])
    tutorial.set_defaults(func=_tutorial)

    bench = sub.add_parser("bench", help="throughput against the plain numpy limit")
    bench.add_argument("--storage", default="numpy,torch",
                       help="comma-separated storage backends: numpy, torch, tensorflow, "
                       "mmap (files in a temporary directory) (default: numpy,torch)")
    bench.add_argument("--workloads", default="control,frames",
                       help="comma-separated: control, frames (default: both)")
    bench.add_argument("--quick", action="store_true",
                       help="small capacities and short timings (a smoke run)")
    bench.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    bench.add_argument("--peers", action="store_true",
                       help="run the control, frames and prioritized workloads through "
                            "cpprb, Stable-Baselines3, TorchRL and Tianshou where installed "
                            "(benchmarks/setup_peers.sh), beside ours and the numpy limit, "
                            "and TF-Agents' own buffers on its tutorial's workload in "
                            ".venv-tfagents (benchmarks/setup_tf_agents.sh)")
    bench.add_argument("--peer-workloads",
                       default="control,frames,prioritized,prioritized-skewed,pearl,"
                               "tf-agents",
                       help="with --peers: comma-separated workloads (pearl: Pearl's own "
                            "buffers against compat.pearl, in .venv-pearl from "
                            "benchmarks/setup_pearl.sh; tf-agents: TF-Agents' own buffers "
                            "against compat.tf_agents, in .venv-tfagents from "
                            "benchmarks/setup_tf_agents.sh)")
    bench.add_argument("--sb3", action="store_true",
                       help="RolloutBuffer (add, GAE, minibatch epochs) and HERBuffer (add, "
                            "sample) against Stable-Baselines3's on the same data")
    bench.add_argument("--scale", action="store_true",
                       help="sample cost at capacities 10k, 100k, 1M, 10M (uniform, "
                            "prioritized, within episodes, both) against the numpy limit")
    bench.add_argument("--plot", nargs="?", const="bench-results/scale.png", default=None,
                       metavar="PNG", help="--scale, and plot it (default "
                       "bench-results/scale.png)")
    bench.add_argument("--checkpoint", action="store_true",
                       help="save a large buffer while a collector adds to it, then load it: "
                            "GB/s against a plain file copy, the longest add stall, peak "
                            "extra memory")
    bench.add_argument("--size-gb", type=float, default=4.0,
                       help="with --checkpoint: the buffer's size (default 4)")
    bench.add_argument("--processes", action="store_true",
                       help="writer processes and a sampler on one SharedReplayBuffer "
                            "(1, 2, 4 writers), one process alone, and Reverb where "
                            "benchmarks/setup_reverb.sh installed it")
    bench.add_argument("--ray", action="store_true",
                       help="a RayReplayBuffer with 1, 2, 4 shards and 4 collector tasks "
                            "on a local Ray cluster, beside one process alone")
    bench.add_argument("--seconds", type=float, default=5.0,
                       help="with --processes or --ray: seconds per configuration "
                            "(default 5)")
    bench.add_argument("--soak", type=float, default=None, metavar="SECONDS",
                       help="with --processes: the stress run (writers killed, every "
                            "sample checked) for SECONDS instead")
    bench.add_argument("--gpu", action="store_true",
                       help="the torch storage on a CUDA device (sampling on the device) "
                            "against TorchRL's LazyTensorStorage there and the device's "
                            "memory bandwidth; exits 2 without CUDA")
    bench.add_argument("--device", default="cuda",
                       help="with --gpu: the torch device (cpu: a smoke run)")
    bench.set_defaults(func=_bench)

    inspect = sub.add_parser("inspect", help="describe a checkpoint and verify its checksums "
                             "(exit status 1 when it is corrupt or incomplete)")
    inspect.add_argument("path", help="a checkpoint series (buffer.save's path), one "
                         "checkpoint directory, or the path of a buffer on mmap storage")
    inspect.add_argument("--json", action="store_true", help="print the whole manifest")
    inspect.set_defaults(func=_inspect)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
