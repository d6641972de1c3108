"""Run by `make release-check` with the fresh venv's interpreter, from outside the
checkout (python -I): the installed wheel must be what is imported, carry its typing
marker and one version, and run the demo."""

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

buffer = rb.UniformReplayBuffer(rb.ArraySpec((3,), np.float32, "obs"), batch_size=2,
                                max_length=4)
buffer.add_batch(np.ones((2, 3), np.float32))
items, info = buffer.get_next(sample_batch_size=5)
assert items.shape == (5, 3) and info.ids.shape == (5,)

script = Path(sys.executable).with_name("replaybuffer")
subprocess.run([str(script), "demo", "--steps", "4096", "--no-progress", "--out",
                "release-demo"], check=True)
result = json.loads(Path("release-demo/result.json").read_text())
assert result["steps_trained"] == 4096, result["steps_trained"]
assert Path("release-demo/learning_curve.png").stat().st_size > 0
print(f"release smoke: replaybuffer {rb.__version__} from {package}: demo trained "
      f"{result['steps_trained']} steps, last network {result['last_network_return']:.1f}")
