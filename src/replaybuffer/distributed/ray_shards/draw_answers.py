"""A shard's answer to a draw call: the batches it drew packed into one byte buffer
with their ids and probabilities (:func:`pack_draws`), and the client's side of it
(:class:`DrawAnswer`: fetched once, its batches handed out as views of that buffer).

One call may draw several batches (the dataset plans a few at once and sends the
ones that go to the same shard together, :mod:`.sampling`); each is drawn with its own
seed, so the batches are the same as separate calls would give. When one of them
cannot be drawn (the shard holds none, its rate limiter held it back), the shard stops
there and answers the error in band: the batches before it are kept (a rate limiter
has counted them), the ones from it on are drawn again by the client as a failed call's
would be. An error at the first batch is raised as the call's.

Ray maps the one buffer of an answer read-only from its object store (or, small,
deserialises it once from the reply); the items, ids and probabilities of each batch
are views of it: no copy on the client, and one buffer for Ray to serialise instead
of three arrays per leaf and batch. Answers larger than :data:`PACK_MAX_BYTES` go
unpacked, one contiguous array per leaf (Ray maps each; no copy on the client either).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import ray

from replaybuffer import nest
from replaybuffer.distributed.ray_shards.packing import ChunkPacking
from replaybuffer.errors import EmptyBufferError
from replaybuffer.rate_limiter import RateLimitedError

DRAW_EXTRA = ((np.int64, True), (np.float32, False))
"""The leaves packed after the items: int64 local ids per step, float32 probabilities
per row (per sample)."""
DRAWN_ERRORS = (EmptyBufferError, RateLimitedError)
"""Errors a shard answers in band for the batches of a call it could not draw."""

PACK_MAX_BYTES = 1 << 17
"""Answers of more item bytes than this go unpacked: packing copies them once more in
the shard, which outweighs Ray's per-array cost (tens of us) for large batches (a
batch of 256 Atari frames, 7 MB: about 2 ms more per draw in the bench)."""

INLINE_BYTES = 100 * 1024 - 4096
"""The packed bytes an answer may hold and still come back inside Ray's reply: Ray
inlines a return value of at most ``max_direct_call_object_size`` (100 KiB by
default) and puts larger ones into its object store, which costs the caller, the
shard and Ray's raylet about 1.4 ms more CPU per call (measured on a shared 2-core
machine: 2.7 ms against 1.5 ms for an answer of 4 control batches, 119 KB); 4 KiB
are left for the reply's other fields and Ray's framing."""
MAX_INLINE_RETURNS = 12
"""The most return values a call's answer is split into to stay inline; an answer that
needs more of them goes into the object store whole. Each return costs the caller and
the shard about 30-50 us more, and the store costs Ray's raylet more than that: with
the bench's groups of 32 control batches (11 inline returns), Ray's own processes
spent 14-21 us of CPU per batch with 1 shard and 29-35 with 8, against 61-79 and
84-149 at a limit of 4 (the store), samples/s level or higher (1 shard 361-585k
against 424-511k, 8 shards 324-376k against 108-306k; ``python -m
replaybuffer_bench.ray_bench --workloads control --shards 1,8 --seconds 5
--no-single``, 3 interleaved rounds on a shared 2-core machine, load 4-12; the
project's own quiet A/B agreed: a third of Ray's CPU, samples/s level)."""

Drawn = tuple[list[np.ndarray], np.ndarray, np.ndarray]
"""One drawn batch on the shard: its flattened item leaves ``[n, T, ...]`` (``[n,
...]`` without ``num_steps``), int64 ids ``[n, T]`` (``[n]``), float32 probabilities
``[n]``."""
DrawReply = tuple[Any, int, "BaseException | None", float, tuple[int, int, int, int]]
"""A shard's answer: ``(payload, drawn, error, mass, status)``: ``payload`` packed
(:func:`pack_draws`) or, when the items do not fit the spec's layout (a transition
buffer's ``sample``), a list of ``(items, ids, probabilities)``; ``drawn`` batches of
the call are in it, the others failed with ``error``; the shard's sampling mass after
the draw and its status."""


def draw_packing(data_spec: Any) -> ChunkPacking:
    """The layout of draw answers of ``data_spec``'s items."""
    return ChunkPacking(data_spec, DRAW_EXTRA)


def inline_runs(packing: ChunkPacking, counts: list[int], num_steps: int | None
                ) -> list[int] | None:
    """How to split the answer to a call drawing batches of ``counts`` rows (windows
    of ``num_steps``) into return values that Ray keeps inline: the batches of each,
    consecutive, in order, each return's packed bytes at most :data:`INLINE_BYTES`.
    ``None``: one return value, as the whole answer fits inline already, a batch
    alone does not, or it would take more than :data:`MAX_INLINE_RETURNS`."""
    steps = num_steps or 1
    whole = packing.nbytes(sum(counts), steps)
    # Runs pad each leaf to its alignment, so they never hold less than the whole
    # answer: one that fits needs no split, one over the most runs' bytes cannot be
    # split (checked first: the groups of one shard, a few hundred us a call saved).
    if whole <= INLINE_BYTES or whole > MAX_INLINE_RETURNS * INLINE_BYTES:
        return None
    runs: list[int] = []
    rows = 0
    for n in counts:
        if packing.nbytes(n, steps) > INLINE_BYTES:
            return None
        if runs and packing.nbytes(rows + n, steps) <= INLINE_BYTES:
            runs[-1] += 1
            rows += n
        else:
            runs.append(1)
            rows = n
    return runs if 2 <= len(runs) <= MAX_INLINE_RETURNS else None


