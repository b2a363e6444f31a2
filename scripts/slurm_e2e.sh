#!/usr/bin/env bash
# End to end through a real SLURM cluster: start the single-node test cluster (scripts/slurm_cluster.sh),
# run a tiny offline config with `snakemake --profile profiles/slurm` up to TARGET (default: trajectories),
# and check that every job really went through SLURM (sbatch job ids in the Snakemake log, the same ids
# COMPLETED in `squeue --states=all`, SLURM log files; no job arrays: profiles/slurm leaves them off).
#
#   scripts/slurm_e2e.sh [TARGET]
#
# Environment:
#   GYMFORGE_PYTHON      interpreter with gymforge + snakemake + the SLURM plugin (default: .venv/bin/python)
#   GYMFORGE_E2E_DIR     scratch working directory (default: a new /tmp/gymforge-slurm-e2e.XXXXXX; removed on
#                        success unless GYMFORGE_E2E_KEEP=1)
#   GYMFORGE_E2E_TIMEOUT seconds for the Snakemake run (default 900)
#   GYMFORGE_E2E_CONFIG  a config file under configs/ to run instead of the tiny offline one (configs/ is copied
#                        too, for its `base:`); scripts/rehearsal.sh runs configs/rehearsal.yaml this way
#   GYMFORGE_E2E_GPU_RULES rules whose jobs must ask SLURM for a GPU, space-separated (default: none); every other
#                        job must not, except eval_runs of a served model, which asks for one when
#                        evaluate.serving.gpus does, and a slot's verify_environment, micro_task and rollout_shard
#                        jobs, which ask for one when their task needs it (gymforge.runtime.resources, read from
#                        the slot's records)
#   GYMFORGE_SLURM_KEEP  1: leave the cluster running afterwards. By default the cluster is stopped again
#                        if this script started it, and left alone if it was already running.
#   GYMFORGE_SLURM_DIR   the cluster's scratch directory (see slurm_cluster.sh)
#
# Exit codes: 0 ok, 1 failure, 77 SLURM cannot run on this machine (reason on stderr; tests skip).
# Writes <workdir>/e2e-summary.json. Other snakemake invocations are never slowed down by this script:
# the cluster's slurm.conf is private (SLURM_CONF is set only for this run), see slurm_cluster.sh.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TARGET="${1:-trajectories}"
PY="${GYMFORGE_PYTHON:-$REPO/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
CLUSTER="$REPO/scripts/slurm_cluster.sh"
TIMEOUT="${GYMFORGE_E2E_TIMEOUT:-900}"
started_at=$SECONDS

say() { echo "slurm_e2e: $*" >&2; }

"$PY" -c "import snakemake_executor_plugin_slurm" 2>/dev/null || {
    say "ERROR: $PY has no snakemake-executor-plugin-slurm (pip install -e '.[slurm]')"
    exit 1
}

# --- cluster ---------------------------------------------------------------------------------------------
was_running=0
"$CLUSTER" status >/dev/null 2>&1 && was_running=1
set +e
cluster_env="$("$CLUSTER" start)"
rc=$?
set -e
[ $rc -eq 77 ] && exit 77
[ $rc -eq 0 ] || { say "ERROR: the SLURM test cluster did not start (exit $rc)"; exit 1; }
eval "$cluster_env"
export SLURM_CONF
cluster_seconds=$((SECONDS - started_at))

stop_cluster() {
    if [ "$was_running" = 0 ] && [ "${GYMFORGE_SLURM_KEEP:-0}" != 1 ]; then
        "$CLUSTER" stop >/dev/null 2>&1 || true
    fi
}
trap stop_cluster EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# --- a copy of the workflow with a tiny offline config -----------------------------------------------------
if [ -n "${GYMFORGE_E2E_DIR:-}" ]; then
    WORK="$GYMFORGE_E2E_DIR"
    mkdir -p "$WORK"
else
    WORK="$(mktemp -d /tmp/gymforge-slurm-e2e.XXXXXX)"
