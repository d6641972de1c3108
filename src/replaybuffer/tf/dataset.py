"""``tf.data`` datasets over a :class:`~replaybuffer.tf.TFUniformReplayBuffer`.

:class:`ReplayDataset` is an ordinary ``tf.data.Dataset`` (every transformation,
``tf.function`` and Keras take it) whose Python iterators add the behaviour of
replaybuffer's own datasets: reading an empty buffer raises
:class:`~replaybuffer.EmptyBufferError` with the same message as ``get_next``
(TensorFlow itself raises ``InvalidArgumentError``), a random stream recovers after
such an error, and iterators can be closed (also as a context manager).

Python iteration takes a shorter road than ``tf.data``'s own iterator: it runs the
iterator's ``IteratorGetNext`` op itself and builds the element from the flat tensors
with the buffer's structure (:func:`flat_unpacker`), skipping ``tf.data``'s generic
restructuring of every element, which costs more than sampling a batch does. The
element is the same (same tensors, same nest); where the element spec holds anything
but dense tensors, TensorFlow lacks the private names this relies on, or eager
execution is asynchronous, ``next`` on TensorFlow's iterator is used instead.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

import tensorflow as tf

from replaybuffer.dataset import to_torch
from replaybuffer.errors import EmptyBufferError

try:  # the op behind tf.data's own OwnedIterator.__next__
    from tensorflow.python.ops.gen_dataset_ops import iterator_get_next as _get_next_op
except ImportError:  # pragma: no cover - a TensorFlow without it takes the generic road
    _get_next_op = None

# The buffer's "is empty" and "longer than a row holds" assertions (tf/state.py).
_EMPTY = re.compile(r"assertion failed: \[([^\]]*(?:Make sure to add items before|is longer "
                    r"than a row of)[^\]]*)\]")


def translate_error(exc: BaseException) -> EmptyBufferError | None:
    """The :class:`EmptyBufferError` a TensorFlow error stands for, if it is one of the
    buffer's "is empty" / "has no window" assertions."""
    if not isinstance(exc, tf.errors.InvalidArgumentError):
        return None
    match = _EMPTY.search(exc.message or "")
    return EmptyBufferError(match.group(1)) if match else None


Unpack = Callable[[Sequence[Any]], Any]


def flat_unpacker(element_spec: Any, build: Callable[[list[Any]], Any], count: int
                  ) -> Unpack | None:
    """A function from an iterator's flat tensors to the element ``build`` makes.

    ``build(values)`` makes an element from ``count`` values in the caller's order; an
    iterator returns the element's dense tensors in ``tf.nest`` order of
    ``element_spec`` (a ``None`` in the element is a component without tensors). The
    two orders are matched once, here, by building an element of integers.

    Returns ``None`` when the element spec holds anything but ``tf.TensorSpec`` s and
    ``None`` s, or does not match what ``build`` makes.
    """
    try:
        markers = tf.nest.flatten(build(list(range(count))))
        specs = tf.nest.flatten(element_spec)
    except (TypeError, ValueError):
        return None
    if len(markers) != len(specs):
        return None
    order: list[int] = []
    for marker, spec in zip(markers, specs):
        if marker is None:
            # A None must be a component without tensors (the public view of its
            # flat tensor specs: its components, expanded).
            if tf.nest.flatten(spec, expand_composites=True):
                return None
        elif type(spec) is tf.TensorSpec:
            order.append(marker)
        else:
            return None
    if sorted(order) != list(range(count)):
        return None
    if order == list(range(count)):
        return lambda flat: build(list(flat))

    def unpack(flat: Sequence[Any]) -> Any:
        values: list[Any] = [None] * count
        for position, index in enumerate(order):
            values[index] = flat[position]
        return build(values)
    return unpack


