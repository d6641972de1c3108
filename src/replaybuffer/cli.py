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
from typing import Any, Callable, Iterator, Sequence

from replaybuffer import __version__

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


def positive_int(text: str) -> int:
    """An argument that must be an integer >= 1 (argparse ``type=``)."""
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An argument that must be an integer >= 0 (argparse ``type=``)."""
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {value}")
    return value


def positive_float(text: str) -> float:
    """An argument that must be a finite number > 0 (argparse ``type=``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def comma_list(allowed: Sequence[str]) -> Callable[[str], str]:
    """An argparse ``type=``: a comma-separated list of names from ``allowed``, at least
    one; the text is returned unchanged."""
    def parse(text: str) -> str:
        names = [name for name in text.split(",") if name]
        unknown = [name for name in names if name not in allowed]
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {', '.join(allowed)}; got {text!r}")
        return text
    parse.__name__ = "comma-separated list"
    return parse


def count_list(text: str) -> str:
    """An argparse ``type=``: a comma-separated list of positive integers (``1,2,4``), at
    least one; the text is returned unchanged."""
    parts = text.split(",")
    if not all(part.isdigit() and int(part) > 0 for part in parts):
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of positive integers; got {text!r}")
    return text


count_list.__name__ = "comma-separated list of counts"


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


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
             prioritized=args.prioritized, actors=args.actors or 0, ray=args.ray,
             compare=args.compare)
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
        argv += ["--profile"] if args.profile else []
        return int(harness("replaybuffer_bench.gpu").main(argv + json_argv))
    if args.peers:  # the issue-6 workloads through the peer libraries that are installed
        argv = ["--workloads", args.peer_workloads] + (["--quick"] if args.quick else [])
        return int(harness("replaybuffer_bench.peers").main(argv + json_argv))
    if args.sb3:  # on-policy and HER buffers against Stable-Baselines3's
        argv = ["--min-time", "0.05", "--her-capacity", "5000"] if args.quick else []
        return int(harness("replaybuffer_bench.sb3_buffers").main(argv + json_argv))
    if args.sb3_returns:  # SB3 DQN's returns with SB3's buffer and ours over seeds
        argv = ["--seeds", "1", "--steps", "1500", "--episodes", "2", "--resamples",
                "200"] if args.quick else []
        return int(harness("replaybuffer_bench.sb3_returns").main(argv + json_argv))
    if args.scale or args.plot:  # sample cost against capacity, and its plot
        argv = ["--capacities", "10000,100000"] if args.quick else []
        if args.plot:
            argv += ["--plot", args.plot]
        return int(harness("replaybuffer_bench.scale").main(argv + json_argv))
    if args.checkpoint:  # saving and loading a large buffer while it is in use
        argv = ["--size-gb", str(0.2 if args.quick else args.size_gb)]
        return int(harness("replaybuffer_bench.checkpoint").main(argv + json_argv))
    if args.ray:  # shards as Ray actors, collectors as Ray tasks
        argv = ["--seconds", str(1.0 if args.quick else args.seconds),
                "--workloads", args.workloads]
        if args.shards or args.quick:
            argv += ["--shards", args.shards or "1,2"]
        argv += ["--group-from-one-shard"] if args.group_from_one_shard else []
        return int(harness("replaybuffer_bench.ray_bench").main(argv + json_argv))
    if args.processes:  # writer and sampler processes on one shared buffer, and Reverb
        argv = ["--seconds", str(1.0 if args.quick else args.seconds),
                "--workloads", args.workloads]
        if args.writers or args.quick:
            argv += ["--writers", args.writers or "1,2"]
        argv += ["--no-reverb"] if args.quick else []
        argv += ["--prioritized"] if args.prioritized else []
        if args.soak is not None:
            argv += ["--soak", str(args.soak)]
        return int(harness("replaybuffer_bench.processes").main(argv + json_argv))
    return int(harness("replaybuffer_bench").run_and_report(args))


def _inspect(args: argparse.Namespace) -> int:
    from replaybuffer.errors import CheckpointError
    from replaybuffer.persist import verify

    path = Path(args.path)
    mmap = (path / "state").is_dir() and (path / "data").is_dir()
    try:
        # A checkpoint: every file read and its checksum checked. An mmap buffer: its
        # state's files checked, and its data files' headers read.
        manifest = verify(path / "state" if mmap else path)
        files = _mmap_files(path, manifest) if mmap else None
    except CheckpointError as exc:
        # A path that is not there is a typo, not damage: say only what is missing.
        print(f"corrupt or incomplete: {exc}" if path.exists() else str(exc), file=sys.stderr)
        return 1
    if args.json:  # the manifest alone, so that stdout parses as JSON
        print(json.dumps(manifest, indent=1))
        return 0
    for line in _describe(path, manifest, files):
        print(line)
    return 0