fi
rm -rf "$WORK/rules" "$WORK/profiles" "$WORK/results" "$WORK/.snakemake" "$WORK/.cache"
cp "$REPO/Snakefile" "$REPO/config.yaml" "$WORK/"
cp -r "$REPO/rules" "$WORK/rules"
mkdir -p "$WORK/profiles"
cp -r "$REPO/profiles/slurm" "$WORK/profiles/slurm"    # only this profile: no workflow profile applies
CONFIGFILE=e2e-config.yaml
if [ -n "${GYMFORGE_E2E_CONFIG:-}" ]; then
    rm -rf "$WORK/configs"
    cp -r "$REPO/configs" "$WORK/configs"
    CONFIGFILE="configs/$(basename "$GYMFORGE_E2E_CONFIG")"
else
cat >"$WORK/e2e-config.yaml" <<'EOF'
# 2 topic slots, 2 rollouts per verified task in shards of 1: a handful of jobs of every kind. trajectories.gpus: 1,
# but the GPU request of a slot's verification, micro variant and shards follows its task (gymforge.runtime.resources):
# the offline tasks are CPU tasks, so those jobs must go to the CPU partition without a GPU.
base: config.yaml
topics: {n: 2, batch_size: 2}
trajectories: {per_task: 2, shard_size: 1, concurrency: 1, gpus: 1}
EOF
fi

export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
LOG="$WORK/snakemake.log"
say "running '$TARGET' in $WORK through SLURM ($SLURM_CONF)"
run_started=$SECONDS
set +e
(
    cd "$WORK"
    # --workflow-profile none: Snakemake would otherwise also apply profiles/default (cores: 2, latency-wait: 5)
    # on top of profiles/slurm. The two status flags only make this tiny run faster to notice finished jobs.
    timeout -k 30 "$TIMEOUT" "$PY" -m snakemake --profile profiles/slurm --workflow-profile none \
        --configfile "$CONFIGFILE" --slurm-init-seconds-before-status-checks 2 \
        --max-status-checks-per-second 10 -- "$TARGET"
) >"$LOG" 2>&1
smk_rc=$?
set -e
run_seconds=$((SECONDS - run_started))

# --- checks ------------------------------------------------------------------------------------------------
set +e
GPU_RULES="${GYMFORGE_E2E_GPU_RULES:-}"
(cd "$WORK" && "$PY" - "$WORK" "$TARGET" "$smk_rc" "$run_seconds" "$cluster_seconds" "$CONFIGFILE" "$GPU_RULES") <<'PYEOF'
import json, re, subprocess, sys
from pathlib import Path

from gymforge.core.config import load_config

work, target, smk_rc, run_s, cluster_s = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
cfg = load_config(work / sys.argv[6])
gpu_rules = {f"rule_{r}" for r in sys.argv[7].split()}
log = (work / "snakemake.log").read_text(errors="replace")
problems = []
if smk_rc != 0:
    problems.append(f"snakemake exited {smk_rc}")

singles = {int(s): int(j) for s, j in re.findall(r"Job (\d+) has been submitted with SLURM jobid (\d+)", log)}
arrays = []
for ids, jobid, lo, hi in re.findall(r"Submitted array job with Snakemake IDs ([\d,]+) and SLURM job ID (\d+)\. "
                                      r"The individual task IDs are (\d+)-(\d+)", log):
    arrays.append({"slurm_jobid": int(jobid), "snakemake_jobs": [int(i) for i in ids.split(",")],
                   "tasks": f"{lo}-{hi}"})
slurm_ids = {str(j) for j in singles.values()} | {str(a["slurm_jobid"]) for a in arrays}
run_id = re.search(r"SLURM run ID: (\S+)", log)

def minutes(limit):
    """squeue's time limit ([D-]HH:MM:SS or MM:SS) in minutes."""
    days, _, clock = limit.rpartition("-")
    parts = [int(x) for x in clock.split(":")] if clock and clock[0].isdigit() else [0]
    while len(parts) < 3:
        parts.insert(0, 0)
    return int(days or 0) * 1440 + parts[0] * 60 + parts[1] + (parts[2] > 0)


# A CPU job longer than the CPU partition allows goes to the GPU partition (the plugin picks the only one it fits).
import yaml  # noqa: E402

cpu_limit = (yaml.safe_load((work / "profiles/slurm/partitions.yaml").read_text())["partitions"]["debug"]
             .get("max_runtime", float("inf")))

