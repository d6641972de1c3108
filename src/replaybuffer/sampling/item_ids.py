"""Item ids of a prioritized buffer, and the storage positions and logical ids behind them.

``BufferInfo.ids`` of a prioritized buffer identify one step of one row,
``(base + id) * batch_size + row``, where ``id`` is the logical add id and ``base``
(``key_base``) counts the ids used before the last ``clear()``, so ids are never
reused. For one row and no clear they equal TF-Agents' add ids. An item id is *live*
while its step is held (``oldest_id <= id <= last_id``); updates ignore stale ones.
Pure index arithmetic over the ring's integers.
"""

from __future__ import annotations

import numpy as np

from replaybuffer.sampling.ring import Ring


def ids_at(ring: Ring, positions: np.ndarray) -> np.ndarray:
    """Logical ids (int64, a new array) of the steps at stored positions (int64, any
    shape)."""
    slots = positions // ring.batch_size if ring.batch_size > 1 else positions
    oldest = ring.oldest_id
    if not oldest:  # the ring has not wrapped: the slot is the id
        return slots.copy() if slots is positions else slots
    ids = slots - oldest % ring.max_length
    ids %= ring.max_length
    ids += oldest
    return ids


def to_item_ids(ring: Ring, key_base: int, ids: np.ndarray, positions: np.ndarray
                ) -> np.ndarray:
    """Item ids (int64 ``[S]``) of steps given by logical id and position (int64
    ``[S]``); may return ``ids`` itself (one row, no clear yet: the item ids are the
    ids)."""
    if ring.batch_size == 1:
        return ids + key_base if key_base else ids
    out: np.ndarray = (key_base + ids) * ring.batch_size + positions % ring.batch_size
    return out


def live_positions(ring: Ring, key_base: int, item_ids: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """``(live, positions)``: bool ``[K]``, whether each item id (int64 ``[K]``) names a
    stored step, and the int64 positions of the live ones."""
    B = ring.batch_size
    ids = item_ids // B - key_base
    live = (ids >= ring.oldest_id) & (ids <= ring.last_id) & (item_ids >= 0)
    return live, ring.positions(ids[live], item_ids[live] % B)
