"""The command line: help, the demo's printed shapes, a bench smoke run, inspect."""

import argparse
import json
import subprocess
import time
import sys

import numpy as np
import pytest

import replaybuffer as rb
from replaybuffer import cli
from replaybuffer.cli import main
from replaybuffer_demos import tutorial


def test_help_lists_the_commands():
    out = subprocess.run([sys.executable, "-m", "replaybuffer", "--help"], capture_output=True,
                         text=True, check=True).stdout
    for command in ("demo", "tutorial", "bench", "inspect"):
        assert command in out


def test_demo_smoke_run_writes_its_outputs(tmp_path, capsys):
    # CI runs a short version; benchmarks/dqn_seeds.py shows the full run solves CartPole.
    assert main(["demo", "--steps", "1500", "--seed", "3", "--out", str(tmp_path),
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "greedy evaluation over 10 episodes" in out
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["config"]["steps"] == 1500 and result["config"]["seed"] == 3
    assert result["final_return"] > 0 and result["evaluations"]
    assert result["config"]["prioritized"] is False
    assert main(["demo", "--steps", "1500", "--out", str(tmp_path / "per"), "--no-progress",
                 "--prioritized"]) == 0
    assert json.loads((tmp_path / "per" / "result.json").read_text())["config"]["prioritized"]
    png = (tmp_path / "learning_curve.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


@pytest.mark.parametrize("storage", ["numpy", "torch"])
def test_demo_prints_the_tutorials_shapes(storage):
    lines = []
    result = tutorial.main(storage=storage, echo=lines.append)
    assert result["len_sample"] == 2
    assert result["iterator_shapes"] == [((4, 2, 3), ((4, 2, 5), (4, 2, 3, 2)))] * 3
    assert result["gather_all_shapes"] == ((32, 6, 3), ((32, 6, 5), (32, 6, 3, 2)))
    assert "Iterator trajectories:" in lines and "Trajectories from gather all:" in lines
    # Every printed value has a label: no bare "2".
    assert "2" not in lines
    assert "len(get_next(sample_batch_size=10, num_steps=1)) = 2 (a pair: items, info)" \
        in lines


def test_bench_quick_smoke(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--workloads", "control", "--storage", "numpy",
                 "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    ops = {(r["workload"], r["op"]) for r in results}
    assert ("control B=1", "add_batch") in ops and ("control B=32", "get_next(256)") in ops
    assert all(r["seconds"] > 0 and r["limit_seconds"] > 0 for r in results)
    reads = [r for r in results if r["op"] != "add_batch"]
    assert reads and all(r["record_limit_seconds"] > 0 for r in reads)
    out = capsys.readouterr().out
    assert "x numpy" in out and "x records" in out


@pytest.mark.parametrize("command", [["demo", "--steps", "64"], ["tutorial"],
                                     ["bench", "--quick"], ["bench", "--peers", "--quick"]])
def test_harness_commands_say_they_run_from_a_checkout(command, monkeypatch, capsys):
    # As from an installed wheel, which ships neither package.
    for package in ("replaybuffer_demos", "replaybuffer_bench"):
        monkeypatch.setitem(sys.modules, package, None)
        for name in [m for m in sys.modules if m.startswith(package + ".")]:
            monkeypatch.delitem(sys.modules, name)
    assert main(command) == 2
    err = capsys.readouterr().err
    assert f"replaybuffer {command[0]} runs from a checkout of the repository" in err
    assert "`make demo`" in err and "`make bench`" in err


def test_a_missing_dependency_of_the_harness_is_not_a_missing_harness(monkeypatch):
    def import_module(name):  # the harness is there; an optional dependency of it is not
        raise ModuleNotFoundError("No module named 'gymnasium'", name="gymnasium")

    monkeypatch.setattr(cli.importlib, "import_module", import_module)
    with pytest.raises(SystemExit, match="needs the demo extra"):
        main(["demo", "--steps", "64"])
    with pytest.raises(ModuleNotFoundError, match="gymnasium"):
        main(["bench", "--quick"])


def test_inspect(tmp_path, capsys):
    buf = rb.UniformReplayBuffer(rb.ArraySpec((2,), np.float32, "x"), 2, 3)
    buf.add_batch(np.zeros((2, 2), np.float32))
    buf.save(tmp_path / "c")
    assert main(["inspect", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "UniformReplayBuffer: batch_size=2 max_length=3 capacity=6" in out
    assert "steps=2/6" in out and "checksums verified" in out and "ckpt-000001" in out
    assert "frames=" not in out
    assert "leaf_000.npy" in out and f"{2 * 2 * 4 + 128:,} bytes" in out  # header + data
    leaf = rb.checkpoints(tmp_path / "c")[-1] / "leaf_000.npy"
    data = bytearray(leaf.read_bytes())
    data[-1] ^= 1
    leaf.write_bytes(bytes(data))
    assert main(["inspect", str(tmp_path / "c")]) == 1
    assert "leaf_000.npy) is corrupt" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "nothing")]) == 1


def test_bench_peers_quick_reports_every_peer(tmp_path, capsys):
    out = tmp_path / "peers.json"
    assert main(["bench", "--peers", "--quick", "--peer-workloads", "control",
                 "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    peers = {r["peer"] for r in rows}
    assert {"numpy limit", "numpy limit[records]", "replaybuffer", "cpprb", "sb3", "torchrl",
            "tianshou"} <= peers
    limits = [r for r in rows if r["peer"].startswith("numpy limit")]
    assert len(limits) == 6 and all(r["status"] == "ok" for r in limits)
    ours = [r for r in rows if r["peer"] == "replaybuffer"]
    assert {r["op"] for r in ours} == {"add(1)", "add(256)", "sample(256)+next"}
    assert all(r["status"] == "ok" and r["seconds_per_call"] > 0 for r in ours)
    # A peer that is missing is reported as such, never dropped.
    assert all(r["status"] == "ok" or r["status"].startswith(("not installed", "failed",
                                                                "unsupported"))
               for r in rows)
    assert "x ours" in capsys.readouterr().out


def test_bench_peers_reports_tf_agents_as_not_installed_without_its_venv(tmp_path,
                                                                         monkeypatch):
    from replaybuffer_bench import peers, tf_agents_seed

    monkeypatch.setenv("VENV_TFAGENTS", str(tmp_path / "missing"))
    rows = peers.run_peers(["tf-agents"], quick=True)
    assert [r["op"] for r in rows] == list(tf_agents_seed.peer_ops())
    assert all(r["peer"] == "tf-agents" and r["status"].startswith("not installed (")
               and ".venv-tfagents" in r["status"] for r in rows)


def test_bench_scale_smoke(tmp_path, capsys):
    from replaybuffer_bench import scale

    out, png = tmp_path / "scale.json", tmp_path / "scale.png"
    assert scale.main(["--capacities", "1000,4000", "--min-time", "0.005", "--plot",
                       str(png), "--json", str(out)]) == 0
    points = json.loads(out.read_text())
    assert {(p["kind"], p["capacity"]) for p in points} == {
        (k, c) for k in ("uniform", "prioritized", "episodes", "prioritized-episodes")
        for c in (1000, 4000)}
    assert all(p["seconds"] > 0 and p["limit_seconds"] > 0 for p in points)
    assert png.stat().st_size > 0
    assert "| numpy limit |" in capsys.readouterr().out


def test_bench_scale_buffers_are_full_and_prioritized_everywhere():
    from replaybuffer_bench import scale

    rng = np.random.default_rng(0)
    per = scale.filled("prioritized", 3000, rng)
    assert len(per) == 3000
    priorities = per.priorities(np.arange(3000))
    assert np.isfinite(priorities).all() and len(np.unique(priorities)) == 3000
    episodes = scale.filled("episodes", 3000, rng)
    items, _ = episodes.get_next(64, num_steps=20, within_episodes=True)
    # A window inside one episode holds at most one FIRST, and only at its start.
    assert (items["step_type"][:, 1:] != rb.StepType.FIRST).all()
    both = scale.filled("prioritized-episodes", 3000, rng)
    assert len(np.unique(both.priorities(np.arange(3000)))) == 3000
    items, _ = both.get_next(64, num_steps=20, within_episodes=True)
    assert (items["step_type"][:, 1:] != rb.StepType.FIRST).all()


def test_bench_sb3_smoke(tmp_path):
    """The SB3 comparison runs and checks that both buffers computed the same
    advantages (it raises otherwise)."""
    out = tmp_path / "sb3.json"
    assert main(["bench", "--sb3", "--quick", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert {(r["workload"], r["op"].split(" ")[0]) for r in rows} == {
        ("rollout", "add"), ("rollout", "GAE"), ("rollout", "one"), ("her", "add"),
        ("her", "sample(256)")}
    assert all(r["sb3_us"] > 0 and r["ours_us"] > 0 for r in rows)


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "replaybuffer", *argv], capture_output=True,
                          text=True)


def test_version():
    done = run_cli("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"replaybuffer {rb.__version__}"


def test_top_level_help_lists_the_bench_modes():
    out = run_cli("--help").stdout
    for mode in ("--peers", "--sb3", "--scale", "--checkpoint", "--processes", "--ray",
                 "--gpu", "--quick"):
        assert f"replaybuffer bench {mode}" in out or mode in out
    assert "replaybuffer bench --peers" in out and "replaybuffer bench --gpu" in out


def test_every_option_has_help_and_its_default():
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subparsers.choices.items():
        formatter = sub.formatter_class(prog=sub.prog)
        # ArgumentDefaultsHelpFormatter appends each option's default to its help.
        assert isinstance(formatter, argparse.ArgumentDefaultsHelpFormatter)
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"
            if action.option_strings:
                assert "%(default)" in formatter._get_help_string(action), \
                    f"{name} {action.option_strings}: its default is not shown"
    demo = " ".join(subparsers.choices["demo"].format_help().split())
    assert "(default: 0)" in demo and "(default: demo-out)" in demo
    assert "(default: 50000)" in demo
    assert "(default: numpy)" in " ".join(subparsers.choices["tutorial"].format_help().split())
    bench = " ".join(subparsers.choices["bench"].format_help().split())
    assert "(default: numpy,torch)" in bench and "(default: 5.0)" in bench


@pytest.mark.parametrize("argv, message", [
    (["demo", "--steps", "-5"], "argument --steps: must be a positive integer, got -5"),
    (["demo", "--steps", "0"], "argument --steps: must be a positive integer, got 0"),
    (["demo", "--seed", "x"], "argument --seed: must be an integer, got 'x'"),
    (["demo", "--seed", "-1"], "argument --seed: must be a non-negative integer, got -1"),
    (["demo", "--actors", "0"], "argument --actors: must be a positive integer, got 0"),
    (["tutorial", "--storage", "jax"], "argument --storage: invalid choice: 'jax'"),
    (["bench", "--seconds", "0"], "argument --seconds: must be a positive number, got 0"),
    (["bench", "--seconds", "soon"], "argument --seconds: must be a number, got 'soon'"),
    (["bench", "--size-gb", "-1"], "argument --size-gb: must be a positive number, got -1"),
    (["bench", "--soak", "nan"], "argument --soak: must be a positive number, got nan"),
    (["bench", "--storage", "numpy,cupy"], "argument --storage: expected a comma-separated "
     "list of numpy, torch, tensorflow, mmap; got 'numpy,cupy'"),
    (["bench", "--workloads", ""], "argument --workloads: expected a comma-separated list"),
    (["bench", "--writers", "1,0"], "argument --writers: expected a comma-separated list of "
     "positive integers; got '1,0'"),
    (["bench", "--shards", "two"], "argument --shards: expected a comma-separated list of "
     "positive integers; got 'two'"),
    (["bench", "--peer-workloads", "atari"], "argument --peer-workloads: expected"),
])
def test_invalid_arguments_exit_2_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("usage: replaybuffer")


def test_inspect_json_is_pure_json(tmp_path):
    buf = rb.UniformReplayBuffer(rb.ArraySpec((2,), np.float32, "x"), 2, 3)
    buf.add_batch(np.zeros((2, 2), np.float32))
    buf.save(tmp_path / "c")
    done = run_cli("inspect", str(tmp_path / "c"), "--json")
    assert done.returncode == 0
    manifest = json.loads(done.stdout)  # nothing before or after it
    assert manifest["buffer"] == "UniformReplayBuffer" and manifest["batch_size"] == 2
    assert manifest["state"]["last_id"] == 0


def test_inspect_counts_transitions_and_lists_state_files(tmp_path, capsys):
    buf = rb.TransitionReplayBuffer(rb.ArraySpec((2,), np.float32), rb.ArraySpec((), np.int64),
                                    100)
    for _ in range(3):
        buf.add(np.zeros((1, 2), np.float32), np.ones(1, np.int64), np.full(1, 0.5, np.float32),
                np.ones((1, 2), np.float32), np.zeros(1, bool), np.zeros(1, bool))
    buf.save(tmp_path / "t")
    assert main(["inspect", str(tmp_path / "t")]) == 0
    out = capsys.readouterr().out
    assert "transitions=3/100" in out and "steps=" not in out and "frames=" not in out
    directory = rb.checkpoints(tmp_path / "t")[-1]
    state = sorted(p.name for p in directory.glob("state.*.npy"))
    assert state and all(f"  {name}: " in out for name in state)
    files = len(list(directory.glob("*.npy")))
    assert f"checksums verified: {files} file(s)" in out


def test_inspect_names_stacked_frames(tmp_path, capsys):
    buf = rb.UniformReplayBuffer({"o": rb.ArraySpec((4, 8, 8), np.uint8)}, 1, 10,
                                 frame_stack="o")
    buf.add_batch({"o": np.zeros((1, 4, 8, 8), np.uint8)})
    buf.save(tmp_path / "f")
    assert main(["inspect", str(tmp_path / "f")]) == 0
    out = capsys.readouterr().out
    assert "steps=1/10" in out and "frame_stack='o'" in out and "frames in the ring" in out


def test_inspect_mmap_says_what_it_checked(tmp_path, capsys):
    buf = rb.UniformReplayBuffer(rb.ArraySpec((2,), np.float32, "x"), 2, 3, storage="mmap",
                                 path=tmp_path / "m")
    buf.add_batch(np.zeros((2, 2), np.float32))
    buf.flush()
    assert main(["inspect", str(tmp_path / "m")]) == 0
    out = capsys.readouterr().out
    assert "a buffer on mmap storage" in out and "data/header.npy" in out
    assert "checksums verified: 0" not in out and "0 bytes" not in out
    assert "checked: the state's manifest by checksum; the 3 data file(s) by their .npy " \
        "headers" in out


def test_bench_as_dataset_times_the_consumers_wait():
    """The dataset row pulls from a fresh iterator each round, so no prefetched element
    comes free: with two worker threads on at most two cores it cannot beat the numpy
    gather limit by more than the parallelism (the old timing, on one long-lived
    iterator, reported 1/100 of it)."""
    from replaybuffer_bench import workloads

    rows = list(workloads.run_workload("frames[84,84,4]", workloads.frames_spec(), 1, 2000,
                                       "numpy", (64,), 0.02))
    dataset = next(r for r in rows if r.op.startswith("as_dataset(64, 2"))
    assert dataset.ratio is not None and dataset.record_ratio is not None
    assert dataset.ratio > 0.5 and dataset.record_ratio > 0.5, dataset


def test_fresh_pulls_start_from_an_empty_queue():
    from replaybuffer_bench.workloads import FreshPulls

    class Slow:  # a producer that takes 20 ms an element
        def __iter__(self):
            while True:
                time.sleep(0.02)
                yield None

    pulls = FreshPulls(Slow(), 3)
    pulls()
    pulls()
    assert len(pulls.seconds) == 2 and min(pulls.seconds) >= 0.02


@pytest.mark.parametrize("argv, module, passed", [
    (["bench", "--processes", "--writers", "1,2,4,8,12", "--prioritized"],
     "replaybuffer_bench.processes", ["--writers", "1,2,4,8,12", "--prioritized"]),
    (["bench", "--ray", "--shards", "1,8"], "replaybuffer_bench.ray_bench",
     ["--shards", "1,8"]),
    (["bench", "--ray", "--workloads", "control"], "replaybuffer_bench.ray_bench",
     ["--workloads", "control"]),
    (["bench", "--ray", "--group-from-one-shard"], "replaybuffer_bench.ray_bench",
     ["--group-from-one-shard"]),
    (["bench", "--processes", "--workloads", "frames"], "replaybuffer_bench.processes",
     ["--workloads", "frames"]),
    (["bench", "--gpu", "--profile"], "replaybuffer_bench.gpu", ["--profile"]),
])
def test_bench_passes_its_mode_options_to_the_harness(monkeypatch, argv, module, passed):
    seen = {}

    class Harness:
        @staticmethod
        def main(args):
            seen["args"] = args
            return 0

    def harness(name):
        seen["module"] = name
        return Harness

    monkeypatch.setattr(cli, "harness", harness)
    assert main(argv) == 0
    assert seen["module"] == module
    args = seen["args"]
    for option in passed:
        assert option in args
    if "--writers" in passed:
        assert args[args.index("--writers") + 1] == "1,2,4,8,12"
