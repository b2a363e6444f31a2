# Shared helpers: paths, wildcard constraints, the resolved config handed to every job.
import functools
import shlex
from pathlib import Path
import sys

from gymforge import atomic
from gymforge.benchmark.suite import load_benchmark
from gymforge.hub.prefetch import (
    KEY_PATTERN,
    MANIFEST,
    cache_root,
    dataset_id_of,
    dataset_key,
    proposal_dataset_ids,
    task_dataset_ids,
)
from gymforge.specs import text_hash
from gymforge.stages.evaluation import SERVED_SOURCES, model_spec
from gymforge.stages.topics import batch_id, batch_of_slot, slot_id

# The interpreter running Snakemake also runs the jobs, so rules never depend on PATH.
GYMFORGE = f"{shlex.quote(sys.executable)} -m gymforge"
R = CFG.results_dir
LOGS = f"{R}/logs"
BENCH = f"{R}/benchmarks"
TOPIC_SLOTS = [slot_id(i) for i in range(CFG.topics.n)]
N_BATCHES = -(-CFG.topics.n // CFG.topics.batch_size)
TOPIC_BATCHES = [batch_id(i) for i in range(N_BATCHES)]
OFFLINE_STUDENT = CFG.train.student == "offline"
# Offline the student's base is built by a rule; otherwise it is the hub id or local path itself.
STUDENT_BASE = f"{R}/student/base" if OFFLINE_STUDENT else CFG.train.student
CHECKPOINT = f"{R}/checkpoints/{CFG.train.name}"
DATASET_CACHE = str(cache_root(CFG))


wildcard_constraints:
    slot=r"t\d\d\d\d+",
    batch=r"b\d\d\d\d+",
    key=KEY_PATTERN,  # a dataset cache entry: owner--name


def _resolved_config_path():
    """Jobs read the validated config from a content-addressed JSON file, so a dry-run or a second
    invocation with other settings never changes what a running job reads."""
    text = CFG.model_dump_json(indent=2) + "\n"
    path = Path(R) / ".gymforge" / f"config-{text_hash(text)}.json"
    if not path.exists():
        atomic.write_text(path, text)
    return str(path)


CONFIG_JSON = _resolved_config_path()


def previous_batch(wildcards):
    """Topic batches are chained: each prompt lists the topics already sampled."""
    index = int(wildcards.batch[1:])
    return [f"{R}/topics/batches/{batch_id(index - 1)}.json"] if index else []


def served_model(name):
    return model_spec(CFG, name).source in SERVED_SOURCES


def model_checkpoint(wildcards):
    """What a served model is loaded from: a folder a rule builds (then also an input), or a hub id / path."""
    spec = model_spec(CFG, wildcards.model)
    if spec.source == "student-sft":
        return CHECKPOINT
    if spec.source == "student-base":
        return STUDENT_BASE
    return spec.model if spec.source == "checkpoint" else ""


def built_checkpoint(wildcards):
    path = model_checkpoint(wildcards)
    return [path] if path in (CHECKPOINT, f"{R}/student/base") else []


def dataset_targets(ids):
    """The fetch targets (cache manifests) of hub dataset ids."""
    return [f"{DATASET_CACHE}/{dataset_key(i)}/{MANIFEST}" for i in dict.fromkeys(ids)]


def slot_datasets(slot):
    # A slot's dataset is known only once its proposal exists, hence the checkpoint. Offline, tasks carry a
    # local copy: no .get(), so the DAG stays static and `snakemake -n` lists the whole plan.
    if CFG.datasets.hub != "huggingface":
        return []
    return dataset_targets(proposal_dataset_ids(checkpoints.proposal.get(slot=slot).output[0]))


def slot_dataset_targets(wildcards):
    """Input function: the fetched datasets the task of `wildcards.slot` loads from the hub."""
    return slot_datasets(wildcards.slot)


@functools.cache
def benchmark_datasets():
    # Known statically from the task configs (MLGym-Bench's non-local datasets; the built-in suite has none).
    return {t.id: task_dataset_ids(t.task_yaml, t.root) for t in load_benchmark(CFG.evaluate)}
