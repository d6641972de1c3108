"""RayReplayBuffer under faults on a local Ray cluster (num_cpus=2): restarts keep
the rate limiter and report every lost step, writes survive restarts and refused
neighbours, stale ids are ignored by the shard, bad input is refused in the caller
(issue 25 item 4, issue 28 items 12-17)."""

from __future__ import annotations

import functools
import os
import threading
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from ray_cluster import start_local_cluster, kill_and_wait_restarted  # noqa: E402

import replaybuffer as rb  # noqa: E402
from replaybuffer.distributed import RayReplayBuffer  # noqa: E402
from replaybuffer.errors import SpecError  # noqa: E402

SPEC = {"x": rb.ArraySpec((), np.int64)}


def uniform(max_length: int = 1000):
    return rb.UniformReplayBuffer(SPEC, 1, max_length, seed=0)


def prioritized():
    return rb.PrioritizedReplayBuffer(SPEC, 1, 100, alpha=1.0, seed=0)


def limited():
    buffer = rb.UniformReplayBuffer(SPEC, 1, 1000, seed=0)
    buffer.rate_limiter = rb.MinSize(1)
    return buffer


def fifo():
    return rb.FIFOReplayBuffer(SPEC, 1, 10)


def transitions():
    return rb.TransitionReplayBuffer(rb.ArraySpec((2,), np.float32),
                                     rb.ArraySpec((), np.int64), capacity=100, seed=0)


@pytest.fixture(scope="module", autouse=True)
def cluster():
    start_local_cluster()
    yield
    ray.shutdown()


def write(writer, values) -> None:
    for v in values:
        writer.add_batch({"x": np.array([v])})


def test_a_restarted_shard_keeps_its_limiter_counters_and_stats_sum_them(tmp_path):
    with RayReplayBuffer(limited, 2, checkpoint_dir=tmp_path, seed=1) as buffer:
        for i in range(2):
            buffer.extend({"x": np.arange(10)[None]}, shard=i)
        buffer.flush()
        buffer.get_next(8)
        before = buffer.stats()
        assert (before.inserts, before.samples) == (20, 8)
        buffer.checkpoint()
        kill_and_wait_restarted(buffer, 0)
        buffer.wait_for_shards()
        after = buffer.stats()
        assert (after.inserts, after.samples, after.size) == (20, 8, 20)


def test_a_shard_restarted_after_a_clear_keeps_the_limiter_counters_saved_with_it(tmp_path):
    """A clear saves the empty buffer at last_id -1: the counters saved with it must be
    the ones a restart restores, not pruned by the older saves' higher ids."""
    with RayReplayBuffer(limited, 1, checkpoint_dir=tmp_path, seed=4) as buffer:
        for _ in range(3):  # three saves, with counter files at ids 9, 19, 29
            buffer.extend({"x": np.arange(10)[None]}, shard=0)
            buffer.flush()
            buffer.checkpoint()
        buffer.get_next(8)
        buffer.clear()
        before = buffer.stats()
        assert (before.inserts, before.samples, before.size) == (30, 8, 0)
        kill_and_wait_restarted(buffer, 0)
        buffer.wait_for_shards()
        after = buffer.stats()
        assert (after.inserts, after.samples, after.size) == (30, 8, 0)
        buffer.extend({"x": np.arange(5)[None]}, shard=0)  # and the series goes on
        buffer.flush()
        buffer.checkpoint()
        kill_and_wait_restarted(buffer, 0)
        buffer.wait_for_shards()
        again = buffer.stats()
        assert (again.inserts, again.samples, again.size) == (35, 8, 5)


def test_writes_after_a_restart_are_applied_when_flush_returns_and_losses_count(tmp_path):
    """Items 12 and 15: a restart between two calls is recorded; a writer's steps
    count in steps_lost; writes after the restart land before flush returns."""
    with RayReplayBuffer(uniform, 2, checkpoint_dir=tmp_path, checkpoint_every=10,
                         seed=2) as buffer:
        writer = buffer.writer(0, chunk_steps=1)
        write(writer, range(25))  # saved every 10 steps or more (chunks that arrive
        writer.flush()            # out of order are applied, and saved, together)
        kill_and_wait_restarted(buffer, 0)  # the client makes no call meanwhile
        write(writer, range(100, 105))
        writer.flush()
        size = buffer.describe()[0]["size"]  # (its answer reports the restart)
        [loss] = buffer.losses
        restored = loss.restored_last_id + 1
        assert 10 <= restored <= 25
        assert size == restored + 5  # restored + 5 new
        assert (loss.shard, loss.steps_lost) == (0, 25 - restored)


