"""Recording a sequence of device work once and running it again: a CUDA graph, or
its CPU twin that replays the ops recorded (or, the older twin, reruns the callable).

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

:class:`TracedCapture` is the CPU twin of a graph, faithful to what a graph freezes:
``record`` runs ``fn`` once while :class:`OpTrace` notes every aten op it dispatches,
and ``run`` replays those ops without calling ``fn`` again. As in a graph, tensors that
existed before the recording are bound by identity (a graph binds their addresses:
one replaced rather than written in place is not seen), tensors made by the trace's
own ops are the replay's fresh ones, and Python numbers, shapes and generators are the
ones seen at record time (a host value computed from buffer state is frozen). A
registered generator's offset advances per replay in a graph; here the same generator
object draws afresh per replay, so recorded and eager draws stay bit for bit the same.
A host read while recording (``.item()``, ``bool(t)``, ``.tolist()``, ``.numpy()``,
``.cpu()``, an op whose result size depends on data) raises ``RuntimeError``, as it
fails a CUDA graph's capture; so does a tensor allocated while recording that is
still referenced after it (a scratch tensor made lazily and kept on an object): in a
graph it is the pool's memory, empty until a replay and rewritten by every one. The
buffers' CPU path (``capture_samples`` on CPU torch storage) records into it.

:class:`EagerCapture` is the same protocol calling ``fn`` on every run: it freezes
nothing, so it checks only the logic around a capture (static buffers, in-place
inputs, copies out); kept as the simplest :class:`Capture` (a test's stand-in, and
the reference the traced twin is checked against).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Protocol, Sequence

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten


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


# Tensor methods that read a tensor's values back to the host without an aten op the
# dispatch mode would see (``.item()`` and ``bool(t)`` reach _local_scalar_dense, seen
# there too). ``.cpu()`` is a no-op on the CPU but a device-to-host copy on a GPU.
_HOST_READS = {torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.__array__,
               torch.Tensor.cpu, torch.Tensor.item, torch.Tensor.__bool__,
               torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__}
# Aten ops whose result's size depends on the data: the host must read it (a sync,
# refused by a graph's capture; replayed, the twin would differ from any graph).
# (A Python number or bool as an op's result is refused too, whatever the op.)
_DATA_SIZED = {"nonzero", "unique", "_unique", "_unique2", "unique_dim",
               "unique_consecutive", "masked_select", "bincount", "_local_scalar_dense"}


class HostReadError(RuntimeError):
    """A recorded callable read a device value on the host (refused, as by a graph)."""


class EscapedTensorError(RuntimeError):
    """A tensor a recorded callable allocated is still referenced once the recording
    ends (kept on an object, say): in a graph it lives in the graph's memory pool, is
    filled only by a replay and rewritten by every later one."""


class _RefuseHostReads(TorchFunctionMode):
    """Refuses the tensor methods of :data:`_HOST_READS` while a trace is recorded."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        if func in _HOST_READS:
            raise HostReadError(f"a recorded sequence read a tensor on the host "
                                f"(Tensor.{func.__name__}): a CUDA graph cannot, and "
                                f"would freeze the value seen while it was captured")
        return func(*args, **(kwargs or {}))