class ReplayDataset(tf.data.Dataset):  # type: ignore[misc]  # TensorFlow is untyped (Any)
    """A buffer's dataset: elements ``(items, BufferInfo)``.

    Args:
        dataset: the pipeline.
        restart_on_error: a random stream: after an empty-buffer error the next pull
            starts a fresh iterator (dropping elements sampled ahead), as the numpy
            buffer's prefetching stream does. A deterministic pass ends instead.
        build, count: how an element is made from its ``count`` tensors (see
            :func:`flat_unpacker`); without them Python iteration uses ``tf.data``'s
            own iterator.

    Attributes:
        restart_on_error: as the argument.
        unpack_flat: the element from the iterator's flat tensors (``None``: use
            ``tf.data``'s own restructuring).
        flat_count: how many flat tensors an element has.
    """

    def __init__(self, dataset: tf.data.Dataset, restart_on_error: bool,
                 build: Callable[[list[Any]], Any] | None = None, count: int = 0):
        self._dataset = dataset
        self.restart_on_error = restart_on_error
        self._build = build
        # tf.data.Dataset's constructor takes the pipeline's variant tensor, which
        # TensorFlow offers no public accessor for (its own wrapping datasets read it
        # the same way).
        super().__init__(dataset._variant_tensor)  # noqa: SLF001
        self.unpack_flat = None if build is None else flat_unpacker(self.element_spec,
                                                                    build, count)
        self.flat_count = count

    def _inputs(self) -> list[tf.data.Dataset]:
        return [self._dataset]

    @property
    def element_spec(self) -> Any:
        return self._dataset.element_spec

    def prefetch(self, buffer_size: Any, name: str | None = None) -> "ReplayDataset":
        """``tf.data.Dataset.prefetch`` that stays a :class:`ReplayDataset` (the same
        elements, this class's iterator and errors), as TF-Agents' tutorials write
        ``as_dataset(...).prefetch(3)``."""
        return ReplayDataset(super().prefetch(buffer_size, name=name),
                             self.restart_on_error, self._build, self.flat_count)

    def __iter__(self) -> Any:
        if not tf.executing_eagerly():  # inside tf.function: TensorFlow's own iterator
            return super().__iter__()
        return ReplayIterator(self)

    def tf_iterator(self) -> Any:
        """TensorFlow's own iterator over this dataset (no :class:`ReplayIterator`
        behaviour: errors are TensorFlow's, elements restructured by ``tf.data``)."""
        return super().__iter__()

    def to_torch(self) -> Any:
        """This dataset as a ``torch.utils.data.IterableDataset`` of torch tensors."""
        return to_torch(self, tf_tensors=True)


class ReplayIterator:
    """Iterates a :class:`ReplayDataset`, raising :class:`EmptyBufferError` for reads of an
    empty buffer. Closed by :meth:`close` or on leaving a ``with`` block."""

    def __init__(self, dataset: ReplayDataset):
        self._dataset = dataset
        self._iterator: Any = None
        self._pull: Callable[[], Any] | None = None
        self._closed = False
        self._start()

    def _start(self) -> None:
        self._iterator = self._dataset.tf_iterator()
        self._pull = _direct_pull(self._iterator, self._dataset.unpack_flat,
                                  self._dataset.flat_count)

    @property
    def element_spec(self) -> Any:
        return self._dataset.element_spec

    def __iter__(self) -> "ReplayIterator":
        return self

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        if self._iterator is None:
            self._start()
        try:
            if self._pull is not None and tf.config.experimental.get_synchronous_execution():
                return self._pull()
            return next(self._iterator)
        except tf.errors.InvalidArgumentError as exc:
            error = translate_error(exc)
            if error is None:
                raise
            if self._dataset.restart_on_error:
                self._iterator = None  # elements sampled ahead saw the empty buffer too
            else:
                self.close()
            raise error from None

    def get_next(self) -> Any:
        return next(self)

    def close(self) -> None:
        """Stop iterating and release the TensorFlow iterator (and its prefetch)."""
        self._closed = True
        self._iterator = self._pull = None

    def __enter__(self) -> "ReplayIterator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _direct_pull(iterator: Any, unpack: Unpack | None, count: int
                 ) -> Callable[[], Any] | None:
    """``next(iterator)`` by the iterator's ``IteratorGetNext`` op and ``unpack``, or
    ``None`` where this TensorFlow's iterator lacks what that needs."""
    resource = getattr(iterator, "_iterator_resource", None)
    types = getattr(iterator, "_flat_output_types", None)
    shapes = getattr(iterator, "_flat_output_shapes", None)
    if unpack is None or _get_next_op is None or resource is None or types is None \
            or shapes is None or not len(types) == len(shapes) == count:
        return None
    get_next = _get_next_op

    def pull() -> Any:
        try:
            flat = get_next(resource, output_types=types, output_shapes=shapes)
        except tf.errors.OutOfRangeError:
            raise StopIteration from None
        return unpack(flat)
    return pull

