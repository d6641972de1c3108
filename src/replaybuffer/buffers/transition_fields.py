"""The fields of a transition buffer: the names of its stored leaves and the batch
that its reads return (:class:`Transitions`)."""

from __future__ import annotations

from typing import Any, NamedTuple


class Transitions(NamedTuple):
    """A batch of transitions; every field has the leading sample dims (``[S]``).

    Attributes:
        observations, actions: at ``t`` (nests as the specs).
        rewards: float32; the discounted ``n``-step return when ``n_step > 1``.
        next_observations: the observation the value is bootstrapped from.
        terminated, truncated: bool, how the episode ended within the return's steps.
        dones: ``terminated | truncated`` (Pearl's field).
        discounts: float32 factor of ``V(next_observations)`` in the TD target.
    """

    observations: Any
    actions: Any
    rewards: Any
    next_observations: Any
    terminated: Any
    truncated: Any
    dones: Any
    discounts: Any


OBS, ACTION, REWARD, TERMINATED, TRUNCATED = ("observation", "action", "reward",
                                              "terminated", "truncated")
