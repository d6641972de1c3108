"""TensorDictReplayBuffer inside TorchRL's own collector and loss modules, checked item
for item against TorchRL's ReplayBuffer fed the same stream."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from tensordict.nn import TensorDictSequential
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage
from torchrl.data import ReplayBuffer as TorchRLReplayBuffer
from torchrl.envs import GymEnv
from torchrl.modules import MLP, EGreedyModule, QValueActor
from torchrl.objectives import DQNLoss, SoftUpdate

from replaybuffer import EmptyBufferError, SpecError
from replaybuffer.integrations.torchrl import TensorDictReplayBuffer


def numbered(start: int, count: int) -> TensorDict:
    """``count`` items whose leaves all encode their position in the stream."""
    n = torch.arange(start, start + count)
    return TensorDict({"observation": n[:, None].float().expand(count, 3).clone(),
                       "action": n % 2,
                       "next": {"observation": (n[:, None] + 1).float().expand(count, 3).clone(),
                                "done": (n % 5 == 4)[:, None]}}, batch_size=[count])


def test_collector_extends_it_directly():
    env = GymEnv("CartPole-v1")
    env.set_seed(0)
    ours = TensorDictReplayBuffer(capacity=128, batch_size=64, seed=0)
    collector = Collector(env, None, frames_per_batch=50, total_frames=300,
                          replay_buffer=ours)
    yielded = list(collector)  # a collector with a replay buffer yields None
    collector.shutdown()
    assert yielded == [None] * 6
    assert ours.write_count == 300 and len(ours) == 128
    sample = ours.sample()
    assert sample.batch_size == torch.Size([64])
    assert sample["observation"].shape == sample["next", "observation"].shape == (64, 4)
    assert (sample["index"] >= 300 - 128).all()


def test_samples_match_torchrl_buffer_fed_the_same_stream():
    env = GymEnv("CartPole-v1")
    env.set_seed(1)
    ours = TensorDictReplayBuffer(capacity=128, batch_size=64, seed=0)
    theirs = TorchRLReplayBuffer(storage=LazyTensorStorage(128))
    collector = Collector(env, None, frames_per_batch=50, total_frames=300)
    for batch in collector:
        ours_index = ours.extend(batch)
        theirs_index = theirs.extend(batch)
        # TorchRL's ring puts write w at w % capacity; ours counts writes.
        assert torch.equal(ours_index % 128, theirs_index)
    collector.shutdown()
    for _ in range(3):
        sample = ours.sample()
        expected = theirs[sample["index"] % 128]
        keys = list(expected.keys(include_nested=True, leaves_only=True))
        assert ("next", "observation") in keys and "action" in keys
        for key in keys:
            assert torch.equal(sample[key], expected[key]), key


def test_dqn_training_loop_with_prioritized_weights_and_priority_updates():
    torch.manual_seed(0)
    env = GymEnv("CartPole-v1")
    env.set_seed(0)
    actor = QValueActor(MLP(in_features=4, out_features=2, num_cells=[32]),
                        in_keys=["observation"], spec=env.action_spec)
    explore = TensorDictSequential(actor, EGreedyModule(env.action_spec, eps_init=0.5))
    loss_module = DQNLoss(actor, action_space=env.action_spec, delay_value=True)
    target = SoftUpdate(loss_module, eps=0.95)
    optim = torch.optim.Adam(loss_module.parameters(), lr=1e-3)
    buffer = TensorDictReplayBuffer(capacity=2_000, batch_size=32, prioritized=True,
                                    alpha=0.6, beta=0.4, seed=0)
    collector = Collector(env, explore, frames_per_batch=100, total_frames=1_000,
                          replay_buffer=buffer, auto_register_policy_transforms=False)
    updates = 0
    for _ in collector:
        for _ in range(4):
            sample = buffer.sample()
            weights = sample["priority_weight"]
            assert weights.shape == (32,) and weights.max() == pytest.approx(1.0)
            loss = loss_module(sample)["loss"]
            # DQNLoss writes td_error [32, 1]; the trailing dim is reduced away.
            assert sample["td_error"].shape == (32, 1)
            td_error = sample["td_error"][:, 0]
            optim.zero_grad()
            loss.backward()
            optim.step()
            target.step()
            assert buffer.update_tensordict_priority(sample) > 0
            stored = buffer.buffer.priorities(sample["index"].numpy())
            # The same index may be drawn twice; its last write wins. The buffer keeps
            # priority ** alpha.
            last = {int(i): float(p) ** 0.6 for i, p in zip(sample["index"], td_error)}
            np.testing.assert_allclose(stored, [last[int(i)] for i in sample["index"]],
                                       rtol=1e-5)
            updates += 1
    collector.shutdown()
    assert updates == 40 and buffer.write_count == 1_000


def test_loss_uses_the_importance_weights():
    env = GymEnv("CartPole-v1")
    actor = QValueActor(MLP(in_features=4, out_features=2, num_cells=[8]),
                        in_keys=["observation"], spec=env.action_spec)
    loss_module = DQNLoss(actor, action_space=env.action_spec, delay_value=False,
                          reduction="none")
    buffer = TensorDictReplayBuffer(capacity=200, batch_size=16, prioritized=True, seed=1)
    collector = Collector(env, None, frames_per_batch=200, total_frames=200,
                          replay_buffer=buffer)
    for _ in collector:
        pass
    collector.shutdown()
    buffer.update_priority(torch.arange(200), torch.linspace(0.1, 5.0, 200))
    sample = buffer.sample()
    weights = sample["priority_weight"]
    assert not torch.allclose(weights, torch.ones(16))
    with torch.no_grad():
        weighted = loss_module(sample.clone())["loss"]
        unweighted = loss_module(sample.clone().exclude("priority_weight"))["loss"]
    assert weighted.shape == (16,)
    torch.testing.assert_close(weighted, unweighted * weights)


def test_wraps_around_keeping_the_newest_items():
    buffer = TensorDictReplayBuffer(capacity=10, batch_size=64, seed=0)
    written = torch.cat([buffer.extend(numbered(0, 7)), buffer.extend(numbered(7, 11)),
                         buffer.extend(numbered(18, 7))])
    assert torch.equal(written, torch.arange(25))
    assert len(buffer) == 10 and buffer.write_count == 25
    sample = buffer.sample()
    assert (sample["index"] >= 15).all()
    assert torch.equal(sample["observation"][:, 0], sample["index"].float())
    assert torch.equal(sample["next", "observation"][:, 0], sample["index"].float() + 1)


def test_index_of_an_overwritten_item_is_ignored():
    buffer = TensorDictReplayBuffer(capacity=4, batch_size=2, prioritized=True, seed=0)
    buffer.extend(numbered(0, 4))
    sample = buffer.sample()
    buffer.extend(numbered(4, 4))  # every sampled item is gone
    assert buffer.update_priority(sample["index"], torch.full((2,), 7.0)) == 0
    np.testing.assert_array_equal(buffer.buffer.priorities(np.arange(4, 8)), 1.0)


def test_ndim_2_takes_env_by_time_batches():
    buffer = TensorDictReplayBuffer(capacity=100, batch_size=8, ndim=2, seed=0)
    data = numbered(0, 12).reshape(3, 4)  # 3 envs x 4 steps
    index = buffer.extend(data)
    assert torch.equal(index, torch.arange(12)) and len(buffer) == 12
    sample = buffer.sample()
    assert torch.equal(sample["observation"][:, 0], sample["index"].float())


def test_add_one_item():
    buffer = TensorDictReplayBuffer(capacity=5, batch_size=1)
    assert buffer.add(numbered(3, 1)[0]) == 0
    assert buffer.sample()["observation"][0, 0] == 3.0


@pytest.mark.parametrize("bad, message", [
    (lambda td: td.set("observation", torch.zeros(4, 2)), r"'observation'.*\(3,\).*\(2,\)"),
    (lambda td: td.set("observation", td["observation"].double()),
     r"'observation'.*float32.*float64"),
    (lambda td: td.exclude(("next", "done")), r"missing \[\"\('next', 'done'\)\"\]"),
    (lambda td: td.set("extra", torch.zeros(4)), r"unexpected \['extra'\]"),
    (lambda td: td.set("index", torch.zeros(4)), r"'index' is what sample\(\) adds"),
])
def test_bad_batches_raise_naming_the_key_and_write_nothing(bad, message):
    buffer = TensorDictReplayBuffer(capacity=10, batch_size=4, seed=0)
    buffer.extend(numbered(0, 4))
    before = buffer.buffer.gather_all()
    with pytest.raises(SpecError, match=message):
        buffer.extend(bad(numbered(4, 4)))
    assert len(buffer) == 4 and buffer.write_count == 4
    after = buffer.buffer.gather_all()
    assert torch.equal(before["observation"], after["observation"])


def test_clear_errors():
    buffer = TensorDictReplayBuffer(capacity=10)
    with pytest.raises(EmptyBufferError, match="empty"):
        buffer.sample(4)
    with pytest.raises(TypeError, match="TensorDict"):
        buffer.extend({"observation": torch.zeros(3)})
    with pytest.raises(SpecError, match="batch dimension"):
        TensorDictReplayBuffer(capacity=10, ndim=2).extend(numbered(0, 3))
    buffer.extend(numbered(0, 3))
    with pytest.raises(ValueError, match="pass batch_size"):
        buffer.sample()
    with pytest.raises(ValueError, match="prioritized=False"):
        buffer.update_priority(torch.arange(2), torch.ones(2))
    prioritized = TensorDictReplayBuffer(capacity=10, prioritized=True)
    prioritized.extend(numbered(0, 3))
    with pytest.raises(ValueError, match="(?i)nan"):
        prioritized.update_priority(torch.arange(3), torch.tensor([1.0, float("nan"), 2.0]))
    np.testing.assert_array_equal(prioritized.buffer.priorities(np.arange(3)), 1.0)
    with pytest.raises(KeyError, match="td_error"):
        prioritized.update_tensordict_priority(prioritized.sample(2))
    with pytest.raises(ValueError, match="capacity"):
        TensorDictReplayBuffer(capacity=0)


def test_empty_keeps_the_spec_and_restarts_counting():
    buffer = TensorDictReplayBuffer(capacity=10, batch_size=2)
    buffer.extend(numbered(0, 6))
    buffer.empty()
    assert len(buffer) == 0 and buffer.write_count == 0
    with pytest.raises(EmptyBufferError):
        buffer.sample()
    buffer.extend(numbered(0, 2))
    assert len(buffer) == 2


def test_dumps_loads_goes_on_with_the_same_draws(tmp_path):
    buffer = TensorDictReplayBuffer(capacity=50, batch_size=8, prioritized=True, seed=3)
    buffer.extend(numbered(0, 30))
    buffer.update_priority(torch.arange(30), torch.linspace(0.5, 3.0, 30))
    buffer.dumps(tmp_path / "rb")
    restored = TensorDictReplayBuffer(capacity=50, batch_size=8, prioritized=True)
    restored.loads(tmp_path / "rb")
    assert len(restored) == 30 and restored.write_count == 30
    for _ in range(3):
        a, b = buffer.sample(), restored.sample()
        assert torch.equal(a["index"], b["index"])
        assert torch.equal(a["priority_weight"], b["priority_weight"])
        assert torch.equal(a["observation"], b["observation"])


@settings(max_examples=40, deadline=None)
@given(capacity=st.integers(1, 12),
       sizes=st.lists(st.integers(1, 9), min_size=1, max_size=8),
       seed=st.integers(0, 2**16))
def test_holds_exactly_the_newest_items_like_a_list(capacity, sizes, seed):
    """Reference model: a Python list of every item written, of which the last
    ``capacity`` are held."""
    buffer = TensorDictReplayBuffer(capacity=capacity, batch_size=16, seed=seed)
    written: list[int] = []
    for size in sizes:
        index = buffer.extend(numbered(len(written), size))
        assert index.tolist() == list(range(len(written), len(written) + size))
        written.extend(range(len(written), len(written) + size))
    held = written[-capacity:]
    assert len(buffer) == len(held) and buffer.write_count == len(written)
    sample = buffer.sample()
    assert set(sample["index"].tolist()) <= set(held)
    assert torch.equal(sample["observation"][:, 0], sample["index"].float())
    assert torch.equal(sample["action"], sample["index"] % 2)
    gathered = buffer.buffer.gather_all()["observation"][0, :, 0]
    assert gathered.tolist() == [float(i) for i in held]
