# Rollouts stage: teacher rollouts in shards per topic slot (trivial shards for tasks that were not verified).
from gymforge.core.plan import shard_ids, shard_mem_mb, shard_rollouts

shard_mem_mb(CFG)  # a trajectories.mem_mb below what its sandboxes need fails the plan here

TRAJ_SHARDS = shard_ids(CFG)
SHARD_FILES = expand(f"{R}/trajectories/{{slot}}/shard_{{shard}}.json", slot=TOPIC_SLOTS, shard=TRAJ_SHARDS)


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
        digest=CFG.digest("seed", "teacher", "sandbox", "agent", "trajectories", "post_training"),
        # The rollout indices this shard holds: changing per_task or shard_size reruns only the shards it changes.
        rollouts=lambda w: ",".join(map(str, shard_rollouts(CFG, int(w.shard)))),
    resources:
        # concurrency x sandbox memory + the job (a smaller mem_mb fails the plan); trajectories.gpus only for a task
        # whose code needs a GPU (its verification report says); a slot verification did not keep only writes a
        # "skipped" record, and asks for no GPU and minutes (gymforge.runtime.resources)
        gpu=lambda w, input: resources.shard(CFG, input.report).gpu,
        mem_mb=lambda w, input: resources.shard(CFG, input.report).mem_mb,
        runtime=lambda w, input: resources.shard(CFG, input.report).runtime,
    threads: CFG.trajectories.threads
    shell:
        gymforge(
            "rollout-shard",
            "--slot {wildcards.slot} --shard {wildcards.shard} --report {input.report} --env {input.env} "
            "--out {output}",
            gpus=True,
        )


rule interface_comparison:
    """The agent interfaces compared on the same tasks (`trajectories.interfaces`, docs/post-training.md)."""
    input:
        shards=SHARD_FILES,
        reports=expand(f"{R}/environments/{{slot}}/report.json", slot=TOPIC_SLOTS),
    output:
        comparison=f"{R}/interfaces/comparison.json",
        table=f"{R}/interfaces/comparison.md",
    log:
        f"{LOGS}/interfaces/comparison.log",
    params:
        digest=CFG.digest("trajectories.interfaces"),
    shell:
        gymforge(
            "interface-comparison",
            "--shards {input.shards} --reports {input.reports} --out {output.comparison} --table-out {output.table}",
        )
