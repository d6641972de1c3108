"""A uniform draw and its gather, recorded once per batch shape and run per call.

What a uniform sample does on the device (:class:`~replaybuffer.sampling.torch_uniform.
TorchUniformSampler`'s draw, the windows of ids and positions, the positions modulo the
capacity, one ``index_select`` per packed block of leaves, the probabilities) is about
ten kernels, each a launch of 5-10 us of host time for well under a microsecond of
device work. :class:`CapturedUniformDraw` records the sequence for one
``(sample_batch_size, num_steps)`` into a :class:`~replaybuffer.sampling.graph_capture.
Capture` (a CUDA graph, or its CPU twin), so a sample is a fill of one scalar, one
replay and one copy out.

Nothing that changes between calls is baked into the recording: the sequence reads the
ring's write head (``last_id``) from a 0-d device tensor set in place per call and
derives the valid range of starts from it on the device. Its results go to one static
byte buffer (each gathered block, the ids and the probabilities at aligned offsets);
each call copies the buffer out once and hands out views of the copy, so a batch a
learner holds is never overwritten by a later call. The draws are those of
:func:`~replaybuffer.sampling.torch_uniform.draw_bits` and
:func:`~replaybuffer.sampling.torch_uniform.starts_from_bits` from the sampler's own
generator, so a captured call returns what the eager path would, byte for byte, and
the generator's state (saved, restored, reseeded) means what it means eagerly.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from replaybuffer.sampling.graph_capture import Capture
from replaybuffer.sampling.torch_uniform import draw_bits, starts_from_bits

_ALIGN = 64  # bytes: every segment of the output starts at a multiple


def window_outputs(blocks: Sequence[torch.Tensor], sample_batch_size: int,
                   num_steps: int | None, per_batch: int
                   ) -> tuple[tuple[int, ...], torch.Tensor, list[torch.Tensor]]:
    """The outer shape of a recorded draw of ``sample_batch_size`` windows of
    ``num_steps`` (``[S]`` or ``[S, T]``), its static output buffer and the views of it
    (:func:`static_output`): per block of ``blocks`` its gathered rows
    ``[S * T, width]``, the item ids (int64 ``[*outer]``), and ``per_batch`` float32
    ``[S]`` vectors (probabilities, and the prioritized draw's weight ratios)."""
    outer = (sample_batch_size,) if num_steps is None else (sample_batch_size, num_steps)
    rows = sample_batch_size * (num_steps or 1)
    shapes: list[tuple[torch.dtype, tuple[int, ...]]] = [
        (b.dtype, (rows, int(b.shape[1]))) for b in blocks]
    shapes += [(torch.int64, outer)] + [(torch.float32, (sample_batch_size,))] * per_batch
    return (outer, *static_output(shapes, blocks[0].device))


def static_output(shapes: Sequence[tuple[torch.dtype, tuple[int, ...]]],
                  device: torch.device) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One uint8 buffer for a recording's outputs, and a view of it per ``(dtype,
    shape)`` in ``shapes``, each starting at a multiple of 64 bytes: a call copies the
    buffer out once, whatever the number of outputs."""
    segments = []
    offset = 0
    for dtype, shape in shapes:
        size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        segments.append((dtype, shape, offset, offset + size))
        offset += -(-size // _ALIGN) * _ALIGN
    output = torch.empty(max(offset, _ALIGN), dtype=torch.uint8, device=device)
    return output, [output[first:end].view(dtype).view(shape)
                    for dtype, shape, first, end in segments]


class CapturedUniformDraw:
    """Uniform ``(start, row)`` draws of ``sample_batch_size`` windows of ``num_steps``
    over a ring of ``batch`` rows by ``length`` steps, and the rows of ``blocks`` at
    their positions, recorded in ``capture``.

    Args:
        capture: where the sequence is recorded (it is recorded here, at once).
        generator: the sampler's device generator (the draws' source).
        blocks: the storage's packed blocks, ``[capacity, width]`` each, on the
            generator's device (read in place: writes to them are seen by later runs).
        batch, length: the ring's rows and steps per row (capacity ``batch * length``).
        sample_batch_size: ``S``, windows per call.
        num_steps: ``T``, steps per window, or ``None`` for single steps (no window
            axis in the outputs).
    """

    def __init__(self, capture: Capture, generator: torch.Generator,
                 blocks: Sequence[torch.Tensor], batch: int, length: int,
                 sample_batch_size: int, num_steps: int | None):
        self.capture = capture
        self.generator = generator
        self.blocks = list(blocks)
        self.batch, self.length, self.capacity = batch, length, batch * length
        self.sample_batch_size, self.num_steps = sample_batch_size, num_steps
        device = self.blocks[0].device
        self.device = device
        steps = num_steps or 1
        # The static output: the blocks' rows, item ids, probabilities.
        self.outer, self.output, self.static = window_outputs(
            self.blocks, sample_batch_size, num_steps, 1)
        self.last_id = torch.zeros((), dtype=torch.int64, device=device)
        # Window offsets made here, never inside the recording (a tensor made while a
        # CUDA graph is captured is filled only when it is replayed).
        self._id_steps = torch.arange(steps, device=device)
        self._position_steps = self._id_steps * batch
        # Recording runs the sequence once (a graph's warm-up, the CPU twin's trace):
        # at the smallest head a window fits after, so that the valid starts are not
        # 0 (an integer remainder by 0 raises on the CPU, and is garbage on a GPU).
        self.last_id.fill_(steps - 1)
        capture.record(self._sequence, self.last_id, self.output)

    def _sequence(self) -> None:
        """The recorded work: every input from :attr:`last_id`, every result into
        :attr:`output` (through :attr:`static`)."""
        last, steps = self.last_id, self.num_steps or 1
        lo = torch.clamp_min(last + (1 - self.length), 0)  # ring.oldest_id
        n = (torch.maximum(lo, last + (2 - steps)) - lo) * self.batch
        bits = draw_bits(self.generator, self.sample_batch_size, self.device)
        ids, positions = starts_from_bits(bits, lo, n, self.batch, self.length,
                                          self.capacity)
        *gathered, ids_out, probabilities = self.static
        if self.num_steps is None:
            window_positions = positions
            ids_out.copy_(ids)
        else:
            ids_out.copy_(ids[:, None] + self._id_steps)
            window_positions = ids_out if self.batch == 1 else \
                positions[:, None] + self._position_steps
        flat = torch.remainder(window_positions.reshape(-1), self.capacity)
        for block, out in zip(self.blocks, gathered):
            torch.index_select(block, 0, flat, out=out)
        probabilities.copy_(torch.reciprocal(n.to(torch.float64)).to(torch.float32)
                            .expand(self.sample_batch_size))

    def run(self, last_id: int) -> torch.Tensor:
        """One call: the ring's write head ``last_id`` (at least ``num_steps - 1``: a
        window must fit) in, a fresh copy of :attr:`output` out. Its segments are
        :attr:`static`'s: each gathered block ``[S * T, width]`` (``T`` = 1 without
        ``num_steps``), then the ids (int64 ``[S, T]``, or ``[S]`` without
        ``num_steps``) and the probabilities (float32 ``[S]``); :class:`ViewsOf` remakes
        views of them (or of leaves of them) on the copy."""
        return self.capture.run(last_id)


class ViewsOf:
    """The views ``templates`` of a byte buffer ``buffer`` (any dtypes, shapes and
    strides), remade on a copy of it: one ``view(dtype)`` per dtype and one
    ``as_strided`` per view, fewer tensor constructions than slicing it again.

    Args:
        buffer: uint8 ``[B]``, contiguous, ``B`` a multiple of every dtype's size.
        templates: views of ``buffer``.
    """

    def __init__(self, buffer: torch.Tensor, templates: Sequence[torch.Tensor]):
        base = buffer.untyped_storage().data_ptr()
        self.dtypes: list[torch.dtype] = []
        self.specs: list[tuple[int, tuple[int, ...], tuple[int, ...], int]] = []
        for t in templates:
            if t.untyped_storage().data_ptr() != base:
                raise ValueError("a template is not a view of the buffer")
            if t.dtype not in self.dtypes:
                self.dtypes.append(t.dtype)
            self.specs.append((self.dtypes.index(t.dtype), tuple(t.shape), tuple(t.stride()),
                               int(t.storage_offset())))

    def of(self, copy: torch.Tensor) -> list[torch.Tensor]:
        """The templates' views of ``copy`` (a copy of the buffer), in their order."""
        typed = [copy.view(dtype) for dtype in self.dtypes]
        return [typed[i].as_strided(shape, stride, offset)
                for i, shape, stride, offset in self.specs]
