"""Run by `make release-check` with the fresh venv's interpreter, from outside the
checkout (python -I), with the wheel installed without extras: the installed wheel must be
what is imported, carry its typing marker and one version, hold the library and nothing
else (the benchmark harness and the demos run from a checkout), and do a buffer's whole
life with numpy and optree alone: build, fill, sample, save, load, and `replaybuffer
inspect` the checkpoint. `replaybuffer demo`, `tutorial` and `bench` must exit 2 and say
to run them from a checkout."""

import importlib.util
import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np

import replaybuffer as rb

package = Path(rb.__file__).parent
assert "site-packages" in package.parts, f"imported from {package}, not the installed wheel"
assert (package / "py.typed").is_file(), "py.typed is missing from the wheel"
assert rb.__version__ == metadata.version("replaybuffer"), \
    f"__version__ {rb.__version__} != metadata {metadata.version('replaybuffer')}"

# The wheel holds the library only.
files = [str(f) for f in metadata.files("replaybuffer") or []]
# (RECORD also names the dist-info and, as ../../bin/replaybuffer, the console script.)
top = sorted({f.split("/")[0] for f in files if not f.startswith(("replaybuffer-", ".."))})
assert top == ["replaybuffer"], f"the wheel installs {top}, not the library alone"
for harness in ("replaybuffer_bench", "replaybuffer_demos"):
    assert importlib.util.find_spec(harness) is None, f"{harness} is importable from the wheel"
for optional in ("torch", "tensorflow", "gymnasium", "ray"):
    # Installed without extras: what follows runs on numpy and optree alone.
    assert importlib.util.find_spec(optional) is None, f"{optional} is installed"

# A buffer's life: build, fill (wrapping around), sample, save, load.
spec = {"obs": rb.ArraySpec((3,), np.float32, "obs"), "step": rb.ArraySpec((), np.int64)}
buffer = rb.UniformReplayBuffer(spec, batch_size=2, max_length=4, seed=0)
for t in range(6):
    buffer.add_batch({"obs": np.full((2, 3), t, np.float32), "step": np.full(2, t)})
items, info = buffer.get_next(sample_batch_size=5, num_steps=2)
assert items["obs"].shape == (5, 2, 3) and info.ids.shape == (5, 2)
assert ((items["step"][:, 1] - items["step"][:, 0]) == 1).all()  # consecutive steps
assert (items["step"] >= 2).all()  # steps 0 and 1 were overwritten
saved = buffer.save("release-smoke/checkpoint")
loaded = rb.load("release-smoke/checkpoint")
assert type(loaded) is type(buffer) and len(loaded) == len(buffer) == 8
ours, _ = buffer.get_next(sample_batch_size=64)
theirs, _ = loaded.get_next(sample_batch_size=64)
assert ours["step"].tolist() == theirs["step"].tolist(), "the loaded buffer samples otherwise"
whole = loaded.gather_all()  # [batch_size, items_per_row] per leaf, oldest first
assert whole["step"].tolist() == [[2, 3, 4, 5], [2, 3, 4, 5]], whole["step"]

# The command line: inspect works from the wheel; the harness commands say where they run.
script = str(Path(sys.executable).with_name("replaybuffer"))
inspected = subprocess.run([script, "inspect", "release-smoke/checkpoint"],
                           capture_output=True, text=True, check=True).stdout
assert "UniformReplayBuffer: batch_size=2 max_length=4 capacity=8" in inspected, inspected
assert "checksums verified" in inspected and saved.name in inspected, inspected
manifest = json.loads(subprocess.run([script, "inspect", "release-smoke/checkpoint", "--json"],
                                     capture_output=True, text=True, check=True).stdout)
assert manifest["state"]["last_id"] == 5, manifest["state"]
for command in (["demo", "--steps", "64", "--no-progress"], ["tutorial"], ["bench", "--quick"]):
    run = subprocess.run([script, *command], capture_output=True, text=True)
    assert run.returncode == 2, (command, run.returncode, run.stdout, run.stderr)
    assert "runs from a checkout of the repository" in run.stderr, run.stderr
    assert "make demo" in run.stderr and "make bench" in run.stderr, run.stderr

print(f"release smoke: replaybuffer {rb.__version__} from {package}: the library alone; "
      f"built, filled, sampled, saved and loaded a buffer ({saved.name}); inspect verified "
      "it; demo, tutorial and bench exit 2 with the checkout message")
