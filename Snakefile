# gymforge: topics -> validated tasks -> ... (see README). Rules are thin; logic lives in src/gymforge.
from gymforge.core.config import layered_config, validate_config
from gymforge.runtime.locks import clear_stale_locks


report: "report/workflow.rst"


# No `configfile:` directive: Snakemake would merge every --configfile over it, so each run would inherit the quick
# start's demo values. Without --configfile a run reads config.yaml; with one, that file (and the files its `base:`
# names) over the models' defaults, then --config (docs/configuration.md#how-configs-layer).
config.clear()
config.update(layered_config(workflow.overwrite_configfiles, workflow.config_settings.config))
# Fails here, before any job is scheduled, with the offending key path.
CFG = validate_config(config)
# config.yaml holds only overrides (the defaults live in the models): the report's first page (report/workflow.rst)
# reads the resolved values from here. Jobs read the resolved config file (rules/common.smk), never `config`.
config.update(seed=CFG.seed, results_dir=CFG.results_dir)
# A run killed with kill -9 leaves its lock behind: removed here when no other snakemake runs in this directory.
# Only by the main process: a cluster job's own snakemake (on another node) cannot see the run that holds the lock.
if workflow.is_main_process:
    clear_stale_locks()


# `snakemake --lint` is clean apart from "Specify a conda environment or container for each rule": deliberately
# absent. Every job runs `python -m gymforge` with the interpreter that runs Snakemake (rules/common.smk), so the
# software is the installed gymforge package and its pinned dependencies (pyproject.toml), one environment for all
# steps; a per-rule conda env would install that same package 16 times. Task and agent code does not run in the
# job's environment but in the sandbox (`sandbox.backend`: bubblewrap over the venv, or the docker image built by
# scripts/docker_sandbox.sh), which is where a container belongs; on a cluster the profile's executor provides it.
include: "rules/common.smk"
include: "rules/topics.smk"
include: "rules/proposals.smk"
include: "rules/datasets.smk"
include: "rules/generation.smk"
include: "rules/verification.smk"
include: "rules/micro.smk"
include: "rules/rollouts.smk"
include: "rules/sft.smk"
include: "rules/training.smk"
include: "rules/rl.smk"
include: "rules/evaluation.smk"
include: "rules/scores.smk"
include: "rules/interop.smk"


rule run_config:
    """The config of the latest real run, for `gymforge status` and provenance."""
    input:
        CONFIG_JSON,
    output:
        f"{R}/config.json",
    params:
        config=Path(CONFIG_JSON).stem,
    log:
        f"{LOGS}/run_config.log",
    shell:
        "cp {input} {output} 2> {log}"


rule all:
    default_target: True
    input:
        rules.trajectories.input,
        rules.checkpoints.input,
        rules.scores.input,
        rules.rl_plot.output if RL_EVALUATED else [],


# Every rule is known now: hand each job the config sections its rule declares (rules/common.smk).
declare_reads()


onstart:
    # Before the first job is submitted: a job no partition can take fails the run here, not in the queue.
    check_partitions()