def pack_draws(packing: ChunkPacking, data_spec: Any, drawn: list[Drawn],
               num_steps: int | None) -> np.ndarray | None:
    """The batches ``drawn`` in one ``uint8`` buffer of ``packing``'s layout (rows one
    after another; ``num_steps`` ``None``: steps of 1), or ``None`` when their leaves
    are not the spec's or hold more than :data:`PACK_MAX_BYTES` (the caller answers
    them unpacked)."""
    if sum(leaf.nbytes for leaves, _, _ in drawn for leaf in leaves) > PACK_MAX_BYTES:
        return None
    specs = nest.flatten(data_spec)[0]
    steps = num_steps or 1
    parts = []
    for leaves, ids, probabilities in drawn:
        if len(leaves) != len(specs):
            return None
        n = len(ids)
        lead = (n, steps)
        shaped = []
        for leaf, spec in zip(leaves, specs):
            if leaf.dtype != spec.dtype or leaf.shape[1 if num_steps is None else 2:] \
                    != tuple(spec.shape):
                return None
            shaped.append(leaf.reshape(lead + tuple(spec.shape)))
        parts.append(shaped + [ids.reshape(lead), probabilities])
    return packing.pack_rows(parts, steps)


class SplitReplies:
    """The return values of one draw call split by :func:`inline_runs`: they come in
    one reply, so they are fetched with one ``ray.get``, at the first asked for.

    Held by each of the call's answers, and holding none of them: the answers are
    freed by reference counting once their batches are (a list of the answers that
    each answer held was a reference cycle, left to the garbage collector).
    """

    def __init__(self, refs: list[Any]):
        self.refs = refs
        self._replies: list[DrawReply] | None = None
        self._raised: BaseException | None = None

    def get(self, index: int) -> DrawReply:
        """Return value ``index`` (waits for the call; raises its error, each time)."""
        if self._raised is not None:
            raise self._raised
        if self._replies is None:
            try:
                self._replies = ray.get(self.refs)
            except BaseException as exc:  # a call's error is every return value's
                self._raised = exc
                raise
        return self._replies[index]


class DrawAnswer:
    """The client's side of one draw call (or one return value of a split call),
    shared by the batches it serves: fetched and unpacked once, at the first
    :meth:`part` asked for.

    Args:
        ref: the call's object ref (of this return value, for a split call).
        packing: :func:`draw_packing` of the buffer's spec.
        counts: the rows of each batch of the answer, in order.
        num_steps: the call's window length (``None``: single steps).
        split: the call's return values where :func:`inline_runs` split it, this one
            number ``index`` among them.
    """

    def __init__(self, ref: Any, packing: ChunkPacking, counts: list[int],
                 num_steps: int | None, split: SplitReplies | None = None,
                 index: int = 0):
        self.ref = ref
        self._packing = packing
        self._counts = counts
        self._num_steps = num_steps
        self._split, self._index = split, index
        self._reply: DrawReply | None = None
        self._raised: BaseException | None = None
        self._leaves: list[np.ndarray] | None = None

    def reply(self) -> DrawReply:
        """The shard's answer (waits for it; raises the call's error, each time)."""
        if self._raised is not None:
            raise self._raised
        if self._reply is None:
            try:
                self._reply = ray.get(self.ref) if self._split is None \
                    else self._split.get(self._index)
            except BaseException as exc:
                self._raised = exc
                raise
        return self._reply

    def part(self, index: int) -> tuple[Any, np.ndarray, np.ndarray]:
        """Batch ``index`` of the call: ``(items, ids, probabilities)``, views of the
        answer's buffer (read-only where Ray mapped it).

        Raises:
            RayError: the call failed (its cause for the caller to sort out).
            EmptyBufferError, RateLimitedError: the shard could not draw this batch.
        """
        payload, drawn, error, _, _ = self.reply()
        if index >= drawn:
            assert error is not None
            raise error
        if not isinstance(payload, np.ndarray):  # unpacked: (items, ids, probabilities)
            items, ids, probabilities = payload[index]
            return items, ids, probabilities
        steps = self._num_steps or 1
        if self._leaves is None:
            self._leaves = self._packing.unpack_leaves(payload, sum(self._counts[:drawn]),
                                                       steps)
        start = sum(self._counts[:index])
        end = start + self._counts[index]
        if self._num_steps is None:  # steps of 1, dropped again
            leaves = [leaf[start:end, 0] for leaf in self._leaves[:-1]]
        else:
            leaves = [leaf[start:end] for leaf in self._leaves[:-1]]
        return (self._packing.unflatten(leaves), leaves[-1],
                self._leaves[-1][start:end])

