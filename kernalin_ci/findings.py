"""Findings, notices and the fixed bug-class vocabulary (docs/bug-classes.md).

A finding is evidence that a kernel is wrong; a notice says a check could not
decide (it never fails the gate). Both are plain data, serialised as docs/cli.md
describes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

# One vocabulary for dynamic and structural checks. "Symptom" classes are what a
# launch shows when no more specific cause is known; "cause" classes name the bug.
BUG_CLASSES: dict[str, str] = {
    # symptoms (dynamic)
    "wrong-output": "output differs from the float64 reference beyond tolerance; no known bug fingerprint matched",
    "non-finite": "NaN or Inf in the output where the reference is finite",
    "unwritten-output": "part of the output was never written (the poison survived)",
    "input-modified": "an input the contract does not name as written changed",
    "stale-result": "the output depends on an earlier call (results cached across calls)",
    "entry-error": "the entry raised an exception on a valid input",
    "timeout": "the kernel did not finish within the time limit",
    "crashed": "the process running the kernel died (segfault, abort)",
    "cuda-error": "a CUDA error (illegal memory access, launch failure) during the launch",
    "bad-result": "the worker handed back no result, or one the parent did not ask for (a forged or broken report)",
    # attention
    "softmax-no-max": "exp of scores without subtracting their maximum (overflows for large scores)",
    "softmax-no-normalize": "output not divided by the sum of the exponentials (missing 1/l)",
    "online-rescale": "tiled online softmax: accumulator or running sum not rescaled by exp(m_old - m_new)",
    "split-combine": "split-KV partial results combined with the wrong log-sum-exp weights",
    "scale": "softmax scale missing, applied twice, or applied after the max",
    "kv-mask": "positions >= kv_len take part in the softmax (length mask missing or off by one)",
    "unmasked-load": "a load or store whose index can leave the valid range (unmasked tail; 0 * NaN)",
    "gqa-mapping": "query head h reads a KV head other than h // (Hq // Hkv)",
    "stride": "a tensor indexed with the wrong stride (batch stride ignored, another tensor's strides)",
    "paged-index": "paged KV addressing wrong (block table lookup, block size, in-block offset)",
    # attention features (docs/ops.md, "Attention features")
    "window-mask": "sliding window wrong: a key at its edge kept or dropped (window off by one, not applied)",
    "soft-cap": "logit soft-cap wrong: applied before the scale, or not applied",
    "alibi": "ALiBi bias wrong: another head's slope, the wrong sign, or none",
    "attention-sink": "attention sink wrong: another head's sink, missing from the denominator, or counted twice",
    # several query tokens per sequence (attention.decode_multi)
    "causal-mask": "a new token's causal bound wrong: it attends the new tokens after it (drafts see each other), "
    "or misses keys up to its own position",
    "query-start": "a ragged query batch read at the wrong row of query_start_loc: a token taken as another sequence's",
    # multi-head latent attention (attention.decode_mla)
    "mla-rope": "MLA: the decoupled RoPE part of the score missing, or read from the wrong columns of the latent "
    "cache row",
    # rope
    "rope-pairing": "rotation pairs the wrong dimensions (neox and gptj swapped, wrong half)",
    "rope-sign": "a sign of the rotation is flipped",
    "rope-position": "the angle does not follow the token's position (program id, constant, wrong token)",
    "rope-frequency": "frequencies not base^(-2i/rotary_dim) (head dim used for partial rotary, wrong base)",
    "rope-passthrough": "dims >= rotary_dim not passed through unchanged",
    "precision": "angles, reductions or accumulations computed in reduced precision",
    # kv_append
    "kv-slot": "a token written to the wrong slot (off by one, wrong block/offset split)",
    "kv-padding": "a padding token (slot -1) written instead of skipped",
    "kv-source": "a cache written from the wrong source (V from K, K from V)",
    "kv-coverage": "part of a token's Hkv * D elements never written (only the first head, half of D)",
    "stray-write": "bytes outside the intended write set changed",
    # FP8 caches (docs/ops.md, "FP8 KV caches")
    "kv-scale": "an FP8 cache quantised or dequantised with the wrong scale (another head's, the other cache's, "
    "multiplied where it divides, or none)",
    "kv-saturation": "a value past the FP8 format's largest normal stored as inf, NaN or another byte instead of "
    "saturating to that normal",
    "offset-overflow": "32-bit address arithmetic that overflows once a buffer passes 2^31 elements",
    # decode_step (a whole step: rotate, append, attend)
    "step-order": "attention reads the new token's cache slot before this step's write of it lands",
    "kv-unrotated": "keys written to the cache before the rotation (the cache holds k, not R(position) k)",
    "rope-value": "the rotation applied to v (values are stored or attended rotated)",
    "new-token-twice": "the new token enters the softmax twice (read back from the cache and taken from registers)",
    # CUDA C++ (docs/cuda.md): the build, and what Compute Sanitizer sees (Triton kernels too)
    "build-error": "the kernel's CUDA sources do not compile",
    "shared-race": "threads of a block access the same shared memory without a barrier between (a missing "
    "__syncthreads between tiles, a race on a shared buffer)",
    "barrier-divergence": "a barrier (__syncthreads, __syncwarp) reached by only some of the threads it waits for",
    "uninitialized-read": "a read of device memory nothing wrote: garbage or a stale result enters the output",
    "warp-reduction": "a warp-shuffle reduction combines the wrong lanes (a wrong offset or width, a partial mask)",
}


def known(cls, d: dict) -> dict:
    """The items of D that are fields of dataclass CLS: a report.json a newer version wrote may hold more."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}


