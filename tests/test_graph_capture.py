"""The CPU twin of a CUDA graph (sampling/graph_capture.py: TracedCapture, OpTrace).

A graph freezes what its callable computed on the host while it was captured and binds
the tensors it touched by address; the twin must do the same, or the CPU tests of the
recorded draws cannot see what a GPU's graph would get wrong. Each test here pins one
of those rules, against :class:`EagerCapture` (which reruns the callable) where the two
differ, and a property test checks that a callable reading no host state replays what
an eager call gives, bit for bit, random draws included.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from replaybuffer.sampling.graph_capture import (EagerCapture,  # noqa: E402
                                                 EscapedTensorError, HostReadError,
                                                 TracedCapture)


def scalar_and_output(n: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros((), dtype=torch.int64), torch.zeros(n, dtype=torch.int64)


def test_a_python_number_read_from_state_keeps_its_record_time_value():
    state = {"offset": 3}
    scalar, output = scalar_and_output()

    def fn():
        output.copy_(torch.arange(4) + scalar + state["offset"])

    traced, eager = TracedCapture(), EagerCapture()
    traced.record(fn, scalar, output)
    eager.record(fn, scalar, output)
    state["offset"] = 100  # a graph captured 3: so must the twin
    assert traced.run(10).tolist() == [13, 14, 15, 16]
    assert eager.run(10).tolist() == [110, 111, 112, 113]  # what the old twin saw


def test_a_tensor_made_in_the_recording_is_the_replay_s_own():
    scalar, output = scalar_and_output(3)

    def fn():
        made = torch.arange(3) * scalar  # made by the trace, then written in place
        made.add_(1)
        head = made[:2]  # a view of it
        values, order = torch.sort(-made)  # an op of two outputs
        output.copy_(order + head.sum())

    capture = TracedCapture()
    capture.record(fn, scalar, output)
    for value in (0, 5, -7):
        made = torch.arange(3) * value + 1
        want = torch.sort(-made).indices + made[:2].sum()
        got = capture.run(value)
        assert torch.equal(got, want), value
        assert got.data_ptr() != output.data_ptr()  # a copy out


def test_a_tensor_replaced_rather_than_written_in_place_is_not_seen():
    """A graph binds the address of what it read: a new tensor put in an attribute
    afterwards is invisible to it; a write in place is seen."""
    holder = {"table": torch.tensor([1, 2, 3, 4])}
    scalar, output = scalar_and_output()

    def fn():
        output.copy_(holder["table"] + scalar)

    capture = TracedCapture()
    capture.record(fn, scalar, output)
    holder["table"].mul_(10)  # in place: seen
    assert capture.run(0).tolist() == [10, 20, 30, 40]
    holder["table"] = torch.tensor([7, 7, 7, 7])  # replaced: the recorded one is read
    assert capture.run(1).tolist() == [11, 21, 31, 41]


def test_recording_draws_nothing_and_each_run_draws_as_an_eager_call():
    generator = torch.Generator().manual_seed(11)
    scalar = torch.zeros((), dtype=torch.int64)
    output = torch.zeros(5, dtype=torch.float64)

    def fn():
        output.copy_(torch.rand(5, dtype=torch.float64, generator=generator) + scalar)

    before = generator.get_state()
    capture = TracedCapture()
    capture.record(fn, scalar, output)
    assert torch.equal(generator.get_state(), before)
    reference = torch.Generator().manual_seed(11)
    runs = [capture.run(k) for k in range(3)]
    for k, got in enumerate(runs):
        assert torch.equal(got, torch.rand(5, dtype=torch.float64,
                                           generator=reference) + k)
    assert torch.equal(generator.get_state(), reference.get_state())  # it advanced
    generator.set_state(before)  # a restored state draws the same again
    assert torch.equal(capture.run(0), runs[0])


def host_reads() -> list:
    zero = torch.zeros((), dtype=torch.int64)
    return [
        ("item", lambda t: t.sum().item()),
        ("bool", lambda t: bool(t.sum() > 0)),
        ("int", lambda t: int(t.sum())),
        ("float", lambda t: float(t.sum())),
        ("tolist", lambda t: t.tolist()),
        ("numpy", lambda t: t.numpy()),
        ("array", lambda t: np.asarray(t)),
        ("cpu", lambda t: t.cpu()),
        ("index by a 0-d tensor", lambda t: t[zero + 1]),
        ("boolean mask", lambda t: t[t > 1]),
        ("nonzero", lambda t: torch.nonzero(t)),
        ("unique", lambda t: torch.unique(t)),
        ("equal", lambda t: torch.equal(t, t)),
    ]


@pytest.mark.parametrize("name,read", host_reads(), ids=[n for n, _ in host_reads()])
def test_a_host_read_while_recording_raises(name, read):
    generator = torch.Generator().manual_seed(3)
    scalar, output = scalar_and_output()
    before = generator.get_state()

    def fn():
        t = torch.arange(4) + scalar + torch.randint(0, 3, (4,), generator=generator)
        read(t)
        output.copy_(t)

    with pytest.raises(HostReadError) as caught:
        TracedCapture().record(fn, scalar, output)
    assert isinstance(caught.value, RuntimeError)  # what captured_reads catches
    assert torch.equal(generator.get_state(), before)  # put back, failed or not
    assert torch.arange(3).sum().item() == 3  # no mode left behind


class LazyScratch:
    """Scratch made at its first use and kept (as TorchPrefixSums makes its
    ``_hold_empty`` scratch): made inside a recording, it is the graph pool's memory."""

    def __init__(self):
        self.scratch = None

    def use(self, t):
        if self.scratch is None:
            self.scratch = torch.zeros_like(t)
        return self.scratch.copy_(t).add_(1)


