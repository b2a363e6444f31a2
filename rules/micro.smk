# RL (micro tasks) stage: micro-scale variants of the verified tasks (SandMLE), the RL environments.


rule micro_task:
    input:
        report=f"{R}/environments/{{slot}}/report.json",
        env=f"{R}/environments/{{slot}}/verified",
    output:
        report=f"{R}/micro/{{slot}}/report.json",
        env=directory(f"{R}/micro/{{slot}}/verified"),
    log:
        f"{LOGS}/micro/{{slot}}.log",
    benchmark:
        f"{BENCH}/micro/{{slot}}.tsv"
    params:
        # verification.probes: the micro variant's evaluator is probed again
        digest=CFG.digest("seed", "sandbox", "micro", "verification.probes", "post_training"),
    resources:
        # verification's check, with the GPUs the task's rollouts get (none for a task whose code needs none); a slot
        # verification did not keep only writes a "skipped" record, and asks for no GPU and minutes
        # (gymforge.runtime.resources)
        gpu=lambda w, input: resources.micro(CFG, input.report).gpu,
        mem_mb=lambda w, input: resources.micro(CFG, input.report).mem_mb,
        runtime=lambda w, input: resources.micro(CFG, input.report).runtime,
    shell:
        gymforge(
            "micro-task",
            "--slot {wildcards.slot} --report {input.report} --env {input.env} "
            "--report-out {output.report} --env-out {output.env}",
            gpus=True,
        )


rule micro:
    input:
        f"{R}/config.json",
        expand(f"{R}/micro/{{slot}}/report.json", slot=TOPIC_SLOTS),