@dataclass
class Location:
    path: str
    line: int

    @classmethod
    def from_json(cls, d: dict | None) -> Location | None:
        return cls(**known(cls, d)) if d else None


@dataclass
class Finding:
    check: str
    bug_class: str
    message: str
    location: Location | None = None
    case: dict | None = None
    reproduce: str | None = None
    kind: str = "dynamic"  # "dynamic" | "structural" | "sanitizer" (Compute Sanitizer) | "build" (CUDA sources)

    def __post_init__(self):
        if self.bug_class not in BUG_CLASSES:
            raise ValueError(f"unknown bug class {self.bug_class!r}")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Finding:
        return cls(**{**known(cls, d), "location": Location.from_json(d.get("location"))})


@dataclass
class Notice:
    """A check that could not decide: 'could not verify X'. Never fails the gate."""

    check: str
    message: str
    location: Location | None = None
    kind: str = "structural"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Notice:
        return cls(**{**known(cls, d), "location": Location.from_json(d.get("location"))})


@dataclass
class Coverage:
    """What the dynamic checks actually ran: every value seen in a case that completed its launch."""

    head_dims: list[int] = field(default_factory=list)
    heads: list[str] = field(default_factory=list)  # "Hq/Hkv" (kv_append: "Hkv")
    dtypes: list[str] = field(default_factory=list)
    block_sizes: list[int] = field(default_factory=list)
    kv_lens: list[int] = field(default_factory=list)  # [lowest, highest] kv_len, or empty
    positions: list[int] = field(default_factory=list)  # [lowest, highest] position, or empty

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Coverage:
        return cls(**{k: list(d.get(k) or []) for k in cls.__dataclass_fields__})

    def summary(self) -> str:
        """One line, e.g. 'D 64, 128 · float32, float16 · heads 8/2, 4/4 · kv_len 1..2048'."""
        parts = []
        if self.head_dims:
            parts.append("D " + ", ".join(map(str, self.head_dims)))
        if self.dtypes:
            parts.append(", ".join(self.dtypes))
        if self.heads:
            parts.append("heads " + ", ".join(self.heads))
        if self.block_sizes:
            parts.append("block size " + ", ".join(map(str, self.block_sizes)))
        if self.kv_lens:
            parts.append(f"kv_len {self.kv_lens[0]}..{self.kv_lens[-1]}")
        if self.positions:
            parts.append(f"positions {self.positions[0]}..{self.positions[-1]}")
        return " · ".join(parts) or "nothing"


