# Verification stage: baseline + evaluation + one teacher episode in the sandbox, with the self-debug loop.


rule verify_environment:
    input:
        proposal=f"{R}/proposals/{{slot}}.json",
        configs=f"{R}/configs/{{slot}}.json",
        code=f"{R}/tasks/{{slot}}/status.json",
        tree=f"{R}/tasks/{{slot}}/mlgym",
        datasets=slot_dataset_targets,
    output:
        report=f"{R}/environments/{{slot}}/report.json",
        env=directory(f"{R}/environments/{{slot}}/verified"),
    log:
        f"{LOGS}/environments/{{slot}}.log",
    benchmark:
        f"{BENCH}/environments/{{slot}}.tsv"
    params:
        digest=CFG.digest("seed", "teacher", "datasets", "generation", "sandbox", "agent", "verification", "post_training"),
    resources:
        # trajectories.gpus only for a task whose code needs a GPU, read from its starter-code record
        # (gymforge.runtime.resources.task_gpus): a CPU task's verification asks for none
        gpu=lambda w, input: resources.verification(CFG, input.code).gpu,
        mem_mb=resources.verification(CFG).mem_mb,
        runtime=CFG.verification.runtime_min,
    shell:
        gymforge(
            "verify-environment",
            "--slot {wildcards.slot} --proposal {input.proposal} --configs {input.configs} --code "
            "{input.code} --tree {input.tree} --report-out {output.report} --env-out {output.env}",
            gpus=True,
        )


rule environments:
    input:
        f"{R}/config.json",
        expand(f"{R}/environments/{{slot}}/report.json", slot=TOPIC_SLOTS),
