"""The documentation site and the README: every Python example runs, and the site builds.

Each ```python block of ``docs/**/*.md`` and of ``README.md`` is executed; the blocks of one page run in
order in one namespace (a page may build an example up), in a fresh temporary working
directory. A block preceded by the line ``<!-- no-test -->`` is skipped: only for code
that needs a Ray cluster, processes started by ``spawn`` from a real module, or a long
training run.

The site itself is built with ``mkdocs build --strict`` (warnings are errors), as CI
builds it, with ray, tensorflow and torch made unimportable: the API reference is
generated from the source statically.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import traceback
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
NO_TEST = "<!-- no-test -->"
OPEN = re.compile(r"^(\s*)```python\s*$")
# Optional dependencies: a page whose example needs one that is missing is skipped.
OPTIONAL = {"torch", "tensorflow", "gymnasium", "ray", "stable_baselines3", "tensordict",
            "torchrl"}
# Opt-outs are for what cannot run here; keep them few.
MAX_OPT_OUTS = 6
README = ROOT / "README.md"
README_MAX_LINES = 250
README_MAX_OPT_OUTS = 1  # the Ray example: it needs a cluster


def python_blocks(page: Path) -> list[tuple[int, str, bool]]:
    """``(line number, code, skipped)`` of every ```python block of ``page``."""
    lines = page.read_text().splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        match = OPEN.match(lines[i])
        if not match:
            i += 1
            continue
        indent, start = match.group(1), i + 1
        previous = next((line.strip() for line in reversed(lines[:i]) if line.strip()), "")
        body = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        if i == len(lines):
            raise AssertionError(f"{page}:{start}: unclosed ```python block")
        blocks.append((start + 1, textwrap.dedent("\n".join(body)), previous == NO_TEST))
        i += 1
    return blocks


PAGES = sorted(p for p in DOCS.rglob("*.md") if python_blocks(p))


def test_pages_have_examples():
    assert len(PAGES) >= 15, [str(p.relative_to(DOCS)) for p in PAGES]


def test_opt_outs_are_few():
    skipped = [f"{p.relative_to(DOCS)}:{line}" for p in PAGES
               for line, _, skip in python_blocks(p) if skip]
    assert len(skipped) <= MAX_OPT_OUTS, skipped


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_page_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    run_blocks(page, tmp_path, monkeypatch)


def test_readme_is_short_and_its_examples_run(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch):
    lines = README.read_text().splitlines()
    assert len(lines) < README_MAX_LINES, len(lines)
    blocks = python_blocks(README)
    assert len(blocks) >= 8  # one example per buffer family at least
    assert sum(skip for _, _, skip in blocks) <= README_MAX_OPT_OUTS
    run_blocks(README, tmp_path, monkeypatch, blocks_may_skip=True)


def test_readme_links_resolve():
    """Every relative link of the README names a file of the repository."""
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text()):
        if "://" in target:
            continue
        assert (ROOT / target).exists(), target


def run_blocks(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
               blocks_may_skip: bool = False) -> None:
    """Run the ```python blocks of ``page`` in order in one namespace, in ``tmp_path``.

    A page skips (``pytest.skip``) at its first block that needs a missing optional
    dependency; with ``blocks_may_skip`` (the README, whose blocks each stand on the
    blocks before them, not on the optional ones) only that block is skipped and the
    rest still run."""
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__main__"}
    missing_for: list[str] = []
    for line, code, skipped in python_blocks(page):
        if skipped:
            continue
        name = f"{page.relative_to(ROOT)}:{line}"
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                exec(compile(code, name, "exec"), namespace)
            except Exception as exc:
                missing = (exc.name or "").split(".")[0] \
                    if isinstance(exc, ModuleNotFoundError) else None
                if missing in OPTIONAL:
                    if not blocks_may_skip:
                        pytest.skip(f"{name} needs {missing}")
                    missing_for.append(f"{name} needs {missing}")
                    continue
                # The page line that raised: the block's first line + the frame's line.
                frames = [f for f in traceback.extract_tb(exc.__traceback__)
                          if f.filename == name]
                where = f"{page.relative_to(ROOT)}:{line + frames[-1].lineno - 1}" \
                    if frames else name
                raise AssertionError(f"the example at {where} raised "
                                     f"{type(exc).__name__}: {exc}") from exc
    if missing_for:
        pytest.skip("; ".join(missing_for))


# ------------------------------------------------------------------------ the site
BLOCKED = ("ray", "tensorflow", "torch")
EXTERNAL = re.compile(r"""<(?:link|script|img|iframe|source)\b[^>]*\b(?:href|src)=["']?"""
                      r"""(?:https?:)?//""", re.IGNORECASE)


def test_mkdocs_build_strict(tmp_path: Path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    pytest.importorskip("material")
    # Packages that the build must not import (griffe reads the source statically).
    blocked = tmp_path / "blocked"
    for name in BLOCKED:
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(
            f"raise ImportError('the docs build imported {name}')\n")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1",
               PYTHONPATH=os.pathsep.join([str(blocked), str(ROOT / "src"),
                                           os.environ.get("PYTHONPATH", "")]))
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "--site-dir", str(site)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    pages = list(site.rglob("*.html"))
    assert len(pages) > 20
    # Nothing on a page loads from the network (fonts, scripts, styles, images).
    fetched = {str(p.relative_to(site)): EXTERNAL.findall(p.read_text()) for p in pages}
    assert not {k: v for k, v in fetched.items() if v}


# ------------------------------------------------------------ the README's two commands
def make_dry_run(tmp_path: Path, target: str, *stamps: str) -> str:
    """``make -n target`` in a copy of the Makefile and pyproject.toml, with ``stamps``
    (paths under .venv) present and newer than both."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / ".venv" / "bin").mkdir(parents=True, exist_ok=True)
    for stamp in stamps:
        path = tmp_path / ".venv" / stamp
        path.touch()
        os.utime(path, (time.time() + 10, time.time() + 10))
    done = subprocess.run([make, "-n", target], cwd=tmp_path, capture_output=True,
                          text=True, check=True)
    return done.stdout


def test_make_demo_installs_the_demo_extra_only(tmp_path: Path):
    out = make_dry_run(tmp_path, "demo")
    installs = [line for line in out.splitlines() if "pip install" in line]
    assert "torch==" in installs[-2]  # the torch pin first
    assert installs[-1].endswith("-e '.[demo]'")
    assert "tensorflow" not in out and "touch .venv/.installed-demo" in out


def test_make_test_installs_everything_even_after_make_demo(tmp_path: Path):
    out = make_dry_run(tmp_path, "test", ".installed-demo")
    assert "tensorflow,ray,torchrl" in out and "touch .venv/.installed" in out
    assert "lint-imports" in out and "-m pytest -q" in out


def test_make_demo_reuses_the_full_install(tmp_path: Path):
    out = make_dry_run(tmp_path, "demo", ".installed")
    assert "pip install" not in out and "replaybuffer demo" in out
