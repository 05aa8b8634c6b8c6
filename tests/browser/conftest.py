"""The browser tests drive the same real stack as the API tests."""

from tests.api.conftest import api_crew, api_settings, shared_api, stack  # noqa: F401 (fixtures)
