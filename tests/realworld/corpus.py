"""The real-world corpus: public production Triton kernels, fetched at test time, behind our own adapters.

`manifest.json` names each kernel (distribution, sha256, the files it needs, license, op, params, adapter)
and one single-bug mutant (one line's find/replace; `occurrence` picks one where the line recurs).
Nothing of the kernels' code lives in this repository: `fetch()` downloads
each distribution with `pip download --no-deps` into `.cache/realworld/` (git-ignored), checks its
sha256 and extracts the named members. `mutant_tree()` copies a kernel's extracted files and applies its
mutant (one find/replace) into `mutants/<kernel>/src/`, beside a copy of the adapters: an adapter loads
the production modules from the `src/` beside its own folder when there is one, else from the extracted
originals, so the same adapter code runs an original or its mutant. `verify()` runs `kernalin-ci verify` on
one variant and returns what it found.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
MANIFEST = HERE / "manifest.json"
CACHE = Path(os.environ.get("KERNALIN_REALWORLD_CACHE") or REPO / ".cache" / "realworld")


@dataclass(frozen=True)
class Dist:
    key: str  # "package-version": the folder its members are extracted into
    package: str
    version: str
    filename: str  # the distribution file pip downloads
    sha256: str
    license: str


@dataclass(frozen=True)
class Mutant:
    file: str  # member path inside the distribution
    find: str  # occurs exactly once in that file
    replace: str
    bug_class: str  # the finding class kernalin-ci must report
    models: str  # the real bug it is modelled on
    occurrence: int = 0  # 0: `find` occurs exactly once; n: replace its n-th occurrence (the line recurs)


@dataclass(frozen=True)
class Kernel:
    id: str
    dist: Dist
    files: tuple[str, ...]  # members the adapter loads
    op: str
    params: dict
    adapter: str  # entry, relative to the repository root
    description: str
    mutant: Mutant
    # findings on the original from a known cause that is not the kernel's fault: [{"cause", match keys}]
    known_false: tuple[dict, ...] = ()
    true_findings: tuple[dict, ...] = ()  # a real bug of the public kernel: [{"why", match keys}], each seen
    needs_triton_below: str | None = None  # the kernel uses a construct later Triton versions removed
    notes: str = ""
    # a CUDA C++ kernel: {"sources": [our launcher .cu], "include": its headers' folder inside the distribution,
    # "vendored_include": [folders of the distribution extracted whole and searched before the toolkit's headers:
    # the CCCL a project ships and builds with], "flags": [...]}; verified with --cuda-source / --cuda-flag
    # (docs/cuda.md); device "cuda": runs on a GPU only
    cuda: dict | None = None
    domain: dict = field(default_factory=dict)  # --domain KEY=V,... (the shapes the launcher was built for)
    device: str | None = None


MATCH_KEYS = ("bug_class", "kind", "dtype", "case")  # a rule's "device" (cpu | cuda) limits where it applies


def matches(finding: dict, rule: dict) -> bool:
    """Whether a finding (verify --json) matches a manifest rule's keys: bug_class, kind, dtype, case name
    (a rule's value may be a list of accepted values)."""
    case = finding.get("case") or {}
    have = {
        "bug_class": finding.get("bug_class"),
        "kind": finding.get("kind"),
        "dtype": case.get("dtype"),
        "case": case.get("name"),
    }
    return all(
        have[key] in (rule[key] if isinstance(rule[key], list) else [rule[key]]) for key in MATCH_KEYS if key in rule
    )


def triton_too_new(k: Kernel) -> bool:
    if not k.needs_triton_below:
        return False
    from importlib.metadata import version

    def parse(v):
        return tuple(int(x) for x in re.findall(r"\d+", v)[:2])

    return parse(version("triton")) >= parse(k.needs_triton_below)


def load_manifest(path: Path = MANIFEST) -> list[Kernel]:
    data = json.loads(path.read_text())
    dists = {k: Dist(key=k, **v) for k, v in data["distributions"].items()}
    kernels = []
    for kid, k in data["kernels"].items():
        k = dict(k)
        kernels.append(
            Kernel(
                id=kid,
                dist=dists[k.pop("dist")],
                files=tuple(k.pop("files")),
                mutant=Mutant(**k.pop("mutant")),
                known_false=tuple(k.pop("known_false", ())),
                true_findings=tuple(k.pop("true_findings", ())),
                **k,
            )
        )
    return kernels


def ci_subset(path: Path = MANIFEST) -> list[str]:
    """The kernel ids tests/test_realworld.py runs by default (the manifest's `ci`)."""
    return list(json.loads(path.read_text()).get("ci", []))


def bug_classes() -> set[str]:
    from kernalin_ci.findings import BUG_CLASSES

    return set(BUG_CLASSES)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def download(dist: Dist, cache: Path = CACHE) -> Path:
    """The distribution file, downloaded once with pip and checked against its sha256."""
    target = cache / "dist" / dist.filename
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        kind = "--no-binary" if dist.filename.endswith((".tar.gz", ".zip")) else "--only-binary"
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            kind,
            ":all:",
            "--dest",
            str(target.parent),
            f"{dist.package}=={dist.version}",
        ]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0 or not target.is_file():
            raise RuntimeError(
                f"pip download {dist.package}=={dist.version} failed: "
                f"{(r.stderr or r.stdout).strip().splitlines()[-1:]}"
            )
    got = sha256(target)
    if got != dist.sha256:
        raise RuntimeError(f"{target}: sha256 {got}, manifest says {dist.sha256}")
    return target


