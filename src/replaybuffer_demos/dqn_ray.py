"""The DQN demo on Ray: ``replaybuffer demo --ray [--actors N]``.

Collectors are Ray actors (:class:`Collector`): each steps its own CartPole with a
:class:`~replaybuffer.collect.StepDriver` and an epsilon-greedy numpy copy of the
Q-network, and writes its trajectories, 32 steps per ``extend``, into one shard of a
:class:`~replaybuffer.distributed.RayReplayBuffer` through a
:class:`~replaybuffer.distributed.ShardWriter` (one shard per collector, so each
shard holds whole sequences). Each shard's buffer carries a
:class:`~replaybuffer.SampleToInsertRatio` at the single-process demo's ratio, so the
collectors wait for the learner and the learner for data. The learner (this process)
samples two-step windows across the shards and trains as
:func:`replaybuffer_demos.dqn.train` does; it publishes its parameters to a small
:class:`ParameterStore` actor after every ``target_update`` gradient steps, and collectors
pick them up every 32 steps.

With ``--prioritized`` it is an Ape-X-style run (:mod:`replaybuffer_demos.apex`): each
shard is an :class:`~replaybuffer_demos.apex.ActorPrioritizedBuffer`, each collector
sends its steps with initial priorities (``|TD error|`` from its copy of the network,
which is why it sends a chunk once it has seen the step after it), and the learner
weights its loss by importance weights (beta annealed to 1 over the run) and sets the
priorities of the windows it sampled to its own ``|TD error|`` without waiting for the
shards (as Ape-X's learner does). Reads and writes go through
:mod:`replaybuffer_demos.shard_traffic`: the learner draws its batches through a
stream that samples ahead while it trains.

Collectors report each episode's return to the parameter store as it ends; the
learner's ``curve`` is their average over the last 20 episodes at each episode's end
(the run's step counted as the collector's steps times the collectors, its epsilon
clock).
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any, Callable

import numpy as np

from replaybuffer import nest
from replaybuffer.collect import AverageReturn, StepDriver
from replaybuffer.protocols import BufferInfo
from replaybuffer_demos.actor_policy import EpsilonGreedyMLP
from replaybuffer_demos.apex import (ActorPrioritizedBuffer, annealed_beta,
                                     importance_weights, initial_priorities)
from replaybuffer_demos.dqn_learner import (DQNConfig, DQNResult, Selection,
                                            decay_learning_rate, gradient_step, learner,
                                            make_env, progress_bar)
from replaybuffer_demos.shard_traffic import sample_stream, send_priorities, send_steps

CHUNK = 32
"""Steps a collector sends per ``extend`` (and between parameter checks)."""


class ParameterStore:
    """The learner's latest parameters, versioned, and the collectors' episode returns
    (a Ray actor)."""

    def __init__(self) -> None:
        self.version = 0
        self.parameters: list[np.ndarray] | None = None
        self.stopped = False
        self.returns: list[tuple[int, float]] = []

    def publish(self, version: int, parameters: list[np.ndarray]) -> None:
        self.version, self.parameters = version, parameters

    def newer(self, version: int) -> tuple[int, list[np.ndarray] | None, bool]:
        """``(version, parameters or None if not newer than version, stopped)``."""
        fresh = self.parameters if self.version > version else None
        return self.version, fresh, self.stopped

    def stop(self) -> None:
        self.stopped = True

    def report(self, episodes: list[tuple[int, float]]) -> None:
        """Collectors' ``(run's step, return)`` of episodes that ended."""
        self.returns.extend(episodes)

    def episodes(self) -> list[tuple[int, float]]:
        return self.returns


class _RemoteWeights:
    """``read()`` for :class:`EpsilonGreedyMLP` from a :class:`ParameterStore`, asked
    once every :data:`CHUNK` calls (a round trip per env step would cost more than
    the step)."""

    def __init__(self, store: Any):
        self.store, self.version, self.calls, self.stopped = store, 0, 0, False

    def read(self) -> list[np.ndarray] | None:
        import ray

        self.calls += 1
        if self.calls % CHUNK != 1 and self.version:
            return None
        version, parameters, self.stopped = ray.get(self.store.newer.remote(self.version))
        if parameters is not None:
            self.version = version
        fresh: list[np.ndarray] | None = parameters
        return fresh


class Collector:
    """One collector (a Ray actor): env, policy and a writer to one shard.

    It sends its steps :data:`CHUNK` at a time; with ``config.prioritized``, each with
    its initial priority (:func:`~replaybuffer_demos.apex.initial_priorities`), so a
    chunk leaves once the step after it is known (that step starts the next chunk)."""

    def __init__(self, writer: Any, store: Any, config: DQNConfig, num_collectors: int,
                 index: int):
        self.env = make_env()
        self.weights = _RemoteWeights(store)
        self.store = store
        self.steps = 0
        num_actions = int(self.env.single_action_space.n)
        self.num_collectors = num_collectors
        self.config = config
        self.policy = EpsilonGreedyMLP(self.weights, self._run_steps, config, num_actions,
                                       index)
        self.writer = writer
        self.chunk: list[Any] = []
        self.returns = AverageReturn(window=CHUNK)  # more than a chunk's episodes
        self.driver = StepDriver(self.env, self.policy, [self._observe, self.returns],
                                 num_steps=CHUNK, seed=config.seed * 100 + index)

    def _run_steps(self) -> int:
        """The run's steps so far, as this collector estimates them (its own times
        the collectors): epsilon's clock."""
        return self.steps * self.num_collectors

    def _observe(self, trajectory: Any) -> None:
        self.chunk.append(trajectory)
        self.steps += 1
        lookahead = 1 if self.config.prioritized else 0
        if len(self.chunk) == CHUNK + lookahead:
            self._send(CHUNK)

    def _send(self, count: int) -> None:
        """Send the first ``count`` steps of the chunk (leaves ``[1, count, ...]``)."""
        if not count:
            return
        stacked = nest.map_structure(lambda *steps: np.stack(steps, axis=1), *self.chunk)
        priorities = None
        if self.config.prioritized:
            # The last step has no successor yet when the run ends: it gets the
            # chunk's largest priority.
            known = initial_priorities(self.policy.q_values, stacked, self.config.gamma,
                                       self.config.priority_epsilon)
            tail = [known.max() if len(known) else 1.0] * (count - len(known))
            priorities = np.concatenate([known, tail])[:count]
        send_steps(self.writer, nest.map_structure(lambda x: x[:, :count], stacked),
                   priorities)
        self.chunk = self.chunk[count:]

    def _report_episodes(self, seen: int) -> None:
        """Send the store the returns of the episodes that ended since ``seen``."""
        new = min(self.returns.episodes - seen, len(self.returns.values))
        if new:
            values = list(self.returns.values)[len(self.returns.values) - new:]
            self.store.report.remote([(self._run_steps(), v) for v in values])

    def run(self, steps: int) -> int:
        """Collect until ``steps`` were taken or the learner says stop (then the steps
        not sent yet are dropped: nobody samples them); returns the steps taken."""
        while self.steps < steps and not self.weights.stopped:
            seen = self.returns.episodes
            self.driver.run()
            self._report_episodes(seen)
        if not self.weights.stopped:
            self._send(len(self.chunk))
            self.writer.flush()
        return self.steps


