# Hub datasets that tasks load by id instead of carrying a local copy: each is fetched once, on the host,
# into the dataset cache that sandboxes mount read-only (gymforge.hub.prefetch). One target per dataset id.
import functools

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

DATASET_CACHE = str(cache_root(CFG))


wildcard_constraints:
    key=KEY_PATTERN,


def dataset_targets(ids):
    return [f"{DATASET_CACHE}/{dataset_key(i)}/{MANIFEST}" for i in dict.fromkeys(ids)]


def _slot_datasets(slot):
    # A slot's dataset is known only once its proposal exists, hence the checkpoint. Offline, tasks carry a
    # local copy: no .get(), so the DAG stays static and `snakemake -n` lists the whole plan.
    if CFG.datasets.hub != "huggingface":
        return []
    return dataset_targets(proposal_dataset_ids(checkpoints.proposal.get(slot=slot).output[0]))


def slot_dataset_targets(wildcards):
    """Input function: the fetched datasets the task of `wildcards.slot` loads from the hub."""
    return _slot_datasets(wildcards.slot)


@functools.cache
def _benchmark_datasets():
    # Known statically from the task configs (MLGym-Bench's non-local datasets; the built-in suite has none).
    return {t.id: task_dataset_ids(t.task_yaml, t.root) for t in load_benchmark(CFG.evaluate)}


def benchmark_dataset_targets(wildcards):
    """Input function: the fetched datasets benchmark task `wildcards.task` loads from the hub."""
    return dataset_targets(_benchmark_datasets().get(wildcards.task, []))


rule fetch_dataset:
    output:
        f"{DATASET_CACHE}/{{key}}/{MANIFEST}",
    log:
        f"{LOGS}/datasets/{{key}}.log",
    benchmark:
        f"{BENCH}/datasets/{{key}}.tsv"
    params:
        dataset_id=lambda w: dataset_id_of(w.key),
        hub=CFG.datasets.hub,
    resources:
        mem_mb=4096,
        runtime=120,
    shell:
        "{GYMFORGE} prefetch-dataset --config {CONFIG_JSON} --dataset-id {params.dataset_id} --out {output} "
        "> {log} 2>&1"


rule datasets:
    """Every dataset the synthesized tasks and the benchmark load from the hub."""
    input:
        lambda w: dataset_targets(
            [i for ids in _benchmark_datasets().values() for i in ids]
        ) + [t for slot in TOPIC_SLOTS for t in _slot_datasets(slot)],
