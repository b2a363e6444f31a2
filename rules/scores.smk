# Evaluation (scores) stage: Best Attempt / Best Submission, AUP with intervals and the plots; the run summary; target `scores`.


rule score_table:
    input:
        records=EVAL_RECORDS,
        checks=CHECKS,
    output:
        aup=f"{SCORES}/aup.csv",
        scores=f"{SCORES}/scores.json",
        replies=f"{SCORES}/replies.json",
        violins=report(f"{SCORES}/plots/violins.png", caption="../report/scores.rst", category="4. Scores"),
        bars=report(f"{SCORES}/plots/aup.png", caption="../report/scores.rst", category="4. Scores"),
        profiles=report(f"{SCORES}/plots/profiles.png", caption="../report/scores.rst", category="4. Scores"),
    log:
        f"{LOGS}/scores/table.log",
    params:
        # the benchmark's tasks and metrics, exclude_gameable, the models' student/base pairs of the intervals
        digest=CFG.digest("evaluate"),
    shell:
        gymforge(
            "score-table",
            "--records {input.records} --checks {input.checks} --aup-out {output.aup} --scores-out {output.scores} --replies-out "
            "{output.replies} --violins-out {output.violins} --bars-out {output.bars} --profiles-out "
            "{output.profiles}",
        )


rule run_summary:
    input:
        # The funnel reads every stage's records (gymforge.report.funnel.collect); besides these it reads the
        # LLM ledger (results/llm) and the jobs' failure records (logs/**/*.failed.json): logs every job appends
        # to, not rule outputs (the one exception tests/workflow/test_rule_inputs.py allows).
        f"{R}/config.json",
        expand(f"{R}/topics/batches/{{batch}}.json", batch=TOPIC_BATCHES),
        expand(f"{R}/proposals/{{slot}}.json", slot=TOPIC_SLOTS),
        expand(f"{R}/configs/{{slot}}.json", slot=TOPIC_SLOTS),
        expand(f"{R}/tasks/{{slot}}/status.json", slot=TOPIC_SLOTS),
        expand(f"{R}/environments/{{slot}}/report.json", slot=TOPIC_SLOTS),
        DECONTAMINATION,
        SHARD_FILES,
        f"{SFT}/stats.json",
        CHECKPOINT,
        EVAL_RECORDS,
        CHECKS,
        rules.score_table.output,
    output:
        html=report(f"{R}/report/summary.html", caption="../report/summary.rst", category="1. Funnel"),
        png=report(f"{R}/report/funnel.png", caption="../report/funnel.rst", category="1. Funnel"),
    log:
        f"{LOGS}/report/summary.log",
    shell:
        gymforge("run-summary", f"--results {R} --html-out {{output.html}} --png-out {{output.png}}", config=False)


rule scores:
    input:
        f"{R}/config.json",
        rules.score_table.output,
        rules.run_summary.output,
