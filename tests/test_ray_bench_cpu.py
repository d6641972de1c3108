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


class CountingWriter:
    """A writer that notes the steps it was given and when."""

    def __init__(self):
        self.steps, self.flushed = [], False

    def extend(self, items):
        self.steps.append(len(items["step_type"][0]))

    def flush(self):
        self.flushed = True


def test_a_paced_collector_writes_no_faster_than_its_rate_and_an_unpaced_one_does():
    from replaybuffer_bench.processes import WORKLOADS
    from replaybuffer_bench.ray_bench import CHUNK, PACE_STEPS, Collector

    collector = Collector(WORKLOADS["control"][0](), 0)
    paced = CountingWriter()
    sent = collector.collect(paced, 0.5, rate=2000.0)
    assert sent == sum(paced.steps) and paced.flushed
    # ahead of its rate by less than PACE_STEPS before the extend it then started
    assert 0 < sent < 2000 * 0.5 + PACE_STEPS + CHUNK
    free = CountingWriter()
    assert collector.collect(free, 0.5) > 4 * (2000 * 0.5 + PACE_STEPS + CHUNK)


def test_per_operation_figures_divide_each_part_by_its_own_operations():
    from replaybuffer_bench.ray_bench import per_operation

    roles = {"writes": 2.0, "calls": 0.5, "main": 0.08, "ray": 0.4}
    op = per_operation(120.0, 3.0, roles, shards=4, batches=1000, steps=1_000_000,
                       seconds=2.0)
    assert op == {"learner_us_per_batch": 120.0, "shard_draw_us_per_batch": 500.0,
                  "collector_us_per_step": 3.0, "shard_write_us_per_step": 2.0,
                  "shard_main_ms_per_s": 10.0, "shard_ray_ms_per_s": 50.0}
    blank = per_operation(None, None, None, shards=4, batches=0, steps=0, seconds=2.0)
    assert set(blank.values()) == {None}


def test_a_shards_threads_are_told_apart_by_role():
    from replaybuffer_bench.shard_threads import role_of

    pid, writes, name = 100, 105, "ray::ShardActor"
    assert role_of(100, name, pid, writes, name) == "main"
    assert role_of(105, name, pid, writes, name) == "writes"
    assert role_of(107, name, pid, writes, name) == "calls"
    assert role_of(101, "worker.io", pid, writes, name) == "ray"
    assert role_of(102, "client.poll0", pid, writes, name) == "ray"


@linux
def test_a_thread_meter_puts_a_busy_threads_cpu_in_its_role():
    import threading

    from replaybuffer_bench.shard_threads import ShardThreadMeter

    go, burned, leave = threading.Event(), threading.Event(), threading.Event()
    tid: list[int] = []

    def busy():
        tid.append(threading.get_native_id())
        go.wait()
        end = time.thread_time() + 0.3
        while time.thread_time() < end:
            pass
        burned.set()
        leave.wait()

    worker = threading.Thread(target=busy)
    worker.start()
    while not tid:
        time.sleep(0.01)
    meter = ShardThreadMeter([(os.getpid(), tid[0])])  # the busy thread as "writes"
    meter.start()
    go.set()
    burned.wait()
    meter.stop()
    leave.set()
    worker.join()
    assert meter.spent is not None
    assert 0.3 <= meter.spent["writes"] < 0.45
    assert meter.spent["main"] < 0.1  # this thread waited
    assert meter.spent["calls"] < 0.05  # the other threads named as the main one idle


@pytest.mark.parametrize("rate", ["0", "-5", "nan", "inf", "fast"])
def test_an_insert_rate_that_is_not_above_0_is_refused_before_anything_starts(rate, capsys):
    """A rate of 0 or below divided by zero or slept a negative time in each collector."""
    from replaybuffer_bench import ray_bench

    with pytest.raises(SystemExit) as exit_info:
        ray_bench.main(["--insert-rate", rate])
    assert exit_info.value.code == 2
    assert f"expected steps a second above 0, got {rate!r}" in capsys.readouterr().err