def test_writes_sent_to_a_dying_shard_are_counted_lost():
    with RayReplayBuffer(uniform, 1, seed=3, max_in_flight=64) as buffer:
        writer = buffer.writer(0, chunk_steps=1)
        write(writer, range(40))
        writer.flush()  # 40 steps applied, then lost with the process
        ray.kill(buffer.actors[0], no_restart=False)
        write(writer, range(40, 100))  # some to the dead process, some to the new one
        writer.flush()
        deadline = time.monotonic() + 60
        while (info := buffer.describe()[0]) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        size = info["size"]
        assert len(buffer.losses) == 1
        # Every step sent is either in the shard or counted lost, once: a chunk the dying
        # shard applied but could not acknowledge is counted by the shard's mark, and
        # the writer's report of it is recognised by its number.
        assert buffer.losses[0].steps_lost == 100 - size
        assert writer.steps_dropped <= buffer.losses[0].steps_lost


def test_a_chunk_applied_by_a_dead_shard_process_is_counted_lost_once(tmp_path):
    """The shard's processes as plain objects over one home: the first applies chunks
    0-2 of a writer (chunk 3 never arrives) and dies; the writer, which saw no answer
    for chunks 2 and 3, reports both to the next process. Chunk 2 is counted by the
    mark the first process left; only chunk 3 is added."""
    from replaybuffer.distributed.ray_shards.shard import ShardActor

    def step(v: int):
        return [("add_batch", ({"x": np.array([v])},), {})]

    writer = os.urandom(8).hex()
    first = ShardActor(uniform, 0, str(tmp_path), None)
    for seq in range(3):
        first.write((step(seq), [], writer, seq, seq, None, False))
    second = ShardActor(uniform, 0, str(tmp_path), None)  # a restart: nothing saved
    assert second.steps_lost == 3
    second.write((step(4), [], writer, 4, 4, [(2, 1), (3, 1)], False))
    assert second.steps_lost == 4
    other = os.urandom(8).hex()  # a writer no process applied anything of
    second.write((step(5), [], other, 1, 1, [(0, 2)], False))
    assert second.steps_lost == 6


def test_writes_held_for_a_lost_one_go_before_those_after_the_base_moved():
    """Write 1 is lost with a shard process; write 2 reached the next process first
    (held for 1); once the writer's base moves past 1, write 2 is applied before 3,
    never after it (the later of two priority updates of an id must win)."""
    from replaybuffer.distributed.ray_shards.ordering import WriteOrder

    order: WriteOrder[str] = WriteOrder()
    assert order.arrive("w", 2, 1, "two") == []  # held: 1 may still come
    assert order.arrive("w", 3, 3, "three") == ["two", "three"]
    assert order.arrive("w", 4, 3, "four") == ["four"] and order.waiting("w") == 0
    assert order.arrive("v", 5, 1, "five") == []
    assert order.arrive("v", 0, 6, "late") == ["five", "late"]  # a late one, after


class _DyingShard:
    def write(self, *args):
        os._exit(1)


class _RecordingShard:
    def __init__(self):
        self.reported = []

    def write(self, call):
        ops, keys, writer, seq, base, lost, round_robin = call
        self.reported.append(lost)
        return 0, {}, 0, (1, -1, 0, 0)

    def release(self, writer, lost=None):
        self.reported.append(lost)
        return (1, -1, 0, 0)

    def seen(self):
        return self.reported


def test_a_loss_report_carried_by_a_write_that_is_lost_too_is_reported_again():
    from replaybuffer.distributed.ray_shards.outbox import Outbox

    dying = ray.remote(_DyingShard).options(max_restarts=0).remote()
    recording = ray.remote(_RecordingShard).remote()
    outbox = Outbox(SPEC, None, 1, lambda shard, answer: None)
    op = [("add_batch", ({"x": np.array([0])},), {})]
    for _ in range(3):  # each write after the first carries the losses seen so far
        outbox.send(0, dying, op, 1, [])
    outbox.send(0, recording, op, 1, [])
    outbox.flush()
    reported = [tuple(chunk) for r in ray.get(recording.seen.remote()) if r for chunk in r]
    assert sorted(reported) == [(0, 1), (1, 1), (2, 1)]  # each lost write, once


