"""Storage in TensorFlow variables, on the device TF places them or a named one."""

from __future__ import annotations

import contextlib
from typing import Any, Sequence, cast

import numpy as np
import tensorflow as tf

from replaybuffer.errors import SpecError
from replaybuffer.specs import ArraySpec, can_store, check_leaf
from replaybuffer.storage.base import LeafChecker, checked_leaves, leaf_nbytes, leaves_state


def tf_dtype(dtype: np.dtype) -> tf.DType:
    """The TensorFlow dtype of a numpy dtype; ``SpecError`` if TF has none."""
    try:
        return tf.as_dtype(np.dtype(dtype).newbyteorder("="))
    except TypeError:
        raise SpecError(f"tensorflow storage cannot hold dtype {np.dtype(dtype).name}") from None


def slot_names(specs: Sequence[ArraySpec]) -> list[str]:
    """TF-Agents' ``Table`` slot names: the spec's name or ``slot``, made unique with
    ``_1``, ``_2``, ... (``lidar``, ``lidar_1``; ``slot``, ``slot_1``)."""
    seen: dict[str, int] = {}
    names = []
    for spec in specs:
        base = spec.name or "slot"
        count = seen.get(base, 0)
        seen[base] = count + 1
        names.append(base if count == 0 else f"{base}_{count}")
    return names


def is_tensor(value: Any) -> bool:
    """A ``tf.Tensor`` (eager or symbolic) or a ``tf.Variable``."""
    return isinstance(value, (tf.Tensor, tf.Variable))


