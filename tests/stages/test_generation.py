"""Stage 3.3, rules task_configs and starter_code: drafts, repairs and determinism."""

from stage_fixtures import make_cfg

from gymforge.llm.codeblocks import parse_files


def test_generation_repairs_invalid_drafts_and_is_deterministic(proposals, tmp_path):
    from gymforge.stages.generation import task_configs, starter_code

    src, records = proposals
    kept = [r for r in records if r.status == "ok"]
    outcomes = []
    for r in kept:
        cfg = make_cfg(tmp_path / "a")
        configs = task_configs(cfg, r.item, src / f"{r.item}.json", tmp_path / "a" / f"{r.item}.configs.json")
        code = starter_code(cfg, r.item, src / f"{r.item}.json", tmp_path / "a" / f"{r.item}.configs.json",
                                  tmp_path / "a" / r.item / "status.json", tmp_path / "a" / r.item / "mlgym")
        outcomes.append((r, configs, code))
    repaired = [c for _, c, _ in outcomes if c.status == "ok" and len(c.attempts) > 1]
    repaired += [k for _, _, k in outcomes if k.status == "ok" and len(k.attempts) > 1]
    assert repaired, "no first draft needed a repair"
    for draft in repaired:
        assert draft.attempts[0].errors and not draft.attempts[-1].errors
    done = [k for _, _, k in outcomes if k.status == "ok"]
    assert len(done) >= len(kept) // 2
    for k in done:
        assert (tmp_path / "a" / k.item / "mlgym" / "configs" / "tasks" / f"{k.task_id}.yaml").exists()

    # A fresh cache and the same seed give byte-identical configs.
    r, first, _ = outcomes[0]
    again = task_configs(make_cfg(tmp_path / "b"), r.item, src / f"{r.item}.json", tmp_path / "b" / "c.json")
    assert again.files == first.files


class _Teacher:
    """A teacher that answers every request with one fixed reply, and keeps the requests it got."""

    def __init__(self, reply: str):
        from gymforge.llm.client import Usage

        self.reply, self.requests, self.usage = reply, [], Usage()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def chat(self, messages, seed=None):
        from gymforge.llm.client import ChatResult

        self.requests.append([dict(m) for m in messages])
        return ChatResult(content=self.reply, finish_reason="stop", prompt_tokens=1, completion_tokens=1, cost_usd=0.0,
                          model="fixed")


def _penguin_proposal():
    from gymforge.core.records import ProposalRecord, TaskProposal

    return ProposalRecord(item="t0000", status="ok", proposal=TaskProposal(
        topic="penguins", metric="accuracy", description="Classify penguin species."),
        dataset={"id": "penguins", "is_local": True, "features": {"species": "string", "island": "string"}})


def _draft_configs_from(monkeypatch, tmp_path, reply: str):
    from gymforge.stages import generation

    teacher = _Teacher(reply)
    monkeypatch.setattr(generation, "make_client", lambda cfg, stage: teacher)
    cfg = make_cfg(tmp_path)
    return generation.draft_configs(cfg, "t0000", _penguin_proposal()), teacher, cfg


def test_teacher_draft_claiming_lm_submission_is_discarded_with_the_reason(monkeypatch, tmp_path):
    """A teacher that keeps naming LMSubmissionTasks (its scorer runs on the agent's whole workspace beside the
    answers; only suites gymforge did not generate use it) is sent the rule on each repair and, at the last attempt,
    its slot is discarded in the funnel with that reason; no starter code is drafted from such configs."""
    from test_task_files import CONFIG_ANSWER

    from gymforge.stages.generation import draft_code

    lm = CONFIG_ANSWER.replace("task_entrypoint: CSVSubmissionTasks", "task_entrypoint: LMSubmissionTasks")
    record, teacher, cfg = _draft_configs_from(monkeypatch, tmp_path, lm)
    rule = "a generated task's task_entrypoint must be one of CSVSubmissionTasks, ModelSubmissionTasks, " \
           "PythonSubmissionTasks, not 'LMSubmissionTasks'"
    assert (record.status, record.reason_code) == ("discarded", "invalid_config")
    assert rule in record.reason and not record.files
    assert len(record.attempts) == len(teacher.requests) == cfg.generation.max_attempts
    assert all(any(rule in e for e in a.errors) for a in record.attempts)
    assert rule in teacher.requests[-1][-1]["content"]  # the repair request names the rule

    # Configs recorded before the rule (an older run's record) get no starter code and keep the reason.
    stale = record.model_copy(update={"status": "ok", "reason_code": None, "reason": None,
                                      "files": parse_files(lm), "entrypoint": "LMSubmissionTasks"})
    code = draft_code(cfg, "t0000", stale, _penguin_proposal())
    assert (code.status, code.reason_code, code.entrypoint) == ("discarded", "invalid_config", "LMSubmissionTasks")
    assert rule in code.reason and len(teacher.requests) == cfg.generation.max_attempts  # the teacher was not asked


def test_teacher_draft_with_an_allowed_entrypoint_passes_at_once(monkeypatch, tmp_path):
    from test_task_files import CONFIG_ANSWER

    record, teacher, _ = _draft_configs_from(monkeypatch, tmp_path, CONFIG_ANSWER)
    assert (record.status, record.entrypoint, record.task_id) == ("ok", "CSVSubmissionTasks", "penguinSpecies")
    assert len(record.attempts) == len(teacher.requests) == 1 and not record.attempts[0].errors
    assert "one of CSVSubmissionTasks, ModelSubmissionTasks, PythonSubmissionTasks." in teacher.requests[0][-1]["content"]
