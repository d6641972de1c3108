"""Pearl's buffers tutorial (LondonNode/Pearl-tutorials, 2_Buffers.ipynb) in our API.

Run: ``python examples/pearl_tutorial.py`` (needs gymnasium and torch; a few seconds).

The tutorial walks through Pearl's ``BaseBuffer``, ``ReplayBuffer``, ``RolloutBuffer``
and ``HERBuffer``. Every name it imports lives in ``replaybuffer.compat.pearl``; a port
changes these lines and nothing else of the buffer code:

=====================================================  =====================================================
Pearl's tutorial                                       here
=====================================================  =====================================================
``from pearll.buffers import BaseBuffer``              ``from replaybuffer.compat.pearl import BaseBuffer``
``from pearll.buffers import ReplayBuffer``            ``from replaybuffer.compat.pearl import ReplayBuffer``
``from pearll.buffers import RolloutBuffer``           ``from replaybuffer.compat.pearl import RolloutBuffer``
``from pearll.buffers import HERBuffer``               ``from replaybuffer.compat.pearl import HERBuffer``
``from pearll.common.type_aliases import``             ``from replaybuffer.compat.pearl import``
``Observation, Trajectories``                          ``Observation, Trajectories``
``from pearll.common.enumerations import``             ``from replaybuffer.compat.pearl import``
``TrajectoryType``                                     ``TrajectoryType``
``import gym``                                         ``import gymnasium as gym``
``obs = env.reset()``                                  ``obs, _ = env.reset()``
``next_obs, reward, done, _ = env.step(action)``       ``next_obs, reward, terminated, truncated, _ =``
                                                       ``env.step(action)``
``buffer.add_trajectory(obs, action, reward,``         ``buffer.add_trajectory(obs, action, reward,``
``next_obs, done)``                                    ``next_obs, terminated, truncated)``
=====================================================  =====================================================

(``add_trajectory(..., done)`` with one flag still works: it is taken as termination.)
The rest are the fixes listed in that module's docstring. Each section then shows the
native buffer underneath (``buffer.core``).
"""

from __future__ import annotations

from typing import Any, Union

import gymnasium as gym
import numpy as np
from gymnasium import spaces

import replaybuffer as rb
from replaybuffer.compat.pearl import (BaseBuffer, HERBuffer, Observation, ReplayBuffer,
                                       RolloutBuffer, Trajectories, TrajectoryType)

np.set_printoptions(precision=4, suppress=True)


def show(i: int, t: Trajectories) -> None:
    print(f"{i}. Trajectories(observations={t.observations}, actions={t.actions}, "
          f"rewards={t.rewards}, next_observations={t.next_observations}, dones={t.dones})")


# ---------------------------------------------------------------- Base Buffer
print("# Base Buffer\n")


class YourBuffer(BaseBuffer):
    """The tutorial's skeleton. ``BaseBuffer.__init__`` builds the storage from the env
    (``self.core``) and checks that it fits in memory; the helpers ``_add``, ``_last``,
    ``_all`` and ``_output`` do Pearl's shaping."""

    def __init__(self, env: gym.Env, buffer_size: int, device: Any = "auto") -> None:
        super().__init__(env, buffer_size, device)

    def reset(self) -> None:
        super().reset()

    def add_trajectory(self, observation: Observation, action: Union[np.ndarray, int],
                       reward: Union[float, np.ndarray], next_observation: Observation,
                       done: Union[bool, np.ndarray], truncated: Any = None) -> None:
        self._add(observation, action, reward, next_observation, done, truncated)

    def sample(self, batch_size: int, flatten_env: bool = False,
               dtype: Union[str, TrajectoryType] = "numpy") -> Trajectories:
        return self._last(batch_size, flatten_env, dtype)  # a toy: the newest ones

    def last(self, batch_size: int, flatten_env: bool = False,
             dtype: Union[str, TrajectoryType] = "numpy") -> Trajectories:
        return self._last(batch_size, flatten_env, dtype)

    def all(self, flatten_env: bool = False,
            dtype: Union[str, TrajectoryType] = "numpy") -> Trajectories:
        return self._all(flatten_env, dtype)


env = gym.make("CartPole-v1")
buffer = YourBuffer(env=env, buffer_size=10)
print(f"The environment has action space {env.action_space} and Box observation space "
      f"shape {env.observation_space.shape}\n")
print(f"Buffer observation array shape = {buffer.observations.shape}")
print(f"Buffer action array shape = {buffer.actions.shape}")
print(f"Buffer reward array shape = {buffer.rewards.shape}")
print(f"Buffer done array shape = {buffer.dones.shape}")

# ---------------------------------------------------------------- Replay Buffer
print("\n# Replay Buffer\n")
env = gym.make("CartPole-v1")
buffer = ReplayBuffer(env=env, buffer_size=5, seed=0)
print("Environment trajectories in order:")
obs, _ = env.reset(seed=0)
env.action_space.seed(0)
for i in range(5):
    action = env.action_space.sample()
    next_obs, reward, terminated, truncated, _ = env.step(action)
    buffer.add_trajectory(obs, action, reward, next_obs, terminated, truncated)
    show(i + 1, Trajectories(obs, action, reward, next_obs, terminated))
    obs = next_obs
trajectories = buffer.sample(batch_size=5, dtype="numpy")
print("\nSampled trajectories are randomly indexed:")
for i in range(5):
    show(i + 1, Trajectories(trajectories.observations[i], trajectories.actions[i],
                             trajectories.rewards[i], trajectories.next_observations[i],
                             trajectories.dones[i]))
print(f"\nShapes: observations {tuple(trajectories.observations.shape)}, actions "
      f"{tuple(trajectories.actions.shape)}, rewards {tuple(trajectories.rewards.shape)}")
