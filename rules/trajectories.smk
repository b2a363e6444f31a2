# Stages 3.5-3.6: teacher rollouts in shards per topic slot (trivial shards for tasks that were not
# verified), the student's tokenizer, the filters -> SFT dataset + stats, and the plots.
from gymforge.importing import extra_source_files
from gymforge.prompts import templates_dir
from gymforge.stages.rollouts import shard_ids, shard_rollouts

TRAJ_SHARDS = shard_ids(CFG)
SHARD_FILES = expand(f"{R}/trajectories/{{slot}}/shard_{{shard}}.json", slot=TOPIC_SLOTS, shard=TRAJ_SHARDS)
SFT = f"{R}/sft"
# sft.extra_sources: every file an import reads is an input, so a changed, added or removed trajectory reruns
# the SFT dataset (a source that does not exist fails here, at parse time).
EXTRA_SFT_FILES = extra_source_files(CFG.sft.extra_sources)


rule rollout_shard:
    input:
        report=f"{R}/environments/{{slot}}/report.json",
        env=f"{R}/environments/{{slot}}/verified",
    output:
        f"{R}/trajectories/{{slot}}/shard_{{shard}}.json",
    log:
        f"{LOGS}/trajectories/{{slot}}/shard_{{shard}}.log",
    benchmark:
        f"{BENCH}/trajectories/{{slot}}/shard_{{shard}}.tsv"
    wildcard_constraints:
        shard=r"\d{4}",
    params:
        digest=CFG.digest("seed", "teacher", "sandbox", "trajectories"),
        # The rollout indices this shard holds: changing per_task or shard_size reruns only the shards it changes.
        rollouts=lambda w: ",".join(map(str, shard_rollouts(CFG, int(w.shard)))),
    resources:
        gpu=CFG.trajectories.gpus,
        mem_mb=CFG.trajectories.mem_mb or CFG.sandbox.memory_mb * CFG.trajectories.concurrency + 1024,
        runtime=CFG.trajectories.runtime_min,
    shell:
        "{GYMFORGE} --log {log} with-gpus {resources.gpu} -- {GYMFORGE} rollout-shard --config {CONFIG_JSON} --slot {wildcards.slot} --shard {wildcards.shard} "
        "--report {input.report} --env {input.env} --out {output}"


rule student_tokenizer:
    input:
        # Offline the tokenizer is trained on the prompt templates and the verified tasks' texts.
        templates=sorted(str(p) for p in templates_dir().glob("*.j2")) if CFG.train.student == "offline" else [],
        envs=expand(f"{R}/environments/{{slot}}/verified", slot=TOPIC_SLOTS) if CFG.train.student == "offline" else [],
    output:
        directory(f"{R}/student/tokenizer"),
    log:
        f"{LOGS}/student/tokenizer.log",
    params:
        digest=CFG.digest("student"),
        templates=str(templates_dir()),
    shell:
        "{GYMFORGE} --log {log} student-tokenizer --config {CONFIG_JSON} --templates {params.templates} "
        "--envs {input.envs} --out {output}"


rule sft_dataset:
    input:
        shards=SHARD_FILES,
        tokenizer=f"{R}/student/tokenizer",
        extra=EXTRA_SFT_FILES,
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
        digest=CFG.digest("filter", "student", *(["sft"] if CFG.sft.extra_sources else [])),
    resources:
        mem_mb=4096,
    shell:
        "{GYMFORGE} --log {log} sft-dataset --config {CONFIG_JSON} --tokenizer {input.tokenizer} --jsonl-out {output.jsonl} "
        "--dataset-out {output.dataset} --rollouts-out {output.rollouts} --stats-out {output.stats}"


rule sft_plots:
    input:
        stats=f"{SFT}/stats.json",
        rollouts=f"{SFT}/rollouts.jsonl",
    output:
        kept=report(f"{SFT}/plots/kept_per_task.png", caption="../report/trajectories.rst", category="3. Trajectories"),
        stats=report(f"{SFT}/plots/trajectory_stats.png", caption="../report/trajectories.rst",
                     category="3. Trajectories"),
    log:
        f"{LOGS}/sft/plots.log",
    shell:
        "{GYMFORGE} --log {log} sft-plots --stats {input.stats} --rollouts {input.rollouts} --kept-out {output.kept} "
        "--stats-out {output.stats}"


rule trajectories:
    input:
        f"{R}/config.json",
        SHARD_FILES,
        rules.sft_dataset.output,
        rules.sft_plots.output,
