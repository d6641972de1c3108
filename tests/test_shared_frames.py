"""Frame dedup in the shared-memory buffer: each frame stored once in shared memory,
stacks byte-identical to those added, over rows of several writer processes, killed
writers, clear, windows, episodes, the Queue limiter, priorities and checkpoints."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import replaybuffer as rb
from replaybuffer import Queue
from replaybuffer.crash_points import CRASH_EXIT_CODE
from replaybuffer.distributed import SharedReplayBuffer
from replaybuffer.distributed.shared.frame_ring import SharedFrameRing, SideFramesFullError
from replaybuffer.errors import CheckpointError, SpecError
from soak import frame_workloads

H, W = 3, 4
FORK = mp.get_context("fork")


def spec(K: int, axis: int = 0, frame=(H, W)) -> dict:
    shape = (K,) + frame if axis == 0 else frame + (K,)
    return {"obs": rb.ArraySpec(shape, np.uint8), "row": rb.ArraySpec((), np.int64),
            "step": rb.ArraySpec((), np.int64)}


def plain_frame(value: int) -> np.ndarray:
    return np.full((H, W), value % 256, np.uint8)


class StackModel:
    """The plain model: per row, the frames a frame-stack wrapper saw, and the stack of
    each step as it was added (axis 0), by ``(row, step)``."""

    def __init__(self, K: int, rng: np.random.Generator):
        self.K, self.rng = K, rng
        self.added: dict[tuple[int, int], np.ndarray] = {}
        self.history: dict[int, list[np.ndarray]] = {}
        self.padding: dict[int, np.ndarray] = {}

    def stack(self, row: int, step: int, kind: str) -> np.ndarray:
        """The next stack of ``row``: ``reset``/``zero`` start an episode padded by
        repetition or zeros, ``slide`` slides on (a new frame), ``random`` is a stack of
        frames drawn from a small palette (zero and earlier frames included, so that
        frame-by-frame matches of every kind happen; it never slides)."""
        K, seen = self.K, self.history.setdefault(row, [])
        new = plain_frame(int(self.rng.integers(1, 250)))
        if kind == "random":
            palette = [np.zeros((H, W), np.uint8), new] + seen[-K:]
            frames = [palette[int(self.rng.integers(len(palette)))] for _ in range(K - 1)]
            stack = np.stack(frames + [new])
            seen.clear()
        elif kind in ("reset", "zero") or not seen:
            pad = new if kind != "zero" else np.zeros((H, W), np.uint8)
            stack = np.stack([pad] * (K - 1) + [new])
            seen[:] = [new]
            self.padding[row] = pad
        else:
            seen.append(new)
            window = seen[-K:]
            stack = np.stack([self.padding[row]] * (K - len(window)) + window)
        if kind != "random":
            seen[:] = seen[-K:]
        self.added[(row, step)] = stack
        return stack


def item(stacks: np.ndarray, rows: np.ndarray, steps: np.ndarray, axis: int = 0) -> dict:
    obs = stacks if axis == 0 else np.moveaxis(stacks, 1, -1)
    return {"obs": np.ascontiguousarray(obs), "row": rows.astype(np.int64),
            "step": steps.astype(np.int64)}


def check_samples(buffer: SharedReplayBuffer, added: dict, draws: int = 200,
                  axis: int = 0, num_steps: int | None = None, ids_name: bool = True) -> int:
    """Every sampled stack is, byte for byte, the one added at its (row, step) leaves;
    ``ids_name``: which are also the sample's row and step ids (not so after a restore
    from a local checkpoint, whose steps are numbered from 0)."""
    batch, info = buffer.get_next(draws, num_steps)
    obs = batch["obs"] if axis == 0 else np.moveaxis(batch["obs"], -1, -3)
    ids = np.asarray(info.ids)
    if ids_name:
        np.testing.assert_array_equal(ids % buffer.num_rows, batch["row"])
        np.testing.assert_array_equal(ids // buffer.num_rows, batch["step"])
    for stack, row, step in zip(obs.reshape((-1,) + obs.shape[-3:]),
                                batch["row"].reshape(-1), batch["step"].reshape(-1)):
        expected = added[(int(row), int(step))]
        assert stack.tobytes() == expected.tobytes(), (int(row), int(step))
    return len(ids)


def state_of(buffer: SharedReplayBuffer) -> list[bytes]:
    """Every shared array of the buffer's directory, as bytes, but the row owners: a
    process's first call claims its rows before its items are encoded, refused or not
    (as ``claim_rows`` does; giving them back would race another thread of the process
    that was handed the same rows)."""
    return [np.load(path, mmap_mode="r").tobytes()
            for path in sorted(buffer.path.glob("*.npy")) if path.name != "owner.npy"]


# ------------------------------------------------------------ against the model
@settings(max_examples=25, deadline=None)
@given(K=st.integers(2, 4), rows=st.integers(1, 3), max_length=st.integers(1, 6),
       axis=st.sampled_from([0, -1]),
       plan=st.lists(st.tuples(st.sampled_from(["reset", "zero", "slide", "slide",
                                                "slide", "random"]),
                               st.integers(1, 4)), min_size=1, max_size=12),
       seed=st.integers(0, 2**16))
def test_stacks_come_back_byte_identical_to_a_plain_model(K, rows, max_length, axis, plan,
                                                          seed):
    """Random episodes (reset and zero padding, sliding and non-sliding stacks) written by
    add_batch and extend past the wrap: every sampled stack, alone or in windows, is the
    one added, and len() is the model's."""
    model = StackModel(K, np.random.default_rng(seed))
    with SharedReplayBuffer(spec(K, axis), rows, max_length, frame_stack="obs",
                            stack_axis=axis, side_frames=(K - 1) * max_length,
                            seed=seed) as buffer:
        row_ids = np.arange(rows)
        written = 0
        for kind, steps in plan:
            stacks = [np.stack([model.stack(r, written + t, kind if t == 0 or
                                            kind == "random" else "slide")
                                for r in range(rows)]) for t in range(steps)]
            if steps == 1:
                buffer.add_batch(item(stacks[0], row_ids, np.full(rows, written), axis))
            else:  # extend: leaves [B, T, ...]
                per_step = [item(s, row_ids, np.full(rows, written + t), axis)
                            for t, s in enumerate(stacks)]
                buffer.extend({k: np.stack([p[k] for p in per_step], 1)
                               for k in per_step[0]})
            written += steps
        assert len(buffer) == rows * min(written, max_length)
        check_samples(buffer, model.added, 64, axis)
        if min(written, max_length) >= 2:
            check_samples(buffer, model.added, 16, axis, num_steps=2)


