"""The Ape-X-style Ray demo (``replaybuffer demo --ray --prioritized``): shards that take
steps with their priorities, the actors' initial priorities, the learner's weights, the
comparison plot, and a short run end to end."""

from __future__ import annotations

import functools
import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("gymnasium")
torch = pytest.importorskip("torch")
ray = pytest.importorskip("ray")

import replaybuffer as rb  # noqa: E402
from replaybuffer.cli import main as cli_main  # noqa: E402
from replaybuffer.collect import StepDriver, Trajectory  # noqa: E402
from replaybuffer.distributed import RayReplayBuffer  # noqa: E402
from replaybuffer_demos.apex import (ActorPrioritizedBuffer, annealed_beta,  # noqa: E402
                                     importance_weights, initial_priorities)
from replaybuffer_demos.curve_plot import plot  # noqa: E402
from replaybuffer_demos.dqn_learner import DQNConfig, learner, make_env  # noqa: E402
from replaybuffer_demos.dqn_ray import (Collector, ParameterStore, learning_curve,  # noqa: E402
                                        shard_buffer)

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def cluster():
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


def _spec():
    env = make_env()
    spec = StepDriver(env, lambda obs: np.zeros(len(obs), np.int64)).data_spec
    env.close()
    return spec


def _steps(count: int, seed: int = 0):
    """``count`` consecutive CartPole steps from a random policy, leaves ``[1, count]``."""
    env = make_env()
    rng = np.random.default_rng(seed)
    collected = []
    driver = StepDriver(env, lambda obs: rng.integers(0, 2, len(obs)), [collected.append],
                        num_steps=count, seed=seed)
    while len(collected) < count:
        driver.run()
    env.close()
    return rb.nest.map_structure(lambda *s: np.stack(s, axis=1), *collected[:count])


# ------------------------------------------------------------- shard buffer
def test_add_writes_steps_with_their_priorities():
    buffer = ActorPrioritizedBuffer(_spec(), 50, alpha=0.5, seed=0)
    steps = _steps(12)
    priorities = np.linspace(0.5, 6.0, 12)
    assert buffer.add(steps, priorities) == 12
    assert buffer.last_id == 11
    np.testing.assert_allclose(buffer.priorities(np.arange(12)), priorities ** 0.5)
    buffer.add(_steps(3, seed=1), [4.0, 9.0, 16.0])  # ids go on from the last step
    np.testing.assert_allclose(buffer.priorities(np.arange(12, 15)), [2.0, 3.0, 4.0])


def test_add_after_clear_sets_the_new_steps_priorities():
    buffer = ActorPrioritizedBuffer(_spec(), 50, alpha=1.0, seed=0)
    buffer.add(_steps(5), np.ones(5))
    buffer.clear()
    buffer.add(_steps(4), [2.0, 3.0, 4.0, 5.0])
    # Item ids never repeat: the 5 cleared steps came first.
    np.testing.assert_allclose(buffer.priorities(np.arange(5, 9)), [2.0, 3.0, 4.0, 5.0])
    assert buffer.max_priority == 5.0


@pytest.mark.parametrize("priorities, message", [
    (np.ones(4), r"priorities must be \[T\] for items of T steps .* shape \(4,\)"),
    (np.ones((6, 1)), r"priorities must be \[T\] .* shape \(6, 1\)"),
    ([1.0, 2.0, np.nan, 1.0, 1.0, 1.0], r"priorities\[2\] is nan \(for id 2\)"),
    ([1.0, -1.0, 1.0, 1.0, 1.0, 1.0], r"must be finite and >= 0; priorities\[1\] is -1.0"),
])
def test_bad_priorities_are_refused_and_nothing_is_written(priorities, message):
    buffer = ActorPrioritizedBuffer(_spec(), 50, seed=0)
    with pytest.raises(ValueError, match=message):
        buffer.add(_steps(6), priorities)
    assert buffer.last_id == -1 and len(buffer) == 0 and buffer.max_priority == 1.0
    buffer.add(_steps(6), np.ones(6))  # still usable
    assert buffer.last_id == 5


# ------------------------------------------------------ actors' priorities
def _reference_q(layers):
    def q(obs):
        h = np.asarray(obs, np.float64)
        for k in range(0, len(layers), 2):
            h = h @ layers[k].T + layers[k + 1]
            if k + 2 < len(layers):
                h = np.maximum(h, 0)
        return h
    return q


