"""Storage backends by name: what ``storage="numpy"`` (or ``"torch"``, ``"mmap"``,
``"tensorflow"``) builds.

A backend is registered by class, or by ``"module:Class"`` path so that its module
(and its optional dependency: torch, TensorFlow) is imported only when the backend is
asked for. The TensorFlow backend is listed by path: :mod:`replaybuffer.storage` never
imports :mod:`replaybuffer.tf`.
"""

from __future__ import annotations

import importlib
from typing import Any

_BACKENDS: dict[str, type[Any] | str] = {
    "numpy": "replaybuffer.storage.numpy_storage:NumpyStorage",
    "torch": "replaybuffer.storage.torch_storage:TorchStorage",
    "tensorflow": "replaybuffer.tf.storage:TFStorage",
    "mmap": "replaybuffer.storage.mmap_storage:MmapStorage",
}


def register_storage(name: str, backend: type[Any] | str) -> None:
    """Make ``storage=name`` build ``backend``: a class, or ``"module:Class"`` imported on
    first use. A backend other than the built-in ones is built as
    ``backend(specs, capacity, device)`` (see :func:`replaybuffer.storage.make_storage`)
    and must satisfy :class:`~replaybuffer.storage.base.Storage`. A later registration
    of a name replaces the earlier one."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a storage name must be a non-empty str, got {name!r}")
    if not isinstance(backend, (type, str)) or (isinstance(backend, str)
                                                 and backend.count(":") != 1):
        raise ValueError(f"a storage backend is a class or a 'module:Class' path, got "
                         f"{backend!r}")
    _BACKENDS[name] = backend


def storage_names() -> tuple[str, ...]:
    """Every registered name, the built-in ones first."""
    return tuple(_BACKENDS)


def storage_class(name: str) -> type[Any]:
    """The class registered as ``name``, its module imported if it is listed by path.

    Raises:
        KeyError: no backend has that name.
        ImportError: its module (or the module's dependency) cannot be imported.
    """
    backend = _BACKENDS[name]
    if isinstance(backend, str):
        module, _, attribute = backend.partition(":")
        found: type[Any] = getattr(importlib.import_module(module), attribute)
        return found
    return backend
