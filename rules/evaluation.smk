# Evaluation (runs) stage: every model in evaluate.models runs every benchmark task runs_per_task times (one job per
# model and task), after a decontamination check of the benchmark against the synthesized tasks.
from gymforge.benchmark.suite import load_benchmark
from gymforge.core.plan import run_ids, teacher_identity

BENCHMARK = load_benchmark(CFG.evaluate)
BENCHMARK_TASKS = [t.id for t in BENCHMARK]
TASK_GPUS = {t.id: t.gpus for t in BENCHMARK}  # a GPU task's job declares (and leases) its GPUs
# A Harbor task's folder (evaluate.harbor) is its jobs' input: an edited folder reruns them.
TASK_FILES = {t.id: sorted(str(p) for p in t.root.rglob("*") if p.is_file()) for t in BENCHMARK if t.benchmark == "harbor"}
EVAL_MODELS = [m.name for m in CFG.evaluate.models]
SCORES = f"{R}/scores"
EVAL_RECORDS = expand(f"{SCORES}/runs/{{model}}/{{task}}.json", model=EVAL_MODELS, task=BENCHMARK_TASKS)
CHECKS = expand(f"{SCORES}/checks/{{task}}.json", task=BENCHMARK_TASKS)


wildcard_constraints:
    model=r"[A-Za-z0-9][A-Za-z0-9.-]*",


rule decontamination:
    input:
        envs=expand(f"{R}/environments/{{slot}}/verified", slot=TOPIC_SLOTS),
        proposals=expand(f"{R}/proposals/{{slot}}.json", slot=TOPIC_SLOTS),
    output:
        DECONTAMINATION,
    log:
        f"{LOGS}/scores/decontamination.log",
    params:
        # What is compared: the benchmark's tasks (the `tasks` param below; covered: how evaluate names them) and the
        # policy. Evaluation settings (steps, models, serving) must not rerun it: the SFT data and RL depend on it.
        digest=CFG.digest("decontamination", "evaluate.benchmark", "evaluate.mlgym_root", covered=("evaluate",)),
        tasks=" ".join(BENCHMARK_TASKS),
    shell:
        gymforge(
            "decontamination",
            "--synthesized {input.envs} --proposals {input.proposals} --out {output}",
        )


rule eval_runs:
    input:
        checkpoint=built_checkpoint,
        decontamination=DECONTAMINATION,
        task=lambda w: TASK_FILES.get(w.task, []),
    output:
        f"{SCORES}/runs/{{model}}/{{task}}.json",
    log:
        f"{LOGS}/scores/{{model}}/{{task}}.log",
    benchmark:
        f"{BENCH}/scores/{{model}}/{{task}}.tsv"
    params:
        # covered: llm.teacher is tracked by the `teacher` param below
        digest=CFG.digest("seed", "sandbox", "agent", "evaluate", "post_training", covered=("teacher",)),
        spec=lambda w: model_spec(CFG, w.model).identity_json(),
        # a teacher's runs rerun when llm.teacher changes (model, endpoint, sampling); the others' do not
        teacher=lambda w: teacher_identity(CFG, model_spec(CFG, w.model)),
        runs=" ".join(map(str, run_ids(CFG))),
        checkpoint=lambda w: f"--checkpoint {shlex.quote(model_checkpoint(w))}" if model_checkpoint(w) else "",
    resources:
        gpu=lambda w: (CFG.evaluate.serving.gpus if served_model(w.model) else 0) + TASK_GPUS[w.task],
        # evaluate.mem_mb, raised to hold evaluate.concurrency sandboxes plus the job (gymforge.runtime.resources)
        mem_mb=resources.evaluation(CFG).mem_mb,
        runtime=CFG.evaluate.runtime_min,
    threads: CFG.evaluate.threads
    shell:
        gymforge(
            "eval-runs",
            "--model {wildcards.model} --task {wildcards.task} --runs {params.runs} {params.checkpoint} "
            "--log {log} --out {output}",
            gpus=True,
        )


rule check_benchmark_task:
    # Each benchmark task's evaluator, probed once with knowledge-free degenerate submissions (gymforge
    # check-task); score_table reports a gameable one beside its AUP contribution.
    input:
        task=lambda w: TASK_FILES.get(w.task, []),
    output:
        f"{SCORES}/checks/{{task}}.json",
    log:
        f"{LOGS}/scores/checks/{{task}}.log",
    benchmark:
        f"{BENCH}/scores/checks/{{task}}.tsv"
    params:
        digest=CFG.digest("seed", "sandbox", "evaluate", "post_training"),
    resources:
        gpu=lambda w: TASK_GPUS[w.task],
        mem_mb=resources.benchmark_check(CFG).mem_mb,  # evaluate.mem_mb, raised to hold its sandbox and the job
        runtime=CFG.evaluate.runtime_min,
    shell:
        gymforge("check-benchmark-task", "--task {wildcards.task} --out {output}", gpus=True)