@settings(max_examples=25, deadline=None)
# A first call refused: nothing but its claim of rows stays.
@example(K=4, rows=2, max_length=2, side=1, plan=[("random", 2), ("slide", 1)], seed=2)
@given(K=st.integers(2, 4), rows=st.integers(1, 2), max_length=st.integers(1, 5),
       side=st.integers(1, 12),
       plan=st.lists(st.tuples(st.sampled_from(["reset", "slide", "random", "random"]),
                               st.integers(1, 7)), min_size=1, max_size=10),
       seed=st.integers(0, 2**16))
def test_calls_refused_for_side_frames_change_nothing_and_the_rest_match_the_model(
        K, rows, max_length, side, plan, seed):
    """Random calls (add_batch and extend, longer than the rows hold too) into rows with
    few side frames: a refused call leaves every shared array as it was; what the
    accepted ones wrote comes back byte-identical; with ``(K - 1) * max_length`` side
    frames a row never refuses (every step held needs at most ``K - 1``)."""
    model = StackModel(K, np.random.default_rng(seed))
    side = min(side, (K - 1) * max_length)
    with SharedReplayBuffer(spec(K), rows, max_length, frame_stack="obs",
                            side_frames=side, seed=seed) as buffer:
        row_ids = np.arange(rows)
        written = 0
        for kind, steps in plan:
            stacks = [np.stack([model.stack(r, written + t, kind if t == 0 or
                                            kind == "random" else "slide")
                                for r in range(rows)]) for t in range(steps)]
            before = state_of(buffer)
            try:
                if steps == 1:
                    buffer.add_batch(item(stacks[0], row_ids, np.full(rows, written)))
                else:
                    buffer.extend(steps_of(stacks, row_ids, written))
            except SideFramesFullError:
                assert side < (K - 1) * max_length
                assert state_of(buffer) == before
                continue
            written += steps
        assert len(buffer) == rows * min(written, max_length)
        if written:
            check_samples(buffer, model.added, 64)


