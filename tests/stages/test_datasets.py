"""The host-side dataset cache: fetch once (offline hub, and the real hub's protocol on a loopback server),
then `load_dataset(id)` inside sandboxes with no network, from a read-only mount."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import yaml

from fake_hf_hub import FakeHFHub
from test_sandbox_docker import docker_backend  # noqa: F401  (the real-daemon fixture; skips with a reason)
from workflow_copy import copy_workflow
from gymforge.core.config import GymforgeConfig
from gymforge.tasks.environment import InstallError, TaskEnvironment
from gymforge.hub import get_hub
from gymforge.offline.hub import OfflineHub
from gymforge.stages import datasets as pf
from gymforge.tasks import datacache
from gymforge.sandbox import Limits, get_sandbox
from gymforge.sandbox.local import LocalBackend

TINY_ID = "gymforge-test/tiny"
LOAD = "import datasets; ds = datasets.load_dataset({id!r}); print('ROWS', {{k: len(v) for k, v in ds.items()}})"


def _parquet(df: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


TINY_REPO = {
    "README.md": b"---\nlicense: mit\n---\n# tiny\n",
    "data/train-00000-of-00001.parquet": _parquet(pd.DataFrame({"x": range(10), "label": [i % 2 for i in range(10)]})),
    "data/test-00000-of-00001.parquet": _parquet(pd.DataFrame({"x": range(10, 14), "label": [0, 1, 0, 1]})),
}


@pytest.fixture(scope="module")
def offline_hub(tmp_path_factory: pytest.TempPathFactory) -> OfflineHub:
    hub = get_hub(GymforgeConfig(cache_dir=str(tmp_path_factory.mktemp("cache"))))
    assert isinstance(hub, OfflineHub)
    hub.ensure_built()
    return hub


@pytest.fixture(scope="module")
def iris_cache(offline_hub: OfflineHub, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("datasets")
    pf.prefetch(offline_hub, "sklearn/iris", root)
    return root


@pytest.fixture(scope="module")
def hf_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`gymforge fetch-dataset` against a loopback server speaking the hub's protocol (HF_ENDPOINT)."""
    tmp = tmp_path_factory.mktemp("hf")
    root = tmp / "datasets"
    (tmp / "hf.yaml").write_text(yaml.safe_dump({"datasets": {"hub": "huggingface", "cache_dir": str(root)}}))
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    with FakeHFHub({TINY_ID: TINY_REPO}) as hub:
        env |= {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp / "host-hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1"}
        proc = subprocess.run(
            [sys.executable, "-m", "gymforge", "fetch-dataset", "--config", str(tmp / "hf.yaml"),
             "--dataset-id", TINY_ID, "--out", str(root / "gymforge-test--tiny" / "manifest.json")],
            env=env, capture_output=True, text=True, timeout=300,
        )
        requests = list(hub.requests)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert any("/resolve/" in r and r.endswith(".parquet") for r in requests), requests  # really downloaded
    return root


def _load_in_sandbox(backend, cache: Path, dataset_id: str, ws: Path) -> tuple[str, int]:
    ws.mkdir(parents=True, exist_ok=True)
    mounts, env = datacache.sandbox_view(cache, [dataset_id], ws.parent / "hf-home")
    r = backend.run_once(ws, [sys.executable, "-c", LOAD.format(id=dataset_id)], timeout=120, limits=Limits(),
                         mounts=mounts, env=env)
    return r.output, r.exit_code


# --- keys and manifests ---


@pytest.mark.parametrize("dataset_id", ["sklearn/iris", "uoft-cs/cifar10", "HuggingFaceFW/fineweb-edu",
                                        "nyu-mll/multi_nli", "imdb", "a.b/c_d.e"])
def test_key_round_trip(dataset_id: str) -> None:
    key = datacache.dataset_key(dataset_id)
    assert "/" not in key and re.fullmatch(datacache.KEY_PATTERN, key)
    assert datacache.dataset_id_of(key) == dataset_id