# Rules with a shell command must run as SLURM jobs, never as local jobs of the Snakemake process.
# (a checkpoint, such as `proposal`, is logged as `checkpoint <name>:`)
local = set(re.findall(r"^local(?:rule|checkpoint) (\w+):", log, re.M))
remote = set(re.findall(r"^(?:rule|checkpoint) (\w+):", log, re.M))
aggregation = {"topics", "tasks", "environments", "trajectories", "checkpoints", "scores", "all"}
if local - aggregation:
    problems.append(f"jobs ran locally instead of through SLURM: {sorted(local - aggregation)}")
expected_remote = {"topic_batch", "proposal", "task_configs", "starter_code", "verify_environment"}
if target in ("trajectories", "all"):
    expected_remote |= {"rollout_shard", "student_tokenizer", "sft_dataset", "sft_plots"}
if target == "all":
    expected_remote |= {"decontamination", "student_base", "train_student", "check_benchmark_task", "eval_runs",
                        "score_table", "run_summary"}
if smk_rc == 0 and not expected_remote <= remote:
    problems.append(f"rules never submitted: {sorted(expected_remote - remote)}")
if not slurm_ids:
    problems.append("no SLURM job id in the Snakemake log")

# The controller still knows every job (MinJobAge=3600 s): all must be COMPLETED.
states, jobs = {}, {}
if run_id:
    out = subprocess.run(["squeue", "--states=all", "--noheader", "--format=%i|%T|%P|%b|%k|%l", "--name", run_id.group(1)],
                         capture_output=True, text=True)
    for line in out.stdout.splitlines():
        jobid, state, partition, gres, comment, limit = (line.split("|") + [""] * 6)[:6]
        states[jobid] = state
        jobs[jobid] = {"state": state, "partition": partition, "gres": gres, "rule": comment.split("_wildcards_")[0],
                       "comment": comment, "minutes": minutes(limit)}
    if out.returncode != 0:
        problems.append(f"squeue failed: {out.stderr.strip()}")
    # `--gpus=N` shows up as the job's TRES per job (gres:gpu:N), not in %b.
    tres = subprocess.run(["squeue", "--states=all", "--noheader", "--Format=JobArrayID:40,tres-per-job:60",
                           "--name", run_id.group(1)], capture_output=True, text=True)
    for line in tres.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in jobs and parts[1] != "N/A":
            jobs[parts[0]]["gres"] = parts[1]
else:
    problems.append("no 'SLURM run ID' in the Snakemake log")
# GPU jobs went to the GPU partition with a GPU request, others did not. A served model's evaluation asks for
# evaluate.serving.gpus; a slot's jobs ask for trajectories.gpus only when their task needs a GPU (its records say).
from gymforge.runtime import resources  # noqa: E402

served = {m.name for m in cfg.evaluate.models if m.source not in ("teacher", "endpoint")}
slot_requests = {"rule_verify_environment": lambda slot: resources.verification(cfg, results / "tasks" / slot / "status.json"),
                 "rule_rollout_shard": lambda slot: resources.shard(cfg, results / "environments" / slot / "report.json"),
                 "rule_micro_task": lambda slot: resources.micro(cfg, results / "environments" / slot / "report.json")}
results = work / cfg.results_dir
slot_gpus = {}
for jobid, job in jobs.items():
    wants_gpu = job["rule"] in gpu_rules
    if job["rule"] == "rule_eval_runs" and cfg.evaluate.serving.gpus:
        wants_gpu = any(f"_{name}_" in job["comment"] for name in served)
    if job["rule"] in slot_requests and (slot := re.search(r"_wildcards_([A-Za-z0-9]+)", job["comment"])):
        wants_gpu = slot_requests[job["rule"]](slot[1]).gpu > 0
        slot_gpus[jobid] = {"rule": job["rule"][5:], "slot": slot[1], "gpu": wants_gpu, "partition": job["partition"]}
    if wants_gpu and (job["partition"] != "gpu" or "gpu" not in job["gres"]):
        problems.append(f"GPU job {jobid} ({job['rule']}) ran in partition {job['partition']!r} with gres {job['gres']!r}")
    if not wants_gpu and ("gpu" in job["gres"] or job["partition"] != ("debug" if job["minutes"] <= cpu_limit else "gpu")):
        problems.append(f"CPU job {jobid} ({job['rule']}) ran in partition {job['partition']!r} with gres {job['gres']!r}")