class _AnsweringShard:
    """A shard process that answers as ``incarnation``, holding ``holds[k]`` of the
    writer's chunks after its k-th write (0 after a release); it records the losses
    reported to it."""

    def __init__(self, incarnation, holds):
        self.incarnation, self.holds, self.reported = incarnation, list(holds), []

    def write(self, call):
        self.reported.extend(call[5] or [])
        return 0, {}, self.holds.pop(0), (self.incarnation, -1, 0, 0)

    def release(self, writer, lost=None):
        self.reported.extend(lost or [])
        return (self.incarnation, -1, 0, 0)

    def seen(self):
        return [tuple(chunk) for chunk in self.reported]


def test_chunks_a_dead_shard_process_answered_held_are_reported_lost_to_the_next():
    """Chunks 0 and 1 went to a process that answered "held" (they waited there for
    an earlier one) and died; the writer reports both to the next process, which
    counts those no process of the shard applied (its applied-chunk table)."""
    from replaybuffer.distributed.ray_shards.outbox import Outbox

    old = ray.remote(_AnsweringShard).remote(1, [1, 1])
    new = ray.remote(_AnsweringShard).remote(2, [0])
    outbox = Outbox(SPEC, None, 1, lambda shard, answer: None)
    op = [("add_batch", ({"x": np.array([0])},), {})]
    outbox.send(0, old, op, 2, [])
    outbox.send(0, old, op, 3, [])  # settles chunk 0: held
    outbox.send(0, new, op, 1, [])  # settles chunk 1: held; the process restarts
    outbox.flush()
    assert ray.get(old.seen.remote()) == []
    assert sorted(ray.get(new.seen.remote())) == [(0, 2), (1, 3)]  # once each


def test_chunks_held_and_then_applied_by_the_same_process_are_not_reported():
    from replaybuffer.distributed.ray_shards.outbox import Outbox

    shard = ray.remote(_AnsweringShard).remote(1, [1, 1, 0, 1])
    outbox = Outbox(SPEC, None, 1, lambda shard, answer: None)
    op = [("add_batch", ({"x": np.array([0])},), {})]
    for steps in (2, 3, 1, 4):  # the third answer holds none: 0 and 1 were applied
        outbox.send(0, shard, op, steps, [])
    outbox.flush()  # the fourth, held, is released by the same process
    assert ray.get(shard.seen.remote()) == []


def test_a_held_chunk_no_process_applied_is_counted_lost_by_the_next(tmp_path):
    """The shard's side: the first process applied chunk 0 of a writer and held chunk
    2 for chunk 1, then died; reported both, the next process counts 1 and 2."""
    from replaybuffer.distributed.ray_shards.shard import ShardActor

    def step(v: int):
        return [("add_batch", ({"x": np.array([v])},), {})]

    writer = os.urandom(8).hex()
    first = ShardActor(uniform, 0, str(tmp_path), None)
    assert first.write((step(0), [], writer, 0, 0, None, False))[2] == 0
    assert first.write((step(2), [], writer, 2, 1, None, False))[2] == 1  # held
    second = ShardActor(uniform, 0, str(tmp_path), None)
    # chunk 0 by the mark; chunk 2 held by the process that died, from its home
    assert second.steps_lost == 2
    second.release(writer, [(1, 1), (2, 1)])
    assert second.steps_lost == 3  # chunk 1 added; chunk 2 not counted twice


def extend_op(values):
    return [("extend", ({"x": np.asarray(values, np.int64)[None]},), {})]


