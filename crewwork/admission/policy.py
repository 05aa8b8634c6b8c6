"""Operator policy: what a tenant may ask for, checked at submission (a 422 naming the field), never later.

One `Policy` per submission, from the deployment's settings and the tenant's overrides
(`CREWWORK_TENANT_POLICIES`, keyed by tenant name or id). It answers with the first violation:

| field | rule | setting |
|---|---|---|
| `agent.name` | one of the allowed agents | CREWWORK_POLICY_AGENTS |
| `agent.config...` | no fault-injection keys of the scripted agent | CREWWORK_TEST_FAULTS |
| `sandbox.backend` | one of the allowed backends (`local` also needs CREWWORK_ALLOW_UNSAFE_SANDBOX) | CREWWORK_POLICY_SANDBOX_BACKENDS |
| `sandbox.memory_mb`, `cpus`, `pids`, `disk_mb` | at most the maxima | CREWWORK_SANDBOX_MAX_* |
| `validation.timeout_s`, each check's `timeout_s` | at most the longest run | CREWWORK_SANDBOX_MAX_TIMEOUT_S |
| `budget.*` | at most the ceilings | CREWWORK_MAX_*_CEILING |
| `review.timeout_s` | at most the ceiling | CREWWORK_MAX_REVIEW_TIMEOUT_S_CEILING |

Defaults a submission leaves to the operator are filled in first (`with_defaults`): `review.required` from
CREWWORK_REVIEW_REQUIRED_DEFAULT (true: code changes wait for a person).

The ceilings also apply where a submission set nothing: admission runs the item under `limits.effective_budget`.
"""

from __future__ import annotations

from dataclasses import dataclass

from crewwork.agents.scripted_config import fault_fields
from crewwork.config import Settings
from crewwork.config.tenant_policy import TenantPolicy
from crewwork.models import WorkItemKind, WorkItemSpec
from crewwork.models.limits import OperatorCeilings, ceiling_violations