# Rules wrapped in `gymforge with-gpus` log the devices they got: inside SLURM they are passed through.
leases = [line.strip() for p in sorted((work / cfg.results_dir / "logs").rglob("*.log"))
          for line in p.read_text(errors="replace").splitlines() if line.startswith("gymforge with-gpus:")]
odd = [line for line in leases if "passed through" not in line and "no GPU requested" not in line]
if odd:
    problems.append(f"with-gpus inside SLURM did not use the job's devices: {odd[:3]}")
seen = {j.split("_")[0] for j in states}
if slurm_ids - seen:
    problems.append(f"SLURM does not know jobs {sorted(slurm_ids - seen)}")
bad = {j: s for j, s in states.items() if s != "COMPLETED"}
if bad:
    problems.append(f"SLURM jobs not COMPLETED: {bad}")
array_tasks = sorted(j for j in states if "_" in j)
if arrays:  # profiles/slurm leaves job arrays off: plugin 2.8 drops array jobs (tests/workflow/test_slurm_arrays.py)
    problems.append(f"jobs went out as SLURM job arrays: {arrays}")

slurm_logs = sorted(str(p.relative_to(work)) for p in (work / ".snakemake" / "slurm_logs").rglob("*.log"))
if not slurm_logs:
    problems.append("no SLURM log files under .snakemake/slurm_logs")

results = work / cfg.results_dir
outputs = {"environments": [results / "environments"], "trajectories": [results / "sft" / "stats.json"],
           "all": [results / "sft" / "stats.json", results / "scores" / "aup.csv"]}
for path in outputs.get(target, []):
    if smk_rc == 0 and not path.exists():
        problems.append(f"missing output {path}")
shards = sorted(str(p.relative_to(results)) for p in results.glob("trajectories/*/shard_*.json"))

summary = {
    "ok": not problems, "problems": problems, "target": target, "snakemake_rc": smk_rc,
    "cluster_start_s": cluster_s, "snakemake_s": run_s, "slurm_run_id": run_id.group(1) if run_id else None,
    "sbatch_jobs": len(singles), "array_jobs": arrays, "array_tasks": array_tasks, "slurm_states": states,
    "slurm_jobs": jobs, "gpu_leases": leases,
    "slurm_logs": len(slurm_logs), "remote_rules": sorted(remote), "local_rules": sorted(local),
    "rollout_shards": shards, "slot_gpus": slot_gpus,
}
(work / "e2e-summary.json").write_text(json.dumps(summary, indent=2) + "\n")
if problems:
    print("slurm_e2e: FAILED:\n  - " + "\n  - ".join(problems), file=sys.stderr)
    sys.exit(1)
print(f"slurm_e2e: OK: {len(singles)} sbatch jobs + {len(arrays)} job array(s) with {len(array_tasks)} tasks, "
      f"all COMPLETED in SLURM; {len(slurm_logs)} SLURM logs; {len(shards)} rollout shards; "
      f"cluster start {cluster_s} s, snakemake {run_s} s", file=sys.stderr)
PYEOF
check_rc=$?
set -e
if [ $check_rc -ne 0 ]; then
    echo "----- tail of $LOG -----" >&2
    tail -n 60 "$LOG" >&2
    for f in $(ls -t "$WORK"/.snakemake/slurm_logs/*/*/*.log "$WORK"/.snakemake/slurm_logs/*/*.log 2>/dev/null | head -n 3); do
        echo "----- tail of $f -----" >&2
        tail -n 20 "$f" >&2
    done
    "$CLUSTER" logs 2>&1 | tail -n 40 >&2 || true
    say "FAILED after $((SECONDS - started_at)) s; everything is kept in $WORK (summary: $WORK/e2e-summary.json)"
    exit 1
fi
say "total $((SECONDS - started_at)) s; summary: $WORK/e2e-summary.json"
if [ -z "${GYMFORGE_E2E_DIR:-}" ] && [ "${GYMFORGE_E2E_KEEP:-0}" != 1 ]; then
    rm -rf "$WORK"
fi