def test_initial_priorities_are_td_errors_of_the_actors_network():
    rng = np.random.default_rng(3)
    layers = [rng.normal(size=(8, 4)), rng.normal(size=8), rng.normal(size=(2, 8)),
              rng.normal(size=2)]
    q = _reference_q(layers)
    steps = _steps(60, seed=2)  # random play: several episodes end inside
    got = initial_priorities(q, steps, 0.9, 0.01)
    assert got.shape == (59,)
    t = Trajectory(*steps)
    for i in range(59):  # one window at a time, written out
        if t.step_type[0, i] == rb.StepType.LAST:  # a boundary: nothing to learn
            assert got[i] == pytest.approx(0.01)
            continue
        target = t.reward[0, i] + 0.9 * t.discount[0, i] * q(t.observation[0, i + 1]).max()
        td = abs(target - q(t.observation[0, i])[int(t.action[0, i])])
        assert got[i] == pytest.approx(td + 0.01, rel=1e-5)
    assert (got[t.step_type[0, :59] == rb.StepType.LAST] == 0.01).any()  # boundaries seen


@given(st.lists(st.floats(1e-6, 1.0), min_size=1, max_size=40), st.floats(0.0, 1.0))
@settings(max_examples=50, deadline=None)
def test_importance_weights_match_the_definition(probabilities, beta):
    p = np.array(probabilities)
    got = importance_weights(p, beta)
    expected = [(min(probabilities) / x) ** beta for x in probabilities]
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert got.max() == pytest.approx(1.0)


def test_beta_anneals_to_one():
    assert annealed_beta(0.4, 0, 100) == pytest.approx(0.4)
    assert annealed_beta(0.4, 50, 100) == pytest.approx(0.7)
    assert annealed_beta(0.4, 500, 100) == 1.0


@given(st.lists(st.tuples(st.integers(0, 10_000), st.floats(0, 500)), max_size=60),
       st.integers(1, 25))
@settings(max_examples=50, deadline=None)
def test_learning_curve_is_the_moving_average_of_episodes_in_step_order(episodes, window):
    got = learning_curve(episodes, window)
    ordered = sorted(episodes)
    assert [s for s, _ in got] == [s for s, _ in ordered]
    for k, (_, value) in enumerate(got):
        last = [r for _, r in ordered[max(0, k + 1 - window):k + 1]]
        assert value == pytest.approx(sum(last) / len(last))


# ------------------------------------------------------------------- plot
def _result_json(seed, run, prioritized, curve, evaluations, last):
    return {"config": {"seed": seed, "prioritized": prioritized}, "run": run,
            "curve": curve, "evaluations": evaluations, "last_network_return": last,
            "final_return": last, "best_step": evaluations[-1][0]}


