"""Connecting to Temporal with crewwork's data converter (pydantic models in and out) and TLS/API-key options."""

from __future__ import annotations

from typing import ClassVar

from temporalio.client import Client, TLSConfig
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.converter import DataConverter

from crewwork.config import Settings
from crewwork.observability import tracing


class SharedPydanticPayloadConverter(PydanticPayloadConverter):
    """temporalio's pydantic payload converter, whose encoding converters are built once per process.

    The SDK constructs its data converter's payload converter class anew for every workflow activation
    (`_CommandAwareDataConverter.create` -> `DataConverter.__post_init__`), for every workflow instance and for every
    context it clones: each construction built the pydantic JSON converter and its type-adapter cache only to throw
    them away, ~6% of a control pool's Python under load (bench/trace.py --profile control-0 --profile-gil). Every
    instance here takes the first one's encoding converters instead: they hold no state but the pydantic JSON
    converter's cache of type adapters, which the SDK's own per-context copies of one converter share already. The
    bytes on the wire are the same (tests/unit/test_data_converter.py)."""

    _first: ClassVar[PydanticPayloadConverter | None] = None

    def __init__(self) -> None:
        first = SharedPydanticPayloadConverter._first
        if first is None:
            super().__init__()
            SharedPydanticPayloadConverter._first = self
        else:
            self.converters = first.converters


DATA_CONVERTER = DataConverter(payload_converter_class=SharedPydanticPayloadConverter)
"""crewwork's data converter: pydantic models in and out (temporalio.contrib.pydantic), converters built once."""


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
        data_converter=DATA_CONVERTER,
        tls=tls,
        api_key=settings.temporal_api_key,
        # Tracing (when on): workers built from this client inherit the interceptor.
        interceptors=tracing.client_interceptors(),
    )
