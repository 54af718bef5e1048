"""Text helpers shared by the renderers: escaping for markdown, HTML and XML, and the one wording of
each thing the outputs show (a benchmark Verdict, a Finding, a shape not checked, a Notice), from the
typed results the Report holds.

Nothing here computes a statistic: every figure comes from the Verdict as it is, only rounded and
phrased.
"""

from __future__ import annotations

import html
import math
import re

from kernalin_ci.bench.regime import MICRO_US, is_micro
from kernalin_ci.ops.base import Case

# ---------------------------------------------------------------------------------------- escaping

_MD_BACKSLASH = re.compile(r"([\\`*_\[\]|~])")
_XML_BAD = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def md(text: object) -> str:
    """TEXT as inline markdown that renders literally, also inside a table cell.

    HTML's `& < >` become entities; markdown's punctuation (backslash, backtick, `* _ [ ] | ~`) is
    backslash-escaped (GitHub's table parser reads `\\|` as a literal pipe); a line break becomes `<br>`.
    """
    s = html.escape(str(text), quote=False)
    s = _MD_BACKSLASH.sub(r"\\\1", s)
    return s.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "<br>")


def html_text(text: object) -> str:
    """TEXT for a raw-HTML line (a `<summary>`), where markdown is not parsed: entities only."""
    return html.escape(str(text).replace("\n", " "), quote=True)


def code(text: object, *, table: bool = False) -> str:
    """TEXT as a markdown code span: literal whatever it holds (backticks, `<script>`, pipes).

    The fence is one backtick longer than the longest run inside; in a table cell a pipe is
    written `\\|`, which GitHub's table parser turns back into `|` inside the span.
    """
    s = str(text).replace("\r", " ").replace("\n", " ")
    if table:
        s = s.replace("|", "\\|")
    if not s:
        return "` `"
    longest = max((len(r) for r in re.findall(r"`+", s)), default=0)
    fence = "`" * (longest + 1)
    if s.startswith("`") or s.endswith("`") or longest:
        s = f" {s} "
    return f"{fence}{s}{fence}"


