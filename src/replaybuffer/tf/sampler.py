"""Uniform sampling with TensorFlow random ops, seeded from ``seed=``."""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any

import numpy as np
import tensorflow as tf

from replaybuffer.tf.ring import INT

_MASK = (1 << 64) - 1


def _seed_from(values: Any) -> int:
    """A 63-bit seed derived from a nest of ints (a saved generator state)."""
    digest = hashlib.sha256(repr(values).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class TFUniformSampler:
    """Draws uniform integers for :class:`~replaybuffer.tf.TFUniformReplayBuffer`.

    ``get_next`` draws from a ``tf.random.Generator`` (its state is a variable, so
    draws advance it inside ``tf.function`` too); dataset elements use stateless
    draws keyed by a seed taken from that generator when iteration starts and the
    element's index, so parallel sampling gives the same elements in the same order.

    Args:
        seed: seed of the generator (``None``: fresh entropy).
        device: where the generator's state lives (``None``: TensorFlow's placement).
    """

    def __init__(self, seed: int | None = None, device: Any = None):
        placement = tf.device(device) if device is not None else contextlib.nullcontext()
        with placement:
            if seed is None:
                self.generator = tf.random.Generator.from_non_deterministic_state()
            else:
                self.generator = tf.random.Generator.from_seed(int(seed) & (_MASK >> 1))

    def draw(self, count: int, n: Any, seed: Any = None) -> tf.Tensor:
        """``count`` int64 draws uniform in ``[0, n)`` (``n > 0``): from the generator, or
        stateless from ``seed`` (int64 ``[2]``)."""
        zero = tf.constant(0, INT)
        if seed is None:
            return self.generator.uniform([count], zero, n, dtype=INT)
        return tf.random.stateless_uniform([count], seed, zero, n, dtype=INT)

    def spawn_seed(self) -> tf.Tensor:
        """A fresh int64 ``[2]`` key for stateless draws, taken from the generator."""
        return self.generator.make_seeds(1)[:, 0]

    # ------------------------------------------------------------ persistence
    def state_dict(self, values: np.ndarray | None = None) -> dict[str, Any]:
        """``{"tf_rng": ..., "rng": ...}``: the generator's exact state, and a numpy
        ``PCG64`` state derived from it so that a numpy or torch buffer can restore a
        TensorFlow save (it continues with other draws).

        Args:
            values: the generator's state as read by the caller (default: read it now).
        """
        if values is None:
            values = self.generator.state.numpy()
        state = [int(v) & _MASK for v in np.asarray(values).tolist()]
        return {"tf_rng": {"algorithm": int(self.generator.algorithm), "state": state},
                "rng": np.random.PCG64(state).state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; a numpy sampler's state (``{"rng": ...}``, from a
        numpy or torch save) reseeds the generator from a hash of it."""
        saved = state.get("tf_rng")
        if saved is not None:
            if int(saved["algorithm"]) != int(self.generator.algorithm):
                raise ValueError(f"saved generator algorithm {saved['algorithm']} differs "
                                 f"from this one ({int(self.generator.algorithm)})")
            values = np.array([v & _MASK for v in saved["state"]], np.uint64).view(np.int64)
            if values.shape != tuple(self.generator.state.shape):
                raise ValueError(f"saved generator state has shape {values.shape}")
            self.generator.reset(values)
            return
        self.generator.reset_from_seed(_seed_from(state["rng"]))
