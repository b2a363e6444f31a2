"""Runs policy.act on seeded slippery gridworld episodes; prints {"Reward Mean": mean return}."""

import argparse
import contextlib
import json
import os
import random
import sys
try:  # gymforge runs the submission in a sandbox of its own and hands it over through gymforge_eval
    from gymforge_eval import import_submission
except ImportError:  # under MLGym it is imported into this process
    from importlib import import_module as import_submission

# gymforge keeps the held-out maps outside the workspace and names their directory in GYMFORGE_SECRETS;
# under MLGym they are a workspace file next to this script.
SECRETS = os.environ.get("GYMFORGE_SECRETS", os.path.dirname(os.path.abspath(__file__)))

MOVES = {"N": (-1, 0), "S": (1, 0), "E": (0, 1), "W": (0, -1)}
SLIP, MAX_MOVES, GAMMA, GOAL_REWARD = 0.15, 60, 0.96, 10.0
EPISODES_PER_MAP, SEED = 2, 9127


def episode(act, grid: tuple[str, ...], start: tuple[int, int], goal: tuple[int, int], seed: int) -> float:
    random.seed(seed)  # the policy's own randomness is reproducible too
    world = random.Random(seed + 7919)  # the slips; drawn every step, whatever the policy does
    position = start
    for t in range(1, MAX_MOVES + 1):
        move = act(grid, position, goal)
        if move not in MOVES:
            raise SystemExit(f"act returned {move!r}; expected one of 'N', 'S', 'E', 'W'")
        slipped, other = world.random() < SLIP, "NSEW"[min(3, int(world.random() * 4))]
        dr, dc = MOVES[other if slipped else move]
        row, column = position[0] + dr, position[1] + dc
        if 0 <= row < len(grid) and 0 <= column < len(grid[0]) and grid[row][column] != "#":
            position = (row, column)
        if position == goal:
            return GOAL_REWARD * GAMMA**t
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--maps", help="a JSON file of maps (default: the held-out maps)")
    args = parser.parse_args()
    with open(args.maps or os.path.join(SECRETS, "test_maps.json")) as f:
        maps = json.load(f)
    returns = []
    # The submitted module's prints go to stderr, so stdout stays one JSON object.
    with contextlib.redirect_stdout(sys.stderr):
        act = import_submission("policy").act

        for m, spec in enumerate(maps):
            grid, start, goal = tuple(spec["grid"]), tuple(spec["start"]), tuple(spec["goal"])
            for e in range(EPISODES_PER_MAP):
                returns.append(episode(act, grid, start, goal, SEED + 100 * m + e))
    print(json.dumps({"Reward Mean": round(sum(returns) / len(returns), 6)}))


if __name__ == "__main__":
    main()
