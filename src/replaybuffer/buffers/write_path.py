"""The write path: steps validated, converted and written to the ring.

Three ways in, one bookkeeping: :meth:`WritePath.add_batch` tries the storage's fused
exact writer first (arrays already in the stored dtype and shape, one check-and-write
call; about 2-3 us for one small step), with deduplicated frame stacks encoded on the
way (:meth:`WritePath._write_exact_stacks`); anything else goes through the general,
validating path (:meth:`WritePath.convert_leaves`, :meth:`WritePath.write_steps`),
which also serves :meth:`WritePath.extend` and the adds of subclasses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from replaybuffer import nest
from replaybuffer.arguments import check_timeout
from replaybuffer.buffers.wiring import BufferParts
from replaybuffer.errors import SpecError

if TYPE_CHECKING:
    from replaybuffer.storage.exact_writer import ExactWriter
    from replaybuffer.storage.frames import FrameStackCodec


class WritePath(BufferParts):
    """``add_batch`` and ``extend``, and the validating steps subclasses' adds reuse:
    :meth:`flatten_items`, :meth:`convert_leaves`, :meth:`leading_dim`,
    :meth:`write_steps`. Every write takes the buffer's lock, is admitted by the rate
    limiter (if any), advances the ring, tells the sampler, and records episode starts
    (with ``track_episodes``)."""

    def flatten_items(self, items: Any, method: str) -> Sequence[Any]:
        """``items`` (a nest matching ``data_spec``) as a list of leaves, in the spec's
        order; ``method`` names the caller in the error.

        Raises:
            SpecError: the structure differs (missing and unexpected leaves named).
        """
        if self._fast_flatten is not None:
            leaves = self._fast_flatten(items)
            if leaves is not None:
                return leaves
        leaves, structure = nest.flatten(items)
        if structure != self._structure:
            raise SpecError(self._structure_mismatch(items, structure, method))
        return leaves

    def _structure_mismatch(self, items: Any, structure: Any, method: str) -> str:
        try:
            got = set(nest.leaf_paths(items))
        except Exception:  # an unflattenable object: report its structure only
            got = set()
        want = set(self._paths)
        detail = []
        if want - got:
            detail.append(f"missing leaves {sorted(want - got)}")
        if got - want:
            detail.append(f"unexpected leaves {sorted(got - want)}")
        return (f"{method}: items do not match the data_spec structure: expected "
                f"{nest.describe(self._structure)}, got {nest.describe(structure)}"
                + (f" ({'; '.join(detail)})" if detail else ""))

    def add_batch(self, items: Any, *, timeout: float | None = None,
                  block: bool = True) -> bool:
        """Append one step to every row.

        Args:
            items: a nest matching ``data_spec`` whose leaves have shape
                ``[batch_size, *spec.shape]``: numpy arrays, array-likes or (torch
                storage) tensors, of a dtype that casts to the leaf's within its kind.
            timeout, block: with a :attr:`rate_limiter` that holds the insert back: wait
                up to ``timeout`` seconds (``None``: as long as it takes), or with
                ``block=False`` return ``False`` at once.

        Returns:
            ``True`` once written; ``False`` only with ``block=False`` (nothing written).

        Raises:
            SpecError: wrong structure, shape, batch size or dtype; the message names
                the leaf. Nothing is written.
            RateLimitedError: ``timeout`` passed with the insert held back.
            ValueError: ``timeout`` is NaN or negative (nothing is counted or written).
        """
        # Adding one small step is a hot path (about 3 us): every attribute lookup and
        # call saved here is measurable (so the timeout is checked only when given).
        if timeout is not None:
            check_timeout(timeout)
        flatten = self._fast_flatten
        leaves = None if flatten is None else flatten(items)
        if leaves is not None and self._write_exact is not None:
            ring = self._ring
            with self._lock:
                limiter = self._limiter
                if limiter is not None and not self._admit(ring.batch_size, timeout, block):
                    return False
                # Read again under the lock, after the limiter's wait (which lets go of
                # it): a save's snapshot may have paused the fused writer since, as it
                # writes around the snapshot's copy-on-write storage.
                write_exact = self._write_exact
                last_id = ring.last_id + 1
                position = (last_id % ring.max_length) * ring.batch_size
                codec = self._codec
                if write_exact is None:  # the general path below writes it
                    written = False
                elif codec is None:
                    written = write_exact(position, leaves)
                else:
                    written = self._write_exact_stacks(codec, write_exact, position, last_id,
                                                       leaves)
                if written:
                    ring.last_id = last_id
                    self._sampler.on_add(ring, last_id, 1)
                    if limiter is not None:
                        limiter.inserted(ring.batch_size)
                    return True
        if leaves is None:
            leaves = self.flatten_items(items, "add_batch")
        if self._codec is not None:  # one step in time-major layout is the batch itself
            return self.write_steps(self.convert_leaves(leaves, self._outer, self._outer_names), 1,
                                     timeout, block)
        arrays = self._storage.convert(leaves, self._paths, self._outer, self._outer_names)
        ring = self._ring
        with self._lock:
            if self._limiter is not None and not self._admit(ring.batch_size, timeout, block):
                return False
            last_id = ring.last_id + 1
            self._storage.write((last_id % ring.max_length) * ring.batch_size, arrays)
            ring.last_id = last_id
            if self._commit is not None:
                self._commit(last_id)
            self._sampler.on_add(ring, last_id, 1)
            if self._episodes is not None:
                self._record_episodes(last_id, arrays[self._step_type_leaf], 1)
            if self._limiter is not None:
                self._limiter.inserted(ring.batch_size)
        return True

    def _write_exact_stacks(self, codec: FrameStackCodec, write_exact: ExactWriter,
                            position: int, step_id: int, leaves: Sequence[Any]) -> bool:
        """``write_exact`` of one step whose stacked frames are deduplicated (by ``codec``,
        the buffer's): exact stacks become frame references, then every leaf is written
        (or nothing is)."""
        i = self._codec_leaf
        stacks = leaves[i]
        if type(stacks) is not np.ndarray or stacks.dtype is not self._specs[i].dtype \
                or stacks.shape != self._stack_shape:
            return False
        refs, frame_writes = codec.encode(step_id, stacks)  # changes nothing yet
        leaves = list(leaves)  # the caller's list stays as it was, for the general path
        leaves[i] = refs
        if not write_exact(position, leaves):
            return False
        codec.commit(frame_writes, step_id, 1)
        return True

    def extend(self, items: Any, *, timeout: float | None = None, block: bool = True
               ) -> bool:
        """Append ``num_steps`` consecutive steps to every row in one call.

        Args:
            items: a nest matching ``data_spec`` whose leaves have shape
                ``[batch_size, num_steps, *spec.shape]``, oldest step first.
            timeout, block: as for :meth:`add_batch` (``batch_size * num_steps`` items).

        Equivalent to ``num_steps`` calls of :meth:`add_batch` with ``items[:, t]``.
        """
        check_timeout(timeout)
        leaves = self.flatten_items(items, "extend")
        B = self.batch_size
        num_steps = self.leading_dim(leaves, 1, "extend", f"[batch_size={B}, num_steps]")
        try:
            arrays = self.convert_leaves(leaves, (B, num_steps),
                                         f"[batch_size={B}, num_steps={num_steps}]")
        except SpecError as exc:
            # One step given as [batch_size, *spec.shape]: its first spec dimension was
            # taken for num_steps, so the shape error alone would puzzle.
            if np.ndim(leaves[0]) == 1 + len(self._specs[0].shape):
                raise SpecError(f"extend: {exc}; extend takes leaves [batch_size, num_steps, "
                                "*spec.shape], a num_steps axis after the rows (one step "
                                "is add_batch)") from None
            raise
        # Slot-major layout: [B, T, ...] -> [T, B, ...] -> [T * B, ...].
        return self.write_steps([a.swapaxes(0, 1).reshape((-1,) + s.shape)
                                  for a, s in zip(arrays, self._specs)], num_steps, timeout,
                                 block)

    def convert_leaves(self, leaves: Sequence[Any], outer: tuple[int, ...], names: str) -> list[Any]:
        """Validate leaves for storage; a deduplicated frame leaf stays whole until written."""
        if self._codec is None:
            return list(self._storage.convert(leaves, self._paths, outer, names))
        i = self._codec_leaf
        frames = self._frame_checker.numpy_leaf(0, leaves[i], outer + self._specs[i].shape,
                                                self._paths[i], outer, names)
        leaves = list(leaves)
        leaves[i] = np.zeros(outer + (self._codec.stack,), np.int64)  # stands in for refs
        arrays = list(self._storage.convert(leaves, self._paths, outer, names))
        arrays[i] = frames
        return arrays

    def leading_dim(self, leaves: Sequence[Any], axis: int, method: str, names: str) -> int:
        """Size of dimension ``axis`` of the first leaf (the others are checked against it)."""
        shape = tuple(np.shape(leaves[0]))
        if len(shape) <= axis:
            raise SpecError(f"{method}: leaf {self._paths[0]}: expected leading dimensions "
                            f"{names} before the spec shape {self._specs[0].shape}, got shape "
                            f"{shape}")
        return int(shape[axis])

    def write_steps(self, time_major: list[Any], num_steps: int,
                     timeout: float | None = None, block: bool = True) -> bool:
        """Write ``num_steps`` validated steps given as ``[num_steps * batch_size, ...]``
        leaves, oldest step first, wrapping around the ring; ``False`` if a rate limiter
        held them back and ``block`` is false."""
        if num_steps == 0:
            return True
        ring = self._ring
        B, L = ring.batch_size, ring.max_length
        skip = max(0, num_steps - L)  # steps overwritten within this very call
        with self._lock:
            if self._limiter is not None and not self._admit(B * num_steps, timeout, block):
                return False
            first_id = ring.last_id + 1
            if self._codec is not None:  # may refuse the stacks: before anything is written
                time_major = list(time_major)
                time_major[self._codec_leaf], frame_writes = self._codec.encode(
                    first_id, time_major[self._codec_leaf])
            kept = num_steps - skip
            slot = (first_id + skip) % L
            head = min(kept, L - slot)
            if num_steps == 1:  # one step never wraps: no slicing (the frame-stack add path)
                self._storage.write(slot * B, time_major)
            else:
                self._storage.write(slot * B, [a[skip * B:(skip + head) * B]
                                               for a in time_major])
            if head < kept:
                self._storage.write(0, [a[(skip + head) * B:] for a in time_major])
            if self._codec is not None:
                self._codec.commit(frame_writes, first_id, num_steps)
            ring.last_id += num_steps
            if self._commit is not None:
                self._commit(ring.last_id)
            self._sampler.on_add(ring, first_id, num_steps)
            if self._episodes is not None:
                self._record_episodes(first_id, time_major[self._step_type_leaf], num_steps)
            if self._limiter is not None:
                self._limiter.inserted(B * num_steps)
        return True
