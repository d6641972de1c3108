"""Checkpoints of the TensorFlow buffer: its state read out and written back.

Checkpoints hold the stored slots in the numpy storage's slot-major order (``[slots,
B]`` flattened), so that every backend loads them; the TensorFlow storage is row-major
(:mod:`replaybuffer.tf.ring`), so both directions reorder. The variables are copied to
the host whole: TensorFlow writes them inside its own graphs, where no copy-on-write
hook can run.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from replaybuffer.persist.savable import StreamTarget
from replaybuffer.sampling.ring import items_per_row
from replaybuffer.storage.frozen import FrozenRows, static_rows
from replaybuffer.tf import ring
from replaybuffer.tf.compiled import CompiledFunction
from replaybuffer.tf.state import TFRingState



class TFCheckpoint:
    """Reads a :class:`~replaybuffer.tf.state.TFRingState` out for a save and writes a
    save back into it.

    Args:
        state: the buffer's TensorFlow state.
        paths: the leaves' paths in the data spec (for the frozen rows' names).
    """

    def __init__(self, state: TFRingState, paths: Any):
        self._state = state
        self._paths = paths
        self._read = CompiledFunction(self._snapshot_graph, [])
        variables = self.variables_by_key()
        signature = [tf.TensorSpec(v.shape, v.dtype) for v in variables.values()]
        self._assign_all = CompiledFunction(self._assign_all_graph, [signature])

    # ------------------------------------------------- tf.train.Checkpoint of the buffer
    def variables_by_key(self) -> dict[str, tf.Variable]:
        """Every variable of the buffer by its key in a ``tf.train.Checkpoint`` of the
        buffer: ``data_<i>`` for leaf ``i`` (flatten order), ``last_id``,
        ``rng_state`` and ``stamp``."""
        state = self._state
        keys = {f"data_{i}": var for i, var in enumerate(state.storage.arrays)}
        return {**keys, "last_id": state.last_id,
                "rng_state": state.sampler.generator.state, "stamp": state.stamp.variable}

    def _assign_all_graph(self, values: list[tf.Tensor]) -> tf.Tensor:
        variables = list(self.variables_by_key().values())

        def body() -> tf.Tensor:
            writes = [var.assign(value, read_value=False)
                      for var, value in zip(variables, values)]
            with tf.control_dependencies(writes):
                return tf.constant(True)
        done: tf.Tensor = self._state.critical_section.execute(body)
        return done

    def assign(self, tensors: dict[str, Any]) -> None:
        """Write values of :meth:`variables_by_key` (by key) back, all at one instant,
        inside the state's critical section: no add, sample or draw ahead of a pull
        reads a mix of two states; the saved stamp comes back with the data.

        Raises:
            ValueError: a key is missing or unknown, or a value's shape or dtype is not
                the variable's (the message names the key); nothing is written.
        """
        variables = self.variables_by_key()
        if set(tensors) != set(variables):
            raise ValueError(f"{self._state.owner} checkpoint: expected the keys "
                             f"{sorted(variables)}, got {sorted(tensors)}")
        values = []
        for key, var in variables.items():
            value = tf.convert_to_tensor(tensors[key])
            if value.dtype != var.dtype or value.shape != var.shape:
                raise ValueError(f"{self._state.owner} checkpoint: {key} must be "
                                 f"{var.dtype.name}{var.shape.as_list()}, got "
                                 f"{value.dtype.name}{value.shape.as_list()}")
            values.append(value)
        self._assign_all(values)

    def _snapshot_graph(self) -> Any:
        state = self._state
        B, L = state.batch_size, state.max_length

        def body() -> Any:
            last_id = state.last_id.read_value()
            slots = ring.items_per_row(last_id, L)
            arrays = []
            for var, spec in zip(state.storage.arrays, state.specs):
                rows = tf.reshape(var.read_value(), (B, L) + spec.shape)[:, :slots]
                slot_major = tf.transpose(rows, [1, 0, *range(2, 2 + len(spec.shape))])
                arrays.append(tf.reshape(slot_major, (-1,) + spec.shape))
            return last_id, state.sampler.generator.state.read_value(), arrays
        return state.critical_section.execute(body)

    def snapshot(self) -> tuple[dict[str, Any], dict[str, FrozenRows]]:
        """``(state, streams)`` for persistence, read atomically in one graph call:
        ``{"last_id": int, "sampler": ...}`` and ``{"leaves": rows}``, the rows
        ``[items_per_row * batch_size, *spec.shape]`` per leaf in slot-major order."""
        last_id, rng_state, arrays = self._read()
        sampler = self._state.sampler.state_dict(rng_state.numpy())
        leaves = static_rows([a.numpy() for a in arrays], self._state.storage.specs,
                             self._paths)
        return {"last_id": int(last_id), "sampler": sampler}, {"leaves": leaves}

    def stream_targets(self, saved: dict[str, Any]) -> dict[str, StreamTarget]:
        """Where a save's ``"leaves"`` stream goes: all retained slots of ``saved``."""
        state = self._state
        count = items_per_row(int(saved["last_id"]), state.max_length) * state.batch_size
        return {"leaves": StreamTarget(state.storage.specs, count, self.load_slot_major)}

    def load_slot_major(self, start: int, arrays: list[np.ndarray]) -> None:
        """Write ``arrays`` (``[n, *spec.shape]`` per leaf) at the slot-major positions
        ``[start, start + n)`` of a checkpoint, in bounded chunks (sources may be
        read-only memory maps)."""
        state = self._state
        count = len(arrays[0]) if arrays else 0
        step = max(1, (64 << 20) // max(1, sum(a[:1].nbytes for a in arrays)))
        for i in range(0, count, step):
            n = min(step, count - i)
            slot_major = np.arange(start + i, start + i + n, dtype=np.int64)
            positions = ring.slot_major_to_positions(slot_major, state.max_length,
                                                     state.batch_size)
            state.storage.scatter(tf.constant(positions),
                                  [tf.constant(np.array(a[i:i + n])) for a in arrays])

    def restore(self, saved: dict[str, Any], arrays: list[np.ndarray] | None) -> None:
        """Set ``last_id`` and the generator from ``saved`` (a :meth:`snapshot` state)
        and, when given, the data from ``arrays`` (slot-major, as :meth:`snapshot`);
        then renew the :attr:`~replaybuffer.tf.state.TFRingState.stamp`, so that
        samples drawn ahead of a pull before the restore are not handed out."""
        if arrays is not None:
            self.load_slot_major(0, arrays)
        self._state.last_id.assign(int(saved["last_id"]))
        self._state.sampler.load_state_dict(saved["sampler"])
        # Last, after the data: a sample drawn ahead before this point is drawn again.
        self._state.renew_stamp()