def test_chunks_held_by_a_process_that_died_count_lost_with_no_report(tmp_path):
    """A writer whose chunks 1 and 2 (3 and 2 steps) a process held for chunk 0, that
    never calls again: the next process counts them at its start, once; chunks a
    process held and then applied are not counted by the one after it."""
    from replaybuffer.distributed.ray_shards.shard import ShardActor

    writer, other = os.urandom(8).hex(), os.urandom(8).hex()
    first = ShardActor(uniform, 0, str(tmp_path), None)
    assert first.write((extend_op([1, 2, 3]), [], writer, 1, 0, None, False))[2] == 1
    assert first.write((extend_op([4, 5]), [], writer, 2, 0, None, False))[2] == 2
    assert first.write((extend_op([7]), [], other, 1, 0, None, False))[2] == 1
    assert first.write((extend_op([6]), [], other, 0, 0, None, False))[2] == 0  # applied
    second = ShardActor(uniform, 0, str(tmp_path), None)
    assert second.steps_lost == 5 + 2  # writer's held chunks; other's applied, by the mark
    second.write((extend_op([8]), [], writer, 3, 3, [(1, 3), (2, 2)], False))
    assert second.steps_lost == 7  # the writer's report of the same chunks: not again
    second.describe()  # a client is shown them and acknowledges them: the next
    second.acknowledge(second.incarnation, 7)  # process does not carry them
    third = ShardActor(uniform, 0, str(tmp_path), None)
    assert third.steps_lost == 1  # chunk 3 by the mark; nothing held any more


def test_a_home_of_the_earlier_layout_holds_nothing_and_keeps_its_writers(tmp_path):
    from replaybuffer.distributed.ray_shards.shard_home import (_MARK_WORDS, ShardHome,
                                                                writer_key)

    words = np.zeros(_MARK_WORDS, np.int64)
    key = writer_key(os.urandom(8).hex())
    words[0], words[2], words[3] = 41, key, 5 + 1  # mark 41; chunk 5 applied
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "mark").write_bytes(words.tobytes())
    home = ShardHome(tmp_path, temporary=False)
    assert home.mark == 41 and home.applied() == {key: 5} and home.take_held() == {}
    home.record_held(key, {7: 2, 9: 4, 7 + 70: 1})  # the last too far: left to the writer
    assert home.take_held() == {key: ({7, 9}, 6)} and home.take_held() == {}
    assert home.applied() == {key: 5}


def test_a_writer_that_never_calls_again_has_its_held_chunks_in_losses():
    """Chunk 1 of a writer waits in the shard for chunk 0, which never comes; the
    shard's process dies; the client sees the 4 steps lost at its next call."""
    with RayReplayBuffer(uniform, 1, seed=5) as buffer:
        writer = os.urandom(8).hex()
        answer = ray.get(buffer.actors[0].write.remote(
            (extend_op([1, 2, 3, 4]), [], writer, 1, 0, None, False)))
        assert answer[2] == 1  # held
        kill_and_wait_restarted(buffer, 0)
        buffer.wait_for_shards(timeout=60)
        assert len(buffer) == 0
        assert [loss.steps_lost for loss in buffer.losses] == [4]


def test_a_refused_write_does_not_drop_the_writers_later_writes():
    with RayReplayBuffer(transitions, 1, seed=4) as buffer:
        writer = buffer.writer(0, chunk_steps=1)

        def add(t, width=2):
            writer.add(np.full((1, width), t, np.float32), np.array([t]), np.array([1.0]),
                       np.full((1, 2), t + 1, np.float32), np.array([False]))
        add(0)
        add(1, width=3)  # refused inside the shard
        with pytest.raises(Exception, match="3"):
            writer.flush()
        for t in range(2, 7):
            add(t)
        writer.flush()
        batch, _ = buffer.sample(200)
        assert set(batch.actions.tolist()) == {0, 2, 3, 4, 5, 6}


def test_get_next_over_read_fifo_shards_raises_instead_of_spinning():
    with RayReplayBuffer(fifo, 2, seed=5) as buffer:
        for i in range(2):
            buffer.extend({"x": np.arange(4)[None] + 10 * i}, shard=i)
        buffer.flush()
        read = [int(buffer.get_next()[0]["x"]) for _ in range(8)]  # each item once
        assert sorted(read) == [0, 1, 2, 3, 10, 11, 12, 13]
        outcome: list = []

        def read():
            try:
                buffer.get_next(2, timeout=0.5)
            except Exception as exc:  # noqa: BLE001 - inspected below
                outcome.append(exc)
        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        thread.join(30)
        assert not thread.is_alive(), "get_next spun past its timeout"
        assert isinstance(outcome[0], rb.EmptyBufferError)