def test_memory_is_about_one_frame_per_step():
    """The shared files of a dedup buffer against those of the same buffer storing whole
    stacks: the stacked leaf costs about a frame and K references per step."""
    K, frame, rows, length = 4, (32, 32), 2, 256
    with SharedReplayBuffer(spec(K, frame=frame), rows, length) as stacked, \
            SharedReplayBuffer(spec(K, frame=frame), rows, length, frame_stack="obs",
                               side_frames=8) as dedup:
        def size(buffer):
            return sum(p.stat().st_size for p in buffer.path.glob("*.npy"))
        frame_bytes, positions = 32 * 32, rows * length
        others = size(stacked) - positions * K * frame_bytes  # all but the stacks
        per_step = (size(dedup) - others) / positions
        # One frame, K int64 references and a frame id per step, and per row K - 1 ring
        # frames and 8 side frames more (1.05 frames a step at this length).
        assert frame_bytes + 8 * K < per_step < 1.1 * frame_bytes + 8 * K + 8


# ------------------------------------------------------------ several writer processes
def _write_episodes(buffer: SharedReplayBuffer, count: int, steps: int, seed: int) -> None:
    """A writer process: episodes of stacks that name their row and step (each frame's
    bytes come from them), ``count`` rows of its own."""
    first, _ = buffer.claim_rows(count)
    rows = np.arange(first, first + count)
    for step in range(steps):
        buffer.add_batch(item(np.stack([named_stack(int(r), step) for r in rows]), rows,
                              np.full(count, step)))


def named_stack(row: int, step: int, K: int = 3) -> np.ndarray:
    """The stack of ``row``'s ``step``: episodes of 5 steps, reset-padded (odd rows) or
    zero-padded (even rows)."""
    start = step - step % 5
    frames = []
    for t in range(step - K + 1, step + 1):
        if t >= start:
            frames.append(plain_frame(row * 64 + t % 61 + 1))
        else:
            frames.append(plain_frame(row * 64 + start % 61 + 1) if row % 2
                          else np.zeros((H, W), np.uint8))
    return np.stack(frames)


def check_named(batch: dict) -> None:
    for stack, row, step in zip(batch["obs"], batch["row"], batch["step"]):
        assert stack.tobytes() == named_stack(int(row), int(step)).tobytes()


def test_writer_processes_share_one_ring_and_a_reader_sees_only_added_stacks():
    """Three writer processes (forked handles) write their own rows while this process
    samples: every stack drawn, during and after, is the one its row's writer added."""
    with SharedReplayBuffer(spec(3), 5, 8, frame_stack="obs", seed=1) as buffer:
        writers = [FORK.Process(target=_write_episodes, args=(buffer, n, 60, n))
                   for n in (1, 2, 2)]
        for process in writers:
            process.start()
        draws = 0
        while any(p.is_alive() for p in writers):
            if len(buffer):
                batch, _ = buffer.get_next(32)
                check_named(batch)
                draws += 1
        for process in writers:
            process.join(60)
            assert process.exitcode == 0
        assert len(buffer) == 5 * 8
        for _ in range(5):
            check_named(buffer.get_next(64)[0])
        windows, _ = buffer.get_next(16, num_steps=3)
        for t in range(3):
            check_named({k: v[:, t] for k, v in windows.items()})


# ------------------------------------------------------------ killed writers
def _write_then_die_in_the_frame_write(buffer: SharedReplayBuffer, steps: int) -> None:
    """Writes ``steps`` whole steps, then dies (as a SIGKILL would: ``os._exit``) after
    writing the next step's newest frame to the ring, before its ids and versions."""
    _write_episodes(buffer, 2, steps, 0)

    def die(ring: SharedFrameRing, writes) -> None:
        frames, _, _, step, first = writes
        position = (step % ring.slots) * ring.rows + first
        ring.frames[position:position + len(frames)] = 255 - frames[:, -1]  # not its own
        os._exit(86)

    SharedFrameRing.commit = die  # type: ignore[method-assign]  # this child only
    buffer.add_batch(item(np.stack([named_stack(r, steps) for r in (0, 1)]),
                          np.arange(2), np.full(2, steps)))


def test_a_writer_killed_in_the_frame_write_leaves_no_torn_stack():
    """A writer dies mid-step with a frame written over the ring position of a step
    still held: no sample shows it; the next writer takes the rows over and goes on."""
    with SharedReplayBuffer(spec(3), 2, 4, frame_stack="obs", seed=2) as buffer:
        child = FORK.Process(target=_write_then_die_in_the_frame_write, args=(buffer, 9))
        child.start()
        child.join(60)
        assert child.exitcode == 86
        assert len(buffer) == 2 * 3  # step 5 of each row went: its position is odd
        for _ in range(5):
            check_named(buffer.get_next(64)[0])
        after = FORK.Process(target=_write_episodes, args=(buffer, 2, 30, 1))
        after.start()  # a new writer's steps 0.. land on whatever rows it claims
        after.join(60)
        assert after.exitcode == 0
        for _ in range(5):
            batch = buffer.get_next(64)[0]
            check_named(batch)


