"""Connecting to Temporal with crewwork's data converter (pydantic models in and out) and TLS/API-key options."""

from __future__ import annotations

from temporalio.client import Client, TLSConfig
from temporalio.contrib.pydantic import pydantic_data_converter

from crewwork.config import Settings
from crewwork.observability import tracing


async def connect(settings: Settings) -> Client:
    tls: TLSConfig | bool = False
    if settings.temporal_tls or settings.temporal_tls_cert_path:
        tls = TLSConfig(
            server_root_ca_cert=settings.temporal_tls_ca_path.read_bytes() if settings.temporal_tls_ca_path else None,
            client_cert=settings.temporal_tls_cert_path.read_bytes() if settings.temporal_tls_cert_path else None,
            client_private_key=(
                settings.temporal_tls_key_path.read_bytes() if settings.temporal_tls_key_path else None
            ),
        )
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        data_converter=pydantic_data_converter,
        tls=tls,
        api_key=settings.temporal_api_key,
        # Tracing (when on): workers built from this client inherit the interceptor.
        interceptors=tracing.client_interceptors(),
    )
