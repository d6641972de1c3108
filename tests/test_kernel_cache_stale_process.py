"""A process that imported a kernel's callee before it was edited never saves a compiled
kernel under the stamps a newer process recorded (``sampling/kernel_cache.py``): on
324fdec such a process, compiling a *new* signature after the edit (a call with new
argument types, or ``tree_kernels.direct_entry``), saved its old machine code into the
entry a newer process had validated, and a later process loaded it. Each step runs in a
fresh process over a temporary two-module package, as a working tree's edits are seen
(as ``test_kernel_cache.py``)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("numba")

from kernel_package import CALLEE, environment, make_package, write  # noqa: E402

# argv: a value to call twice with (int or float); then, if given, a file to wait for
# and a second value to call it with after it appears (a new signature, compiled then).
RUN = """
import os, sys, time
import kernels.caller
from replaybuffer.sampling import tree_kernels
assert tree_kernels.AVAILABLE

def call(text):
    value = float(text) if "." in text else int(text)
    twice = kernels.caller.twice
    print(twice(value), sum(twice.stats.cache_hits.values()), flush=True)

call(sys.argv[1])
if len(sys.argv) > 2:
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.05)
    call(sys.argv[3])
"""


def run(root: Path, value: str) -> tuple[str, int]:
    done = subprocess.run([sys.executable, "-c", RUN, value], cwd=root,
                          env=environment(root), capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr
    result, hits = done.stdout.split()
    return result, int(hits)


def test_an_old_process_s_new_signature_is_not_loaded_by_a_later_process(tmp_path):
    package = make_package(tmp_path, increment=1)
    go = tmp_path / "go"
    old = subprocess.Popen([sys.executable, "-c", RUN, "1", str(go), "1.0"], cwd=tmp_path,
                           env=environment(tmp_path), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        assert old.stdout is not None
        assert old.stdout.readline().split() == ["3", "0"]  # compiled against step + 1
        time.sleep(0.01)  # (a later modification time, whatever the clock's grain)
        write(package / "callee.py", CALLEE.format(increment=10))
        assert run(tmp_path, "1") == ("21", 0)  # a new process: recompiled, saved
        go.touch()  # the old process now compiles twice(float) with its step + 1
        out, err = old.communicate(timeout=240)
    finally:
        old.kill()
    assert old.returncode == 0, err
    assert out.split() == ["3.0", "0"]  # its own (old) code, as Python's modules are
    # A later process: the edited callee's code for both signatures, never the old one.
    assert run(tmp_path, "1.0")[0] == "21.0"
    assert run(tmp_path, "1") == ("21", 1)  # the new process's entry is still used
