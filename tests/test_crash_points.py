"""The crash-point switch itself: parsing, refusal of unknown names, inert when off, a
real process ended at the N-th pass with the documented exit status, and the once file
that lets one process of several (a Ray shard and its restarts) end there."""

import os
import subprocess
import sys
import textwrap

import pytest

from replaybuffer import crash_points


def test_off_without_the_variable():
    assert ("REPLAYBUFFER_CRASH_AT" in os.environ) or crash_points.ARMED is None
    crash_points.crash_point("mmap.journal.recreate")  # unarmed: returns


@pytest.mark.parametrize("value, expected", [
    (None, None), ("", None),
    ("mmap.journal.recreate", ("mmap.journal.recreate", 1)),
    ("mmap.journal.recreate:3", ("mmap.journal.recreate", 3)),
])
def test_parse(value, expected):
    assert crash_points.parse(value) == expected


@pytest.mark.parametrize("value, message", [
    ("mmap.journal.recreat", "not a crash point; known: .*mmap.journal.recreate"),
    ("mmap.journal.recreate:0", "positive integer, got '0'"),
    ("mmap.journal.recreate:x", "positive integer, got 'x'"),
    ("mmap.journal.recreate:", "positive integer, got ''"),
])
def test_bad_values_are_refused_with_the_known_points(value, message):
    with pytest.raises(ValueError, match=message):
        crash_points.parse(value)


def test_every_point_has_a_description():
    assert crash_points.POINTS
    assert all(isinstance(v, str) and v for v in crash_points.POINTS.values())


CHILD = textwrap.dedent("""
    from replaybuffer import crash_points
    for i in range(5):
        print(i, flush=True)
        crash_points.crash_point("mmap.journal.recreate")
    print("never ended", flush=True)
""")


def run_child(value):
    env = {**os.environ, "REPLAYBUFFER_CRASH_AT": value}
    return subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                          text=True, timeout=60)


def test_an_armed_point_ends_the_process_at_its_nth_pass():
    out = run_child("mmap.journal.recreate:3")
    assert out.returncode == crash_points.CRASH_EXIT_CODE, out.stderr
    assert out.stdout.split() == ["0", "1", "2"]


def test_an_unknown_name_fails_at_import_not_silently():
    out = run_child("no.such.point")
    assert out.returncode == 1
    assert "not a crash point" in out.stderr


def run_once_child(value, once):
    env = {**os.environ, "REPLAYBUFFER_CRASH_AT": value, "REPLAYBUFFER_CRASH_ONCE": str(once)}
    return subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                          text=True, timeout=60)


def test_with_a_once_file_only_the_first_process_ends_and_a_restart_runs_on(tmp_path):
    """A process restarted with the same environment (a Ray shard actor) passes the
    point its predecessor ended at: the first one creates the file as it ends."""
    once = tmp_path / "crashed"
    first = run_once_child("mmap.journal.recreate:2", once)
    assert first.returncode == crash_points.CRASH_EXIT_CODE, first.stderr
    assert first.stdout.split() == ["0", "1"] and once.exists()
    again = run_once_child("mmap.journal.recreate:2", once)
    assert again.returncode == 0, again.stderr
    assert again.stdout.split() == ["0", "1", "2", "3", "4", "never", "ended"]


def test_a_once_file_made_beforehand_holds_the_point_off_until_removed(tmp_path):
    once = tmp_path / "crashed"
    once.touch()
    assert run_once_child("mmap.journal.recreate", once).returncode == 0
    once.unlink()  # armed again: the next process to reach it ends
    out = run_once_child("mmap.journal.recreate", once)
    assert out.returncode == crash_points.CRASH_EXIT_CODE and out.stdout.split() == ["0"]


def test_every_ray_point_is_placed_once_in_the_shards_home():
    """A Ray point listed but never placed would fail its soak scenario as 'never
    reached'; one placed twice would end the shard at either place."""
    from pathlib import Path
    from replaybuffer.distributed.ray_shards import shard_home
    text = Path(shard_home.__file__).read_text()
    ray_points = [name for name in crash_points.POINTS if name.startswith("ray.")]
    assert ray_points
    for name in ray_points:
        assert text.count(f'crash_point("{name}")') == 1, name
