# Proposals stage: one proposal per topic slot (a discarded topic yields a small "skipped" record).
# A checkpoint: with the real hub, which dataset a slot's task fetches is known only from its proposal.


checkpoint proposal:
    input:
        batch=lambda w: f"{R}/topics/batches/{batch_of_slot(w.slot, CFG.topics.batch_size)}.json",
    output:
        f"{R}/proposals/{{slot}}.json",
    log:
        f"{LOGS}/proposals/{{slot}}.log",
    params:
        digest=CFG.digest("seed", "teacher", "datasets", "proposals"),
    shell:
        gymforge(
            "proposal",
            "--slot {wildcards.slot} --batch-file {input.batch} --out {output}",
        )
