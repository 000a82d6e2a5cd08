"""A check's result: its status, what it found, what to do; and ``fleet doctor``'s exit code."""

from __future__ import annotations

from dataclasses import asdict, dataclass

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        status = self.status.upper() if self.status in (WARN, FAIL) else self.status
        fix = f"; fix: {self.fix}" if self.fix and self.status in (WARN, FAIL) else ""
        return f"{status:<4}  {self.name:<15}  {self.detail}{fix}"

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def exit_code(checks: list[Check]) -> int:
    """1 when any check failed, else 0 (warnings do not fail)."""
    return 1 if any(c.status == FAIL for c in checks) else 0