def shard_buffer(spec: Any, max_length: int, ratio: float, min_size: int,
                 error_buffer: float, prioritized_config: DQNConfig | None = None) -> Any:
    """One shard's buffer, paced by a SampleToInsertRatio: uniform, or with
    ``prioritized_config`` (the run's configuration: its alpha) an
    :class:`~replaybuffer_demos.apex.ActorPrioritizedBuffer`."""
    import replaybuffer as rb

    limiter = rb.SampleToInsertRatio(ratio, min_size, error_buffer)
    if prioritized_config is not None:
        return ActorPrioritizedBuffer(spec, max_length, alpha=prioritized_config.alpha, seed=0,
                                      rate_limiter=limiter)
    return rb.UniformReplayBuffer(spec, 1, max_length, seed=0, rate_limiter=limiter)


def learning_curve(episodes: list[tuple[int, float]], window: int = 20
                   ) -> list[tuple[int, float]]:
    """``(step, average return of the last window episodes)`` at each episode's end,
    from ``(step, return)`` pairs in any order."""
    ordered = sorted(episodes)
    returns = np.array([r for _, r in ordered], np.float64)
    sums = np.concatenate([[0.0], np.cumsum(returns)])
    ends = np.arange(1, len(ordered) + 1)
    starts = np.maximum(0, ends - window)
    means = (sums[ends] - sums[starts]) / (ends - starts)
    return [(step, float(m)) for (step, _), m in zip(ordered, means)]


