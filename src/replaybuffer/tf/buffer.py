"""TF-Agents' ``TFUniformReplayBuffer``: the uniform buffer with its state in TensorFlow.

Everything that changes lives in TensorFlow state: the data in ``tf.Variable`` s
(:class:`~replaybuffer.tf.TFStorage`), the write counter ``last_id`` in an int64
variable, the sampler's generator in a ``tf.random.Generator``. The ring arithmetic
is :mod:`replaybuffer.tf.ring` (the formulas of :mod:`replaybuffer.sampling.ring` in
TF ops), so ``add_batch``, ``extend``, ``get_next``, ``gather_all`` and ``clear``
work eagerly and inside ``tf.function`` alike, and ``as_dataset`` is a
``tf.data.Dataset``. A ``tf.CriticalSection`` makes each of them atomic, whichever
thread, function or dataset runs it.

Build one with ``replaybuffer.UniformReplayBuffer(..., storage="tensorflow")`` or
``replaybuffer.compat.tf_agents.TFUniformReplayBuffer(data_spec, batch_size)``.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, TypeVar

import numpy as np
import tensorflow as tf

from replaybuffer import nest
from replaybuffer.arguments import positive_or_none
from replaybuffer.protocols import BufferInfo
from replaybuffer.buffers.uniform import UniformReplayBuffer
from replaybuffer.errors import EmptyBufferError, ReplayBufferError, SpecError
from replaybuffer.sampling.deterministic import check_not_all_dropped
from replaybuffer.sampling.ring import Ring, items_per_row
from replaybuffer.specs import ArraySpec, as_data_spec
from replaybuffer.tf import deterministic as det
from replaybuffer.tf import ring
from replaybuffer.tf.dataset import ReplayDataset, translate_error
from replaybuffer.tf.ring import INT
from replaybuffer.tf.sampler import TFUniformSampler
from replaybuffer.storage.frozen import FrozenRows, static_rows
from replaybuffer.tf.storage import TFStorage, is_tensor


F = TypeVar("F", bound=Callable[..., Any])


def _plain_errors(method: F) -> F:
    """Let this library's errors leave a ``tf.function`` as they are.

    AutoGraph re-raises an exception from converted code as a ``StagingError`` unless
    it is one of a few built-in types or carries ``ag_pass_through``; a ``SpecError``
    must reach the caller as a ``SpecError``. The buffer's methods hold no Python
    control flow on tensors, so AutoGraph has nothing to convert in them.
    """
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except (ReplayBufferError, ValueError) as exc:
            exc.ag_pass_through = True  # type: ignore[union-attr]  # AutoGraph's marker
            raise
    # do_not_convert (untyped, like all of TensorFlow) keeps method's signature.
    unconverted: F = tf.autograph.experimental.do_not_convert(wrapper)
    return unconverted


class TFUniformReplayBuffer(UniformReplayBuffer):
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
        >>> import numpy as np, tensorflow as tf, replaybuffer as rb
        >>> buf = rb.UniformReplayBuffer(tf.TensorSpec([3], tf.float32), batch_size=2,
        ...                              max_length=10, storage="tensorflow", seed=0)
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
        if storage != "tensorflow":
            raise ValueError(f"{type(self).__name__} keeps its data in TensorFlow variables: "
                             f"storage must be 'tensorflow', got {storage!r}")
        if table_fn is not None:
            raise ValueError("table_fn is not supported: the buffer keeps one tf.Variable "
                             "per leaf (see replaybuffer.tf.TFStorage)")
        if frame_stack is not None:
            raise ValueError(f"frame_stack needs storage='numpy', got {storage!r}")
        if track_episodes:
            raise ValueError("track_episodes keeps episode starts in Python, which "
                             f"{type(self).__name__} cannot; use UniformReplayBuffer(..., "
                             "storage='tensorflow', track_episodes=True) for an eager "
                             "buffer with tensorflow storage")
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
        self._storage = TFStorage(self._specs, self._B * self._L, device, scope)
        with tf.device(self._storage.device), tf.name_scope(scope):
            self._last_id = tf.Variable(tf.constant(-1, INT), trainable=False, name="last_id")
            self._cs = tf.CriticalSection(name="critical_section")
        self._sampler = TFUniformSampler(seed, self._storage.device)
        B, dtypes = self._B, self._storage.dtypes
        add_signature = [tf.TensorSpec((B,) + s.shape, d) for s, d in zip(self._specs, dtypes)]
        extend_signature = [tf.TensorSpec((B, None) + s.shape, d)
                            for s, d in zip(self._specs, dtypes)]
        self._add_fn = _compile(self._add_graph, [add_signature])
        self._extend_fn = _compile(self._extend_graph, [extend_signature])
        self._gather_all_fn = _compile(self._gather_all_graph, [])
        self._range_fn = _compile(self._range_graph, [])
        self._spawn_fn = _compile(lambda: self._cs.execute(self._sampler.spawn_seed), [])
        self._snapshot_fn = _compile(self._snapshot_graph, [])
        self._functions: dict[tuple[Any, ...], Callable[..., Any]] = {}

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
    def scope(self) -> str:
        return self._scope

    @property
    def table_fn(self) -> None:
        return None

    @property
    def stateful_dataset(self) -> bool:
        return self._stateful_dataset

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
        """The data variables, ``last_id`` and the generator's state (for
        ``tf.train.Checkpoint`` or inspection). A data variable is
        ``[batch_size * max_length, *spec.shape]``, step ``id`` of row ``b`` at
        ``b * max_length + id % max_length`` (TF-Agents' table layout)."""
        return (*self._storage.arrays, self._last_id, self._sampler.generator.state)

    # ----------------------------------------------------------------- write path
    # add_batch, extend and get_next run in TF graphs: no rate limiter (timeout, block),
    # and nothing to report (a bool) or hold back (None).
    @_plain_errors
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

    @_plain_errors
    def extend(self, items: Any) -> None:  # type: ignore[override]
        """Append ``num_steps`` consecutive steps to every row in one call.

        Args:
            items: a nest matching ``data_spec`` whose leaves have shape
                ``[batch_size, num_steps, *spec.shape]``, oldest step first.
        """
        leaves = self.flatten_items(items, "extend")
        B = self._B
        first = leaves[0]
        dims = tuple(first.shape.as_list()) if is_tensor(first) and first.shape.rank is not None \
            else (None, None) if is_tensor(first) else tuple(np.shape(first))
        if len(dims) <= 1:
            raise SpecError(f"extend: leaf {self._paths[0]}: expected leading dimensions "
                            f"[batch_size={B}, num_steps] before the spec shape "
                            f"{self._specs[0].shape}, got shape {dims}")
        steps = dims[1]
        values = self._storage.convert_tensors(
            leaves, self._paths, (B, steps), f"[batch_size={B}, num_steps={steps}]")
        self._extend_fn(values)

    def _add_graph(self, leaves: list[tf.Tensor]) -> tf.Tensor:
        L = self._L
        rows = tf.constant(np.arange(self._B), INT)

        def body() -> tf.Tensor:
            # Readers take the same critical section, so the order of the increment and
            # the writes inside it is free: incrementing first reads last_id only once.
            first = self._last_id.assign_add(1).read_value()
            writes = self._storage.scatter(ring.positions(first, rows, L), leaves)
            with tf.control_dependencies(writes):
                return tf.identity(first)
        return self._cs.execute(body)

    def _extend_graph(self, leaves: list[tf.Tensor]) -> tf.Tensor:
        B, L = self._B, self._L
        steps = tf.shape(leaves[0], out_type=INT)[1]

        def body() -> tf.Tensor:
            first = self._last_id.read_value() + 1
            skip, positions = ring.write_positions(first, steps, L, B)
            # Rows are contiguous in storage: [B, T] items go in row by row as they are.
            writes = self._storage.scatter(positions, [
                tf.reshape(leaf[:, skip:], (-1,) + spec.shape)
                for leaf, spec in zip(leaves, self._specs)])
            with tf.control_dependencies(writes):
                done = self._last_id.assign_add(steps, read_value=False)
            with tf.control_dependencies([done]):
                return tf.identity(first)
        return self._cs.execute(body)

    # ------------------------------------------------------------------ read path
    def empty_error(self, num_steps: int = 1, action: str = "sampling the buffer"
                     ) -> EmptyBufferError:
        """The error for ``num_steps`` longer than a row (known without reading state)."""
        return EmptyBufferError(f"num_steps={num_steps} can never be read from "
                                f"{type(self).__name__}: it exceeds max_length={self._L}")

    def _no_window_message(self, last_id: tf.Tensor, num_steps: int, action: str
                           ) -> tf.Tensor:
        """The message of the empty / no-window assertion (that of the numpy buffer).

        A read fails only while a row holds fewer than ``num_steps`` steps (none: the
        buffer is empty), so up to 64 steps the message is picked from a constant table
        of those cases: two ops per read instead of formatting a string every time.
        """
        name, L = type(self).__name__, self._L
        empty = f"{name} is empty. Make sure to add items before {action}."
        head = f"{name} has no window of num_steps={num_steps}: each row holds "
        tail = f" steps (max_length={L}). Make sure to add items before {action}."
        if num_steps == 1:  # only an empty buffer fails
            return tf.constant(empty)
        held = ring.items_per_row(last_id, L)
        if num_steps <= 64:
            table = [empty] + [f"{head}{k}{tail}" for k in range(1, num_steps)]
            return tf.gather(tf.constant(table), tf.minimum(held, num_steps - 1))
        short = tf.strings.join([head, tf.strings.as_string(held), tail])
        return tf.where(last_id < 0, tf.constant(empty), short)

    @_plain_errors
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
            return self._unflatten_sample(fn(), num_steps, time_stacked)
        try:
            flat = fn()
        except tf.errors.InvalidArgumentError as exc:
            error = translate_error(exc)
            if error is None:
                raise
            raise error from None
        return self._unflatten_sample(flat, num_steps, time_stacked)

    def _unflatten_sample(self, flat: Any, num_steps: int | None, time_stacked: bool
                          ) -> tuple[Any, BufferInfo]:
        leaves, ids, probabilities = flat
        if num_steps is not None and not time_stacked:
            return (tuple(self._structure.unflatten(step) for step in leaves),
                    BufferInfo(tuple(ids), probabilities))
        return self._structure.unflatten(leaves), BufferInfo(ids, probabilities)

    def _sample_function(self, sample_batch_size: int | None, num_steps: int | None,
                         time_stacked: bool, seeded: bool) -> Callable[..., Any]:
        """The compiled sampler for one combination of arguments (built once)."""
        key = ("sample", sample_batch_size, num_steps, time_stacked, seeded)
        fn = self._functions.get(key)
        if fn is None:
            def sample(seed: Any = None) -> Any:
                return self._sample_graph(sample_batch_size, num_steps, time_stacked, seed)
            signature = [tf.TensorSpec([2], INT)] if seeded else []
            fn = self._functions[key] = _compile(sample, signature)
        return fn

    def _sample_graph(self, sample_batch_size: int | None, num_steps: int | None,
                      time_stacked: bool, seed: Any = None) -> Any:
        """``(leaves, ids, probabilities)`` of one sample, shaped for the caller."""
        B, L = self._B, self._L
        count, steps = sample_batch_size or 1, num_steps or 1

        def body() -> Any:
            last_id = self._last_id.read_value()
            lo, hi = ring.valid_start_range(last_id, L, steps)
            n = (hi - lo) * B
            check = tf.debugging.Assert(n > 0, [self._no_window_message(
                last_id, steps, "sampling the buffer")])
            with tf.control_dependencies([check]):
                draws = self._sampler.draw(count, n, seed)
            ids, rows = ring.draws_to_starts(draws, lo, B)
            if num_steps is not None:
                ids, rows = ids[:, None] + tf.range(num_steps, dtype=INT), rows[:, None]
            leaves = self._storage.take(ring.positions(ids, rows, L))
            probabilities = tf.fill([count], tf.cast(1.0 / tf.cast(n, tf.float64),
                                                     tf.float32))
            return leaves, ids, probabilities

        leaves, ids, probabilities = self._cs.execute(body)
        if sample_batch_size is None:
            leaves = [leaf[0] for leaf in leaves]
            ids, probabilities = ids[0], probabilities[0]
        if num_steps is not None and not time_stacked:
            axis = 0 if sample_batch_size is None else 1
            leaves = [[tf.gather(leaf, t, axis=axis) for leaf in leaves]
                      for t in range(num_steps)]
            ids = [tf.gather(ids, t, axis=axis) for t in range(num_steps)]
        return leaves, ids, probabilities

    @_plain_errors
    def gather_all(self) -> Any:
        """Every retained step, ``[batch_size, items_per_row, D]`` per leaf, each row
        oldest first; an empty buffer gives ``[batch_size, 0, D]``."""
        return self._structure.unflatten(self._gather_all_fn())

    def _gather_all_graph(self) -> list[tf.Tensor]:
        B, L = self._B, self._L

        def body() -> list[tf.Tensor]:
            # Storage is row-major ([B, L] per leaf), the layout gather_all returns: one
            # copy per leaf. Until the ring wraps the oldest step is in slot 0 and only
            # the first count slots are read; after, every slot is, rolled to put the
            # oldest first. (A roll by 0 still copies; a gather of [B, count] positions
            # is TF-Agents' way and about a tenth slower than either.)
            last_id = self._last_id.read_value()
            oldest, count = ring.oldest_id(last_id, L), ring.items_per_row(last_id, L)
            out = []
            for var, spec in zip(self._storage.arrays, self._specs):
                table = tf.reshape(var.read_value(), (B, L) + spec.shape)
                out.append(tf.cond(count < L, lambda t=table: t[:, :count],
                                   lambda t=table: tf.roll(t, -(oldest % L), axis=1)))
            return out
        leaves: list[tf.Tensor] = self._cs.execute(body)
        return leaves

    @_plain_errors
    def clear(self, zero_storage: bool = False) -> None:
        """Forget every step: ``last_id`` goes back to -1.

        Args:
            zero_storage: also overwrite the variables with zeros (otherwise they are
                only unlinked).
        """
        key = ("clear", bool(zero_storage))
        fn = self._functions.get(key)
        if fn is None:
            fn = self._functions[key] = _compile(lambda: self._clear_graph(zero_storage), [])
        fn()

    def _clear(self, clear_all_variables: bool = False) -> None:
        """TF-Agents' name: :meth:`clear` with ``zero_storage=clear_all_variables``."""
        self.clear(zero_storage=clear_all_variables)

    def _clear_graph(self, zero_storage: bool) -> tf.Tensor:
        def body() -> tf.Tensor:
            ops = [self._last_id.assign(tf.constant(-1, INT), read_value=False)]
            if zero_storage:
                ops += self._storage.zero_ops()
            with tf.control_dependencies(ops):
                return tf.constant(-1, INT)
        return self._cs.execute(body)

    # ------------------------------------------------------------------- datasets
    @_plain_errors
    def as_dataset(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                   num_parallel_calls: int | None = None,
                   single_deterministic_pass: bool = False, *,
                   prefetch: int | None = None, drop_remainder: bool | None = None,
                   window_shift: int | None = None, within_episodes: bool = False
                   ) -> ReplayDataset:
        """A ``tf.data.Dataset`` of ``(items, BufferInfo)`` elements.

        Random mode (default) is infinite: each element is a fresh sample with
        ``time_stacked=True``, drawn when it is computed. With ``num_parallel_calls=k``
        elements are sampled by ``k`` parallel calls and ``prefetch`` elements (default
        ``2 * k``) are kept ready; without either, an element is sampled when it is
        pulled, so it sees the buffer as it is then. Elements come in the same order
        whatever the parallelism, and a seeded buffer gives the same stream each run.

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
            return ReplayDataset(self._deterministic_dataset(
                sample_batch_size, num_steps, shift, bool(drop)), restart_on_error=False,
                build=self._element_builder(()), count=len(self._specs) + 1)
        num_parallel_calls = positive_or_none(num_parallel_calls, "num_parallel_calls")
        if prefetch is not None and (isinstance(prefetch, bool) or
                                     not isinstance(prefetch, (int, np.integer)) or
                                     prefetch < 0):
            raise ValueError(f"prefetch must be a non-negative int or None, got {prefetch!r}")
        if num_steps is not None and num_steps > self._L:
            raise self.empty_error(num_steps)
        return ReplayDataset(self._random_dataset(sample_batch_size, num_steps,
                                                  num_parallel_calls, prefetch),
                             restart_on_error=True, build=self._element_builder(None),
                             count=len(self._specs) + 2)

    def _element_builder(self, probabilities: Any) -> Callable[[list[Any]], Any]:
        """Makes a dataset element ``(items, BufferInfo)`` from its tensors: the leaves in
        flatten order, then ``ids``, then ``probabilities`` unless it is given (the
        deterministic pass's ``()``)."""
        unflatten, n = self._structure.unflatten, len(self._specs)
        if probabilities is None:
            return lambda values: (unflatten(values[:n]), BufferInfo(values[n], values[n + 1]))
        return lambda values: (unflatten(values[:n]), BufferInfo(values[n], probabilities))

    def _random_dataset(self, sample_batch_size: int | None, num_steps: int | None,
                        num_parallel_calls: int | None, prefetch: int | None
                        ) -> tf.data.Dataset:
        sample = self._sample_function(sample_batch_size, num_steps, True, True)

        def element(seed: tf.Tensor, i: tf.Tensor) -> Any:  # element i draws with (seed, i)
            key = tf.random.experimental.stateless_fold_in(seed, i)
            return self._unflatten_sample(sample(key), num_steps, True)

        def stream(seed: tf.Tensor) -> tf.data.Dataset:
            counter = tf.data.Dataset.counter(dtype=INT)
            if num_parallel_calls is None:
                return counter.map(lambda i: element(seed, i))
            return counter.map(lambda i: element(seed, i),
                               num_parallel_calls=num_parallel_calls, deterministic=True)

        # The seed is drawn from the buffer's generator when iteration starts.
        seeds = tf.data.Dataset.from_tensors(tf.constant(0, INT)).map(
            lambda _: self._spawn_fn())
        dataset = seeds.flat_map(stream)
        ahead = prefetch if prefetch is not None else 2 * (num_parallel_calls or 0)
        if ahead:
            return dataset.prefetch(ahead)
        options = tf.data.Options()  # sample on pull: nothing may run ahead
        options.experimental_optimization.inject_prefetch = False
        options.autotune.enabled = False  # nothing to tune: no parallelism, no buffer
        return dataset.with_options(options)

    def _range_graph(self) -> tuple[tf.Tensor, tf.Tensor]:
        """``(oldest id, steps per row)``, asserting that the buffer is not empty."""
        message = (f"{type(self).__name__} is empty. Make sure to add items before asking "
                   "the buffer for data.")

        def body() -> tuple[tf.Tensor, tf.Tensor]:
            last_id = self._last_id.read_value()
            check = tf.debugging.Assert(last_id >= 0, [tf.constant(message)])
            with tf.control_dependencies([check]):
                return ring.oldest_id(last_id, self._L), ring.items_per_row(last_id, self._L)
        oldest_and_count: tuple[tf.Tensor, tf.Tensor] = self._cs.execute(body)
        return oldest_and_count

    def _deterministic_dataset(self, sample_batch_size: int | None, num_steps: int | None,
                               shift: int | None, drop_remainder: bool) -> tf.data.Dataset:
        L = self._L
        groups = det.row_groups(self._B, sample_batch_size, drop_remainder)
        outer: list[int | None] = []
        if sample_batch_size is not None:
            uniform = all(rows == sample_batch_size for _, rows in groups)
            outer.append(sample_batch_size if uniform else None)
        if num_steps is not None:
            outer.append(num_steps if drop_remainder else None)
        shapes = [tuple(outer) + spec.shape for spec in self._specs]

        def read(first: tf.Tensor, group: tf.Tensor, offset: tf.Tensor, length: tf.Tensor
                 ) -> Any:
            ids, rows = det.block(first, group, offset, length, groups, sample_batch_size,
                                  num_steps)
            positions = ring.positions(ids, rows, L)  # also TF-Agents' physical rows
            leaves = self._cs.execute(lambda: self._storage.take(positions))
            leaves = [tf.ensure_shape(leaf, shape) for leaf, shape in zip(leaves, shapes)]
            physical = tf.ensure_shape(positions, tuple(outer))
            return self._structure.unflatten(leaves), BufferInfo(physical, ())

        def elements(first: tf.Tensor, num_frames: tf.Tensor) -> tf.data.Dataset:
            plan = det.plan(num_frames, len(groups), num_steps, shift, drop_remainder)
            return tf.data.Dataset.from_tensor_slices(plan).map(
                lambda g, o, n: read(first, g, o, n))

        start = tf.data.Dataset.from_tensors(tf.constant(0, INT)).map(
            lambda _: self._range_fn())
        return start.flat_map(elements)

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

    def _snapshot_graph(self) -> Any:
        B, L = self._B, self._L

        def body() -> Any:
            # Checkpoints hold the stored slots in the numpy storage's slot-major order
            # ([slots, B] flattened), so that every backend loads them.
            last_id = self._last_id.read_value()
            slots = ring.items_per_row(last_id, L)
            arrays = []
            for var, spec in zip(self._storage.arrays, self._specs):
                rows = tf.reshape(var.read_value(), (B, L) + spec.shape)[:, :slots]
                slot_major = tf.transpose(rows, [1, 0, *range(2, 2 + len(spec.shape))])
                arrays.append(tf.reshape(slot_major, (-1,) + spec.shape))
            return last_id, self._sampler.generator.state.read_value(), arrays
        return self._cs.execute(body)

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
        last_id, rng_state, arrays = self._snapshot_fn()
        sampler = self._sampler.state_dict(rng_state.numpy())
        leaves = static_rows([a.numpy() for a in arrays], self._storage.specs, self._paths)
        return {"last_id": int(last_id), "sampler": sampler}, {"leaves": leaves}

    def stream_targets(self, state: dict[str, Any]) -> dict[str, tuple[
            tuple[ArraySpec, ...], int, Callable[[int, list[np.ndarray]], None]]]:
        count = items_per_row(int(state["last_id"]), self._L) * self._B
        return {"leaves": (self._storage.specs, count, self._load_slot_major)}

    def _load_slot_major(self, start: int, arrays: list[np.ndarray]) -> None:
        """Write ``arrays`` (``[n, *spec.shape]`` per leaf) at the slot-major positions
        ``[start, start + n)`` of a checkpoint, in bounded chunks (sources may be
        read-only memory maps)."""
        count = len(arrays[0]) if arrays else 0
        step = max(1, (64 << 20) // max(1, sum(a[:1].nbytes for a in arrays)))
        for i in range(0, count, step):
            n = min(step, count - i)
            slot_major = np.arange(start + i, start + i + n, dtype=np.int64)
            positions = ring.slot_major_to_positions(slot_major, self._L, self._B)
            self._storage.scatter(tf.constant(positions),
                                  [tf.constant(np.array(a[i:i + n])) for a in arrays])

    def restore_state(self, state: dict[str, Any], arrays: list[np.ndarray] | None) -> None:
        with self._lock:
            if arrays is not None:
                self._load_slot_major(0, arrays)
            self._last_id.assign(int(state["last_id"]))
            self._sampler.load_state_dict(state["sampler"])


class _compile:
    """``fn`` as a ``tf.function`` for ``signature``, traced on its first eager call.

    Eager calls go straight to the traced concrete function: that skips
    ``tf.function``'s dispatch (about a third of an eager call's cost), and tracing
    outside ``tf.function.__call__`` keeps TensorFlow from warning about "frequent
    retracing" when a program builds several buffers (each traces the same code once).

    Called while a graph is being built (the user's ``tf.function``, a ``tf.data``
    function), ``fn`` builds its ops in that graph, as TF-Agents' buffer does: a call of
    the nested function made ``add_batch`` inside ``tf.function`` 2-4% slower (about
    10 us a call, in 40 interleaved rounds of 200 calls against building in place).
    """

    __slots__ = ("_fn", "_function", "_concrete")

    def __init__(self, fn: Callable[..., Any], signature: list[Any]):
        self._fn = fn
        self._function = tf.function(fn, input_signature=signature, autograph=False)
        self._concrete: Any = None

    def __call__(self, *args: Any) -> Any:
        if not tf.executing_eagerly():
            return self._fn(*args)
        concrete = self._concrete
        if concrete is None:
            concrete = self._concrete = self._function.get_concrete_function()
        return concrete(*args)
