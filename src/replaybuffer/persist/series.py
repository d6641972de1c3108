"""A series of checkpoints in one directory: publish the next, prune old ones, list
them, find the newest.

A checkpoint is published by renaming its complete temporary directory to the next
free ``ckpt-N`` (atomic); old ones are renamed aside before they are removed, so a
kill mid-removal never leaves a half-deleted ``ckpt-N``. Directories of processes
that no longer run (abandoned saves and removals) are removed by the next save.

Readers and savers share a series without locks: a reader picks the newest checkpoint,
and a save into the series may publish a newer one and prune the reader's before it has
opened every file. :func:`read_newest` then reads the checkpoint that is newest by then
(a few times at most), so "load the newest complete checkpoint" holds while another
process saves.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

try:  # POSIX: readers pin the checkpoint they read (below); elsewhere they retry
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

from replaybuffer.crash_points import ARMED, crash_point
from replaybuffer.errors import CheckpointError
from replaybuffer.persist.durable import sync_directory
from replaybuffer.persist.layout import CHECKPOINT, MANIFEST, TMP, TRASH, mmap_buffer_root

T = TypeVar("T")

PRUNED_RETRIES = 10
"""How many checkpoints :func:`read_newest` tries when each is pruned while it reads: a
save publishes and prunes in milliseconds, so a small checkpoint is lost to a pruning
about one read in six under a saver in a tight loop; ten in a row means the saver
replaces checkpoints faster than they can be read."""


def publish(tmp: Path, root: Path) -> Path:
    """Rename a complete checkpoint to the next free ``ckpt-N`` (atomic)."""
    while True:
        seq = max((sequence(p) for p in root.iterdir()), default=0) + 1
        final = root / f"{CHECKPOINT}{seq:06d}"
        if ARMED is not None:
            crash_point("checkpoint.publish.before_rename")
        try:
            os.rename(tmp, final)  # a checkpoint is never empty, so this never replaces one
        except OSError:
            if final.exists():  # another process published the same number first
                continue
            raise
        sync_directory(root)
        return final


def save_into(root: Path, keep: int, write: Callable[[Path], None]) -> Path:
    """Add a checkpoint to the series at ``root`` (made if missing): ``write`` fills a
    temporary directory in it, which is then published as the next ``ckpt-N``; the
    series is pruned to ``keep``. What an earlier dead saver left is removed first.

    Returns:
        The new checkpoint's directory.

    Raises:
        CheckpointError: a file system error (the message names ``root`` and the
            error); the series is as it was, the temporary directory removed.
    """
    tmp = None
    try:
        root.mkdir(parents=True, exist_ok=True)
        remove_abandoned(root)
        tmp = Path(tempfile.mkdtemp(prefix=f"{TMP}{os.getpid()}-", dir=root))
        write(tmp)
        final = publish(tmp, root)
        tmp = None
        prune(root, keep)
    except OSError as exc:
        raise CheckpointError(f"cannot save to {root}: {exc}") from exc
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def prune(root: Path, keep: int) -> None:
    """Remove all but the newest ``keep`` checkpoints, each renamed aside first."""
    done = checkpoints(root)
    legacy = (root / MANIFEST).is_file()
    excess = len(done) + legacy - keep
    if excess > 0 and legacy:  # a format-1 save at the top: the oldest
        _remove_legacy(root)
        excess -= 1
    for old in done[:max(0, excess)]:
        trash = root / f"{TRASH}{os.getpid()}-{old.name}"
        with _locked(old, exclusive=True) as free:
            if not free:  # a load is reading it: the next save prunes it
                continue
            try:
                os.rename(old, trash)
            except FileNotFoundError:  # another process saving here pruned it first
                continue
        if ARMED is not None:
            crash_point("checkpoint.prune.renamed")
        shutil.rmtree(trash, ignore_errors=True)


@contextmanager
def _locked(directory: Path, exclusive: bool) -> Iterator[bool]:
    """A ``flock`` on ``directory`` for the context: shared (a load pins the checkpoint
    it reads; waits for a prune in progress) or exclusive without waiting (a prune:
    ``False`` when a load holds it). ``False`` too when ``directory`` is gone or was
    renamed aside before the lock took."""
    if fcntl is None:
        yield True
        return
    try:
        fd = os.open(directory, os.O_RDONLY)
    except FileNotFoundError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB if exclusive else fcntl.LOCK_SH)
        except BlockingIOError:
            yield False
            return
        try:
            here = os.stat(directory).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            here = False
        yield here
    finally:
        os.close(fd)


def _remove_legacy(root: Path) -> None:
    """Remove a format-1 save's files from ``root``, its manifest first (so that a
    kill midway leaves no manifest pointing at missing files)."""
    manifest = json.loads((root / MANIFEST).read_text())
    (root / MANIFEST).unlink()
    names = [e.get("file") for e in manifest.get("leaves", []) if isinstance(e, dict)]
    names += [p.name for p in root.glob("state*.npy")]
    for name in names:
        if isinstance(name, str) and "/" not in name and (root / name).is_file():
            (root / name).unlink()


def remove_abandoned(root: Path) -> None:
    """Remove temporary and trash directories of processes that no longer run."""
    for entry in root.iterdir():
        if entry.is_dir() and entry.name.startswith((TMP, TRASH)):
            pid = entry.name.split("-")[1]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def sequence(entry: Path) -> int:
    """The number of a ``ckpt-N`` directory name, 0 for any other name."""
    name = entry.name
    if name.startswith(CHECKPOINT) and name[len(CHECKPOINT):].isdigit():
        return int(name[len(CHECKPOINT):])
    return 0


def checkpoints(path: str | os.PathLike[str]) -> list[Path]:
    """The complete checkpoints under ``path``, oldest first (``[]`` if there are none)."""
    root = Path(path)
    if not root.is_dir():
        return []
    for _ in range(PRUNED_RETRIES):
        listed = [p for p in root.iterdir() if sequence(p) > 0]
        found = [p for p in listed if (p / MANIFEST).is_file()]
        # A checkpoint pruned between the listing and the check (its newer one published
        # after the listing): list again, or a series that always holds one would seem
        # to hold none.
        if all(p.exists() for p in listed if p not in found):
            break
    return sorted(found, key=sequence)


def is_checkpoint_root(root: Path) -> bool:
    """Empty, or holding checkpoints, saves under way, or a format-1 save."""
    return all(sequence(p) > 0 or p.name.startswith((TMP, TRASH)) for p in root.iterdir()) \
        or (root / MANIFEST).is_file()


def read_newest(path: str | os.PathLike[str], read: Callable[[Path], T]) -> T:
    """``read(directory)`` of the checkpoint that ``path`` names (:func:`resolve`),
    pinned while it is read: a save into the series does not prune it then (it goes at
    a later save). Should a save prune it between finding and pinning it, ``read`` the
    then-newest one, up to :data:`PRUNED_RETRIES` checkpoints. Errors of a checkpoint still there (a corrupt
    file) are raised at once.

    Raises:
        CheckpointError: what ``read`` or :func:`resolve` raise, or every checkpoint
            tried was pruned while it was read.
    """
    root = Path(path)
    last: BaseException | None = None
    for _ in range(PRUNED_RETRIES):
        directory = resolve(root)
        with _locked(directory, exclusive=False) as pinned:  # a save's prune skips it while read
            if not pinned:  # pruned between finding it and pinning it
                continue
            try:
                return read(directory)
            except (CheckpointError, OSError) as exc:
                if directory == root or directory.exists():  # not pruned: the error stands
                    raise
                last = exc
    raise CheckpointError(f"cannot read {root}: its newest checkpoint was pruned by a save "
                          f"into the series while it was read, {PRUNED_RETRIES} times in a "
                          "row; have the saver keep more (save(path, keep=2)) so that a "
                          "checkpoint outlives a read") from last


def resolve(path: str | os.PathLike[str]) -> Path:
    """The checkpoint directory that ``path`` names: the newest complete checkpoint of a
    series, or ``path`` itself when it holds a manifest (one checkpoint, or a format-1
    save). Raises :class:`CheckpointError` when there is none."""
    root = Path(path)
    if not root.exists():
        raise CheckpointError(f"no checkpoint at {root}: the path does not exist (pass the "
                              "directory given to buffer.save)")
    if not root.is_dir():
        raise CheckpointError(f"{root} is a file, not a checkpoint: pass the directory "
                              "given to buffer.save (it holds ckpt-NNNNNN directories)")
    done = checkpoints(root)
    if done:
        return done[-1]
    if (root / MANIFEST).is_file():
        return root
    mmap_root = mmap_buffer_root(root)
    if mmap_root is not None:
        raise CheckpointError(f"{mmap_root} is a buffer on mmap storage, not a checkpoint: "
                              f"reopen it with replaybuffer.reopen({str(mmap_root)!r})")
    partial = [p.name for p in root.iterdir() if p.name.startswith(TMP)]
    raise CheckpointError(f"{root} holds no {MANIFEST}: not a replaybuffer save, or an "
                          "incomplete one" + (f" ({len(partial)} incomplete save(s) ignored: "
                                               f"{', '.join(sorted(partial))})"
                                               if partial else ""))


def checked_save_arguments(path: str | os.PathLike[str], keep: Any, metadata: Any
                           ) -> tuple[Path, dict[str, Any]]:
    """A save's ``path``, ``keep`` and ``metadata`` checked before anything is written:
    ``(root, metadata)``, ``metadata`` ``{}`` when ``None``.

    Raises:
        ValueError: ``keep`` is not a positive int, or ``metadata`` is not a JSON-able
            dict.
        CheckpointError: ``path`` is a file, or a non-empty directory that holds no
            replaybuffer checkpoints.
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be a positive int (checkpoints to keep), got {keep!r}")
    metadata = {} if metadata is None else metadata
    try:
        if not isinstance(metadata, dict):
            raise TypeError(f"a {type(metadata).__name__}")
        json.dumps(metadata)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"metadata must be a JSON-able dict: {exc}") from exc
    root = Path(path)
    if root.exists() and not root.is_dir():
        raise CheckpointError(f"cannot save to {root}: it is a file")
    if root.is_dir() and not is_checkpoint_root(root):
        raise CheckpointError(f"refusing to save into {root}: it is a non-empty directory "
                              "that holds no replaybuffer checkpoints")
    return root, metadata
