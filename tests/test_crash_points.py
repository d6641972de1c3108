"""The crash-point switch itself: parsing, refusal of unknown names, inert when off, and
a real process ended at the N-th pass with the documented exit status."""

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