FRAME_WORKLOADS = str(Path(frame_workloads.__file__))


def run_frame_workload(handle: Path, units: int, seed: int, crash_at: str | None = None
                       ) -> subprocess.CompletedProcess:
    """The soak's frame-dedup writer (attach, claim 2 rows, add or extend, sample, close;
    ``units`` times) in a child process, with ``REPLAYBUFFER_CRASH_AT=crash_at``."""
    env = {k: v for k, v in os.environ.items() if k != "REPLAYBUFFER_CRASH_AT"}
    if crash_at is not None:
        env["REPLAYBUFFER_CRASH_AT"] = crash_at
    args = {"handle": str(handle), "rows": 2, "units": units, "prioritized": False,
            "seed": seed}
    return subprocess.run([sys.executable, FRAME_WORKLOADS, "shared_frames",
                           json.dumps(args)], env=env, capture_output=True, text=True,
                          timeout=120)


def check_workload_stacks(buffer: SharedReplayBuffer, draws: int = 256) -> np.ndarray:
    """Every sampled stack is the one its row and step name; the steps drawn."""
    batch, info = buffer.get_next(draws)
    ids = np.asarray(info.ids)
    rows, steps = ids % buffer.num_rows, ids // buffer.num_rows
    for stack, row, step in zip(batch["obs"], rows, steps):
        np.testing.assert_array_equal(stack, frame_workloads.stack(int(row), int(step)))
    return steps


def test_a_writer_crashed_at_its_frame_write_leaves_no_torn_stack(tmp_path):
    """A writer ended at ``shared.write.frames`` (its 10th step's newest frames in the
    ring, their ids and side frames not): the frame is there, its id is still the old
    step's, the step is not held, every stack drawn is whole, and a new writer takes the
    rows over and goes on, matching no frame the dead one left half written."""
    with SharedReplayBuffer(frame_workloads.frames_spec(), 2, 4, frame_stack="obs",
                            side_frames=4, seed=3) as buffer:
        handle = tmp_path / "handle.pkl"
        handle.write_bytes(pickle.dumps(buffer))
        crashed = run_frame_workload(handle, 12, 4, "shared.write.frames:10")
        assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr[-2000:]
        np.testing.assert_array_equal(buffer.steps_written(), [9, 9])
        assert len(buffer) == 2 * 3  # step 9 was overwriting step 5: neither is held
        slots = 4 + frame_workloads.K - 1  # the ring frames a row
        positions = (9 % slots) * 2 + np.arange(2)
        frames = np.load(buffer.path / "frames.npy", mmap_mode="r")
        frame_ids = np.load(buffer.path / "frame_ids.npy", mmap_mode="r")
        np.testing.assert_array_equal(frames[positions], [[0, 9], [1, 9]])
        np.testing.assert_array_equal(frame_ids[positions], 9 - slots + 1)  # step 3's
        assert set(check_workload_stacks(buffer).tolist()) == {6, 7, 8}
        after = run_frame_workload(handle, 9, 5)
        assert after.returncode == 0, after.stderr[-2000:]
        written = buffer.steps_written()
        assert written[0] == written[1] >= 9 + 9
        assert len(buffer) == 2 * 4
        assert set(check_workload_stacks(buffer).tolist()) == set(range(written[0] - 4,
                                                                          written[0]))


def _write_forever(buffer: SharedReplayBuffer, count: int) -> None:
    first, _ = buffer.claim_rows(count)
    rows = np.arange(first, first + count)
    while True:
        steps = buffer.steps_written()[rows]
        buffer.add_batch(item(np.stack([named_stack(int(r), int(s))
                                        for r, s in zip(rows, steps)]), rows, steps))


def test_writers_killed_at_random_moments_leave_no_torn_stack():
    """Writers SIGKILLed at random moments, over and over, each followed by a new writer
    on the freed rows: every stack sampled meanwhile and after is one that was added."""
    rng = np.random.default_rng(3)
    with SharedReplayBuffer(spec(3), 2, 6, frame_stack="obs", seed=3) as buffer:
        for _ in range(12):
            child = FORK.Process(target=_write_forever, args=(buffer, 2))
            child.start()
            deadline = time.monotonic() + float(rng.uniform(0.05, 0.3))
            while time.monotonic() < deadline:
                if len(buffer):
                    check_named(buffer.get_next(16)[0])
            os.kill(child.pid, signal.SIGKILL)
            child.join(60)
        assert len(buffer) > 0
        for _ in range(10):
            check_named(buffer.get_next(64)[0])


