"""Prioritized sampling drawn on the storage's device: the sum tree is a device tensor.

:class:`TorchPrioritizedSampler` keeps :class:`~replaybuffer.sampling.prioritized.
PrioritizedSampler`'s bookkeeping on the host (the schedule, item ids, stale-id
filtering, new steps entering at the largest priority, all plain integers and the
already validated priority values) and moves what touches every slot to the device:
the sum tree (and the min tree of ``normalize="buffer"``) live in
:class:`~replaybuffer.sampling.torch_tree.TorchSegmentTree` s, priorities are written
with a scatter and a level-by-level recompute, and a batch is drawn by a batched
level-by-level descent with a ``torch.Generator`` on the device. Ids, positions,
probabilities and weights come back as device tensors: sampling needs no host round
trip. Where a priority of 0 (or one too small to survive in the running sums) has been
stored, a range may have no mass, which has no draw: the host sampler raises
:class:`~replaybuffer.errors.EmptyBufferError`. Reading the mass back at every draw
would make the host wait for the device's queue, so on CUDA the mass is checked as the
device priority updates are (:class:`DrawMassChecks`): queued without waiting, and the
error raised by a later call of the sampler (the next draw or update that finds it
arrived, or a call that waits for it: ``valid_mass``, the buffer's ``max_priority``);
the batch of that draw is not valid (its probabilities are not finite, or not
positive). ``state_dict`` (and so a checkpoint) leaves that error queued: the draw
changed nothing it saves. :attr:`TorchPrioritizedSampler.draw_checks_on_device`
chooses (``True``, ``False`` or ``None``; anything else is refused where it is set).

The slot values are searched in one of two ways (``search``): ``"prefix"``, their
running sums recomputed by one ``cumsum`` after a write and searched by one
``searchsorted`` (:mod:`~replaybuffer.sampling.torch_prefix_sums`: a few kernel launches
at any capacity, O(capacity) bytes), or ``"tree"``, a sum tree descended level by level
(:mod:`~replaybuffer.sampling.torch_tree`: O(log capacity) bytes but a few launches per
level). The default is ``"prefix"``: on an H100 (``replaybuffer bench --gpu``) a priority
update and a batch of 256 took 0.73-1.29 ms with it against 10.4-15.5 ms with the tree,
from 2**17 to 2**26 slots; the running sums' bytes would match the tree's launches only near
2**30 slots. Draws are by search only (the host sampler's rejection path pays off for
numpy, not for a GPU).

Targets are drawn inside the valid starts' share of the prefix sums, so windows never
cross the write head. Float64 rounding can carry a target to the edge of that share
(odds about 1e-16): the running sums bound a segment exactly, so the target is held
below its end; the tree's path sums may differ from the bounds in the last bit, so a
tree search that lands outside is redone at the middle of its segment instead of
redrawn, which would need the host (:mod:`~replaybuffer.sampling.torch_tree_ranges`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from replaybuffer.device_copy import to_device
from replaybuffer.errors import EmptyBufferError
from replaybuffer.sampling.episodes import EpisodeIndex
from replaybuffer.sampling.item_ids import live_positions
from replaybuffer.sampling.prioritized import PrioritizedSampler
from replaybuffer.sampling.priority_range import require_mass
from replaybuffer.sampling.priority_writes import int64_item_ids
from replaybuffer.sampling.ring import Ring
from replaybuffer.sampling.sampler import SampleIndices
from replaybuffer.sampling.trees import MinTree, SumTree
from replaybuffer.sampling.device_check_choice import CheckChoice, ChoosesChecks
from replaybuffer.sampling.torch_deferred_checks import DeviceChecks
from replaybuffer.sampling.torch_empty_ranges import EmptyRanges
from replaybuffer.sampling.torch_generator import DeviceGenerator, refuse_episodes
from replaybuffer.sampling.torch_prefix_sums import TorchPrefixSums
from replaybuffer.sampling.torch_priority_updates import (DevicePriorityUpdates,
                                                          checked_on_device,
                                                          device_arguments)
from replaybuffer.sampling.torch_tree import TorchSegmentTree
from replaybuffer.sampling.torch_tree_ranges import tree_draw, tree_range_mass


class TorchPrioritizedSampler(PrioritizedSampler, metaclass=ChoosesChecks):
    """Draws window starts in proportion to ``priority ** alpha`` on ``device``.

    Args:
        capacity, alpha, beta, beta_final, beta_steps, seed, normalize: as for
            :class:`~replaybuffer.sampling.prioritized.PrioritizedSampler`.
        device: the storage's device.
        search: ``"prefix"`` (running sums, the default) or ``"tree"`` (a sum tree);
            module docstring.

    Priority updates given as tensors on the device (``BufferInfo.ids`` and, say,
    absolute TD errors computed there) are applied and checked on the device, with no
    host synchronization, by :meth:`update_on_device`: a bad batch writes nothing (the
    refusal is a mask on the write) and its ``ValueError`` is raised at a later call
    (:mod:`~replaybuffer.sampling.torch_priority_updates`). :attr:`device_updates`
    chooses (on the class or one sampler): ``None``, the default, checks on the device
    where the sampler draws on a CUDA device with ``search="prefix"``; ``True`` on any
    device with ``"prefix"`` (the CPU tests' way); ``False`` copies every update to the
    host and checks it there at once (two synchronizations per update). The tree search
    always checks on the host: its writes size their output there anyway
    (``torch.unique``). Alone, a device-checked update is more kernels than a host-checked
    one (about 44 against 9, 554 against 237 us on an NVIDIA H200, ``replaybuffer bench
    --gpu``), but it never makes the host wait for the device's queue, which a train
    step's kernels fill (``benchmarks/gpu_train_loop.py`` times both in a train loop).
    """

    fused_updates = False  # its priorities live in the device tree (_set), not the host's

    # Each refused at assignment unless True, False or None (device_check_choice).
    device_updates = CheckChoice("device_updates")
    # A draw's no-mass check deferred (DrawMassChecks.deferred): None on CUDA only.
    draw_checks_on_device = CheckChoice("draw_checks_on_device")

    def __init__(self, capacity: int, alpha: float = 0.6, beta: float = 0.4, *,
                 beta_final: float | None = None, beta_steps: int = 0,
                 seed: int | None = None, normalize: str = "batch",
                 device: torch.device | str = "cpu", search: str = "prefix"):
        super().__init__(capacity, alpha, beta, beta_final=beta_final, beta_steps=beta_steps,
                         seed=seed, normalize=normalize)
        if search not in ("prefix", "tree"):
            raise ValueError(f"search must be 'prefix' or 'tree', got {search!r}")
        self.search = search
        self.device = torch.device(device)
        self._generator = DeviceGenerator(self.device, seed)
        self._draw_checks = DrawMassChecks(self.device)
        self._tree: TorchPrefixSums | TorchSegmentTree
        # The smallest positive value (normalize="buffer"): a min tree beside a sum tree;
        # the running sums' own scan of the slots otherwise.
        self._mins: TorchSegmentTree | None = None
        # Updates from device tensors (running sums only: the tree's writes size their
        # output on the host, torch.unique, a synchronization anyway).
        self._device_updates: DevicePriorityUpdates | None = None
        if search == "prefix":
            self._tree = TorchPrefixSums(self.capacity, self.device)
            self._device_updates = DevicePriorityUpdates(self.device, self.alpha)
        else:
            self._tree = TorchSegmentTree(self.capacity, self.device, "sum")
            if normalize == "buffer":
                self._mins = TorchSegmentTree(self.capacity, self.device, "min")
        # Whether a range may have no mass (then draws check it): torch_empty_ranges.
        self._empty = EmptyRanges(self.capacity, self.running_sums)

    # ------------------------------------------------------------------- trees
    def _set(self, positions: np.ndarray, priorities: np.ndarray, largest: float) -> None:
        if self.alpha == 0.0:  # 0 ** 0 is 1, but a zero priority must stay unsampled
            scaled = np.where(priorities > 0, 1.0, 0.0)
            largest = 1.0
        else:
            scaled = priorities if self.alpha == 1.0 else np.power(priorities, self.alpha)
            try:
                largest = math.pow(largest, self.alpha) if self.alpha != 1.0 else largest
            except OverflowError:
                largest = math.inf
        if not (largest * self.capacity < 1e307):  # the total may overflow: check it
            if not np.isfinite(scaled).all() or not math.isfinite(
                    float(self._tree.root()) + float(np.sum(scaled))):
                raise ValueError("update: expected a finite total priority, got inf with "
                                 "these values (float64 overflow); nothing was updated")
        if scaled.size:
            self._empty.note(float(scaled.min()), largest)
        slots = to_device(np.ascontiguousarray(positions, np.int64), self.device)
        values = to_device(np.ascontiguousarray(scaled, np.float64), self.device)
        self._tree.assign(slots, values)
        if self._mins is not None:
            self._mins.assign(slots, torch.where(values > 0, values, math.inf))

    def _flush(self) -> None:
        """Pending new steps enter at the largest priority, the device's included."""
        updates = self._device_updates
        if not self._pending or updates is None or updates.largest is None:
            super()._flush()
            return
        positions = np.concatenate([p for p, _ in self._pending])
        values = np.concatenate([np.full(len(p), v) for p, v in self._pending])
        self._pending.clear()
        self._pending_count = 0
        raw = torch.maximum(to_device(values, self.device), updates.largest)
        # Noted from the host's values: no larger than those written (conservative).
        smallest, largest = float(values.min()), float(values.max())
        if self.alpha == 0.0:
            smallest = largest = 1.0 if smallest > 0 else 0.0
        elif self.alpha != 1.0:
            smallest, largest = smallest ** self.alpha, largest ** self.alpha
        self._empty.note(smallest, largest)
        self._tree.assign(to_device(positions.astype(np.int64, copy=False), self.device),
                          updates.scale(raw))

    @property
    def checks_on_device(self) -> bool:
        """Whether updates given as device tensors are checked on the device
        (:func:`~replaybuffer.sampling.torch_priority_updates.checked_on_device` of
        :attr:`device_updates`)."""
        updates = self._device_updates
        return checked_on_device(self.device_updates, self.device, self.search,
                                 updates is not None and updates.recorder is not None)

    def update_on_device(self, ring: Ring, ids: Any, priorities: Any) -> int | None:
        """Apply ``priorities`` to item ``ids`` on the device, when both are tensors on
        it and :attr:`checks_on_device`; ``None`` otherwise (the caller takes the host
        path). Returns how many ids were given (module
        :mod:`~replaybuffer.sampling.torch_priority_updates`: stale ones are skipped
        uncounted, and a bad batch writes nothing and raises at a later call).

        Raises:
            ValueError: ids that are not integers or shapes that do not match (at
                once), or a batch refused by an earlier call (deferred).
        """
        updates = self._device_updates
        if updates is None or not self.checks_on_device:
            return None
        given = device_arguments(ids, priorities, self.device)
        if given is None:
            return None
        item_ids, values = given
        self.settle(wait=updates.checks.full)
        if not item_ids.shape[0]:
            return 0
        if self._pending:
            self._flush()
        updates.apply(ring, self.key_base, self._tree, item_ids, values)  # type: ignore[arg-type]
        self._empty.unknown()  # (until its outcome is read, it may have written zeros)
        return int(item_ids.shape[0])

    def settle(self, wait: bool = True, draws: bool = True) -> None:
        """Act on the outcomes of device updates that have arrived (every one, with
        ``wait``: waits for the device): note the values they wrote, and raise the
        ``ValueError`` of the first refused one; or (with ``draws``) the
        ``EmptyBufferError`` of an earlier draw that found no mass
        (:class:`DrawMassChecks`)."""
        if draws:
            self._draw_checks.raise_arrived(wait)
        updates = self._device_updates
        if updates is None or not len(updates.checks):
            return
        notes, error = updates.outcomes(wait)
        for smallest, largest, raw in notes:
            self._empty.note(smallest, largest)
            self.max_priority = max(self.max_priority, raw)
        if not len(updates.checks):
            self._empty.settled()
        if error is not None:
            raise ValueError(error)

    def update_priorities(self, ring: Ring, item_ids: np.ndarray, priorities: np.ndarray,
                          largest: float | None = None) -> int:
        self.settle(wait=False)  # a later call: earlier device updates' outcomes
        return super().update_priorities(ring, item_ids, priorities, largest)

    def on_clear(self, ring: Ring) -> None:
        super().on_clear(ring)
        # A queued no-mass check is about the priorities the clear forgets (as a
        # restore's are replaced): dropped, never raised about the new ones. A refused
        # update's error is about the caller's values and is still raised; the outcomes
        # of updates before the clear note nothing (DevicePriorityUpdates.forget).
        self._draw_checks.clear()
        if self._device_updates is not None:
            self._device_updates.forget()
        self._tree.clear()
        if self._mins is not None:
            self._mins.clear()
        self._empty.forget()

    # ---------------------------------------------------------------- sampling
    def valid_mass(self, ring: Ring, num_steps: int) -> float:
        self.settle()
        if self._pending:
            self._flush()
        if ring.last_id + 1 < num_steps:
            return 0.0
        first, span = _valid_positions(ring, num_steps)
        if isinstance(self._tree, TorchPrefixSums):
            return float(self._tree.range_mass(first, span))
        return float(tree_range_mass(self._tree, first, span))

    def sample(self, ring: Ring, sample_batch_size: int, num_steps: int,
               rng: np.random.Generator | None = None,
               episodes: EpisodeIndex | None = None
               ) -> tuple[SampleIndices, dict[str, Any]]:
        refuse_episodes(episodes)
        self.settle(wait=False)
        if self._pending:
            self._flush()
        generator = self._generator.for_call(rng)
        u = torch.rand(sample_batch_size, dtype=torch.float64, generator=generator,
                       device=self.device)
        first, span = _valid_positions(ring, num_steps)
        tree = self._tree
        if isinstance(tree, TorchPrefixSums):
            positions, mass = tree.draw(u, first, span)
        else:  # (torch_tree_ranges: the tree's search of the cyclic range)
            positions, mass = tree_draw(tree, u, first, span)
        if self._empty.possible:  # only where a range may be empty
            if self._draw_checks.deferred(self.draw_checks_on_device):
                self._draw_checks.push(mass, num_steps)
            else:  # one scalar back to the host
                require_mass(float(mass), num_steps)
        values = self._tree.leaves[positions]
        ids = _ids_on_device(ring, positions)
        probabilities = (values / mass).to(torch.float32)
        if self.normalize == "batch":
            smallest = values.amin()
        elif self._mins is not None:
            smallest = self._mins.root()
        else:
            assert isinstance(self._tree, TorchPrefixSums)
            smallest = self._tree.smallest_positive()
        weights = (smallest / values).to(torch.float32).pow(self.beta)
        if self.normalize == "buffer":
            weights = weights.clamp(max=1.0)
        self.sample_calls += 1
        return SampleIndices(ids, positions), {  # type: ignore[arg-type]
            "probabilities": probabilities, "weights": weights}

    # ------------------------------------------------------- recorded draws
    @property
    def generator(self) -> torch.Generator:
        """The device generator the draws come from (registered with a recording)."""
        return self._generator.generator

    @property
    def running_sums(self) -> TorchPrefixSums | None:
        """The running sums searched (``None`` with ``search="tree"``)."""
        return self._tree if isinstance(self._tree, TorchPrefixSums) else None

    def before_recorded_draw(self) -> bool:
        """What :meth:`sample` does before drawing (device updates' outcomes acted on,
        new steps' priorities written); whether a recorded draw
        (:mod:`~replaybuffer.sampling.captured_prioritized`) may serve the call: not
        where a range may have no mass (only the eager path reports that)."""
        self.settle(wait=False)
        if self._pending:
            self._flush()
        return not self._empty.possible

    def record_updates(self, recorder: Any) -> None:
        """Record device updates per batch size into captures ``recorder()`` makes
        (:class:`~replaybuffer.sampling.torch_priority_updates.RecordedUpdate`)."""
        if self._device_updates is not None:
            self._device_updates.recorder = recorder

    def after_recorded_draw(self, ratios: torch.Tensor) -> torch.Tensor:
        """The importance weights (float32 ``[S]``) of a recorded draw's ratios, as
        :meth:`sample` makes them, and the call counted (the beta schedule)."""
        weights = ratios.pow(self.beta)
        if self.normalize == "buffer":
            weights = weights.clamp(max=1.0)
        self.sample_calls += 1
        return weights

    # ------------------------------------------------------------- priorities
    def priorities(self, ring: Ring, item_ids: np.ndarray) -> np.ndarray:
        """Current ``priority ** alpha`` (float64 ``[S]``, numpy) of live item ids
        (``[S]``, any integer dtype, converted to int64 as :meth:`update_priorities`
        converts them; NaN for stale ones).

        Raises:
            TypeError: ``item_ids`` are not integers (nothing is changed).
        """
        if item_ids.dtype != np.int64:
            item_ids = int64_item_ids(item_ids)
        self.settle()
        self._flush()
        live, positions = live_positions(ring, self.key_base, item_ids)
        out = np.full(item_ids.shape, np.nan)
        out[live] = self._tree.leaves[torch.from_numpy(positions).to(self.device)].cpu().numpy()
        return out

    # ------------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        """The host sampler's state, its priorities read from the device, and the
        device generator's state (uint8 ``[n]``)."""
        # A refused device update raises; a no-mass draw's error waits for a draw.
        self.settle(draws=False)  # max_priority as the device's updates left it
        state = super().state_dict()  # the host trees are unused: priorities from ours
        # A copy: on the CPU, .cpu().numpy() would be the live tensor's memory.
        state["priorities"] = self._tree.leaves.cpu().numpy().copy()
        state["device_rng"] = self._generator.state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (or a host sampler's): the priorities go to
        the device, and later draws are the original's."""
        super().load_state_dict(state)  # checks the shape, restores the host bookkeeping
        if self._device_updates is not None:  # the restored state replaces theirs
            self._device_updates.checks.clear()
            self._device_updates.forget()
        self._draw_checks.clear()  # draws from the state replaced
        leaves = torch.from_numpy(np.array(state["priorities"], np.float64)).to(self.device)
        self._tree.load(leaves)
        if self._mins is not None:
            self._mins.load(torch.where(leaves > 0, leaves, math.inf))
        # The host trees the base class just filled are not read here: free them.
        self._sum = SumTree(self.capacity)
        self._min = MinTree(self.capacity) if self._min is not None else None
        # Empty slots hold 0 too, so this is conservative (a scalar sync per sample).
        self._empty.forget()
        self._empty.note(float(leaves.min()), float(leaves.max()))
        self._generator.restore(state, self._rng)


class DrawMassChecks:
    """The no-mass checks of draws made on ``device``, read on the host at a later call.

    A draw whose range has no mass (every valid window's priority 0) draws nothing
    meaningful; the host sampler raises :class:`~replaybuffer.errors.EmptyBufferError`.
    On a GPU, reading the mass back would make the host wait for the device's queue, so
    the draw queues it instead (a float64 ``[1]`` summary copied to pinned memory
    without waiting: :class:`~replaybuffer.sampling.torch_deferred_checks.DeviceChecks`)
    and :meth:`raise_arrived`, called by the sampler's next calls, raises that error
    once the mass has arrived on the host and is not positive.
    """

    def __init__(self, device: torch.device):
        self.device = device
        # Made at the first push: its pinned memory's allocation synchronizes, once.
        self._checks: DeviceChecks | None = None

    def deferred(self, chosen: bool | None) -> bool:
        """Whether draws defer their check: ``chosen``
        (``TorchPrioritizedSampler.draw_checks_on_device``) where it is a bool, else
        (``None``) on CUDA only (checked where it was set: :class:`CheckChoice`)."""
        return self.device.type == "cuda" if chosen is None else chosen

    def push(self, mass: torch.Tensor, num_steps: int) -> None:
        """Queue the range's ``mass`` (a 0-d float64 tensor on the device) of a draw of
        windows of ``num_steps``. :meth:`raise_arrived` (with ``wait`` where the queue
        is full) must have run since the last push."""
        if self._checks is None:
            self._checks = DeviceChecks(self.device, 1)
        self._checks.push(mass.reshape(1), num_steps)

    def raise_arrived(self, wait: bool) -> None:
        """Act on the checks that have arrived (all of them with ``wait``, or where
        the queue is full: waits for the device).

        Raises:
            EmptyBufferError: a draw found no mass (the first such; the checks taken
                with it are dropped).
        """
        checks = self._checks
        if checks is None or not len(checks):
            return
        for summary, num_steps in checks.take(wait or checks.full):
            if not summary[0] > 0.0:
                try:
                    require_mass(float(summary[0]), num_steps)
                except EmptyBufferError as exc:
                    raise EmptyBufferError(
                        f"{exc} (found by an earlier draw on {self.device}, reported at "
                        "this call: that draw's batch is not valid)") from None

    def clear(self) -> None:
        """Forget the checks queued (the state they were drawn from is gone)."""
        if self._checks is not None:
            self._checks.clear()


def _valid_positions(ring: Ring, num_steps: int) -> tuple[int, int]:
    """``(first, span)``: the valid window starts are stored positions ``first`` to
    ``first + span - 1``, cyclically (``(0, capacity)`` for the whole ring). Never
    an unwritten position: those hold no mass, and the running sums count on
    that (:attr:`TorchPrefixSums.may_hold_empty`)."""
    lo, hi = ring.valid_start_range(num_steps)
    span = (hi - lo) * ring.batch_size
    if span == ring.capacity:
        return 0, span
    return (lo % ring.max_length) * ring.batch_size, span


def _ids_on_device(ring: Ring, positions: torch.Tensor) -> torch.Tensor:
    """Logical ids (int64, a new tensor) of the steps at stored positions."""
    oldest = ring.oldest_id
    if not oldest:  # the ring has not wrapped: the slot is the id
        return positions // ring.batch_size
    slots = positions // ring.batch_size if ring.batch_size > 1 else positions
    return (slots - oldest % ring.max_length) % ring.max_length + oldest