def test_the_plot_draws_both_runs(tmp_path, monkeypatch):
    import matplotlib.axes

    drawn = []
    original = matplotlib.axes.Axes.plot

    def spy(self, *args, **kwargs):
        drawn.append(kwargs.get("label"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    ray_run = _result_json(0, "2 Ray actors", True, [(100, 20.0), (900, 60.0)],
                           [(500, 30.0), (1000, 80.0)], 80.0)
    single = _result_json(0, "single process", False, [(50, 10.0), (800, 90.0)],
                          [(500, 40.0), (1000, 120.0)], 120.0)
    plot(ray_run, tmp_path / "both.png", single)
    assert (tmp_path / "both.png").read_bytes()[:8] == PNG
    assert drawn == ["2 Ray actors, prioritized: training return (last 20 episodes)",
                     "2 Ray actors, prioritized: greedy evaluation",
                     "single process, uniform: training return (last 20 episodes)",
                     "single process, uniform: greedy evaluation"]


# ------------------------------------------------------- on a Ray cluster
def test_actors_send_their_priorities_to_the_shards(cluster):
    """Collectors alone (no learner updates priorities): a sample's probabilities are
    those of the collectors' |TD errors| under the network they act with."""
    config = DQNConfig(hidden=(16,), prioritized=True, alpha=0.7, priority_epsilon=0.01)
    spec, _, q_net, _, _, ratio = learner(config)
    factory = functools.partial(shard_buffer, spec, 400, ratio, 50, ratio * 256, config)
    buffer = RayReplayBuffer(factory, 2, seed=0)
    store = ray.remote(num_cpus=0)(ParameterStore).remote()
    layers = [p.detach().numpy().copy() for p in q_net.parameters()]
    ray.get(store.publish.remote(1, layers))
    collectors = [ray.remote(num_cpus=0)(Collector).remote(buffer.writer(i), store, config,
                                                           2, i) for i in range(2)]
    try:
        assert min(ray.get([c.run.remote(100) for c in collectors], timeout=120)) >= 100
        items, info = buffer.get_next(256, 2)
    finally:
        for c in collectors:
            ray.kill(c)
        buffer.close()
    t = Trajectory(*items)
    q = _reference_q([np.asarray(x, np.float64) for x in layers])
    valid = t.step_type[:, 0] != rb.StepType.LAST
    target = t.reward[:, 0] + config.gamma * t.discount[:, 0] * q(t.observation[:, 1]).max(1)
    taken = q(t.observation[:, 0])[np.arange(256), t.action[:, 0]]
    priority = np.abs(target - taken) * valid + config.priority_epsilon
    # P(i) is proportional to priority ** alpha over the whole buffer: the ratio of any
    # two sampled windows' probabilities is that of their priorities ** alpha.
    np.testing.assert_allclose(info.probabilities / info.probabilities[0],
                               (priority / priority[0]) ** config.alpha, rtol=1e-3)
    assert np.ptp(info.probabilities) > 0  # not all at the largest priority


def test_a_short_ape_x_run_trains_and_plots_beside_another_run(cluster, tmp_path, capsys,
                                                               monkeypatch):
    import replaybuffer_demos.dqn as dqn

    single = _result_json(0, "single process", True, [(300, 15.0), (1400, 30.0)],
                          [(1500, 25.0)], 25.0)
    (tmp_path / "single.json").write_text(json.dumps(single))
    out = tmp_path / "apex"
    runs, real = [], dqn.train_ray

    def train_ray(config, num_collectors, progress):  # the real one, its network kept
        runs.append((config, num_collectors) + real(config, num_collectors, progress=progress))
        return runs[-1][2:]

    monkeypatch.setattr(dqn, "train_ray", train_ray)
    assert cli_main(["demo", "--ray", "--actors", "2", "--prioritized", "--steps", "1500",
                     "--seed", "1", "--out", str(out), "--no-progress",
                     "--compare", str(tmp_path / "single.json")]) == 0
    assert "greedy evaluation over 10 episodes" in capsys.readouterr().out
    result = json.loads((out / "result.json").read_text())
    assert result["run"] == "2 Ray actors" and result["config"]["prioritized"]
    assert result["steps_trained"] >= 1000 and result["gradient_steps"] > 0
    assert result["evaluations"][-1][0] == result["steps_trained"]
    assert result["curve"] and all(s <= 1600 for s, _ in result["curve"])
    png = (out / "learning_curve.png").read_bytes()
    assert png[:8] == PNG and len(png) > 10_000
    (config, num_collectors, _, q_net), = runs
    assert num_collectors == 2 and config.prioritized
    untrained = learner(config).q_net  # seeded as the run's network started
    moved = [not torch.equal(a, b) for a, b in zip(q_net.parameters(), untrained.parameters())]
    assert all(moved)  # gradient steps changed every layer


@pytest.mark.parametrize("text, message", [
    ("[1, 2]", r"x.json is not a demo's result.json \(expected an object with config, "
               r"last_network_return and evaluations, got list\)"),
    ('{"config": {}}', r"got \['config'\]"),
    ("{not json", r"x.json is not a demo's result.json .* it is not JSON"),
])
def test_compare_must_be_a_result_json(tmp_path, text, message):
    from replaybuffer_demos.dqn import main

    (tmp_path / "x.json").write_text(text)
    with pytest.raises(ValueError, match=message):
        main(steps=10, out=str(tmp_path / "out"), compare=str(tmp_path / "x.json"))
    assert not (tmp_path / "out").exists()  # refused before training


def test_compare_names_a_missing_file(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli_main(["demo", "--compare", str(tmp_path / "nope.json"), "--out", str(tmp_path)])
    assert exit_.value.code == 2
    assert "argument --compare: no such file: " in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
