"""``sample_on_device=True`` transition reads made on the device
(buffers/device_transition_reads.py, buffers/device_side_mirror.py): every sampled
transition, byte for byte, against the host path's read of the same step
(``read_steps``), over random adds (episode ends by termination and by truncation,
out-of-sequence adds, wrap-around, several envs, ``n``-step returns), clears,
restores and a side store that grows; and a sample that never brings a device tensor
back to the host. On the CPU (the device layout of torch storage, and the default
numpy views) and, in the tests named ``..._cuda``, on a CUDA device with
``torch.cuda.set_sync_debug_mode("error")``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import replaybuffer as rb  # noqa: E402
from replaybuffer.buffers.numpy_sum_order import row_sums_in_numpy_order  # noqa: E402
from replaybuffer.storage.torch_storage import TorchStorage  # noqa: E402

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
FIELDS = ("observations", "actions", "rewards", "next_observations", "terminated",
          "truncated", "dones", "discounts")
ROWS = 16  # an action is step_id * ROWS + row: a sampled transition names its step


def make(cls, device: str, num_envs: int, capacity: int, n_step: int, gamma: float,
         **kwargs):
    obs = {"pos": rb.ArraySpec((2,), np.float32), "flag": rb.ArraySpec((), np.uint8)}
    return cls(obs, rb.ArraySpec((), np.int64), capacity, num_envs=num_envs,
               storage="torch", device=device, sample_on_device=True, seed=3,
               n_step=n_step, gamma=gamma, **kwargs)


def add(buf, rng: np.random.Generator, state: dict, end_rate: float = 0.25) -> None:
    """One add of every env: observations follow on from the previous next observation
    except now and then (out of sequence); episodes end by termination or truncation;
    rewards include -0.0 and large magnitudes (the n-step sum's rounding shows)."""
    B = buf.num_envs
    step = buf.last_id + 1
    obs = state.get("next")
    if obs is None or rng.random() < 0.1:
        obs = {"pos": rng.standard_normal((B, 2)).astype(np.float32),
               "flag": rng.integers(0, 255, B).astype(np.uint8)}
    nxt = {"pos": rng.standard_normal((B, 2)).astype(np.float32),
           "flag": rng.integers(0, 255, B).astype(np.uint8)}
    reward = (rng.standard_normal(B) * 10.0 ** rng.integers(-3, 6, B)).astype(np.float32)
    reward[rng.random(B) < 0.1] = -0.0
    terminated = rng.random(B) < end_rate / 2
    truncated = ~terminated & (rng.random(B) < end_rate / 2)
    buf.add(obs, step * ROWS + np.arange(B), reward, nxt, terminated, truncated)
    # Rows whose episode ended start afresh; the others follow on.
    follow = {k: v.copy() for k, v in nxt.items()}
    ended = terminated | truncated
    follow["pos"][ended] = rng.standard_normal((int(ended.sum()), 2)).astype(np.float32)
    state["next"] = follow


def check_sample(buf, batch: int = 64) -> None:
    check(buf, *buf.sample(batch))


def check(buf, transitions, info) -> None:
    """Every sampled transition is, byte for byte, the host path's read of its step
    (a stored step's transition never changes, so this may run later)."""
    actions = transitions.actions.cpu().numpy()
    steps, rows = actions // ROWS, actions % ROWS
    reference = buf.read_steps(steps.astype(np.int64))
    k = np.arange(len(steps))
    for field in FIELDS:
        got, want = getattr(transitions, field), getattr(reference, field)
        for g, w in zip(_leaves(got), _leaves(want)):
            assert g.device.type == buf.device.type, field
            expected = w.cpu().numpy()[rows, k]
            actual = g.cpu().numpy()
            assert actual.dtype == expected.dtype and actual.shape == expected.shape, field
            # bytes: -0.0 is not 0.0, a NaN is itself
            assert actual.tobytes() == expected.tobytes(), field
    assert info.ids.device.type == buf.device.type
    assert info.probabilities.device.type == buf.device.type


def _leaves(value):
    return [value[k] for k in sorted(value)] if isinstance(value, dict) else [value]


@pytest.fixture(params=["device-layout", "numpy-views"])
def layout(request, monkeypatch):
    monkeypatch.setattr(TorchStorage, "numpy_views", request.param == "numpy-views")
    return request.param


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), num_envs=st.sampled_from([1, 2, 3]),
       max_length=st.integers(2, 9), n_step=st.sampled_from([1, 2, 3, 9]),
       gamma=st.sampled_from([0.0, 0.5, 0.99, 1.0]),
       prioritized=st.booleans(), ops=st.lists(st.sampled_from(
           ["add", "add", "add", "sample", "clear", "restore"]), min_size=1, max_size=40))
