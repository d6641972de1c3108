"""A temporary two-module package of compiled kernels for the numba cache tests
(``test_kernel_cache*.py``): ``kernels.caller.twice`` calls ``kernels.callee.step``, a
kernel in another module, whose increment a test edits between fresh processes, as a
working tree's edits are seen."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

CALLEE = """
from replaybuffer.sampling.tree_kernels import compile_kernel

@compile_kernel
def step(x):
    return x + {increment}
"""

CALLER = """
from replaybuffer.sampling.tree_kernels import compile_kernel
from kernels.callee import step

@compile_kernel
def twice(x):
    return step(step(x))
"""


def write(path: Path, text: str) -> None:
    path.write_text(textwrap.dedent(text))


def make_package(root: Path, increment: int) -> Path:
    """``root/kernels`` with ``callee.py`` (``step(x) = x + increment``) and
    ``caller.py``; returns the package's directory."""
    package = root / "kernels"
    package.mkdir()
    write(package / "__init__.py", "")
    write(package / "callee.py", CALLEE.format(increment=increment))
    write(package / "caller.py", CALLER)
    return package


def environment(root: Path) -> dict[str, str]:
    """This process's environment for a child that imports the package under ``root``
    and this checkout's ``src``, numba's cache where numba puts it by default."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_CACHE_DIR", "NUMBA_DISABLE_JIT", "REPLAYBUFFER_NUMBA")}
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(SRC)])
    return env
