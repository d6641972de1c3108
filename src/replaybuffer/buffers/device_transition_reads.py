"""Transitions of steps drawn on the device, read there: the device twin of
:class:`~replaybuffer.buffers.transition_reads.TransitionReads`.

With ``sample_on_device=True`` a transition buffer draws ids and positions as tensors
on the torch storage's device. :class:`DeviceTransitionReads` turns them into
:class:`~replaybuffer.Transitions` with device operations only, so a sample never
waits for the device: the stored leaves and the following steps' observations are
gathered by the storage; where a step's next observation is not the following step's
(its slot in the side store, or the newest step's own) it comes from
:class:`~replaybuffer.buffers.device_side_mirror.DeviceSideMirror`; ``n``-step returns
fold the window's rewards, flags and side references as the host path does, and sum
in numpy's order (:mod:`~replaybuffer.buffers.numpy_sum_order`), so every field is
bit for bit what the host path reads for the same step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from replaybuffer.buffers.device_side_mirror import DeviceSideMirror
from replaybuffer.buffers.numpy_sum_order import row_sums_in_numpy_order
from replaybuffer.buffers.transition_fields import Transitions

if TYPE_CHECKING:
    from replaybuffer.sampling import Ring
    from replaybuffer.storage.side_store import SideStore
    from replaybuffer.storage.torch_storage import TorchStorage


class DeviceTransitionReads:
    """Transitions (with ``n``-step returns) of steps given as device tensors.

    Attributes:
        mirror: the device copy of the buffer's next-observation bookkeeping, synced
            by every :meth:`read` (:meth:`DeviceSideMirror.invalidate` after the host
            state was replaced).

    Args:
        storage: the buffer's torch storage.
        ring: the buffer's ring.
        side_state: the buffer's next-observation bookkeeping ``(side_ref, side store,
            head_next)`` (:class:`DeviceSideMirror`'s arguments).
        leaves: storage leaf indices: ``observation`` (list), ``action`` (list),
            ``reward``, ``terminated``, ``truncated``.
        structures: ``(observation, action)`` nest structures to unflatten leaves with.
        n_step, gamma: as the buffer's.
    """

    def __init__(self, storage: TorchStorage, ring: Ring,
                 side_state: tuple[np.ndarray, SideStore, list[np.ndarray]],
                 leaves: dict[str, Any], structures: tuple[Any, Any], n_step: int,
                 gamma: float):
        self._storage = storage
        self._ring = ring
        self.mirror = DeviceSideMirror(ring, *side_state, storage.device)
        self._obs_leaves: list[int] = leaves["observation"]
        self._action_leaves: list[int] = leaves["action"]
        self._flags = [leaves["reward"], leaves["terminated"], leaves["truncated"]]
        self._obs_structure, self._action_structure = structures
        self.n_step = n_step
        device = storage.device
        # The host path's constants, computed as it computes them (numpy's power), so
        # a device read uses the same float64 values: gamma ** k per window step and
        # gamma ** m per counted length m.
        self._steps = torch.arange(n_step, dtype=torch.int64, device=device)
        self._offsets = self._steps * ring.batch_size  # positions of a window's steps
        self._step_discounts = torch.from_numpy(gamma ** np.arange(n_step)).to(device)
        # gamma ** m as float32, as the host's float64 gamma ** m cast to float32
        self._powers = torch.from_numpy(
            (gamma ** np.arange(n_step + 1)).astype(np.float32)).to(device)
        self._gamma = torch.tensor(np.float32(gamma), device=device)  # float32 0-d

    def read(self, ids: torch.Tensor, positions: torch.Tensor, generation: int
             ) -> Transitions:
        """The transitions of steps ``ids`` at ``positions`` (int64 ``[S]`` tensors on the
        device; positions perhaps not yet modulo the capacity): every field a tensor
        on the device, ``[S, ...]``. The buffer's lock held; ``generation``: its count
        of clears and restores (:meth:`DeviceSideMirror.sync`)."""
        self.mirror.sync(generation)
        if self._ring.batch_size == 1:  # the uniform draw hands ids as positions
            positions = torch.remainder(positions, self._ring.capacity)
        leaves = self._storage.gather(positions)
        if self.n_step == 1:
            rewards = leaves[self._flags[0]]
            end_term, end_trunc = leaves[self._flags[1]], leaves[self._flags[2]]
            # gamma, 0 after termination (float32: the host's float32(gamma) * ~terminated)
            discounts = torch.where(end_term, 0.0, self._gamma)
            next_obs = self.next_observations(positions)
        else:
            rewards, end_term, end_trunc, discounts, next_obs = self._n_step_returns(
                ids, positions)
        self.mirror.after_read()
        return Transitions(
            observations=self._obs_structure.unflatten([leaves[i] for i in self._obs_leaves]),
            actions=self._action_structure.unflatten([leaves[i] for i in self._action_leaves]),
            rewards=rewards,
            next_observations=self._obs_structure.unflatten(next_obs),
            terminated=end_term, truncated=end_trunc, dones=end_term | end_trunc,
            discounts=discounts)

    def next_observations(self, positions: torch.Tensor) -> list[torch.Tensor]:
        """The next observation's leaves (``[S, *spec.shape]``) of the steps at
        ``positions`` (int64 ``[S]``, modulo the capacity): the following step's
        observation, unless the step owns a side observation or is its row's newest."""
        ring, mirror = self._ring, self.mirror
        # (the storage takes the following positions modulo the capacity as it gathers)
        out = self._storage.gather(positions + ring.batch_size, self._obs_leaves)
        # The row of mirror.rows to read instead (a side slot, or the newest step's
        # own next observation), -1 for the following step's observation.
        source = mirror.refs[positions]
        patched = source >= 0
        take = source.clamp(min=0)
        result = []
        for leaf, rows in zip(out, mirror.rows):
            mask = patched.view((-1,) + (1,) * (leaf.dim() - 1))
            result.append(torch.where(mask, rows[take], leaf))
        return result

    def _n_step_returns(self, ids: torch.Tensor, positions: torch.Tensor
                        ) -> tuple[Any, ...]:
        """``(returns, terminated, truncated, discounts, next observation leaves)`` of
        the ``n``-step windows starting at steps ``ids``/``positions`` (int64 ``[S]``):
        the host path's fold (``TransitionReads._n_step_returns``), op for op."""
        ring = self._ring
        window_ids = ids[:, None] + self._steps  # [S, n]
        window_positions = torch.remainder(positions[:, None] + self._offsets, ring.capacity)
        held = window_ids <= ring.last_id
        rewards, terminated, truncated = self._storage.gather(
            torch.where(held, window_positions, positions[:, None]), self._flags)
        ended = (terminated | truncated) & held
        # A step whose next observation is in the side store ends the window too (an
        # out-of-sequence add follows it).
        breaks = ended | (self.mirror.refs[window_positions] >= 0) & held
        # Step k counts if it is stored and no earlier step of the window broke it:
        # the running count of breaks up to k is k's own break.
        counted = held & (torch.cumsum(breaks, -1) == breaks)
        m = counted.sum(-1)
        # float32 reward times the bool (numpy's -0.0 and NaN included), times the
        # float64 discounts: computed in float64, as numpy promotes it.
        terms = (rewards * counted) * self._step_discounts
        returns = row_sums_in_numpy_order(terms).to(torch.float32)
        last_k = (m - 1)[:, None]
        last_position = window_positions.gather(1, last_k)[:, 0]
        end_term = terminated.gather(1, last_k)[:, 0]
        end_trunc = truncated.gather(1, last_k)[:, 0]
        discounts = torch.where(end_term, 0.0, self._powers[m])
        return (returns, end_term, end_trunc, discounts,
                self.next_observations(last_position))
