#!/usr/bin/env bash
# The rehearsal of the paper-scale run (configs/rehearsal.yaml: configs/paper-scale.yaml with sizes shrunk): the
# whole pipeline, topics to scores with on-policy RL, through the single-node SLURM cluster, the docker sandbox and a
# teacher endpoint that enforces OpenAI's reasoning-model rules.
#
#   scripts/rehearsal.sh
#
# 1. the docker sandbox: scripts/docker_sandbox.sh (a private dockerd and the offline image; DOCKER_HOST exported);
# 2. the teacher: `gymforge teacher-server --endpoint reasoning` on 127.0.0.1:18431 (configs/rehearsal.yaml's
#    llm.teacher.base_url), logging every request's fields to <workdir>/teacher-requests.jsonl;
# 3. the run: scripts/slurm_e2e.sh all with GYMFORGE_E2E_CONFIG=configs/rehearsal.yaml, which starts the SLURM test
#    cluster, runs `snakemake --profile profiles/slurm --workflow-profile none --configfile configs/rehearsal.yaml`
#    in a scratch copy of the workflow and checks that every job went through SLURM;
# 4. the checks here: containers of the sandbox image ran on the private daemon and every recorded episode says
#    `docker`; every teacher request carried max_completion_tokens and neither max_tokens nor temperature, none was
#    refused, reasoning tokens were reported and billed; scores/aup.csv exists; `gymforge status --json` has every
#    stage with items done.
#
# Environment:
#   GYMFORGE_PYTHON            interpreter with gymforge[dev] + the SLURM plugin (default: .venv/bin/python)
#   GYMFORGE_REHEARSAL_DIR     working directory (default: a new /tmp/gymforge-rehearsal.XXXXXX; always kept)
#   GYMFORGE_REHEARSAL_TIMEOUT seconds for the Snakemake run (default 2400)
#   GYMFORGE_SLURM_KEEP        1: leave the SLURM cluster running (see slurm_e2e.sh); the dockerd is always left
#                              running (docker_sandbox.sh reuses it)
#
# Exit codes: 0 ok, 1 failure, 77 SLURM or docker cannot run on this machine (reason on stderr; the test skips).
# Writes <workdir>/rehearsal-summary.json (what the checks found, with the timings).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${GYMFORGE_PYTHON:-$REPO/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
CONFIG=configs/rehearsal.yaml
started_at=$SECONDS

say() { echo "rehearsal: $*" >&2; }

# The endpoint the overlay names (llm.teacher.base_url): one source of truth for host and port.
read -r HOST PORT < <("$PY" - "$REPO/$CONFIG" <<'PYEOF'
import sys
from urllib.parse import urlsplit

from gymforge.core.config import load_config

url = urlsplit(load_config(sys.argv[1]).llm.teacher.base_url)
print(url.hostname, url.port)
PYEOF
)

if [ -n "${GYMFORGE_REHEARSAL_DIR:-}" ]; then
    WORK="$GYMFORGE_REHEARSAL_DIR"
    mkdir -p "$WORK"
else
    WORK="$(mktemp -d /tmp/gymforge-rehearsal.XXXXXX)"
fi
rm -f "$WORK/teacher-requests.jsonl" "$WORK/rehearsal-summary.json"

# --- the docker sandbox --------------------------------------------------------------------------------------
[ "$(id -u)" = 0 ] || command -v dockerd >/dev/null 2>&1 || { say "SKIP: no dockerd and not root to install one"; exit 77; }
[ "$(id -u)" = 0 ] || { say "SKIP: the docker sandbox's private daemon needs root (scripts/docker_sandbox.sh)"; exit 77; }
docker_started=$SECONDS
docker_env="$(bash "$REPO/scripts/docker_sandbox.sh")" || { say "ERROR: scripts/docker_sandbox.sh failed"; exit 1; }
export "$(echo "$docker_env" | tail -n 1)"     # DOCKER_HOST=unix://...
docker_seconds=$((SECONDS - docker_started))
since="$(date -u +%Y-%m-%dT%H:%M:%SZ)"

# --- the strict teacher endpoint -----------------------------------------------------------------------------
if "$PY" -c "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1)" "$HOST" "$PORT" 2>/dev/null; then
    say "ERROR: $HOST:$PORT is taken; configs/rehearsal.yaml's llm.teacher.base_url needs it free"
    exit 1
fi
"$PY" -m gymforge teacher-server --endpoint reasoning --host "$HOST" --port "$PORT" \
    --request-log "$WORK/teacher-requests.jsonl" >"$WORK/teacher-server.log" 2>&1 &
