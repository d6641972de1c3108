"""Adapters that put our buffers inside other frameworks' training loops.

Each module imports its framework and is imported only by those who use it:
:mod:`replaybuffer.integrations.torchrl` (a ``TensorDict`` interface for TorchRL's
collectors and loss modules).
"""
