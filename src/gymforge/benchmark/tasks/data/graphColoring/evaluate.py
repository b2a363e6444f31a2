"""Scores coloring.color_graph on the held-out graphs; prints {"colors": mean colours per graph}."""

import contextlib
import json
import numbers
import os
import sys
try:  # gymforge runs the submission in a sandbox of its own and hands it over through gymforge_eval
    from gymforge_eval import import_submission
except ImportError:  # under MLGym it is imported into this process
    from importlib import import_module as import_submission

# gymforge keeps the held-out graphs outside the workspace and names their directory in GYMFORGE_SECRETS;
# under MLGym they are a workspace file next to this script.
SECRETS = os.environ.get("GYMFORGE_SECRETS", os.path.dirname(os.path.abspath(__file__)))


def colors_used(n: int, edges: list[list[int]], colors: object) -> int:
    """Distinct colours of a proper colouring; n when the colouring is not proper."""
    if not isinstance(colors, (list, tuple)) or len(colors) != n:
        return n
    if not all(isinstance(c, numbers.Integral) and not isinstance(c, bool) and c >= 0 for c in colors):
        return n
    if any(colors[u] == colors[v] for u, v in edges):
        return n
    return len({int(c) for c in colors})


def main() -> None:
    with open(os.path.join(SECRETS, "test_graphs.json")) as f:
        graphs = json.load(f)
    # The submitted module's prints go to stderr, so stdout stays one JSON object.
    with contextlib.redirect_stdout(sys.stderr):
        color_graph = import_submission("coloring").color_graph

        used = [colors_used(g["n"], g["edges"], color_graph(g["n"], [list(e) for e in g["edges"]])) for g in graphs]
    print(json.dumps({"colors": round(sum(used) / len(used), 6)}))


if __name__ == "__main__":
    main()
