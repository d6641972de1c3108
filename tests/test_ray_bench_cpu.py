"""The CPU accounting of ``bench --ray`` (``replaybuffer_bench.process_cpu``): which
processes are the driver's, and the CPU they spend, read from Linux's ``/proc``."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from replaybuffer_bench.process_cpu import CpuMeter, cpu_seconds, descendants
from replaybuffer_bench.ray_bench import format_cpu

linux = pytest.mark.skipif(not os.path.isdir("/proc/self/task"),
                           reason="reads Linux's /proc")

BUSY = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"


@linux
def test_descendants_are_children_and_theirs_and_not_others():
    # a child that starts a grandchild and waits for it
    code = ("import subprocess, sys; subprocess.run([sys.executable, '-c', "
            "'import time; time.sleep(30)'])")
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 30
        while not descendants(child.pid):
            assert time.monotonic() < deadline, "the grandchild never started"
            time.sleep(0.05)
        # This process may have other children (a multiprocessing resource tracker
        # left by an earlier test): the child's own line is what is pinned.
        (grandchild,) = descendants(child.pid)
        below = descendants(os.getpid())
        assert child.pid in below and grandchild in below
        assert os.getpid() not in below and os.getppid() not in below
        assert descendants(grandchild) == []
    finally:
        for pid in descendants(child.pid):
            os.kill(pid, 9)
        child.kill()
        child.wait()


@linux
def test_a_meter_counts_what_a_busy_process_spends_and_none_for_others():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)\n" + BUSY])
    try:
        meter = CpuMeter([child.pid])
        meter.start()
        child.wait()  # the process ends: what it spent until then is gone with it
        meter.stop()
        assert meter.spent([child.pid]) is None
        assert meter.spent([12345678]) is None
        me = CpuMeter([os.getpid()])
        me.start()
        exec(compile(BUSY, "busy", "exec"), {})
        me.stop()
        spent = me.spent([os.getpid()])
        assert spent is not None and spent >= 0.3
        assert cpu_seconds(os.getpid()) >= spent
    finally:
        child.kill()
        child.wait()


def test_cpu_figures_are_formatted_with_gaps_where_none_was_read():
    row = {"cpu_us_per_batch": {"learner": 512.4, "shards": 1400.0, "collectors": None,
                                "ray": 20.2}, "idle_shard_cpu_ms_per_s": 9.04}
    assert format_cpu(row) == "512 / 1,400 / - / 20 (idle shard 9.0 ms/s)"
    assert format_cpu({}) == "- / - / - / -"
