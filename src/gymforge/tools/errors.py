"""Errors whose message says it all: the `gymforge` command prints `gymforge: <message>`, without a traceback."""

from gymforge.agent.sources import TrajectoryImportError
from gymforge.benchmark.suite import BenchmarkError
from gymforge.llm.ledger import BudgetExceeded
from gymforge.sandbox import SandboxError
from gymforge.tasks.environment import BaselineFailed, InstallError, TaskUnsupported
from gymforge.tasks.mlgym import MLGymConfigError

PLAIN_ERRORS: tuple[type[BaseException], ...] = (
    BenchmarkError, BudgetExceeded, BaselineFailed, InstallError, TaskUnsupported, MLGymConfigError, SandboxError,
    TrajectoryImportError,
)
