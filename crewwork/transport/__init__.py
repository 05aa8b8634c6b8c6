"""Model transport: a provider-neutral OpenAI-compatible chat-completions client.

`TransportConfig` (named endpoints + routes by workload) configures a `ModelClient`; failures are raised as
`ProviderUnavailable` (retryable, an `AgentInfraError`) or `ProviderRejected` (non-retryable, an
`AgentError`).
"""

from crewwork.boundary.masking import Redactor, redact
from crewwork.transport.client import ChatResult, ModelClient, Usage
from crewwork.transport.config import (
    ENV_ENDPOINTS,
    EndpointConfig,
    TransportConfig,
    TransportSettingsError,
    merge_configs,
    operator_config,
    parse_transport_config,
)
from crewwork.transport.errors import ProviderRejected, ProviderUnavailable, parse_retry_after

__all__ = [
    "ENV_ENDPOINTS",
    "ChatResult",
    "EndpointConfig",
    "ModelClient",
    "ProviderRejected",
    "ProviderUnavailable",
    "Redactor",
    "TransportConfig",
    "TransportSettingsError",
    "Usage",
    "merge_configs",
    "operator_config",
    "parse_retry_after",
    "parse_transport_config",
    "redact",
]
