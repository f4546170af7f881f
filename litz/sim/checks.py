"""Where the simulated app's checks report. A module of its own: the app's module travels by value in
checkpoints (cloudpickle), this one by reference, so a restored driver still reports here."""
from __future__ import annotations

VIOLATIONS: list[str] = []


def violation(text: str) -> None:
    VIOLATIONS.append(text)


def take() -> list[str]:
    found = list(VIOLATIONS)
    VIOLATIONS.clear()
    return found