# ------------------------------------------------------------ bad input
def test_bad_stacks_are_refused_naming_the_leaf_and_nothing_changes():
    with SharedReplayBuffer(spec(3), 1, 4, frame_stack="obs") as buffer:
        _write_episodes(buffer, 1, 2, 0)
        before = state_of(buffer)
        with pytest.raises(SpecError, match=r"obs"):
            buffer.add_batch(item(np.zeros((1, 2, H, W), np.uint8), np.zeros(1),
                                  np.zeros(1)))
        with pytest.raises(SpecError, match=r"obs"):
            buffer.add_batch(item(np.full((1, 3, H, W), 0.5), np.zeros(1), np.zeros(1)))
        assert state_of(buffer) == before
        assert len(buffer) == 2


def test_a_full_side_area_is_refused_naming_the_field_and_its_capacity():
    """Stacks that neither slide nor are padding take side frames; one that needs more
    than its row has free raises before anything is written, and the row goes on."""
    with SharedReplayBuffer(spec(3), 1, 4, frame_stack="obs", side_frames=2) as buffer:
        rows = np.zeros(1)

        def odd_stack(step):  # two frames no ring frame, zero or neighbour matches
            return np.stack([plain_frame(200 + step), plain_frame(100 + step),
                             plain_frame(step + 1)])[None]

        buffer.add_batch(item(odd_stack(0), rows, np.zeros(1)))  # takes both side frames
        before = state_of(buffer)
        with pytest.raises(SideFramesFullError,
                           match=r"frame_stack leaf \[.obs.\]: row 0 .*\(side_frames=2\)"):
            buffer.add_batch(item(odd_stack(1), rows, np.ones(1)))
        assert state_of(buffer) == before and len(buffer) == 1
        added = {(0, 0): odd_stack(0)[0]}
        for step in range(1, 4):  # padded stacks need no side frame
            stack = np.stack([plain_frame(step)] * 3)[None]
            buffer.add_batch(item(stack, rows, np.full(1, step)))
            added[(0, step)] = stack[0]
        check_samples(buffer, added, 32)
        # Once the step owning them is overwritten, its side frames are free again.
        buffer.add_batch(item(odd_stack(4), rows, np.full(1, 4)))
        added[(0, 4)] = odd_stack(4)[0]
        check_samples(buffer, added, 32)


def distinct_stacks(step: int, rows: np.ndarray) -> np.ndarray:
    """Stacks ``[len(rows), 3, H, W]`` of three frames no other step has: two side frames
    each."""
    return np.stack([np.stack([plain_frame(7 * step + 3 * r + 100),
                               plain_frame(7 * step + 3 * r + 101),
                               plain_frame(7 * step + 3 * r + 1)]) for r in rows])


def steps_of(stacks: list[np.ndarray], rows: np.ndarray, first_step: int) -> dict:
    """An extend's items (leaves ``[B, T, ...]``) of ``stacks[t]`` ``[B, K, H, W]``."""
    per_step = [item(s, rows, np.full(len(rows), first_step + t))
                for t, s in enumerate(stacks)]
    return {k: np.stack([p[k] for p in per_step], 1) for k in per_step[0]}


def test_a_call_refused_for_its_side_frames_changes_nothing():
    """An extend whose third step needs side frames its row no longer has free (the two
    steps before it took them) raises naming the leaf, the row and the capacity, and
    leaves every shared array, len() and every sampled stack as before; so does an
    add_batch whose second row's stack does not fit. The rows go on afterwards, and a
    longer extend than the rows hold reuses the side frames of its own overwritten
    steps."""
    rows = np.arange(2)
    with SharedReplayBuffer(spec(3), 2, 4, frame_stack="obs", side_frames=4,
                            seed=5) as buffer:
        added: dict = {}
        for step in range(2):  # padded stacks: no side frames
            stacks = np.stack([np.stack([plain_frame(step + 10 * r)] * 3) for r in rows])
            buffer.add_batch(item(stacks, rows, np.full(2, step)))
            added.update({(int(r), step): stacks[r] for r in rows})
        before = state_of(buffer)
        with pytest.raises(SideFramesFullError, match=r"extend: frame_stack leaf \[.obs.\]: "
                           r"row 0 .*\(side_frames=4\) at step 4.*nothing of this call"):
            buffer.extend(steps_of([distinct_stacks(s, rows) for s in (2, 3, 4)], rows, 2))
        assert state_of(buffer) == before and len(buffer) == 4
        check_samples(buffer, added, 64)
        buffer.extend(steps_of([distinct_stacks(s, rows) for s in (2, 3)], rows, 2))
        added.update({(int(r), s): distinct_stacks(s, rows)[r] for s in (2, 3) for r in rows})
        assert len(buffer) == 8
        check_samples(buffer, added, 64)
        before = state_of(buffer)
        mixed = np.stack([np.stack([plain_frame(40)] * 3), distinct_stacks(4, rows)[1]])
        with pytest.raises(SideFramesFullError, match=r"add_batch: .* row 1 .*side_frames=4"):
            buffer.add_batch(item(mixed, rows, np.full(2, 4)))
        assert state_of(buffer) == before and len(buffer) == 8
        check_samples(buffer, added, 64)
    with SharedReplayBuffer(spec(3), 2, 2, frame_stack="obs", side_frames=4,
                            seed=6) as short:
        stacks = [distinct_stacks(s, rows) for s in range(7)]
        short.extend(steps_of(stacks, rows, 0))
        check_samples(short, {(int(r), s): stacks[s][r] for s in (5, 6) for r in rows}, 64)