teacher_pid=$!
stop_teacher() { kill "$teacher_pid" 2>/dev/null || true; wait "$teacher_pid" 2>/dev/null || true; }
trap stop_teacher EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
for _ in $(seq 100); do
    "$PY" -c "import urllib.request, sys; urllib.request.urlopen(sys.argv[1], timeout=1)" "http://$HOST:$PORT/health" \
        2>/dev/null && break
    kill -0 "$teacher_pid" 2>/dev/null || { say "ERROR: the teacher server exited: $(tail -5 "$WORK/teacher-server.log")"; exit 1; }
    sleep 0.2
done

# --- the run through SLURM -----------------------------------------------------------------------------------
# The key travels to the jobs with sbatch --export=ALL; the loopback endpoint takes any.
export OPENAI_API_KEY=rehearsal-key-not-a-secret
export SNAKEMAKE_SLURM_PARTITIONS=profiles/slurm/partitions.yaml   # relative to the scratch copy the run is in
set +e
GYMFORGE_PYTHON="$PY" GYMFORGE_E2E_DIR="$WORK" GYMFORGE_E2E_CONFIG="$CONFIG" \
    GYMFORGE_E2E_TIMEOUT="${GYMFORGE_REHEARSAL_TIMEOUT:-2400}" GYMFORGE_E2E_GPU_RULES="train_student train_rl" \
    "$REPO/scripts/slurm_e2e.sh" all
e2e_rc=$?
set -e
[ $e2e_rc -eq 77 ] && exit 77

# --- the checks ----------------------------------------------------------------------------------------------
set +e
(cd "$WORK" && "$PY" - "$WORK" "$CONFIG" "$e2e_rc" "$since" "$docker_seconds" "$((SECONDS - started_at))") <<'PYEOF'
import json, subprocess, sys
from pathlib import Path

from gymforge.core.config import load_config

work, config, e2e_rc, since, docker_s, total_s = (Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4],
                                                 int(sys.argv[5]), int(sys.argv[6]))
cfg = load_config(work / config)
results = work / cfg.results_dir
problems = []
e2e = json.loads((work / "e2e-summary.json").read_text()) if (work / "e2e-summary.json").exists() else {}
if e2e_rc != 0 or not e2e.get("ok"):
    problems.append(f"the SLURM run failed its checks (slurm_e2e.sh exit {e2e_rc}): {e2e.get('problems')}")

# The sandbox: containers of the image ran on the private daemon during the run, and every episode recorded says so.
events = subprocess.run(["docker", "events", "--since", since, "--until", "0s", "--format", "{{json .}}",
                         "--filter", "type=container", "--filter", "event=start",
                         "--filter", "label=gymforge.sandbox=1"], capture_output=True, text=True, timeout=120)
containers = [json.loads(line) for line in events.stdout.splitlines() if line.strip()]
images = sorted({c.get("from") or c.get("Actor", {}).get("Attributes", {}).get("image", "?") for c in containers})
if events.returncode != 0:
    problems.append(f"docker events failed: {events.stderr.strip()}")
elif not containers:
    problems.append("no sandbox container started on the docker daemon during the run")
elif images != [cfg.sandbox.image]:
    problems.append(f"sandbox containers ran images {images}, not {cfg.sandbox.image}")
backends = {}


def episodes(node):
    """Every recorded episode's `info.sandbox` in a JSON document (a trajectory, a shard of them, a report)."""
    if isinstance(node, dict):
        info = node.get("info")
        if isinstance(info, dict) and isinstance(info.get("sandbox"), str):
            yield info["sandbox"]
        for value in node.values():
            yield from episodes(value)
    elif isinstance(node, list):
        for value in node:
            yield from episodes(value)


for path in [*results.rglob("*.traj"), *results.glob("trajectories/*/shard_*.json")]:
    try:
        data = json.loads(path.read_text())
    except ValueError:
        continue
    for name in episodes(data):
        backends[name] = backends.get(name, 0) + 1
if not backends:
    problems.append("no recorded episode names its sandbox")
elif set(backends) != {"docker"}:
    problems.append(f"episodes ran in sandboxes {backends}, not only docker")

# The teacher endpoint: what it was asked, and what it answered.
requests = [json.loads(line) for line in (work / "teacher-requests.jsonl").read_text().splitlines() if line.strip()] \
    if (work / "teacher-requests.jsonl").exists() else []
