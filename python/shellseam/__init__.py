"""shellseam: run shell commands for LLM agents — safely, boundedly, fast.

The public names of every layer: the seam vocabulary, the subprocess service, the local and
Landlock-sandboxed executors, the task runtime, the model-facing ``bash`` tool and its
rendering. See README.md for the two-minute tour.
"""

from importlib import metadata as _metadata

from .abort import AbortController, AbortSignal
from .errors import ShellError
from .executor import ShellExecutor
from .limits import containment_facts
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
    ResourceLimits,
    SandboxEnforcement,
    SandboxMode,
    SandboxPolicy,
    ShellExecRequest,
    ShellExecSpec,
    ShellProcessRead,
    ShellResources,
    ShellRunResult,
    ShellSandboxInfo,
)

try:
    # Single-sourced: Cargo.toml's version, copied into the installed metadata by maturin.
    __version__: str = _metadata.version("shellseam")
except _metadata.PackageNotFoundError:  # pragma: no cover - only a bare source tree
    __version__ = "0+unknown"

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
    "ResourceLimits",
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
    "ShellResources",
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
    "containment_facts",
    "default_service",
    "landlock_abi",
    "parse_exit_status",
    "render_markers",
    "render_result",
    "task_tools",
]