def test_a_tensor_made_in_the_recording_and_kept_after_it_raises():
    scalar, output = scalar_and_output()
    lazy = LazyScratch()

    def fn():
        output.copy_(lazy.use(torch.arange(4) + scalar))

    with pytest.raises(EscapedTensorError, match=r"shape \(4,\).*still referenced"):
        TracedCapture().record(fn, scalar, output)
    assert isinstance(EscapedTensorError("x"), RuntimeError)  # captured_reads' fallback
    lazy.use(torch.zeros(4, dtype=torch.int64))  # made before recording: bound, fine
    capture = TracedCapture()
    capture.record(fn, scalar, output)
    assert capture.run(2).tolist() == [3, 4, 5, 6]
    assert lazy.scratch.tolist() == [3, 4, 5, 6]  # written in place by the replay


def test_a_view_of_existing_memory_kept_after_the_recording_is_fine():
    table = torch.arange(6)
    kept = {}
    scalar, output = scalar_and_output(2)

    def fn():
        kept["head"] = table[:2]  # a view: the table's memory, not the recording's
        output.copy_(kept["head"] + scalar)

    capture = TracedCapture()
    capture.record(fn, scalar, output)
    assert capture.run(1).tolist() == [1, 2]


ops = st.lists(st.sampled_from(["add_scalar", "mul_in_place", "draw", "sort", "cumsum",
                                "index_select", "where", "view", "index_put", "stack"]),
               min_size=1, max_size=12)


@settings(max_examples=40, deadline=None)
@given(program=ops, values=st.lists(st.integers(-50, 50), min_size=1, max_size=4),
       seed=st.integers(0, 2**32 - 1))
def test_a_callable_reading_no_host_state_replays_what_eager_calls_give(program, values,
                                                                        seed):
    """The reference model: the callable itself, rerun (EagerCapture), over a table
    written in place between runs and a generator seeded alike."""
    def build():
        generator = torch.Generator().manual_seed(seed)
        table = torch.arange(8, dtype=torch.int64)
        scalar, output = scalar_and_output(8)

        def fn():
            t = table + scalar
            for op in program:
                if op == "add_scalar":
                    t = t + 3
                elif op == "mul_in_place":
                    t.mul_(2)
                elif op == "draw":
                    t = t + torch.randint(0, 9, (8,), generator=generator)
                elif op == "sort":
                    t = torch.sort(t, stable=True).indices + t
                elif op == "cumsum":
                    t = torch.cumsum(t, 0)
                elif op == "index_select":
                    t = torch.index_select(table, 0, torch.remainder(t, 8)) + t
                elif op == "where":
                    t = torch.where(t > scalar, t, -t)
                elif op == "index_put":  # intermediates inside a list argument
                    t = torch.zeros_like(t).index_put_((torch.remainder(t, 8),), t,
                                                       accumulate=True)
                elif op == "stack":
                    t = torch.stack([t, table]).sum(0)
                else:
                    t = t.view(2, 4).flip(1).reshape(8)
            output.copy_(t)
        return table, fn, scalar, output

    table, fn, scalar, output = build()
    traced = TracedCapture()
    traced.record(fn, scalar, output)
    table2, fn2, scalar2, output2 = build()
    eager = EagerCapture()
    eager.record(fn2, scalar2, output2)
    for value in values:
        assert torch.equal(traced.run(value), eager.run(value))
        table.add_(value)
        table2.add_(value)
