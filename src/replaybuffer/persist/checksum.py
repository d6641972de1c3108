"""The CRC-32 of checkpoint files: zlib's checksum (the polynomial of zip and PNG), from
the fastest implementation installed.

zlib-ng's ``crc32`` (the ``fast`` extra: ``pip install replaybuffer[fast]``) folds with
carry-less multiplies: 29 GB per CPU second on this project's machine, against 4 for the
``zlib`` module Python links (whose CRC then costs a load more than reading the files;
docs/benchmarks.md, Checkpoints). Both return the same value for the same bytes, so
checkpoints written with either load with either. Without zlib-ng, :func:`crc32` is
``zlib.crc32``.
"""

from __future__ import annotations

import zlib
from typing import Any, Callable

Crc32 = Callable[[Any, int], int]


def _fastest() -> tuple[Crc32, str]:
    """zlib-ng's ``crc32`` where it imports, else the standard library's."""
    try:
        from zlib_ng import zlib_ng
    except ImportError:  # the optional dependency is absent: the same checksum, slower
        return zlib.crc32, "zlib"
    return zlib_ng.crc32, "zlib-ng"


crc32, IMPLEMENTATION = _fastest()
"""``crc32(data, value)``: the CRC-32 of a bytes-like ``data`` (any contiguous buffer:
bytes, a memoryview, a C-contiguous numpy array) continued from ``value`` (0 to
start), an ``int`` in ``[0, 2**32)``, equal to ``zlib.crc32(data, value)``.
``IMPLEMENTATION`` names the library that computes it (``"zlib-ng"`` or ``"zlib"``)."""
