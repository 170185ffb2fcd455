"""attnkit: one attention API over several paths, and the suite that guards them."""

from attnkit import builtins as _builtins  # noqa: F401  (registers attnkit's own backends)
from attnkit import ops as _ops  # noqa: F401  (registers the attnkit:: torch.library ops)
from attnkit.api import attention, chosen_backend
from attnkit.boundaries import DispatchBoundary
from attnkit.errors import BackendUnavailableError, UnsupportedProblemError
from attnkit.inputs import AttentionProblem
from attnkit.kvcache import attention_with_kvcache
from attnkit.module import MultiHeadAttention
from attnkit.plugins import BackendEntryPointError, BackendEntryPointWarning
from attnkit.reference import reference_attention
from attnkit.registry import (
    Backend,
    available_backends,
    backend_names,
    register_backend,
    unavailable_reason,
    unregister_backend,
)

__version__ = "0.1.0"

__all__ = [
    "AttentionProblem",
    "Backend",
    "BackendEntryPointError",
    "BackendEntryPointWarning",
    "BackendUnavailableError",
    "DispatchBoundary",
    "MultiHeadAttention",
    "UnsupportedProblemError",
    "attention",
    "attention_with_kvcache",
    "available_backends",
    "backend_names",
    "chosen_backend",
    "reference_attention",
    "register_backend",
    "unavailable_reason",
    "unregister_backend",
]
