"""Storage in torch tensors on any device (CPU, CUDA, MPS).

On the CPU the storage holds a :class:`~replaybuffer.storage.numpy_storage.NumpyStorage`
(small leaves packed into one record per position), the one copy of the record layout,
and its gather reads through that storage's: one ``take`` of whole records, the fields
typed over the taken block by one C call, then ``map(torch.from_numpy, ...)``. A batch of
the control workload is seven tensors (five leaves, ids, probabilities), and in torch
2.13 on one thread every way of making a tensor costs about the same, 0.4-0.6 us of
thread CPU, made and freed (measured per batch of 256, one process):

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
much per piece (autograd's view bookkeeping and the Python object), never less. Reading
through the numpy storage's own gather rather than a second copy of its layout here
costs nothing measurable (within 0.2 us a batch, same-process A/B).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from replaybuffer.device_copy import to_device
from replaybuffer.errors import SpecError
from replaybuffer.specs import ArraySpec, check_leaf
from replaybuffer.storage.base import checked_leaves, leaf_nbytes, leaves_state
from replaybuffer.storage.exact_writer import ExactWriter, exact_writer
from replaybuffer.storage.leaf_checker import LeafChecker
from replaybuffer.storage.numpy_storage import NumpyStorage
from replaybuffer.storage.stream_reads import PendingReads
from replaybuffer.storage.torch_packing import PackedLeaves

_TORCH_TO_NUMPY: dict[torch.dtype, np.dtype] = {
    getattr(torch, name): np.dtype(name)
    for name in ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32",
                 "float64", "complex64", "complex128", "uint16", "uint32", "uint64")
    if hasattr(torch, name)  # the wide unsigned types arrived in torch 2.3
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
    they are detached from autograd and copied to ``device``. Gathers run on
    ``device`` and return tensors there.

    On the CPU the memory is laid out as :class:`~replaybuffer.storage.numpy_storage.
    NumpyStorage` lays it out (small leaves packed into one record per position) and
    the tensors are views of it (``torch.from_numpy``; a packed leaf's tensor is
    strided). Writes and gathers go through numpy, so a gather reads each position
    with one ``take``: the numpy storage's speed, with tensors out (packed leaves come
    back as strided views of one gathered block, not contiguous: ``.contiguous()``
    where a consumer insists). Set the class attribute ``numpy_views = False`` for the
    device layout below and torch operations on the CPU too (the CPU twin of a GPU).

    On a device the leaves of one dtype are packed side by side in one tensor
    (:mod:`~replaybuffer.storage.torch_packing`), so a gather is one ``index_select``
    per dtype rather than per leaf (a launch each), and gathered leaves are strided
    views of the gathered block, as on the CPU.

    On CUDA, the buffer's lock orders work on the host only, so every write and
    gather is also ordered on the GPU: a gather waits (on its stream) for the last
    write, and a write waits for every gather issued since the previous write.
    Nothing blocks the host.

    Args:
        specs: leaf specs, in nest flatten order.
        capacity: number of positions.
        device: a torch device (``"cpu"``, ``"cuda"``, ``"cuda:1"``); default CPU.
    """

    kind = "torch"
    numpy_views = True

    def __init__(self, specs: Sequence[ArraySpec], capacity: int,
                 device: str | torch.device | None = None):
        self.specs = tuple(specs)
        self.capacity = int(capacity)
        self._dtypes = [torch_dtype(s.dtype) for s in self.specs]
        try:
            requested = torch.device(device if device is not None else "cpu")
        except (RuntimeError, TypeError) as exc:  # torch's text names no argument
            raise ValueError(f"device must be a torch device or its name ('cpu', 'cuda', "
                             f"'cuda:1', ...), got {device!r}: {exc}") from None
        # The record layout of numpy storage, with tensor views of it (CPU only): its
        # one copy of the layout, read by its own gather (the module docstring).
        self._records: NumpyStorage | None = None
        self._packed: PackedLeaves | None = None
        if requested.type == "cpu" and self.numpy_views:
            self._records = NumpyStorage(self.specs, self.capacity)
            self.arrays = [torch.from_numpy(a) for a in self._records.arrays]
        else:
            try:
                self._packed = PackedLeaves([s.shape for s in self.specs], self._dtypes,
                                            self.capacity, requested)
            except (RuntimeError, AssertionError) as exc:  # no such device in this process
                raise ValueError(f"torch storage cannot be placed on device "
                                 f"{str(requested)!r}: {exc}") from exc
            self.arrays = self._packed.views
        # A tensor's device carries the index ("cuda" becomes "cuda:0"), so indices and
        # info land on the storage's GPU whatever the calling thread's current device.
        self.device = self.arrays[0].device
        for spec, arr in zip(self.specs, self.arrays):  # some dtypes lack kernels
            try:
                torch.index_select(arr[:1], 0, torch.zeros(1, dtype=torch.int64,
                                                            device=self.device))
            except RuntimeError as exc:
                raise SpecError(f"torch storage on {self.device} cannot gather dtype "
                                f"{spec.dtype.name}: {exc}") from exc
        self._shapes = [s.shape for s in self.specs]
        self._all = range(len(self.specs))
        self.checker = LeafChecker(self.specs)
        self._host = self._records.arrays if self._records is not None else None
        self._cuda = self.device.type == "cuda"
        self._write_event: Any = None
        # The gathers since the last write, which the next write waits for.
        self._reads = PendingReads(self.device) if self._cuda else None

    def __getstate__(self) -> dict[str, Any]:
        """The storage for ``copy.deepcopy`` and pickling: its specs, capacity, device,
        layout and leaves (:meth:`state_dict`'s numpy copies, read after the last
        write on CUDA). Copied attribute by attribute, the tensors over the CPU's
        records (or a device block's views) would be copied apart from the memory the
        copy's gathers read, so a write to the copy would not show in its reads;
        :meth:`__setstate__` builds the copy as the constructor does and loads them."""
        self.before_read()
        state = {"specs": self.specs, "capacity": self.capacity,
                 "device": str(self.device), "numpy_views": self._records is not None,
                 "leaves": leaves_state(self)["leaves"]}
        self.after_read()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A copy from :meth:`__getstate__`'s state, in the original's layout on its
        device (``ValueError`` where this process has no such device)."""
        if state["numpy_views"] != type(self).numpy_views:
            self.numpy_views = state["numpy_views"]  # the original's layout, this one
        TorchStorage.__init__(self, state["specs"], state["capacity"], state["device"])
        self.load(state["leaves"])

    @property
    def nbytes(self) -> int:
        return leaf_nbytes(self.specs, self.capacity)

    def convert(self, leaves: Sequence[Any], paths: Sequence[str],
                outer_shape: tuple[int, ...], outer_names: str
                ) -> list[torch.Tensor | np.ndarray]:
        """Validate, then bring every leaf to the storage's device and dtype.

        Everything that can fail happens here, before any write, so a failing leaf
        leaves the storage untouched.
        """
        shapes = self.checker.full_shapes(outer_shape)
        out: list[torch.Tensor | np.ndarray] = []
        for i, (leaf, shape) in enumerate(zip(leaves, shapes)):
            if isinstance(leaf, torch.Tensor):
                out.append(self._convert_tensor(i, leaf, shape, paths[i], outer_shape,
                                                outer_names))
                continue
            arr = self.checker.numpy_leaf(i, leaf, shape, paths[i], outer_shape, outer_names)
            if self._host is not None:
                out.append(arr)  # numpy assignment into the host view casts as needed
                continue
            arr = np.ascontiguousarray(arr, dtype=self.specs[i].dtype)
            if not arr.flags.writeable:  # torch.from_numpy warns on read-only arrays
                arr = arr.copy()
            out.append(to_device(arr, self.device))
        return out

    def _convert_tensor(self, i: int, leaf: torch.Tensor, shape: tuple[int, ...], path: str,
                        outer_shape: tuple[int, ...], outer_names: str) -> torch.Tensor:
        if leaf.dtype is not self._dtypes[i] or tuple(leaf.shape) != shape:
            np_dtype = _TORCH_TO_NUMPY.get(leaf.dtype)
            if np_dtype is None:
                raise SpecError(f"leaf {path}: expected dtype {self.specs[i].dtype.name}, "
                                f"got {leaf.dtype}")
            check_leaf(path, tuple(leaf.shape), np_dtype, self.specs[i], outer_shape,
                       outer_names)
        try:
            # Stored data is never part of an autograd graph.
            return to_device(leaf.detach().to(dtype=self._dtypes[i]), self.device)
        except (RuntimeError, NotImplementedError) as exc:
            raise SpecError(f"leaf {path}: cannot move a tensor on {leaf.device} to "
                            f"{self.device}: {exc}") from exc

    def exact_writer(self, outer_shape: tuple[int, ...]) -> ExactWriter | None:
        """Numpy leaves written through the host views (CPU); ``None`` on a device."""
        if self._host is None:
            return None
        return exact_writer(self._host, self.checker, outer_shape)

    def write(self, start: int, leaves: Sequence[Any]) -> None:
        # ``leaves`` as convert() gives them: tensors on a device; on the CPU, numpy
        # arrays or tensors (written through the host views).
        stop = start + len(leaves[0])
        if self._reads is not None:
            self._reads.wait()
        for i, (dst, src) in enumerate(zip(self.arrays, leaves)):
            if self._host is not None:
                self._host[i][start:stop] = src.numpy() if isinstance(src, torch.Tensor) \
                    else src
            else:
                dst[start:stop].copy_(src)
        if self._cuda:
            if self._write_event is None:
                self._write_event = torch.cuda.Event()
            self._write_event.record(torch.cuda.current_stream(self.device))

    def gather(self, positions: np.ndarray | torch.Tensor, which: Sequence[int] | None = None
               ) -> list[torch.Tensor]:
        records = self._records
        if records is not None:  # on the CPU: the numpy storage's gather, tensors of it
            if type(positions) is not np.ndarray and isinstance(positions, torch.Tensor):
                positions = positions.numpy()  # (a CPU sampler's tensor)
            # The usual read is numpy's (one take of whole records, the fields typed by
            # one C call) and one torch.from_numpy per leaf, the floor of any tensor
            # construction (the module docstring); each a view of memory gathered
            # fresh for this call.
            gathered = records.gather(positions, which)
            if type(positions) is np.ndarray and positions.ndim:
                return list(map(torch.from_numpy, gathered))
            # take() gives numpy scalars for 0-d reads, read-only as arrays (and fields
            # typed over them likewise): copied, so that no tensor wraps read-only memory
            return [torch.from_numpy(a if type(a) is np.ndarray and a.flags.writeable
                                     else np.array(a)) for a in gathered]
        indices = self._all if which is None else which
        if isinstance(positions, torch.Tensor):  # drawn on the device (device sampling)
            return self._gather_on_device(positions, indices)
        flat = torch.from_numpy(np.remainder(positions, self.capacity, dtype=np.int64)
                                .reshape(-1))
        return self._gather_on_device(flat.to(self.device, non_blocking=True), indices,
                                      positions.shape)

    def _gather_on_device(self, positions: torch.Tensor, indices: Sequence[int],
                          shape: tuple[int, ...] | None = None) -> list[torch.Tensor]:
        """Gather int64 ``positions`` (on the device; taken modulo the capacity unless
        ``shape``, the positions' shape before flattening, says they already are)."""
        if shape is None:
            shape = tuple(positions.shape)
            flat = torch.remainder(positions, self.capacity).reshape(-1)
        else:
            flat = positions
        assert self._packed is not None
        if not self._cuda:
            return self._packed.gather(flat, tuple(shape), indices)
        self.before_read()
        out = self._packed.gather(flat, tuple(shape), indices)
        self.after_read()
        return out

    @property
    def packing(self) -> PackedLeaves | None:
        """The packed blocks of the device layout (leaves of one dtype side by side in
        one tensor); ``None`` for the CPU layout of numpy records."""
        return self._packed

    def before_read(self) -> None:
        """Order a read of the storage issued next on the current CUDA stream after the
        last write (a gather does this itself; for reads made around it, such as a
        recorded CUDA graph of gathers). Nothing on the CPU."""
        if self._cuda and self._write_event is not None:
            torch.cuda.current_stream(self.device).wait_event(self._write_event)

    def after_read(self) -> None:
        """Order the storage's next write after the reads issued so far on the current
        CUDA stream (the pair of :meth:`before_read`). Nothing on the CPU."""
        if self._reads is not None:
            self._reads.mark()

    def from_numpy(self, array: np.ndarray | torch.Tensor) -> torch.Tensor:
        """A numpy array (or scalar) as a tensor on the device; a tensor (ids and
        probabilities drawn on the device) is returned as it is. On the CPU a
        C-contiguous, writeable array is wrapped without a copy (it shares memory with
        the tensor); any other is copied first."""
        # The usual case first, with nothing else before it: ids and probabilities of
        # every CPU get_next come here, fresh C-contiguous arrays.
        # ``carray``: C-contiguous, aligned and writeable, in one flag lookup.
        if type(array) is np.ndarray and array.flags.carray and self._records is not None:
            return torch.from_numpy(array)
        if isinstance(array, torch.Tensor):
            return array
        array = np.asarray(array)  # keeps 0-d arrays 0-d, unlike ascontiguousarray
        flags = array.flags
        if not (flags.c_contiguous and flags.writeable):
            array = array.copy()
        if self._records is not None:  # on the CPU already (.to would cost a call)
            return torch.from_numpy(array)
        return to_device(array, self.device)

    @property
    def wraps_fresh(self) -> Callable[[np.ndarray], torch.Tensor]:
        """What wraps a *fresh* array as a tensor on the device: C-contiguous, aligned,
        writeable and of a dtype torch holds, made for this read alone and shared with
        nothing that is written later (the ids, probabilities and weights of
        ``StepDraws.sample_steps``, whose docstring promises this). On the CPU it is
        plain ``torch.from_numpy`` (no copy; 0.4-1.3 us a read less than
        :meth:`from_numpy`'s checks for three arrays); on a device, :meth:`from_numpy`.
        Given any other array, the CPU's ``torch.from_numpy`` may share memory that
        changes later, or refuse it: callers promise freshness."""
        if self._records is not None:
            return torch.from_numpy
        return self.from_numpy

    def zero(self) -> None:
        if self._reads is not None:
            self._reads.wait()
        if self._packed is not None:
            self._packed.zero()
        else:
            for arr in self.arrays:
                arr.zero_()

    def load(self, arrays: Sequence[np.ndarray], start: int = 0) -> None:
        # Sources may be read-only memory maps; copy them in bounded chunks.
        for dst, src in zip(self.arrays, arrays):
            step = max(1, (64 << 20) // max(1, src[:1].nbytes))
            for i in range(0, len(src), step):
                chunk = np.array(src[i:i + step])
                dst[start + i:start + i + len(chunk)].copy_(torch.from_numpy(chunk))

    def state_dict(self) -> dict[str, Any]:
        """``capacity`` and ``leaves``: every tensor copied to a numpy array on the host,
        ``[capacity, *spec.shape]`` in its spec's dtype."""
        return leaves_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Write back the leaves of :meth:`state_dict` onto this storage's device
        (checked first: ``ValueError`` for another capacity, leaf count, shape or dtype,
        before anything is written)."""
        self.load(checked_leaves(self, state))