def test_an_insert_refused_for_its_side_frames_leaves_the_largest_insert_as_it_was():
    """The rate limiter refuses a held-back sample that could never go ahead beside
    inserts as large as the largest seen. An extend of 16 steps admitted, then refused
    for its side frames, was never inserted: a later held-back sample of 8 items (which
    16-item inserts would make wait forever in a window of 20) is held back, not refused,
    and goes once inserts make room. One that went through does count."""
    limiter = rb.RateLimiter(1.0, 1, 0.0, 20.0)  # window [0, 20], a sample per insert
    rows = np.zeros(1)
    with SharedReplayBuffer(spec(3), 1, 32, frame_stack="obs", side_frames=2,
                            rate_limiter=limiter) as buffer:
        buffer.add_batch(item(np.stack([plain_frame(0)] * 3)[None], rows, np.zeros(1)))
        with pytest.raises(SideFramesFullError):
            buffer.extend(steps_of([distinct_stacks(s, rows) for s in range(1, 17)], rows, 1))
        assert buffer.stats().inserts == 1 and len(buffer) == 1
        assert buffer.get_next(8, block=False) is None  # held back (not "wait forever")
        for step in range(1, 8):  # padded stacks: no side frames
            buffer.add_batch(item(np.stack([plain_frame(step)] * 3)[None], rows,
                                  np.full(1, step)))
        batch, _ = buffer.get_next(8, block=False)
        assert set(batch["step"].tolist()) <= set(range(8))
        assert buffer.stats().samples == 8
        # 13 steps in one extend that goes through: now a sample of 8 cannot ever go
        # ahead beside it (8 + 13 > 20), and is refused as such once held back.
        buffer.extend(steps_of([np.stack([plain_frame(s)] * 3)[None] for s in range(8, 21)],
                               rows, 8))
        assert buffer.get_next(12, block=False) is not None  # diff 21 - 20: 8 more wait
        with pytest.raises(ValueError, match="a sample of 8 items needs a window of 21.0 "
                                             "beside inserts of 13.*wait forever"):
            buffer.get_next(8, block=False)


@pytest.mark.parametrize("length", [1, 3, 5])
def test_side_frames_are_reused_exactly_when_their_step_is_overwritten(length):
    """Every stack has two frames nothing matches, so a row holds ``2 * length`` side
    frames at the moment a step is written: with exactly that many, no step is refused
    (a slot is free once its owner is overwritten) and no stack held is wrong (no slot
    is reused before); with one fewer, step ``length - 1`` is refused."""
    rows = np.arange(2)
    with SharedReplayBuffer(spec(3), 2, length, frame_stack="obs", side_frames=2 * length,
                            seed=9) as buffer:
        added: dict = {}
        for step in range(4 * length + 3):
            stacks = distinct_stacks(step, rows)
            buffer.add_batch(item(stacks, rows, np.full(2, step)))
            added.update({(int(r), step): stacks[r] for r in rows})
            check_samples(buffer, added, 8 * length)
    with SharedReplayBuffer(spec(3), 2, length, frame_stack="obs",
                            side_frames=2 * length - 1) if length > 1 else \
            SharedReplayBuffer(spec(3), 2, 2, frame_stack="obs", side_frames=3) as short:
        for step in range(short.max_length - 1):
            short.add_batch(item(distinct_stacks(step, rows), rows, np.full(2, step)))
        with pytest.raises(SideFramesFullError):
            short.add_batch(item(distinct_stacks(9, rows), rows, np.full(2, 9)))