def extract(dist: Dist, members: set[str], cache: Path = CACHE) -> Path:
    """Extract the named members of the distribution into cache/src/<package-version>/ (nothing is
    downloaded when they are all there: a machine without the network needs only src/ and mutants/)."""
    root = cache / "src" / dist.key
    missing = [m for m in sorted(members) if not (root / m).is_file()]
    if not missing:
        return root
    archive = download(dist, cache)
    if archive.name.endswith(".tar.gz"):
        with tarfile.open(archive) as tf:
            prefix = tf.getnames()[0].split("/")[0] + "/"
            for m in missing:
                f = tf.extractfile(prefix + m)
                _write(root / m, f.read())
    else:
        with zipfile.ZipFile(archive) as zf:
            for m in missing:
                _write(root / m, zf.read(m))
    return root


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def extract_tree(dist: Dist, folder: str, cache: Path = CACHE) -> Path:
    """Extract every member of the distribution below FOLDER (a wheel's vendored headers: more files than a
    manifest lists one by one) into cache/src/<package-version>/FOLDER; a marker file says it is complete, so a
    machine without the network needs only src/."""
    root = cache / "src" / dist.key
    done = root / folder / ".extracted"
    if done.is_file():
        return root / folder
    archive = download(dist, cache)
    if not archive.name.endswith(".whl"):
        raise RuntimeError(f"{dist.key}: vendored folders are read from wheels only")
    prefix = folder.rstrip("/") + "/"
    with zipfile.ZipFile(archive) as zf:
        names = [n for n in zf.namelist() if n.startswith(prefix) and not n.endswith("/")]
        if not names:
            raise RuntimeError(f"{dist.key}: no member below {folder}")
        for n in names:
            _write(root / n, zf.read(n))
    done.write_text(f"{len(names)} files\n")
    return root / folder


def vendored_includes(k: Kernel, cache: Path = CACHE) -> list[Path]:
    """The folders a CUDA kernel's headers are searched in before the toolkit's (always the originals': a mutant
    changes none of them)."""
    return [cache / "src" / k.dist.key / f for f in (k.cuda or {}).get("vendored_include", [])]


def fetch(kernels: list[Kernel], cache: Path = CACHE) -> None:
    by_dist: dict[str, tuple[Dist, set[str]]] = {}
    for k in kernels:
        by_dist.setdefault(k.dist.key, (k.dist, set()))[1].update(k.files)
    for dist, members in by_dist.values():
        extract(dist, members, cache)
    for k in kernels:
        for folder in (k.cuda or {}).get("vendored_include", []):
            extract_tree(k.dist, folder, cache)


def mutant_tree(k: Kernel, cache: Path = CACHE) -> Path:
    """mutants/<kernel>/: src/ holding the kernel's files with its mutant applied, and adapters/, a copy
    of the adapters (they load from the src/ beside them). Returns that folder."""
    src = cache / "src" / k.dist.key
    root = cache / "mutants" / k.id
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(HERE / "adapters", root / "adapters", ignore=shutil.ignore_patterns("__pycache__"))
    dst = root / "src" / k.dist.key
    for m in k.files:
        _write(dst / m, (src / m).read_bytes())
    text = (src / k.mutant.file).read_text()
    n, nth = text.count(k.mutant.find), k.mutant.occurrence
    if (nth == 0 and n != 1) or n < nth:
        want = "once" if nth == 0 else f"at least {nth} times"
        raise RuntimeError(f"{k.id}: mutant text occurs {n} times in {k.mutant.file} (must be {want})")
    at = -1
    for _ in range(max(nth, 1)):
        at = text.index(k.mutant.find, at + 1)
    (dst / k.mutant.file).write_text(text[:at] + k.mutant.replace + text[at + len(k.mutant.find) :])
    return root


