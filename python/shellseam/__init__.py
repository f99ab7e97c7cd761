"""shellseam: run shell commands for LLM agents — safely, boundedly, fast.

The public names of every layer: the seam vocabulary, the subprocess service, the local and
Landlock-sandboxed executors, the task runtime, the model-facing ``bash`` tool and its
rendering. See README.md for the two-minute tour.
"""

from .abort import AbortController, AbortSignal
from .errors import ShellError
from .executor import ShellExecutor
from .local import LocalShellExecutor
from .process import ShellProcess
from .render import parse_exit_status, render_markers, render_result
from .sandbox import SandboxShellExecutor, landlock_abi
from .service import SubprocessService, default_service
from .tasks import TaskInfo, TaskNotFound, TaskRead, TaskRuntime
from .tool import (
    ApprovalRequest,
    ApprovalService,
    BashTool,
    ManagedEnvContributor,
    ManagedEnvRegistry,
    PromptSection,
    SandboxModeStore,
    ToolContext,
    ToolResult,
    task_tools,
)
from .types import (
    CollectedOutput,
    ProcessStatus,
    SandboxEnforcement,
    SandboxMode,
    SandboxPolicy,
    ShellExecRequest,
    ShellExecSpec,
    ShellProcessRead,
    ShellRunResult,
    ShellSandboxInfo,
)

__version__ = "0.1.0"

__all__ = [
    "AbortController",
    "AbortSignal",
    "ApprovalRequest",
    "ApprovalService",
    "BashTool",
    "CollectedOutput",
    "LocalShellExecutor",
    "ManagedEnvContributor",
    "ManagedEnvRegistry",
    "ProcessStatus",
    "PromptSection",
    "SandboxEnforcement",
    "SandboxMode",
    "SandboxModeStore",
    "SandboxPolicy",
    "SandboxShellExecutor",
    "ShellError",
    "ShellExecRequest",
    "ShellExecSpec",
    "ShellExecutor",
    "ShellProcess",
    "ShellProcessRead",
    "ShellRunResult",
    "ShellSandboxInfo",
    "SubprocessService",
    "TaskInfo",
    "TaskNotFound",
    "TaskRead",
    "TaskRuntime",
    "ToolContext",
    "ToolResult",
    "__version__",
    "default_service",
    "landlock_abi",
    "parse_exit_status",
    "render_markers",
    "render_result",
    "task_tools",
]
