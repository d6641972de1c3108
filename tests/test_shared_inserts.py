"""The shared buffer's insert shortcuts (issue 24, item 5): ``add_batch``'s item check
(:meth:`ItemChecker.batch`) and the plain step (:meth:`SharedWriter._write_plain_step`)
against the general path, byte for byte, and bad input through them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybuffer as rb
from replaybuffer.distributed import SharedReplayBuffer
from replaybuffer.errors import SpecError

SPEC = {"obs": rb.ArraySpec((3,), np.float32), "reward": rb.ArraySpec((), np.float32),
        "flag": rb.ArraySpec((), np.int32), "img": rb.ArraySpec((2, 2), np.uint8)}

KINDS = ["exact", "exact", "exact", "strided", "fortran", "reward64", "list", "int_obs",
         "float_flag", "shape", "batch", "missing", "extra", "tuple"]
"""Items an add_batch may get: usual ones (the shortcut's), ones the general path
converts, and ones it refuses."""


def items_of(kind: str, count: int, seed: int) -> object:
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(count, 3)).astype(np.float32)
    items: dict = {"obs": obs, "reward": rng.normal(size=count).astype(np.float32),
                   "flag": rng.integers(-9, 9, count).astype(np.int32),
                   "img": rng.integers(0, 255, (count, 2, 2)).astype(np.uint8)}
    if kind == "strided":  # exact dtype and shape, not contiguous
        items["obs"] = np.repeat(obs, 2, 1)[:, ::2]
    elif kind == "fortran":
        items["img"] = np.asfortranarray(items["img"])
    elif kind == "reward64":
        items["reward"] = items["reward"].astype(np.float64)
    elif kind == "list":
        items["obs"] = obs.tolist()
    elif kind == "int_obs":
        items["obs"] = rng.integers(0, 5, (count, 3))
    elif kind == "float_flag":
        items["flag"] = items["flag"].astype(np.float32)
    elif kind == "shape":
        items["obs"] = rng.normal(size=(count, 4)).astype(np.float32)
    elif kind == "batch":
        items = {k: np.concatenate([v, v[:1]]) for k, v in items.items()}
    elif kind == "missing":
        del items["flag"]
    elif kind == "extra":
        items["other"] = obs
    elif kind == "tuple":
        return tuple(items.values())
    return items


def general_only(buffer: SharedReplayBuffer) -> SharedReplayBuffer:
    """``buffer`` with both shortcuts off: every batch checked by
    :meth:`ItemChecker.arrays`, every step written by ``_write_step``."""
    checker = buffer._items

    def long_way(items):
        leaves, (count,) = checker.arrays(items, "add_batch", 1)
        return leaves, count

    checker.batch = long_way
    buffer._writer._plain = False
    return buffer


def state_of(buffer: SharedReplayBuffer) -> list[bytes]:
    """Every shared array of the buffer's directory, as bytes."""
    return [np.load(path, mmap_mode="r").tobytes() for path in sorted(buffer.path.glob("*.npy"))]


def outcome(buffer: SharedReplayBuffer, items: object) -> object:
    try:
        return buffer.add_batch(items, block=False)
    except (SpecError, ValueError, TypeError) as error:
        return type(error), str(error)


LIMITERS = {"none": lambda: None, "min_size": lambda: rb.MinSize(1),
            "ratio": lambda: rb.SampleToInsertRatio(1.0, 1, 1e9)}


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 3), max_length=st.integers(1, 4),
       limiter=st.sampled_from(sorted(LIMITERS)),
       calls=st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 2**31)),
                      min_size=1, max_size=14))
def test_the_shortcuts_write_what_the_general_path_writes_byte_for_byte(
        rows, max_length, limiter, calls):
    """The same calls (usual items, items the general path converts, bad items) into a
    buffer with the shortcuts and one without: the same results and errors, and after
    each call every shared array (data, versions, heads, held counts, the limiter's
    counters) byte for byte the same, across the ring's wrap."""
    with SharedReplayBuffer(SPEC, rows, max_length, rate_limiter=LIMITERS[limiter]()) as fast, \
            SharedReplayBuffer(SPEC, rows, max_length,
                               rate_limiter=LIMITERS[limiter]()) as plain:
        general_only(plain)
        for kind, seed in calls:
            items = items_of(kind, rows, seed)
            assert outcome(fast, items) == outcome(plain, items), kind
            assert state_of(fast) == state_of(plain), kind
        assert len(fast) == len(plain)


def test_a_usual_batch_takes_both_shortcuts_and_an_unusual_one_the_general_path(monkeypatch):
    """After the first batch (the long way, which claims the rows), usual batches are
    neither converted by ItemChecker.arrays nor written by _write_step; a batch that
    needs converting goes the long way again and is stored as converted."""
    with SharedReplayBuffer(SPEC, 2, 8) as buffer:
        checker, writer = buffer._items, buffer._writer
        calls = {"arrays": 0, "step": 0}
        arrays, step = checker.arrays, writer._write_step

        def counted_arrays(*args):
            calls["arrays"] += 1
            return arrays(*args)

        def counted_step(*args):
            calls["step"] += 1
            return step(*args)

        monkeypatch.setattr(checker, "arrays", counted_arrays)
        monkeypatch.setattr(writer, "_write_step", counted_step)
        for seed in range(5):
            buffer.add_batch(items_of("exact", 2, seed))
        assert calls == {"arrays": 1, "step": 0}
        converted = items_of("reward64", 2, 9)
        buffer.add_batch(converted)
        assert calls == {"arrays": 2, "step": 0}
        batch, info = buffer.get_next(64)
        last = batch["reward"][info.ids // 2 == 5]
        assert set(last.tolist()) <= set(converted["reward"].astype(np.float32).tolist())
        assert len(buffer) == 12


@pytest.mark.parametrize("kind, message", [
    ("shape", r"^leaf \['obs'\]: expected shape \(1, 3\) \(leading dimensions \[batch=1\] "
              r"then the spec shape \(3,\)\), got \(1, 4\)$"),
    ("batch", r"^add_batch: this process writes 1 rows \(0\.\.0\); got a batch of 2$"),
    ("missing", r"^add_batch: items do not match the data_spec structure: expected "
                r"\{'flag': \*, 'img': \*, 'obs': \*, 'reward': \*\}, got \{'img'"),
    ("tuple", r"^add_batch: items do not match the data_spec structure: .* got \(\*, \*"),
    ("list", r"^leaf \['obs'\]: expected an array, got a list"),
    ("float_flag", r"^leaf \['flag'\]"),
])
def test_bad_items_through_the_shortcut_raise_as_before_and_change_nothing(kind, message):
    """Once the shortcut is armed (a usual batch came), bad items still raise the
    general path's error naming the leaf, and leave every shared array as it was."""
    with SharedReplayBuffer(SPEC, 1, 4, rate_limiter=rb.SampleToInsertRatio(1.0, 2, 50.0)
                            ) as buffer:
        for seed in range(6):  # past the ring's wrap
            buffer.add_batch(items_of("exact", 1, seed))
        before, stats = state_of(buffer), buffer.stats()
        with pytest.raises(SpecError, match=message):
            buffer.add_batch(items_of(kind, 1, 7))
        assert state_of(buffer) == before and len(buffer) == 4
        assert buffer.stats().inserts == stats.inserts == 6
        buffer.add_batch(items_of("exact", 1, 8))
        assert buffer.stats().inserts == 7
