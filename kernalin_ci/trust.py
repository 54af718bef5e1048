"""What a report says about trust: where the gate's configuration came from, how the configuration of
the pull request differs from it, and the isolation the kernel code ran under (docs/security.md).

Plain data, no kernalin_ci imports: the gate fills these in (gate/config_source.py, sandbox/isolation.py), the
Report carries them (report/model.py) and the renderers word them (report/text.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields


def _known(cls, d: dict) -> dict:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}


@dataclass(frozen=True)
class ConfigChange:
    """One difference between the configuration that decides the gate and another one (the pull
    request's own, or the command line's overrides)."""

    what: str  # one line: "gate.fail_on: drops slower"
    loosens: bool  # whether it would let more through than the deciding configuration
    by: str = "head"  # "head" (the pull request's .kernalin.yml) | "command line" (--fail-on, --budget-s)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> ConfigChange:
        return cls(**_known(cls, d))


# ConfigOrigin.source
BASE, HEAD, FILE = "base", "head", "file"


@dataclass
class ConfigOrigin:
    """Where the configuration that decided the gate came from."""

    source: str  # BASE | HEAD | FILE (an operator's file outside the repository)
    path: str  # repository-relative path, or the file's own path
    revision: str | None = None  # the commit it was read at (None for FILE)
    why: str = ""  # one line: why this one
    changes: list[ConfigChange] = field(default_factory=list)  # how the head (or the command line) differs

    @property
    def loosened(self) -> list[ConfigChange]:
        return [c for c in self.changes if c.loosens]

    def to_json(self) -> dict:
        return {**asdict(self), "changes": [c.to_json() for c in self.changes]}

    @classmethod
    def from_json(cls, d: dict) -> ConfigOrigin:
        d = _known(cls, d)
        d["changes"] = [ConfigChange.from_json(c) for c in d.get("changes") or [] if isinstance(c, dict)]
        return cls(**d)


# Isolation.mode
BUBBLEWRAP, UID, NONE = "bubblewrap", "uid", "none"


@dataclass(frozen=True)
class Isolation:
    """The isolation kernel code (a pull request's) ran under in this process's kernel workers."""

    mode: str  # BUBBLEWRAP | UID (an unprivileged uid, no namespaces) | NONE
    uid: int | None = None  # the uid kernel code ran as
    network: bool = True  # whether kernel code could reach a network
    why: str = ""  # how it was chosen: "KERNALIN_SANDBOX=off", "bubblewrap is not installed", ...

    @property
    def sandboxed(self) -> bool:
        return self.mode == BUBBLEWRAP

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Isolation:
        return cls(**_known(cls, d))