def code_block(text: str, lang: str = "") -> str:
    """TEXT in a fenced code block whose fence no line of TEXT can close."""
    longest = max((len(r) for r in re.findall(r"`{3,}", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{text.rstrip()}\n{fence}"


def xml_text(text: object) -> str:
    """TEXT with the characters XML 1.0 cannot hold at all (NUL, ESC, ...) written as `\\xNN`;
    the XML writer escapes `& < > "` itself."""
    return _XML_BAD.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def clip(text: str, limit: int) -> str:
    """TEXT cut to LIMIT characters with a note of how much was cut."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"… ({len(text) - limit} more characters)"


# ---------------------------------------------------------------------------------------- numbers


def _finite(*xs) -> bool:
    return all(isinstance(x, (int, float)) and math.isfinite(x) for x in xs)


def percent(frac: float, decimals: int = 1) -> str:
    """0.031 -> '3.1%'."""
    return f"{100 * frac:.{decimals}f}%"


def signed_percent(frac: float, decimals: int = 1) -> str:
    """0.031 -> '+3.1%', -0.002 -> '-0.2%' (a minus sign that survives copy and paste)."""
    return f"{100 * frac:+.{decimals}f}%"


def prob(p: float) -> str:
    """A posterior probability as a percentage; the extremes say 'beyond this resolution'."""
    if not _finite(p):
        return "n/a"
    if p >= 0.9995:
        return ">99.9%"
    if p <= 0.0005:
        return "<0.1%"
    return f"{100 * p:.1f}%"


# The statistics' region of practical equivalence (a ROPE), in users' words: the equivalence margin, the
# change of head/base within which base and head count as equivalent (docs/statistics.md). Code and JSON
# keep the statistical name (`rope`); everything a person reads says "margin".
MARGIN_WORDS = "equivalence margin"
MARGIN_LEGEND = (
    "margin: the equivalence margin, a change of head/base within ±margin counts as equivalent "
    "(the region of practical equivalence of docs/statistics.md)"
)


def rope_text(rope) -> str:
    """The margin [lo, hi] as ratios -> '±0.5%' (its half-width, trailing zeros dropped)."""
    lo, hi = rope
    if not _finite(lo, hi):
        return "n/a"
    half = 100 * (hi - lo) / 2
    s = f"{half:.2f}".rstrip("0").rstrip(".")
    return f"±{s}%"


def ratio_text(x) -> str:
    return f"{x:.4f}" if _finite(x) else "n/a"


def hdi_text(hdi) -> str:
    lo, hi = hdi
    return f"{ratio_text(lo)}–{ratio_text(hi)}"


def _decimals(*fracs: float, apart: tuple[float, float] | None = None) -> int:
    """One decimal for effects of a percent or more, two below that (0.35% must not read 0.3%); more
    (up to three) while the two ends of APART (an HDI) would print the same."""
    d = 1 if max(abs(f) for f in fracs) >= 0.01 else 2
    while apart and d < 3 and f"{100 * apart[0]:.{d}f}" == f"{100 * apart[1]:.{d}f}":
        d += 1
    return d


# ---------------------------------------------------------------------------------------- verdicts


def benchmark_ok(b) -> bool:
    """Whether BenchResult B (or None) has a verdict a renderer can word (its figures are numbers)."""
    v = b.verdict if b is not None else None
    if v is None or v.verdict not in ("faster", "slower", "equivalent", "inconclusive"):
        return False
    try:
        return _finite(v.ratio, *v.hdi, v.p_faster, v.p_slower, v.p_equivalent, *v.rope)
    except (TypeError, ValueError):
        return False


def effect(v) -> str:
    """Verdict V as '3.1% faster', '2.0% slower', 'equivalent', 'inconclusive (+0.4%)': for headlines and
    cells."""
    r = v.ratio
    if v.verdict == "faster":
        return f"{percent(1 - r, _decimals(1 - r))} faster"
    if v.verdict == "slower":
        return f"{percent(r - 1, _decimals(r - 1))} slower"
    if v.verdict == "equivalent":
        return "equivalent"
    return f"inconclusive ({signed_percent(r - 1, _decimals(r - 1))})"


def verdict_phrase(v) -> str:
    """Verdict V for humans, e.g. 'faster: 3.1% (95% HDI 2.7%..3.5%), P(faster) 99.4%, margin ±0.5%'.

    Effects are changes of the head's time against the base's: 'faster: 3.1%' is a ratio of 0.969.
    """
    return f"{v.verdict}: {verdict_words(v)}"


def verdict_words(v) -> str:
    """Verdict V's figures, its name left out: '3.1% (95% HDI 2.7%..3.5%), P(faster) 99.4%, margin ±0.5%'.
    The one wording of a benchmark verdict: `verdict_phrase` (report.md, JUnit, the PR comment) and the
    `bench`/`compare` lines (`verdict_line`, the verdict in its own column) use it."""
    r = v.ratio
    lo, hi = v.hdi
    rope = rope_text(v.rope)
    if v.verdict == "faster":
        d = _decimals(1 - r, 1 - lo, 1 - hi, apart=(lo, hi))
        return (
            f"{percent(1 - r, d)} (95% HDI {percent(1 - hi, d)}..{percent(1 - lo, d)}), "
            f"P(faster) {prob(v.p_faster)}, margin {rope}"
        )
    if v.verdict == "slower":
        d = _decimals(r - 1, lo - 1, hi - 1, apart=(lo, hi))
        return (
            f"{percent(r - 1, d)} (95% HDI {percent(lo - 1, d)}..{percent(hi - 1, d)}), "
            f"P(slower) {prob(v.p_slower)}, margin {rope}"
        )
    d = _decimals(r - 1, lo - 1, hi - 1, apart=(lo, hi))
    span = f"{signed_percent(r - 1, d)} (95% HDI {signed_percent(lo - 1, d)}..{signed_percent(hi - 1, d)})"
    if v.verdict == "equivalent":
        return f"{span}, P(equivalent) {prob(v.p_equivalent)}, margin {rope}"
    return (
        f"{span}, P(faster) {prob(v.p_faster)}, P(equivalent) {prob(v.p_equivalent)}, "
        f"P(slower) {prob(v.p_slower)}, margin {rope}"
    )


def verdict_line(v, label: str = "") -> str:
    """One line per verdict for `bench` and `compare`: the verdict in capitals (a column to scan),
    head/base, the verdict's figures in the report's own words (`verdict_words`), where the equivalence
    margin came from, and the rounds."""
    words = verdict_words(v)
    floor = f", A/A floor {100 * v.floor:.2f}%" if v.floor is not None else ""
    src = {"fixed": "fixed", "minimum": "minimum", "floor": "from the floor"}.get(v.rope_source, v.rope_source)
    head = f"{label}  " if label else ""
    return f"{head}{v.verdict.upper():12s} head/base {v.ratio:.4f}: {words} ({src}{floor}); {v.rounds} rounds"


def verdict_interval(v, digits: int = 4) -> str:
    """Verdict V's head/base and 95% HDI as bare ratios, '0.9690 [0.9650, 0.9730]': the compact lines (a
    shape of `bench`, tune's table)."""
    return f"{v.ratio:.{digits}f} [{v.hdi[0]:.{digits}f}, {v.hdi[1]:.{digits}f}]"


def shape_line(s) -> str:
    """A ShapeResult with a verdict in one line for `bench`: 'long-ctx: base 0.1 ms, head 0.09 ms, head/base
    0.9690 [0.9650, 0.9730] -> faster (margin ±0.50%, inner 8, cuda-graph)'."""
    v = s.verdict
    return (
        f"{s.shape}: base {s.base_ms:.4g} ms, head {s.head_ms:.4g} ms, "
        f"head/base {verdict_interval(v)} -> {v.verdict} "
        f"(margin ±{100 * v.rope_half_width:.2f}%, inner {s.inner}, {s.timing})"
    )


def verdict_exact(v) -> str:
    """Verdict V's figures unrounded for machines that read text (JUnit's): 'benchmark ratio 0.969000, 95% HDI
    [...], P(faster) 0.3000, P(equivalent) 0.5000, P(slower) 0.2000, equivalence margin [...]'."""
    return (
        f"benchmark ratio {v.ratio:.6f}, 95% HDI [{v.hdi[0]:.6f}, {v.hdi[1]:.6f}], "
        f"P(faster) {v.p_faster:.4f}, P(equivalent) {v.p_equivalent:.4f}, "
        f"P(slower) {v.p_slower:.4f}, equivalence margin [{v.rope[0]:.6f}, {v.rope[1]:.6f}]"
    )


def benchmark_summary(v) -> str:
    """Verdict V in the gate's line per kernel: 'benchmark faster (ratio 0.9690)'."""
    return f"benchmark {v.verdict} (ratio {v.ratio:.4f})"


def faster_text(names: list[str]) -> str:
    """The kernels shown faster, in the gate's conclusion: 'faster: attn, rope'."""
    return f"faster: {', '.join(names)}"


def not_shown_faster_text(label: str, verdicts: list[str]) -> str:
    """tune: why a candidate that leads on median time does not replace the current config."""
    return (
        f"{label} leads on median time but is not shown faster than the current "
        f"config on every shape ({', '.join(verdicts)}): the current config stays"
    )


def not_written_text(label: str, verdicts: list[str]) -> str | None:
    """tune --write: why a chosen candidate's verdicts against the current config write nothing (None: they
    do: faster on some shape, equivalent or faster on all)."""
    if any(v in ("slower", "inconclusive") for v in verdicts):
        return f"{label} is not faster or equivalent on every shape ({', '.join(verdicts)})"
    if "faster" not in verdicts:
        return f"{label} is equivalent to the current config within the equivalence margin: nothing to gain"
    return None


def mass_sentence(v) -> str:
    """Where verdict V's posterior mass sits relative to the equivalence margin, e.g. '99.4% of the
    posterior mass sits below the equivalence margin.' (below = head faster)."""
    pf, ps, pe = v.p_faster, v.p_slower, v.p_equivalent
    if pf >= 0.5:
        return f"{prob(pf)} of the posterior mass sits below the equivalence margin (head faster)."
    if ps >= 0.5:
        return f"{prob(ps)} of the posterior mass sits above the equivalence margin (head slower)."
    if pe >= 0.5:
        return f"{prob(pe)} of the posterior mass sits inside the equivalence margin."
    return f"The posterior mass is split: {prob(pf)} below the equivalence margin, {prob(pe)} inside, {prob(ps)} above."


def measurement_note(b) -> str:
    """BenchResult B's '24 rounds · 18.2 s · CUDA events · warm L2 · A/A floor 0.05%', from the fields
    that are set."""
    parts = []
    if b.rounds:
        parts.append(f"{b.rounds} rounds")
    if _finite(b.seconds):
        parts.append(f"{b.seconds:.1f} s")
    clock = {"cuda-events": "CUDA events", "cpu-wall": "CPU wall clock", "cpu-wall-clock": "CPU wall clock"}.get(
        b.clock, b.clock
    )
    if clock:
        parts.append(str(clock))
    if b.regime in ("warm", "cold"):
        parts.append(f"{b.regime} L2")
    floor = b.verdict.floor if b.verdict is not None else None
    if _finite(floor):
        parts.append(f"A/A floor {percent(floor, 2)}")
    if b.shapes:
        parts.append(f"{len(b.shapes)} shape{'s' * (len(b.shapes) != 1)}")
    if b.clock == "cuda-events" and any(is_micro(s.base_ms) for s in b.shapes):
        parts.append(f"under {MICRO_US:g} us per launch: the ratio of this timing context (docs/statistics.md)")
    return " · ".join(parts)


# ---------------------------------------------------------------------------------------- findings


def case_summary(case: dict | None) -> str | None:
    """'long-tail [float16, seed 8] Hq=8 Hkv=2 D=64 kv_lens=[...]': the op layer's own case summary."""
    if not isinstance(case, dict):
        return None
    try:
        return Case(
            name=str(case.get("name", "?")),
            dims=dict(case.get("dims") or {}),
            dtype=str(case.get("dtype", "float32")),
            seed=case.get("seed", 0),
            tags=tuple(case.get("tags") or ()),
        ).summary()
    except (TypeError, ValueError):
        return str(case)


def location_text(loc) -> str | None:
    """A Location as 'kernels/attn.py:57', or None."""
    if loc is None or not loc.path:
        return None
    return f"{loc.path}:{loc.line}" if loc.line else str(loc.path)


def finding_text(f) -> str:
    """A Finding as plain text: class, check, location, message, case and reproduce command. The one
    plain-text wording of a finding (the CLI, JUnit and the check-run annotations use it; the comment
    is markdown)."""
    head = f"[{f.bug_class}] {f.kind} check {f.check}"
    loc = location_text(f.location)
    if loc:
        head += f" at {loc}"
    lines = [head, f"  {f.message}"]
    case = case_summary(f.case)
    if case:
        lines.append(f"  case: {case}")
    if f.reproduce:
        lines.append(f"  reproduce: {f.reproduce}")
    return "\n".join(lines)


def finding_line(f) -> str:
    """A Finding in one line for tables and progress: 'kv-mask at k.py:57 (structural:kv-mask): message'
    (the message on one line, cut at 200 characters; `tune` lists dropped configs with it)."""
    where = f" at {f.location.path}:{f.location.line}" if f.location else ""
    msg = " ".join(f.message.split()).split(" (also in ")[0]
    return f"{f.bug_class}{where} ({f.check}): {msg[:200]}"


def bug_classes(findings: list) -> list[tuple[str, int]]:
    """The Findings' bug classes in first-seen order, with how often each occurs."""
    counts: dict[str, int] = {}
    for f in findings:
        c = str(f.bug_class)
        counts[c] = counts.get(c, 0) + 1
    return list(counts.items())


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


# ---------------------------------------------------------------------------------------- shape domain


def structural_text(v) -> str | None:
    """A VerifyResult's structural status: 'analysed at D=64 float16 Hq=6 Hkv=2' / 'not analysed (cause)' /
    None when not run."""
    if v.structural.status not in ("analysed", "not-analysed"):
        return None
    return v.structural.summary()


def coverage_text(v) -> str | None:
    """The shapes and lengths the dynamic checks of VerifyResult V reached, in one line; None when there
    is no coverage."""
    if not any(v.coverage.to_json().values()):
        return None
    return v.coverage.summary()


def not_checked_texts(v) -> list[str]:
    """One line per shape that was not checked: its reason and the kernel's own error."""
    return [not_checked_text(n) for n in v.not_checked]


def not_checked_text(item) -> str:
    """A NotChecked in one line: its shape, reason, the kernel's own error and the cases (the CLI,
    report.md and JUnit)."""
    cases = ", ".join(item.cases[:4]) + (", ..." if len(item.cases) > 4 else "")
    return item.summary() + (f" (cases: {cases})" if cases else "")


def notice_text(n) -> str:
    """A Notice in one line: 'structural:interpret at k.py:12: could not verify ...' (the CLI and JUnit)."""
    loc = location_text(n.location)
    return f"{n.check}{' at ' + loc if loc else ''}: {n.message}"


# ---------------------------------------------------------------------------------------- trust


def config_origin_text(origin) -> str:
    """Where the gate's configuration came from (a trust.ConfigOrigin), in one line:
    '.kernalin.yml at base 1a2b3c4d5e6f (the base revision's: ...)'."""
    if origin.source == "file":
        return f"{origin.path} ({origin.why})"
    at = f" {origin.revision[:12]}" if origin.revision else ""
    return f"{origin.path} at {origin.source}{at} ({origin.why})"


def config_change_text(change) -> str:
    """One difference from the deciding configuration (a trust.ConfigChange)."""
    by = "this pull request changes" if change.by == "head" else "the command line overrides"
    return f"{by} {change.what}" + (" (LOOSENS the gate)" if change.loosens else "")


def isolation_text(iso) -> str:
    """The isolation kernel code ran under (a trust.Isolation), as 'sandboxed by bubblewrap as uid 65534
    without network' / 'as uid N, without a sandbox (why): ...' / 'UNSANDBOXED (why)'."""
    if iso is None:
        return "under an isolation this report does not record"
    net = "without network" if not iso.network else "with the network"
    if iso.mode == "bubblewrap":
        return f"sandboxed by bubblewrap as uid {iso.uid} {net}" + (f" ({iso.why})" if iso.why else "")
    if iso.mode == "uid":
        return f"as the unprivileged uid {iso.uid} without a sandbox ({iso.why}): {net}, other processes visible"
    as_root = " AS ROOT" if iso.uid == 0 else f" as uid {iso.uid}" if iso.uid is not None else ""
    return f"UNSANDBOXED{as_root} ({iso.why})"


SPEED_TRUST = (
    "Speed verdicts are measured by the pull request's own code (base and head are timed in one worker) and "
    "can be influenced by it; correctness verdicts are judged by the gate from raw results."
)