def test_ids_from_before_a_restart_the_client_missed_are_ignored(tmp_path):
    with RayReplayBuffer(prioritized, 2, checkpoint_dir=tmp_path, checkpoint_every=5,
                         seed=6) as buffer:
        for i in range(2):
            buffer.extend({"x": np.arange(10)[None]}, shard=i)
        buffer.flush()
        _, info = buffer.get_next(64)
        from_shard_1 = int(((info.ids & ((1 << 48) - 1)) % 2 == 1).sum())
        kill_and_wait_restarted(buffer, 0)  # the client has not noticed
        assert buffer.update_priorities(info.ids, np.full(64, 5.0)) == from_shard_1
        assert [loss.shard for loss in buffer.losses] == [0]


def test_bad_rows_and_timeouts_are_refused_in_the_caller():
    with RayReplayBuffer(uniform, 2, seed=7) as buffer:
        buffer.extend({"x": np.arange(3)[None]}, shard=0)
        buffer.flush()
        writer = buffer.writer(1)
        for call in (lambda: buffer.add_batch({"x": np.array([1, 2])}),
                     lambda: buffer.extend({"x": np.zeros((2, 3), np.int64)}),
                     lambda: writer.add_batch({"x": np.array([1, 2])})):
            with pytest.raises(SpecError, match="2 rows.*batch_size=1"):
                call()
        for bad in (float("nan"), -1.0):
            for call in (functools.partial(buffer.add_batch, {"x": np.array([1])}),
                         functools.partial(buffer.extend, {"x": np.array([[1]])}),
                         functools.partial(buffer.get_next, 2),
                         functools.partial(buffer.sample, 2)):
                with pytest.raises(ValueError, match="timeout must be None or a number"):
                    call(timeout=bad)
        writer.flush()
        buffer.flush()
        assert [d["size"] for d in buffer.describe()] == [3, 0]  # nothing reached a shard


def test_a_process_killed_right_after_its_mark_counts_held_chunks_it_applied_once(
        tmp_path, monkeypatch):
    """A process applies chunk 0 (1 step) and the chunk 1 (3 steps) it held for it,
    and dies right after storing its mark (modelled by the store after the mark
    raising: the held record's, the pending record's two, the mark): the next process
    counts the 4 steps once, by the mark; the held record must not still name chunk 1
    (counted a second time before the fix)."""
    from replaybuffer.distributed.ray_shards.shard import ShardActor

    writer = os.urandom(8).hex()
    first = ShardActor(uniform, 0, str(tmp_path), None)
    assert first.write((extend_op([1, 2, 3]), [], writer, 1, 0, None, False))[2] == 1
    made = kill_at_store(monkeypatch, 4)
    with pytest.raises(Killed):
        first.write((extend_op([0]), [], writer, 0, 0, None, False))
    assert made[-1] == 0  # the last store made was the mark's (word 0)
    monkeypatch.undo()
    second = ShardActor(uniform, 0, str(tmp_path), None)
    assert second.steps_lost == 4


class Killed(BaseException):
    """A shard process killed at one store into its home (not an Exception: nothing
    on the way catches it, as nothing runs after a kill)."""


def kill_at_store(monkeypatch, stores_before_kill: int) -> list[int]:
    """Make the shard home's stores raise :class:`Killed` once ``stores_before_kill``
    of them went through (every store that orders the mark and the records goes
    through ``ShardHome.store``); the list holds the stores made."""
    from replaybuffer.distributed.ray_shards.shard_home import ShardHome

    made: list[int] = []
    store = ShardHome.store

    def dying(home, index, value):
        if len(made) == stores_before_kill:
            raise Killed
        made.append(index)
        store(home, index, value)
    monkeypatch.setattr(ShardHome, "store", dying)
    return made