def _close_when_done(runs: list[Any], stop: threading.Event,
                     stream: Callable[[], Any]) -> None:
    """Close the learner's ``stream()`` once every collector's run has returned (a
    rate-limited draw would wait for inserts that never come)."""
    import ray

    while not stop.is_set():
        if len(ray.wait(runs, num_returns=len(runs), timeout=0.5)[0]) == len(runs):
            stream().close()
            return


def train_ray(config: DQNConfig, num_collectors: int = 2, progress: bool = True,
              on_eval: Callable[[int, float], None] | None = None
              ) -> tuple[DQNResult, Any]:
    """Train a DQN from ``num_collectors`` Ray collector actors into as many shards
    (prioritized ones, Ape-X style, with ``config.prioritized``); returns the result and
    the selected Q-network."""
    import ray

    from replaybuffer.distributed import RayReplayBuffer

    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    spec, _, q_net, target_net, optimizer, ratio = learner(config)
    factory = functools.partial(shard_buffer, spec, config.buffer_length // num_collectors,
                                ratio, max(1, config.learning_starts // num_collectors),
                                ratio * config.collect_steps,
                                config if config.prioritized else None)
    buffer = RayReplayBuffer(factory, num_collectors, seed=config.seed)
    # Actor handles: their methods are looked up remotely (ray types them loosely).
    store: Any = ray.remote(num_cpus=0)(ParameterStore).remote()
    version = 0

    def publish() -> None:
        nonlocal version
        version += 1
        ray.get(store.publish.remote(version, [p.detach().numpy().copy()
                                               for p in q_net.parameters()]))

    def inserted_steps() -> int:
        return sum(d["last_id"] + 1 for d in buffer.describe() if d is not None)

    publish()
    collector_class: Any = ray.remote(num_cpus=0)(Collector)
    collectors = [collector_class.remote(buffer.writer(i), store, config, num_collectors, i)
                  for i in range(num_collectors)]
    share = -(-config.steps // num_collectors)
    runs = [c.run.remote(share) for c in collectors]
    bar = progress_bar(config.steps, progress)
    start = time.perf_counter()
    selection = Selection(config, on_eval)
    gradient_steps = inserted = 0
    gradient_total = (config.steps // config.collect_steps) * config.gradient_steps
    stream: Any = None
    stop_watching = threading.Event()
    watcher = threading.Thread(target=_close_when_done, args=(runs, stop_watching,
                                                              lambda: stream), daemon=True)
    try:
        # The shards' limiters fill first (a run shorter than that: until it ends).
        while inserted < min(config.learning_starts, config.steps) and \
                len(ray.wait(runs, num_returns=len(runs), timeout=0.1)[0]) < len(runs):
            inserted = inserted_steps()
        bar.update(inserted)
        stream = sample_stream(buffer, config.sample_batch_size, 2)  # once there is data
        watcher.start()
        for trajectories, info in stream:  # ends when every collector has finished
            if config.prioritized:
                beta = annealed_beta(config.beta, gradient_steps, gradient_total)
                info = BufferInfo(info.ids, info.probabilities,
                                  importance_weights(info.probabilities, beta))
            td = gradient_step(q_net, target_net, optimizer, trajectories, info,
                               config.gamma)
            if config.prioritized:
                send_priorities(buffer, info.ids, td + config.priority_epsilon)
            gradient_steps += 1
            if gradient_steps % config.target_update == 0:
                target_net.load_state_dict(q_net.state_dict())
                publish()
                decay_learning_rate(optimizer, config, inserted)
                now = inserted_steps()
                bar.update(now - inserted)
                inserted = now
                selection.after(q_net, inserted)
                bar.set_postfix(best=f"{selection.best[0]:.0f}", grad=gradient_steps)
                if inserted >= config.steps or selection.stopped_early:
                    break
        inserted = inserted_steps()
        if not selection.stopped_early:
            selection.finish(q_net, inserted)
        bar.close()
        curve = learning_curve(ray.get(store.episodes.remote()))
        return selection.result(q_net, inserted, time.perf_counter() - start, curve,
                                gradient_steps)
    finally:
        stop_watching.set()
        if watcher.is_alive():
            watcher.join()
        if stream is not None:
            stream.close()
        ray.get(store.stop.remote())
        # A collector may wait on its shard's rate limiter now that nobody samples.
        ray.wait(runs, num_returns=len(runs), timeout=2)
        for collector in collectors:
            ray.kill(collector)
        buffer.close()
        if started_ray:
            ray.shutdown()
