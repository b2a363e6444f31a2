# Harbor task folders of the verified environments (docs/interop.md): target `harbor`, not part of `all`.


rule harbor_task:
    input:
        report=f"{R}/environments/{{slot}}/report.json",
        env=f"{R}/environments/{{slot}}/verified",
        proposal=f"{R}/proposals/{{slot}}.json",
    output:
        directory(f"{R}/harbor/{{slot}}"),
    log:
        f"{LOGS}/harbor/{{slot}}.log",
    params:
        # sandbox: the limits task.toml declares and the base image (sandbox.image); rl.reward: the reward's scale
        digest=CFG.digest("sandbox", "rl.reward"),
    shell:
        gymforge(
            "harbor-task",
            "--slot {wildcards.slot} --report {input.report} --env {input.env} --proposal {input.proposal} "
            "--out {output}",
        )


rule harbor:
    input:
        expand(f"{R}/harbor/{{slot}}", slot=TOPIC_SLOTS),
