"""The gate badge: a flat SVG (self-contained: no fonts, links or images from elsewhere) and the
shields.io endpoint JSON (https://shields.io/badges/endpoint-badge) for a badge served by shields.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

from kernalin_ci.report.markdown import checked_kernels
from kernalin_ci.report.model import Report
from kernalin_ci.report.text import plural, xml_text

LABEL = "kernalin-ci"
# shields.io named colours and the hex each one is drawn with.
COLORS = {"brightgreen": "#4c1", "red": "#e05d44", "blue": "#007ec6", "lightgrey": "#9f9f9f"}
FONT = "Verdana,Geneva,DejaVu Sans,sans-serif"
FONT_PX = 11
PAD = 6  # horizontal padding each side of a text

# Approximate advance widths (px) of Verdana at 11 px, by character class. The SVG also sets
# textLength, so a viewer with another font stretches the text to exactly this width.
_NARROW = set("ijlI.,:;'!|")
_SEMI = set('frt()[]{}- /\\"`')
_WIDE = set("mwMW@%")


def text_width(text: str) -> int:
    w = 0.0
    for ch in text:
        if ch in _NARROW:
            w += 3.4
        elif ch in _SEMI:
            w += 4.6
        elif ch in _WIDE:
            w += 10.2
        elif ch == " ":
            w += 3.9
        elif ch.isdigit():
            w += 7.0
        elif ch.isupper():
            w += 7.6
        elif ord(ch) < 128:
            w += 6.6
        else:
            w += 11.0  # a symbol, a letter of another script, an emoji
    return math.ceil(w)


@dataclass
class Badge:
    label: str
    message: str
    color: str  # a shields.io colour name (a key of COLORS)

    @property
    def hex(self) -> str:
        return COLORS.get(self.color, COLORS["lightgrey"])


def badge(report: Report) -> Badge:
    """The badge's message and colour: 'passed (3 kernels)' green, 'failed (1 of 3 kernels)' red,
    'no kernels changed' blue, 'neutral' grey."""
    checked = checked_kernels(report)
    if report.conclusion == "failure":
        bad_k = sum(1 for k in report.kernels if k.failed_by)
        bad_p = sum(1 for p in report.pipelines if p.failed_by)
        what = []
        if bad_k:
            what.append(f"{bad_k} of {plural(len(checked), 'kernel')}")
        if bad_p:
            what.append(plural(bad_p, "pipeline"))
        return Badge(LABEL, "failed" + (f" ({', '.join(what)})" if what else ""), "red")
    if report.conclusion == "success":
        if not checked:
            return Badge(LABEL, "no kernels changed", "blue")
        return Badge(LABEL, f"passed ({plural(len(checked), 'kernel')})", "brightgreen")
    return Badge(LABEL, report.conclusion or "neutral", "lightgrey")


def badge_endpoint(report: Report) -> dict:
    """The shields.io endpoint JSON: {"schemaVersion": 1, "label", "message", "color"}."""
    b = badge(report)
    return {"schemaVersion": 1, "label": b.label, "message": b.message, "color": b.color}


def badge_svg(report: Report) -> str:
    """A flat badge as a standalone SVG document; each half as wide as its text plus padding."""
    b = badge(report)
    label, message = xml_text(b.label), xml_text(b.message)
    lw, mw = text_width(label), text_width(message)
    left, right = lw + 2 * PAD, mw + 2 * PAD
    width = left + right
    title = f"{label}: {message}"

    def text(x: float, s: str, w: int) -> str:
        attrs = f'x="{x:g}" textLength="{w}" lengthAdjust="spacingAndGlyphs"'
        return (
            f'<text {attrs} y="15" fill="#010101" fill-opacity=".3" aria-hidden="true">{escape(s)}</text>'
            f'<text {attrs} y="14">{escape(s)}</text>'
        )

    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="20" role="img" '
        f"aria-label={quoteattr(title)}>"
        f"<title>{escape(title)}</title>"
        '<linearGradient id="s" x2="0" y2="100%"><stop offset="0" stop-color="#bbb" stop-opacity=".1"/>'
        '<stop offset="1" stop-opacity=".1"/></linearGradient>'
        f'<clipPath id="r"><rect width="{width}" height="20" rx="3" fill="#fff"/></clipPath>'
        '<g clip-path="url(#r)">'
        f'<rect width="{left}" height="20" fill="#555"/>'
        f'<rect x="{left}" width="{right}" height="20" fill="{b.hex}"/>'
        f'<rect width="{width}" height="20" fill="url(#s)"/></g>'
        f'<g fill="#fff" text-anchor="start" font-family="{FONT}" font-size="{FONT_PX}">'
        + text(PAD, label, lw)
        + text(left + PAD, message, mw)
        + "</g></svg>\n"
    )
