"""What a task's evaluation raises to the agent loop (`TaskEvaluator.evaluate`; `gymforge.tasks.scoring` raises
them, the loop shows them to the model)."""


class SubmissionNotFound(Exception):
    """The submission artefact the task asks for does not exist (yet)."""


class EvaluationFormatError(Exception):
    """The evaluation ran but its output could not be read as metrics."""