def test_a_process_killed_between_its_mark_and_its_writer_record_counts_the_chunk_once(
        tmp_path, monkeypatch):
    """The review's case: chunk 1 (2 steps) applied, its mark stored, the process
    killed before the writer's record (modelled by that record raising). The writer,
    which saw no answer, reports chunk 1 lost: the next process counts its 2 steps
    once (counted by the mark and again by the report before the fix: 5)."""
    from replaybuffer.distributed.ray_shards.shard import ShardActor
    from replaybuffer.distributed.ray_shards.shard_home import ShardHome

    writer = os.urandom(8).hex()
    first = ShardActor(uniform, 0, str(tmp_path), None)
    first.write((extend_op([1]), [], writer, 0, 0, None, False))

    def killed(*args, **kwargs):
        raise Killed
    monkeypatch.setattr(ShardHome, "record_applied", killed)
    with pytest.raises(Killed):
        first.write((extend_op([2, 3]), [], writer, 1, 1, None, False))
    monkeypatch.undo()
    second = ShardActor(uniform, 0, str(tmp_path), None)
    second.write((extend_op([4]), [], writer, 2, 2, [(1, 2)], False))
    assert second.steps_lost == 3


@pytest.mark.parametrize("stores_before_kill", range(4))
def test_a_chunk_is_counted_once_wherever_its_process_is_killed(tmp_path, monkeypatch,
                                                                  stores_before_kill):
    """Chunk 0 (1 step) applied and answered; chunk 1 (2 steps) applied and its
    process killed after each of the stores of its mark and its writer's record in
    turn. The writer reports chunk 1 lost (it saw no answer): 3 steps lost, exactly,
    at every kill point."""
    from replaybuffer.distributed.ray_shards.shard import ShardActor

    writer = os.urandom(8).hex()
    first = ShardActor(uniform, 0, str(tmp_path), None)
    first.write((extend_op([1]), [], writer, 0, 0, None, False))
    made = kill_at_store(monkeypatch, stores_before_kill)
    with pytest.raises(Killed):
        first.write((extend_op([2, 3]), [], writer, 1, 1, None, False))
    assert len(made) == stores_before_kill
    monkeypatch.undo()
    second = ShardActor(uniform, 0, str(tmp_path), None)
    second.write((extend_op([4]), [], writer, 2, 2, [(1, 2)], False))
    assert second.steps_lost == 3
    second.describe()  # the client was shown it, and acknowledges it
    second.acknowledge(second.incarnation, 3)
    third = ShardActor(uniform, 0, str(tmp_path), None)
    assert third.steps_lost == 1  # chunk 2, by the mark; chunk 1 not again


@pytest.mark.parametrize("stores_before_kill", range(5))
def test_held_chunks_applied_by_a_killed_process_are_counted_once(tmp_path, monkeypatch,
                                                                   stores_before_kill):
    """Chunks 1 and 2 (3 and 2 steps) held for chunk 0 (1 step), which comes: the
    process applies all three and is killed after each store of its held record,
    mark and writer's record in turn. The writer (chunk 0 unanswered, 1 and 2
    answered "held") reports all three: 6 steps lost at every kill point."""
    from replaybuffer.distributed.ray_shards.shard import ShardActor

    writer = os.urandom(8).hex()
    first = ShardActor(uniform, 0, str(tmp_path), None)
    assert first.write((extend_op([1, 2, 3]), [], writer, 1, 0, None, False))[2] == 1
    assert first.write((extend_op([4, 5]), [], writer, 2, 0, None, False))[2] == 2
    kill_at_store(monkeypatch, stores_before_kill)
    with pytest.raises(Killed):
        first.write((extend_op([0]), [], writer, 0, 0, None, False))
    monkeypatch.undo()
    second = ShardActor(uniform, 0, str(tmp_path), None)
    second.write((extend_op([6]), [], writer, 3, 3, [(0, 1), (1, 3), (2, 2)], False))
    assert second.steps_lost == 6


@pytest.mark.parametrize("stores_before_kill", range(5))
def test_a_held_record_is_never_torn_by_a_kill(tmp_path, monkeypatch, stores_before_kill):
    """Chunk 1 (3 steps) held; chunk 2 (2 steps) arrives, held too, and the process
    is killed after each store of the new held record in turn: the next process sees
    the old record or the new one, whole, so with the writer's report of both chunks
    5 steps are lost at every kill point (a record torn between its chunks and its
    steps counted 3 or 7)."""
    from replaybuffer.distributed.ray_shards.shard import ShardActor

    writer = os.urandom(8).hex()
    first = ShardActor(uniform, 0, str(tmp_path), None)
    assert first.write((extend_op([1, 2, 3]), [], writer, 1, 0, None, False))[2] == 1
    kill_at_store(monkeypatch, stores_before_kill)
    with pytest.raises(Killed):
        first.write((extend_op([4, 5]), [], writer, 2, 0, None, False))
    monkeypatch.undo()
    second = ShardActor(uniform, 0, str(tmp_path), None)
    assert second.steps_lost in (3, 5)  # the old record, or the new one, whole
    second.write((extend_op([6]), [], writer, 3, 3, [(1, 3), (2, 2)], False))
    assert second.steps_lost == 5


