"""Checking a storage object a user passes (``storage=MyStorage(...)``) before a buffer
takes it: it must have every member of :class:`~replaybuffer.storage.base.Storage`, and
hold the specs and capacity the buffer stores.
"""

from __future__ import annotations

from typing import Any, Sequence

from replaybuffer.errors import SpecError
from replaybuffer.specs import ArraySpec
from replaybuffer.storage.base import STORAGE_ATTRIBUTES, STORAGE_METHODS, Storage


def checked_storage(storage: Any, specs: Sequence[ArraySpec], capacity: int) -> Storage:
    """``storage``, once it is checked to satisfy the protocol and to fit the buffer.

    Args:
        storage: the object passed as ``storage=``.
        specs: the leaf specs the buffer stores (in nest flatten order; a deduplicated
            frame stack's leaf as its frame references).
        capacity: the buffer's ``batch_size * max_length``.

    Raises:
        TypeError: a class rather than an object, or a member of the protocol is missing
            (the message names the class and the member).
        SpecError: its ``specs`` are not the buffer's.
        ValueError: its ``capacity`` is not the buffer's.
    """
    if isinstance(storage, type):
        raise TypeError(f"storage={storage.__name__} is a class: pass a storage object (built "
                        f"with the buffer's leaf specs and capacity) or a backend's name")
    name = type(storage).__name__
    for method in STORAGE_METHODS:
        if not callable(getattr(storage, method, None)):
            raise TypeError(f"storage={name}(...) is not a storage: it lacks the method "
                            f"{method}() of replaybuffer.storage.Storage")
    for attribute in STORAGE_ATTRIBUTES:
        if not hasattr(storage, attribute):
            raise TypeError(f"storage={name}(...) is not a storage: it lacks the attribute "
                            f"{attribute!r} of replaybuffer.storage.Storage")
    if tuple(storage.specs) != tuple(specs):
        raise SpecError(f"storage={name}(...) holds specs {tuple(storage.specs)}; the buffer "
                        f"stores {tuple(specs)}")
    if storage.capacity != capacity:
        raise ValueError(f"storage={name}(...) has capacity {storage.capacity}; the buffer "
                         f"holds {capacity} (batch_size * max_length)")
    checked: Storage = storage
    return checked
