"""``tf.data`` datasets over a :class:`~replaybuffer.tf.TFUniformReplayBuffer`.

:class:`ReplayDataset` is an ordinary ``tf.data.Dataset`` (every transformation,
``tf.function`` and Keras take it) whose Python iterators add the behaviour of
replaybuffer's own datasets: reading an empty buffer raises
:class:`~replaybuffer.EmptyBufferError` with the same message as ``get_next``
(TensorFlow itself raises ``InvalidArgumentError``), a random stream recovers after
such an error, and iterators can be closed (also as a context manager).
"""

from __future__ import annotations

import re
from typing import Any, Iterator

import numpy as np
import tensorflow as tf

from replaybuffer.errors import EmptyBufferError

_EMPTY = re.compile(r"assertion failed: \[([^\]]*Make sure to add items before[^\]]*)\]")


def translate_error(exc: BaseException) -> EmptyBufferError | None:
    """The :class:`EmptyBufferError` a TensorFlow error stands for, if it is one of the
    buffer's "is empty" / "has no window" assertions."""
    if not isinstance(exc, tf.errors.InvalidArgumentError):
        return None
    match = _EMPTY.search(exc.message or "")
    return EmptyBufferError(match.group(1)) if match else None


class ReplayDataset(tf.data.Dataset):  # type: ignore[misc]  # TensorFlow is untyped (Any)
    """A buffer's dataset: elements ``(items, BufferInfo)``.

    Args:
        dataset: the pipeline.
        restart_on_error: a random stream: after an empty-buffer error the next pull
            starts a fresh iterator (dropping elements sampled ahead), as the numpy
            buffer's prefetching stream does. A deterministic pass ends instead.
    """

    def __init__(self, dataset: tf.data.Dataset, restart_on_error: bool):
        self._dataset = dataset
        self._restart_on_error = restart_on_error
        super().__init__(dataset._variant_tensor)

    def _inputs(self) -> list[tf.data.Dataset]:
        return [self._dataset]

    @property
    def element_spec(self) -> Any:
        return self._dataset.element_spec

    def __iter__(self) -> Any:
        if not tf.executing_eagerly():  # inside tf.function: TensorFlow's own iterator
            return super().__iter__()
        return ReplayIterator(self)

    def _tf_iterator(self) -> Any:
        return super().__iter__()

    def to_torch(self) -> Any:
        """This dataset as a ``torch.utils.data.IterableDataset`` of torch tensors."""
        from replaybuffer.dataset import to_torch

        return to_torch(_TorchView(self))


class ReplayIterator:
    """Iterates a :class:`ReplayDataset`, raising :class:`EmptyBufferError` for reads of an
    empty buffer. Closed by :meth:`close` or on leaving a ``with`` block."""

    def __init__(self, dataset: ReplayDataset):
        self._dataset = dataset
        self._iterator: Any = dataset._tf_iterator()
        self._closed = False

    @property
    def element_spec(self) -> Any:
        return self._dataset.element_spec

    def __iter__(self) -> "ReplayIterator":
        return self

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        if self._iterator is None:
            self._iterator = self._dataset._tf_iterator()
        try:
            return next(self._iterator)
        except tf.errors.InvalidArgumentError as exc:
            error = translate_error(exc)
            if error is None:
                raise
            if self._dataset._restart_on_error:
                self._iterator = None  # elements sampled ahead saw the empty buffer too
            else:
                self.close()
            raise error from None

    def get_next(self) -> Any:
        return next(self)

    def close(self) -> None:
        """Stop iterating and release the TensorFlow iterator (and its prefetch)."""
        self._closed = True
        self._iterator = None

    def __enter__(self) -> "ReplayIterator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _TorchView:
    """Elements of a dataset with every tensor converted to a CPU torch tensor."""

    def __init__(self, dataset: ReplayDataset):
        self._dataset = dataset

    def __iter__(self) -> Iterator[Any]:
        import torch

        from replaybuffer import nest

        for element in self._dataset:
            yield nest.map_structure(lambda t: torch.from_numpy(np.asarray(t.numpy())), element)
