"""The names a checkpoint series uses on disk, and the format's version.

A series under ``path`` holds ``ckpt-NNNNNN`` directories (complete checkpoints), each
with a ``manifest.json``, and ``.tmp-PID-XXXX`` / ``.trash-PID-NAME`` directories of
saves and removals under way (or abandoned by a killed process).
"""

from __future__ import annotations

from pathlib import Path

FORMAT = "replaybuffer"
"""The ``format`` field of every manifest."""
VERSION = 2
"""The format version this code writes."""
READS = (1, 2)
"""Format versions this code loads: 1 kept a single save in the directory itself."""
MANIFEST = "manifest.json"
"""The file that describes one checkpoint; written last, so its presence means done."""
CHECKPOINT = "ckpt-"
"""Prefix of a complete checkpoint's directory (``ckpt-000001``)."""
TMP, TRASH = ".tmp-", ".trash-"
"""Prefixes of a save under way and of a checkpoint being removed."""


MMAP_STATE, MMAP_DATA = "state", "data"
"""The directories of a buffer on mmap storage (``storage="mmap", path=...``): its state,
a one-checkpoint series, and its data files."""


def mmap_buffer_root(path: Path) -> Path | None:
    """The directory of the buffer on mmap storage that ``path`` is (or is the data
    directory of), or ``None``: for the messages that point to ``replaybuffer.reopen``."""
    for root in (path, path.parent):
        if (root / MMAP_STATE).is_dir() and (root / MMAP_DATA).is_dir() and \
                (root == path or path.name == MMAP_DATA):
            return root
    return None


def stream_files(name: str, count: int) -> list[str]:
    """The file names of a stream of ``count`` arrays: ``leaf_000.npy`` ... for the
    storage's leaves (stream ``"leaves"``), ``NAME_000.npy`` ... for any other."""
    prefix = "leaf" if name == "leaves" else name
    return [f"{prefix}_{i:03d}.npy" for i in range(count)]