def test_device_reads_match_the_host_path(layout, seed, num_envs, max_length, n_step, gamma,
                                          prioritized, ops):
    cls = rb.PrioritizedTransitionReplayBuffer if prioritized else rb.TransitionReplayBuffer
    buf = make(cls, "cpu", num_envs, num_envs * max_length, n_step, gamma)
    rng = np.random.default_rng(seed)
    state: dict = {}
    saved = None
    for op in ops + ["add", "sample"]:
        if op == "add":
            add(buf, rng, state)
        elif op == "clear":
            buf.clear()
            state.clear()
        elif op == "restore":
            if saved is None:  # save now, restore at the next "restore"
                saved = (buf.state_dict(), dict(state))
            else:
                buf.load_state_dict(saved[0])
                state = dict(saved[1])
                saved = None
        elif len(buf):
            check_sample(buf)


def test_a_growing_side_store_and_long_windows_read_as_on_the_host(layout):
    # Every row ends its episode at every step: the side store (64 slots at first)
    # grows twice while samples are read between adds; windows longer than the ring.
    buf = make(rb.TransitionReplayBuffer, "cpu", 3, 3 * 90, 12, 0.9)
    rng = np.random.default_rng(0)
    state: dict = {}
    for t in range(200):
        add(buf, rng, state, end_rate=1.0 if t < 80 else 0.2)
        if t % 7 == 0 or t > 190:
            check_sample(buf, 128)
    assert buf.last_id == 199


def test_n_step_sums_are_numpys_bit_for_bit():
    rng = np.random.default_rng(1)
    for n in list(range(1, 40)) + [127, 128, 129, 300]:
        terms = rng.standard_normal((50, n)) * 10.0 ** rng.integers(-12, 12, (50, n))
        terms[rng.random((50, n)) < 0.2] = -0.0
        terms[:5] = -0.0  # numpy's sum of -0.0 terms is 0.0
        terms[5, 0] = np.nan
        got = row_sums_in_numpy_order(torch.from_numpy(terms)).numpy()
        assert got.tobytes() == terms.sum(-1).tobytes(), n


class _HostTouch(Exception):
    pass


def _refuse(name):
    def refuse(*args, **kwargs):
        raise _HostTouch(f"the sample path called Tensor.{name}")
    return refuse


@pytest.mark.parametrize("n_step", [1, 4])
@pytest.mark.parametrize("cls", [rb.TransitionReplayBuffer,
                                 rb.PrioritizedTransitionReplayBuffer])
def test_a_sample_never_brings_a_device_tensor_to_the_host(monkeypatch, cls, n_step):
    # The device layout on the CPU: every read is a torch operation, as on a GPU.
    monkeypatch.setattr(TorchStorage, "numpy_views", False)
    buf = make(cls, "cpu", 2, 40, n_step, 0.9)
    rng = np.random.default_rng(2)
    state: dict = {}
    for _ in range(30):
        add(buf, rng, state)
    check_sample(buf)  # the first sync copies everything, outside the patch
    for _ in range(3):
        add(buf, rng, state)
    with monkeypatch.context() as patch:
        for name in ("numpy", "item", "tolist", "cpu", "__array__", "__bool__", "__int__",
                     "__float__", "__index__"):
            patch.setattr(torch.Tensor, name, _refuse(name))
        transitions, info = buf.sample(32)
        transitions, info = buf.sample(32)  # a sync with nothing to copy
    check_sample(buf)
    with pytest.raises(_HostTouch):  # the patch would have caught a touch
        with monkeypatch.context() as patch:
            patch.setattr(torch.Tensor, "numpy", _refuse("numpy"))
            transitions.rewards.numpy()


def test_a_mirror_copy_is_the_hosts_even_where_adds_changed_it_since(monkeypatch):
    # An add that does not follow on keeps the previous step's next observation (its
    # side_ref entry set after that step was synced): the next sample must see it.
    monkeypatch.setattr(TorchStorage, "numpy_views", False)
    buf = make(rb.TransitionReplayBuffer, "cpu", 1, 50, 1, 0.9)
    obs = {"pos": np.zeros((1, 2), np.float32), "flag": np.zeros(1, np.uint8)}
    nxt = {"pos": np.ones((1, 2), np.float32), "flag": np.ones(1, np.uint8)}
    no = np.zeros(1, bool)
    buf.add(obs, np.array([0]), np.ones(1, np.float32), nxt, no, no)
    check_sample(buf, 8)  # synced with step 0, its next observation the head's
    other = {"pos": np.full((1, 2), 7, np.float32), "flag": np.full(1, 7, np.uint8)}
    buf.add(other, np.array([ROWS]), np.ones(1, np.float32), nxt, no, no)
    transitions = buf.read_steps(np.array([0]))
    np.testing.assert_array_equal(transitions.next_observations["pos"].numpy()[0, 0], [1, 1])
    for _ in range(5):
        check_sample(buf, 16)