@pytest.mark.parametrize("bad", ["", "a/b/c", "../x", "a--b/c", "a/b c", "/abs"])
def test_key_rejects_what_is_not_a_hub_id(bad: str) -> None:
    with pytest.raises(ValueError):
        datacache.dataset_key(bad)


def test_cache_root_defaults_under_cache_dir(tmp_path: Path) -> None:
    assert datacache.cache_root(GymforgeConfig(cache_dir=str(tmp_path))) == tmp_path / "datasets"
    assert datacache.cache_root(GymforgeConfig(datasets={"cache_dir": "/x/y"})) == Path("/x/y")
    # Where the cache lives is not a setting that reruns proposals.
    assert GymforgeConfig(datasets={"cache_dir": "/x/y"}).digest("datasets") == GymforgeConfig().digest("datasets")


def test_offline_prefetch_manifest_and_layout(iris_cache: Path) -> None:
    entry = iris_cache / "sklearn--iris"
    manifest = datacache.read_manifest(iris_cache, "sklearn/iris")
    assert manifest.splits == {"train": 120, "test": 30} and manifest.rows == 150 and manifest.hub == "offline"
    assert manifest.bytes > 0 and set(manifest.versions) == {"datasets", "huggingface_hub", "pyarrow"}
    assert (entry / manifest.path).is_dir() and manifest.path == "datasets/sklearn___iris"
    # Only the manifest and the prepared dataset: no scratch, no lock files named after the temporary path.
    assert sorted(p.name for p in entry.iterdir()) == ["datasets", "manifest.json"]
    assert not list(entry.rglob("*.lock")) and [p.name for p in (entry / "datasets").iterdir()] == ["sklearn___iris"]
    assert not list(iris_cache.glob("*.tmp"))  # no temporary sibling left
    assert all(p.stat().st_mode & 0o444 == 0o444 for p in entry.rglob("*"))  # readable by a sandbox uid


