"""The DQN demo with N actor processes: ``replaybuffer demo --actors N``.

Each actor (:class:`~replaybuffer.collect.actors.ActorPool`) steps its own CartPole
with an epsilon-greedy policy and writes its trajectories straight into a
:class:`~replaybuffer.distributed.SharedReplayBuffer` (one row per actor); the learner,
in the main process, samples two-step windows from it and trains as
:func:`replaybuffer_demos.dqn.train` does. A :class:`~replaybuffer.SampleToInsertRatio`
keeps the single-process demo's ratio (``gradient_steps * sample_batch_size /
collect_steps`` sampled items per inserted step), so actors wait for the learner
instead of filling the buffer with stale-policy data, and the learner waits for data.

With ``config.prioritized`` the shared buffer is prioritized: steps enter at the
largest priority seen (the actors send none), the learner weights its loss by importance
weights with beta annealed to 1 over the run and sets the priorities of what it drew to
its ``|TD error|``, as the single-process demo does.

Actors act with a numpy copy of the Q-network (:class:`PolicyWeights`: the learner
publishes its parameters to shared memory after every ``target_update`` gradient
steps; an actor picks up a new version between steps, never half of one). Epsilon
follows the whole run's inserted steps, read from the buffer's shared counters.
"""

from __future__ import annotations

import os
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable

import numpy as np

from replaybuffer.collect.actors import ActorPool
from replaybuffer.distributed import SharedReplayBuffer
from replaybuffer.protocols import BufferInfo
from replaybuffer.rate_limiter import RateLimitedError, SampleToInsertRatio
from replaybuffer.storage.mmap_storage import map_npy
from replaybuffer_demos.actor_policy import EpsilonGreedyMLP
from replaybuffer_demos.apex import annealed_beta, importance_weights
from replaybuffer_demos.dqn_learner import (DQNConfig, DQNResult, Selection,
                                            decay_learning_rate, gradient_step, learner,
                                            make_env, progress_bar)


class PolicyWeights:
    """An MLP's parameters in shared memory, published whole and read whole.

    ``version`` is odd while the learner writes; a reader copies the parameters and
    keeps the copy only if the version was even and unchanged around it.

    Args:
        directory: where the two ``.npy`` files are (the shared buffer's directory).
        shapes: the parameters' shapes, in ``q_net.parameters()`` order.
        create: make the files (the learner) or map them (actors).
    """

    def __init__(self, directory: str | os.PathLike[str], shapes: list[tuple[int, ...]],
                 create: bool):
        self._args = (str(directory), shapes)
        size = int(sum(np.prod(s) for s in shapes))
        self._vector = map_npy(Path(directory) / "policy.npy", (size,), np.dtype(np.float32),
                               create).view(np.ndarray)
        self._version = map_npy(Path(directory) / "policy_version.npy", (1,),
                                np.dtype(np.int64), create).view(np.ndarray)
        self._shapes = shapes
        self._seen = -1

    def __reduce__(self) -> tuple[Any, ...]:
        return PolicyWeights, self._args + (False,)

    def publish(self, parameters: list[np.ndarray]) -> None:
        self._version[0] += 1
        self._vector[:] = np.concatenate([p.ravel() for p in parameters])
        self._version[0] += 1

    def read(self) -> list[np.ndarray] | None:
        """The parameters if a version newer than the last read is whole, else None."""
        version = int(self._version[0])
        if version % 2 or version == self._seen:
            return None
        vector = self._vector.copy()
        if int(self._version[0]) != version:
            return None
        self._seen = version
        out, offset = [], 0
        for shape in self._shapes:
            size = int(np.prod(shape))
            out.append(vector[offset:offset + size].reshape(shape))
            offset += size
        return out


def inserted_steps(buffer: SharedReplayBuffer) -> int:
    """Steps every actor inserted so far (the buffer's shared limiter counters)."""
    stats = buffer.stats()
    return 0 if stats is None else stats.inserts


def train_actors(config: DQNConfig, num_actors: int, progress: bool = True,
                 on_eval: Callable[[int, float], None] | None = None
                 ) -> tuple[DQNResult, Any]:
    """Train a DQN from ``num_actors`` actor processes; returns the result (``curve``
    empty: returns are seen by the actors) and the selected Q-network."""
    spec, num_actions, q_net, target_net, optimizer, ratio = learner(config)
    limiter = SampleToInsertRatio(ratio, config.learning_starts,
                                  error_buffer=ratio * config.collect_steps)
    buffer = SharedReplayBuffer(spec, num_actors, config.buffer_length // num_actors,
                                prioritized=config.prioritized, alpha=config.alpha,
                                rate_limiter=limiter, seed=config.seed)
    gradient_total = (config.steps // config.collect_steps) * config.gradient_steps
    weights = PolicyWeights(buffer.path, [tuple(p.shape) for p in q_net.parameters()],
                            create=True)

    def publish() -> None:
        weights.publish([p.detach().numpy() for p in q_net.parameters()])

    publish()
    bar = progress_bar(config.steps, progress)
    start = time.perf_counter()
    selection = Selection(config, on_eval)
    gradient_steps = 0
    inserted = 0
    policy = partial(EpsilonGreedyMLP, weights, partial(inserted_steps, buffer), config,
                     num_actions)
    pool = ActorPool(buffer, make_env, policy, num_actors, seed=config.seed)
    try:
        with pool:
            while inserted < config.steps and not selection.stopped_early:
                try:
                    trajectories, info = buffer.get_next(config.sample_batch_size, 2,
                                                         timeout=0.5)
                except RateLimitedError:
                    pool.check()
                else:
                    if config.prioritized:
                        beta = annealed_beta(config.beta, gradient_steps, gradient_total)
                        info = BufferInfo(info.ids, info.probabilities,
                                          importance_weights(info.probabilities, beta))
                    td = gradient_step(q_net, target_net, optimizer, trajectories, info,
                                       config.gamma)
                    if config.prioritized:
                        buffer.update_priorities(info.ids, td + config.priority_epsilon)
                    gradient_steps += 1
                    if gradient_steps % config.target_update == 0:
                        target_net.load_state_dict(q_net.state_dict())
                        publish()
                        decay_learning_rate(optimizer, config, inserted)
                stats = buffer.stats()
                assert stats is not None
                bar.update(stats.inserts - inserted)
                inserted = stats.inserts
                selection.after(q_net, inserted)
                bar.set_postfix(best=f"{selection.best[0]:.0f}", grad=gradient_steps)
        bar.close()
        return selection.result(q_net, inserted, time.perf_counter() - start, [],
                                gradient_steps)
    finally:
        buffer.close()
