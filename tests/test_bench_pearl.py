"""The Pearl seed benchmark (replaybuffer_bench.pearl_seed) and its rows in
``replaybuffer bench --peers``. Pearl itself lives in .venv-pearl
(benchmarks/setup_pearl.sh); without it the rows say so. No timings are asserted."""

import numpy as np
import pytest

from replaybuffer_bench import pearl_seed, peers


def test_pearl_rows_say_not_installed_without_its_venv(monkeypatch, tmp_path):
    monkeypatch.setenv("VENV_PEARL", str(tmp_path / "nothing"))
    assert pearl_seed.pearl_python() is None
    rows = peers.run_peers(["pearl"], quick=True, peers=["pearl"])
    assert [r["op"] for r in rows] == list(pearl_seed.peer_ops())
    assert all(r["peer"] == "pearl" and r["status"].startswith("not installed")
               and r["seconds_per_call"] is None for r in rows)
    assert "not installed" in peers.format_rows(rows)


def test_the_other_peers_do_not_run_the_pearl_workload():
    assert [p.label for p in peers.PEERS if "pearl" in p.workloads] == ["pearl"]


@pytest.mark.parametrize("envs", [1, 3])
def test_the_stream_is_what_an_env_gives(envs):
    data = pearl_seed.stream(envs, length=400)
    ends = 0
    for (obs, action, reward, next_obs, term, trunc), following in zip(data, data[1:] + data[:1]):
        assert obs.dtype == next_obs.dtype == action.dtype == np.float32
        ended = np.asarray(term) | np.asarray(trunc)
        assert not (np.asarray(term) & np.asarray(trunc)).any()
        if envs == 1:
            assert obs.shape == (17,) and action.shape == (6,)
            assert type(reward) is float and type(term) is bool and type(trunc) is bool
            assert (following[0] is next_obs) != bool(ended)
        else:
            assert obs.shape == (envs, 17) and reward.shape == (envs,)
            same = (following[0] == next_obs).all(axis=1)
            np.testing.assert_array_equal(same, ~ended)
        ends += int(ended.sum())
    assert ended.all() and ends > 1  # the last step ends every episode: cycles are whole
