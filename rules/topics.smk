# Topics stage: batches are chained (each prompt lists the topics already sampled), slots are fixed per batch.


rule topic_batch:
    input:
        previous_batch,
    output:
        f"{R}/topics/batches/{{batch}}.json",
    log:
        f"{LOGS}/topics/{{batch}}.log",
    params:
        digest=CFG.digest("seed", "teacher", "topics"),
    shell:
        gymforge(
            "topic-batch",
            "--batch {wildcards.batch} --previous {input} --out {output}",
        )


rule topics:
    input:
        f"{R}/config.json",
        expand(f"{R}/topics/batches/{{batch}}.json", batch=TOPIC_BATCHES),
