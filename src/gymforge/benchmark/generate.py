"""The data files of the built-in benchmark suite, generated deterministically.

`python -m gymforge.benchmark.generate [ROOT]` rewrites them under ROOT (default: the shipped tree);
`tests/benchmark/test_benchmark.py` checks that the shipped files are exactly what this module produces.

Only `random.Random(seed).random()` is used (Python guarantees its stream across versions and
platforms); Gaussian and exponential draws are derived from it here, and every number is written
rounded, so the files do not depend on the interpreter or on numpy.
"""

from __future__ import annotations

import json
import math
import random
import sys
from collections import deque
from pathlib import Path


class Rng:
    """Uniform, Gaussian and exponential draws from `random.Random.random()` alone."""

    def __init__(self, seed: int) -> None:
        self._r = random.Random(seed)

    def uniform(self, a: float = 0.0, b: float = 1.0) -> float:
        return a + (b - a) * self._r.random()

    def integer(self, a: int, b: int) -> int:
        """Uniform in [a, b], both included."""
        return a + min(b - a, int(self._r.random() * (b - a + 1)))

    def normal(self, mean: float = 0.0, sd: float = 1.0) -> float:
        u1 = 1.0 - self._r.random()  # (0, 1]
        u2 = self._r.random()
        return mean + sd * math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)

    def exponential(self, scale: float) -> float:
        return -scale * math.log(1.0 - self._r.random())

    def shuffle(self, items: list) -> None:  # type: ignore[type-arg]
        for i in range(len(items) - 1, 0, -1):
            j = self.integer(0, i)
            items[i], items[j] = items[j], items[i]

    def choice(self, items: list):  # type: ignore[no-untyped-def,type-arg]
        return items[self.integer(0, len(items) - 1)]


def _num(value: float, places: int = 4) -> str:
    text = f"{value:.{places}f}"
    return "0." + "0" * places if text == "-0." + "0" * places else text


