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
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

import numpy as np

from replaybuffer.collect import StepDriver
from replaybuffer.rate_limiter import RateLimitedError
from replaybuffer_demos.actor_policy import EpsilonGreedyMLP
from replaybuffer_demos.dqn_learner import (DQNConfig, DQNResult, Selection,
                                            decay_learning_rate, gradient_step, learner,
                                            make_env, progress_bar)

CHUNK = 32
"""Steps a collector sends per ``extend`` (and between parameter checks)."""


class ParameterStore:
    """The learner's latest parameters, versioned (a Ray actor)."""

    def __init__(self) -> None:
        self.version = 0
        self.parameters: list[np.ndarray] | None = None
        self.stopped = False

    def publish(self, version: int, parameters: list[np.ndarray]) -> None:
        self.version, self.parameters = version, parameters

    def newer(self, version: int) -> tuple[int, list[np.ndarray] | None, bool]:
        """``(version, parameters or None if not newer than version, stopped)``."""
        fresh = self.parameters if self.version > version else None
        return self.version, fresh, self.stopped

    def stop(self) -> None:
        self.stopped = True


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
    """One collector (a Ray actor): env, policy and a writer to one shard."""

    def __init__(self, writer: Any, store: Any, config: DQNConfig, num_collectors: int,
                 index: int):
        from replaybuffer import nest

        self.env = make_env()
        self.weights = _RemoteWeights(store)
        self.steps = 0
        num_actions = int(self.env.single_action_space.n)
        self.num_collectors = num_collectors
        policy = EpsilonGreedyMLP(self.weights, self._run_steps, config, num_actions, index)
        self.writer, self.nest = writer, nest
        self.chunk: list[Any] = []
        self.driver = StepDriver(self.env, policy, [self._observe], num_steps=CHUNK,
                                 seed=config.seed * 100 + index)

    def _run_steps(self) -> int:
        """The run's steps so far, as this collector estimates them (its own times
        the collectors): epsilon's clock."""
        return self.steps * self.num_collectors

    def _observe(self, trajectory: Any) -> None:
        self.chunk.append(trajectory)
        self.steps += 1
        if len(self.chunk) == CHUNK:  # [1, CHUNK, ...] per leaf
            leaves = [self.nest.flatten(t)[0] for t in self.chunk]
            structure = self.nest.flatten(self.chunk[0])[1]
            self.writer.extend(structure.unflatten([np.stack(group, axis=1)
                                                    for group in zip(*leaves)]))
            self.chunk = []

    def run(self, steps: int) -> int:
        """Collect until ``steps`` were taken or the learner says stop."""
        while self.steps < steps and not self.weights.stopped:
            self.driver.run()
        self.writer.flush()
        return self.steps


def shard_buffer(spec: Any, max_length: int, ratio: float, min_size: int,
                 error_buffer: float) -> Any:
    """One shard's buffer: uniform, paced by a SampleToInsertRatio."""
    import replaybuffer as rb

    buffer = rb.UniformReplayBuffer(spec, 1, max_length, seed=0)
    buffer.rate_limiter = rb.SampleToInsertRatio(ratio, min_size, error_buffer)
    return buffer


def train_ray(config: DQNConfig, num_collectors: int = 2, progress: bool = True,
              on_eval: Callable[[int, float], None] | None = None
              ) -> tuple[DQNResult, Any]:
    """Train a DQN from ``num_collectors`` Ray collector actors into as many shards."""
    import ray

    from replaybuffer.distributed import RayReplayBuffer

    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    spec, _, q_net, target_net, optimizer, ratio = learner(config)
    factory = functools.partial(shard_buffer, spec, config.buffer_length // num_collectors,
                                ratio, max(1, config.learning_starts // num_collectors),
                                ratio * config.collect_steps)
    buffer = RayReplayBuffer(factory, num_collectors, seed=config.seed)
    # Actor handles: their methods are looked up remotely (ray types them loosely).
    store: Any = ray.remote(num_cpus=0)(ParameterStore).remote()
    version = 0

    def publish() -> None:
        nonlocal version
        version += 1
        ray.get(store.publish.remote(version, [p.detach().numpy().copy()
                                               for p in q_net.parameters()]))

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
    try:
        while inserted < config.learning_starts:  # the shards' limiters fill first
            time.sleep(0.1)
            inserted = sum(d["last_id"] + 1 for d in buffer.describe() if d is not None)
        bar.update(inserted)
        while inserted < config.steps and not selection.stopped_early:
            if not ray.wait(runs, num_returns=len(runs), timeout=0)[1]:
                break  # every collector finished its share
            try:  # short waits: the loop must see collectors end
                trajectories, info = buffer.get_next(config.sample_batch_size, 2,
                                                     timeout=1.0)
            except RateLimitedError:
                continue
            gradient_step(q_net, target_net, optimizer, trajectories, info, config.gamma)
            gradient_steps += 1
            if gradient_steps % config.target_update == 0:
                target_net.load_state_dict(q_net.state_dict())
                publish()
                decay_learning_rate(optimizer, config, inserted)
                now = sum(d["last_id"] + 1 for d in buffer.describe() if d is not None)
                bar.update(now - inserted)
                inserted = now
                selection.after(q_net, inserted)
                bar.set_postfix(best=f"{selection.best[0]:.0f}", grad=gradient_steps)
        inserted = sum(d["last_id"] + 1 for d in buffer.describe() if d is not None)
        if not selection.stopped_early:
            selection.finish(q_net, inserted)
        bar.close()
        return selection.result(q_net, inserted, time.perf_counter() - start, [])
    finally:
        ray.get(store.stop.remote())
        # A collector may wait on its shard's rate limiter now that nobody samples.
        ray.wait(runs, num_returns=len(runs), timeout=10)
        for collector in collectors:
            ray.kill(collector)
        buffer.close()
        if started_ray:
            ray.shutdown()
