"""Array specs: the shape and dtype of one leaf of the data a buffer stores.

A *data spec* is any nest (tuples, namedtuples, dicts, lists) of
:class:`ArraySpec` / :class:`BoundedArraySpec`. Specs can be written by hand,
or derived from gymnasium spaces (:func:`spec_from_space`), from anything with
``.shape`` and ``.dtype`` such as a ``tf.TensorSpec`` or a torch tensor
(:func:`spec_from_tensor_spec`), or from example arrays (:func:`spec_from_example`).
:func:`as_data_spec` accepts a nest mixing all of these.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

from replaybuffer import nest
from replaybuffer.errors import SpecError

__all__ = [
    "ArraySpec",
    "BoundedArraySpec",
    "as_data_spec",
    "spec_from_example",
    "spec_from_space",
    "spec_from_tensor_spec",
]


class ArraySpec:
    """The shape and dtype of one array.

    Args:
        shape: a tuple of non-negative ints (``()`` for a scalar).
        dtype: anything ``np.dtype`` accepts (``np.float32``, ``"uint8"``).
        name: an optional name, used in messages and as the storage slot name.
    """

    __slots__ = ("_shape", "_dtype", "_name")

    def __init__(self, shape: Iterable[int], dtype: Any, name: str | None = None):
        try:
            shape_t = tuple(int(d) for d in shape)
        except TypeError as exc:  # None dims, non-iterables
            hint = (f" (one dimension is written ({shape},))"
                    if isinstance(shape, (int, np.integer)) else "")
            raise SpecError(f"ArraySpec shape must be a tuple of ints, got {shape!r}"
                            + hint) from exc
        if any(d < 0 for d in shape_t):
            raise SpecError(f"ArraySpec shape must be non-negative, got {shape_t}")
        try:
            dt = np.dtype(dtype)
        except TypeError as exc:
            # A torch or TensorFlow dtype is the likely slip; the tensor-spec path takes them.
            raise SpecError(f"ArraySpec dtype {dtype!r} is not a numpy dtype: pass one such as "
                            "np.float32 (rb.spec_from_tensor_spec takes torch and "
                            "TensorFlow tensors and specs)") from exc
        if dt.hasobject:
            raise SpecError(f"ArraySpec dtype {dt} holds Python objects; use a numeric dtype")
        if dt.byteorder not in "=|":  # stored data is always native byte order
            dt = dt.newbyteorder("=")
        self._shape = shape_t
        self._dtype: np.dtype = dt
        self._name = name

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def name(self) -> str | None:
        return self._name

    @property
    def nbytes(self) -> int:
        """Bytes one item of this spec takes."""
        return int(np.prod(self._shape, dtype=np.int64)) * self._dtype.itemsize

    def zeros(self, outer_shape: Sequence[int] = ()) -> np.ndarray:
        """An all-zero array of shape ``outer_shape + self.shape`` and this dtype."""
        return np.zeros(tuple(outer_shape) + self._shape, self._dtype)

    def replace(self, **changes: Any) -> "ArraySpec":
        """A copy with some of ``shape``, ``dtype``, ``name`` changed."""
        kwargs: dict[str, Any] = {"shape": self._shape, "dtype": self._dtype, "name": self._name}
        kwargs.update(changes)
        return ArraySpec(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly description (see :func:`spec_from_dict`)."""
        return {"kind": "array", "shape": list(self._shape), "dtype": self._dtype.str,
                "name": self._name}

    def __eq__(self, other: object) -> bool:
        return (type(other) is type(self) and other.shape == self._shape
                and other.dtype == self._dtype and other.name == self._name)

    def __hash__(self) -> int:
        return hash((type(self), self._shape, self._dtype, self._name))

    def __repr__(self) -> str:
        return f"ArraySpec(shape={self._shape}, dtype={self._dtype.name}, name={self._name!r})"


