"""Collection with many processes: actors that step their own envs and write straight
into a :class:`~replaybuffer.distributed.SharedReplayBuffer`.

Each actor process builds its env (``make_env()``, a vector env, one row of the buffer
per sub-env) and its policy (``make_policy(index)``), and runs a
:class:`~replaybuffer.collect.StepDriver` whose observer is the shared buffer's
``add_batch``: trajectories go into shared memory, never through a pipe. A rate
limiter on the buffer paces the actors against the learner; an actor held back waits
in short rounds so that :meth:`ActorPool.stop` ends it promptly.

``make_env`` and ``make_policy`` must pickle (module-level functions or
``functools.partial`` of them): actors are started with the ``spawn`` method.
"""

from __future__ import annotations

import multiprocessing as mp
import traceback
from typing import Any, Callable

from replaybuffer.collect.driver import StepDriver
from replaybuffer.rate_limiter import RateLimitedError

__all__ = ["ActorPool"]


class _Stopped(Exception):
    """Raised inside an actor's observer to leave the driver when the pool stops."""


def _act(buffer: Any, make_env: Callable[[], Any], make_policy: Callable[[int], Any],
         index: int, seed: int, steps_per_run: int, stop: Any, errors: Any) -> None:
    def add(trajectory: Any) -> None:
        while not stop.is_set():
            try:
                buffer.add_batch(trajectory, timeout=0.2)
                return
            except RateLimitedError:
                continue
        raise _Stopped

    try:
        env = make_env()
        driver = StepDriver(env, make_policy(index), [add], num_steps=steps_per_run,
                            seed=seed)
        while not stop.is_set():
            driver.run()
    except _Stopped:
        pass
    except BaseException as exc:  # reported to the learner by ActorPool.check()
        errors.put((index, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
    finally:
        buffer.close()  # gives up this actor's rows


class ActorPool:
    """``num_actors`` processes collecting into ``buffer``.

    Args:
        buffer: a :class:`~replaybuffer.distributed.SharedReplayBuffer` whose spec is
            the driver's trajectory spec.
        make_env: builds one actor's (vector) env.
        make_policy: ``make_policy(actor_index)`` builds its policy
            (observations ``[num_envs, ...]`` to actions ``[num_envs, ...]``).
        num_actors: processes.
        steps_per_run: env steps per ``driver.run()`` between stop checks.
        seed: actor ``i`` seeds its env resets with ``seed + i``.
    """

    def __init__(self, buffer: Any, make_env: Callable[[], Any],
                 make_policy: Callable[[int], Any], num_actors: int,
                 steps_per_run: int = 64, seed: int = 0):
        if isinstance(num_actors, bool) or not isinstance(num_actors, int) or num_actors < 1:
            raise ValueError(f"num_actors must be a positive int, got {num_actors!r}")
        ctx = mp.get_context("spawn")
        self._stop = ctx.Event()
        self._errors = ctx.Queue()
        self._processes = [
            ctx.Process(target=_act, name=f"replaybuffer-actor-{i}", daemon=True,
                        args=(buffer, make_env, make_policy, i, seed + i, steps_per_run,
                              self._stop, self._errors))
            for i in range(num_actors)]

    def start(self) -> "ActorPool":
        for process in self._processes:
            process.start()
        return self

    def check(self) -> None:
        """Raise ``RuntimeError`` if an actor failed (its error and traceback) or ended
        without being stopped."""
        if not self._errors.empty():
            index, error, trace = self._errors.get()
            raise RuntimeError(f"actor {index} failed: {error}\n{trace}")
        for process in self._processes:
            if process.exitcode is not None and not self._stop.is_set():
                raise RuntimeError(f"{process.name} ended (exit code {process.exitcode})")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every actor (killing those that do not end within ``timeout``)."""
        self._stop.set()
        for process in self._processes:
            if process.pid is None:
                continue
            process.join(timeout)
            if process.is_alive():
                process.kill()
                process.join()

    def __enter__(self) -> "ActorPool":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
