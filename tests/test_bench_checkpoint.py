"""The checkpoint benchmarks run on a small buffer: `bench --checkpoint`'s save and
load measurements and `benchmarks/save_stalls.py` (their figures are reported, never
asserted)."""

import re
import subprocess
import sys
from pathlib import Path

import replaybuffer as rb
from replaybuffer_bench import checkpoint

ROOT = Path(__file__).parent.parent


def test_measure_save_counts_the_whole_buffer_and_the_adds_beside_it(tmp_path):
    buffer = checkpoint.build(0.001)  # 1,000 frames, the smallest it builds
    before = buffer.last_id
    got = checkpoint.measure_save(buffer, tmp_path / "c", add_rate=2000)
    # every leaf's bytes, plus one .npy header per leaf
    assert buffer.nbytes < got["bytes"] <= buffer.nbytes + 4 * 4096
    assert buffer.last_id > before + got["adds_during"] > before  # 2 s of adds first
    saved = rb.load(got["checkpoint"])
    assert before < saved.last_id <= buffer.last_id
    load = checkpoint.measure_load(got["checkpoint"])
    assert load["gb_per_s"] > 0 and load["gb_per_cpu_s"] > 0
    read, read_cpu = checkpoint.measure_read(got["checkpoint"])
    assert read > 0 and read_cpu > 0


def test_save_stalls_prints_each_round_and_the_phases_it_timed():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "save_stalls.py"), "--size-gb", "0.01",
         "--rounds", "2", "--chunk-mb", "0.25", "--show", "2"],
        capture_output=True, text=True, timeout=300, check=True).stdout
    rounds = re.findall(r"^round (\d): save [\d.]+ s, (\d+) adds, longest [\d., ]+ ms$",
                        out, re.M)
    assert [r[0] for r in rounds] == ["0", "1"], out
    phases = re.findall(r"^  phases: (.*)$", out, re.M)
    assert len(phases) == 2, out
    for line in phases:  # 10 MB in 0.25 MiB chunks: the locked reads were timed
        assert "chunk read (locked)" in line and "crc32" in line and "fsync" in line, out


def test_load_only_alternates_reads_and_loads_of_a_checkpoint(tmp_path, capsys):
    written = checkpoint.build(0.001).save(tmp_path / "c")
    assert checkpoint.main(["--load-only", str(written), "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    assert len(re.findall(r"^round \d: load [\d.]+ GB/s \([\d.]+ per CPU second\), plain "
                          r"read [\d.]+ \([\d.]+\)$", out, re.M)) == 2, out
    assert re.search(r"^best of 2: load [\d.]+ GB/s vs read [\d.]+ \([\d.]+x\); per CPU "
                     r"second [\d.]+ vs [\d.]+ \([\d.]+x\)$", out, re.M), out
