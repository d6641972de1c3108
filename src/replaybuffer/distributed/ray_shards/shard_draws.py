"""What a shard does for a draw call: each batch of the call drawn from its buffer with
a generator set from the batch's seed, and the batches packed into one answer
(:mod:`.draw_answers`). The actor (:mod:`.shard`) adds its sampling mass and status.

A call may carry several batches (a group the client planned together); each is drawn
with its own seed, so a batch is the same whichever call carries it.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from replaybuffer import nest
from replaybuffer.distributed.errors import NotSupportedError
from replaybuffer.distributed.ray_shards.draw_answers import (DRAWN_ERRORS, Drawn,
                                                              pack_draws)
from replaybuffer.distributed.ray_shards.packing import ChunkPacking

if TYPE_CHECKING:
    from replaybuffer.buffers.base import ReplayBuffer
    from replaybuffer.buffers.transitions import TransitionReplayBuffer

DrawCall = tuple[str, list[tuple[int, int | None]], int | None, float, bool,
                 "list[int] | None"]
"""The one argument of a shard's ``draw``: ``(method, batches, num_steps, timeout,
within_episodes, runs)``, ``batches`` a ``(count, seed)`` per batch, ``runs`` the
batches of each return value when the caller asked for several (``None``, or left
out: one; :func:`~.draw_answers.inline_runs`). One argument: Ray serialises each
argument of a call on its own."""
DrawnBatches = tuple[Any, int, "BaseException | None"]
"""``(payload, drawn, error)``: the answer's batches (packed, or a list of ``(items,
ids, probabilities)`` when they do not fit the spec's layout), how many of the call's
batches it holds, and the error that stopped the rest (``None``: all drawn)."""

_GENERATORS = threading.local()


def seeded(seed: int) -> np.random.Generator:
    """This thread's generator, its state set from ``seed`` (a 63-bit number the
    client drew at random): about 1 us where a new seeded generator costs 20-30 us,
    on every draw of every shard. One per thread: a shard draws in several."""
    generator = getattr(_GENERATORS, "generator", None)
    if generator is None:
        generator = _GENERATORS.generator = np.random.Generator(np.random.PCG64(0))
    generator.bit_generator.state = {"bit_generator": "PCG64",
                                     "state": {"state": int(seed), "inc": 0xDA3E39CB94B95BDB},
                                     "has_uint32": 0, "uinteger": 0}
    return generator


def draw_batches(buffer: "ReplayBuffer", packing: ChunkPacking, call: DrawCall,
                 round_robin: bool) -> list[DrawnBatches]:
    """Draw the batches of ``call`` from ``buffer``: for each ``(count, seed)``,
    ``count`` samples by ``method`` (``get_next``, drawn with a generator seeded by
    ``seed``, or a transition buffer's ``sample``), answered in one
    :data:`DrawnBatches` per return value the call's ``runs`` ask for (one without):
    those after the error that stopped the call hold none and carry it. ``packing``:
    the draw answers' layout of the buffer's spec; ``round_robin``: the shard took
    round-robin writes.

    Raises:
        NotSupportedError: windows of more than one step over round-robin writes.
        EmptyBufferError, RateLimitedError: the first batch could not be drawn (a
            later one stops the call there and is answered in band).
    """
    method, batches, num_steps, timeout, within_episodes = call[:5]
    runs = call[5] if len(call) > 5 else None
    if method == "get_next" and round_robin and (num_steps or 1) > 1:
        raise NotSupportedError(
            f"RayReplayBuffer does not support windows (num_steps={num_steps}) "
            "over round-robin writes: each row's consecutive steps went to different shards, so a "
            "shard's window would skip steps. Write sequences through shard= or "
            "writer(i), one writer per shard's rows (clear() forgets the "
            "round-robin writes)")
    drawn: list[Drawn] = []
    structures: list[Any] = []
    error: BaseException | None = None
    for count, seed in batches:
        try:
            one, structure = draw_one(buffer, method, count, num_steps, timeout, seed,
                                      within_episodes)
        except DRAWN_ERRORS as exc:
            if not drawn:
                raise  # the call's error, as one batch's always was
            error = exc  # the batches drawn so far are kept: a limiter counted them
            break
        drawn.append(one)
        structures.append(structure)
    replies: list[DrawnBatches] = []
    start = 0
    for size in runs or [len(batches)]:
        # the run's batches drawn: those before the error that stopped the call
        first, end = min(start, len(drawn)), min(start + size, len(drawn))
        payload: Any = None
        if method == "get_next":
            payload = pack_draws(packing, buffer.data_spec, drawn[first:end], num_steps)
        if payload is None:  # not the spec's layout: as they came
            payload = [(structure.unflatten(leaves), ids, probabilities)
                       for (leaves, ids, probabilities), structure
                       in zip(drawn[first:end], structures[first:end])]
        replies.append((payload, end - first, None if end == start + size else error))
        start += size
    return replies


def draw_one(buffer: "ReplayBuffer", method: str, count: int, num_steps: int | None,
             timeout: float | None, seed: int | None, within_episodes: bool
             ) -> tuple[Drawn, Any]:
    """One batch: its flattened leaves, ids and probabilities; its structure."""
    if method == "get_next":
        rng = None if seed is None else seeded(seed)
        items, info = buffer.draw(count, num_steps, True, rng, within_episodes, timeout)
    else:  # asked of transition buffers only
        items, info = cast("TransitionReplayBuffer", buffer).sample(count, timeout=timeout)
    leaves, structure = nest.flatten(items)
    # Contiguous leaves (sent unpacked) go out of band into Ray's store and the
    # client maps them; a strided view (a packed leaf) would be pickled in band.
    return ([np.ascontiguousarray(leaf) for leaf in leaves], np.asarray(info.ids),
            np.asarray(info.probabilities, np.float32)), structure
