"""Fault scenarios of the soak and the invariants checked after each.

Each scenario starts child processes running :mod:`soak.workloads`, ends them with a
fault (``SIGKILL`` at a random moment, or a crash point from
:data:`replaybuffer.crash_points.POINTS` armed with ``REPLAYBUFFER_CRASH_AT=NAME:N``)
and then checks, in this process, what survived:

* shared buffer (uniform and prioritized, with frame dedup or without): no torn item
  (every sampled step, and stack of frames, holds the one write its row and step
  name), every committed step drawable and nothing else,
  ``len()`` equal to what can be drawn; prioritized: every interior node of the sum
  tree the sum of its children, every drawable step a positive leaf, each sample's
  probability its leaf over the total, every position being rewritten (an odd
  version) a zero leaf after a draw; with prioritized ``extend`` blocks killed
  mid-block (``shared_block_kill``), the steps a killed block tore are a run at each
  row's oldest end, and a sampler drawing through the kills never gets a torn item;
* checkpoint series: ``load`` gives the newest complete checkpoint (the last one the
  saver reported, or the one after it), whole and consistent, and the next save in
  another process removes what the dead one left;
* mmap buffer: ``reopen`` gives every step committed before the fault, whole.

Crash points are dispatched by the prefix of their name (:data:`CRASH_WORKLOADS`): a
point with a prefix no workload serves fails the soak, so a new point cannot go
untested.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from soak import frame_workloads, ray_workloads, workloads

WORKLOADS_SCRIPT = str(Path(workloads.__file__))
FRAME_WORKLOADS_SCRIPT = str(Path(frame_workloads.__file__))


@dataclass
class Tally:
    """What a soak did: scenarios run (by name), faults injected, invariant checks
    made, and the failures (each a message saying what broke, with the scenario)."""

    scenarios: Counter = field(default_factory=Counter)
    faults: Counter = field(default_factory=Counter)
    checks: int = 0
    failures: list[str] = field(default_factory=list)
    scenario: str = ""

    def check(self, ok: Any, message: str) -> bool:
        self.checks += 1
        if not ok:
            self.failures.append(f"{self.scenario}: {message}")
        return bool(ok)

    def summary(self) -> dict[str, Any]:
        return {"scenarios": dict(self.scenarios), "scenarios_run": sum(self.scenarios.values()),
                "faults": dict(self.faults), "faults_injected": sum(self.faults.values()),
                "invariant_checks": self.checks, "failures": self.failures}


class Child:
    """A workload in a process of its own, its stdout lines collected as they come."""

    def __init__(self, name: str, args: dict[str, Any], crash_at: str | None = None,
                 script: str = WORKLOADS_SCRIPT):
        env = dict(os.environ)
        env.pop("REPLAYBUFFER_CRASH_AT", None)
        if crash_at is not None:
            env["REPLAYBUFFER_CRASH_AT"] = crash_at
        self.process = subprocess.Popen(
            [sys.executable, script, name, json.dumps(args)], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.strip())
            if line.startswith("ready"):
                self._ready.set()
        self._ready.set()  # ended: nobody waits for a ready that cannot come

    def wait_ready(self, timeout: float = 120) -> bool:
        return self._ready.wait(timeout) and "ready" in self.lines

    def kill(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)

    def wait(self, timeout: float = 120) -> int:
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.process.wait(30)
        self._reader.join(30)
        return code

    def ended(self) -> str:
        """How the child ended: its exit status and the end of its stderr (waits for it)."""
        code = self.wait()
        assert self.process.stderr is not None
        return f"exit {code}, stderr: {self.process.stderr.read()[-1500:]}"

    def last(self, word: str) -> int | None:
        """The number on the last ``word N`` line, or None."""
        values = [int(line.split()[1]) for line in self.lines if line.startswith(word + " ")]
        return values[-1] if values else None


# ------------------------------------------------------------------ shared buffer
def make_shared(prioritized: bool, seed: int, rows: int = 4, length: int = 16) -> Any:
    from replaybuffer.distributed import SharedReplayBuffer
    return SharedReplayBuffer(workloads.shared_spec(), rows, length,
                              prioritized=prioritized, seed=seed)


def handle_file(buffer: Any, tmp: Path) -> str:
    path = tmp / "handle.pkl"
    path.write_bytes(pickle.dumps(buffer))
    return str(path)


def check_shared(buffer: Any, tally: Tally, draws: int = 48, blocks: bool = False) -> None:
    """The shared buffer's invariants (module docstring), no process writing. ``blocks``:
    a killed writer may have left a run of steps torn (a prioritized ``extend`` block's,
    odd versions from its rows' heads): the committed steps are then those whose version
    names them, and each row's others a run at its window's oldest end."""
    rows_total, length = buffer.num_rows, buffer.max_length
    heads = buffer.steps_written()
    if heads.max() == 0:
        tally.check(len(buffer) == 0, f"len {len(buffer)} with nothing written")
        return
    buffer.get_next(1)  # one lock holder first: it repairs what a dead process left
    drawn: set[tuple[int, int]] = set()
    prioritized = buffer.layout.prioritized
    tree = buffer.layout.tree.copy() if prioritized else None
    bad_probability = torn = outside = 0
    for _ in range(draws):
        items, info = buffer.get_next(256)
        ids = np.asarray(info.ids)
        rows, steps = ids % rows_total, ids // rows_total
        want = steps.astype(np.float32) + rows.astype(np.float32) / 8
        torn += int(((items["payload"] != want[:, None]).any(1) | (items["row"] != rows)
                     | (items["step"] != steps)).sum())
        outside += int(((steps >= heads[rows]) | (steps < heads[rows] - length)).sum())
        drawn.update(zip(rows.tolist(), steps.tolist()))
        if tree is not None:
            positions = (steps % length) * rows_total + rows
            leaves = tree[len(tree) // 2 + positions]
            expected = leaves / tree[1]
            bad_probability += int((~np.isclose(np.asarray(info.probabilities), expected,
                                                rtol=1e-4, atol=0)).sum())
    tally.check(torn == 0, f"{torn} sampled items torn (bytes of two writes)")
    tally.check(outside == 0, f"{outside} sampled items outside their row's window")
    certain = {(r, s) for r in range(rows_total)
               for s in range(max(0, int(heads[r]) - length + 1), int(heads[r]))}
    if blocks:
        version = buffer.layout.version
        whole = {(r, s) for r, s in certain
                 if version[(s % length) * rows_total + r] == 2 * s + 2}
        for r in range(rows_total):  # a row's torn steps: its oldest ones, in a run
            lost = sorted(s for q, s in certain - whole if q == r)
            tally.check(lost == list(range(int(heads[r]) - length + 1,
                                           int(heads[r]) - length + 1 + len(lost))),
                        f"row {r}: steps {lost[:6]} torn, not a run at the oldest end "
                        f"(head {int(heads[r])})")
        certain = whole
    missing = certain - drawn
    tally.check(not missing, f"{len(missing)} committed steps never drawn in "
                             f"{draws * 256} draws, e.g. {sorted(missing)[:4]}")
    tally.check(len(buffer) == len(drawn), f"len() is {len(buffer)}, {len(drawn)} steps "
                                           "can be drawn")
    if tree is not None:
        half = len(tree) // 2
        interior = np.arange(1, half)
        sums = tree[2 * interior] + tree[2 * interior + 1]
        wrong = ~np.isclose(tree[interior], sums, rtol=1e-9, atol=1e-12)
        tally.check(not wrong.any(), f"{int(wrong.sum())} sum-tree nodes are not the sum "
                                     f"of their children (root {tree[1]}, leaves sum "
                                     f"{tree[half:].sum()})")
        held = np.array([(s % length) * rows_total + r for r, s in drawn], np.int64)
        tally.check((tree[half + held] > 0).all(), "a drawable step has priority 0")
        # A position being rewritten (odd version: a step marked, or a killed writer's
        # run) is hidden by the draw before it: its leaf 0, out of the total.
        odd = np.flatnonzero(buffer.layout.version % 2 == 1)
        tally.check((tree[half + odd] == 0).all(),
                    f"{int((tree[half + odd] != 0).sum())} of {len(odd)} positions being "
                    "rewritten (odd versions) keep a positive leaf after a draw")
        tally.check(bad_probability == 0, f"{bad_probability} sample probabilities are "
                                          "not their leaf over the total")


def kill_in_random_order(rng: np.random.Generator, children: list[Child]) -> None:
    """SIGKILL ``children`` after a random moment (up to 30 ms), in a random order,
    a few milliseconds apart."""
    time.sleep(float(rng.uniform(0, 0.03)))
    for child in rng.permutation(len(children)):
        children[child].kill()
        time.sleep(float(rng.uniform(0, 0.005)))


def shared_kill(rng: np.random.Generator, tmp: Path, tally: Tally) -> None:
    """Writers (and, prioritized, a sampler setting priorities) SIGKILLed at random."""
    prioritized = bool(rng.integers(2))
    tally.scenario = f"shared_kill(prioritized={prioritized})"
    with make_shared(prioritized, int(rng.integers(2**31))) as buffer:
        handle = handle_file(buffer, tmp)
        children = [Child("shared_writer", {"handle": handle, "rows": 2,
                                            "ready_after": int(rng.integers(0, 40))})
                    for _ in range(2)]
        if prioritized:
            for child in children:
                child.wait_ready()
            children.append(Child("shared_sampler", {"handle": handle, "prioritized": True,
                                                     "seed": int(rng.integers(2**31))}))
        for child in children:
            if not child.wait_ready():
                tally.check(False, f"a child never got ready: {child.ended()}")
        kill_in_random_order(rng, children)
        for child in children:
            tally.check(child.wait() == -signal.SIGKILL, "a child ended before its kill")
            tally.faults["sigkill_shared"] += 1
        check_shared(buffer, tally)


def shared_block_kill(rng: np.random.Generator, tmp: Path, tally: Tally) -> None:
    """Writers of prioritized ``extend`` blocks SIGKILLed at random (mid-block: a run of
    odd versions from their rows' heads) while a sampler draws, checks each item and
    sets priorities; the sampler draws on after the kills, then is killed too."""
    tally.scenario = "shared_block_kill"
    with make_shared(True, int(rng.integers(2**31))) as buffer:
        handle = handle_file(buffer, tmp)
        writers = [Child("shared_block_writer",
                         {"handle": handle, "rows": 2, "seed": int(rng.integers(2**31)),
                          "ready_after": int(rng.integers(1, 6))}) for _ in range(2)]
        for child in writers:
            if not child.wait_ready():
                tally.check(False, f"a block writer never got ready: {child.ended()}")
        sampler = Child("shared_checking_sampler",
                        {"handle": handle, "seed": int(rng.integers(2**31))})
        if not sampler.wait_ready():
            tally.check(False, f"the sampler never got ready: {sampler.ended()}")
        kill_in_random_order(rng, writers)
        time.sleep(0.05)  # the sampler draws over what the kills left
        sampler.kill()
        for child in writers + [sampler]:
            tally.check(child.wait() == -signal.SIGKILL, "a child ended before its kill")
            tally.faults["sigkill_shared_block"] += 1
        torn = [line for line in sampler.lines if line.startswith("torn")]
        tally.check(not torn, f"the sampler drew torn items while blocks were written: "
                              f"{torn[:3]}")
        check_shared(buffer, tally, blocks=True)


def check_shared_reads(buffer: Any, tally: Tally, draws: int = 16) -> None:
    """After a clear or a save was cut short: ``len()`` equals what can be drawn (0: a
    read is refused as empty), and nothing drawn is torn or below its row's floor."""
    from replaybuffer.errors import EmptyBufferError
    rows_total = buffer.num_rows
    held = len(buffer)
    if held == 0:
        try:
            buffer.get_next(1)
        except EmptyBufferError:
            tally.check(True, "")
        else:
            tally.check(False, "len() is 0 but a read returned a step")
        return
    drawn: set[tuple[int, int]] = set()
    torn = 0
    for _ in range(draws):
        items, info = buffer.get_next(256)
        ids = np.asarray(info.ids)
        rows, steps = ids % rows_total, ids // rows_total
        want = steps.astype(np.float32) + rows.astype(np.float32) / 8
        torn += int(((items["payload"] != want[:, None]).any(1) | (items["row"] != rows)
                     | (items["step"] != steps)).sum())
        drawn.update(zip(rows.tolist(), steps.tolist()))
    tally.check(torn == 0, f"{torn} sampled items torn after a cut-short clear or save")
    tally.check(held == len(drawn), f"len() is {held}, {len(drawn)} steps can be drawn")


def shared_clear_save_crash(name: str, count: int, rng: np.random.Generator, tmp: Path,
                            tally: Tally) -> None:
    """A child adding, saving and clearing, ended at ``name``: the buffer reads
    consistently, the series loads its newest complete checkpoint, and a new writer
    goes on."""
    import replaybuffer as rb
    from replaybuffer.persist.series import checkpoints
    root = tmp / f"shared-series-{int(rng.integers(2**31))}"
    with make_shared(bool(rng.integers(2)), int(rng.integers(2**31))) as buffer:
        handle = handle_file(buffer, tmp)
        child = Child("shared_clear_save", {"handle": handle, "rows": 2, "units": 20,
                                             "root": str(root)}, crash_at=f"{name}:{count}")
        expect_crash(child, name, tally)
        check_shared_reads(buffer, tally)
        if checkpoints(root):
            try:
                rb.load(root)
                tally.check(True, "")
            except Exception as exc:  # noqa: BLE001 - any failure to load is reported
                tally.check(False, f"load after {name} failed: {type(exc).__name__}: {exc}")
        after = Child("shared_everything", {"handle": handle, "rows": 2, "units": 1,
                                            "prioritized": buffer.layout.prioritized,
                                            "seed": 3})
        tally.check(after.wait() == 0, f"a writer after {name} failed: {after.ended()}")
        check_shared_reads(buffer, tally)


def check_frames(buffer: Any, tally: Tally, draws: int = 16) -> None:
    """A frame-dedup buffer's stacks: every sampled ``obs`` is the stack its row and
    step name (:func:`frame_workloads.stack`), none torn."""
    rows_total = buffer.num_rows
    torn = 0
    for _ in range(draws):
        items, info = buffer.get_next(64)
        ids = np.asarray(info.ids)
        expected = np.stack([frame_workloads.stack(int(i % rows_total), int(i // rows_total))
                             for i in ids])
        torn += int((items["obs"] != expected).any((1, 2)).sum())
    tally.check(torn == 0, f"{torn} sampled frame stacks torn (frames of another step)")


def shared_frames_crash(name: str, count: int, rng: np.random.Generator, tmp: Path,
                        tally: Tally, prioritized: bool) -> None:
    """:func:`shared_crash` on a frame-dedup buffer (:mod:`soak.frame_workloads`): the
    shared invariants, no torn stack, and a new writer goes on."""
    from replaybuffer.distributed import SharedReplayBuffer
    tally.scenario = f"crash_point({name}:{count}, frames)"
    with SharedReplayBuffer(frame_workloads.frames_spec(), 4, 16, prioritized=prioritized,
                            seed=int(rng.integers(2**31)), frame_stack="obs",
                            side_frames=4) as buffer:
        handle = handle_file(buffer, tmp)
        first = Child("shared_frames", {"handle": handle, "rows": 2, "units": 8,
                                        "prioritized": prioritized, "seed": 1},
                      script=FRAME_WORKLOADS_SCRIPT)
        if first.wait() != 0:
            tally.check(False, f"the first frames writer failed: {first.ended()}")
        child = Child("shared_frames", {"handle": handle, "rows": 2, "units": 200,
                                        "prioritized": prioritized,
                                        "seed": int(rng.integers(2**31))},
                      crash_at=f"{name}:{count}", script=FRAME_WORKLOADS_SCRIPT)
        expect_crash(child, name, tally)
        check_shared(buffer, tally)
        check_frames(buffer, tally)
        after = Child("shared_frames", {"handle": handle, "rows": 2, "units": 3,
                                        "prioritized": prioritized, "seed": 2},
                      script=FRAME_WORKLOADS_SCRIPT)
        tally.check(after.wait() == 0, f"a frames writer after {name} failed: "
                                       f"{after.ended()}")
        check_frames(buffer, tally)


def shared_crash(name: str, count: int, rng: np.random.Generator, tmp: Path,
                 tally: Tally) -> None:
    if name.startswith(("shared.clear.", "shared.save.")):
        shared_clear_save_crash(name, count, rng, tmp, tally)
        return
    prioritized = "priorit" in name or bool(rng.integers(2))
    # The frame write is reached on a frame-dedup buffer only; the other write, claim
    # and priority points are passed there too, so they take it one time in three.
    if name == "shared.write.frames" or rng.integers(3) == 0:
        shared_frames_crash(name, count, rng, tmp, tally, prioritized)
        return
    with make_shared(prioritized, int(rng.integers(2**31))) as buffer:
        handle = handle_file(buffer, tmp)
        first = Child("shared_everything", {"handle": handle, "rows": 2, "units": 8,
                                            "prioritized": prioritized, "seed": 1})
        if first.wait() != 0:
            tally.check(False, f"the first writer failed: {first.ended()}")
        child = Child("shared_everything", {"handle": handle, "rows": 2, "units": 200,
                                            "prioritized": prioritized,
                                            "seed": int(rng.integers(2**31))},
                      crash_at=f"{name}:{count}")
        expect_crash(child, name, tally)
        check_shared(buffer, tally)


def expect_crash(child: Child, name: str, tally: Tally) -> None:
    from replaybuffer.crash_points import CRASH_EXIT_CODE
    code = child.wait()
    if code == CRASH_EXIT_CODE:
        tally.check(True, "")
        tally.faults["crash_point"] += 1
    else:
        tally.check(False, f"crash point {name} did not end its child (a workload that never "
                           f"reaches it leaves it untested): {child.ended()}")


# ------------------------------------------------------------------ checkpoints
def check_series(root: Path, saved: int | None, batch: int, tally: Tally,
                 keep: int) -> None:
    """``load`` gives the newest complete checkpoint: the last reported or the next."""
    import replaybuffer as rb
    from replaybuffer.persist.series import checkpoints
    if saved is None and not checkpoints(root):
        return  # killed before its first save published: nothing to load
    try:
        buffer = rb.load(root)
    except Exception as exc:  # noqa: BLE001 - any failure to load is what the soak reports
        tally.check(False, f"load failed after {saved} was saved: {type(exc).__name__}: {exc}")
        return
    low = -1 if saved is None else saved
    tally.check(low <= buffer.last_id <= low + 1,
                f"load gave last_id {buffer.last_id}; the saver had reported {saved}")
    check_local(buffer, tally)
    buffer.add_batch(workloads.local_item(buffer.last_id + 1, batch))
    buffer.save(root, keep=keep)  # another process's save: it clears what the dead left
    left = [p.name for p in root.iterdir() if not p.name.startswith("ckpt-")]
    tally.check(not left, f"a dead saver's directories outlived the next save: {left}")
    tally.check(len(checkpoints(root)) <= keep, f"{len(checkpoints(root))} checkpoints "
                                                f"after a save with keep={keep}")
    tally.check(rb.load(root).last_id == buffer.last_id, "the next save is not the newest")


def check_local(buffer: Any, tally: Tally) -> None:
    """Each row of a local buffer holds consecutive whole steps ending at ``last_id``."""
    everything = buffer.gather_all()
    batch, n = everything["t"].shape
    steps = np.arange(buffer.last_id - n + 1, buffer.last_id + 1)
    rows = np.arange(batch)[:, None]
    payload = (steps[None, :] + rows / 8).astype(np.float32)
    whole = ((everything["t"] == steps[None, :]) & (everything["row"] == rows)
             & (everything["payload"] == payload[..., None]).all(-1))
    tally.check(whole.all(), f"{int((~whole).sum())} of {whole.size} held steps are not "
                             f"what was written (last_id {buffer.last_id})")


def save_kill(rng: np.random.Generator, tmp: Path, tally: Tally) -> None:
    """A process saving into a series SIGKILLed at a random moment."""
    keep = int(rng.integers(1, 4))
    tally.scenario = f"save_kill(keep={keep})"
    root = tmp / "series"
    child = Child("saver", {"root": str(root), "batch": 2, "length": 8, "keep": keep,
                            "units": 10**6})
    if not child.wait_ready():
        tally.check(False, f"the saver never got ready: {child.ended()}")
    time.sleep(float(rng.uniform(0, 0.4)))
    child.kill()
    tally.check(child.wait() == -signal.SIGKILL, "the saver ended before its kill")
    tally.faults["sigkill_save"] += 1
    check_series(root, child.last("saved"), 2, tally, keep)


def save_crash(name: str, count: int, rng: np.random.Generator, tmp: Path,
               tally: Tally) -> None:
    keep = int(rng.integers(1, 4))
    root = tmp / "series"
    child = Child("saver", {"root": str(root), "batch": 2, "length": 8, "keep": keep,
                            "units": 50}, crash_at=f"{name}:{count}")
    expect_crash(child, name, tally)
    check_series(root, child.last("saved"), 2, tally, keep)


# ------------------------------------------------------------------ mmap
MMAP_LENGTH = 12
def check_mmap(path: Path, committed: int | None, tally: Tally) -> None:
    import replaybuffer as rb
    if committed is None and not (path / "data").exists():
        return
    try:
        buffer = rb.reopen(path)
    except Exception as exc:  # noqa: BLE001 - any failure to reopen is what the soak reports
        tally.check(False, f"reopen failed after {committed} was committed: "
                           f"{type(exc).__name__}: {exc}")
        return
    low = -1 if committed is None else committed
    tally.check(low <= buffer.last_id <= low + MMAP_LENGTH,  # an extend's steps, at most
                f"reopen gave last_id {buffer.last_id}; {committed} had been committed")
    check_local(buffer, tally)
    buffer.close()


def mmap_kill(rng: np.random.Generator, tmp: Path, tally: Tally) -> None:
    """An mmap writer SIGKILLed at a random moment, twice: made, then reopened."""
    tally.scenario = "mmap_kill"
    path = tmp / "mmap"
    for _ in range(2):
        child = Child("mmap_writer", {"path": str(path), "batch": 2, "length": MMAP_LENGTH,
                                      "units": 10**6, "grow_every": int(rng.integers(2, 6))})
        if not child.wait_ready():
            tally.check(False, f"the mmap writer never got ready: {child.ended()}")
        time.sleep(float(rng.uniform(0, 0.2)))
        child.kill()
        tally.check(child.wait() == -signal.SIGKILL, "the mmap writer ended before its kill")
        tally.faults["sigkill_mmap"] += 1
        check_mmap(path, child.last("committed"), tally)


def mmap_crash(name: str, count: int, rng: np.random.Generator, tmp: Path,
               tally: Tally) -> None:
    path = tmp / "mmap"
    child = Child("mmap_writer", {"path": str(path), "batch": 2, "length": MMAP_LENGTH, "units": 200,
                                  "grow_every": int(rng.integers(2, 6))},
                  crash_at=f"{name}:{count}")
    expect_crash(child, name, tally)
    check_mmap(path, child.last("committed"), tally)


# ------------------------------------------------------------------ Ray shards
def ray_kill(rng: np.random.Generator, tmp: Path, tally: Tally) -> None:
    """A Ray shard's process SIGKILLed while collectors write and a learner samples
    (:mod:`soak.ray_workloads`)."""
    ray_workloads.ray_fault(rng, tmp, tally)


def ray_crash(name: str, count: int, rng: np.random.Generator, tmp: Path,
              tally: Tally) -> None:
    ray_workloads.ray_fault(rng, tmp, tally, name, count)


# ------------------------------------------------------------------ crash points
CRASH_WORKLOADS: dict[str, Callable[[str, int, np.random.Generator, Path, Tally], None]] = {
    "mmap": mmap_crash, "shared": shared_crash, "checkpoint": save_crash,
    "persist": save_crash, "ray": ray_crash}
"""The scenario that serves each crash-point prefix (the name up to its first dot)."""


def crash_workload(name: str) -> Callable[[str, int, np.random.Generator, Path, Tally], None]:
    """The scenario for crash point ``name``.

    Raises:
        KeyError: its prefix has none (a new kind of point needs a workload here).
    """
    prefix = name.split(".", 1)[0]
    if prefix not in CRASH_WORKLOADS:
        raise KeyError(f"crash point {name!r}: no soak workload serves the prefix "
                       f"{prefix!r} (known: {sorted(CRASH_WORKLOADS)}); add one in "
                       "tests/soak/scenarios.py")
    return CRASH_WORKLOADS[prefix]


def crash_point(rng: np.random.Generator, tmp: Path, tally: Tally) -> None:
    """A crash point of those that exist, chosen at random, armed for its N-th pass."""
    from replaybuffer.crash_points import POINTS
    name = str(rng.choice(sorted(POINTS)))
    count = int(rng.integers(1, 4))
    tally.scenario = f"crash_point({name}:{count})"
    try:
        scenario = crash_workload(name)
    except KeyError as exc:
        tally.check(False, str(exc))
        return
    scenario(name, count, rng, tmp, tally)


SCENARIOS: dict[str, Callable[[np.random.Generator, Path, Tally], None]] = {
    "shared_kill": shared_kill, "shared_block_kill": shared_block_kill,
    "save_kill": save_kill, "mmap_kill": mmap_kill,
    "crash_point": crash_point, "ray_kill": ray_kill}
