"""A seed system's own venv: finding its interpreter and running a benchmark module in it.

Pearl 0.4.1 needs numpy < 2 and gym 0.19, TF-Agents 0.19 needs TensorFlow 2.15: neither
can share this project's venv, so ``replaybuffer bench --peers`` runs
:mod:`~replaybuffer_bench.pearl_seed` and :mod:`~replaybuffer_bench.tf_agents_seed` in
``.venv-pearl`` and ``.venv-tfagents`` (built by ``benchmarks/setup_*.sh``), with this
source tree first on the path, and reads the JSON report they print.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["NotInstalled", "comparison_table", "run_report", "venv_python"]


class NotInstalled(Exception):
    """A seed's venv is missing (reported as ``not installed (...)``)."""


def venv_python(variable: str, name: str) -> Path | None:
    """The venv's interpreter: ``$variable`` or ``name`` at the root of this checkout;
    ``None`` when there is no executable Python there."""
    root = os.environ.get(variable)
    venv = Path(root) if root else Path(__file__).resolve().parents[3] / name
    python = venv / "bin" / "python"
    return python if python.is_file() and os.access(python, os.X_OK) else None


def run_report(python: Path, module: str, args: list[str],
               env: dict[str, str] | None = None) -> dict[str, Any]:
    """``python -m module --json - --quiet *args``'s report. From a checkout, this very
    source is put first on the path (an installed copy leaves the venv's own).

    Raises:
        RuntimeError: the module failed; the message ends with its last stderr line.
    """
    run_env = dict(os.environ, **(env or {}))
    src = Path(__file__).resolve().parents[2]
    if src.name == "src":
        run_env["PYTHONPATH"] = str(src)
    done = subprocess.run([str(python), "-m", module, "--json", "-", "--quiet", *args],
                          capture_output=True, text=True, env=run_env, timeout=1800)
    if done.returncode != 0:
        tail = " ".join(done.stderr.strip().splitlines()[-1:]) or f"exit {done.returncode}"
        raise RuntimeError(f"{python} -m {module}: {tail}")
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def comparison_table(rows: list[tuple[str, float | None, float | None, float | None, str]],
                     theirs: str, markdown: bool = False) -> str:
    """A seed's ops side by side: ``rows`` of ``(op, their seconds, our seconds, ours /
    theirs, status)`` (``None`` where an op did not run), as aligned text or markdown."""
    header = ("op", f"{theirs} us", "ours us", f"ours / {theirs}", "status")
    cells = [(name, "" if t is None else f"{t * 1e6:,.1f}",
              "" if o is None else f"{o * 1e6:,.1f}",
              "" if ratio is None else f"{ratio:.2f}", status)
             for name, t, o, ratio, status in rows]
    if markdown:
        out = ["| " + " | ".join(header) + " |", "|---|---:|---:|---:|---|"]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in line) + " |"
                for line in cells]
        return "\n".join(out)
    table = [header, *cells]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    text = ["  ".join(c.rjust(w) if 0 < i < 4 else c.ljust(w)
                      for i, (c, w) in enumerate(zip(row, widths))).rstrip() for row in table]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(text)
