"""``RayReplayBuffer.close`` reads what its shards answer (``distributed/ray_shards/
health.py``, ``close_shards``) and the acknowledgements' outcomes are never left
unread (``Acknowledgements``), on a local Ray cluster (num_cpus=2):

- a shard whose temporary files cannot be removed, or that does not answer within the
  close's bound, is a ``RuntimeWarning`` naming it and the cause (on 324fdec the
  removals' outcomes were never read: silent);
- a dead shard is skipped silently; close is idempotent and never raises for it;
- acknowledgements still in flight at the close are read there (on 324fdec dropped
  unread, which Ray logs as unhandled errors);
- several failed acknowledgements ready together are all read even where warnings
  are errors (on 324fdec the first warning stopped the loop and the rest went unread).
"""

from __future__ import annotations

import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from ray_cluster import record_unhandled_errors, free_dropped_refs, start_local_cluster  # noqa: E402


import replaybuffer as rb  # noqa: E402
from replaybuffer.distributed import RayReplayBuffer  # noqa: E402
from replaybuffer.distributed.ray_shards.health import Acknowledgements  # noqa: E402
from replaybuffer.distributed.ray_shards.shard_home import ShardHome  # noqa: E402

SPEC = {"x": rb.ArraySpec((), np.int64)}


def uniform():
    return rb.UniformReplayBuffer(SPEC, 1, 100, seed=0)


@pytest.fixture(scope="module", autouse=True)
def cluster():
    start_local_cluster()
    yield
    ray.shutdown()


@pytest.fixture
def unhandled(monkeypatch):
    """The errors Ray would log as unhandled (its handler, patched to record them)."""
    return record_unhandled_errors(monkeypatch)


class SlowRemoval:
    def remove(self) -> None:
        time.sleep(8.0)


def break_removal(shard) -> str:
    """Run in the shard (``__ray_call__``): its home becomes a file where its files'
    removal expects a directory (a real OSError in ``ShardHome.remove``)."""
    home = Path(shard.files.home)
    shutil.rmtree(home, ignore_errors=True)
    home.write_text("not a directory")
    return str(home)


def slow_removal(shard) -> None:
    shard.files = SlowRemoval()


def home_of(shard) -> str:
    return str(shard.files.home)


@ray.remote(max_restarts=0, max_task_retries=0)
class Refusing:
    """Answers ``acknowledge`` with an error, after ``delay`` s."""

    def acknowledge(self, shard: int, delay: float) -> None:
        time.sleep(delay)
        raise OSError(f"cannot store shard {shard}'s acknowledgement")


def test_a_shard_whose_files_cannot_be_removed_is_a_warning_naming_it(unhandled):
    buffer = RayReplayBuffer(uniform, 2, seed=0)
    buffer.extend({"x": np.arange(5)[None]}, shard=1)
    buffer.flush()
    broken = Path(ray.get(buffer.actors[1].__ray_call__.remote(break_removal)))
    kept = Path(ray.get(buffer.actors[0].__ray_call__.remote(home_of)))
    assert kept.is_dir()
    with pytest.warns(RuntimeWarning, match=r"closing the Ray buffer: shard 1 could not "
                      r"remove its temporary files \(OSError: could not remove "
                      r"\S*shard-001: NotADirectoryError: .*Not a directory"):
        buffer.close()
    assert not kept.exists()  # shard 0's went
    assert buffer.actors == ()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        buffer.close()  # again: nothing to do, nothing said
    broken.unlink()
    free_dropped_refs()
    assert unhandled == []


def test_a_dead_shard_is_skipped_silently_and_close_is_idempotent(unhandled):
    buffer = RayReplayBuffer(uniform, 2, seed=0)
    ray.kill(buffer.actors[0], no_restart=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning, no error for the dead shard
        buffer.close()
        buffer.close()
    assert buffer.actors == ()
    free_dropped_refs()
    assert unhandled == []


def test_a_shard_that_does_not_answer_in_time_is_a_warning(unhandled):
    buffer = RayReplayBuffer(uniform, 2, seed=0)
    ray.get(buffer.actors[0].__ray_call__.remote(slow_removal))
    start = time.monotonic()
    with pytest.warns(RuntimeWarning, match=r"shard 0 did not answer within 5 s: its "
                      r"temporary files may stay"):
        buffer.close()
    assert time.monotonic() - start < 30  # bounded (5 s, then the kill)
    free_dropped_refs()
    assert unhandled == []  # its removal's error (the kill) was read after the kill


def test_acknowledgements_in_flight_at_close_are_read(unhandled):
    buffer = RayReplayBuffer(uniform, 2, seed=0)
    refusing = Refusing.remote()
    acks = buffer._health.acknowledgements
    acks.sent(refusing.acknowledge.remote(1, 1.5), 1)  # back after the close began
    with pytest.warns(RuntimeWarning, match=r"closing the Ray buffer: shard 1 could not "
                      r"take the client's acknowledgement of its loss \(OSError: cannot "
                      r"store shard 1's acknowledgement\)"):
        buffer.close()
    assert acks.in_flight == 0
    ray.kill(refusing, no_restart=True)
    free_dropped_refs()
    assert unhandled == []


def test_failed_acknowledgements_ready_together_are_all_read_under_W_error(unhandled):
    refusing = Refusing.remote()
    acks = Acknowledgements()
    refs = [refusing.acknowledge.remote(shard, 0.0) for shard in range(3)]
    for shard, ref in enumerate(refs):
        acks.sent(ref, shard)
    ray.wait(refs, num_returns=3, timeout=30)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning, match=r"shards \[0, 1, 2\] could not take the "
                           r"client's acknowledgements of their losses \(shard 0: OSError"
                           r".*shard 1: OSError.*shard 2: OSError"):
            acks.collect()
    assert acks.in_flight == 0
    del refs
    ray.kill(refusing, no_restart=True)
    free_dropped_refs()
    assert unhandled == []


def test_shard_home_remove_reports_what_it_could_not_remove(tmp_path):
    """No cluster: the removal itself. Gone already is fine, a failure is an OSError
    naming the path and cause, a checkpoint directory is never removed."""
    home = ShardHome(tmp_path / "shard", temporary=True)
    assert (tmp_path / "shard" / "mark").exists()
    home.remove()
    assert not (tmp_path / "shard").exists()
    home.remove()  # again: nothing to do
    (tmp_path / "shard").write_text("not a directory")
    with pytest.raises(OSError, match=r"could not remove .*shard.*: NotADirectoryError"):
        home.remove()
    kept = ShardHome(tmp_path / "kept", temporary=False)
    kept.remove()
    assert (tmp_path / "kept" / "mark").exists()
