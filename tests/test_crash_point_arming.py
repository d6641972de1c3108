"""Crash points armed by a file (``REPLAYBUFFER_CRASH_ARMING``) while a process runs:
nothing armed without the file, the point read at each pass, its N passes counted from
the arming a process sees, re-arming (the same point too) starting the count afresh,
a sequence of points ending one process each in order (the line taken by the process
that ends there), the once file honoured, and bad values refused by name (by
:func:`arm` before anything is written; by the point when the file was written by
hand)."""

import os
import subprocess
import sys
import textwrap

import pytest

from replaybuffer import crash_points

POINT = "mmap.journal.recreate"

# Each "pass" line on stdin: one pass of POINT, then the number of passes so far.
CHILD = textwrap.dedent(f"""
    import sys
    from replaybuffer import crash_points
    print("ready", flush=True)
    for i, line in enumerate(sys.stdin, 1):
        crash_points.crash_point({POINT!r})
        print(i, flush=True)
""")


class Child:
    """A process passing the point when told, armed by ``arming``."""

    def __init__(self, arming, once=None):
        env = {**os.environ, "REPLAYBUFFER_CRASH_ARMING": str(arming)}
        env.pop("REPLAYBUFFER_CRASH_AT", None)
        if once is not None:
            env["REPLAYBUFFER_CRASH_ONCE"] = str(once)
        self.process = subprocess.Popen([sys.executable, "-c", CHILD], env=env, text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE)
        assert self.process.stdout.readline().strip() == "ready"

    def passes(self, n):
        """Pass the point ``n`` times; whether the process is still running."""
        for _ in range(n):
            self.process.stdin.write("pass\n")
            self.process.stdin.flush()
            if not self.process.stdout.readline():
                return False
        return True

    def end(self):
        """Close its stdin; its exit status and stderr."""
        try:
            self.process.stdin.close()
        except BrokenPipeError:
            pass
        code = self.process.wait(60)
        return code, self.process.stderr.read()


def test_without_the_file_nothing_is_armed(tmp_path):
    child = Child(tmp_path / "armed")
    assert child.passes(5)
    assert child.end()[0] == 0


def test_a_point_armed_while_the_process_runs_counts_from_the_arming(tmp_path):
    arming = tmp_path / "armed"
    child = Child(arming)
    assert child.passes(4)  # unarmed passes do not count toward N
    crash_points.arm(arming, f"{POINT}:2")
    assert child.passes(1)
    assert not child.passes(1)
    assert child.end()[0] == crash_points.CRASH_EXIT_CODE


def test_arming_the_same_point_again_starts_its_count_afresh(tmp_path):
    arming = tmp_path / "armed"
    crash_points.arm(arming, f"{POINT}:3")
    child = Child(arming)
    assert child.passes(2)
    crash_points.arm(arming, f"{POINT}:3")
    assert child.passes(2)  # 4 passes in all, 2 since the new arming
    assert not child.passes(1)
    assert child.end()[0] == crash_points.CRASH_EXIT_CODE


def test_disarming_and_another_point_leave_the_process_running(tmp_path):
    arming = tmp_path / "armed"
    crash_points.arm(arming, f"{POINT}:2")
    child = Child(arming)
    assert child.passes(1)
    crash_points.arm(arming)
    assert child.passes(3)
    crash_points.arm(arming, "shared.claim")  # armed, but not this point
    assert child.passes(3)
    assert child.end()[0] == 0


def test_a_sequence_ends_one_process_per_point_in_order(tmp_path):
    """A shard's process, then its restart, then the next: each ends at the next
    point, and the processes after them run on."""
    arming = tmp_path / "armed"
    crash_points.arm(arming, f"{POINT}:2", POINT)
    first, other = Child(arming), Child(arming)
    assert first.passes(1) and not first.passes(1)
    assert first.end()[0] == crash_points.CRASH_EXIT_CODE
    assert crash_points.still_armed(arming) == [POINT]
    restart = Child(arming)
    assert not restart.passes(1)  # the second point, counted afresh: its first pass
    assert restart.end()[0] == crash_points.CRASH_EXIT_CODE
    assert crash_points.still_armed(arming) == []
    assert other.passes(3)  # it passed the point before: taken by the others, not it
    assert Child(arming).passes(3)
    assert other.end()[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["armed"]


def test_the_once_file_lets_one_process_end_and_holds_the_next_off(tmp_path):
    arming, once = tmp_path / "armed", tmp_path / "crashed"
    crash_points.arm(arming, POINT, POINT)
    first = Child(arming, once)
    assert not first.passes(1)
    assert first.end()[0] == crash_points.CRASH_EXIT_CODE and once.exists()
    again = Child(arming, once)  # a restart with the same environment runs on
    assert again.passes(3)
    assert crash_points.still_armed(arming) == [POINT]  # held off, not taken
    once.unlink()  # armed again: the next pass ends it
    assert not again.passes(1)
    assert again.end()[0] == crash_points.CRASH_EXIT_CODE
    assert crash_points.still_armed(arming) == []


@pytest.mark.parametrize("value, message", [
    ("mmap.journal.recreat", "not a crash point; known: .*mmap.journal.recreate"),
    (f"{POINT}:0", "positive integer, got '0'"),
    ("", "each point must be one NAME or NAME:N, got ''"),
    (f"{POINT}\n{POINT}", "each point must be one NAME or NAME:N, got"),
])
def test_arm_refuses_a_bad_value_and_leaves_the_file_as_it_was(tmp_path, value, message):
    arming = tmp_path / "armed"
    crash_points.arm(arming, f"{POINT}:2")
    before = arming.read_text()
    with pytest.raises(ValueError, match=message):
        crash_points.arm(arming, POINT, value)
    assert arming.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["armed"]


def test_a_bad_name_written_by_hand_fails_at_the_pass_not_silently(tmp_path):
    arming = tmp_path / "armed"
    arming.write_text("no.such.point\n")
    child = Child(arming)
    assert not child.passes(1)
    code, stderr = child.end()
    assert code == 1 and "'no.such.point', which is not a crash point" in stderr


def test_both_variables_set_are_refused_by_name():
    with pytest.raises(ValueError, match="REPLAYBUFFER_CRASH_AT='shared.claim' and "
                                         "REPLAYBUFFER_CRASH_ARMING='/x' are both set"):
        crash_points.armed_at_import("shared.claim", "/x")
    assert crash_points.armed_at_import(None, "/x") is crash_points.BY_FILE
    assert crash_points.armed_at_import("shared.claim:2", None) == ("shared.claim", 2)
    assert crash_points.armed_at_import("", "") is None
