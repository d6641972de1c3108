"""In-memory checkpoints (the Checkpointable seam): a buffer's state_dict loaded into a
fresh buffer of the same configuration makes it sample and read exactly as the
original would."""

import numpy as np
import pytest

import replaybuffer as rb
from replaybuffer import nest
from replaybuffer.collect import Trajectory
from replaybuffer.protocols import Checkpointable

SPEC = {"x": rb.ArraySpec((3,), np.float32), "t": rb.ArraySpec((), np.int64)}
B, L = 2, 7


def items(t, batch_size=B):
    return {"x": np.full((batch_size, 3), t, np.float32),
            "t": np.full(batch_size, t, np.int64)}


def frames_spec():
    return {"obs": rb.ArraySpec((3, 4, 4), np.uint8), "t": rb.ArraySpec((), np.int64)}


def frame_items(t):
    # Stacks of the last three frames (frame k filled with k), so consecutive steps slide.
    stack = np.stack([np.full((4, 4), max(0, k) % 251, np.uint8)
                      for k in range(t - 2, t + 1)])
    return {"obs": np.broadcast_to(stack, (B, 3, 4, 4)).copy(),
            "t": np.full(B, t, np.int64)}


def episode_spec():
    return Trajectory(step_type=rb.ArraySpec((), np.int32),
                      observation=rb.ArraySpec((2,), np.float32),
                      action=rb.ArraySpec((), np.int64), policy_info=(),
                      next_step_type=rb.ArraySpec((), np.int32),
                      reward=rb.ArraySpec((), np.float32),
                      discount=rb.ArraySpec((), np.float32))


def episode_items(t):
    step = np.full(B, 0 if t % 4 == 0 else 1, np.int32)  # an episode every 4 steps
    return Trajectory(step_type=step, observation=np.full((B, 2), t, np.float32),
                      action=np.full(B, t, np.int64), policy_info=(),
                      next_step_type=np.ones(B, np.int32),
                      reward=np.full(B, t, np.float32), discount=np.ones(B, np.float32))


KINDS = {
    "uniform": (lambda: rb.UniformReplayBuffer(SPEC, B, L, seed=1), items, {}),
    "prioritized": (lambda: rb.PrioritizedReplayBuffer(SPEC, B, L, seed=1), items, {}),
    "fifo": (lambda: rb.FIFOReplayBuffer(SPEC, B, L), items, {}),
    "shuffled": (lambda: rb.ShuffledReplayBuffer(SPEC, B, L, seed=1), items, {}),
    "frame_stack": (lambda: rb.UniformReplayBuffer(frames_spec(), B, L, seed=1,
                                                   frame_stack="obs"), frame_items, {}),
    "episodes": (lambda: rb.UniformReplayBuffer(episode_spec(), B, L, seed=1,
                                                track_episodes=True), episode_items,
                 {"within_episodes": True}),
}


