"""TF-Agents' ``TFUniformReplayBuffer``: the uniform buffer with its state in TensorFlow.

Everything that changes lives in TensorFlow state: the data in ``tf.Variable`` s
(:class:`~replaybuffer.tf.TFStorage`), the write counter ``last_id`` in an int64
variable, the sampler's generator in a ``tf.random.Generator``. The ring arithmetic
is :mod:`replaybuffer.tf.ring` (the formulas of :mod:`replaybuffer.sampling.ring` in
TF ops), so ``add_batch``, ``extend``, ``get_next``, ``gather_all`` and ``clear``
work eagerly and inside ``tf.function`` alike, and ``as_dataset`` is a
``tf.data.Dataset``. A ``tf.CriticalSection`` makes each of them atomic, whichever
thread, function or dataset runs it.

The buffer wires parts, each in its own module: the state and its graph functions
(:mod:`replaybuffer.tf.state`), the ``tf.data`` pipelines
(:mod:`replaybuffer.tf.pipelines`, wrapped by :mod:`replaybuffer.tf.dataset`),
checkpoints (:mod:`replaybuffer.tf.checkpoint`) and TF-Agents' constructor options
(:mod:`replaybuffer.tf.agents_options`); this class checks arguments and
turns flat tensors into nests.

Build one by name: ``replaybuffer.tf.TFUniformReplayBuffer(data_spec, batch_size,
max_length)`` or ``replaybuffer.compat.tf_agents.TFUniformReplayBuffer(...)`` (the same
class). ``replaybuffer.UniformReplayBuffer(..., storage="tensorflow")`` is the Python
ring over TensorFlow variables instead (eager only).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import tensorflow as tf

from replaybuffer import nest
from replaybuffer.arguments import positive_or_none
from replaybuffer.buffers.uniform import UniformReplayBuffer
from replaybuffer.errors import EmptyBufferError, SpecError
from replaybuffer.persist.savable import StreamTarget
from replaybuffer.protocols import BufferInfo
from replaybuffer.sampling.deterministic import check_not_all_dropped
from replaybuffer.sampling.ring import Ring
from replaybuffer.specs import as_data_spec
from replaybuffer.storage.frozen import FrozenRows
from replaybuffer.tf import pipelines, ring
from replaybuffer.tf.agents_options import TFAgentsOptions, refuse_unsupported
from replaybuffer.tf.checkpoint import TFCheckpoint
from replaybuffer.tf.compiled import plain_errors
from replaybuffer.tf.dataset import ReplayDataset, translate_error
from replaybuffer.tf.sampler import TFUniformSampler
from replaybuffer.tf.stamp import StampedGeneration
from replaybuffer.tf.state import TFRingState, unflatten_sample
from replaybuffer.tf.storage import TFStorage, is_tensor
from replaybuffer.tf.trackable import CheckpointedContents


def leaf_dims(leaf: Any) -> tuple[int | None, ...]:
    """The shape of an item leaf as a tuple (``None`` for a tensor's unknown dimension;
    ``(None, None)`` for a tensor of unknown rank)."""
    if is_tensor(leaf):
        return tuple(leaf.shape.as_list()) if leaf.shape.rank is not None else (None, None)
    return tuple(np.shape(leaf))


class TFUniformReplayBuffer(StampedGeneration, UniformReplayBuffer, TFAgentsOptions,
                            CheckpointedContents):
    """A uniform replay buffer whose state is TensorFlow variables.

    The layout, the reads and every error are those of
    :class:`~replaybuffer.UniformReplayBuffer` (TF-Agents' ``TFUniformReplayBuffer``
    with its documented fixes); items, ids and probabilities come back as
    ``tf.Tensor`` s. All methods work eagerly and inside ``tf.function``: checks of
    structure, shape and dtype run in Python, so in a ``tf.function`` they fail when it
    is traced; a read of an empty buffer can only be known when the graph runs, and
    raises ``tf.errors.InvalidArgumentError`` there with the message of the
    :class:`~replaybuffer.EmptyBufferError` raised eagerly (and by datasets' iterators).

    Args:
        data_spec: a nest of :class:`~replaybuffer.ArraySpec`, ``tf.TensorSpec`` s,
            gymnasium spaces, or anything with ``.shape`` and ``.dtype``.
        batch_size: rows; every ``add_batch`` item has this leading dimension.
        max_length: steps kept per row.
        scope: name scope of the variables (``<scope>/<slot>``, slots named as
            TF-Agents' ``Table`` names them).
        device: where the variables live (``"/CPU:0"``, ``"/GPU:0"``, ``"cpu:*"``);
            ``None``: where TensorFlow places them (a GPU if it sees one).
        table_fn: TF-Agents' table factory; only ``None`` is supported.
        dataset_drop_remainder, dataset_window_shift: defaults of ``as_dataset``'s
            ``drop_remainder`` and ``window_shift`` (TF-Agents' constructor options).
        stateful_dataset: kept for TF-Agents' API (``tf.data`` in TF 2 needs nothing).
        storage: must be ``"tensorflow"``.
        seed: seeds the ``tf.random.Generator`` behind ``get_next`` and ``as_dataset``.
        track_episodes, frame_stack, stack_axis: not available here; build
            ``UniformReplayBuffer(..., storage="tensorflow", track_episodes=True)`` for
            an eager buffer with a Python ring and tensorflow storage.

    Example:
        >>> import tensorflow as tf
        >>> from replaybuffer.tf import TFUniformReplayBuffer
        >>> buf = TFUniformReplayBuffer(tf.TensorSpec([3], tf.float32), batch_size=2,
        ...                             max_length=10, seed=0)
        >>> buf.add_batch(tf.ones([2, 3]))
        >>> items, info = buf.get_next(sample_batch_size=4)
        >>> items.shape, info.probabilities.numpy().tolist()
        (TensorShape([4, 3]), [0.5, 0.5, 0.5, 0.5])
    """

    _storage: TFStorage
    # Draws in TF ops, not the numpy Sampler protocol: every method using it is this class's.
    _sampler: TFUniformSampler  # type: ignore[assignment]

    def __init__(self, data_spec: Any, batch_size: int = 1, max_length: int = 1000,
                 scope: str = "TFUniformReplayBuffer", device: Any = None,
                 table_fn: Any = None, dataset_drop_remainder: bool = False,
                 dataset_window_shift: int | None = None, stateful_dataset: bool = False, *,
                 storage: str = "tensorflow", seed: int | None = None,
                 track_episodes: bool = False, frame_stack: str | None = None,
                 stack_axis: int = 0):
        refuse_unsupported(type(self).__name__, storage, table_fn, frame_stack,
                           track_episodes)
        layout = Ring(batch_size, max_length)  # validates both
        self._B, self._L = layout.batch_size, layout.max_length
        self._data_spec = as_data_spec(data_spec)
        specs, self._structure = nest.flatten(self._data_spec)
        self._specs = tuple(specs)
        self._paths = nest.leaf_paths(self._data_spec)
        self._fast_flatten = nest.fast_flattener(self._data_spec)
        self._codec = None
        self._episodes = None
        self._lock = threading.Lock()  # persistence holds it; TF state has its own lock
        self._outer = (self._B,)
        self._outer_names = f"[batch_size={self._B}]"
        self._seed = seed
        self._frame_config = {"frame_stack": None, "stack_axis": stack_axis}
        self._scope = scope
        self._dataset_drop_remainder = bool(dataset_drop_remainder)
        self._dataset_window_shift = positive_or_none(dataset_window_shift,
                                                       "dataset_window_shift")
        self._stateful_dataset = bool(stateful_dataset)
        state = TFRingState(self._specs, self._B, self._L, device, scope, seed,
                            type(self).__name__)
        self._state = state
        self._storage = state.storage
        self._sampler = state.sampler
        self._last_id = state.last_id
        self._checkpoint = TFCheckpoint(state, self._paths)
        # The graph functions the hot paths call, bound once.
        self._add_fn = state.add
        self._extend_fn = state.extend
        self._gather_all_fn = state.gather_all
        self._sample_function = state.sample_function

    # ----------------------------------------------------------------- properties
    @property
    def capacity(self) -> int:
        """Steps the buffer can hold: ``batch_size * max_length`` (a Python int)."""
        return self._B * self._L

    @property
    def batch_size(self) -> int:
        return self._B

    @property
    def max_length(self) -> int:
        return self._L

    @property
    def last_id(self) -> Any:
        """Id of the newest step (-1 when empty): a Python int eagerly, an int64 tensor
        inside ``tf.function``."""
        if tf.executing_eagerly():
            return int(self._last_id.numpy())
        return self._last_id.read_value()

    def num_frames(self) -> Any:
        """Steps held, ``min(adds * batch_size, capacity)``: an int eagerly, an int64
        tensor inside ``tf.function``."""
        if tf.executing_eagerly():
            return min(int(self._last_id.numpy()) + 1, self._L) * self._B
        return ring.items_per_row(self._last_id.read_value(), self._L) * self._B

    def __len__(self) -> int:
        return min(int(self._last_id.numpy()) + 1, self._L) * self._B

    def variables(self) -> tuple[tf.Variable, ...]:
        """The data variables, ``last_id``, the generator's state and the int64
        :mod:`~replaybuffer.tf.stamp` (restore them all together). A data variable
        is ``[batch_size * max_length, *spec.shape]``, step ``id`` of row ``b`` at
        ``b * max_length + id % max_length`` (TF-Agents' table layout)."""
        return (*self._storage.arrays, self._last_id, self._sampler.generator.state,
                self._state.stamp.variable)

    # ----------------------------------------------------------------- write path
    # add_batch, extend and get_next run in TF graphs: no rate limiter (timeout, block),
    # and nothing to report (a bool) or hold back (None).
    @plain_errors
    def add_batch(self, items: Any) -> None:  # type: ignore[override]
        """Append one step to every row (eagerly or inside ``tf.function``).

        Args:
            items: a nest matching ``data_spec`` whose leaves have shape
                ``[batch_size, *spec.shape]``: tensors, numpy arrays or array-likes of a
                dtype that casts to the leaf's within its kind.

        Raises:
            SpecError: wrong structure, shape, batch size or dtype; the message names
                the leaf. Nothing is written.
        """
        leaves = self.flatten_items(items, "add_batch")
        values = self._storage.convert_tensors(leaves, self._paths, self._outer,
                                               self._outer_names)
        self._add_fn(values)

    @plain_errors
    def extend(self, items: Any) -> None:  # type: ignore[override]
        """Append ``num_steps`` consecutive steps to every row in one call.

        Args:
            items: a nest matching ``data_spec`` whose leaves have shape
                ``[batch_size, num_steps, *spec.shape]``, oldest step first.
        """
        leaves = self.flatten_items(items, "extend")
        B = self._B
        dims = leaf_dims(leaves[0])
        if len(dims) <= 1:
            raise SpecError(f"extend: leaf {self._paths[0]}: expected leading dimensions "
                            f"[batch_size={B}, num_steps] before the spec shape "
                            f"{self._specs[0].shape}, got shape {dims}")
        steps = dims[1]
        values = self._storage.convert_tensors(
            leaves, self._paths, (B, steps), f"[batch_size={B}, num_steps={steps}]")
        self._extend_fn(values)

    # ------------------------------------------------------------------ read path
    def empty_error(self, num_steps: int = 1, action: str = "sampling the buffer"
                     ) -> EmptyBufferError:
        """The error for ``num_steps`` longer than a row (known without reading state)."""
        return EmptyBufferError(f"num_steps={num_steps} can never be read from "
                                f"{type(self).__name__}: it exceeds max_length={self._L}")

    @plain_errors
    def get_next(self,  # type: ignore[override]
                 sample_batch_size: int | None = None, num_steps: int | None = None,
                 time_stacked: bool = True, *, within_episodes: bool = False
                 ) -> tuple[Any, BufferInfo]:
        """Sample items (with replacement) and return ``(items, BufferInfo)`` of tensors.

        Shapes as :meth:`replaybuffer.UniformReplayBuffer.get_next`: items ``[D]``,
        ``[S, D]``, ``[T, D]`` or ``[S, T, D]`` (a T-tuple of ``[D]`` / ``[S, D]``
        unstacked); ``BufferInfo.ids`` int64 with the items' outer shape;
        ``probabilities`` float32 ``[S]`` (a scalar without ``S``).

        Raises:
            EmptyBufferError: the buffer is empty or holds fewer than ``num_steps`` steps
                per row (inside ``tf.function``: ``tf.errors.InvalidArgumentError`` with
                the same message, when the graph runs; ``num_steps > max_length`` is
                refused when it is traced).
        """
        sample_batch_size = positive_or_none(sample_batch_size, "sample_batch_size")
        num_steps = positive_or_none(num_steps, "num_steps")
        if within_episodes:
            raise self.untracked_error()
        if (num_steps or 1) > self._L:
            raise self.empty_error(num_steps or 1)
        fn = self._sample_function(sample_batch_size, num_steps, bool(time_stacked), False)
        if not tf.executing_eagerly():
            return unflatten_sample(self._structure, fn(), num_steps, time_stacked)
        try:
            flat = fn()
        except tf.errors.InvalidArgumentError as exc:
            error = translate_error(exc)
            if error is None:
                raise
            raise error from None
        return unflatten_sample(self._structure, flat, num_steps, time_stacked)

    @plain_errors
    def gather_all(self) -> Any:
        """Every retained step, ``[batch_size, items_per_row, D]`` per leaf, each row
        oldest first; an empty buffer gives ``[batch_size, 0, D]``."""
        return self._structure.unflatten(self._gather_all_fn())

    @plain_errors
    def clear(self, zero_storage: bool = False) -> None:
        """Forget every step: ``last_id`` goes back to -1.

        Args:
            zero_storage: also overwrite the variables with zeros (otherwise they are
                only unlinked).
        """
        self._state.clear_function(zero_storage)()

    # ------------------------------------------------------------------- datasets
    @plain_errors
    def as_dataset(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                   num_parallel_calls: int | None = None,
                   single_deterministic_pass: bool = False, *,
                   prefetch: int | None = None, drop_remainder: bool | None = None,
                   window_shift: int | None = None, within_episodes: bool = False
                   ) -> ReplayDataset:
        """A ``tf.data.Dataset`` of ``(items, BufferInfo)`` elements.

        Random mode (default) is infinite: each element a fresh sample with
        ``time_stacked=True``. Without ``num_parallel_calls`` and ``prefetch`` the next
        element is drawn ahead of its pull, as TF-Agents' dataset does (steps added
        after that draw are not in it); one drawn before a ``clear()``/restore or while
        rows held no window is drawn again at the pull. ``prefetch=0`` samples at the
        pull; ``num_parallel_calls=k`` keeps ``prefetch`` (default ``2 * k``) ready.
        The order never depends on these: a seeded buffer left unchanged while it is
        read gives the same stream.

        ``single_deterministic_pass=True`` visits every retained step once, in the
        order of :mod:`replaybuffer.sampling.deterministic` (rows kept apart after the
        ring wraps; partial windows and groups kept unless ``drop_remainder``). The
        index range is read when iteration starts. Its ``BufferInfo.ids`` are physical
        row indices and ``probabilities`` is ``()``.

        ``element_spec`` is the data spec with the leading ``[S, T]`` dimensions (those
        a deterministic pass may leave partial are ``None``).

        Raises:
            ValueError: the data spec contains Python lists (use tuples), or
                ``drop_remainder`` would drop all data.
            EmptyBufferError: ``num_steps`` exceeds ``max_length`` (random mode); from
                the iterator, a pull from an empty buffer.
        """
        if nest.contains_lists(self._data_spec):
            raise ValueError("as_dataset needs a data_spec without Python lists: convert "
                             f"them to tuples (data_spec={self._data_spec!r})")
        sample_batch_size = positive_or_none(sample_batch_size, "sample_batch_size")
        num_steps = positive_or_none(num_steps, "num_steps")
        if within_episodes:
            raise self.untracked_error()
        if single_deterministic_pass:
            drop = self._dataset_drop_remainder if drop_remainder is None else drop_remainder
            shift = positive_or_none(window_shift, "window_shift") or \
                self._dataset_window_shift
            check_not_all_dropped(self._B, self._L, sample_batch_size, num_steps, drop)
            return ReplayDataset(pipelines.deterministic_dataset(
                self._state, self._structure, sample_batch_size, num_steps, shift,
                bool(drop)), restart_on_error=False,
                build=pipelines.element_builder(self._structure, len(self._specs), ()),
                count=len(self._specs) + 1)
        num_parallel_calls = positive_or_none(num_parallel_calls, "num_parallel_calls")
        if prefetch is not None and (isinstance(prefetch, bool) or
                                     not isinstance(prefetch, (int, np.integer)) or
                                     prefetch < 0):
            raise ValueError(f"prefetch must be a non-negative int or None, got {prefetch!r}")
        if num_steps is not None and num_steps > self._L:
            raise self.empty_error(num_steps)
        return ReplayDataset(pipelines.random_dataset(self._state, self._structure,
                                                      sample_batch_size, num_steps,
                                                      num_parallel_calls, prefetch),
                             restart_on_error=True,
                             build=pipelines.element_builder(self._structure,
                                                             len(self._specs), None),
                             count=len(self._specs) + 2)

    # ---------------------------------------------------------------- persistence
    def constructor_config(self) -> dict[str, Any]:
        # The keys of UniformReplayBuffer's, so that numpy and torch buffers load a save.
        return {"seed": self._seed, "track_episodes": False, **self._frame_config}

    @classmethod
    def rebuild(cls, data_spec: Any, batch_size: int, max_length: int, storage: str,
                   device: Any, config: dict[str, Any]) -> UniformReplayBuffer:
        if storage != "tensorflow":  # a TensorFlow save restored into another backend
            return UniformReplayBuffer(data_spec, batch_size, max_length, storage=storage,
                                       device=device, **config)
        return cls(data_spec, batch_size, max_length, device=device, **config)

    @property
    def rate_limiter(self) -> None:
        """Always ``None``: this buffer's adds and samples run inside TensorFlow graphs,
        where no Python limiter can make them wait."""
        return None

    @rate_limiter.setter
    def rate_limiter(self, limiter: Any) -> None:
        raise ValueError("rate limiters pace Python-side adds and samples; this TensorFlow "
                         "buffer adds and samples inside graphs: use storage='numpy' or "
                         "'torch' for a rate-limited buffer")

    def snapshot(self) -> tuple[dict[str, Any], dict[str, FrozenRows]]:
        """``(state, streams)`` for persistence, read atomically in one graph call.

        The variables are copied to the host whole: TensorFlow writes them inside its
        own graphs, where no copy-on-write hook can run.
        """
        return self._checkpoint.snapshot()

    def stream_targets(self, state: dict[str, Any]) -> dict[str, StreamTarget]:
        return self._checkpoint.stream_targets(state)

    def restore_state(self, state: dict[str, Any], arrays: list[np.ndarray] | None) -> None:
        with self._lock:
            self._checkpoint.restore(state, arrays)