def test_losses_of_a_process_no_client_heard_are_carried_by_the_next(tmp_path):
    """A process that counted losses at its start (held chunks of a writer that never
    calls again, steps past the checkpoint) or from a writer's report, and dies
    before a client reads its status, leaves them to the next process; once a client
    was shown them (a description, a draw, a mass question) and acknowledged them,
    they are not carried."""
    from replaybuffer.distributed.ray_shards.shard import ShardActor

    writer, other = os.urandom(8).hex(), os.urandom(8).hex()
    first = ShardActor(uniform, 0, str(tmp_path), None)
    assert first.write((extend_op([1, 2, 3]), [], writer, 1, 0, None, False))[2] == 1
    first.write((extend_op([7, 8]), [], other, 0, 0, None, False))
    second = ShardActor(uniform, 0, str(tmp_path), None)
    assert second.steps_lost == 5  # 3 held, 2 by the mark; no client hears it
    third = ShardActor(uniform, 0, str(tmp_path), None)
    assert third.steps_lost == 5  # carried (0 before the fix)
    assert third.describe()["status"][2] == 5  # the client is shown them
    third.acknowledge(third.incarnation, 5)  # and holds them in its losses
    fourth = ShardActor(uniform, 0, str(tmp_path), None)
    assert fourth.steps_lost == 0
    fourth.write((extend_op([9]), [], writer, 4, 4, [(2, 4)], False))  # a report
    assert fourth.steps_lost == 4  # answered to the writer only
    fifth = ShardActor(uniform, 0, str(tmp_path), None)
    assert fifth.steps_lost == 4 + 1  # the report carried; chunk 4 by the mark
    assert fifth.mass_status(None)[1][2] == 5
    fifth.acknowledge(fifth.incarnation, -1)  # as many as it was shown
    sixth = ShardActor(uniform, 0, str(tmp_path), None)
    assert sixth.steps_lost == 0
    sixth.write((extend_op([10]), [], writer, 6, 6, [(5, 2)], False))
    sixth.clear()  # a clear starts afresh: nothing carried
    assert ShardActor(uniform, 0, str(tmp_path), None).steps_lost == 0


START_STORES = 8
"""The stores the start below makes: its record (3), undelivered, the held record
forgotten, the pending record settled, the mark, the record cleared."""


def start_stores(tmp_path) -> None:
    """A shard home left by a process that held chunk 1 (3 steps) of one writer and
    applied 2 steps of another past its (absent) checkpoint (its pending record
    left to settle)."""
    from replaybuffer.distributed.ray_shards.shard import ShardActor

    writer, other = os.urandom(8).hex(), os.urandom(8).hex()
    first = ShardActor(uniform, 0, str(tmp_path), None)
    assert first.write((extend_op([1, 2, 3]), [], writer, 1, 0, None, False))[2] == 1
    first.write((extend_op([7, 8]), [], other, 0, 0, None, False))


@pytest.mark.parametrize("stores_before_kill", range(START_STORES + 1))
def test_a_start_killed_at_any_store_leaves_its_count_to_the_next_once(
        tmp_path, monkeypatch, stores_before_kill):
    """A process held chunk 1 (3 steps) of one writer and applied 2 steps of another
    past its checkpoint: its next start counts 5 steps lost, and is killed after each
    store it makes in turn (its redo record, undelivered, the held record forgotten,
    the pending records settled, the mark, the record cleared). The start after it
    counts exactly 5, whatever store the kill followed (the steps past the checkpoint,
    and the held ones, counted twice before the fix: 7 or 10), and once a client was
    shown them they are not carried further."""
    from replaybuffer.distributed.ray_shards.shard import ShardActor

    start_stores(tmp_path)
    made = kill_at_store(monkeypatch, stores_before_kill)
    try:
        killed = ShardActor(uniform, 0, str(tmp_path), None)
    except Killed:
        killed = None
    monkeypatch.undo()
    if killed is not None:  # every store made: nothing left to kill
        assert len(made) == stores_before_kill == START_STORES
        assert killed.steps_lost == 5
    else:
        assert len(made) == stores_before_kill
    after = ShardActor(uniform, 0, str(tmp_path), None)
    assert after.steps_lost == 5
    assert after.files.start_record is None
    assert after.files.mark == after.restored_last_id == -1
    assert after.files.held() == {}
    assert after.describe()["status"][2] == 5  # the client is shown them
    after.acknowledge(after.incarnation, 5)
    assert ShardActor(uniform, 0, str(tmp_path), None).steps_lost == 0