class BoundedArraySpec(ArraySpec):
    """An :class:`ArraySpec` with inclusive ``minimum`` and ``maximum`` bounds.

    The bounds broadcast to ``shape`` and are stored as arrays of ``dtype``.
    Discrete actions with ``n`` choices are ``BoundedArraySpec((), int64, 0, n - 1)``.
    """

    __slots__ = ("_minimum", "_maximum")

    def __init__(self, shape: Iterable[int], dtype: Any, minimum: Any, maximum: Any,
                 name: str | None = None):
        super().__init__(shape, dtype, name)
        try:
            lo = np.broadcast_to(np.asarray(minimum, self.dtype), self.shape).copy()
            hi = np.broadcast_to(np.asarray(maximum, self.dtype), self.shape).copy()
        except (ValueError, TypeError) as exc:
            raise SpecError(
                f"BoundedArraySpec bounds must broadcast to shape {self.shape}: "
                f"minimum={minimum!r}, maximum={maximum!r}") from exc
        if np.any(lo > hi):
            raise SpecError(f"BoundedArraySpec minimum {minimum!r} exceeds maximum {maximum!r}")
        lo.flags.writeable = False
        hi.flags.writeable = False
        self._minimum: np.ndarray = lo
        self._maximum: np.ndarray = hi

    @property
    def minimum(self) -> np.ndarray:
        return self._minimum

    @property
    def maximum(self) -> np.ndarray:
        return self._maximum

    def replace(self, **changes: Any) -> "BoundedArraySpec":
        kwargs: dict[str, Any] = {"shape": self.shape, "dtype": self.dtype, "name": self.name,
                                  "minimum": self._minimum, "maximum": self._maximum}
        kwargs.update(changes)
        return BoundedArraySpec(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d.update(kind="bounded", minimum=self._minimum.tolist(), maximum=self._maximum.tolist())
        return d

    def __eq__(self, other: object) -> bool:
        return (super().__eq__(other) and isinstance(other, BoundedArraySpec)
                and np.array_equal(other.minimum, self._minimum)
                and np.array_equal(other.maximum, self._maximum))

    def __hash__(self) -> int:
        return super().__hash__()

    def __repr__(self) -> str:
        def short(a: np.ndarray) -> Any:
            return a.flat[0].item() if a.size and np.all(a == a.flat[0]) else a.tolist()
        return (f"BoundedArraySpec(shape={self.shape}, dtype={self.dtype.name}, "
                f"name={self.name!r}, minimum={short(self._minimum)}, "
                f"maximum={short(self._maximum)})")


def spec_from_dict(d: dict[str, Any]) -> ArraySpec:
    """Inverse of :meth:`ArraySpec.to_dict`."""
    if d.get("kind") == "bounded":
        return BoundedArraySpec(d["shape"], np.dtype(d["dtype"]), d["minimum"], d["maximum"],
                                d.get("name"))
    if d.get("kind") == "array":
        return ArraySpec(d["shape"], np.dtype(d["dtype"]), d.get("name"))
    raise SpecError(f"not a serialised spec: {d!r}")


def spec_from_space(space: Any) -> Any:
    """The data spec of a gymnasium space.

    ``Box`` gives a :class:`BoundedArraySpec` with its bounds; ``Discrete(n, start)``
    a scalar ``int64`` spec bounded by ``[start, start + n - 1]``; ``MultiDiscrete``
    the same per element; ``MultiBinary`` an ``int8`` spec bounded by ``[0, 1]``;
    ``Dict`` a dict and ``Tuple`` a tuple of specs.
    """
    from gymnasium import spaces  # optional dependency, imported only here

    if isinstance(space, spaces.Box):
        return BoundedArraySpec(space.shape, space.dtype, space.low, space.high)
    if isinstance(space, spaces.Discrete):
        first = int(space.start)
        return BoundedArraySpec((), space.dtype, first, first + int(space.n) - 1)
    if isinstance(space, spaces.MultiDiscrete):
        start = np.asarray(space.start)
        return BoundedArraySpec(space.shape, space.dtype, start, start + space.nvec - 1)
    if isinstance(space, spaces.MultiBinary):
        return BoundedArraySpec(space.shape, space.dtype, 0, 1)
    if isinstance(space, spaces.Dict):
        return {key: spec_from_space(sub) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(spec_from_space(sub) for sub in space.spaces)
    if hasattr(space, "observation_space") and hasattr(space, "action_space"):
        # The usual first mistake: the environment itself instead of one of its spaces.
        # A vector env's own spaces carry the env axis; one env's are its single_*.
        single = "single_" if hasattr(space, "single_observation_space") else ""
        raise SpecError(
            f"spec_from_space: got an environment ({type(space).__name__}), not a space: "
            f"pass env.{single}observation_space or env.{single}action_space; for whole "
            "trajectories use "
            "StepDriver(env, policy).data_spec, for transitions "
            "TransitionReplayBuffer.from_env(env, capacity=...)")
    if not isinstance(space, spaces.Space):
        # A space of the legacy gym package bears gymnasium's names (Box, Dict...).
        legacy = (" of the legacy gym package: make the env with gymnasium"
                  if type(space).__module__.partition(".")[0] == "gym" else "")
        raise SpecError(f"spec_from_space: expected a gymnasium space, got "
                        f"{type(space).__name__}{legacy} (rb.spec_from_example takes "
                        "example arrays, rb.spec_from_tensor_spec anything with .shape "
                        "and .dtype)")
    raise SpecError(
        f"cannot store gymnasium space {type(space).__name__}: it has no fixed shape "
        "(supported: Box, Discrete, MultiDiscrete, MultiBinary, Dict, Tuple)")


def numpy_dtype(dtype: Any) -> np.dtype:
    """The numpy dtype of a numpy, TensorFlow or torch dtype."""
    result: np.dtype
    if hasattr(dtype, "as_numpy_dtype"):  # tf.DType
        result = np.dtype(dtype.as_numpy_dtype)
    elif type(dtype).__module__ == "torch":
        import torch  # only reached when the caller already uses torch

        result = torch.empty((), dtype=dtype).numpy().dtype
    else:
        result = np.dtype(dtype)
    return result


def spec_from_tensor_spec(obj: Any, name: str | None = None) -> ArraySpec:
    """An :class:`ArraySpec` from anything with ``.shape`` and ``.dtype``.

    That covers ``tf.TensorSpec`` (its ``name`` is kept), numpy arrays and torch
    tensors. Every dimension must be known: a buffer preallocates its storage.
    """
    shape = obj.shape
    dims = list(shape.as_list()) if hasattr(shape, "as_list") else list(shape)
    if any(d is None for d in dims):
        raise SpecError(f"spec {obj!r} has an unknown dimension in shape {dims}; "
                        "a buffer needs every dimension to preallocate its storage")
    try:
        dtype = numpy_dtype(obj.dtype)
    except TypeError as exc:
        raise SpecError(f"spec {obj!r} has dtype {obj.dtype!r} with no numpy equivalent") from exc
    if name is None:
        name = getattr(obj, "name", None)
        name = name if isinstance(name, str) and name else None
    lo, hi = getattr(obj, "minimum", None), getattr(obj, "maximum", None)
    if lo is not None and hi is not None and not callable(lo):  # tf BoundedTensorSpec
        return BoundedArraySpec(dims, dtype, np.asarray(lo), np.asarray(hi), name)
    return ArraySpec(dims, dtype, name)


def spec_from_example(example: Any) -> Any:
    """The data spec of one example item (a nest of arrays or scalars).

    Python scalars take numpy's default dtypes (``float64``, ``int64``, ``bool``);
    pass ``np.float32(0.0)`` for a float32 leaf.
    """
    def leaf_spec(x: Any) -> ArraySpec:
        if hasattr(x, "shape") and hasattr(x, "dtype"):
            return spec_from_tensor_spec(x)
        arr = np.asarray(x)
        if arr.dtype.hasobject:
            raise SpecError(f"example leaf {x!r} is not numeric")
        return ArraySpec(arr.shape, arr.dtype)

    return nest.map_structure(leaf_spec, example)


def _is_space(obj: Any) -> bool:
    return any(c.__module__.startswith("gymnasium") and c.__name__ == "Space"
               for c in type(obj).__mro__)


def as_data_spec(data_spec: Any) -> Any:
    """Normalise a nest whose leaves are specs, gymnasium spaces or tensor specs.

    Returns the same nest with every leaf an :class:`ArraySpec`. Raises
    :class:`SpecError` for a nest with no leaves or a leaf that is none of these.
    """
    def convert(x: Any, path: str) -> Any:
        if isinstance(x, ArraySpec):
            return x
        if _is_space(x):
            return spec_from_space(x)
        if hasattr(x, "shape") and hasattr(x, "dtype"):
            return spec_from_tensor_spec(x)
        # A bare int is most often a shape written where a spec belongs ({"obs": (4,)}).
        hint = (" (a shape alone is not a spec: write rb.ArraySpec(shape, dtype))"
                if isinstance(x, int) else "")
        raise SpecError(f"data_spec leaf {path} is {x!r} ({type(x).__name__}): expected an "
                        "ArraySpec, a gymnasium space or an object with .shape and .dtype"
                        + hint)

    # Spaces are leaves to optree; converting one may produce a nest (Dict, Tuple),
    # so convert and flatten again.
    leaves, structure = nest.flatten(data_spec)
    converted = nest.unflatten(structure, [
        convert(leaf, path) for leaf, path in zip(leaves, nest.leaf_paths(data_spec))])
    leaves, _ = nest.flatten(converted)
    if not leaves:
        raise SpecError(f"data_spec {data_spec!r} has no array leaves")
    return converted


def can_store(value_dtype: np.dtype, spec_dtype: np.dtype) -> bool:
    """Whether a value of ``value_dtype`` may be written into a leaf of ``spec_dtype``.

    The rule is numpy's ``same_kind``, widened to let any integer into any integer
    leaf: a float64 into a float32 leaf and an int64 into a uint8 leaf are fine (RL
    code produces those all the time); a float into an integer leaf, or anything
    but bool into a bool leaf, is refused.
    """
    if value_dtype == spec_dtype:
        return True
    if value_dtype.kind in "iu" and spec_dtype.kind in "iu":
        return True
    return bool(np.can_cast(value_dtype, spec_dtype, "same_kind"))


def check_leaf(path: str, shape: tuple[int, ...], dtype: np.dtype, spec: ArraySpec,
               outer_shape: tuple[int | None, ...], outer_names: str) -> None:
    """Raise :class:`SpecError` unless a value of ``shape``/``dtype`` fits ``spec``.

    Args:
        path: the leaf's path in the nest, for the message.
        shape, dtype: of the value offered.
        spec: the leaf's spec.
        outer_shape: leading dimensions expected before ``spec.shape`` (``None``: one not
            known, which no value matches).
        outer_names: what those dimensions are, for the message (``"[batch_size=32]"``).
    """
    expected = outer_shape + spec.shape
    if shape != expected:
        if shape[len(outer_shape):] == spec.shape or len(shape) == len(expected):
            hint = f"leading dimensions {outer_names} then the spec shape {spec.shape}"
        else:
            hint = f"the spec shape {spec.shape} after {outer_names}"
        raise SpecError(f"leaf {path}: expected shape {expected} ({hint}), got {shape}")
    if dtype != spec.dtype and not can_store(dtype, spec.dtype):
        raise SpecError(f"leaf {path}: expected dtype {spec.dtype.name} (or one that casts to it "
                        f"within its kind), got {dtype.name}")


def as_leaf_array(leaf: Any, path: str) -> np.ndarray:
    """``np.asarray(leaf)`` for a value offered at leaf ``path``, refusing containers.

    A list, tuple or dict where an array belongs means the nest does not match the
    spec; converting it silently would let ``[[1, 2]]`` stand in for an array.
    """
    if isinstance(leaf, (list, tuple, dict)):
        raise SpecError(f"leaf {path}: expected an array, got a {type(leaf).__name__} "
                        "(nests must match the data_spec; pass arrays as leaves)")
    if hasattr(leaf, "detach") and hasattr(leaf, "cpu"):  # a torch tensor, maybe with grad
        leaf = leaf.detach().cpu()
    try:
        arr = np.asarray(leaf)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise SpecError(f"leaf {path}: cannot convert {type(leaf).__name__} to an array") from exc
    if arr.dtype.hasobject:
        raise SpecError(f"leaf {path}: expected a numeric array, got {type(leaf).__name__}")
    return arr
