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
    # Where Snakemake runs (a cluster's login node): fetching needs the internet, compute nodes may have none.
    localrule: True
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


rule prefetch_model:
    """A hub model the jobs load (the student's base), fetched once into the model cache (gymforge.student.fetch)."""
    output:
        directory(f"{MODELS}/{{model_key}}"),
    log:
        f"{LOGS}/models/{{model_key}}.log",
    wildcard_constraints:
        model_key=KEY_PATTERN,
    params:
        model=lambda w: w.model_key.replace("--", "/"),
    # Where Snakemake runs (a cluster's login node): fetching needs the internet, compute nodes may have none.
    localrule: True
    shell:
        gymforge("prefetch-model", "--model {params.model} --out {output}", config=False)


rule prefetch:
    """Everything the plan loads from the hub that is known before it runs: the student's base and the benchmark's
    datasets. On a cluster, run `snakemake prefetch` on the login node; the jobs then need no internet for them
    (the synthesized tasks' datasets follow their proposals: rule fetch_dataset, also a local rule)."""
    localrule: True
    input:
        [f"{MODELS}/{model_key(m)}" for m in hub_models(CFG)],
        lambda w: dataset_targets([i for ids in benchmark_datasets().values() for i in ids]),
