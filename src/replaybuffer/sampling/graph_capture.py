"""Recording a sequence of device work once and running it again: a CUDA graph, or
its CPU twin that runs the recorded callable eagerly.

A :class:`Capture` records ``fn`` (a callable that reads its inputs from one int64
0-d tensor, ``scalar``, and writes its results into one static tensor, ``output``,
with ``out=`` and in-place operations), then :meth:`Capture.run` sets the scalar in
place, runs the sequence and returns a fresh copy of ``output``, so a later run never
overwrites what an earlier one handed out.

:class:`CudaGraphCapture` records into a ``torch.cuda.CUDAGraph``: one graph launch
per run, plus the scalar's fill and the copy out. The generators ``fn`` draws from are
registered with the graph (``CUDAGraph.register_generator_state``, for a generator
other than the default one), so each replay draws what an eager run from the
generator's state at that moment would, and advances the generator's offset as that
run would: ``get_state``/``set_state`` keep meaning what they mean eagerly.

:class:`EagerCapture` is the same protocol on any device: ``run`` calls ``fn``. It is
how the logic around a capture (static buffers, in-place inputs, copies out,
invalidation, generator state) is exercised where no GPU is.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

import torch


class Capture(Protocol):
    """A recorded sequence: :meth:`record` once, then :meth:`run` per call."""

    def record(self, fn: Callable[[], None], scalar: torch.Tensor,
               output: torch.Tensor) -> None:
        """Record ``fn``: it reads ``scalar`` (int64, 0-d) and writes ``output``."""

    def run(self, value: int) -> torch.Tensor:
        """Set ``scalar`` to ``value`` (in place), run the recorded sequence and
        return a copy of ``output`` (fresh memory, ``output``'s shape and dtype)."""


class EagerCapture:
    """:class:`Capture` by calling the recorded callable each run (the CPU twin of
    :class:`CudaGraphCapture`: the same inputs, outputs and copies, no graph)."""

    def __init__(self) -> None:
        self._fn: Callable[[], None] | None = None
        self._scalar: torch.Tensor | None = None
        self._output: torch.Tensor | None = None

    def record(self, fn: Callable[[], None], scalar: torch.Tensor,
               output: torch.Tensor) -> None:
        self._fn, self._scalar, self._output = fn, scalar, output

    def run(self, value: int) -> torch.Tensor:
        assert self._fn is not None and self._scalar is not None and \
            self._output is not None, "run before record"
        self._scalar.fill_(value)
        self._fn()
        return self._output.clone()


class CudaGraphCapture:
    """:class:`Capture` as a CUDA graph on ``device``.

    ``generators`` (``torch.Generator`` s on ``device`` that ``fn`` draws from) are
    registered with the graph before it is captured. ``record`` runs ``fn`` once on a
    side stream first (the warm-up torch's graph documentation asks for), with the
    generators' states put back afterwards, so recording draws nothing.

    A run is ordered after the previous run's copy out when it comes from another
    stream (an event recorded after each copy), so two threads' streams never share
    the static buffers at once; on one stream the order is the stream's.
    """

    def __init__(self, device: torch.device, generators: Sequence[torch.Generator]):
        self.device = device
        self._generators = list(generators)
        self._graph: Any = None
        self._scalar: torch.Tensor | None = None
        self._output: torch.Tensor | None = None
        self._done: Any = None  # the event after the last copy out
        self._last_stream: Any = None

    def record(self, fn: Callable[[], None], scalar: torch.Tensor,
               output: torch.Tensor) -> None:
        # On the storage's GPU whatever the calling thread's current device: the
        # capture stream and the graph's memory pool belong to it.
        with torch.cuda.device(self.device):
            states = [g.get_state() for g in self._generators]
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                fn()  # the warm-up: lazy initializations happen outside the capture
            torch.cuda.current_stream(self.device).wait_stream(side)
            for g, state in zip(self._generators, states):
                g.set_state(state)  # the warm-up's draws are not the user's
            graph = torch.cuda.CUDAGraph()
            default = torch.cuda.default_generators[self.device.index or 0]
            for g in self._generators:
                if g is not default:  # the default generator is registered by torch
                    graph.register_generator_state(g)
            # thread_local: other threads may allocate and launch while this one
            # captures (a collector adding steps, say).
            with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
                fn()
        self._graph, self._scalar, self._output = graph, scalar, output
        self._done = torch.cuda.Event()
        self._last_stream = None

    def run(self, value: int) -> torch.Tensor:
        assert self._graph is not None and self._scalar is not None and \
            self._output is not None, "run before record"
        stream = torch.cuda.current_stream(self.device)
        if self._last_stream is not None and stream != self._last_stream:
            stream.wait_event(self._done)
        self._scalar.fill_(value)
        self._graph.replay()
        out = self._output.clone()
        self._done.record(stream)
        self._last_stream = stream
        return out