class OpTrace(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's untyped hook
    """The aten ops a callable dispatches, noted while it runs (a dispatch mode), and
    replayed without it.

    Each op is noted as its overload, its arguments flattened (``torch.utils._pytree``)
    with every tensor made by an earlier op of the trace replaced by that op's output
    slot (one slot per flattened output of every op). Any other argument (a tensor that
    existed before, or one made outside the dispatcher such as a constant, a Python
    number, a shape, a dtype, a device, a ``torch.Generator``) is kept as the object
    seen. :meth:`replay` runs the ops in order with the slots filled by the replay's
    own outputs.
    """

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        # Per op, :func:`_noted`'s (overload, arguments, keyword arguments, links,
        # pytree spec or None).
        self.ops: list[tuple[Any, Any, Any, list[tuple[int, Any, int]], Any]] = []
        self._slot_of: dict[int, int] = {}  # id(tensor) -> slot, while recording
        self._made: list[Any] = []  # slot -> output (kept: ids stay unique)
        # Slots of tensors in memory the recording allocated (not an argument's that
        # existed before: views of, or writes to, that are bound like it), and where.
        self._fresh: list[int] = []
        self._fresh_memory: set[int] = set()
        # Those still referenced when the recording ended (finish), by slot.
        self.escaped: list[tuple[torch.Tensor, int]] = []
        # Each generator an op drew from, and its state before the first such op.
        self._generators: dict[int, tuple[torch.Generator, torch.Tensor]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        leaves, _ = tree_flatten((args, kwargs))
        if name in _DATA_SIZED or (name in ("index", "index_put", "index_put_") and any(
                isinstance(x, torch.Tensor) and x.dtype == torch.bool for x in leaves)):
            raise HostReadError(f"a recorded sequence ran {func}, whose result depends "
                                f"on reading device values on the host: a CUDA graph "
                                f"cannot record it")
        noted = _noted(func, args, kwargs, self._slot_of)  # before the op maps outputs
        for x in leaves:
            if isinstance(x, torch.Generator) and id(x) not in self._generators:
                self._generators[id(x)] = (x, x.get_state())
        result = func(*args, **kwargs)
        outputs, _ = tree_flatten(result)
        memory = {x.untyped_storage().data_ptr() for x in leaves
                  if isinstance(x, torch.Tensor)}
        for out in outputs:
            if not isinstance(out, torch.Tensor) and out is not None:
                raise HostReadError(f"a recorded sequence read {func}'s result on the "
                                    f"host ({type(out).__name__}): a CUDA graph cannot")
            if isinstance(out, torch.Tensor) and id(out) not in self._slot_of:
                self._slot_of[id(out)] = len(self._made)
                where = out.untyped_storage().data_ptr()
                if out.numel() and (where not in memory or where in self._fresh_memory):
                    self._fresh_memory.add(where)  # views of it (a detach) count too
                    self._fresh.append(len(self._made))
            self._made.append(out)  # slot per output position, in order
        self.ops.append(noted)
        return result

    def finish(self) -> None:
        """Recording is over: forget the recording's own tensors (replays make theirs)
        and put back the state each generator had before it (a graph's capture draws
        nothing either)."""
        fresh = [(weakref.ref(self._made[k]), k) for k in self._fresh]
        self._slot_of.clear()
        self._made.clear()
        self._fresh.clear()
        self._fresh_memory.clear()
        for generator, state in self._generators.values():
            generator.set_state(state)
        self._generators.clear()
        self.escaped = [(t, k) for r, k in fresh if (t := r()) is not None]

    def refuse_escapes(self) -> None:
        """Raise where a tensor the recording allocated outlived it (:meth:`finish`
        found it still referenced).

        Raises:
            EscapedTensorError: the first such tensor, by the op that made it.
        """
        if self.escaped:
            t, k = self.escaped[0]
            raise EscapedTensorError(
                f"a tensor the recorded sequence made (shape {tuple(t.shape)}, "
                f"{t.dtype}, output {k} of the recording) is still referenced after it: "
                f"in a CUDA graph it is filled only by a replay and rewritten by each "
                f"one; make it before recording and write it in place")

    def replay(self) -> None:
        """Run the noted ops in order, each tensor made by an earlier op of the trace
        replaced by this replay's."""
        made: list[Any] = []
        for func, args, kwargs, links, spec in self.ops:
            if spec is None:  # every link a top-level argument: no pytree per op
                args, kwargs = list(args), dict(kwargs)
                for where, key, slot in links:
                    (args if where == 0 else kwargs)[key] = made[slot]
            else:
                leaves = list(args)
                for _, i, slot in links:
                    leaves[i] = made[slot]
                args, kwargs = tree_unflatten(leaves, spec)
            result = func(*args, **kwargs)
            if isinstance(result, torch.Tensor):
                made.append(result)
            else:
                made.extend(tree_flatten(result)[0])


def _noted(func: Any, args: Any, kwargs: dict[str, Any], slot_of: dict[int, int]
           ) -> tuple[Any, Any, Any, list[tuple[int, Any, int]], Any]:
    """One op as :meth:`OpTrace.replay` runs it, each tensor argument made by the trace
    (``slot_of``: id -> slot) linked to its slot and held as ``None`` (filled per
    replay): ``(func, args, kwargs, [(0, position, slot) or (1, keyword, slot)],
    None)`` where every linked tensor is a top-level argument (most ops: a replay then
    needs no pytree), else ``(func, flat leaves, None, [(0, leaf index, slot)],
    spec)`` (one inside a list: ``index_put_``'s indices, ``cat``'s inputs)."""
    def slot(x: Any) -> int | None:
        return slot_of.get(id(x)) if isinstance(x, torch.Tensor) else None

    top: list[tuple[int, Any, int]] = []
    flat_args, flat_kwargs = list(args), dict(kwargs)
    for where, items, held in ((0, enumerate(args), flat_args),
                               (1, kwargs.items(), flat_kwargs)):
        for key, x in items:
            k = slot(x)
            if k is not None:
                top.append((where, key, k))
                held[key] = None  # type: ignore[index]
            elif isinstance(x, (list, tuple)) and any(
                    slot(y) is not None for y in tree_flatten(x)[0]):
                leaves, spec = tree_flatten((args, kwargs))
                links = [(0, i, k) for i, y in enumerate(leaves)
                         if (k := slot(y)) is not None]
                for _, i, _ in links:
                    leaves[i] = None
                return func, leaves, None, links, spec
    return func, tuple(flat_args), flat_kwargs, top, None


class TracedCapture:
    """:class:`Capture` as a replay of the aten ops ``fn`` ran once (:class:`OpTrace`):
    the CPU twin of :class:`CudaGraphCapture` that freezes what a graph freezes
    (module docstring).

    Recording runs ``fn`` for real (as a graph's warm-up does) and then puts back the
    state of every ``torch.Generator`` it drew from, so recording draws nothing.

    Raises:
        RuntimeError: (:class:`HostReadError`) ``fn`` read a device value on the host
            while it was recorded, or (:class:`EscapedTensorError`) a tensor it
            allocated is still referenced after it.
    """

    def __init__(self) -> None:
        self._trace: OpTrace | None = None
        self._scalar: torch.Tensor | None = None
        self._output: torch.Tensor | None = None

    def record(self, fn: Callable[[], None], scalar: torch.Tensor,
               output: torch.Tensor) -> None:
        trace = OpTrace()
        try:
            with _RefuseHostReads(), trace:
                fn()
        finally:
            trace.finish()  # the generators' states put back, failed or not
        trace.refuse_escapes()
        self._trace, self._scalar, self._output = trace, scalar, output

    def run(self, value: int) -> torch.Tensor:
        assert self._trace is not None and self._scalar is not None and \
            self._output is not None, "run before record"
        self._scalar.fill_(value)
        self._trace.replay()
        return self._output.clone()

