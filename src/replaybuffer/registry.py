"""Buffer classes by name, for restoring a checkpoint that names its class.

Every :class:`~replaybuffer.ReplayBuffer` subclass registers itself when it is
defined (``__init_subclass__``). Classes whose module needs an optional dependency
(the TensorFlow buffer) are listed here by module path as well, so that a checkpoint
of one can be restored before that module was imported; the module is imported then,
and registers its class.

This module imports nothing of the library above :mod:`replaybuffer.errors`: the
checkpoint code (:mod:`replaybuffer.persist`) reads it without importing the buffers.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Classes defined so far, by ``__name__``.
_CLASSES: dict[str, type[Any]] = {}

#: Classes in modules imported on demand: name -> (module that defines and registers it,
#: the storage that class keeps its data in, the class that holds the same data on any
#: other storage). A TensorFlow buffer's checkpoint restored into numpy or torch storage
#: needs no TensorFlow.
_LAZY: dict[str, tuple[str, str, str]] = {
    "TFUniformReplayBuffer": ("replaybuffer.tf.buffer", "tensorflow", "UniformReplayBuffer"),
}


def register_buffer(cls: type[Any]) -> None:
    """Make ``cls`` restorable under its ``__name__`` (a later class of the same name
    replaces an earlier one, as a redefined class in a notebook should)."""
    _CLASSES[cls.__name__] = cls


def buffer_class(name: str, storage: str | None = None) -> type[Any] | None:
    """The buffer class a checkpoint names, to hold its data on ``storage`` (``None``:
    the class's own), importing its module if it is one of the optional ones; ``None``
    for a name no class has.

    Raises:
        ImportError: the class lives in a module whose dependency (TensorFlow) is not
            installed.
    """
    if name in _LAZY:
        module, own_storage, elsewhere = _LAZY[name]
        if storage is not None and storage != own_storage:
            return _CLASSES.get(elsewhere)
        if name not in _CLASSES:
            importlib.import_module(module)
    return _CLASSES.get(name)


def known(name: str) -> bool:
    """Whether ``name`` is a buffer class a checkpoint may name (without importing)."""
    return name in _CLASSES or name in _LAZY