@dataclass
class NotChecked:
    """Cases that did not run, and why. reason: "unsupported" (the kernel refused a shape nobody
    declared: its own error is in `error`), "interpreter" (the CPU interpreter cannot run it) or
    "needs-gpu" (a CUDA C++ kernel on a host without a GPU: docs/cuda.md)."""

    shape: str  # e.g. "D=80 float32 Hq=8 Hkv=2"
    reason: str
    error: str = ""
    cases: list[str] = field(default_factory=list)  # the cases affected
    instead: str | None = None  # the shape they ran at instead, if any

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> NotChecked:
        return cls(**known(cls, d))

    def summary(self) -> str:
        if self.reason == "needs-gpu":
            return f"{self.shape}: not checked (needs a GPU)"
        done = f"checked at {self.instead} instead" if self.instead else "not checked"
        what = f"{self.shape}: {self.reason}, {done}"
        return what + (f": {self.error}" if self.error else "")


@dataclass(frozen=True)
class CaseErrors:
    """What the judge measured of one case's outputs against the float64 reference, element by element over
    every output it compared: the largest |out - ref| and |out - ref| / (|ref| + 1e-8) (NaN where an output
    holds NaN; verify/reference.py, `max_errors`)."""

    max_abs: float
    max_rel: float


@dataclass(frozen=True)
class CaseVerdict:
    """One dynamic case's own verdict (verify's findings are deduplicated across cases; this is per case):
    `ran` False when the case did not run at its own shape (not checked, or moved to another shape), its
    findings' checks, bug classes and messages as recorded for it, and the errors the judge measured (None: no output
    compared, e.g. the call raised). In memory only: `verify --trace` writes it (kernalin_ci/workload.py)."""

    case: str
    ran: bool
    checks: tuple[str, ...] = ()  # each finding's check, bug class and message, in order
    bug_classes: tuple[str, ...] = ()
    messages: tuple[str, ...] = ()
    errors: CaseErrors | None = None


STRUCTURAL_STATUSES = ("analysed", "not-analysed", "not-run")


@dataclass
class StructuralStatus:
    """Whether the compiled-IR analysis ran: "analysed" (at `shape`), "not-analysed" (`cause` says
    why: never a silent pass) or "not-run" (not asked for: --only dynamic, --probe, --case)."""

    status: str
    cause: str | None = None
    shape: str | None = None  # the capture shape the kernels were analysed at
    # analysed: the properties proved of the kernels (docs/structural.md), and those the analysis could not
    # verify, each "property: why" (a gap is never a pass of that property)
    proved: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)

    def __post_init__(self):
        if self.status not in STRUCTURAL_STATUSES:
            raise ValueError(f"unknown structural status {self.status!r}")

    def to_json(self) -> dict:
        d = asdict(self)
        for key in ("proved", "gaps"):  # absent when empty: a result without them reads as before
            if not d[key]:
                del d[key]
        return d

    @classmethod
    def from_json(cls, d: dict) -> StructuralStatus:
        d = known(cls, d)
        return cls(**{**d, "proved": list(d.get("proved") or []), "gaps": list(d.get("gaps") or [])})

    def summary(self) -> str:
        if self.status == "analysed":
            text = "analysed" + (f" at {self.shape}" if self.shape else "")
            if self.proved:
                text += "; proved: " + ", ".join(self.proved)
            if self.gaps:
                text += "; not verified: " + "; ".join(self.gaps)
            return text
        if self.status == "not-analysed":
            return f"not analysed ({self.cause})"
        return "not run"


SANITIZER_STATUSES = ("checked", "not-checked", "not-run")


