"""What the API app holds while it runs: one typed value (`ApiState`), built once by the app's lifespan
(crewwork/api/app.py) and read through typed dependencies (crewwork/api/deps.py), or `api_state(app)` where a
function is called by a front end mounted on the app (the MCP tools call the route functions themselves)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette

from crewwork.api.errors_intake import ErrorIntake
from crewwork.api.forge_intake import ForgeIntake
from crewwork.api.horizon import EventHorizon
from crewwork.api.ratelimit import ApiRateLimits
from crewwork.api.service import WorkItemService
from crewwork.config import Settings
from crewwork.config.api import ApiOptions
from crewwork.observability.metrics import StoreProjections
from crewwork.store.outbox import OutboxStore
from crewwork.store.store import Store
from crewwork.webhooks.deliver import OutboxDeliverer

STATE_KEY = "crewwork"
"""The one attribute of the app's `app.state` this value is kept under."""


@dataclass
class ApiState:
    """The running API's parts, each built once by the lifespan."""

    settings: Settings
    options: ApiOptions
    store: Store
    outbox: OutboxStore
    """The webhook outbox and registrations, on the store's database."""
    service: WorkItemService
    """The submission service; its Temporal client is connected in the background (None until then)."""
    rate_limits: ApiRateLimits
    horizon: EventHorizon
    """The safe event id the live streams read up to."""
    projections: StoreProjections
    projections_registry: CollectorRegistry
    """A registry of this app's own for the projections (several apps may share one process in tests)."""
    deliverer: OutboxDeliverer | None = None
    """The webhook deliverer, when this process delivers webhooks (`ApiOptions.webhook_delivery`)."""
    forge_intake: ForgeIntake | None = None
    """The forge intake, when this process runs it (`ApiOptions.forge_intake`)."""
    errors_intake: ErrorIntake | None = None
    """The error intake, when this process runs it (`ApiOptions.errors_intake`)."""


class NotRunning(RuntimeError):
    """The app's state was asked for before its lifespan started (or after it ended)."""


def api_state(app: Starlette) -> ApiState:
    """The state of a running app."""
    state = getattr(app.state, STATE_KEY, None)
    if not isinstance(state, ApiState):
        raise NotRunning("the API app is not running: its state is built when its lifespan starts")
    return state