class PolicyViolation(ValueError):
    """The submission asks for something the operator does not allow; `field` names it."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def _names(csv: str) -> list[str]:
    return [s.strip() for s in csv.split(",") if s.strip()]


@dataclass(frozen=True)
class Policy:
    settings: Settings
    tenant: TenantPolicy

    @classmethod
    def for_tenant(cls, settings: Settings, tenant_id: str | None, tenant_name: str | None = None) -> Policy:
        own = settings.tenant_setting(settings.tenant_policies, tenant_id, tenant_name)
        return cls(settings, own or TenantPolicy())

    # ------------------------------------------------------------------ the effective values

    def agents(self) -> set[str] | None:
        """Agent names allowed; None: every plugin the registry allows."""
        if self.tenant.agents is not None:
            return set(self.tenant.agents)
        if self.settings.policy_agents.strip() == "*":
            return None
        return set(_names(self.settings.policy_agents))

    def sandbox_backends(self) -> set[str]:
        allowed = set(
            self.tenant.sandbox_backends
            if self.tenant.sandbox_backends is not None
            else _names(self.settings.policy_sandbox_backends)
        )
        if not self.settings.allow_unsafe_sandbox:
            allowed.discard("local")
        return allowed

    def ceilings(self) -> OperatorCeilings:
        s, t = self.settings, self.tenant
        return OperatorCeilings(
            max_attempts=t.max_attempts or s.max_attempts_ceiling,
            max_wall_clock_s=t.max_wall_clock_s or s.max_wall_clock_s_ceiling,
            max_tokens=t.max_tokens or s.max_tokens_ceiling,
            max_cost_usd=t.max_cost_usd or s.max_cost_usd_ceiling,
        )

    def review_timeout_ceiling_s(self) -> float:
        return self.tenant.max_review_timeout_s or self.settings.max_review_timeout_s_ceiling

    def review_required_default(self) -> bool:
        if self.tenant.review_required_default is not None:
            return self.tenant.review_required_default
        return self.settings.review_required_default

    # ------------------------------------------------------------------ the operator's defaults

    def with_defaults(self, spec: WorkItemSpec) -> WorkItemSpec:
        """`spec` with what it left to the operator filled in, as it is stored, hashed and run: `review.required`
        (a code change waits for review unless the operator's default or the submission says otherwise; a task
        never does, nor does a pull request's review, which changes nothing)."""
        if spec.review.required is not None:
            return spec
        required = spec.kind not in (WorkItemKind.task, WorkItemKind.pr_review) and self.review_required_default()
        return spec.model_copy(update={"review": spec.review.model_copy(update={"required": required})})

    def sandbox_maxima(self) -> dict[str, float]:
        sb = self.settings.sandbox
        t = self.tenant
        return {
            "memory_mb": t.max_memory_mb or sb.max_memory_mb,
            "cpus": t.max_cpus or sb.max_cpus,
            "pids": t.max_pids or sb.max_pids,
            "disk_mb": t.max_disk_mb or sb.max_disk_mb,
            "timeout_s": t.max_timeout_s or sb.max_timeout_s,
        }

    # ------------------------------------------------------------------ the check

    def check(self, spec: WorkItemSpec) -> None:
        """Raise PolicyViolation for the first thing `spec` asks for that the operator does not allow."""
        self._check_agent(spec)
        self._check_sandbox(spec)
        for field, message in ceiling_violations(spec.budget, self.ceilings()):
            raise PolicyViolation(message, field)
        review = spec.review.timeout_s
        ceiling = self.review_timeout_ceiling_s()
        if review is not None and review > ceiling:
            raise PolicyViolation(
                f"review.timeout_s is {review:g} but this deployment allows at most {ceiling:g} "
                "(CREWWORK_MAX_REVIEW_TIMEOUT_S_CEILING)",
                "review.timeout_s",
            )

    def _check_agent(self, spec: WorkItemSpec) -> None:
        allowed = self.agents()
        name = spec.agent.name
        if allowed is not None and name not in allowed:
            shown = ", ".join(sorted(allowed)) or "none"
            raise PolicyViolation(
                f"agent {name!r} is not allowed here (allowed: {shown}; CREWWORK_POLICY_AGENTS)", "agent.name"
            )
        if name == "scripted" and not self.settings.test_faults:
            faults = fault_fields(spec.agent.config)
            if faults:
                raise PolicyViolation(
                    f"{faults[0]}: fault injection is for tests only; this deployment does not run with "
                    "CREWWORK_TEST_FAULTS",
                    faults[0],
                )

    def _check_sandbox(self, spec: WorkItemSpec) -> None:
        backend = spec.sandbox.backend
        if backend is not None:
            allowed = self.sandbox_backends()
            if backend not in allowed:
                why = (
                    " (`local` has no isolation; the operator has not allowed it)" if backend.lower() == "local" else ""
                )
                shown = ", ".join(sorted(allowed)) or "none"
                raise PolicyViolation(
                    f"sandbox.backend {backend!r} is not allowed here{why}; allowed: {shown} "
                    "(CREWWORK_POLICY_SANDBOX_BACKENDS)",
                    "sandbox.backend",
                )
        maxima = self.sandbox_maxima()
        asked: list[tuple[str, str, float | None]] = [
            ("sandbox.memory_mb", "memory_mb", spec.sandbox.memory_mb),
            ("sandbox.cpus", "cpus", spec.sandbox.cpus),
            ("sandbox.pids", "pids", spec.sandbox.pids),
            ("sandbox.disk_mb", "disk_mb", spec.sandbox.disk_mb),
            ("validation.timeout_s", "timeout_s", spec.validation.timeout_s if spec.validation else None),
        ]
        for i, check in enumerate(spec.validation.checks if spec.validation else []):
            asked.append((f"validation.checks[{i}].timeout_s", "timeout_s", check.timeout_s))
        for field, key, value in asked:
            if value is not None and value > maxima[key]:
                raise PolicyViolation(
                    f"{field} is {value:g} but this deployment allows at most {maxima[key]:g} "
                    f"(CREWWORK_SANDBOX_MAX_{key.upper()})",
                    field,
                )
