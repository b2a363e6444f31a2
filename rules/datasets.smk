# Hub datasets that tasks load by id instead of carrying a local copy: each is fetched once, on the host,
# into the dataset cache that sandboxes mount read-only (gymforge.stages.datasets). One target per dataset id.


rule fetch_dataset:
    output:
        f"{DATASET_CACHE}/{{key}}/{MANIFEST}",
    log:
        f"{LOGS}/datasets/{{key}}.log",
    benchmark:
        f"{BENCH}/datasets/{{key}}.tsv"
    params:
        dataset_id=lambda w: dataset_id_of(w.key),
        digest=CFG.digest("datasets.hub"),
    resources:
        mem_mb=CFG.datasets.mem_mb,
        runtime=CFG.datasets.runtime_min,
    shell:
        gymforge(
            "fetch-dataset",
            "--dataset-id {params.dataset_id} --out {output}",
        )


rule datasets:
    """Every dataset the synthesized tasks and the benchmark load from the hub."""
    input:
        lambda w: dataset_targets(
            [i for ids in benchmark_datasets().values() for i in ids]
        ) + [t for slot in TOPIC_SLOTS for t in slot_datasets(slot)],