@pytest.mark.parametrize("keywords,error,match", [
    ({"frame_stack": "image"}, SpecError, r"frame_stack='image' names no top-level leaf"),
    ({"frame_stack": "obs", "stack_axis": 3}, SpecError, r"stack axis within its shape"),
    ({"frame_stack": "row"}, SpecError, r"stack axis within its shape \(\)"),
    ({"frame_stack": "obs", "side_frames": 0}, ValueError, r"side_frames must be a positive"),
])
def test_bad_frame_configurations_are_refused_before_a_directory_is_made(
        tmp_path, keywords, error, match):
    with pytest.raises(error, match=match):
        SharedReplayBuffer(spec(3), 1, 4, path=tmp_path / "buffer", **keywords)
    assert not (tmp_path / "buffer").exists()


def test_an_attach_with_another_frame_configuration_is_refused():
    """The frame configuration is in the shared files; a handle that disagrees (here a
    stack axis that gives frames of the same shape) is refused, naming both."""
    square = {"obs": rb.ArraySpec((3, 3, 3), np.uint8)}
    with SharedReplayBuffer(square, 1, 4, frame_stack="obs") as buffer:
        config, episodes = buffer.__getstate__()
        import dataclasses
        other = dataclasses.replace(config, frames=dataclasses.replace(config.frames,
                                                                       stack_axis=2))
        attached = SharedReplayBuffer.__new__(SharedReplayBuffer)
        with pytest.raises(CheckpointError, match=r"made for .* stack_axis=0.*stack_axis=2"):
            attached.__setstate__((other, episodes))


# ------------------------------------------------------------ parity
def test_clear_forgets_every_stack_and_writing_goes_on():
    with SharedReplayBuffer(spec(3), 2, 5, frame_stack="obs", seed=4) as buffer:
        _write_episodes(buffer, 2, 7, 0)
        buffer.clear()
        assert len(buffer) == 0
        with pytest.raises(rb.EmptyBufferError):
            buffer.get_next(1)
        rows = np.arange(2)
        for step in range(7, 10):
            buffer.add_batch(item(np.stack([named_stack(r, step) for r in rows]), rows,
                                  np.full(2, step)))
        assert len(buffer) == 6
        check_named(buffer.get_next(64)[0])


def test_prioritized_reads_rebuild_stacks_and_updates_apply():
    with SharedReplayBuffer(spec(3), 2, 5, frame_stack="obs", prioritized=True,
                            seed=5) as buffer:
        _write_episodes(buffer, 2, 4, 0)
        rows, steps = np.arange(2), np.arange(4, 9)  # extend: step by step with frames
        buffer.extend({"obs": np.stack([np.stack([named_stack(r, s) for s in steps])
                                        for r in rows]),
                       "row": np.repeat(rows[:, None], 5, 1),
                       "step": np.repeat(steps[None], 2, 0)})
        batch, info = buffer.get_next(64)
        check_named(batch)
        assert buffer.update_priorities(info.ids, np.full(64, 2.0)) == 64
        check_named(buffer.get_next(64)[0])


def test_a_queue_reads_each_stack_once_oldest_first():
    with SharedReplayBuffer(spec(3), 1, 6, frame_stack="obs",
                            rate_limiter=Queue(6)) as buffer:
        _write_episodes(buffer, 1, 6, 0)
        batch, _ = buffer.get_next(6)
        np.testing.assert_array_equal(batch["step"], np.arange(6))
        check_named(batch)