@dataclass
class Outcome:
    """What `kernalin-ci verify` said about one variant (original or mutant) of one kernel."""

    kernel: str
    variant: str  # "original" | "mutant"
    exit_code: int
    classes: list[str]  # bug classes of the findings, in order, without repeats
    findings: list[dict] = field(default_factory=list)
    structural: str = ""  # "ran" or why it did not
    seconds: float = 0.0
    error: str = ""
    device: str = "cpu"
    not_checked: list[str] = field(default_factory=list)  # cases kernalin-ci reported as not checked, and why
    proved: list[str] = field(default_factory=list)  # structural properties proved (issue 30, item 4)
    gaps: list[str] = field(default_factory=list)  # structural properties not verified, with why
    notices: list[dict] = field(default_factory=list)  # kernalin-ci's notices (the PTX engine's "not proved")


def verify(
    k: Kernel,
    variant: str,
    device: str = "cpu",
    extra: tuple[str, ...] = (),
    cache: Path = CACHE,
    timeout: float = 1800,
) -> Outcome:
    """Run `kernalin-ci verify` on the original or the mutant of one kernel; parse its JSON."""
    entry = k.adapter
    tree = cache / "src"
    if variant == "mutant":  # each mutant's bug shows in float32; the dtype sweep would only add time
        root = mutant_tree(k, cache)
        entry = str(root / "adapters" / Path(k.adapter).name)
        tree = root / "src"
        extra = ("--dtype", (k.domain.get("dtype") or "float32"), *extra)
    extra = (*extra, *cuda_args(k, tree, (REPO / entry.rpartition(":")[0]).parent, cache))
    for key, value in k.domain.items():
        if variant != "mutant" or key != "dtype":
            extra = (*extra, "--domain", f"{key}={','.join(map(str, value)) if isinstance(value, list) else value}")
    cmd = [
        sys.executable,
        "-m",
        "kernalin_ci",
        "verify",
        "--op",
        k.op,
        "--entry",
        entry,
        "--device",
        device,
        "--json",
        "-",
        "--quiet",
        *extra,
    ]
    for name, value in k.params.items():
        cmd += ["--param", f"{name}={value}"]
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    seconds = time.monotonic() - t0
    try:
        res = json.loads(r.stdout)
    except json.JSONDecodeError:
        return Outcome(
            k.id,
            variant,
            r.returncode,
            [],
            structural="not run",
            seconds=seconds,
            error=(r.stderr.strip().splitlines() or ["no output"])[-1],
            device=device,
        )
    findings = res.get("findings", [])
    classes: list[str] = []
    for f in findings:
        if f.get("bug_class") not in classes:
            classes.append(f.get("bug_class"))
    not_checked = [
        f"{n.get('shape')}: {n.get('reason')} ({n.get('error', '')[:120]})" for n in res.get("not_checked", [])
    ]
    st = res.get("structural") if isinstance(res.get("structural"), dict) else {}
    return Outcome(
        k.id,
        variant,
        r.returncode,
        classes,
        findings,
        structural_status(res),
        seconds,
        device=device,
        not_checked=not_checked,
        proved=list(st.get("proved") or []),
        gaps=list(st.get("gaps") or []),
        notices=list(res.get("notices") or []),
    )


def cuda_args(k: Kernel, tree: Path, adapters: Path, cache: Path = CACHE) -> tuple[str, ...]:
    """--cuda-source/--cuda-flag of a CUDA kernel: our launchers (the copies beside the adapter that runs), the
    vendored headers first (the CCCL the project builds with, ahead of the toolkit's), then the headers of the
    tree it runs against (the originals, or the mutant's)."""
    if not k.cuda:
        return ()
    out: tuple[str, ...] = ()
    for src in k.cuda["sources"]:  # relative to the repository, where verify runs (the cache lives inside it)
        out += ("--cuda-source", os.path.relpath(adapters / Path(src).name, REPO))
    include = os.path.relpath(tree / k.dist.key / k.cuda["include"], REPO)
    vendored = [f"-I{os.path.relpath(p, REPO)}" for p in vendored_includes(k, cache)]
    for flag in [*k.cuda.get("flags", []), *vendored, f"-I{include}"]:
        out += (f"--cuda-flag={flag}",)
    return out


