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

A process keeps the stamps it imported its kernel modules with, and numba saves or
loads an entry of one of our kernels only while the kernel's stamp file holds those
(:func:`compiled`: numba's dispatcher with a cache that asks :func:`own_stamps` first).
Without that, a process started before a callee was edited, compiling a *new* signature
afterwards (a call with new argument types, ``tree_kernels.direct_entry``), saved its
old machine code beside the entries a newer process had compiled under the new stamps,
and a later process loaded it. What remains: a process that reads the stamp file just
before a newer one rewrites it may still save once; the newer process discards that
entry only if it checks after the save (a window of one file write).

Not covered (numba's own limit): a plain module-level constant a kernel reads from a
module without kernels is frozen into the compiled code as well.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any, Callable

numba_caching: Any
numba_config: Any
numba_registry: Any
try:  # optional: pip install 'replaybuffer[fast]'
    from numba.core import caching as numba_caching
    from numba.core import config as numba_config
    from numba.core import registry as numba_registry
except ImportError:  # pragma: no cover - depends on the installed extras
    numba_caching = numba_config = numba_registry = None

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


def check(fn: Callable[..., Any]) -> None:
    """Discard ``fn``'s cache entry (numba's ``FunctionCache`` of it; needs numba)
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
        cache = numba_caching.FunctionCache(fn)
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


def own_stamps(fn: Callable[..., Any], cache_path: str) -> bool:
    """Whether ``fn``'s stamp file (in numba's ``cache_path`` for it) holds this
    process's stamps for every kernel module both list (or there is none): only then
    is an entry this process compiles its callees' current code, and one it loads the
    code it imported."""
    recorded = _recorded(_stamp_file(cache_path, fn))
    if recorded is None:
        return True
    return all(tuple(stamp) == _stamps[path] for path, stamp in recorded.items()
               if path in _stamps)


if numba_caching is not None:
    class OwnStampsCache(numba_caching.FunctionCache):  # type: ignore[misc]
        """numba's cache of one function, which loads and saves only under this
        process's stamps (:func:`own_stamps`)."""

        def load_overload(self, sig: Any, target_context: Any) -> Any:
            if not own_stamps(self._py_func, self.cache_path):
                return None  # compiled here from the code this process imported
            return super().load_overload(sig, target_context)

        def save_overload(self, sig: Any, data: Any) -> None:
            if own_stamps(self._py_func, self.cache_path):
                super().save_overload(sig, data)

    class OwnStampsDispatcher(numba_registry.CPUDispatcher):  # type: ignore[misc]
        """numba's CPU dispatcher (what ``numba.njit`` makes) caching through
        :class:`OwnStampsCache`."""

        def enable_caching(self) -> None:
            self._cache = OwnStampsCache(self.py_func)


def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``numba.njit(cache=True, nogil=True, boundscheck=False)(fn)`` whose cache loads
    and saves only under this process's stamps (needs numba)."""
    if numba_config.DISABLE_JIT:
        return fn  # as numba.njit does
    dispatcher = OwnStampsDispatcher(py_func=fn, locals={}, targetoptions={
        "nopython": True, "nogil": True, "boundscheck": False})
    dispatcher.enable_caching()
    result: Callable[..., Any] = dispatcher
    return result