def _csv(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join([",".join(header), *(",".join(r) for r in rows)]) + "\n"


# ---- blobClustering -----------------------------------------------------------------------------------

# (mean x, mean y, sd along the main axis, sd across it, angle in degrees, points)
BLOBS = [
    (0.0, 0.0, 1.3, 0.3, 30.0, 70),
    (2.8, 2.0, 0.55, 0.5, 0.0, 40),
    (-2.4, 2.6, 1.6, 0.35, -40.0, 60),
    (2.8, -1.6, 0.9, 0.8, 0.0, 50),
    (0.2, 3.6, 1.1, 0.25, 85.0, 30),
]


def blob_clustering() -> dict[str, str]:
    rng = Rng(20240611)
    points: list[tuple[float, float, int]] = []
    for label, (mx, my, s1, s2, angle, n) in enumerate(BLOBS):
        a = math.radians(angle)
        for _ in range(n):
            u, v = rng.normal(0, s1), rng.normal(0, s2)
            points.append((mx + u * math.cos(a) - v * math.sin(a), my + u * math.sin(a) + v * math.cos(a), label))
    rng.shuffle(points)
    return {
        "data/blobClustering/data/points.csv": _csv(
            ["id", "x", "y"], [[str(i), _num(x), _num(y)] for i, (x, y, _) in enumerate(points)]),
        "data/blobClustering/test_labels.csv": _csv(
            ["id", "cluster"], [[str(i), str(c)] for i, (_, _, c) in enumerate(points)]),
    }


# ---- signalDenoising ----------------------------------------------------------------------------------

SIGNALS, SAMPLES = 16, 64


def _clean_signal(kind: str, rng: Rng) -> list[float]:
    ts = [i / (SAMPLES - 1) for i in range(SAMPLES)]
    if kind == "waves":
        parts = [(rng.uniform(0.5, 1.3), rng.uniform(0.5, 3.5), rng.uniform(0, 2 * math.pi)) for _ in range(2)]
        return [sum(amp * math.sin(2 * math.pi * f * t + ph) for amp, f, ph in parts) for t in ts]
    if kind == "steps":
        cuts = sorted(rng.uniform(0.1, 0.9) for _ in range(3))
        levels = [rng.uniform(-1.5, 1.5) for _ in range(4)]
        return [levels[sum(t >= c for c in cuts)] for t in ts]
    if kind == "bump":
        slope, centre, width = rng.uniform(-1.5, 1.5), rng.uniform(0.25, 0.75), rng.uniform(0.05, 0.12)
        height = rng.uniform(1.0, 2.0)
        return [slope * (t - 0.5) + height * math.exp(-0.5 * ((t - centre) / width) ** 2) for t in ts]
    f0, rate, amp = rng.uniform(0.5, 1.5), rng.uniform(2.0, 4.0), rng.uniform(0.8, 1.4)  # chirp
    return [amp * math.sin(2 * math.pi * (f0 * t + rate * t * t)) for t in ts]


def signal_denoising() -> dict[str, str]:
    rng = Rng(20240612)
    kinds = ["waves", "steps", "bump", "chirp"] * (SIGNALS // 4)
    rng.shuffle(kinds)
    header = ["signal", *(f"v{i}" for i in range(SAMPLES))]
    noisy, clean = [], []
    for s, kind in enumerate(kinds):
        values = _clean_signal(kind, rng)
        sigma = rng.uniform(0.2, 0.5)
        clean.append([str(s), *(_num(v) for v in values)])
        noisy.append([str(s), *(_num(v + rng.normal(0, sigma)) for v in values)])
    return {
        "data/signalDenoising/data/noisy.csv": _csv(header, noisy),
        "data/signalDenoising/clean_signals.csv": _csv(header, clean),
    }


# ---- kernelDensityBandwidth ---------------------------------------------------------------------------


def _density_sample(rng: Rng) -> float:
    u = rng.uniform()
    if u < 0.45:
        return rng.normal(0.0, 1.0)
    if u < 0.75:
        return rng.normal(3.5, 0.3)
    return -2.5 - rng.exponential(1.2)


def kernel_density() -> dict[str, str]:
    rng = Rng(20240613)
    train = [_density_sample(rng) for _ in range(400)]
    heldout = [_density_sample(rng) for _ in range(400)]
    return {
        "data/kernelDensityBandwidth/data/train.csv": _csv(["x"], [[_num(x)] for x in train]),
        "data/kernelDensityBandwidth/heldout.csv": _csv(["x"], [[_num(x)] for x in heldout]),
    }


# ---- graphColoring ------------------------------------------------------------------------------------


def _graph(kind: str, rng: Rng) -> dict[str, object]:
    edges: set[tuple[int, int]] = set()
    if kind == "random":
        n, p = rng.integer(30, 40), rng.uniform(0.12, 0.2)
        edges = {(u, v) for u in range(n) for v in range(u + 1, n) if rng.uniform() < p}
    elif kind == "planted":
        n, k, p = rng.integer(30, 40), rng.integer(3, 4), rng.uniform(0.25, 0.35)
        part = [rng.integer(0, k - 1) for _ in range(n)]
        edges = {(u, v) for u in range(n) for v in range(u + 1, n) if part[u] != part[v] and rng.uniform() < p}
    else:  # geometric: points in the unit square, an edge between points closer than r
        n, r = rng.integer(30, 40), rng.uniform(0.22, 0.28)
        pts = [(rng.uniform(), rng.uniform()) for _ in range(n)]
        edges = {(u, v) for u in range(n) for v in range(u + 1, n) if math.dist(pts[u], pts[v]) < r}
    # Vertex numbers are shuffled so that the index order carries no hint of the structure.
    relabel = list(range(n))
    rng.shuffle(relabel)
    return {"n": n, "edges": sorted(sorted((relabel[u], relabel[v])) for u, v in edges)}


def _json_lines(items: list[object]) -> str:
    """A JSON array with one compact item per line (the committed task data stays diffable)."""
    return "[\n" + ",\n".join("  " + json.dumps(i, separators=(",", ":")) for i in items) + "\n]\n"


def _graphs(seed: int, count: int) -> str:
    rng = Rng(seed)
    kinds = ["random", "planted", "geometric"] * math.ceil(count / 3)
    return _json_lines([_graph(kind, rng) for kind in kinds[:count]])


def graph_coloring() -> dict[str, str]:
    return {
        "data/graphColoring/practice_graphs.json": _graphs(20240614, 6),
        "data/graphColoring/test_graphs.json": _graphs(20240615, 12),
    }


# ---- gridNavigation -----------------------------------------------------------------------------------

GRID = 10
MOVES = {"N": (-1, 0), "S": (1, 0), "E": (0, 1), "W": (0, -1)}


def _distances(grid: list[str], source: tuple[int, int]) -> dict[tuple[int, int], int]:
    seen = {source: 0}
    queue = deque([source])
    while queue:
        r, c = queue.popleft()
        for dr, dc in MOVES.values():
            nr, nc = r + dr, c + dc
            if 0 <= nr < GRID and 0 <= nc < GRID and grid[nr][nc] != "#" and (nr, nc) not in seen:
                seen[(nr, nc)] = seen[(r, c)] + 1
                queue.append((nr, nc))
    return seen


def _maze(rng: Rng) -> dict[str, object]:
    while True:
        density = rng.uniform(0.25, 0.32)
        grid = ["".join("#" if rng.uniform() < density else "." for _ in range(GRID)) for _ in range(GRID)]
        free = [(r, c) for r in range(GRID) for c in range(GRID) if grid[r][c] == "."]
        start = rng.choice(free)
        reachable = _distances(grid, start)
        far = [cell for cell, d in sorted(reachable.items()) if d >= 9]
        # Keep maps where the goal is well away and the straight-line heuristic meets a wall.
        if far:
            goal = rng.choice(far)
            if reachable[goal] > abs(goal[0] - start[0]) + abs(goal[1] - start[1]):
                return {"grid": grid, "start": list(start), "goal": list(goal)}


def _mazes(seed: int, count: int) -> str:
    rng = Rng(seed)
    return _json_lines([_maze(rng) for _ in range(count)])


def grid_navigation() -> dict[str, str]:
    return {
        "data/gridNavigation/practice_maps.json": _mazes(20240616, 10),
        "data/gridNavigation/test_maps.json": _mazes(20240617, 30),
    }


# ---- all ----------------------------------------------------------------------------------------------


def generated_files() -> dict[str, str]:
    """Path relative to the task tree -> contents, for every generated data file."""
    return {**blob_clustering(), **signal_denoising(), **kernel_density(), **graph_coloring(), **grid_navigation()}


def write(root: Path) -> list[Path]:
    out = []
    for rel, text in generated_files().items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        out.append(path)
    return out


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "tasks"
    for p in write(target):
        print(p)