@dataclass
class SanitizerStatus:
    """Whether Compute Sanitizer ran over the kernel's cases (kernalin_ci/cuda/sanitizer.py): "checked" (its
    findings are among the result's, kind "sanitizer"), "not-checked" (`cause`: no GPU, no compute-sanitizer)
    or "not-run" (not asked for). `tools`: per tool, {"seconds", "errors", "status"}; `cases`: the cases run."""

    status: str = "not-run"
    cause: str | None = None
    tools: dict = field(default_factory=dict)
    cases: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def __post_init__(self):
        if self.status not in SANITIZER_STATUSES:
            raise ValueError(f"unknown sanitizer status {self.status!r}")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> SanitizerStatus:
        return cls(**known(cls, d))

    def summary(self) -> str:
        if self.status == "checked":
            tools = ", ".join(f"{t} {v.get('seconds', 0):.1f} s" for t, v in self.tools.items())
            return f"checked ({len(self.cases)} case{'s' * (len(self.cases) != 1)}; {tools})"
        if self.status == "not-checked":
            return f"not checked ({self.cause})"
        return "not run"


@dataclass
class VerifyResult:
    op: str
    entry: str
    cases_run: int = 0
    seconds: float = 0.0
    findings: list[Finding] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)
    device: str = "cpu"
    coverage: Coverage = field(default_factory=Coverage)
    not_checked: list[NotChecked] = field(default_factory=list)
    structural: StructuralStatus = field(default_factory=lambda: StructuralStatus("not-run"))
    # a verification that could not run (the gate's pipeline whose entry did not load, a bug of ours):
    # it fails, and report.json holds only its verdict, findings and this error
    error: str | None = None
    # a CUDA C++ kernel's build (kernalin_ci/cuda/build.py: status, sources, compiler, seconds), else None
    build: dict | None = None
    sanitizer: SanitizerStatus = field(default_factory=SanitizerStatus)
    # each dynamic case's own verdict, in case order (not in to_json: report.json is unchanged)
    cases: list[CaseVerdict] = field(default_factory=list)

    @property
    def needs_gpu(self) -> bool:
        """Whether some of its dynamic cases were not checked for want of a GPU (a CUDA kernel on the CPU)."""
        return any(n.reason == "needs-gpu" for n in self.not_checked)

    @property
    def verdict(self) -> str:
        """fail (a finding or an error), not-checked (no finding, but cases that need a GPU did not run: never a
        pass), or pass."""
        if self.findings or self.error:
            return "fail"
        return "not-checked" if self.needs_gpu else "pass"

    def to_json(self) -> dict:
        if self.error is not None:
            return {"verdict": self.verdict, "findings": [f.to_json() for f in self.findings], "error": self.error}
        extra: dict = {}
        if self.build is not None:
            extra["build"] = self.build
        if self.sanitizer.status != "not-run":
            extra["sanitizer"] = self.sanitizer.to_json()
        return {
            "op": self.op,
            "entry": self.entry,
            "verdict": self.verdict,
            "cases_run": self.cases_run,
            "seconds": round(self.seconds, 3),
            "device": self.device,
            "findings": [f.to_json() for f in self.findings],
            "notices": [n.to_json() for n in self.notices],
            "coverage": self.coverage.to_json(),
            "not_checked": [n.to_json() for n in self.not_checked],
            "structural": self.structural.to_json(),
            **extra,
        }

    @classmethod
    def from_json(cls, d: dict) -> VerifyResult:
        """The typed result of `verify --json` or a report.json's `verification` (fields it lacks take
        their defaults; fields this version does not know are left out)."""
        return cls(
            op=d.get("op", ""),
            entry=d.get("entry", ""),
            cases_run=d.get("cases_run", 0),
            seconds=d.get("seconds", 0.0),
            findings=[Finding.from_json(f) for f in d.get("findings") or []],
            notices=[Notice.from_json(n) for n in d.get("notices") or []],
            device=d.get("device", "cpu"),
            coverage=Coverage.from_json(d.get("coverage") or {}),
            not_checked=[NotChecked.from_json(n) for n in d.get("not_checked") or []],
            structural=StructuralStatus.from_json(d.get("structural") or {"status": "not-run"}),
            error=d.get("error"),
            build=d.get("build"),
            sanitizer=SanitizerStatus.from_json(d.get("sanitizer") or {}),
        )
