"""A writer's chunk as one contiguous byte buffer (:class:`ChunkPacking`): packed by
the :class:`~.writer.ShardWriter`, unpacked by the shard into one ``extend``.

Ray serialises each array of a call's arguments as a buffer of its own, with its
dtype and shape, and the shard rebuilds each; one ``uint8`` buffer for the whole chunk
costs one. Measured on the bench's control steps (5 leaves, 100-256 steps a chunk, a
2-core machine shared with other work), a call of one buffer cost the caller and the
actor about 100 and 150 us less each than the same bytes as a dict of 5 arrays, a
fifth to a third of a chunk's whole cost.

Layout of ``steps`` steps of ``rows`` rows: the leaves one after another in the
spec's flattened order, each ``[rows, steps, *shape]`` C-contiguous, its start rounded
up to :data:`ALIGN` bytes so that every leaf is aligned for its dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaybuffer import nest

ALIGN = 16
"""Each leaf starts at a multiple of this many bytes of the packed buffer."""


class ChunkPacking:
    """The packed layout of chunks of a data spec.

    Args:
        data_spec: the buffer's data spec (leaves with ``shape`` and ``dtype``).
    """

    def __init__(self, data_spec: Any):
        specs, self._structure = nest.flatten(data_spec)
        self._shapes = [tuple(s.shape) for s in specs]
        self._dtypes = [np.dtype(s.dtype) for s in specs]
        self._step_bytes = [int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                            for shape, dtype in zip(self._shapes, self._dtypes)]

    def _offsets(self, cells: int) -> tuple[list[int], int]:
        """Each leaf's start for ``cells`` (rows x steps) steps, and the total bytes."""
        offsets, at = [], 0
        for size in self._step_bytes:
            at = -(-at // ALIGN) * ALIGN
            offsets.append(at)
            at += size * cells
        return offsets, at

    def pack(self, arrays: list[np.ndarray], steps: int) -> np.ndarray:
        """The first ``steps`` steps of ``arrays`` (leaves ``[rows, >= steps, ...]`` of
        the spec's dtypes, in its flattened order) copied into one new ``uint8``
        buffer."""
        rows = arrays[0].shape[0]
        offsets, total = self._offsets(rows * steps)
        packed = np.empty(total, np.uint8)
        for array, at, size, shape, dtype in zip(arrays, offsets, self._step_bytes,
                                                 self._shapes, self._dtypes):
            view = packed[at:at + size * rows * steps].view(dtype)
            view.reshape((rows, steps) + shape)[...] = array[:, :steps]
        return packed

    def unpack(self, packed: np.ndarray, rows: int, steps: int) -> Any:
        """The nest :meth:`pack` made (leaves ``[rows, steps, ...]``: views of
        ``packed``, read-only where ``packed`` is).

        Raises:
            ValueError: ``packed`` is not ``rows x steps`` steps of this layout.
        """
        offsets, total = self._offsets(rows * steps)
        if packed.dtype != np.uint8 or packed.ndim != 1 or packed.size != total:
            raise ValueError(f"a packed chunk of {rows} x {steps} steps must be {total} "
                             f"uint8 bytes, got {packed.dtype} {packed.shape}")
        leaves = []
        for at, size, shape, dtype in zip(offsets, self._step_bytes, self._shapes,
                                          self._dtypes):
            leaves.append(packed[at:at + size * rows * steps].view(dtype)
                          .reshape((rows, steps) + shape))
        return self._structure.unflatten(leaves)