def test_within_episode_windows_rebuild_stacks():
    episode_spec = {**spec(3), "step_type": rb.ArraySpec((), np.int32)}
    with SharedReplayBuffer(episode_spec, 1, 12, frame_stack="obs", track_episodes=True,
                            seed=6) as buffer:
        for step in range(12):
            batch = item(named_stack(0, step)[None], np.zeros(1), np.full(1, step))
            buffer.add_batch({**batch, "step_type": np.full(1, 0 if step % 5 == 0 else 1,
                                                             np.int32)})
        windows, _ = buffer.get_next(32, num_steps=3, within_episodes=True)
        for t in range(3):
            check_named({k: v[:, t] for k, v in windows.items()})
        assert ((windows["step"][:, 0] // 5) == (windows["step"][:, 2] // 5)).all()


# ------------------------------------------------------------ checkpoints
def local_stacks(buffer: rb.UniformReplayBuffer) -> dict[tuple[int, int], bytes]:
    """A local buffer's stacks by the (row, step) leaves they were added with."""
    everything = buffer.gather_all()
    return {(int(r), int(s)): o.tobytes() for o, r, s in
            zip(everything["obs"].reshape((-1,) + everything["obs"].shape[2:]),
                everything["row"].reshape(-1), everything["step"].reshape(-1))}


@pytest.mark.parametrize("axis", [0, -1])
def test_a_checkpoint_goes_to_a_local_buffer_with_frame_stack_and_back(tmp_path, axis):
    """A shared save restores into a UniformReplayBuffer(frame_stack=...) whose stacks are
    those added; its save restores into a new shared buffer, and that one's save again,
    every stack byte-identical; writers go on after the restore."""
    model = StackModel(3, np.random.default_rng(7))
    kinds = ["zero", "slide", "slide", "random", "slide", "reset", "slide", "slide", "slide"]
    with SharedReplayBuffer(spec(3, axis), 2, 6, frame_stack="obs", stack_axis=axis,
                            seed=7) as shared:
        rows = np.arange(2)
        for step, kind in enumerate(kinds):
            shared.add_batch(item(np.stack([model.stack(r, step, kind) for r in rows]),
                                  rows, np.full(2, step), axis))
        shared.save(tmp_path / "shared")
    local = rb.load(tmp_path / "shared")
    assert isinstance(local, rb.UniformReplayBuffer) and len(local) == 12
    expected = {(r, s): model.added[(r, s)] for r in range(2) for s in range(3, 9)}
    got = local_stacks(local)
    assert {k: (v if axis == 0 else None) for k, v in got.items()}.keys() == expected.keys()
    if axis == 0:
        assert got == {k: v.tobytes() for k, v in expected.items()}
    local.save(tmp_path / "local")
    with SharedReplayBuffer.load(tmp_path / "local") as again:
        assert again.data_spec == shared.data_spec and len(again) == 12
        check_samples(again, model.added, 64, axis, ids_name=False)
        again.save(tmp_path / "again")
        for step, kind in enumerate(["slide", "slide"], start=9):  # writers go on
            again.add_batch(item(np.stack([model.stack(r, step, kind) for r in rows]),
                                 rows, np.full(2, step), axis))
        check_samples(again, model.added, 64, axis, ids_name=False)
    with SharedReplayBuffer.load(tmp_path / "again") as third:
        check_samples(third, model.added, 64, axis, ids_name=False)


def test_a_restore_needing_more_side_frames_than_the_buffer_has_is_refused(tmp_path):
    """Stacks of three distinct frames take two side frames each: six of them need 12."""
    local = rb.UniformReplayBuffer(spec(3), 1, 6, frame_stack="obs")
    added = {}
    for step in range(6):
        added[(0, step)] = np.stack([plain_frame(200 + step), plain_frame(100 + step),
                                     plain_frame(step + 1)])
        local.add_batch(item(added[(0, step)][None], np.zeros(1), np.full(1, step)))
    local.save(tmp_path / "local")
    with pytest.raises(SideFramesFullError, match=r"^load: .*side_frames=11.*the load is "
                                                  r"refused$"):
        SharedReplayBuffer.load(tmp_path / "local", side_frames=11)
    with SharedReplayBuffer.load(tmp_path / "local", side_frames=12) as shared:
        check_samples(shared, added, 64, ids_name=False)


def test_a_buffer_of_long_stacks_loads_its_own_checkpoint_with_the_default_side_frames(
        tmp_path):
    """Restored rows' oldest steps reference frames from before them, which come back
    as side frames (7 + 6 + ... + 1 for stacks of 8): the load's default makes room."""
    K = 8
    stacked = {"obs": rb.ArraySpec((K, 2, 2), np.uint8), "x": rb.ArraySpec((), np.int64)}
    frames = [np.full((2, 2), v, np.uint8) for v in range(64)]
    with SharedReplayBuffer(stacked, 1, 10, frame_stack="obs", side_frames=16) as buffer:
        seen = [frames[1]] * K  # an episode start padded by repetition, then sliding
        added = []
        for t in range(30):
            seen = seen[1:] + [frames[2 + t]]
            added.append(np.stack(seen))
            buffer.add_batch({"obs": added[-1][None], "x": np.array([t])})
        buffer.save(tmp_path)
    with SharedReplayBuffer.load(tmp_path) as back:
        assert len(back) == 10
        items, _ = back.get_next(32)
        for obs, x in zip(items["obs"], items["x"]):
            np.testing.assert_array_equal(obs, added[int(x)])