def _describe(path: Path, manifest: dict[str, Any],
              files: tuple[list[int], dict[str, tuple[tuple[int, ...], str, int]]] | None
              ) -> Iterator[str]:
    """The lines ``inspect`` prints for a verified checkpoint (``files``: an mmap
    buffer's header and data files)."""
    from replaybuffer.persist import TMP, checkpoints, decode_spec
    from replaybuffer.sampling.ring import items_per_row

    if files is not None:
        header, sizes = files
        yield (f"{path}: a buffer on mmap storage; its files hold last_id={header[0]}"
               + (" (a commit to replay on reopen)" if header[1] else "")
               + f"; state from the last flush: last_id={manifest['state']['last_id']}")
        for name, (shape, dtype, nbytes) in sizes.items():
            yield f"  data/{name}: {dtype} {shape} {nbytes:,} bytes"
    directory = Path(manifest["directory"])
    series = checkpoints(path)
    if series:
        partial = sorted(p.name for p in path.iterdir() if p.name.startswith(TMP))
        yield (f"{path}: {len(series)} checkpoint(s): {', '.join(p.name for p in series)}"
               + (f"; {len(partial)} incomplete save(s) ignored: {', '.join(partial)}"
                  if partial else ""))
        yield f"newest: {directory.name}"
    state, B, L = manifest["state"], manifest["batch_size"], manifest["max_length"]
    filled = items_per_row(state["last_id"], L) * B
    yield (f"{manifest['buffer']}: batch_size={B} max_length={L} capacity={B * L} "
           f"storage={manifest['storage']} format={manifest['version']}")
    unit = held_unit(manifest)
    yield f"last_id={state['last_id']} {unit}={filled}/{B * L}"
    stacked = (manifest.get("config") or {}).get("frame_stack")
    if stacked:
        frames = sum(e["shape"][0] for e in manifest["streams"].get("frames", []))
        yield (f"frame_stack={stacked!r}: each stacked observation kept as frames "
               f"({frames:,} frames in the ring)")
    yield f"data_spec={decode_spec(manifest['data_spec'])!r}"
    total = count = 0
    for entry in manifest["leaves"] + [e for es in manifest["streams"].values() for e in es]:
        nbytes = (directory / entry["file"]).stat().st_size
        total, count = total + nbytes, count + 1
        yield (f"  {entry['file']}: {entry.get('path', '')} {entry['dtype']} "
               f"{tuple(entry['shape'])} {nbytes:,} bytes crc32={entry['crc32']:08x}")
    for entry in state_files(state):
        nbytes = (directory / entry["__npy__"]).stat().st_size
        total, count = total + nbytes, count + 1
        yield (f"  {entry['__npy__']}: {entry['dtype']} {tuple(entry['shape'])} "
               f"{nbytes:,} bytes crc32={entry['crc32']:08x}")
    if files is None:
        yield f"checksums verified: {count} file(s), {total:,} bytes"
    else:
        state_part = f" and {count} state file(s) ({total:,} bytes)" if count else ""
        yield (f"checked: the state's manifest{state_part} by checksum; the "
               f"{len(files[1])} data file(s) by their .npy headers (the data files change "
               "with every add, so they carry no checksum)")


def held_unit(manifest: dict[str, Any]) -> str:
    """What one slot of the checkpointed buffer holds: ``"transitions"`` for the
    transition buffers (one transition a slot), ``"steps"`` for the others."""
    from replaybuffer import registry
    from replaybuffer.buffers import TransitionReplayBuffer

    if manifest["storage"] == "tensorflow":  # the TF buffer: steps; never import TF here
        return "steps"
    cls = registry.buffer_class(manifest["buffer"], manifest["storage"])
    transitions = cls is not None and issubclass(cls, TransitionReplayBuffer)
    return "transitions" if transitions else "steps"


def state_files(state: Any) -> Iterator[dict[str, Any]]:
    """The ``state.*.npy`` entries (``{"__npy__": file, "shape", "dtype", "crc32"}``) of a
    manifest's state, in the order they appear."""
    if isinstance(state, dict) and "__npy__" in state:
        yield state
    elif isinstance(state, dict):
        for value in state.values():
            yield from state_files(value)
    elif isinstance(state, list):
        for value in state:
            yield from state_files(value)


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


STORAGES = ("numpy", "torch", "tensorflow", "mmap")
BENCH_WORKLOADS = ("control", "frames")
PEER_WORKLOADS = ("control", "frames", "prioritized", "prioritized-skewed", "pearl",
                  "tf-agents")
