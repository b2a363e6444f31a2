# SFT data stage: the student's tokenizer, the filters -> SFT dataset + stats, and the plots; target `trajectories`.
from gymforge.core.prompts import templates_dir
from gymforge.agent.sources import extra_source_files

SFT = f"{R}/sft"
# sft.extra_sources: every file an import reads is an input, so a changed, added or removed trajectory reruns
# the SFT dataset (a source that does not exist fails here, at parse time).
EXTRA_SFT_FILES = extra_source_files(CFG.sft.extra_sources)


rule student_tokenizer:
    input:
        # Offline the tokenizer is trained on the prompt templates and the verified tasks' texts.
        templates=sorted(str(p) for p in templates_dir().glob("*.j2")) if CFG.train.student == "offline" else [],
        envs=expand(f"{R}/environments/{{slot}}/verified", slot=TOPIC_SLOTS) if CFG.train.student == "offline" else [],
        base=[STUDENT_BASE] if PREFETCHED else [],  # a hub student's tokenizer comes from its prefetched folder
    output:
        directory(f"{R}/student/tokenizer"),
    log:
        f"{LOGS}/student/tokenizer.log",
    params:
        digest=CFG.digest("student"),
        # the folder of the declared templates (offline), else the package's (a hub tokenizer ignores it)
        templates=lambda w, input: Path(input.templates[0]).parent if input.templates else templates_dir(),
    shell:
        gymforge(
            "student-tokenizer",
            "--templates {params.templates} --envs {input.envs} --out {output}",
        )


rule sft_dataset:
    input:
        shards=SHARD_FILES,
        tokenizer=f"{R}/student/tokenizer",
        extra=EXTRA_SFT_FILES,
        decontamination=DECONTAMINATION,
    output:
        jsonl=f"{SFT}/train.jsonl",
        dataset=directory(f"{SFT}/dataset"),
        rollouts=f"{SFT}/rollouts.jsonl",
        stats=f"{SFT}/stats.json",
    log:
        f"{LOGS}/sft/dataset.log",
    benchmark:
        f"{BENCH}/sft/dataset.tsv"
    params:
        # sft: extra_sources, example_unit and the student's train.max_length (rerun_view)
        # covered: the upstream settings of the dataset card's provenance stamp (their rules rerun the shards)
        digest=CFG.digest("filter", "student", "sft", covered=("seed", "teacher", "datasets", "proposals",
                                                                "generation", "sandbox", "verification",
                                                                "trajectories")),
    resources:
        mem_mb=CFG.sft.mem_mb,
        runtime=CFG.sft.runtime_min,
    shell:
        gymforge(
            "sft-dataset",
            "--shards {input.shards} --tokenizer {input.tokenizer} --decontamination {input.decontamination} "
            "--jsonl-out {output.jsonl} --dataset-out {output.dataset} "
            "--rollouts-out {output.rollouts} --stats-out {output.stats}",
        )


rule sft_plots:
    input:
        stats=f"{SFT}/stats.json",
        rollouts=f"{SFT}/rollouts.jsonl",
    output:
        kept=report(f"{SFT}/plots/kept_per_task.png", caption="../report/trajectories.rst", category="2. Trajectories"),
        stats=report(f"{SFT}/plots/trajectory_stats.png", caption="../report/trajectories.rst",
                     category="2. Trajectories"),
    log:
        f"{LOGS}/sft/plots.log",
    shell:
        gymforge(
            "sft-plots",
            "--stats {input.stats} --rollouts {input.rollouts} --kept-out {output.kept} --stats-out {output.stats}",
            config=False,
        )


rule trajectories:
    input:
        f"{R}/config.json",
        SHARD_FILES,
        rules.sft_dataset.output,
        rules.sft_plots.output,
        rules.interface_comparison.output if CFG.trajectories.interfaces else [],
