"""A cache of a transition buffer's newest steps, laid out as column arrays that never
change: what adapters hand out as views of runs of consecutive steps.

Built by :meth:`replaybuffer.TransitionReplayBuffer.flat_reads` (through
:class:`~replaybuffer.buffers.flat_reads.FlatReads`, whose ``run`` is
:meth:`RecentSteps.run`), which gives it the buffer's parts.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, NamedTuple, Protocol, Sequence

import numpy as np

from replaybuffer.errors import EmptyBufferError

if TYPE_CHECKING:
    from replaybuffer.sampling import Ring
    from replaybuffer.specs import ArraySpec
    from replaybuffer.storage.side_store import SideStore


class CoreBuffer(Protocol):
    """The buffer a cache serves: its ``generation`` changes on every clear and
    restore; ``empty_error()`` is the error for reading it empty."""

    @property
    def generation(self) -> int: ...

    def empty_error(self, num_steps: int = 1, action: str = "sampling the buffer"
                    ) -> Exception: ...


class NextObservations(NamedTuple):
    """A transition buffer's next-observation parts for one array observation leaf.

    Attributes:
        side: the side store of next observations that are not stored steps.
        side_ref: int64 ``[positions]``: a step's slot in ``side``, -1 for none.
        head: ``[num_envs, *spec.shape]``: the newest step's next observations.
    """

    side: SideStore
    side_ref: np.ndarray
    head: np.ndarray


class RecentSteps:
    """The newest steps' transitions, oldest first, as column arrays that never change.

    Adapters whose reads return runs of consecutive steps as views (compat.pearl's
    ``last``, ``all`` and ``RolloutBuffer.sample``, which Pearl sliced from its own
    arrays) read them here: each step's transition (observation, action, reward, its exact
    next observation, ``done`` as float32) is copied once, when first read after its
    add, into arrays in time order; a run is then a slice of them, whatever the ring.

    Layout: arrays of ``capacity * num_envs`` rows, time-major like storage (row
    ``(step - first) * num_envs + env``); observations and actions in their specs'
    shapes, scalars with a trailing axis of 1 (as Pearl returns them), rewards and dones ``[rows, 1]`` float32. Rows
    ``[0, count * num_envs)`` hold steps ``first .. first + count - 1``. Reads see
    them as ``[capacity, num_envs, ...]`` (``[capacity, ...]`` without an env axis),
    through read-only views for numpy outputs and writable ones for tensors (torch
    warns about read-only arrays).

    Rows are written once: new steps go to rows past ``count``, and when those run out
    the newest ``window`` steps move into fresh arrays (amortised over
    ``capacity - window`` adds). Views handed out therefore never change, also when
    the ring wraps; a clear or restore (``core.generation``) starts afresh. Next
    observations are immutable too: a step's is the one that was added (the following
    step's observation, the side store's, or for the newest step its own), whatever
    is added later.

    Memory: ``window`` is the longest run asked for (``all`` and
    ``RolloutBuffer.sample`` ask for the whole ring), ``capacity`` 1.25 times that;
    per step two observations, an action and 8 bytes.
    """

    def __init__(self, core: CoreBuffer, ring: Ring, lock: threading.Lock,
                 arrays: Sequence[np.ndarray], specs: Sequence[ArraySpec], read: list[int],
                 next_obs: NextObservations, env_axis: bool):
        """``core``: the buffer (its ``generation`` tells clears and restores); ``ring``
        and ``lock`` its ring and lock; ``arrays`` and ``specs`` its numpy storage's, of which ``read`` names
        the observation, action, reward and terminated leaves; ``next_obs`` its side
        store, side references and newest next observation; ``env_axis``: views carry
        the env axis (``[steps, num_envs, ...]``)."""
        self.core, self.ring, self.lock = core, ring, lock
        self.next_obs = next_obs
        self.B = self.ring.batch_size
        self.per_step = (self.B,) if env_axis else ()  # a step's rows, as reads see them
        obs, act, rew, term = (arrays[i] for i in read)
        self.sources = (obs, act, rew, obs, term)  # next observations: obs, shifted
        # Pearl's trailing 1 of scalar observations and actions, rewards and dones.
        self.shapes = (specs[read[0]].shape or (1,), specs[read[1]].shape or (1,), (1,),
                       specs[read[0]].shape or (1,), (1,))
        self.dtypes = (obs.dtype, act.dtype, np.dtype(np.float32), obs.dtype,
                       np.dtype(np.float32))
        self.arrays: tuple[np.ndarray, ...] = ()
        self.targets: tuple[np.ndarray, ...] = ()  # the arrays in storage's shapes
        self.steps: tuple[tuple[np.ndarray, ...], ...] = ((), ())  # read-only, writable
        self.first = self.count = self.window = 0
        self.generation = -1

    def run(self, first: int | None, steps: int | None, window: int, writable: bool
            ) -> tuple[np.ndarray, ...]:
        """Observations, actions, rewards, next observations and dones of ``steps``
        consecutive steps (``None``: every one stored) from ``first`` (``None``: the
        newest ``steps``, as the buffer's ``last``): ``[steps, num_envs, ...]`` views (``[steps, ...]`` without an env axis), read-only unless
        ``writable``. Keeps ``window`` steps from now on (or more). Takes the lock.

        The views stay valid and unchanged for good: nothing ever writes those rows
        again. Callers must not write into them either (later reads return the same
        rows): numpy outputs are read-only; a tensor made of them must be cloned
        before an in-place change.

        Raises:
            EmptyBufferError: asking for more steps than are stored, or steps that are
                not stored.
        """
        ring = self.ring
        with self.lock:
            last_id = ring.last_id
            if first is None:
                held = min(last_id + 1, ring.max_length)
                if steps is None:
                    steps = held
                elif steps > held:
                    raise EmptyBufferError(f"last({steps}) asks for more transitions than "
                                           f"each env holds ({held})")
                first = last_id - steps + 1
            elif steps is None:
                raise ValueError("run: steps=None reads from the oldest step (first=None)")
            elif first < last_id + 1 - ring.max_length or first < 0 or \
                    first + steps - 1 > last_id:
                self.check_held(first, first + steps - 1)
            start = first - self.first
            # Steps added since the last catch-up are copied in when a read needs them
            # (a RolloutBuffer.sample of older steps does not).
            if start < 0 or start + steps > self.count or window > self.window or \
                    self.core.generation != self.generation:
                self.catch_up(max(window, last_id - first + 1))
                start = first - self.first
            stop = start + steps
            return tuple(x[start:stop] for x in self.steps[writable])

    def check_held(self, low: int, high: int) -> None:
        """``EmptyBufferError`` unless steps ``low..high`` are stored."""
        ring = self.ring
        if ring.last_id < 0:
            raise self.core.empty_error()
        if low < ring.oldest_id or high > ring.last_id:
            raise EmptyBufferError(f"steps {low}..{high} are not stored "
                                   f"(held: {ring.oldest_id}..{ring.last_id})")

    def catch_up(self, window: int) -> None:
        """Copy in the steps added since the last read (the lock held); keep at least
        the newest ``window`` steps."""
        ring, generation = self.ring, self.core.generation
        window = min(window, ring.max_length)  # (older steps are not stored)
        last_id = ring.last_id
        synced = self.first + self.count - 1
        new = last_id - synced
        if generation != self.generation or window > self.window or new > self.window:
            self.window = max(window, self.window) if generation == self.generation \
                else window
            self.generation = generation
            held = min(self.window, ring.items_per_row)
            self._allocate()
            self.first, self.count = last_id - held + 1, 0
            self._fill(self.first, held)
            return
        if new <= 0:
            return
        if (self.count + new) * self.B > len(self.arrays[0]):  # full: move to fresh arrays
            keep = min(self.count, self.window - new)
            old = self.arrays
            self._allocate()
            rows = keep * self.B
            for dst, src in zip(self.arrays, old):
                dst[:rows] = src[(self.count - keep) * self.B:self.count * self.B]
            self.first, self.count = synced - keep + 1, keep
        self._fill(synced + 1, new)

    def _allocate(self) -> None:
        rows = (self.window + max(self.window // 4, 64)) * self.B
        self.arrays = tuple(np.empty((rows,) + shape, dtype)
                            for shape, dtype in zip(self.shapes, self.dtypes))
        # Written through views in storage's shapes (a scalar's trailing 1 dropped).
        self.targets = tuple(a.reshape((rows,) + src.shape[1:])
                             for a, src in zip(self.arrays, self.sources))
        outer = (rows // self.B,) + self.per_step
        writable = tuple(a.reshape(outer + a.shape[1:]) for a in self.arrays)
        read_only = tuple(a.view() for a in writable)
        for a in read_only:
            a.flags.writeable = False
        self.steps = (read_only, writable)

    def _fill(self, first: int, steps: int) -> None:
        """Copy steps ``first .. first + steps - 1`` (stored) to rows from ``count``."""
        if steps <= 0:
            return
        B, ring, next_obs = self.B, self.ring, self.next_obs
        capacity = ring.capacity
        row, n = self.count * B, steps * B
        end = row + n
        start = first % ring.max_length * B
        obs, act, rew, nxt, done = self.targets
        obs_s, act_s, rew_s, _, term_s = self.sources
        if start + n <= capacity:  # one run of storage (all but the wrap's)
            stop = start + n
            obs[row:end] = obs_s[start:stop]
            act[row:end] = act_s[start:stop]
            rew[row:end] = rew_s[start:stop]
            done[row:end] = term_s[start:stop]
            side = next_obs.side_ref[start:stop]
        else:
            for dst, src in ((obs, obs_s), (act, act_s), (rew, rew_s), (done, term_s)):
                copy_rows(dst, row, src, start, n, capacity)
            side = np.empty(n, np.int64)
            copy_rows(side, 0, next_obs.side_ref, start, n, capacity)
        self.count += steps
        # A step's next observation is the following step's observation (just copied,
        # but for the last step's), except where the side store keeps the one added
        # (episode ends, out-of-sequence adds); the newest step's is its own (head),
        # for every env (also where it ended: the side store holds the same).
        newest = end - B
        if steps > 1:
            nxt[row:newest] = obs[row + B:end]
        if first + steps - 1 == ring.last_id:
            nxt[newest:end] = next_obs.head
            side = side[:n - B]
        else:
            copy_rows(nxt, newest, obs_s, start + n, B, capacity)
        if len(side):
            from_side = side >= 0
            if np.count_nonzero(from_side):
                nxt[row + np.flatnonzero(from_side)] = next_obs.side.take(side[from_side])[0]


def copy_rows(dst: np.ndarray, at: int, src: np.ndarray, start: int, n: int,
              capacity: int) -> None:
    """``dst[at:at + n] = src[start:start + n]``, rows of ``src`` taken modulo
    ``capacity`` (``n <= capacity``): one copy, or two where they wrap."""
    start %= capacity
    if start + n <= capacity:
        dst[at:at + n] = src[start:start + n]
        return
    cut = capacity - start
    dst[at:at + cut] = src[start:]
    dst[at + cut:at + n] = src[:n - cut]