def test_the_start_kill_test_reaches_every_store_of_a_start(tmp_path, monkeypatch):
    """The parametrised kills above cover every store of the start (a start that
    made more would leave its last stores untested)."""
    from replaybuffer.distributed.ray_shards.shard import ShardActor

    start_stores(tmp_path)
    made = kill_at_store(monkeypatch, 10**6)
    ShardActor(uniform, 0, str(tmp_path), None)
    assert len(made) == START_STORES, made


def test_a_loss_shown_but_not_acknowledged_is_carried_to_the_next_process(tmp_path):
    """Item 2: a process showed its loss in an answer and was killed before the answer
    left (modelled: the answer made, no acknowledgement): the next process carries
    the loss (0 before the fix: the answer cleared it). An acknowledgement of another
    incarnation changes nothing; one of part of it leaves the rest carried; -1
    acknowledges what answers showed, no more."""
    from replaybuffer.distributed.ray_shards.shard import ShardActor

    writer, other = os.urandom(8).hex(), os.urandom(8).hex()
    first = ShardActor(uniform, 0, str(tmp_path), None)
    assert first.write((extend_op([1, 2, 3]), [], writer, 1, 0, None, False))[2] == 1
    first.write((extend_op([7, 8]), [], other, 0, 0, None, False))
    second = ShardActor(uniform, 0, str(tmp_path), None)
    assert second.describe()["status"][2] == 5  # the answer that never left
    third = ShardActor(uniform, 0, str(tmp_path), None)
    assert third.steps_lost == 5
    third.acknowledge(second.incarnation, 5)  # an earlier process's: not this one's
    third.acknowledge(third.incarnation, -1)  # nothing shown yet
    assert third.files.undelivered == 5
    third.acknowledge(third.incarnation, 3)
    assert third.files.undelivered == 2
    third.acknowledge(third.incarnation, 2)  # an older acknowledgement, late
    assert third.files.undelivered == 2
    fourth = ShardActor(uniform, 0, str(tmp_path), None)
    assert fourth.steps_lost == 2
    assert fourth.mass_status(None)[1][2] == 2
    fourth.write((extend_op([9]), [], writer, 4, 4, [(2, 4)], False))  # a report: 6
    fourth.acknowledge(fourth.incarnation, -1)  # shown: 2 of the 6
    assert ShardActor(uniform, 0, str(tmp_path), None).steps_lost == 4 + 1  # and chunk 4


def test_the_client_acknowledges_a_restarted_shards_loss_once_it_holds_it(tmp_path):
    """Item 2, the client's side: once the client has recorded a restarted shard's
    loss in ``losses``, it acknowledges it, and the shard stops carrying it to its
    next process (the next restart's loss is its own steps only)."""
    from replaybuffer.distributed.ray_shards.shard_home import ShardHome

    with RayReplayBuffer(uniform, 2, checkpoint_dir=tmp_path, seed=3) as buffer:
        buffer.extend({"x": np.arange(7)[None]}, shard=0)
        buffer.flush()
        kill_and_wait_restarted(buffer, 0)
        buffer.describe()  # the client sees the restart
        [loss] = buffer.losses
        assert loss.steps_lost == 7
        home = ShardHome(tmp_path / "shard-000", temporary=False)
        deadline = time.monotonic() + 30
        while home.undelivered and time.monotonic() < deadline:
            time.sleep(0.05)  # the acknowledgement is not waited for
        assert home.undelivered == 0
        buffer.extend({"x": np.arange(2)[None]}, shard=0)
        buffer.flush()
        kill_and_wait_restarted(buffer, 0)
        buffer.describe()
        assert [x.steps_lost for x in buffer.losses] == [7, 2]
