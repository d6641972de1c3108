"""Reads across shards: which shards each batch comes from, and batches in flight
(priority updates, routed to the shards their ids name, are in :mod:`.priority_updates`).

Where a batch's items come from (``shards_per_batch``):

- ``None`` (every shard): the batch is split over the shards that are up by a
  multinomial draw in proportion to their sampling masses (windows held for uniform
  buffers, the priority total for prioritized ones): exactly what one buffer holding
  every shard's items would draw. One call per shard per batch.
- ``k``: ``k`` shards are drawn (with replacement) in proportion to their masses and
  each gives ``1/k`` of the batch (``k = 1``: Ape-X's whole batch from one shard).
  Each item's marginal probability is the same as above (its shard is drawn by mass,
  then the item within the shard as the shard's buffer draws); what changes is that
  items of one batch are correlated (they share ``k`` shards), and a batch from one
  shard holds one shard's recent data. The calls per batch stay ``k``, whatever the
  number of shards.

Masses come with every answer (to a draw, a write, a priority update); no call waits
for a round of questions. A shard whose mass no answer brought for
:data:`MASS_REFRESH_S` is asked again, without waiting (collectors writing through
their own writers change it where the client does not see the answers); a shard that
answers draws is never asked, so a learner drawing from every shard sends no call but
its draws (each question costs a shard about what a draw's call does).

A dataset's group of ``g`` batches (``as_dataset(..., batches_per_call=g,
group_from_one_shard=True)``) can come from one shard: the group's first batch draws
a shard by mass and all ``g`` batches are drawn whole from it, in one call. Each
batch's items keep the marginal above (shard by mass, item as the shard draws); ``g``
consecutive batches share one shard's contents, and the calls per batch are ``1/g``
at any shard count.

A batch is started (its calls sent, :meth:`ShardSampler.start`) and finished (its
parts gathered, :meth:`ShardSampler.finish`) separately, so a dataset keeps several in
flight. Each batch draws everything (its shards, the seeds the shards sample with, the
interleaving) from a generator of its own, spawned in order from the stream's: the
batches of a seeded stream are the same however many are in flight.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray
from ray.exceptions import RayError, RayTaskError

from replaybuffer.distributed.errors import ShardsUnavailableError
from replaybuffer.distributed.ray_shards.batches import Part, combine
from replaybuffer.distributed.ray_shards.draw_answers import (DRAWN_ERRORS, DrawAnswer,
                                                              SplitReplies, draw_packing,
                                                              inline_runs)
from replaybuffer.distributed.ray_shards.health import ShardHealth
from replaybuffer.errors import EmptyBufferError
from replaybuffer.protocols import BufferInfo
from replaybuffer.rate_limiter import RateLimitedError
from replaybuffer.sampling.sampler import make_rng

MASS_REFRESH_S = 1.0
"""A shard's sampling mass is asked again (without waiting) when no answer brought it
for this long."""
SHARD_WAIT_S = 0.2
"""How long a shard's rate limiter may hold a part of a sample back before the client
draws that part from the other shards (or, all held back, asks again)."""


def pick_shards(rng: np.random.Generator, p: np.ndarray, size: int) -> np.ndarray:
    """``size`` shard indices (int64 ``[size]``) drawn with replacement by the
    probabilities ``p`` (float64 ``[num_shards]``, summing to 1): what
    ``rng.choice(len(p), size, p=p)`` draws, from the same uniforms, without its
    checks of ``p`` (about 10 us of the learner's time per batch)."""
    cdf = np.cumsum(p)
    cdf /= cdf[-1]
    picks: np.ndarray = cdf.searchsorted(rng.random(size), side="right")
    return picks


@dataclass
class PendingBatch:
    """One batch on its way: its calls in flight and the parts come back."""

    method: str
    count: int
    num_steps: int | None
    rng: np.random.Generator
    within_episodes: bool
    deadline: float | None
    timeout: float | None
    one_shard: bool = False  # its group's shard, chosen for the group (start_many)
    # shard, the call's answer, n, the batch's index in the call
    calls: list[tuple[int, DrawAnswer, int, int]] = field(default_factory=list)
    parts: list[Part] = field(default_factory=list)
    error: BaseException | None = None


class ShardSampler:
    """Draws batches from the shards and keeps their sampling masses.

    Args:
        actors: the shard actor handles (the buffer's list).
        health: which shards are up, and their incarnations.
        beta: the importance-sampling exponent of prioritized shards (``None``:
            uniform).
        data_spec: the shards' data spec (answers come packed in its layout).
        shards_per_batch: see the module docstring (``None``: every shard).
    """

    def __init__(self, actors: list[Any], health: ShardHealth, beta: float | None,
                 data_spec: Any, shards_per_batch: int | None = None):
        self._packing = draw_packing(data_spec)
        self._actors = actors
        self._health = health
        self._up = health.up
        self._num_shards = len(actors)
        self._beta = beta
        self.shards_per_batch = shards_per_batch
        self._mass: dict[int | None, np.ndarray] = {}
        # Per key, when each shard's mass last came (with any answer, or asked).
        self._heard: dict[int | None, np.ndarray] = {}
        # Per key, the mass questions not yet answered: each one's ref, its shard and
        # the clock when it was sent.
        self._asking: dict[int | None, dict[Any, tuple[int, int]]] = {}
        # A count of masses set and questions sent, and per key the count when each
        # shard's mass was last set: an answer to a question sent before a fresher
        # mass came (with an update's or a draw's answer) is dropped, not applied.
        self._clock = 0
        self._set_at: dict[int | None, np.ndarray] = {}

    def mass_keys(self) -> list[int | None]:
        """The window lengths whose masses are kept (a write's answer reports them)."""
        return list(self._mass)

    def forget_masses(self) -> None:
        """Drop every kept mass (a shard came back: ask again)."""
        self._mass.clear()
        self._heard.clear()
        self._asking.clear()
        self._set_at.clear()

    # ------------------------------------------------------------------ drawing
    def draw(self, method: str, count: int, num_steps: int | None,
             rng: np.random.Generator, timeout: float | None = None,
             within_episodes: bool = False) -> tuple[Any, BufferInfo]:
        """:meth:`start` then :meth:`finish`: ``count`` samples by ``method``
        (``get_next`` windows of ``num_steps``, or a transition buffer's ``sample``).

        Raises:
            EmptyBufferError: no shard holds a sample (every one asked said so).
            ShardsUnavailableError: every shard is down.
            RateLimitedError: every shard's rate limiter held its part back for
                ``timeout`` seconds.
        """
        return self.finish(self.start(method, count, num_steps, rng, timeout,
                                      within_episodes))

    def start(self, method: str, count: int, num_steps: int | None,
              rng: np.random.Generator, timeout: float | None = None,
              within_episodes: bool = False) -> PendingBatch:
        """Send the calls of one batch (an error is kept for :meth:`finish`)."""
        return self.start_many(method, count, num_steps, [rng], timeout,
                               within_episodes)[0]

    def start_many(self, method: str, count: int, num_steps: int | None,
                   rngs: list[np.random.Generator], timeout: float | None = None,
                   within_episodes: bool = False, one_shard: bool = False
                   ) -> list[PendingBatch]:
        """Plan one batch per generator of ``rngs`` (each draws its shards and seeds
        from a generator seeded by its own, as :meth:`start` does) and send them with
        one call per shard: a shard that several of them go to draws them all in one
        call. The batches are the same as separate :meth:`start` calls give, except
        with ``one_shard``: then the group's first batch draws one shard by mass and
        every batch of the group is drawn whole from it (one call for the group)."""
        batches, planned = [], []
        group_shard: int | None = None
        for rng in rngs:
            batch = PendingBatch(method, count, num_steps,
                                 make_rng(int(rng.integers(0, 2**63 - 1))), within_episodes,
                                 None if timeout is None else time.monotonic() + timeout,
                                 timeout, one_shard)
            batches.append(batch)
            try:
                mass = self._current_mass(num_steps)
                if not (mass * self._up).sum() > 0:
                    if not any(self._up):
                        raise ShardsUnavailableError(
                            f"all {self._num_shards} shards are down")
                    self.refresh(num_steps)  # none known to hold any: ask, and wait
                    mass = self._mass[num_steps]
                    if not (mass * self._up).sum() > 0:
                        raise self._empty(batch)
                if not one_shard:
                    planned.append((batch, self._plan(batch, count, mass * self._up,
                                                      True)))
                    continue
                # The group's shard, drawn by mass by its first batch (drawn again if
                # masses that came meanwhile left it none): each batch's marginal is
                # still shard by mass, then item as that shard draws.
                available = mass * self._up
                if group_shard is None or not available[group_shard] > 0:
                    group_shard = int(pick_shards(batch.rng, available / available.sum(),
                                                  1)[0])
                planned.append((batch, [(group_shard, count,
                                         int(batch.rng.integers(0, 2**63 - 1)))]))
            except Exception as exc:  # noqa: BLE001 - raised by finish, in the batch's turn
                batch.error = exc
        self._post(method, num_steps, within_episodes, planned)
        return batches

    def finish(self, batch: PendingBatch) -> tuple[Any, BufferInfo]:
        """Gather ``batch``'s parts; parts a shard could not give (down, empty, held
        back by its rate limiter) are drawn again from the others."""
        if batch.error is not None:
            raise batch.error
        key = batch.num_steps
        held = np.zeros(self._num_shards, bool)  # rate limiter held a part back
        empty = np.zeros(self._num_shards, bool)  # answered that it holds none
        while True:
            todo = 0
            for i, answer, n, index in batch.calls:
                try:
                    items, ids, probabilities = answer.part(index)
                except RayTaskError as exc:
                    cause = exc.as_instanceof_cause()
                    if isinstance(cause, EmptyBufferError):  # its mass was stale
                        empty[i] = True
                    elif isinstance(cause, RateLimitedError):  # the others take its part
                        held[i] = True
                    else:
                        raise cause from None
                    todo += n
                    continue
                except DRAWN_ERRORS as exc:  # answered in band: drawn again, as above
                    if isinstance(exc, EmptyBufferError):
                        empty[i] = True
                    else:
                        held[i] = True
                    todo += n
                    continue
                except RayError:
                    self._health.down(i)
                    todo += n
                    continue
                got = answer.reply()
                self._health.observe(i, got[4])
                self._set_mass(key, i, got[3])
                batch.parts.append(Part(i, items, ids, probabilities, int(got[4][0])))
            batch.calls = []
            if not todo:
                break
            mass = self._current_mass(key) * self._up * ~held * ~empty
            if not mass.sum() > 0:
                if not any(self._up):
                    raise ShardsUnavailableError(f"all {self._num_shards} shards are down")
                if not held.any():  # the others answered empty: nothing to draw
                    raise self._empty(batch)
                if batch.deadline is not None and time.monotonic() >= batch.deadline:
                    raise RateLimitedError(f"{batch.method}: every shard's rate limiter "
                                           f"held the sample back for {batch.timeout} s")
                # Every shard with mass held its part back (each waited SHARD_WAIT_S):
                # ask all again, with fresh masses (writers may have filled others).
                self.refresh(key)
                held[:] = False
                mass = self._mass[key] * self._up * ~empty
                if not mass.sum() > 0:
                    raise self._empty(batch)
            self._post(batch.method, key, batch.within_episodes,
                       [(batch, self._plan(batch, todo, mass, first=False))])
        available = self._current_mass(key) * self._up * ~held * ~empty
        # Batches of every shard stay writable, as they always were (one part is
        # copied); the modes of k shards hand one part over as Ray maps it.
        return combine(batch.parts, available, self._num_shards, self._beta, batch.rng,
                       zero_copy=self.shards_per_batch is not None or batch.one_shard)

    def _empty(self, batch: PendingBatch) -> EmptyBufferError:
        return EmptyBufferError(f"{batch.method}: no shard holds a sample of "
                                f"{batch.num_steps or 1} step(s)")

    def _plan(self, batch: PendingBatch, todo: int, mass: np.ndarray, first: bool
              ) -> list[tuple[int, int, int]]:
        """Split ``todo`` samples over the shards by ``mass`` (the first time as
        :attr:`shards_per_batch` says; parts drawn again always by a multinomial, so
        each stays drawn by mass): ``(shard, count, seed)`` per shard that gives."""
        p = mass / mass.sum()
        k = self.shards_per_batch
        if first and k is not None:
            picks = pick_shards(batch.rng, p, min(k, todo))
            sizes = todo // len(picks) + (np.arange(len(picks)) < todo % len(picks))
            split = np.bincount(picks, weights=sizes, minlength=self._num_shards)
        else:
            split = batch.rng.multinomial(todo, p)
        return [(i, int(n), int(batch.rng.integers(0, 2**63 - 1)))
                for i, n in enumerate(split.astype(np.int64)) if n]

    def _post(self, method: str, num_steps: int | None, within_episodes: bool,
              planned: list[tuple[PendingBatch, list[tuple[int, int, int]]]]) -> None:
        """Send the ``planned`` parts of batches, one call per shard (its parts in the
        batches' order), and note each batch's calls."""
        per_shard: dict[int, list[tuple[PendingBatch, int, int]]] = {}
        for batch, parts in planned:
            for i, n, seed in parts:
                per_shard.setdefault(i, []).append((batch, n, seed))
        for i in sorted(per_shard):  # each batch's parts in the order of its shards
            parts_of_shard = per_shard[i]
            counts = [n for _, n, _ in parts_of_shard]
            runs = inline_runs(self._packing, counts, num_steps) \
                if method == "get_next" else None
            call = (method, [(n, seed) for _, n, seed in parts_of_shard], num_steps,
                    SHARD_WAIT_S, within_episodes, runs)
            if runs is None:
                refs = [self._actors[i].draw.remote(call)]
                runs = [len(counts)]
            else:  # answers that stay inside Ray's reply (see INLINE_BYTES)
                refs = self._actors[i].draw.options(num_returns=len(runs)).remote(call)
            start = 0
            split = SplitReplies(refs) if len(runs) > 1 else None  # one reply: one get
            for number, (ref, size) in enumerate(zip(refs, runs)):
                answer = DrawAnswer(ref, self._packing, counts[start:start + size],
                                    num_steps, split, number)
                for index, (batch, n, _) in enumerate(parts_of_shard[start:start + size]):
                    batch.calls.append((i, answer, n, index))
                start += size

    # ------------------------------------------------------------------- masses
    def _current_mass(self, key: int | None) -> np.ndarray:
        """The kept masses for windows of ``key`` steps (asked and waited for the first
        time), after taking in answers to earlier questions and asking again, without
        waiting, when they are older than :data:`MASS_REFRESH_S`. An answer to a
        question sent before a fresher mass of its shard came (with a draw's or an
        update's answer) is dropped: applied, it would put back the mass from before."""
        if key not in self._mass:
            self.refresh(key)
            return self._mass[key]
        asking = self._asking.get(key)
        if asking:
            ready = ray.wait(list(asking), num_returns=len(asking), timeout=0)[0]
            for ref in ready:
                i, sent = asking.pop(ref)
                try:
                    mass, status = ray.get(ref)
                except RayError:
                    self._health.down(i)
                    continue
                self._health.observe(i, status)
                if self._set_at[key][i] <= sent:  # else a fresher mass came meanwhile
                    self._set_mass(key, i, mass)
        heard = self._heard[key]
        stale = heard < time.monotonic() - MASS_REFRESH_S
        if stale.any():
            # Per shard: one that has not answered its question is not asked again,
            # and does not keep the others from being asked.
            if asking is None:
                asking = self._asking[key] = {}
            waiting = {shard for shard, _ in asking.values()}
            for shard in np.flatnonzero(stale).tolist():
                if self._up[shard] and shard not in waiting:
                    asking[self._actors[shard].mass_status.remote(key)] = (shard,
                                                                           self._clock)
            heard[stale] = time.monotonic()  # asked: not again until then
        return self._mass[key]

    def _set_mass(self, key: int | None, shard: int, mass: float) -> None:
        """``shard``'s mass for windows of ``key`` steps, as an answer brought it now."""
        cached = self._mass.get(key)
        if cached is not None:
            cached[shard] = mass
            self._heard[key][shard] = time.monotonic()
            self._clock += 1
            self._set_at[key][shard] = self._clock

    def refresh(self, key: int | None) -> None:
        """Ask every shard that is up for its mass for windows of ``key`` steps, and
        wait for the answers."""
        mass = np.zeros(self._num_shards)
        refs = {i: a.mass_status.remote(key) for i, a in enumerate(self._actors)
                if self._up[i]}
        for i, ref in refs.items():
            try:
                mass[i], status = ray.get(ref)
            except RayError:
                self._health.down(i)
                continue
            self._health.observe(i, status)
        self._mass[key] = mass
        self._heard[key] = np.full(self._num_shards, time.monotonic())
        self._clock += 1
        self._set_at[key] = np.full(self._num_shards, self._clock, np.int64)
        self._asking.pop(key, None)

    def set_masses(self, shard: int, masses: dict[int | None, float]) -> None:
        """A shard's sampling masses as it reported them with an answer."""
        for key, value in masses.items():
            self._set_mass(key, shard, value)
