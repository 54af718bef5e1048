"""Which configuration decides the gate: the base revision's, in every mode (the Action, `kernalin-ci run`,
the daemon), so a pull request cannot lower its own gate (docs/security.md, "The base decides the gate").

- The policy (`gate:`), the kernels with their params, domain, dtype and sources, the pipelines and the
  model come from the configuration file as committed at the BASE revision (read from git, never from the
  working tree, which is the pull request's).
- A kernel that only the head's configuration lists (one the pull request adds) is gated too, with the
  base's policy.
- A kernel the head's configuration drops is still gated while its entry exists at head; one whose entry
  is gone too is reported as removed.
- How the head's configuration differs is reported change by change, each marked where it would loosen
  the gate; it takes effect after merge.
- The head's configuration decides only where the BASE's `gate.trust_head_config` names the head branch
  (globs) and the head comes from the same repository (never a fork), or where the base has no
  configuration at all (the pull request that introduces it).
- A configuration file outside the repository (`--config /etc/...`) is the operator's, used as it is.
"""

from __future__ import annotations

import fnmatch
import subprocess
from dataclasses import replace
from pathlib import Path

from kernalin_ci import config as config_mod
from kernalin_ci.config import Config, Gate, Kernel
from kernalin_ci.errors import UsageError
from kernalin_ci.trust import BASE, FILE, HEAD, ConfigChange, ConfigOrigin

CONFIG_MAX_BYTES = 1 << 20


def read_at(repo: Path, rev: str, rel: str) -> str | None:
    """The text of REL as committed at REV (a blob, no filters or text conversion applied); None where
    REV has no such file. A file larger than CONFIG_MAX_BYTES is a usage error."""
    size = subprocess.run(["git", "cat-file", "-s", f"{rev}:{rel}"], cwd=repo, capture_output=True, text=True)
    if size.returncode != 0:
        return None
    if int(size.stdout.strip() or 0) > CONFIG_MAX_BYTES:
        raise UsageError(f"{rev[:12]}:{rel}: larger than {CONFIG_MAX_BYTES} bytes: not a configuration")
    r = subprocess.run(["git", "cat-file", "blob", f"{rev}:{rel}"], cwd=repo, capture_output=True)
    if r.returncode != 0:
        return None
    try:
        return r.stdout.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{rev[:12]}:{rel}: not UTF-8 text") from None


def repo_path(repo: Path, config_arg: str | None) -> str | None:
    """The repository-relative path of the configuration (default .kernalin.yml); None for a file outside
    the repository (the operator's own)."""
    if not config_arg:
        return config_mod.DEFAULT_FILE
    p = Path(config_arg)
    p = p if p.is_absolute() else Path.cwd() / p
    try:
        return Path(_normalise(p)).relative_to(repo.resolve()).as_posix()
    except ValueError:
        return None


def _normalise(p: Path) -> str:
    """P without `..` and with its folder's links resolved (the file itself may not exist in the working tree)."""
    return str(p.parent.resolve() / p.name)


def gate_config(
    repo: Path,
    config_arg: str | None,
    base: str,
    head: str,
    *,
    head_branch: str | None = None,
    fork: bool = False,
) -> tuple[Config, ConfigOrigin, set[str]]:
    """The configuration that decides the gate between BASE and HEAD (commits of REPO), where it came
    from, and the names of its kernels that the head's configuration no longer lists (gated while their
    entry exists at head, else removed). HEAD_BRANCH/FORK: the head's branch and whether it comes from
    another repository (for `gate.trust_head_config`)."""
    rel = repo_path(repo, config_arg)
    if rel is None:  # the operator's file, outside the repository: nothing of the pull request's
        path = Path(config_arg).resolve()
        return config_mod.load(path), ConfigOrigin(FILE, str(path), why="a file outside the repository"), set()
    base_text, head_text = read_at(repo, base, rel), read_at(repo, head, rel)
    if base_text is None:
        if head_text is None:
            raise UsageError(
                f"{rel}: no configuration at base {base[:12]} or head {head[:12]} (write one with "
                f"`kernalin-ci init` and commit it)",
                setting="config",
            )
        cfg = config_mod.parse(head_text, f"{head[:12]}:{rel}")
        why = "the base has none: this pull request introduces it"
        return cfg, ConfigOrigin(HEAD, rel, head, why), set()
    base_cfg = config_mod.parse(base_text, f"{base[:12]}:{rel}")
    head_cfg, changes = None, []
    if head_text is None:
        changes.append(ConfigChange(f"{rel} removed", loosens=False))
    elif head_text != base_text:
        try:
            head_cfg = config_mod.parse(head_text, f"{head[:12]}:{rel}")
        except UsageError as e:
            changes.append(ConfigChange(f"the head's {rel} is not valid: {e}", loosens=False))
    if head_cfg is not None:
        changes += config_changes(base_cfg, head_cfg)
    trusted = _trusted(base_cfg.gate, head_branch, fork)
    if head_cfg is not None and trusted:
        why = f"head branch {head_branch!r} matches the base's gate.trust_head_config ({trusted})"
        return head_cfg, ConfigOrigin(HEAD, rel, head, why, changes), set()
    cfg = base_cfg
    added = [k for k in head_cfg.kernels if base_cfg.kernel(k.name) is None] if head_cfg is not None else []
    if added:  # gated with the base's policy: the kernels' own definitions are the head's
        cfg = replace(base_cfg, kernels=[*base_cfg.kernels, *added])
    why = "the base revision's: changes a pull request makes to it take effect after merge"
    listed = {k.name for k in head_cfg.kernels} if head_cfg is not None else None
    dropped = {k.name for k in base_cfg.kernels if listed is not None and k.name not in listed}
    if head_text is None:
        dropped = {k.name for k in base_cfg.kernels}
    return cfg, ConfigOrigin(BASE, rel, base, why, changes), dropped


