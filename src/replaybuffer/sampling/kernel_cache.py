"""Our compiled kernels' numba cache entries, discarded when a kernel module changed.

``numba.njit(cache=True)`` keys a function's cache entry on its own source file's
stamp (modification time and size) only: numba documents that a change to a function
it calls in another file is not noticed. In a working tree, editing a called kernel
(say :func:`~replaybuffer.sampling.tree_kernels.descend`) would leave every caller in
another module running the old machine code. An installed wheel never changes, so
there this costs only the stamp check.

:func:`check` runs when :func:`~replaybuffer.sampling.tree_kernels.compile_kernel`
compiles a function, before numba's first call could load an entry (numba loads one
lazily, at a signature's first call). It writes beside numba's entry, in numba's own
cache folder for that function (``FunctionCache(fn).cache_path``), a small JSON file
of the stamps (``st_mtime_ns``, ``st_size``) of every kernel module imported so far:
those hold the kernel's callees (a callee's module is imported before its caller's is
compiled, and numba resolves globals at the first call). While every stamp in it still
holds, the entry stands; otherwise the entry is discarded (``FunctionCache.flush``,
numba's own invalidation: an empty index, the data files reused) and the file
rewritten. Only our kernels' entries are ever touched: never another numba cache, and
never ``NUMBA_CACHE_DIR`` (a user's setting is followed, as numba follows it). Two
processes importing in another order record other supersets; each holds the true
callees, so neither discards what the other compiled while the sources stand.

Not covered (numba's own limit): a plain module-level constant a kernel reads from a
module without kernels is frozen into the compiled code as well.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any, Callable

#: Source files of the modules with compiled kernels seen so far in this process,
#: and their stamps (read once per process: a source edited while a process runs is
#: that process's own old code, as Python's modules are).
_stamps: dict[str, tuple[int, int]] = {}


def _stamp(path: str) -> tuple[int, int] | None:
    """``(st_mtime_ns, st_size)`` of ``path``; ``None`` where it is gone."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_mtime_ns, found.st_size


def _source_of(fn: Callable[..., Any]) -> str | None:
    module = sys.modules.get(fn.__module__)
    path = getattr(module, "__file__", None)
    return os.path.abspath(path) if isinstance(path, str) else None


def _stamp_file(cache_path: str, fn: Callable[..., Any]) -> str:
    """This kernel's stamp file: named as numba names its index, so that one module's
    kernels (and a kernel redefined at another line) each have their own."""
    name = f"{fn.__module__}.{fn.__qualname__}-{fn.__code__.co_firstlineno}"
    return os.path.join(cache_path, f"{name}.replaybuffer-deps.json")


def _recorded(path: str) -> dict[str, list[int]] | None:
    try:
        with open(path, encoding="utf-8") as file:
            found = json.load(file)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def check(fn: Callable[..., Any], cache_type: Any) -> None:
    """Discard ``fn``'s cache entry (``cache_type(fn)``: numba's ``FunctionCache``)
    when a kernel module it may call changed since the entry's stamps were recorded;
    then record the current ones. Any failure to read or write leaves numba's entry as
    numba would (a cache that cannot be written is numba's to report)."""
    source = _source_of(fn)
    if source is None:
        return
    if source not in _stamps:
        stamp = _stamp(source)
        if stamp is None:
            return
        _stamps[source] = stamp
    try:
        cache = cache_type(fn)
        path = _stamp_file(cache.cache_path, fn)
        recorded = _recorded(path)
        if recorded is not None and all(
                _stamps.get(p) == tuple(s) if p in _stamps else _stamp(p) == tuple(s)
                for p, s in recorded.items()) and source in recorded:
            return  # every module it may call is as it was when the entry was made
        cache.flush()
        _write(path, {p: list(s) for p, s in _stamps.items()})
    except (OSError, RuntimeError):
        return


def _write(path: str, stamps: dict[str, list[int]]) -> None:
    """Replace ``path`` with ``stamps`` (JSON) at once: a reader sees the old or new."""
    folder = os.path.dirname(path)
    handle, temporary = tempfile.mkstemp(dir=folder, suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            json.dump(stamps, file)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
