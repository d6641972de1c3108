"""The TensorFlow buffer's state and the graph functions that read and write it.

:class:`TFRingState` holds everything of a
:class:`~replaybuffer.tf.TFUniformReplayBuffer` that changes: the data variables
(:class:`~replaybuffer.tf.TFStorage`), the write counter ``last_id`` (an int64
variable) and the sampler's ``tf.random.Generator``. Each graph function runs its reads
and writes inside one ``tf.CriticalSection``, so it is atomic whichever thread,
function or dataset runs it; the ring arithmetic is :mod:`replaybuffer.tf.ring`. The
functions take and return flat lists of tensors, one per leaf in flatten order; the
buffer turns them into nests.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import tensorflow as tf

from replaybuffer.protocols import BufferInfo
from replaybuffer.specs import ArraySpec
from replaybuffer.tf import ring
from replaybuffer.tf.compiled import CompiledFunction
from replaybuffer.tf.ring import INT
from replaybuffer.tf.sampler import TFUniformSampler
from replaybuffer.tf.stamp import ContentStamp
from replaybuffer.tf.storage import TFStorage


class TFRingState:
    """A ring of ``batch_size`` rows of ``max_length`` steps in TensorFlow state.

    Args:
        specs: the leaves' specs, in flatten order.
        batch_size, max_length: the layout (validated by the caller).
        device: where the variables live (``None``: TensorFlow's placement).
        scope: name scope of the variables (``<scope>/<slot>``, ``<scope>/last_id``).
        seed: seeds the generator (``None``: fresh entropy).
        owner: the buffer class's name, for error messages.

    Attributes:
        storage: the data variables, ``[batch_size * max_length, *spec.shape]`` each,
            step ``id`` of row ``b`` at ``b * max_length + id % max_length``.
        last_id: int64 scalar variable, the id of the newest step (-1: empty).
        stamp: the :class:`~replaybuffer.tf.stamp.ContentStamp` that tells a sample
            drawn ahead of its pull from one drawn before a ``clear()`` or a restore.
        critical_section: the ``tf.CriticalSection`` every graph function runs in.
        sampler: the :class:`~replaybuffer.tf.TFUniformSampler`.
        add: ``add([B, *shape] per leaf) -> first id`` (int64 scalar): one step per row.
        extend: ``extend([B, T, *shape] per leaf) -> first id``: ``T`` steps per row.
        gather_all: ``() -> [B, items_per_row, *shape] per leaf``, each row oldest first.
        readable_range: ``() -> (oldest id, items per row)``, int64 scalars, asserting
            that the ring is not empty.
        spawn_seed: ``() -> int64 [2]``, a key for stateless draws from the generator.
    """

    def __init__(self, specs: tuple[ArraySpec, ...], batch_size: int, max_length: int,
                 device: Any, scope: str, seed: int | None, owner: str):
        self.specs = specs
        self.batch_size, self.max_length = batch_size, max_length
        self.owner = owner
        self.storage = TFStorage(specs, batch_size * max_length, device, scope)
        with tf.device(self.storage.device), tf.name_scope(scope):
            self.last_id = tf.Variable(tf.constant(-1, INT), trainable=False, name="last_id")
            self.stamp = ContentStamp()
            self.critical_section = tf.CriticalSection(name="critical_section")
        self.sampler = TFUniformSampler(seed, self.storage.device)
        dtypes = self.storage.dtypes
        add_signature = [tf.TensorSpec((batch_size,) + s.shape, d)
                         for s, d in zip(specs, dtypes)]
        extend_signature = [tf.TensorSpec((batch_size, None) + s.shape, d)
                            for s, d in zip(specs, dtypes)]
        self.add = CompiledFunction(self._add_graph, [add_signature])
        self.extend = CompiledFunction(self._extend_graph, [extend_signature])
        self.gather_all = CompiledFunction(self._gather_all_graph, [])
        self.readable_range = CompiledFunction(self._range_graph, [])
        self.spawn_seed = CompiledFunction(
            lambda: self.critical_section.execute(self.sampler.spawn_seed), [])
        self.renew_stamp = CompiledFunction(
            lambda: self.critical_section.execute(self.stamp.renew), [])
        self._functions: dict[tuple[Any, ...], Callable[..., Any]] = {}

    # ----------------------------------------------------------------- writes
    def _add_graph(self, leaves: list[tf.Tensor]) -> tf.Tensor:
        L = self.max_length
        rows = tf.constant(np.arange(self.batch_size), INT)

        def body() -> tf.Tensor:
            # Readers take the same critical section, so the order of the increment and
            # the writes inside it is free: incrementing first reads last_id only once.
            first = self.last_id.assign_add(1).read_value()
            writes = self.storage.scatter(ring.positions(first, rows, L), leaves)
            with tf.control_dependencies(writes):
                return tf.identity(first)
        return self.critical_section.execute(body)

    def _extend_graph(self, leaves: list[tf.Tensor]) -> tf.Tensor:
        B, L = self.batch_size, self.max_length
        steps = tf.shape(leaves[0], out_type=INT)[1]

        def body() -> tf.Tensor:
            first = self.last_id.read_value() + 1
            skip, positions = ring.write_positions(first, steps, L, B)
            # Rows are contiguous in storage: [B, T] items go in row by row as they are.
            writes = self.storage.scatter(positions, [
                tf.reshape(leaf[:, skip:], (-1,) + spec.shape)
                for leaf, spec in zip(leaves, self.specs)])
            with tf.control_dependencies(writes):
                done = self.last_id.assign_add(steps, read_value=False)
            with tf.control_dependencies([done]):
                return tf.identity(first)
        return self.critical_section.execute(body)

    def clear_function(self, zero_storage: bool) -> Callable[[], tf.Tensor]:
        """The compiled ``clear``: ``last_id`` back to -1 and, with ``zero_storage``,
        zeros written over the variables (built once per flag)."""
        key = ("clear", bool(zero_storage))
        fn = self._functions.get(key)
        if fn is None:
            fn = self._functions[key] = CompiledFunction(
                lambda: self._clear_graph(zero_storage), [])
        return fn

    def _clear_graph(self, zero_storage: bool) -> tf.Tensor:
        def body() -> tf.Tensor:
            ops = [self.last_id.assign(tf.constant(-1, INT), read_value=False),
                   self.stamp.renew()]
            if zero_storage:
                ops += self.storage.zero_ops()
            with tf.control_dependencies(ops):
                return tf.constant(-1, INT)
        return self.critical_section.execute(body)

    # ------------------------------------------------------------------ reads
    def no_window_message(self, last_id: tf.Tensor, num_steps: int, action: str
                          ) -> tf.Tensor:
        """The message of the empty / no-window assertion (that of the numpy buffer),
        a string scalar.

        A read fails only while a row holds fewer than ``num_steps`` steps (none: the
        buffer is empty), so up to 64 steps the message is picked from a constant table
        of those cases: two ops per read instead of formatting a string every time.
        """
        name, L = self.owner, self.max_length
        empty = f"{name} is empty. Make sure to add items before {action}."
        # Rows shorter than the window: "... holds: each row holds K steps so far
        # (max_length=L). Ask for num_steps <= K, or read once rows hold T steps."
        head = f"num_steps={num_steps} is longer than a row of {name} holds: each row holds "
        middle = f" steps so far (max_length={L}). Ask for num_steps <= "
        tail = f", or read once rows hold {num_steps} steps."
        if num_steps == 1:  # only an empty buffer fails
            return tf.constant(empty)
        held = ring.items_per_row(last_id, L)
        if num_steps <= 64:
            table = [empty] + [f"{head}{k}{middle}{k}{tail}" for k in range(1, num_steps)]
            return tf.gather(tf.constant(table), tf.minimum(held, num_steps - 1))
        count = tf.strings.as_string(held)
        short = tf.strings.join([head, count, middle, count, tail])
        return tf.where(last_id < 0, tf.constant(empty), short)

    def sample_function(self, sample_batch_size: int | None, num_steps: int | None,
                        time_stacked: bool, seeded: bool) -> Callable[..., Any]:
        """The compiled sampler for one combination of arguments (built once): takes an
        int64 ``[2]`` key for stateless draws when ``seeded``, and returns ``(leaves,
        ids, probabilities)`` shaped as :meth:`sample_graph` says."""
        key = ("sample", sample_batch_size, num_steps, time_stacked, seeded)
        fn = self._functions.get(key)
        if fn is None:
            def sample(seed: Any = None) -> Any:
                return self.sample_graph(sample_batch_size, num_steps, time_stacked, seed)
            signature = [tf.TensorSpec([2], INT)] if seeded else []
            fn = self._functions[key] = CompiledFunction(sample, signature)
        return fn

    def ahead_sample_function(self, sample_batch_size: int | None, num_steps: int | None
                              ) -> Callable[..., Any]:
        """The compiled draw ahead of a pull (built once): takes an int64 ``[2]`` key and
        returns ``(fresh, stamp, leaves, ids, probabilities)``, the sample as
        :meth:`sample_function` (``time_stacked``, seeded) draws it with that key, or,
        where the buffer has no window of ``num_steps`` yet, ``fresh`` False and
        placeholders of the same shapes instead of the assertion's error (steps may
        come before the pull, which then draws again). ``stamp`` (int64 scalar) is
        the value the draw set :attr:`stamp` to before it read anything."""
        key = ("ahead", sample_batch_size, num_steps)
        fn = self._functions.get(key)
        if fn is None:
            def sample(seed: Any) -> Any:
                return self.sample_graph(sample_batch_size, num_steps, True, seed,
                                         ahead=True)
            fn = self._functions[key] = CompiledFunction(sample, [tf.TensorSpec([2], INT)])
        return fn

    def sample_graph(self, sample_batch_size: int | None, num_steps: int | None,
                     time_stacked: bool, seed: Any = None, ahead: bool = False) -> Any:
        """``(leaves, ids, probabilities)`` of one uniform sample with replacement.

        Leaves are ``[S, T, *shape]`` (``S`` absent without ``sample_batch_size``, ``T``
        without ``num_steps``); ids int64 of the outer shape; probabilities float32
        ``[S]`` (a scalar without ``S``). With ``num_steps`` and not ``time_stacked``,
        leaves and ids are ``T``-lists of the per-step slices. Draws come from the
        generator, or stateless from ``seed`` (int64 ``[2]``).

        ``ahead``: a draw before the pull (stateless, ``time_stacked``), which returns
        ``(fresh, stamp, leaves, ids, probabilities)`` instead of asserting that
        the buffer has a window (see :meth:`ahead_sample_function`).
        """
        B, L = self.batch_size, self.max_length
        count, steps = sample_batch_size or 1, num_steps or 1

        def body() -> Any:
            if ahead:
                # The new stamp goes in before anything is read: a restore of
                # variables() writes the stamp after the data, so one that overlaps
                # this draw leaves its own stamp, not this one (the pull draws again).
                stamp = self.stamp.renew(draw=True)
                with tf.control_dependencies([stamp]):
                    last_id = self.last_id.read_value()
            else:
                last_id = self.last_id.read_value()
            lo, hi = ring.valid_start_range(last_id, L, steps)
            n = (hi - lo) * B
            if ahead:
                # Without a window, draw from one placeholder start (any slot reads
                # some bytes): the pull sees fresh False and draws again.
                draws = self.sampler.draw(count, tf.maximum(n, 1), seed)
            else:
                check = tf.debugging.Assert(n > 0, [self.no_window_message(
                    last_id, steps, "sampling the buffer")])
                with tf.control_dependencies([check]):
                    draws = self.sampler.draw(count, n, seed)
            ids, rows = ring.draws_to_starts(draws, lo, B)
            if num_steps is not None:
                ids, rows = ids[:, None] + tf.range(num_steps, dtype=INT), rows[:, None]
            leaves = self.storage.take(ring.positions(ids, rows, L))
            probabilities = tf.fill([count], tf.cast(1.0 / tf.cast(n, tf.float64),
                                                     tf.float32))
            if ahead:
                return n > 0, stamp, leaves, ids, probabilities
            return leaves, ids, probabilities

        if ahead:
            fresh, stamp, leaves, ids, probabilities = self.critical_section.execute(body)
        else:
            leaves, ids, probabilities = self.critical_section.execute(body)
        if sample_batch_size is None:
            leaves = [leaf[0] for leaf in leaves]
            ids, probabilities = ids[0], probabilities[0]
        if ahead:
            return fresh, stamp, leaves, ids, probabilities
        if num_steps is not None and not time_stacked:
            axis = 0 if sample_batch_size is None else 1
            leaves = [[tf.gather(leaf, t, axis=axis) for leaf in leaves]
                      for t in range(num_steps)]
            ids = [tf.gather(ids, t, axis=axis) for t in range(num_steps)]
        return leaves, ids, probabilities

    def _gather_all_graph(self) -> list[tf.Tensor]:
        B, L = self.batch_size, self.max_length

        def body() -> list[tf.Tensor]:
            # Storage is row-major ([B, L] per leaf), the layout gather_all returns: one
            # copy per leaf. Until the ring wraps the oldest step is in slot 0 and only
            # the first count slots are read; after, every slot is, rolled to put the
            # oldest first. (A roll by 0 still copies; a gather of [B, count] positions
            # is TF-Agents' way and about a tenth slower than either.)
            last_id = self.last_id.read_value()
            oldest, count = ring.oldest_id(last_id, L), ring.items_per_row(last_id, L)
            out = []
            for var, spec in zip(self.storage.arrays, self.specs):
                table = tf.reshape(var.read_value(), (B, L) + spec.shape)
                out.append(tf.cond(count < L, lambda t=table: t[:, :count],
                                   lambda t=table: tf.roll(t, -(oldest % L), axis=1)))
            return out
        leaves: list[tf.Tensor] = self.critical_section.execute(body)
        return leaves

    def _range_graph(self) -> tuple[tf.Tensor, tf.Tensor]:
        message = (f"{self.owner} is empty. Make sure to add items before asking "
                   "the buffer for data.")

        def body() -> tuple[tf.Tensor, tf.Tensor]:
            last_id = self.last_id.read_value()
            check = tf.debugging.Assert(last_id >= 0, [tf.constant(message)])
            with tf.control_dependencies([check]):
                return (ring.oldest_id(last_id, self.max_length),
                        ring.items_per_row(last_id, self.max_length))
        oldest_and_count: tuple[tf.Tensor, tf.Tensor] = self.critical_section.execute(body)
        return oldest_and_count


def unflatten_sample(structure: Any, flat: Any, num_steps: int | None, time_stacked: bool
                     ) -> tuple[Any, BufferInfo]:
    """``(items, BufferInfo)`` from :meth:`TFRingState.sample_graph`'s ``(leaves, ids,
    probabilities)``: the leaves as the data spec's nest (``structure``, a
    :func:`replaybuffer.nest.flatten` structure), or a ``T``-tuple of nests and of ids
    when not ``time_stacked``."""
    leaves, ids, probabilities = flat
    if num_steps is not None and not time_stacked:
        return (tuple(structure.unflatten(step) for step in leaves),
                BufferInfo(tuple(ids), probabilities))
    return structure.unflatten(leaves), BufferInfo(ids, probabilities)
