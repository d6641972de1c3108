"""The demo's ``learning_curve.png``: one run's learning curve, or two runs side by side
on one axis of environment steps (``replaybuffer demo --compare RESULT_JSON``).

Each run draws two lines in its own colour: the training return (solid: the average
undiscounted return of the last 20 episodes its collectors finished, at each
environment step where it was read) and the greedy evaluations (dashed, with markers:
the greedy policy's average return every ``eval_every`` environment steps, on the same
seeds for every run). Both are against environment steps, so two runs are compared at
equal environment steps whatever their wall time or number of collectors.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from replaybuffer_demos.dqn_learner import ENV_ID, DQNResult

SOLVED = 475.0
"""CartPole-v1 counts as solved at this average return."""


def run_label(result: dict[str, Any]) -> str:
    """A run's name in the legend: its collectors (``"run"`` in its result.json) and
    replay (``config.prioritized``), e.g. ``"2 Ray actors, prioritized"``."""
    replay = "prioritized" if result["config"].get("prioritized") else "uniform"
    return f"{result.get('run', 'single process')}, {replay}"


def _draw(ax: Any, result: dict[str, Any], colour: str) -> None:
    label = run_label(result)
    curve: Sequence[Sequence[float]] = result.get("curve") or []
    evaluations: Sequence[Sequence[float]] = result.get("evaluations") or []
    if curve:
        steps, returns = zip(*curve)
        ax.plot(steps, returns, color=colour, lw=1.2,
                label=f"{label}: training return (last 20 episodes)")
    if evaluations:
        steps, scores = zip(*evaluations)
        ax.plot(steps, scores, "o--", color=colour, ms=4,
                label=f"{label}: greedy evaluation")


def plot(result: DQNResult | dict[str, Any], path: Path,
         compare: dict[str, Any] | None = None) -> None:
    """Write the learning curve of ``result`` (a :class:`DQNResult` or its result.json
    as a dict) as a PNG at ``path``; with ``compare`` (another run's result.json, as
    a dict), that run's curves beside it on the same axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    this = asdict(result) if isinstance(result, DQNResult) else result
    fig, ax = plt.subplots(figsize=(8, 4.5))
    _draw(ax, this, "tab:blue")
    if compare is not None:
        _draw(ax, compare, "tab:orange")
    ax.axhline(SOLVED, color="grey", lw=0.8, ls=":", label=f"solved ({SOLVED:g})")
    ax.set_xlabel("environment steps")
    ax.set_ylabel("return")
    seed = this["config"]["seed"]
    title = (f"DQN on {ENV_ID}, seed {seed}: {run_label(this)}: last network's greedy "
             f"return {this['last_network_return']:.1f}")
    if compare is not None:
        title += (f"\nbeside {run_label(compare)} (seed {compare['config']['seed']}): "
                  f"{compare['last_network_return']:.1f}")
    else:
        title += (f"\n(best snapshot, step {this['best_step']}: "
                  f"{this['final_return']:.1f})")
    ax.set_title(title, fontsize="medium")
    ax.legend(loc="upper left", fontsize="x-small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
