"""Names for users coming from other libraries: thin aliases, no second implementations.

* :mod:`replaybuffer.compat.tf_agents` — TF-Agents' replay-buffer names.
* :mod:`replaybuffer.compat.pearl` — Pearl's buffers (``pearll.buffers``) on gymnasium.
"""