def test_frame_stack_is_refused_for_device_sampling():
    with pytest.raises(ValueError, match="frame_stack needs storage='numpy', got 'torch'"):
        rb.TransitionReplayBuffer(rb.ArraySpec((4, 8, 8), np.uint8),
                                  rb.ArraySpec((), np.int64), 16, storage="torch",
                                  frame_stack=True, sample_on_device=True)


@needs_cuda
@pytest.mark.parametrize("n_step", [1, 3])
@pytest.mark.parametrize("cls", [rb.TransitionReplayBuffer,
                                 rb.PrioritizedTransitionReplayBuffer])
def test_device_reads_match_the_host_path_without_a_sync_cuda(cls, n_step):
    buf = make(cls, "cuda", 3, 3 * 40, n_step, 0.97)
    rng = np.random.default_rng(4)
    state: dict = {}
    for t in range(130):  # wraps around; the side store grows
        add(buf, rng, state, end_rate=0.6)
        if t % 9 == 0:
            check_sample(buf)
    saved = buf.state_dict()
    for _ in range(5):
        add(buf, rng, state)
    buf.sample(64)  # the first sample of a batch size may allocate and sync once
    previous = torch.cuda.get_sync_debug_mode()
    for _ in range(3):  # the add path is not checked here: the sample's is
        add(buf, rng, state, end_rate=0.6)
        torch.cuda.set_sync_debug_mode("error")
        try:
            buf.sample(64)
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    check_sample(buf)
    buf.load_state_dict(saved)
    check_sample(buf)
    buf.clear()
    state.clear()
    for _ in range(4):
        add(buf, rng, state)
    check_sample(buf)


def test_a_sample_between_a_restores_two_steps_does_not_keep_stale_copies(monkeypatch):
    # restore_state restores the ring (a new generation), then the side state under a
    # second hold of the lock: a sample from another thread may come in between and
    # sync the mirror with the old side state. Simulated by sampling there.
    monkeypatch.setattr(TorchStorage, "numpy_views", False)
    buf = make(rb.TransitionReplayBuffer, "cpu", 2, 30, 2, 0.9)
    rng = np.random.default_rng(5)
    state: dict = {}
    for _ in range(8):
        add(buf, rng, state, end_rate=0.8)
    saved = buf.state_dict()
    for _ in range(9):
        add(buf, rng, state, end_rate=0.8)
    from replaybuffer.buffers.checkpoints import Checkpoints

    ring_restore = Checkpoints.restore_state

    def sample_after_the_ring(self, *args):  # the ring restored, the side state not yet
        ring_restore(self, *args)
        self.sample(16)

    monkeypatch.setattr(Checkpoints, "restore_state", sample_after_the_ring)
    buf.load_state_dict(saved)
    monkeypatch.setattr(Checkpoints, "restore_state", ring_restore)
    for _ in range(3):
        check_sample(buf)


@needs_cuda
def test_reads_on_another_stream_are_not_overwritten_by_later_copies_cuda():
    # A sample on a stream held back by a long kernel reads the mirror's rows after a
    # later add's sample (on the default stream) has copied new ones over them: the
    # copy must wait for it. Capacity enough that no sampled step is overwritten.
    buf = make(rb.TransitionReplayBuffer, "cuda", 2, 2 * 200, 1, 0.9)
    rng = np.random.default_rng(6)
    state: dict = {}
    for _ in range(20):
        add(buf, rng, state)
    check_sample(buf)
    other = torch.cuda.Stream()
    big = torch.randn(4096, 4096, device="cuda")
    drawn = []
    for _ in range(10):
        add(buf, rng, state, end_rate=0.8)
        other.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(other):
            for _ in range(4):
                big = (big @ big).clamp_(-1, 1)  # hold the stream back
            drawn.append(buf.sample(256))
        add(buf, rng, state, end_rate=0.8)
        drawn.append(buf.sample(256))
    torch.cuda.current_stream().wait_stream(other)
    for transitions, info in drawn:
        check(buf, transitions, info)