BENCH_MODES = """\
bench modes (one at a time; add --quick for a smoke run, --json FILE to keep the rows):
  replaybuffer bench               add_batch, get_next, as_dataset against the numpy limit
  replaybuffer bench --peers       the same workloads through cpprb, SB3, TorchRL,
                                   Tianshou, and Pearl's and TF-Agents' own buffers
  replaybuffer bench --sb3         RolloutBuffer and HERBuffer against Stable-Baselines3's
  replaybuffer bench --sb3-returns SB3 DQN's returns on CartPole, SB3's buffer vs ours
  replaybuffer bench --scale       sample cost against capacity (--plot PNG: and plot it)
  replaybuffer bench --checkpoint  save and load a large buffer while it is in use
  replaybuffer bench --processes   writer processes on one SharedReplayBuffer (--soak S)
  replaybuffer bench --ray         a RayReplayBuffer with 1, 2, 4, 8 shards
  replaybuffer bench --gpu         the torch storage on a CUDA device against TorchRL
"""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter,
                    argparse.RawDescriptionHelpFormatter):
    """Every option's default after its help; descriptions and epilogs kept as written."""


def build_parser() -> argparse.ArgumentParser:
    """The ``replaybuffer`` command's parser: subcommands demo, tutorial, bench, inspect."""
    parser = argparse.ArgumentParser(prog="replaybuffer", formatter_class=HelpFormatter,
                                     description="Experience replay for reinforcement learning.",
                                     epilog=BENCH_MODES)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser("demo", formatter_class=HelpFormatter,
                          help="the main job: train a DQN on CartPole-v1 from a replay buffer "
                          "fed by a driver, then evaluate it greedily")
    demo.add_argument("--steps", type=positive_int, default=50_000,
                      help="environment steps to train for")
    demo.add_argument("--seed", type=non_negative_int, default=0,
                      help="seeds the network, the environments and the buffer")
    demo.add_argument("--out", default="demo-out", metavar="DIR",
                      help="directory for learning_curve.png and result.json")
    demo.add_argument("--prioritized", action="store_true",
                      help="prioritized replay (PrioritizedReplayBuffer) instead of uniform; "
                           "with --actors, a prioritized SharedReplayBuffer; with --ray, "
                           "Ape-X style: prioritized shards, the actors send initial "
                           "priorities")
    demo.add_argument("--actors", type=positive_int, default=None, metavar="N",
                      help="collect with N actor processes writing into a shared buffer "
                           "(SharedReplayBuffer), the learner in this process; with --ray, "
                           "N Ray actors (2 if not given); neither: collect in this process")
    demo.add_argument("--ray", action="store_true",
                      help="collect with Ray actors (--actors of them) into a "
                           "RayReplayBuffer of as many shards")
    demo.add_argument("--compare", default=None, metavar="RESULT_JSON",
                      help="another run's result.json (e.g. the single-process demo's): "
                           "learning_curve.png draws its curves beside this run's, against "
                           "environment steps")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.set_defaults(func=_demo)

    tutorial = sub.add_parser("tutorial", formatter_class=HelpFormatter,
                              help="the TF-Agents replay-buffer tutorial, walked through in "
                              "replaybuffer's API")
    tutorial.add_argument("--storage", default="numpy", choices=["numpy", "torch"],
                          help="where the tutorial's buffer keeps its data")
    tutorial.set_defaults(func=_tutorial)

    bench = sub.add_parser("bench", formatter_class=HelpFormatter, epilog=BENCH_MODES,
                           help="throughput against the plain numpy limit, and against the "
                           "peer libraries (modes: --peers, --sb3, --scale, --checkpoint, "
                           "--processes, --ray, --gpu)")
    bench.add_argument("--storage", default="numpy,torch", type=comma_list(STORAGES),
                       help="comma-separated storage backends: numpy, torch, tensorflow, "
                       "mmap (files in a temporary directory)")
    bench.add_argument("--workloads", default="control,frames",
                       type=comma_list(BENCH_WORKLOADS),
                       help="comma-separated: control, frames (also with --gpu)")
    bench.add_argument("--quick", action="store_true",
                       help="small capacities and short timings (a smoke run)")
    bench.add_argument("--json", metavar="FILE", default=None,
                       help="also write the results as JSON to FILE")
    bench.add_argument("--peers", action="store_true",
                       help="run the control, frames and prioritized workloads through "
                            "cpprb, Stable-Baselines3, TorchRL and Tianshou where installed "
                            "(benchmarks/setup_peers.sh), beside ours and the numpy limit, "
                            "and TF-Agents' own buffers on its tutorial's workload in "
                            ".venv-tfagents (benchmarks/setup_tf_agents.sh)")
    bench.add_argument("--peer-workloads", default=",".join(PEER_WORKLOADS),
                       type=comma_list(PEER_WORKLOADS),
                       help="with --peers: comma-separated workloads (pearl: Pearl's own "
                            "buffers against compat.pearl, in .venv-pearl from "
                            "benchmarks/setup_pearl.sh; tf-agents: TF-Agents' own buffers "
                            "against compat.tf_agents, in .venv-tfagents from "
                            "benchmarks/setup_tf_agents.sh)")
    bench.add_argument("--sb3", action="store_true",
                       help="RolloutBuffer (add, GAE, minibatch epochs) and HERBuffer (add, "
                            "sample) against Stable-Baselines3's on the same data")
    bench.add_argument("--sb3-returns", action="store_true",
                       help="SB3 DQN on CartPole-v1 (RL-Zoo settings, 20k steps) with SB3's "
                            "buffer and ours over 10 seeds: greedy returns, mean, std and a "
                            "bootstrap 95%% CI of the difference (--quick: 1 seed, 1.5k steps)")
    bench.add_argument("--scale", action="store_true",
                       help="sample cost at capacities 10k, 100k, 1M, 10M (uniform, "
                            "prioritized, within episodes, both) against the numpy limit")
    bench.add_argument("--plot", nargs="?", const="bench-results/scale.png", default=None,
                       metavar="PNG", help="--scale, and plot it (PNG: "
                       "bench-results/scale.png if not given)")
    bench.add_argument("--checkpoint", action="store_true",
                       help="save a large buffer while a collector adds to it, then load it: "
                            "GB/s against a plain file copy, the longest add stall, peak "
                            "extra memory")
    bench.add_argument("--size-gb", type=positive_float, default=4.0,
                       help="with --checkpoint: the buffer's size in GB")
    bench.add_argument("--processes", action="store_true",
                       help="writer processes and a sampler on one SharedReplayBuffer "
                            "(1, 2, 4 writers), one process alone, and Reverb where "
                            "benchmarks/setup_reverb.sh installed it")
    bench.add_argument("--ray", action="store_true",
                       help="a RayReplayBuffer with 1, 2, 4, 8 shards and 4 collector tasks "
                            "on a local Ray cluster, beside one process alone")
    bench.add_argument("--seconds", type=positive_float, default=5.0,
                       help="with --processes or --ray: seconds per configuration")
    bench.add_argument("--soak", type=positive_float, default=None, metavar="SECONDS",
                       help="with --processes: the stress run (writers killed, every "
                            "sample checked) for SECONDS instead")
    bench.add_argument("--writers", type=count_list, default=None, metavar="N,N,...",
                       help="with --processes: the writer counts (default: 1,2,4)")
    bench.add_argument("--shards", type=count_list, default=None, metavar="N,N,...",
                       help="with --ray: the shard counts (default: 1,2,4,8)")
    bench.add_argument("--group-from-one-shard", action="store_true",
                       help="with --ray: each group of batches drawn from one shard "
                            "chosen by mass (as_dataset(group_from_one_shard=True))")
    bench.add_argument("--prioritized", action="store_true",
                       help="with --processes: a prioritized shared buffer")
    bench.add_argument("--profile", action="store_true",
                       help="with --gpu: count kernels, copies and synchronizations per "
                            "call, and compare with the goals")
    bench.add_argument("--gpu", action="store_true",
                       help="the torch storage on a CUDA device (sampling on the device) "
                            "against TorchRL's LazyTensorStorage there and the device's "
                            "memory bandwidth; exits 2 without CUDA")
    bench.add_argument("--device", default="cuda",
                       help="with --gpu: the torch device (cpu: a smoke run)")
    bench.set_defaults(func=_bench)

    inspect = sub.add_parser("inspect", formatter_class=HelpFormatter,
                             help="describe a checkpoint and verify its checksums "
                             "(exit status 1 when it is corrupt or incomplete)")
    inspect.add_argument("path", help="a checkpoint series (buffer.save's path), one "
                         "checkpoint directory, or the path of a buffer on mmap storage")
    inspect.add_argument("--json", action="store_true",
                         help="print the manifest of the checkpoint as JSON, and nothing "
                         "else (after the same checks)")
    inspect.set_defaults(func=_inspect)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``replaybuffer`` command with ``argv`` (``sys.argv[1:]`` if ``None``); its
    exit status. Invalid arguments exit with status 2 and a message, as argparse does."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "demo" and args.compare is not None and not Path(args.compare).is_file():
        parser.error(f"argument --compare: no such file: {args.compare!r} (give a demo "
                     "run's result.json)")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
