"""Mean negative log-likelihood of held-out draws under the configured kernel density estimate.

Prints {"nll": ...} on its last line.
"""

import argparse
import csv
import json
import math
import os

import numpy as np
import yaml

try:  # gymforge's evaluation contract: this script runs no agent code (it reads the config as data), so it calls
    # nothing through gymforge_eval, but importing it puts it under the contract: the scorer starts as `python -I`
    # and its workspace holds only the config, so no module the agent writes (yaml.py, numpy/) is imported here.
    import gymforge_eval  # noqa: F401
except ImportError:  # MLGym: the script's directory is on sys.path, as MLGym always runs it
    pass

HERE = os.path.dirname(os.path.abspath(__file__))
# gymforge keeps the held-out draws outside the workspace and names their directory in GYMFORGE_SECRETS;
# under MLGym they are a workspace file next to this script.
SECRETS = os.environ.get("GYMFORGE_SECRETS", HERE)
KERNELS = ("gaussian", "laplace", "epanechnikov")
FLOOR = 1e-6


def read(path: str) -> np.ndarray:
    with open(path, newline="") as f:
        return np.array([float(row["x"]) for row in csv.DictReader(f)])


def load_config(path: str) -> tuple[str, float, float]:
    with open(path) as f:
        config = yaml.safe_load(f)
    if not isinstance(config, dict):
        raise SystemExit(f"{path} must be a YAML mapping with the keys kernel, bandwidth and adaptive")
    unknown = set(config) - {"kernel", "bandwidth", "adaptive"}
    if unknown:
        raise SystemExit(f"{path}: unknown keys {sorted(unknown)}; allowed: kernel, bandwidth, adaptive")
    kernel = config.get("kernel", "gaussian")
    if kernel not in KERNELS:
        raise SystemExit(f"{path}: kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
    bandwidth, adaptive = config.get("bandwidth"), config.get("adaptive", 0.0)
    for key, value in (("bandwidth", bandwidth), ("adaptive", adaptive)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise SystemExit(f"{path}: {key} must be a number, got {value!r}")
    if bandwidth <= 0:
        raise SystemExit(f"{path}: bandwidth must be positive, got {bandwidth}")
    if not 0 <= adaptive <= 1:
        raise SystemExit(f"{path}: adaptive must be between 0 and 1, got {adaptive}")
    return kernel, float(bandwidth), float(adaptive)


def density(x: np.ndarray, data: np.ndarray, widths: np.ndarray, kernel: str) -> np.ndarray:
    u = (x[:, None] - data[None, :]) / widths[None, :]
    if kernel == "gaussian":
        k = np.exp(-0.5 * u * u) / math.sqrt(2 * math.pi)
    elif kernel == "laplace":
        k = 0.5 * np.exp(-np.abs(u))
    else:
        k = np.where(np.abs(u) < 1, 0.75 * (1 - u * u), 0.0)
    return (k / widths[None, :]).mean(axis=1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config_fname", required=True)
    args = parser.parse_args()
    kernel, bandwidth, adaptive = load_config(args.config_fname)
    train = read(os.path.join(HERE, "data", "train.csv"))
    heldout = read(os.path.join(SECRETS, "heldout.csv"))
    widths = np.full(len(train), bandwidth)
    if adaptive > 0:
        pilot = np.maximum(density(train, train, widths, kernel), FLOOR)
        widths = bandwidth * (pilot / np.exp(np.log(pilot).mean())) ** (-adaptive)
    nll = -np.log(np.maximum(density(heldout, train, widths, kernel), FLOOR)).mean()
    print(json.dumps({"nll": round(float(nll), 6)}))


if __name__ == "__main__":
    main()
