"""``import replaybuffer`` needs numpy and optree alone."""

import subprocess
import sys


def test_import_does_not_pull_optional_dependencies():
    code = ("import sys, replaybuffer, replaybuffer.compat.tf_agents, replaybuffer.cli\n"
            "heavy = [m for m in ('torch', 'gymnasium', 'tensorflow', 'ray', 'matplotlib')"
            " if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_numpy_buffer_works_with_torch_hidden():
    # A machine without torch: make `import torch` fail and use the numpy path.
    code = ("import sys; sys.modules['torch'] = None\n"
            "import numpy as np, replaybuffer as rb\n"
            "b = rb.UniformReplayBuffer(rb.ArraySpec((2,), np.float32), 1, 4)\n"
            "b.add_batch(np.zeros((1, 2), np.float32)); b.get_next(3)\n"
            "try:\n"
            "    rb.UniformReplayBuffer(rb.ArraySpec((2,), np.float32), 1, 4, storage='torch')\n"
            "except ImportError as e:\n"
            "    assert 'replaybuffer[torch]' in str(e)\n"
            "else:\n"
            "    raise SystemExit('torch storage without torch')\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_tensorflow_storage_without_tensorflow_says_what_to_install():
    code = ("import sys; sys.modules['tensorflow'] = None\n"
            "import numpy as np, replaybuffer as rb\n"
            "for kwargs in ({}, {'track_episodes': True}):\n"
            "    try:\n"
            "        rb.UniformReplayBuffer({'step_type': rb.ArraySpec((), np.int32)}, 1, 4,\n"
            "                               storage='tensorflow', **kwargs)\n"
            "    except ImportError as e:\n"
            "        assert 'replaybuffer[tensorflow]' in str(e), e\n"
            "    else:\n"
            "        raise SystemExit('tensorflow storage without tensorflow')\n")
    subprocess.run([sys.executable, "-c", code], check=True)