reasoning_billed = sum(((r.get("usage") or {}).get("completion_tokens_details") or {}).get("reasoning_tokens", 0)
                       for r in requests)
if not requests:
    problems.append("the teacher endpoint saw no request")
bad = [r for r in requests if "max_completion_tokens" not in r["fields"] or "max_tokens" in r["fields"]
       or "temperature" in r["fields"]]
if bad:
    problems.append(f"{len(bad)} teacher requests broke the reasoning model's rules, e.g. {bad[0]}")
refused = [r for r in requests if r.get("status") != 200]
if refused:
    problems.append(f"{len(refused)} teacher requests were refused, e.g. {refused[0]}")
efforts = sorted({str(r.get("reasoning_effort")) for r in requests})
if requests and efforts != [cfg.llm.teacher.reasoning_effort]:
    problems.append(f"reasoning efforts sent: {efforts}, configured {cfg.llm.teacher.reasoning_effort}")
if requests and reasoning_billed <= 0:
    problems.append("the endpoint reported no reasoning tokens")

# The funnel: every stage, with items done, and the ledger's reasoning tokens and cost.
status = subprocess.run([sys.executable, "-m", "gymforge", "status", "--json", "--results", str(results)],
                        capture_output=True, text=True, timeout=300)
funnel = json.loads(status.stdout) if status.returncode == 0 and status.stdout.strip() else {}
if not funnel:
    problems.append(f"gymforge status --json failed: {status.stderr.strip()[-500:]}")
stages = funnel.get("stages", {})
expected = ["topics", "proposals", "configs", "tasks", "environments", "decontamination", "trajectories",
            "checkpoints", "scores"]
missing = [s for s in expected if s not in stages]
if missing:
    problems.append(f"funnel stages missing: {missing}")
empty = [s for s in expected if s in stages and not stages[s].get("done")]
if empty:
    problems.append(f"funnel stages with nothing done: {empty}")
ledger_reasoning = sum((s.get("usage") or {}).get("reasoning_tokens", 0) for s in stages.values())
if funnel and ledger_reasoning <= 0:
    problems.append("the ledger billed no reasoning tokens")
aup = results / "scores" / "aup.csv"
if not aup.exists():
    problems.append(f"missing {aup}")

summary = {
    "ok": not problems, "problems": problems, "config": config, "results_dir": str(results),
    "seconds": {"total": total_s, "docker_setup": docker_s, "slurm_cluster_start": e2e.get("cluster_start_s"),
                "snakemake": e2e.get("snakemake_s")},
    "slurm": {"sbatch_jobs": e2e.get("sbatch_jobs"), "array_tasks": len(e2e.get("array_tasks") or []),
              "remote_rules": e2e.get("remote_rules"), "local_rules": e2e.get("local_rules"),
              "states": sorted(set((e2e.get("slurm_states") or {}).values()))},
    "docker": {"sandbox_containers_started": len(containers), "images": images, "episodes_by_sandbox": backends},
    "teacher": {"requests": len(requests), "fields": sorted({f for r in requests for f in r["fields"]}),
                "reasoning_efforts": efforts, "refused": len(refused), "reasoning_tokens": reasoning_billed},
    "funnel": {name: {k: stages[name].get(k) for k in ("planned", "done", "ok", "skipped", "discarded", "failed")}
               for name in stages},
    "ledger": {"reasoning_tokens": ledger_reasoning,
               "cost_usd": round(sum((s.get("usage") or {}).get("cost_usd", 0.0) for s in stages.values()), 6),
               "requests_sent": funnel.get("llm", {}).get("requests_sent")},
    "aup_csv": aup.read_text() if aup.exists() else None,
}
(work / "rehearsal-summary.json").write_text(json.dumps(summary, indent=2) + "\n")
if problems:
    print("rehearsal: FAILED:\n  - " + "\n  - ".join(problems), file=sys.stderr)
    sys.exit(1)
print(f"rehearsal: OK in {total_s} s (snakemake {e2e.get('snakemake_s')} s): {e2e.get('sbatch_jobs')} sbatch jobs + "
      f"{len(e2e.get('array_tasks') or [])} array tasks through SLURM; {len(containers)} docker sandboxes; "
      f"{len(requests)} teacher requests, {reasoning_billed} reasoning tokens; funnel {', '.join(expected)}",
      file=sys.stderr)
PYEOF
check_rc=$?
set -e
say "workdir $WORK (summary: $WORK/rehearsal-summary.json)"
exit $check_rc
