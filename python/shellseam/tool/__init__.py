"""Model-facing tools: ``bash`` and the generic task tools, with their shared vocabulary.

This layer knows the executor seam and the task runtime below it, never a concrete
executor: any ``ShellExecutor`` can back ``BashTool``.
"""

from .approval import ApprovalDecision, ApprovalRequest, ApprovalService, SandboxModeStore
from .bash import BashTool
from .context import PromptSection, ToolContext, ToolResult
from .managed_env import ManagedEnvContributor, ManagedEnvRegistry
from .tasks import TaskKillTool, TaskListTool, TaskOutputTool, task_tools

__all__ = [
    "ApprovalDecision",
    "ApprovalRequest",
    "ApprovalService",
    "BashTool",
    "ManagedEnvContributor",
    "ManagedEnvRegistry",
    "PromptSection",
    "SandboxModeStore",
    "TaskKillTool",
    "TaskListTool",
    "TaskOutputTool",
    "ToolContext",
    "ToolResult",
    "task_tools",
]