def assert_nests_equal(a, b):
    flat_a, flat_b = nest.flatten(a)[0], nest.flatten(b)[0]
    assert len(flat_a) == len(flat_b)
    for x, y in zip(flat_a, flat_b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def fill(buf, make_items, steps):
    for t in range(steps):
        buf.add_batch(make_items(t))


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("steps", [0, 3, 11])  # empty, partly filled, wrapped around
def test_a_loaded_state_dict_samples_and_reads_as_the_original(kind, steps):
    make, make_items, read = KINDS[kind]
    original = make()
    assert isinstance(original, Checkpointable)
    fill(original, make_items, steps)
    if kind == "prioritized" and steps:
        _, info = original.get_next(4)
        original.update_priorities(info.ids, np.arange(1.0, 5.0))
    state = original.state_dict()
    copy = make()
    copy.load_state_dict(state)
    assert copy.last_id == original.last_id and len(copy) == len(original)
    assert_nests_equal(copy.gather_all(), original.gather_all())
    if steps == 0:
        with pytest.raises(rb.EmptyBufferError):
            copy.get_next(2)
        return
    num_steps = 1 if kind == "fifo" else 2
    for _ in range(3):
        if kind == "fifo" and original.unread(num_steps) < 2:
            break
        got, got_info = copy.get_next(2, num_steps, **read)
        want, want_info = original.get_next(2, num_steps, **read)
        assert_nests_equal(got, want)
        assert_nests_equal(tuple(got_info), tuple(want_info))
    # Both go on alike after further adds.
    fill(copy, make_items, 2)
    fill(original, make_items, 2)
    assert_nests_equal(copy.gather_all(), original.gather_all())
    assert_nests_equal(copy.get_next(2, **read), original.get_next(2, **read))


def test_the_state_is_a_copy_and_later_adds_leave_it_alone():
    buf = rb.UniformReplayBuffer(SPEC, B, L, seed=0)
    fill(buf, items, 5)
    state = buf.state_dict()
    before = buf.gather_all()
    fill(buf, items, 20)  # overwrites every slot
    fresh = rb.UniformReplayBuffer(SPEC, B, L, seed=0)
    fresh.load_state_dict(state)
    assert_nests_equal(fresh.gather_all(), before)
    # Loading again gives the same buffer: load_state_dict does not consume the state.
    again = rb.UniformReplayBuffer(SPEC, B, L, seed=0)
    again.load_state_dict(state)
    assert_nests_equal(again.get_next(3), fresh.get_next(3))


def test_saving_still_works_after_a_state_dict(tmp_path):
    """state_dict releases its snapshot: the fused add path and saves work as before."""
    buf = rb.UniformReplayBuffer(SPEC, B, L, seed=0)
    fill(buf, items, 4)
    buf.state_dict()
    fill(buf, items, 4)
    buf.save(tmp_path / "ckpt")
    assert_nests_equal(rb.load(tmp_path / "ckpt").gather_all(), buf.gather_all())


def test_a_state_of_another_layout_is_refused():
    buf = rb.UniformReplayBuffer(SPEC, B, L, seed=0)
    fill(buf, items, 3)
    with pytest.raises(ValueError, match="batch_size=2, max_length=7; this one has "
                                         "batch_size=2, max_length=8"):
        rb.UniformReplayBuffer(SPEC, B, L + 1).load_state_dict(buf.state_dict())
    state = buf.state_dict()
    state["streams"]["extra"] = []
    with pytest.raises(ValueError, match="a stream 'extra' that a UniformReplayBuffer "
                                         "does not keep"):
        rb.UniformReplayBuffer(SPEC, B, L).load_state_dict(state)


def test_subclass_hooks_come_along_transitions():
    """A subclass's own state (n-step transitions, episode ends) travels through the
    same snapshot hooks."""
    def make():
        return rb.TransitionReplayBuffer(rb.ArraySpec((3,), np.float32),
                                         rb.ArraySpec((), np.int64), 20, num_envs=2,
                                         n_step=2, seed=0)

    original = make()
    for t in range(15):
        original.add(np.full((2, 3), t, np.float32), np.full(2, t), np.ones(2),
                     np.full((2, 3), t + 1, np.float32), np.array([t % 5 == 4, False]))
    copy = make()
    copy.load_state_dict(original.state_dict())
    for _ in range(3):
        assert_nests_equal(tuple(copy.sample(5)), tuple(original.sample(5)))


class CountingLock:
    """A buffer's lock that counts the sections taken (with or ``acquire``)."""

    def __init__(self, lock):
        self.lock, self.sections = lock, 0

    def __enter__(self):
        self.acquire()

    def __exit__(self, *exc):
        self.lock.release()

    def acquire(self, *args, **kwargs):
        taken = self.lock.acquire(*args, **kwargs)
        self.sections += bool(taken)
        return taken

    def release(self):
        self.lock.release()

    def locked(self):
        return self.lock.locked()


@pytest.mark.parametrize("kind", ["transitions", "rollout"])
def test_a_restore_is_one_lock_section_ring_and_subclass_parts_together(kind):
    """A read between the ring's restore and the subclass's own parts (side
    observations, returns) would see half a restore: both are restored in one section."""
    cls = rb.TransitionReplayBuffer if kind == "transitions" else rb.RolloutBuffer

    def make():
        return cls(rb.ArraySpec((3,), np.float32), rb.ArraySpec((), np.int64), 20,
                   num_envs=2, seed=0)

    original = make()
    for t in range(15):
        original.add(np.full((2, 3), t, np.float32), np.full(2, t % 2), np.ones(2),
                     np.full((2, 3), t + 1, np.float32), np.array([t % 5 == 4, False]),
                     np.array([False, t % 7 == 6]))
    state = original.state_dict()
    copy = make()
    copy._lock = counting = CountingLock(copy._lock)
    copy.load_state_dict(state)
    assert counting.sections == 1
    assert_nests_equal(tuple(copy.sample(5)), tuple(original.sample(5)))
