"""A compiled kernel's numba cache entry is discarded when a kernel it calls, in another
module, changes (``sampling/kernel_cache.py``, used by ``tree_kernels.compile_kernel``):
numba keys an entry on its own file's stamp only. Each step runs in a fresh process
over a temporary two-module package, as a working tree's edits are seen."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numba")

from kernel_package import CALLEE, environment, make_package, write  # noqa: E402

OTHER = """
import numba

@numba.njit(cache=True)
def triple(x):  # a user's own cached function, not ours
    return x * 3
"""

RUN = """
import kernels.caller, kernels.other
from replaybuffer.sampling import tree_kernels
assert tree_kernels.AVAILABLE
value, other = kernels.caller.twice(1), kernels.other.triple(2)
hits = sum(kernels.caller.twice.stats.cache_hits.values())
print(value, other, hits)
"""


def run(root: Path) -> tuple[int, int, int]:
    done = subprocess.run([sys.executable, "-c", RUN], cwd=root, env=environment(root),
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    value, other, hits = (int(v) for v in done.stdout.split())
    return value, other, hits


def test_a_changed_callee_in_another_module_is_not_run_from_a_stale_cache(tmp_path):
    package = make_package(tmp_path, increment=1)
    write(package / "other.py", OTHER)
    assert run(tmp_path) == (3, 6, 0)  # compiled, and saved
    assert run(tmp_path) == (3, 6, 1)  # loaded from the cache: it is still used
    cache = package / "__pycache__"
    others = {p.name: (p.stat().st_mtime_ns, p.read_bytes())
              for p in cache.iterdir() if p.name.startswith("other.")}
    assert any(name.endswith(".nbi") for name in others)

    write(package / "callee.py", CALLEE.format(increment=10))  # caller.py unchanged
    assert run(tmp_path) == (21, 6, 0)  # recompiled against the new callee
    assert run(tmp_path) == (21, 6, 1)  # and cached again
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes())
            for p in cache.iterdir() if p.name.startswith("other.")} == others
