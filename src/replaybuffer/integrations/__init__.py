"""replaybuffer inside other RL libraries: classes those libraries accept in place of
their own buffers. Each module imports its library and is imported only when used.

* :mod:`replaybuffer.integrations.sb3`: Stable-Baselines3's ``replay_buffer_class``
  (``ReplayBuffer``, ``PrioritizedReplayBuffer`` with ``PrioritizedDQN``,
  ``HerReplayBuffer``); ``pip install 'replaybuffer[sb3]'``.
* :mod:`replaybuffer.integrations.torchrl`: ``TensorDictReplayBuffer``, a
  ``TensorDict`` interface for TorchRL's collectors and loss modules;
  ``pip install 'replaybuffer[torchrl]'``.
"""