def structural_status(res: dict) -> str:
    """'ran' when the structural analysis ran on the captured launches, else why it did not (in part or whole).

    Reads a first-class status when the result carries one (a `structural` field), else the notices of the
    structural worker: capture, compile and interpret failures and "could not verify the whole entry".
    """
    v = res.get("structural")
    if isinstance(v, dict) and v.get("status"):
        return "ran" if v["status"] in ("ran", "analysed") else f"{v['status']}: {v.get('cause', '')}".strip()
    if isinstance(v, str):
        return "ran" if v in ("ran", "analysed") else v

    def check(n):
        return n.get("check", "").removeprefix("structural:")

    bad = [
        n
        for n in res.get("notices", [])
        if check(n) in ("capture", "compile", "interpret")
        or (check(n) == "structural" and "could not verify" in n.get("message", ""))
    ]
    return "ran" if not bad else "not analysed: " + "; ".join(f"{n['check']}: {n['message']}" for n in bad)[:300]


def expected_structural(k: Kernel) -> str:
    """The structural status a kernel must get when its params switch on what the op's analysis does not model
    (an attention feature: the status names each, docs/ops.md); "ran" otherwise."""
    from kernalin_ci.ops import get_op
    from kernalin_ci.verify.structural.registry import not_modelled

    cause = not_modelled(get_op(k.op), k.params)
    return f"not-analysed: {cause}" if cause else "ran"


@dataclass
class Judgement:
    """What an outcome means against the manifest: `problems` fail the test; `known` are expected causes;
    `not_checked`: why the kernel could not be checked here at all (the test says so and skips)."""

    word: str  # one word or two for the matrix cell
    problems: list[str]
    known: list[str]
    not_checked: str = ""


def not_built(k: Kernel, o: Outcome) -> str:
    """Why a CUDA C++ kernel was not checked: the toolchain here does not build its (unmodified, or one-line
    mutated) sources: a `build-error` finding names the compiler's first error. Empty when it built."""
    if not k.cuda:
        return ""
    errors = [f for f in o.findings if f.get("bug_class") == "build-error"]
    if not errors:
        return ""
    return f"not checked (the CUDA toolchain here does not build it: {errors[0].get('message', '')[:300]})"


def judge(k: Kernel, o: Outcome) -> Judgement:
    if triton_too_new(k):
        import importlib.metadata

        why = f"needs Triton < {k.needs_triton_below} (installed {importlib.metadata.version('triton')})"
        # what a user sees: the verify fails with an entry-error (the entry raised at every shape), nothing else
        if o.exit_code != 1 or o.classes != ["entry-error"]:
            seen = ", ".join(o.classes) or o.error or "no finding"
            return Judgement("ERROR", [f"{why}: expected one entry-error finding and exit code 1, got {seen}"], [])
        return Judgement("cannot run here", [], [why])
    if o.error:
        return Judgement("ERROR", [o.error], [])
    why = not_built(k, o)
    if why:
        return Judgement("not built", [], [], why)
    if o.variant == "mutant":
        if k.mutant.bug_class in o.classes:
            return Judgement("caught", [], [])
        return Judgement("MISSED", [f"mutant ({k.mutant.models}) not reported as {k.mutant.bug_class}"], [])
    problems, known = [], []
    rules = [r for r in k.known_false if r.get("device", o.device) == o.device]
    true_rules = [r for r in k.true_findings if r.get("device", o.device) == o.device]  # some show on one device only
    true = [f for f in o.findings if any(matches(f, r) for r in true_rules)]
    for f in o.findings:
        if f in true:
            continue
        causes = [r["cause"] for r in rules if matches(f, r)]
        if causes:
            known += [c for c in causes if c not in known]
        else:
            problems.append(f"false finding [{f['bug_class']}] {f['kind']}: {f['message'][:200]}")
    for r in rules:  # a cause that no longer shows has been fixed: its rule must go
        if not any(matches(f, r) for f in o.findings if f not in true):
            problems.append(f"known cause no longer seen (fixed? remove it from the manifest): {r['cause'][:120]}")
    if o.structural != "ran" and not k.cuda and o.structural != expected_structural(k):  # CUDA C++: none yet
        problems.append(f"structural analysis did not run: {o.structural}")
    for r in true_rules:
        if not any(matches(f, r) for f in true):
            problems.append(f"the documented true finding is gone: [{r['bug_class']}] {r['why'][:80]}")
    word = "true finding" if true else "clean"
    if problems:
        word = (
            "FALSE FINDING"
            if any(p.startswith("false") for p in problems)
            else "STRUCTURAL NOT RUN"
            if any(p.startswith("structural") for p in problems)
            else "MANIFEST OUT OF DATE"
        )
    elif known:
        word = word + " + known false" if true else "known false"
    return Judgement(word, problems, known)
