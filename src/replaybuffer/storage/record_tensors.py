"""The CPU torch storage's usual gather: host records taken once, one tensor per leaf.

A batch of the control workload is seven tensors (five leaves, ids, probabilities), and
in torch 2.13 on one thread every way of making a tensor costs about the same, 0.4-0.6
us of thread CPU, made and freed (measured per batch of 256, one process):

============================================  =========================================
candidate                                      us per batch of 5 leaves
============================================  =========================================
``torch.from_numpy`` of each numpy field view  2.3-2.4 (0.07 the view, 0.47 the tensor)
one ``from_numpy`` of the block + views        0.6 + 0.6-1.6 per view (``narrow`` 1.6,
                                               ``select`` 1.0, ``as_strided`` 1.1,
                                               ``view(dtype)`` 0.6)
``split_with_sizes`` of the block              0.8 + 0.35-0.45 per piece (2.8 for 6),
                                               and scalars then need ``squeeze``
``unbind`` of a ``[k, B]`` block               0.45 per piece (11.8 for 26)
the same under ``inference_mode``              0.34 per piece, plus 1.2-1.5 to enter,
                                               and inference tensors out (refused by
                                               autograd later)
nested tensor over the block, ``unbind``       2.6 for 3 pieces
``torch.from_dlpack`` / ``torch.frombuffer``   1.7 / 0.8 each
============================================  =========================================

So the floor is one tensor construction per returned tensor, and ``from_numpy`` of a
numpy field view is the cheapest one: a view made in C++ by a many-output op costs as
much per piece (autograd's view bookkeeping and the Python object), never less. This
module takes that path with nothing around it: one ``take`` of whole records (as
:class:`~replaybuffer.storage.numpy_storage.NumpyStorage` does), the fields typed over
the taken block by one C call, and ``map(torch.from_numpy, ...)``.

The record layout is read off the numpy storage's public leaf arrays (each packed leaf
a strided view into one array of records), so this module depends on no private member
of that storage; where the arrays are not laid out so, :meth:`RecordTensors.of` says
``None`` and the storage keeps its general gather.
"""

from __future__ import annotations

import operator
from typing import Callable, Sequence

import numpy as np
import torch


class RecordTensors:
    """One ``take`` of ``[capacity]`` records and a tensor per packed leaf.

    Build with :meth:`of`. ``gather(positions)`` returns, for int ``positions`` of any
    shape ``P`` (taken modulo the capacity), one tensor per leaf in leaf order, each
    ``[*P, *leaf shape]`` in the leaf's dtype: a strided view (row stride the record's
    size) of a block gathered fresh for this call, so no two calls share memory and
    nothing later writes into a returned tensor.
    """

    def __init__(self, records: np.ndarray, dtype: np.dtype, names: Sequence[str]):
        self._bytes = records  # [capacity] of void items, one record each
        self._dtype = dtype  # the record's fields, named in leaf order
        self._fields: Callable[[np.ndarray], tuple[np.ndarray, ...]] = operator.itemgetter(
            *names)

    @classmethod
    def of(cls, arrays: Sequence[np.ndarray], capacity: int) -> RecordTensors | None:
        """The record gather over leaf ``arrays`` (``[capacity, *shape]`` each), or
        ``None`` unless they are two or more fields of one array of ``capacity``
        records (their ``base``), as the numpy storage packs every small leaf of a
        step: then each leaf's byte offset in the record is its address less the
        records' address."""
        if len(arrays) < 2:  # itemgetter of one name gives a field, not a tuple
            return None
        root = arrays[0].base
        if not isinstance(root, np.ndarray) or root.shape != (capacity,) \
                or root.dtype.names is None or not root.flags.c_contiguous:
            return None
        start = root.__array_interface__["data"][0]
        size = root.dtype.itemsize
        names, formats, offsets = [], [], []
        for k, arr in enumerate(arrays):
            offset = arr.__array_interface__["data"][0] - start
            item = arr.dtype.itemsize * int(np.prod(arr.shape[1:], dtype=np.int64))
            if arr.base is not root or arr.shape[0] != capacity or arr.strides[0] != size \
                    or not 0 <= offset <= size - item or offset % arr.dtype.itemsize \
                    or (item and arr.strides[1:] != _c_strides(arr)):  # none if empty
                return None
            names.append(f"leaf{k}")
            formats.append((arr.dtype, arr.shape[1:]) if arr.ndim > 1 else arr.dtype)
            offsets.append(offset)
        dtype = np.dtype({"names": names, "formats": formats, "offsets": offsets,
                          "itemsize": size})
        return cls(root.view(np.dtype((np.void, size))), dtype, names)

    def gather(self, positions: np.ndarray) -> list[torch.Tensor]:
        """Every leaf at ``positions`` (see the class): a byte copy per record, the
        fields typed over the copy without numpy's checked ``view``, a tensor each."""
        taken = self._bytes.take(positions, 0, mode="wrap")
        if type(taken) is not np.ndarray:  # 0-d positions: take gives a numpy scalar
            taken = np.array(taken)
        return list(map(torch.from_numpy,
                        self._fields(np.ndarray(taken.shape, self._dtype, taken))))


def _c_strides(arr: np.ndarray) -> tuple[int, ...]:
    """The strides of ``arr``'s item axes (all but the first) were they C-contiguous."""
    strides, step = [], arr.dtype.itemsize
    for n in reversed(arr.shape[1:]):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))
