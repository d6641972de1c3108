"""Storage in torch tensors on any device (CPU, CUDA, MPS)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from replaybuffer.errors import SpecError
from replaybuffer.specs import ArraySpec, as_leaf_array, check_leaf
from replaybuffer.storage.base import leaf_nbytes

_TORCH_TO_NUMPY = {
    torch.bool: np.dtype(np.bool_), torch.uint8: np.dtype(np.uint8),
    torch.int8: np.dtype(np.int8), torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32), torch.int64: np.dtype(np.int64),
    torch.float16: np.dtype(np.float16), torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64), torch.complex64: np.dtype(np.complex64),
    torch.complex128: np.dtype(np.complex128),
    torch.uint16: np.dtype(np.uint16), torch.uint32: np.dtype(np.uint32),
    torch.uint64: np.dtype(np.uint64),
}
_NUMPY_TO_TORCH = {v: k for k, v in _TORCH_TO_NUMPY.items()}


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of a numpy dtype; ``SpecError`` if torch has none."""
    try:
        return _NUMPY_TO_TORCH[np.dtype(dtype).newbyteorder("=")]
    except KeyError:
        raise SpecError(f"torch storage cannot hold dtype {np.dtype(dtype).name}") from None


class TorchStorage:
    """One ``torch.zeros([capacity, *spec.shape])`` tensor per leaf on ``device``.

    Leaves may be written as numpy arrays, array-likes or tensors on any device;
    they are copied to ``device``. Gathers run on ``device`` and return tensors there.

    Args:
        specs: leaf specs, in nest flatten order.
        capacity: number of positions.
        device: a torch device (``"cpu"``, ``"cuda"``, ``"cuda:1"``); default CPU.
    """

    kind = "torch"

    def __init__(self, specs: Sequence[ArraySpec], capacity: int,
                 device: str | torch.device | None = None):
        self.specs = tuple(specs)
        self.capacity = int(capacity)
        self.device = torch.device(device if device is not None else "cpu")
        self._dtypes = [torch_dtype(s.dtype) for s in self.specs]
        self.arrays = [torch.zeros((self.capacity,) + s.shape, dtype=d, device=self.device)
                       for s, d in zip(self.specs, self._dtypes)]
        for spec, arr in zip(self.specs, self.arrays):  # some dtypes lack kernels
            try:
                torch.index_select(arr[:1], 0, torch.zeros(1, dtype=torch.int64,
                                                            device=self.device))
            except RuntimeError as exc:
                raise SpecError(f"torch storage on {self.device} cannot gather dtype "
                                f"{spec.dtype.name}: {exc}") from exc
        self._shapes = [s.shape for s in self.specs]

    @property
    def nbytes(self) -> int:
        return leaf_nbytes(self.specs, self.capacity)

    def convert(self, leaves: Sequence[Any], paths: Sequence[str],
                outer_shape: tuple[int, ...], outer_names: str) -> list[torch.Tensor]:
        out = []
        for leaf, spec, shape, dtype, path in zip(leaves, self.specs, self._shapes,
                                                   self._dtypes, paths):
            if isinstance(leaf, torch.Tensor):
                if leaf.dtype is not dtype or tuple(leaf.shape) != outer_shape + shape:
                    np_dtype = _TORCH_TO_NUMPY.get(leaf.dtype)
                    if np_dtype is None:
                        raise SpecError(f"leaf {path}: expected dtype {spec.dtype.name}, "
                                        f"got {leaf.dtype}")
                    check_leaf(path, tuple(leaf.shape), np_dtype, spec, outer_shape,
                               outer_names)
                tensor = leaf
            else:
                arr = leaf if type(leaf) is np.ndarray else as_leaf_array(leaf, path)
                check_leaf(path, arr.shape, arr.dtype, spec, outer_shape, outer_names)
                if arr.dtype not in _NUMPY_TO_TORCH:  # e.g. big-endian input
                    arr = arr.astype(spec.dtype)
                tensor = torch.from_numpy(np.ascontiguousarray(arr))
            out.append(tensor)
        return out

    def write(self, start: int, leaves: Sequence[torch.Tensor]) -> None:
        for dst, src in zip(self.arrays, leaves):
            dst[start:start + src.shape[0]].copy_(src, non_blocking=False)

    def gather(self, positions: np.ndarray) -> list[torch.Tensor]:
        flat = torch.from_numpy(np.ascontiguousarray(positions, dtype=np.int64).reshape(-1))
        if self.device.type != "cpu":
            flat = flat.to(self.device, non_blocking=True)
        outer = positions.shape
        return [torch.index_select(arr, 0, flat).reshape(outer + shape)
                for arr, shape in zip(self.arrays, self._shapes)]

    def from_numpy(self, array: np.ndarray) -> torch.Tensor:
        array = np.asarray(array)  # keeps 0-d arrays 0-d, unlike ascontiguousarray
        if not array.flags.c_contiguous:
            array = array.copy()
        return torch.from_numpy(array).to(self.device)

    def zero(self) -> None:
        for arr in self.arrays:
            arr.zero_()

    def export(self, count: int) -> list[np.ndarray]:
        return [arr[:count].cpu().numpy() for arr in self.arrays]

    def load(self, arrays: Sequence[np.ndarray]) -> None:
        # Sources may be read-only memory maps; copy them in bounded chunks.
        for dst, src in zip(self.arrays, arrays):
            step = max(1, (64 << 20) // max(1, src[:1].nbytes))
            for i in range(0, len(src), step):
                chunk = np.array(src[i:i + step])
                dst[i:i + len(chunk)].copy_(torch.from_numpy(chunk))
