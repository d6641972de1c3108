"""Storage in torch tensors on any device (CPU, CUDA, MPS)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from replaybuffer.errors import SpecError
from replaybuffer.specs import ArraySpec, check_leaf
from replaybuffer.storage.base import LeafChecker, leaf_nbytes

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
    On the CPU, writes of numpy data and gathers go through numpy views of the
    tensors (same memory), which is several times faster for small steps.

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
        self._checker = LeafChecker(self.specs)
        # On the CPU, numpy views share the tensors' memory: writes and gathers through
        # them skip torch's per-call dispatch, which costs several microseconds a leaf.
        self._host = ([a.numpy() for a in self.arrays] if self.device.type == "cpu"
                      else None)

    @property
    def nbytes(self) -> int:
        return leaf_nbytes(self.specs, self.capacity)

    def convert(self, leaves: Sequence[Any], paths: Sequence[str],
                outer_shape: tuple[int, ...], outer_names: str
                ) -> list[torch.Tensor | np.ndarray]:
        shapes = self._checker.full_shapes(outer_shape)
        out: list[torch.Tensor | np.ndarray] = []
        for i, (leaf, shape) in enumerate(zip(leaves, shapes)):
            if not isinstance(leaf, torch.Tensor):
                arr = self._checker.numpy_leaf(i, leaf, shape, paths[i], outer_shape,
                                               outer_names)
                if arr.dtype not in _NUMPY_TO_TORCH:  # e.g. big-endian input
                    arr = arr.astype(self.specs[i].dtype)
                # CPU writes go through numpy views; other devices need a tensor.
                out.append(arr if self._host is not None else torch.from_numpy(
                    np.ascontiguousarray(arr)))
                continue
            if leaf.dtype is not self._dtypes[i] or tuple(leaf.shape) != shape:
                np_dtype = _TORCH_TO_NUMPY.get(leaf.dtype)
                if np_dtype is None:
                    raise SpecError(f"leaf {paths[i]}: expected dtype "
                                    f"{self.specs[i].dtype.name}, got {leaf.dtype}")
                check_leaf(paths[i], tuple(leaf.shape), np_dtype, self.specs[i], outer_shape,
                           outer_names)
            out.append(leaf)
        return out

    def write(self, start: int, leaves: Sequence[torch.Tensor | np.ndarray]) -> None:
        stop = start + len(leaves[0])
        for i, (dst, src) in enumerate(zip(self.arrays, leaves)):
            if self._host is not None and type(src) is np.ndarray:
                self._host[i][start:stop] = src
            else:
                if type(src) is np.ndarray:
                    src = torch.from_numpy(src)
                dst[start:stop].copy_(src)

    def gather(self, positions: np.ndarray) -> list[torch.Tensor]:
        if self._host is not None:
            if positions.ndim == 0:  # take() returns numpy scalars for scalar leaves
                return [torch.from_numpy(np.asarray(h.take(positions, 0, mode="clip")))
                        for h in self._host]
            return [torch.from_numpy(h.take(positions, 0, mode="clip")) for h in self._host]
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
