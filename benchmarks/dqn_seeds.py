"""The DQN demo's quality bar: greedy return over 10 episodes for several seeds.

    python benchmarks/dqn_seeds.py [--seeds 0 1 2 3 4] [--steps N] [--json FILE]

CartPole-v1 is solved at an average return of 475. The demo's last network (the one
training ends with, not the best snapshot) must reach it for at least 4 of 5 seeds;
this prints the table for the notes.
"""

from __future__ import annotations

import argparse
import json
import sys

from replaybuffer_demos.dqn import DQNConfig, train


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=DQNConfig.steps)
    parser.add_argument("--prioritized", action="store_true", help="prioritized replay")
    parser.add_argument("--json", help="write the rows as JSON")
    args = parser.parse_args(argv)
    rows = []
    print("| seed | last network | best snapshot (step) | steps trained | stopped early | "
          "seconds |")
    print("|---|---|---|---|---|---|")
    for seed in args.seeds:
        result, _ = train(DQNConfig(steps=args.steps, seed=seed, prioritized=args.prioritized),
                          progress=False)
        rows.append({"seed": seed, "last_network_return": result.last_network_return,
                     "best_return": result.final_return, "best_step": result.best_step,
                     "steps_trained": result.steps_trained,
                     "stopped_early": result.stopped_early, "seconds": result.wall_seconds})
        print(f"| {seed} | {result.last_network_return:.1f} | {result.final_return:.1f} "
              f"({result.best_step}) | {result.steps_trained} | "
              f"{'yes' if result.stopped_early else 'no'} | {result.wall_seconds:.0f} |",
              flush=True)
    solved = sum(r["last_network_return"] >= 475 for r in rows)
    print(f"\nlast network solved (>= 475): {solved} of {len(rows)}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
