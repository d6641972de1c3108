"""Samples on the device served by recorded draws (``capture_samples``).

:class:`CapturedReads` gives a buffer's :meth:`draw` (``get_next``) a second way: for
each ``(sample_batch_size, num_steps)`` asked for, the first call is served eagerly
(the warm-up), the next records a :class:`~replaybuffer.sampling.captured_draws.
CapturedUniformDraw` for a uniform sampler, a :class:`~replaybuffer.sampling.
captured_prioritized.CapturedPrioritizedDraw` for a prioritized one searching running
sums (a CUDA graph on CUDA, its traced twin on the CPU) and every later one runs it. What a recording captured is checked before each run:

- the sampler and the storage are the ones recorded (a snapshot for a save wraps the
  storage: calls are then eager until it is released; another sampler drops every
  recording);
- after a ``clear()`` or a restore (the buffer's generation moves) the storage's
  packed blocks are found again; where they were reallocated every recording is dropped
  and made again (after a warm-up).

Calls that a recording cannot serve go the eager way, every time: a dataset's own
generator (``rng``), ``within_episodes``, a rate limiter, deduplicated frames, and for
a prioritized sampler a range that may have no mass (a stored priority of 0: only the
eager path reports that).

With torch storage on CUDA the storage orders its gathers after its writes on other
streams, and its writes after its gathers, with events (:class:`~replaybuffer.storage.
torch_storage.TorchStorage`); a run takes part through the storage's public
``gather`` of no leaves at no positions, before the replay and after the copy out.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from replaybuffer.buffers.reads import ReadPath
from replaybuffer.protocols import BufferInfo

if TYPE_CHECKING:
    import torch

    from replaybuffer.storage.torch_packing import PackedLeaves

# Calls served eagerly per (sample_batch_size, num_steps) before one is recorded.
WARM_UP_CALLS = 1
# Recordings a buffer keeps at most (each holds a graph, its memory pool and static
# buffers): a learner asks for one or two shapes; calls of further shapes are eager.
MAX_RECORDINGS = 8


class SampleCaptures:
    """The recordings of one buffer, by ``(sample_batch_size, num_steps)``.

    Args:
        storage: the buffer's torch storage (leaves packed by dtype).
        sampler: its :class:`~replaybuffer.sampling.torch_uniform.TorchUniformSampler`,
            or :class:`~replaybuffer.sampling.torch_prioritized.TorchPrioritizedSampler`
            with ``search="prefix"``.
        batch_size, max_length: the ring's layout.
        required: the user asked for recordings (``capture_samples=True``): a failed
            recording raises; otherwise it warns once and the buffer samples eagerly.

    Raises:
        ValueError: the storage's leaves are not packed blocks, or the sampler
            searches a sum tree.
    """

    def __init__(self, storage: Any, sampler: Any, batch_size: int, max_length: int, *,
                 required: bool):


        self.storage, self.sampler = storage, sampler
        # Prioritized draws search running sums (the tree's descent is not recorded).
        self.prioritized = hasattr(sampler, "running_sums")
        if self.prioritized and sampler.running_sums is None:
            raise ValueError("recorded prioritized draws search running sums: "
                             "device_search='prefix' (or 'auto'), not 'tree'")
        packing = storage.packing
        if packing is None:
            raise ValueError("recorded draws gather packed blocks: the torch storage's "
                             "device layout (not its CPU layout of numpy records)")
        self.packing: PackedLeaves = packing
        self.batch_size, self.max_length = batch_size, max_length
        # CUDA graphs on CUDA, the traced twin elsewhere (the CPU: tests).
        self.graph, self.required = storage.device.type == "cuda", required
        # Per (sample_batch_size, num_steps): the recording, and its outputs' views.
        self.draws: dict[tuple[int, int | None], Any] = {}
        self.outputs: dict[tuple[int, int | None], Any] = {}
        self.calls: dict[tuple[int, int | None], int] = {}
        self.generation: int | None = None
        self.disabled: str | None = None  # why recordings stopped (a failed one)
        self._all = list(range(len(storage.arrays)))
        if self.prioritized:
            sampler.record_updates(self._new_capture)

    def _new_capture(self) -> Any:
        """A CUDA graph on CUDA, its traced twin elsewhere (the CPU: tests)."""
        from replaybuffer.sampling.graph_capture import CudaGraphCapture, TracedCapture

        return CudaGraphCapture(self.storage.device, []) if self.graph else TracedCapture()

    def _valid(self, sampler: Any, storage: Any, generation: int) -> bool:
        """Whether the recordings may serve a call now (dropping stale ones)."""
        if storage is not self.storage:  # a save's snapshot wraps it for a while
            return False
        if sampler is not self.sampler:
            self._drop()
            if type(sampler) is not type(self.sampler) or \
                    getattr(sampler, "running_sums", True) is None:
                return False  # its draws are not the recorded ones: eager
            self.sampler = sampler
            if self.prioritized:
                sampler.record_updates(self._new_capture)
        if generation != self.generation:
            packing = storage.packing
            if [b.data_ptr() for b in packing.blocks] != \
                    [b.data_ptr() for b in self.packing.blocks]:
                self._drop()
                self.packing = packing
            self.generation = generation
        return True

    def _drop(self) -> None:
        """Forget every recording (each is made again after a warm-up)."""
        self.draws.clear()
        self.outputs.clear()
        self.calls.clear()

    def sample(self, sampler: Any, storage: Any, generation: int, last_id: int,
               sample_batch_size: int, num_steps: int | None
               ) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
        """``(leaves, [ids, probabilities])`` from a recording (prioritized: ``[ids,
        probabilities, weights]``, the call counted by the sampler), or ``None`` where
        this call is to be served eagerly (a warm-up, a stale or failed recording, a
        range that may have no mass). The caller holds the buffer's lock and has
        checked that a window fits."""
        if self.disabled is not None or not self._valid(sampler, storage, generation):
            return None
        if self.prioritized and not sampler.before_recorded_draw():
            return None
        key = (sample_batch_size, num_steps)
        draw = self.draws.get(key)
        if draw is None:
            calls = self.calls.get(key, 0) + 1
            self.calls[key] = calls
            if calls <= WARM_UP_CALLS or len(self.draws) >= MAX_RECORDINGS:
                return None
            draw = self._record(sample_batch_size, num_steps)
            if draw is None:
                return None
        storage.before_read()
        copy = draw.run(last_id, sampler.key_base) if self.prioritized else \
            draw.run(last_id)
        storage.after_read()
        views = self.outputs[key].of(copy)
        if not self.prioritized:
            return views[:-2], views[-2:]
        leaves, (ids, probabilities, ratios) = views[:-3], views[-3:]
        return leaves, [ids, probabilities, sampler.after_recorded_draw(ratios)]

    def _record(self, sample_batch_size: int, num_steps: int | None) -> Any:
        from replaybuffer.sampling.captured_draws import CapturedUniformDraw, ViewsOf
        from replaybuffer.sampling.captured_prioritized import CapturedPrioritizedDraw
        from replaybuffer.sampling.graph_capture import CudaGraphCapture, TracedCapture

        generator = self.sampler.generator
        # On the CPU the twin that freezes what a graph freezes (host values, tensors
        # bound by identity), so the tests there catch what a GPU's graph would.
        capture: Any = CudaGraphCapture(self.storage.device, [generator]) if self.graph \
            else TracedCapture()
        try:
            draw: Any
            if self.prioritized:
                draw = CapturedPrioritizedDraw(
                    capture, generator, self.sampler.running_sums, self.packing.blocks,
                    self.batch_size, self.max_length, sample_batch_size, num_steps,
                    self.sampler.normalize)
            else:
                draw = CapturedUniformDraw(capture, generator, self.packing.blocks,
                                           self.batch_size, self.max_length,
                                           sample_batch_size, num_steps)
        except RuntimeError as exc:
            if self.required:
                raise RuntimeError(f"capture_samples=True: recording sample_batch_size="
                                   f"{sample_batch_size}, num_steps={num_steps} failed: "
                                   f"{exc}") from exc
            self.disabled = str(exc)
            warnings.warn(f"sampling stays eager: recording the draw failed "
                          f"({exc}); pass capture_samples=False to say so",
                          RuntimeWarning, stacklevel=4)
            return None
        tail = 3 if self.prioritized else 2  # ids, probabilities (and ratios)
        blocks = draw.static[:-tail]
        # The leaves as the storage's gather makes them (views of the gathered blocks).
        templates = self.packing.leaves(blocks, draw.outer, self._all) + draw.static[-tail:]
        self.outputs[(sample_batch_size, num_steps)] = ViewsOf(draw.output, templates)
        self.draws[(sample_batch_size, num_steps)] = draw
        return draw


class CapturedReads(ReadPath):
    """:meth:`draw` from :class:`SampleCaptures` for buffers that record
    (:meth:`record_samples`), eagerly otherwise."""

    _captures: SampleCaptures | None = None

    def _captured_draw(self, sample_batch_size: int | None, num_steps: int | None,
                       time_stacked: bool = True, rng: np.random.Generator | None = None,
                       within_episodes: bool = False, timeout: float | None = None,
                       block: bool = True) -> tuple[Any, BufferInfo] | None:
        """:meth:`draw` of a buffer that records: from a recording where one serves
        the call, else eager."""
        captures = self._captures
        if captures is not None and rng is None and not within_episodes and \
                self._limiter is None and self._codec is None:
            steps = num_steps or 1
            ring = self._ring
            with self._lock:
                last = ring.last_id
                drawn = captures.sample(self._sampler, self._storage, self._generation,
                                        last, sample_batch_size or 1, num_steps) \
                    if steps <= ring.max_length and last + 1 >= steps else None
            if drawn is not None:
                leaves, (ids, probabilities, *weights) = drawn
                info: dict[str, Any] = {"probabilities": probabilities}
                if weights:
                    info["weights"] = weights[0]
                return self._package(leaves, ids, info,  # type: ignore[arg-type]
                                     sample_batch_size, num_steps, time_stacked)
        # The class's draw (the instance's is this one).
        return type(self).draw(self, sample_batch_size, num_steps, time_stacked, rng,
                               within_episodes, timeout, block)

    def record_samples(self, required: bool) -> None:
        """Serve :meth:`draw` from recordings (``capture_samples``) where this buffer's
        storage can have them (``ValueError`` if ``required`` and it cannot)."""
        why = "frame_stack deduplicates frames on read" if self._codec is not None else None
        captures = None
        try:
            captures = None if why else SampleCaptures(
                self._storage, self._sampler, self._ring.batch_size, self._ring.max_length,
                required=required)
        except ValueError as exc:  # not packed blocks (numpy records on the CPU)
            why = str(exc)
        if captures is None and required:
            raise ValueError(f"capture_samples=True: this buffer's draws cannot be "
                             f"recorded: {why}")
        if captures is not None:
            self._captures = captures
            # The check is paid by buffers that record only: the others' draw is
            # ReadPath's, with no frame added to every get_next.
            self.draw = self._captured_draw  # type: ignore[method-assign,assignment]