def test_a_failure_mid_fetch_leaves_nothing(offline_hub: OfflineHub, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> dict[str, str]:  # runs after the data is prepared, before the manifest
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(pf, "_versions", broken)
    with pytest.raises(RuntimeError, match="disk on fire"):
        pf.prefetch(offline_hub, "sklearn/wine", tmp_path)
    assert not (tmp_path / "sklearn--wine").exists() and not list(tmp_path.glob("*.tmp"))


def test_a_killed_fetch_leaves_no_entry_and_the_next_one_clears_its_remains(offline_hub: OfflineHub,
                                                                             tmp_path: Path) -> None:
    # SIGKILL once the data is prepared, before the manifest: no cleanup code runs.
    kill = textwrap.dedent(f"""\
        import os, signal
        from gymforge.offline.hub import OfflineHub
        from gymforge.stages import datasets as pf
        pf._versions = lambda: os.kill(os.getpid(), signal.SIGKILL)
        pf.prefetch(OfflineHub({str(offline_hub.root)!r}), "sklearn/wine", {str(tmp_path)!r})
        """)
    proc = subprocess.run([sys.executable, "-c", kill], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    assert not (tmp_path / "sklearn--wine").exists()
    [remains] = tmp_path.glob(".sklearn--wine.*.tmp")  # the half-built entry, under its temporary name
    assert any(remains.rglob("*.arrow"))
    manifest = pf.prefetch(offline_hub, "sklearn/wine", tmp_path)
    assert manifest.rows == 178 and not remains.exists()


def test_a_failed_refetch_keeps_the_old_entry(offline_hub: OfflineHub, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    before = pf.prefetch(offline_hub, "sklearn/wine", tmp_path)
    monkeypatch.setattr(pf, "_prepare_offline", lambda *a: (_ for _ in ()).throw(RuntimeError("network gone")))
    with pytest.raises(RuntimeError, match="network gone"):
        pf.prefetch(offline_hub, "sklearn/wine", tmp_path)
    assert datacache.read_manifest(tmp_path, "sklearn/wine") == before
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == ["sklearn--wine"]


def test_missing_entry_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"not in the dataset cache .*fetch-dataset"):
        datacache.sandbox_view(tmp_path, ["owner/absent"], tmp_path / "hf-home")


# --- loading inside sandboxes ---


def test_datasets_cannot_load_from_a_read_only_cache_directly(iris_cache: Path, tmp_path: Path) -> None:
    """Why sandbox_view exists: `datasets` locks in the root of HF_DATASETS_CACHE even to read."""
    backend = LocalBackend()
    if backend.confinement != "bwrap":
        pytest.skip("needs bwrap to make the cache read-only")
    from gymforge.sandbox import Mount

    entry = (iris_cache / "sklearn--iris").resolve()
    ws = tmp_path / "ws"
    ws.mkdir()
    r = backend.run_once(ws, [sys.executable, "-c", LOAD.format(id="sklearn/iris")], timeout=120, limits=Limits(),
                         mounts=[Mount(host=entry, target=str(entry))],
                         env={"HF_HOME": str(entry), "HF_DATASETS_CACHE": str(entry / "datasets")})
    assert r.exit_code != 0 and "Read-only file system" in r.output, r.output


def test_offline_dataset_loads_by_id_in_a_sandbox_from_the_read_only_cache(iris_cache: Path, tmp_path: Path) -> None:
    backend = LocalBackend()
    out, code = _load_in_sandbox(backend, iris_cache, "sklearn/iris", tmp_path / "run" / "ws")
    assert code == 0 and "ROWS {'train': 120, 'test': 30}" in out, out
    if backend.confinement == "bwrap":
        entry = (iris_cache / "sklearn--iris").resolve()
        mounts, env = datacache.sandbox_view(iris_cache, ["sklearn/iris"], tmp_path / "run" / "hf-home")
        shown = mounts[0].target  # a fixed path in the sandbox: no host path reaches it
        assert shown == "/hf-datasets/sklearn--iris" and env["HF_HOME"] == "/hf-home"
        r = backend.run_once(tmp_path / "run" / "ws", ["bash", "-c", f"touch {shown}/x; rm -rf {shown}/datasets"],
                             timeout=30, limits=Limits(), mounts=mounts, env=env)
        assert r.exit_code != 0 and "Read-only file system" in r.output
        assert (entry / "datasets" / "sklearn___iris").is_dir()


def test_huggingface_dataset_loads_offline_in_a_subprocess(hf_cache: Path, tmp_path: Path) -> None:
    manifest = datacache.read_manifest(hf_cache, TINY_ID)
    assert manifest.hub == "huggingface" and manifest.splits == {"train": 10, "test": 4}
    mounts, env = datacache.sandbox_view(hf_cache, [TINY_ID], tmp_path / "hf-home", fixed=False)
    # A plain subprocess, offline, with the hub endpoint gone: the cache is all there is.
    env = {**os.environ, **env, "HF_ENDPOINT": "http://127.0.0.1:9"}
    r = subprocess.run([sys.executable, "-c", LOAD.format(id=TINY_ID)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "ROWS {'train': 10, 'test': 4}" in r.stdout, r.stderr


def test_huggingface_dataset_loads_in_a_bwrap_sandbox(hf_cache: Path, tmp_path: Path) -> None:
    out, code = _load_in_sandbox(LocalBackend(), hf_cache, TINY_ID, tmp_path / "run" / "ws")
    assert code == 0 and "ROWS {'train': 10, 'test': 4}" in out, out


def _hub_task(root: Path) -> Path:
    """An MLGym task whose dataset is not local: baseline and evaluation call load_dataset(id)."""
    (root / "configs" / "tasks").mkdir(parents=True)
    (root / "configs" / "datasets").mkdir(parents=True)
    (root / "data" / "hubTiny").mkdir(parents=True)
    (root / "configs" / "datasets" / "tiny.yaml").write_text(yaml.safe_dump(
        {"name": "tiny", "description": "a tiny hub dataset", "data_path": TINY_ID, "is_local": False}))
    task = root / "configs" / "tasks" / "hubTiny.yaml"
    task.write_text(yaml.safe_dump({
        "id": "hubTiny", "name": "Hub tiny", "description": "Predict label. {dataset_docs}",
        "dataset_configs": ["datasets/tiny.yaml"], "task_entrypoint": "CSVSubmissionTasks",
        "training_timeout": 120, "starter_code": ["data/hubTiny/baseline.py", "data/hubTiny/evaluate.py"],
        "baseline_paths": ["baseline.py"], "evaluation_paths": ["evaluate.py"],
    }))
    (root / "data" / "hubTiny" / "baseline.py").write_text(textwrap.dedent(f"""\
        import datasets
        test = datasets.load_dataset({TINY_ID!r}, split="test")
        with open("submission.csv", "w") as f:
            f.write("label\\n" + "".join(f"{{x % 2}}\\n" for x in test["x"]))
        """))
    (root / "data" / "hubTiny" / "evaluate.py").write_text(textwrap.dedent(f"""\
        import argparse, json
        import datasets
        p = argparse.ArgumentParser(); p.add_argument("--submission_file"); a = p.parse_args()
        truth = datasets.load_dataset({TINY_ID!r}, split="test")["label"]
        pred = [int(l) for l in open(a.submission_file).read().split()[1:]]
        print(json.dumps({{"accuracy": sum(t == q for t, q in zip(truth, pred)) / len(truth)}}))
        """))
    return task


@pytest.mark.parametrize("backend_name", ["local", "docker"])
def test_task_with_a_hub_dataset_runs_baseline_evaluation_and_session(
    backend_name: str, hf_cache: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    backend = request.getfixturevalue("docker_backend") if backend_name == "docker" else get_sandbox("local")
    task = _hub_task(tmp_path / "tree")
    env = TaskEnvironment(task, sandbox=backend, run_dir=tmp_path / "run", gpus=0, dataset_cache=hf_cache,
                          limits=Limits())
    env.install()
    assert env.run_env["HF_HUB_OFFLINE"] == "1" and not (env.workspace / ".cache").exists()
    report = env.run_baseline()
    assert report.metrics == {"accuracy": 1.0}, report.baseline.output
    with env.open_session() as session:
        r = session.run(f"python -c \"{LOAD.format(id=TINY_ID)}\"", timeout=120)
    assert r.exit_code == 0 and "ROWS {'train': 10, 'test': 4}" in r.output, r.output


def test_task_with_an_unfetched_hub_dataset_fails_at_install(tmp_path: Path) -> None:
    task = _hub_task(tmp_path / "tree")
    env = TaskEnvironment(task, sandbox=get_sandbox("local"), run_dir=tmp_path / "run", gpus=0,
                          dataset_cache=tmp_path / "empty-cache")
    with pytest.raises(InstallError, match=f"hubTiny: dataset.*{TINY_ID}.*not in the dataset cache"):
        env.install()


# --- the Snakemake rules ---


def _workflow(tmp_path: Path, config: dict) -> Path:
    workdir = copy_workflow(tmp_path / "wf", "rules", "report")
    (workdir / "test.yaml").write_text(yaml.safe_dump({"base": "config.yaml", **config}))
    return workdir


def _snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", *args, "--configfile", "test.yaml"],
                          cwd=workdir, capture_output=True, text=True, timeout=600)


def _jobs(stdout: str) -> dict[str, int]:
    table = stdout.split("Job stats:", 1)[1].split("total", 1)[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


@pytest.mark.slow
def test_fetch_rule_offline_through_snakemake(offline_hub: OfflineHub, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "hub").symlink_to(offline_hub.root)  # the already built offline hub
    workdir = _workflow(tmp_path, {"results_dir": "results", "cache_dir": str(cache), "topics": {"n": 1}})
    target = str(cache / "datasets" / "sklearn--iris" / "manifest.json")
    proc = _snakemake(workdir, target)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    manifest = json.loads(Path(target).read_text())
    assert manifest["id"] == "sklearn/iris" and manifest["splits"] == {"train": 120, "test": 30}
    assert (workdir / "results" / "logs" / "datasets" / "sklearn--iris.log").is_file()
    assert (workdir / "results" / "benchmarks" / "datasets" / "sklearn--iris.tsv").is_file()
    again = _snakemake(workdir, target)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
    # Offline, tasks carry a local copy: the full plan is static and holds no fetch.
    plan = _snakemake(workdir, "-n", "environments")
    jobs = _jobs(plan.stdout)
    assert jobs["verify_environment"] == 1 and "fetch_dataset" not in jobs


def test_verify_environment_requires_the_fetch_of_its_proposals_dataset(tmp_path: Path) -> None:
    workdir = _workflow(tmp_path, {"results_dir": "results", "cache_dir": str(tmp_path / "cache"),
                                   "topics": {"n": 3, "batch_size": 3}, "datasets": {"hub": "huggingface"}})
    results = workdir / "results"
    (results / "topics" / "batches").mkdir(parents=True)
    (results / "topics" / "batches" / "b0000.json").write_text("{}")
    (results / "proposals").mkdir()
    os.utime(results / "topics" / "batches" / "b0000.json", (1, 1))  # older than the proposals
    for slot, dataset_id in (("t0000", TINY_ID), ("t0001", TINY_ID), ("t0002", None)):
        record = {"item": slot, "status": "ok" if dataset_id else "discarded", "topic": "a topic",
                  "reason_code": None if dataset_id else "no_dataset_match",
                  "dataset": {"id": dataset_id, "is_local": False, "features": {}} if dataset_id else None}
        (results / "proposals" / f"{slot}.json").write_text(json.dumps(record))
    plan = _snakemake(workdir, "-n", "--printshellcmds", "environments")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    jobs = _jobs(plan.stdout)
    assert jobs["fetch_dataset"] == 1 and jobs["verify_environment"] == 3 and "proposal" not in jobs
    assert str(tmp_path / "cache" / "datasets" / "gymforge-test--tiny" / "manifest.json") in plan.stdout
    assert "fetch-dataset" in plan.stdout and f"--dataset-id {TINY_ID}" in plan.stdout
    plan = _snakemake(workdir, "-n", "datasets")
    assert _jobs(plan.stdout).get("fetch_dataset") == 1


def test_benchmark_hub_datasets_are_fetch_targets(tmp_path: Path) -> None:
    from test_benchmark import fake_mlgym

    root = fake_mlgym(tmp_path / "MLGym")
    fmnist = root / "configs" / "tasks" / "imageClassificationFMnist.yaml"
    assert datacache.task_dataset_ids(fmnist, root) == ["zalando-datasets/fashion_mnist"]
    # MLGym-Bench's ids are not on the offline hub: they can only come from the real one.
    offline = GymforgeConfig(cache_dir=str(tmp_path / "cache"))
    assert pf.fetch_hub(offline, "zalando-datasets/fashion_mnist").name == "huggingface"
    assert pf.fetch_hub(offline, "sklearn/iris").name == "offline"
    workdir = _workflow(tmp_path, {"results_dir": "results", "cache_dir": str(tmp_path / "cache"), "topics": {"n": 1},
                                   "evaluate": {"benchmark": "mlgym", "mlgym_root": str(root)}})
    plan = _snakemake(workdir, "-n", "--printshellcmds", "datasets")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert _jobs(plan.stdout) == {"fetch_dataset": 1, "datasets": 1}
    assert "--dataset-id zalando-datasets/fashion_mnist" in plan.stdout
