# RL (update) stage: on-policy RL (GRPO-style, duration-aware) of the SFT student on the micro-scale tasks.
# One job: it serves the current policy (transformers on CPU, vLLM on GPUs) and trains it, `rl.gpus` GPUs
# shared by both (docs/rl.md, "On-policy RL"). A killed job resumes from its last finished iteration
# (results/rl/<student>/.work/, not a declared output, so Snakemake leaves it alone).

RL_DIR = f"{R}/rl/{CFG.train.name}"
RL_SLOTS = CFG.rl.tasks or TOPIC_SLOTS
RL_SOURCE = f"{R}/micro" if CFG.rl.tasks_from == "micro" else f"{R}/environments"
# The benchmark scores the RL checkpoint: train_rl is then part of `all`, and so is its figure (Snakefile).
RL_EVALUATED = any(m.source == "student-rl" for m in CFG.evaluate.models)


rule train_rl:
    input:
        sft=CHECKPOINT,
        reports=expand(f"{RL_SOURCE}/{{slot}}/report.json", slot=RL_SLOTS),
        envs=expand(f"{RL_SOURCE}/{{slot}}/verified", slot=RL_SLOTS),
        proposals=expand(f"{R}/proposals/{{slot}}.json", slot=RL_SLOTS),
        decontamination=DECONTAMINATION,
    output:
        checkpoint=directory(RL_CHECKPOINT),
        curve=f"{RL_DIR}/curve.json",
    log:
        f"{LOGS}/rl/{CFG.train.name}.log",
    benchmark:
        f"{BENCH}/rl/{CFG.train.name}.tsv"
    params:
        # student: the chat template the update trains with; evaluate.serving: how the policy is served (backend,
        # vllm_args; its sampling settings come from rl)
        digest=CFG.digest("seed", "sandbox", "agent", "rl", "student", "evaluate.serving", "post_training"),
        slots=" ".join(RL_SLOTS),
    resources:
        gpu=CFG.rl.gpus,
        mem_mb=CFG.rl.mem_mb,
        runtime=CFG.rl.runtime_min,
        nodes=1,  # the vLLM server and the sharded update share the job's GPUs on one node
    threads: CFG.rl.threads
    shell:
        gymforge(
            "train-rl",
            "--sft {input.sft} --slots {params.slots} --reports {input.reports} --envs {input.envs} "
            "--proposals {input.proposals} --decontamination {input.decontamination} --out {output.checkpoint} "
            "--curve-out {output.curve} --log {log}",
            gpus=True,
        )


# The reward curve as a report figure. A rule of its own (not an output of train_rl), so redrawing it never reruns
# the training; `snakemake --report report.html all rl` shows it after `snakemake rl` (the report lists the figures
# of its targets' jobs).
rule rl_plot:
    input:
        curve=f"{RL_DIR}/curve.json",
    output:
        report(f"{RL_DIR}/curve.png", caption="../report/rl.rst", category="5. On-policy RL"),
    log:
        f"{LOGS}/rl/{CFG.train.name}.plot.log",
    shell:
        gymforge("rl-plot", "--curve {input.curve} --png-out {output}", config=False)


rule rl:
    input:
        f"{R}/config.json",
        RL_CHECKPOINT,
        f"{RL_DIR}/curve.json",
        f"{RL_DIR}/curve.png",