def _trusted(gate: Gate, branch: str | None, fork: bool) -> str | None:
    """The glob of the base's gate.trust_head_config that BRANCH matches (never for a fork), else None."""
    if fork or not branch:
        return None
    return next((g for g in gate.trust_head_config if fnmatch.fnmatchcase(branch, g)), None)


def override_changes(gate: Gate, overrides: dict) -> list[ConfigChange]:
    """How command-line overrides of `gate:` (--fail-on, --budget-s) differ from GATE."""
    return [replace(c, by="command line") for c in _gate_changes(gate, replace(gate, **overrides))]


def config_changes(base: Config, head: Config) -> list[ConfigChange]:
    """What HEAD changes relative to BASE, each marked where it lets more through than BASE would."""
    out = _gate_changes(base.gate, head.gate)
    for k in base.kernels:
        h = head.kernel(k.name)
        if h is None:
            out.append(ConfigChange(f"kernel {k.name} removed from the configuration", loosens=True))
        else:
            out += _kernel_changes(k, h)
    out += [ConfigChange(f"kernel {k.name} added", loosens=False) for k in head.kernels if base.kernel(k.name) is None]
    head_pipes = {p.name: p for p in head.pipelines}
    for p in base.pipelines:
        h = head_pipes.get(p.name)
        if h is None:
            out.append(ConfigChange(f"pipeline {p.name} removed", loosens=True))
        elif h != p:
            fewer = h.steps < p.steps
            out.append(ConfigChange(f"pipeline {p.name} changed" + (f" (steps {p.steps} -> {h.steps})" * fewer), fewer))
    base_pipes = {p.name for p in base.pipelines}
    out += [ConfigChange(f"pipeline {p.name} added", loosens=False) for p in head.pipelines if p.name not in base_pipes]
    if (base.model is None) != (head.model is None) or (base.model and head.model and base.model != head.model):
        out.append(ConfigChange("model: changed (reported, never gating)", loosens=False))
    return out


def _gate_changes(base: Gate, head: Gate) -> list[ConfigChange]:
    out = []
    dropped = [x for x in base.fail_on if x not in head.fail_on]
    added = [x for x in head.fail_on if x not in base.fail_on]
    if dropped or added:
        parts = ([f"drops {', '.join(dropped)}"] if dropped else []) + ([f"adds {', '.join(added)}"] if added else [])
        out.append(ConfigChange(f"gate.fail_on: {'; '.join(parts)}", loosens=bool(dropped)))
    if head.rope != base.rope:
        out.append(ConfigChange(f"gate.margin: {base.rope:g} -> {head.rope:g}", loosens=head.rope > base.rope))
    if head.budget_s != base.budget_s:
        out.append(
            ConfigChange(
                f"gate.budget_s: {base.budget_s:g} -> {head.budget_s:g}", loosens=head.budget_s < base.budget_s
            )
        )
    if head.bench != base.bench:
        out.append(ConfigChange(f"gate.bench: {base.bench} -> {head.bench}", loosens=not head.bench))
    more = [g for g in head.trust_head_config if g not in base.trust_head_config]
    if more or len(head.trust_head_config) != len(base.trust_head_config):
        out.append(
            ConfigChange(
                f"gate.trust_head_config: {list(base.trust_head_config)} -> {list(head.trust_head_config)}",
                loosens=bool(more),
            )
        )
    return out


def _kernel_changes(base: Kernel, head: Kernel) -> list[ConfigChange]:
    out = []
    for name in ("entry", "op", "params", "domain", "dtype", "sources", "timeout", "bench", "tune", "cuda"):
        a, b = getattr(base, name), getattr(head, name)
        if a == b:
            continue
        loosens = _kernel_field_loosens(name, a, b)
        out.append(ConfigChange(f"kernel {base.name}: {name} {_short(a)} -> {_short(b)}", loosens))
    return out


def _kernel_field_loosens(name: str, a, b) -> bool:
    """Whether a kernel's field going from A (the base's) to B lets more through."""
    if name == "domain":
        return _narrows(a, b)
    if name == "dtype":  # every case in one dtype instead of the sweep
        return a is None and b is not None
    if name == "sources":
        return not set(a) <= set(b)
    if name == "cuda":  # fewer CUDA sources (or none): a change to the dropped ones no longer selects the kernel
        return b is None or (a is not None and not set(a.sources) <= set(b.sources))
    if name in ("params", "op"):  # another op variant: what is checked changes
        return True
    if name == "timeout":
        return b is not None and (a is None or b > a)
    return False


def _narrows(base: dict, head: dict) -> bool:
    """Whether HEAD's domain declares fewer shapes on some axis than BASE's (or declares an axis BASE left
    open: found by default)."""
    for axis, values in head.items():
        want = set(map(str, values if isinstance(values, list) else [values]))
        have = base.get(axis)
        if have is None or not set(map(str, have if isinstance(have, list) else [have])) <= want:
            return True
    return False


def _short(v) -> str:
    s = str(v)
    return s if len(s) <= 60 else s[:57] + "..."