print(f"Stored once: {buffer.observations.shape[0]} observations hold all 5 transitions; "
      f"the native buffer is {buffer.core!r}")

# Vector envs: an env axis first, or flattened.
venv = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
vbuffer = ReplayBuffer(env=venv, buffer_size=10, seed=0)
obs, _ = venv.reset(seed=0)
for _ in range(10):
    action = venv.action_space.sample()
    next_obs, reward, terminated, truncated, _ = venv.step(action)
    vbuffer.add_trajectory(obs, action, reward, next_obs, terminated, truncated)
    obs = next_obs
last = vbuffer.last(5, dtype="numpy")
print(f"\n2 CartPoles, last(5): observations {last.observations.shape}, actions "
      f"{last.actions.shape}, dones {last.dones.shape}; with flatten_env=True: "
      f"{vbuffer.last(5, flatten_env=True, dtype='numpy').observations.shape}")

# ---------------------------------------------------------------- Rollout Buffer
print("\n# Rollout Buffer\n")
env = gym.make("CartPole-v1")
buffer = RolloutBuffer(env=env, buffer_size=5, seed=0)
print("Environment trajectories in order:")
obs, _ = env.reset(seed=1)
for i in range(5):
    action = env.action_space.sample()
    next_obs, reward, terminated, truncated, _ = env.step(action)
    buffer.add_trajectory(obs, action, reward, next_obs, terminated, truncated,
                          value=0.5, log_prob=np.log(0.5))
    show(i + 1, Trajectories(obs, action, reward, next_obs, terminated))
    obs = next_obs
# In this case, the sample method returns a block of consecutive transitions.
trajectories = buffer.sample(batch_size=5, dtype="numpy")
print("\nSampled trajectories are also in order:")
for i in range(5):
    show(i + 1, Trajectories(trajectories.observations[i], trajectories.actions[i],
                             trajectories.rewards[i], trajectories.next_observations[i],
                             trajectories.dones[i]))
returns, advantages = buffer.core.compute_returns_and_advantages(
    last_values=[0.5], gamma=0.99, gae_lambda=0.95)
print(f"\nGAE on the native buffer: advantages {advantages}, returns {returns}")
for minibatch in buffer.core.minibatches(batch_size=2, epochs=1, seed=0):
    print(f"minibatch: actions {minibatch.actions}, advantages {minibatch.advantages}")

# ---------------------------------------------------------------- HER Buffer
print("\n# HER Buffer\n")


class BitFlippingEnv(gym.Env):
    """Flip one of ``n_bits`` bits per step until the state equals the goal."""

    def __init__(self, n_bits: int = 5):
        self.n_bits = n_bits
        bits = spaces.MultiBinary(n_bits)
        self.observation_space = spaces.Dict(observation=bits, achieved_goal=bits,
                                             desired_goal=bits)
        self.action_space = spaces.Discrete(n_bits)

    def _obs(self) -> dict:
        return {"observation": self.state.copy(), "achieved_goal": self.state.copy(),
                "desired_goal": self.goal.copy()}

    def reset(self, seed: int | None = None, options: Any = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        self.state = self.np_random.integers(0, 2, self.n_bits).astype(np.int8)
        self.goal = self.np_random.integers(0, 2, self.n_bits).astype(np.int8)
        self.steps = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[dict, float, bool, bool, dict]:
        self.state[action] ^= 1
        self.steps += 1
        reward = float(self.compute_reward(self.state, self.goal, {}))
        return self._obs(), reward, reward == 0.0, self.steps >= self.n_bits, {}

    def compute_reward(self, achieved_goal: Any, desired_goal: Any, info: Any) -> Any:
        reached = (np.asarray(achieved_goal) == np.asarray(desired_goal)).all(-1)
        return reached.astype(np.float32) - 1.0  # 0 at the goal, -1 elsewhere


env = BitFlippingEnv()
buffer = HERBuffer(env, buffer_size=100, goal_selection_strategy="future",
                   n_sampled_goal=4, seed=0)
print(f"her_ratio = {buffer.her_ratio}; desired_goals {buffer.desired_goals.shape}")
obs, _ = env.reset(seed=0)
env.action_space.seed(0)
for _ in range(30):
    action = env.action_space.sample()
    next_obs, reward, terminated, truncated, _ = env.step(action)
    buffer.add_trajectory(obs, action, reward, next_obs, terminated, truncated)
    obs = env.reset()[0] if terminated or truncated else next_obs
batch = buffer.sample(5, dtype="numpy")
print("Sampled (the first int(5 * 0.8) = 4 goals relabelled, rewards recomputed):")
print(f"desired goals\n{batch.observations['desired_goal']}\nrewards {batch.rewards.ravel()}")

# Unlike Pearl's, it works with vector envs (SAME_STEP autoreset gives final observations).
venv = gym.vector.SyncVectorEnv([BitFlippingEnv] * 2,
                                autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
native = rb.HERBuffer.from_env(venv, capacity=200, goal_selection_strategy="episode", seed=0)
obs, _ = venv.reset(seed=0)
for _ in range(20):
    action = venv.action_space.sample()
    next_obs, reward, terminated, truncated, info = venv.step(action)
    true_next = {k: v.copy() for k, v in next_obs.items()}
    for i in np.flatnonzero(info.get("_final_obs", [])):
        for key in true_next:
            true_next[key][i] = info["final_obs"][i][key]
    native.add(obs, action, reward, true_next, terminated, truncated)
    obs = next_obs
batch, info = native.sample(8)
print(f"\nVector HER (2 envs): {native.completed()} transitions of completed episodes; "
      f"sampled rewards {batch.rewards}, relabelled {batch.relabelled.astype(int)}")
