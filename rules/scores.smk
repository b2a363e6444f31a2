# Stage 3.8: every model in evaluate.models runs every benchmark task runs_per_task times (one job per
# model and task), after a decontamination check of the benchmark against the synthesized tasks; then
# Best Attempt / Best Submission, AUP and the plots.
from gymforge.benchmark.suite import load_benchmark
from gymforge.stages.evaluation import run_ids

BENCHMARK = load_benchmark(CFG.evaluate)
BENCHMARK_TASKS = [t.id for t in BENCHMARK]
TASK_GPUS = {t.id: t.gpus for t in BENCHMARK}  # a GPU task's job declares (and leases) its GPUs
EVAL_MODELS = [m.name for m in CFG.evaluate.models]
SCORES = f"{R}/scores"
EVAL_RECORDS = expand(f"{SCORES}/runs/{{model}}/{{task}}.json", model=EVAL_MODELS, task=BENCHMARK_TASKS)


wildcard_constraints:
    model=r"[A-Za-z0-9][A-Za-z0-9.-]*",


rule decontamination:
    input:
        envs=expand(f"{R}/environments/{{slot}}/verified", slot=TOPIC_SLOTS),
        proposals=expand(f"{R}/proposals/{{slot}}.json", slot=TOPIC_SLOTS),
    output:
        f"{SCORES}/decontamination.json",
    log:
        f"{LOGS}/scores/decontamination.log",
    params:
        digest=CFG.digest("evaluate"),
    shell:
        "{GYMFORGE} --log {log} decontamination --config {CONFIG_JSON} --synthesized {input.envs} --proposals {input.proposals} "
        "--out {output}"


rule eval_runs:
    input:
        checkpoint=built_checkpoint,
        decontamination=f"{SCORES}/decontamination.json",
    output:
        f"{SCORES}/runs/{{model}}/{{task}}.json",
    log:
        f"{LOGS}/scores/{{model}}/{{task}}.log",
    benchmark:
        f"{BENCH}/scores/{{model}}/{{task}}.tsv"
    params:
        digest=CFG.digest("seed", "sandbox", "evaluate"),
        spec=lambda w: model_spec(CFG, w.model).model_dump_json(),
        runs=",".join(map(str, run_ids(CFG))),
        checkpoint=lambda w: f"--checkpoint {shlex.quote(model_checkpoint(w))}" if model_checkpoint(w) else "",
    resources:
        gpu=lambda w: (CFG.evaluate.serving.gpus if served_model(w.model) else 0) + TASK_GPUS[w.task],
        mem_mb=CFG.evaluate.mem_mb,
        runtime=CFG.evaluate.runtime_min,
    shell:
        "{GYMFORGE} --log {log} with-gpus {resources.gpu} -- {GYMFORGE} eval-runs --config {CONFIG_JSON} --model {wildcards.model} --task {wildcards.task} "
        "--runs {params.runs} {params.checkpoint} --log {log} --out {output}"


rule score_table:
    input:
        EVAL_RECORDS,
    output:
        aup=f"{SCORES}/aup.csv",
        scores=f"{SCORES}/scores.json",
        replies=f"{SCORES}/replies.json",
        violins=report(f"{SCORES}/plots/violins.png", caption="../report/scores.rst", category="5. Scores"),
        bars=report(f"{SCORES}/plots/aup.png", caption="../report/scores.rst", category="5. Scores"),
        profiles=report(f"{SCORES}/plots/profiles.png", caption="../report/scores.rst", category="5. Scores"),
    log:
        f"{LOGS}/scores/table.log",
    shell:
        "{GYMFORGE} --log {log} score-table --config {CONFIG_JSON} --records {input} --aup-out {output.aup} "
        "--scores-out {output.scores} --replies-out {output.replies} --violins-out {output.violins} "
        "--bars-out {output.bars} --profiles-out {output.profiles}"


rule run_summary:
    input:
        rules.score_table.output,
        CHECKPOINT,
        f"{SFT}/stats.json",
    output:
        html=report(f"{R}/report/summary.html", caption="../report/summary.rst", category="1. Funnel"),
        png=report(f"{R}/report/funnel.png", caption="../report/funnel.rst", category="1. Funnel"),
    log:
        f"{LOGS}/report/summary.log",
    shell:
        "{GYMFORGE} --log {log} run-summary --results {R} --html-out {output.html} --png-out {output.png}"


rule scores:
    input:
        f"{R}/config.json",
        rules.score_table.output,
        rules.run_summary.output,