class TFStorage:
    """One ``tf.Variable`` of shape ``[capacity, *spec.shape]`` per leaf.

    The variables are zero-initialised, not trainable, and created under
    ``tf.device(device)`` (``None``: wherever TensorFlow places them, a GPU if it sees
    one). Two interfaces share them:

    * graph ops for :class:`~replaybuffer.tf.TFUniformReplayBuffer`:
      :meth:`convert_tensors`, :meth:`scatter` and :meth:`take` take and return
      tensors and work inside ``tf.function``;
    * the :class:`~replaybuffer.storage.Storage` protocol (numpy positions, eager), so
      that every other buffer class also runs on ``storage="tensorflow"``: its ring
      stays in Python, so those buffers work eagerly, not inside ``tf.function``.

    Positions are the buffer's to assign: :class:`~replaybuffer.tf.TFUniformReplayBuffer`
    keeps rows contiguous (TF-Agents' layout, :mod:`replaybuffer.tf.ring`), the other
    buffers keep the numpy storage's slot-major layout (:mod:`replaybuffer.sampling.ring`).

    Args:
        specs: leaf specs, in nest flatten order.
        capacity: number of positions.
        device: a TensorFlow device name (``"/CPU:0"``, ``"/GPU:0"``); ``None`` for
            TensorFlow's placement.
        scope: name scope of the variables (TF-Agents names them ``<scope>/<slot>``).
    """

    kind = "tensorflow"

    def __init__(self, specs: Sequence[ArraySpec], capacity: int, device: Any = None,
                 scope: str = "TFStorage"):
        self.specs = tuple(specs)
        self.capacity = int(capacity)
        self.dtypes = [tf_dtype(s.dtype) for s in self.specs]
        self.checker = LeafChecker(self.specs)
        self._shapes = [tuple(s.shape) for s in self.specs]
        placement = tf.device(device) if device is not None else contextlib.nullcontext()
        try:
            with placement, tf.name_scope(scope):
                self.arrays = [
                    tf.Variable(tf.zeros((self.capacity,) + shape, dtype), trainable=False,
                                name=name)
                    for shape, dtype, name in zip(self._shapes, self.dtypes,
                                                  slot_names(self.specs))]
        except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError, ValueError) as exc:
            raise ValueError(f"tensorflow storage cannot be placed on device {device!r}: "
                             f"{exc}") from exc
        self.device = self.arrays[0].device
        for spec, var in zip(self.specs, self.arrays):  # some dtypes lack kernels
            try:
                with tf.device(self.device):
                    var.scatter_update(tf.IndexedSlices(tf.gather(var, [0]),
                                                        tf.constant([0], tf.int64)))
            except (tf.errors.NotFoundError, tf.errors.InvalidArgumentError) as exc:
                raise SpecError(f"tensorflow storage on {self.device} cannot hold dtype "
                                f"{spec.dtype.name}: {exc.message.splitlines()[0]}") from exc

    @property
    def nbytes(self) -> int:
        return leaf_nbytes(self.specs, self.capacity)

    # ----------------------------------------------------------------- graph ops
    def convert_tensors(self, leaves: Sequence[Any], paths: Sequence[str],
                        outer_shape: tuple[int | None, ...], outer_names: str
                        ) -> list[tf.Tensor]:
        """Validate leaves (leading dims ``outer_shape``; ``None``: any) and return them
        as tensors of the stored dtypes. See :meth:`validate`."""
        return [v if is_tensor(v) else tf.convert_to_tensor(v)
                for v in self.validate(leaves, paths, outer_shape, outer_names)]

    def validate(self, leaves: Sequence[Any], paths: Sequence[str],
                 outer_shape: tuple[int | None, ...], outer_names: str) -> list[Any]:
        """Validate leaves (leading dims ``outer_shape``; ``None``: any) and return them
        in the stored dtypes: numpy arrays stay numpy, tensors stay tensors.

        Checks run on static shapes and dtypes, so inside ``tf.function`` they fail
        when the function is traced. A dimension that is only known at run time is
        checked then, by ``tf.ensure_shape``, before anything is written.

        Raises:
            SpecError: naming the leaf path, for a wrong shape, dtype or kind of value.
        """
        out: list[Any] = []
        known = None not in outer_shape
        shapes: Sequence[tuple[int | None, ...]] | None = \
            self.checker.full_shapes(cast("tuple[int, ...]", outer_shape)) if known else None
        for i, leaf in enumerate(leaves):
            spec = self.specs[i]
            if is_tensor(leaf):
                out.append(self._convert_tensor(i, leaf, paths[i], outer_shape, outer_names))
                continue
            leaf_outer = outer_shape
            if shapes is not None:
                shape = shapes[i]
            else:  # numpy data has every dimension: fill in what the caller lacks
                shape = outer_shape + spec.shape
                arr = np.shape(leaf)
                if len(arr) == len(shape):
                    shape = tuple(a if s is None else s for s, a in zip(shape, arr))
                    leaf_outer = shape[:len(outer_shape)]
            arr = self.checker.numpy_leaf(i, leaf, shape, paths[i], leaf_outer, outer_names)
            if arr.dtype != spec.dtype:  # safe casts, and big-endian data to native order
                arr = arr.astype(spec.dtype)
            out.append(arr)
        return out

    def _convert_tensor(self, i: int, leaf: Any, path: str,
                        outer_shape: tuple[int | None, ...], outer_names: str) -> Any:
        spec, dtype = self.specs[i], self.dtypes[i]
        expected = tuple(outer_shape) + spec.shape
        got = tuple(leaf.shape.as_list()) if leaf.shape.rank is not None else None
        if got is not None and (len(got) != len(expected) or any(
                g is not None and e is not None and g != e for g, e in zip(got, expected))):
            if None not in got and None not in expected:  # the numpy path's message
                check_leaf(path, got, np.dtype(spec.dtype), spec, tuple(outer_shape),
                           outer_names)
            raise SpecError(f"leaf {path}: expected shape {expected} (leading dimensions "
                            f"{outer_names} then the spec shape {spec.shape}), got {got}")
        if leaf.dtype != dtype:
            try:
                value_dtype = np.dtype(leaf.dtype.as_numpy_dtype)
            except TypeError:
                value_dtype = np.dtype(object)
            if not can_store(value_dtype, spec.dtype):
                raise SpecError(f"leaf {path}: expected dtype {spec.dtype.name} (or one that "
                                f"casts to it within its kind), got {leaf.dtype.name}")
        if isinstance(leaf, tf.Variable):
            leaf = leaf.read_value()
        if leaf.dtype != dtype:
            leaf = tf.cast(leaf, dtype)
        if got is None or None in got:
            leaf = tf.ensure_shape(leaf, expected)  # what is unknown is checked at run time
        return leaf

    def scatter(self, positions: Any, leaves: Sequence[Any]) -> list[Any]:
        """Write ``leaves[i]`` (``[n, *spec.shape]``) at ``positions`` (int64 ``[n]``,
        distinct). Returns the update ops (for control dependencies)."""
        return [var.scatter_update(tf.IndexedSlices(leaf, positions))
                for var, leaf in zip(self.arrays, leaves)]

    def take(self, positions: Any, which: Sequence[int] | None = None) -> list[tf.Tensor]:
        """Read ``positions`` (int64, any shape P): leaf ``i`` comes back
        ``[*P, *spec_i.shape]``."""
        arrays = self.arrays if which is None else [self.arrays[i] for i in which]
        return [tf.gather(var, positions) for var in arrays]

    def zero_ops(self) -> list[Any]:
        return [var.assign(tf.zeros_like(var)) for var in self.arrays]

    # ---------------------------------------------------- the Storage protocol
    def convert(self, leaves: Sequence[Any], paths: Sequence[str],
                outer_shape: tuple[int, ...], outer_names: str) -> list[np.ndarray]:
        """Validated numpy arrays in the stored dtypes (eager tensors are copied to host)."""
        arrays = self.validate(leaves, paths, outer_shape, outer_names)
        return [a.numpy() if is_tensor(a) else a for a in arrays]

    def exact_writer(self, outer_shape: tuple[int, ...]) -> None:
        """No shortcut: every write is a scatter into TF variables."""
        return None

    def write(self, start: int, leaves: Sequence[Any]) -> None:
        count = len(leaves[0])
        self.scatter(tf.range(start, start + count, dtype=tf.int64), leaves)

    def gather(self, positions: np.ndarray, which: Sequence[int] | None = None
               ) -> list[tf.Tensor]:
        return self.take(np.remainder(positions, self.capacity, dtype=np.int64), which)

    def from_numpy(self, array: np.ndarray) -> tf.Tensor:
        with tf.device(self.device):
            return tf.identity(tf.convert_to_tensor(np.asarray(array)))

    def zero(self) -> None:
        self.zero_ops()

    def state_dict(self) -> dict[str, Any]:
        """``capacity`` and ``leaves``: every variable's value as a numpy array."""
        return leaves_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Write back the leaves of :meth:`state_dict` (checked first)."""
        self.load(checked_leaves(self, state))

    def load(self, arrays: Sequence[np.ndarray], start: int = 0) -> None:
        # Sources may be read-only memory maps; copy them in bounded chunks.
        for var, src in zip(self.arrays, arrays):
            step = max(1, (64 << 20) // max(1, src[:1].nbytes))
            for i in range(0, len(src), step):
                chunk = np.array(src[i:i + step])
                var[start + i:start + i + len(chunk)].assign(chunk)
