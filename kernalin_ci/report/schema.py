"""The JSON Schema (draft 2020-12) of report.json, documented field by field in docs/report.md.

Objects allow more properties than listed (docs/cli.md: more fields are fine); the listed ones keep
their names, types and meanings for a given `schema` version.
"""

from __future__ import annotations

from kernalin_ci.findings import BUG_CLASSES, SANITIZER_STATUSES, STRUCTURAL_STATUSES
from kernalin_ci.report.model import SCHEMA_VERSION

_num = {"type": "number"}
_prob = {"type": "number", "minimum": 0, "maximum": 1}
_pair = {"type": "array", "items": _num, "minItems": 2, "maxItems": 2}
_str_or_null = {"type": ["string", "null"]}

LOCATION = {
    "type": ["object", "null"],
    "required": ["path", "line"],
    "properties": {"path": {"type": "string"}, "line": {"type": "integer"}},
}

CASE = {
    "type": ["object", "null"],
    "required": ["name", "dims"],
    "properties": {
        "name": {"type": "string"},
        "dims": {"type": "object"},
        "dtype": {"type": "string"},
        "seed": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
}

FINDING = {
    "type": "object",
    "required": ["check", "bug_class", "message"],
    "properties": {
        "check": {"type": "string"},
        "bug_class": {"enum": sorted(BUG_CLASSES)},
        "message": {"type": "string"},
        "location": LOCATION,
        "case": CASE,
        "reproduce": _str_or_null,
        "kind": {"enum": ["dynamic", "structural", "sanitizer", "build"]},
    },
}

NOTICE = {
    "type": "object",
    "required": ["check", "message"],
    "properties": {
        "check": {"type": "string"},
        "message": {"type": "string"},
        "location": LOCATION,
        "kind": {"type": "string"},
    },
}

_ints = {"type": "array", "items": {"type": "integer"}}
_range = {"type": "array", "items": {"type": "integer"}, "maxItems": 2}

# what the dynamic checks reached (kernalin_ci.findings.Coverage)
COVERAGE = {
    "type": "object",
    "properties": {
        "head_dims": _ints,
        "heads": {"type": "array", "items": {"type": "string"}},
        "dtypes": {"type": "array", "items": {"type": "string"}},
        "block_sizes": _ints,
        "kv_lens": _range,
        "positions": _range,
    },
}

# cases that did not run, and why (kernalin_ci.findings.NotChecked)
NOT_CHECKED = {
    "type": "object",
    "required": ["shape", "reason", "error", "cases"],
    "properties": {
        "shape": {"type": "string"},
        "reason": {"enum": ["unsupported", "interpreter", "needs-gpu"]},
        "error": {"type": "string"},
        "cases": {"type": "array", "items": {"type": "string"}},
        "instead": _str_or_null,
    },
}

# whether the compiled IR was analysed (kernalin_ci.findings.StructuralStatus)
STRUCTURAL = {
    "type": "object",
    "required": ["status"],
    "properties": {
        "status": {"enum": list(STRUCTURAL_STATUSES)},
        "cause": _str_or_null,
        "shape": _str_or_null,
        # since issue 30: what the analysis proved and could not verify (older reports have neither)
        "proved": {"type": "array", "items": {"type": "string"}},
        "gaps": {"type": "array", "items": {"type": "string"}},
    },
}

VERIFICATION = {
    "type": ["object", "null"],
    "required": ["verdict", "findings"],
    "properties": {
        "op": {"type": "string"},
        "entry": {"type": "string"},
        "verdict": {"enum": ["pass", "fail", "not-checked"]},
        "cases_run": {"type": "integer", "minimum": 0},
        "seconds": _num,
        "device": {"type": "string"},
        "findings": {"type": "array", "items": FINDING},
        "notices": {"type": "array", "items": NOTICE},
        "coverage": COVERAGE,
        "not_checked": {"type": "array", "items": NOT_CHECKED},
        "structural": STRUCTURAL,
        "error": {"type": "string"},
        # since issue 31: a CUDA C++ kernel's build, and Compute Sanitizer's run (older reports have neither)
        "build": {
            "type": "object",
            "required": ["status"],
            "properties": {"status": {"enum": ["built", "cached", "failed", "no-compiler", "no-sources"]}},
        },
        "sanitizer": {
            "type": "object",
            "required": ["status"],
            "properties": {
                "status": {"enum": list(SANITIZER_STATUSES)},
                "cause": _str_or_null,
                "tools": {"type": "object"},
                "cases": {"type": "array", "items": {"type": "string"}},
                "seconds": _num,
            },
        },
    },
}

_num_or_null = {"type": ["number", "null"]}

VERDICT = {
    "type": "object",
    "required": ["verdict", "ratio", "hdi", "p_faster", "p_slower", "p_equivalent", "rope"],
    "properties": {
        "verdict": {"enum": ["faster", "slower", "equivalent", "inconclusive"]},
        "ratio": _num,
        "hdi": _pair,
        "p_faster": _prob,
        "p_slower": _prob,
        "p_equivalent": _prob,
        "rope": _pair,
        "rounds": {"type": ["integer", "null"]},
        "rope_source": _str_or_null,
        "floor": _num_or_null,
        "aa_ratio": _num_or_null,
        "aa_hdi": {"type": ["array", "null"], "items": _num},
        "shapes": {"type": ["array", "null"]},
        "seconds": _num_or_null,
        "clock": _str_or_null,
        "regime": _str_or_null,
        "posterior_hist": {
            "type": ["object", "null"],
            "required": ["edges", "density"],
            "properties": {"edges": {"type": "array", "items": _num}, "density": {"type": "array", "items": _num}},
        },
    },
}

# A benchmark that ran but reached no verdict (the harness failed): verdict null, error says why.
FAILED_BENCHMARK = {
    "type": "object",
    "required": ["verdict", "error"],
    "properties": {"verdict": {"type": "null"}, "error": {"type": "string"}},
}

BENCHMARK = {"anyOf": [{"type": "null"}, VERDICT, FAILED_BENCHMARK]}

# kernalin_ci.explain (docs/report.md "explain"): every verdict explained
_obj_or_null = {"type": ["object", "null"]}
SHAPE_IDENTITY = {
    "type": "object",
    "required": ["shape", "identical", "differences"],
    "properties": {
        "shape": {"type": "string"},
        "identical": {"type": ["boolean", "null"]},
        "differences": {"type": "array", "items": {"type": "string"}},
    },
}
IDENTITY = {
    "type": "object",
    "required": ["status", "shapes", "verdict"],
    "properties": {
        "status": {"enum": ["compared", "not-compared"]},
        "cause": _str_or_null,
        "toolchain_changed": {"type": "array", "items": {"type": "string"}},
        "shapes": {"type": "array", "items": SHAPE_IDENTITY},
        "toolchain": {"type": "object"},
        "seconds": _num,
        "verdict": {"enum": [None, "equivalent (identical compiled code)"]},
    },
}
SIDE_PEAK = {
    "type": "object",
    "required": ["bytes", "flops", "achieved_gbs", "above_peak"],
    "properties": {
        "bytes": {"type": "integer"},
        "flops": {"type": "integer"},
        "ms": _num_or_null,
        "achieved_gbs": _num_or_null,
        "achieved_tflops": _num_or_null,
        "peak_gbs": _num_or_null,
        "peak_tflops": _num_or_null,
        "peak_flops_kind": _str_or_null,
        "pct_peak_bw": _num_or_null,
        "pct_peak_flops": _num_or_null,
        "pct_copy_bw": _num_or_null,
        "bound": {"enum": [None, "memory-bound", "compute-bound"]},
        "above_peak": {"type": "boolean"},
        "problem": _str_or_null,
    },
}
PEAK_ROW = {
    "type": "object",
    "required": ["shape"],
    "properties": {"shape": {"type": ["string", "null"]}, "model": _str_or_null, "base": SIDE_PEAK, "head": SIDE_PEAK},
}
WHY_ROW = {
    "type": "object",
    "required": ["kernel", "shape", "base", "head", "changed"],
    "properties": {
        "kernel": {"type": "string"},
        "shape": {"type": "string"},
        "launch": {"type": "integer"},
        "base": _obj_or_null,
        "head": _obj_or_null,
        "changed": {"type": "array", "items": {"type": "string"}},
    },
}
EXPLAIN = {
    "type": ["object", "null"],
    "properties": {
        "identity": IDENTITY,
        "verdict": _str_or_null,
        "peak": {"type": "array", "items": PEAK_ROW},
        "peak_note": {"type": "string"},
        "above_peak": {"type": "boolean"},
        "why": {"type": "array", "items": WHY_ROW},
        "provenance": {
            "type": "object",
            "properties": {
                "start": _obj_or_null,
                "end": _obj_or_null,
                "changed": {"type": "array", "items": {"type": "string"}},
                "regime": {"type": "object"},
            },
        },
        "recheck": {
            "type": ["object", "null"],
            "required": ["case", "verdict", "findings"],
            "properties": {
                "case": {"type": "string"},
                "verdict": _str_or_null,
                "findings": {"type": "array", "items": FINDING},
                "error": _str_or_null,
            },
        },
        "profile": {"type": ["object", "null"]},
        "error": {"type": "string"},
    },
}

_failed_by = {
    "type": "array",
    "items": {"type": "string"},
    "examples": [["finding"], ["slower"], ["inconclusive"], ["not-analysed"], ["error"]],
}

KERNEL = {
    "type": "object",
    "required": ["name", "op", "entry", "status", "verification", "benchmark", "failed_by"],
    "properties": {
        "name": {"type": "string"},
        "op": {"type": "string"},
        "entry": {"type": "string"},
        "status": {"enum": ["changed", "new", "removed", "unchanged"]},
        "reasons": {"type": "array", "items": {"type": "string"}},
        "verification": VERIFICATION,
        "benchmark": BENCHMARK,
        "benchmark_note": _str_or_null,
        "error": _str_or_null,
        "failed_by": _failed_by,
        "seconds": _num,
        "explain": EXPLAIN,
    },
}

PIPELINE = {
    "type": "object",
    "required": ["name", "members", "verification", "failed_by"],
    "properties": {
        "name": {"type": "string"},
        "members": {"type": "object", "additionalProperties": {"type": "string"}},
        "verification": VERIFICATION,
        "failed_by": _failed_by,
        "seconds": _num,
    },
}

# decode tokens/s and $/Mtok, base against head (docs/tokens.md; kernalin_ci.throughput.bench.ModelResult)
_side = {
    "type": "object",
    "required": ["step_ms", "tokens_per_s", "usd_per_mtok"],
    "properties": {
        "step_ms": _num,
        "tokens_per_s": _num,
        "tokens_per_s_hdi": _pair,
        "usd_per_mtok": _num,
        "usd_per_mtok_hdi": _pair,
    },
}
SERVING_POINT = {
    "type": "object",
    "required": [
        "batch",
        "context",
        "verdict",
        "tokens_per_s_ratio",
        "tokens_per_s_ratio_hdi",
        "p_faster",
        "p_equivalent",
        "p_slower",
        "base",
        "head",
    ],
    "properties": {
        "batch": {"type": "integer", "minimum": 1},
        "context": {"type": "integer", "minimum": 1},
        "verdict": {"enum": ["faster", "slower", "equivalent", "inconclusive"]},
        "step_ratio": _num,
        "step_hdi": _pair,
        "tokens_per_s_ratio": _num,
        "tokens_per_s_ratio_hdi": _pair,
        "p_faster": _prob,
        "p_equivalent": _prob,
        "p_slower": _prob,
        "rope": _pair,
        "rounds": {"type": "integer"},
        "usd_per_mtok_change": _num,
        "base": _side,
        "head": _side,
    },
}
MODEL = {
    "type": ["object", "null"],
    "required": ["model", "shape", "price_per_hour", "measured", "reason", "points"],
    "properties": {
        "model": {"type": "string"},
        "shape": {"type": "object"},
        "source": {"type": "string"},
        "price_per_hour": _num,
        "price_source": {"type": "string"},
        "device": {"type": "string"},
        "kernels": {"type": "object", "additionalProperties": {"type": "string"}},
        "measured": {"type": "boolean"},
        "reason": _str_or_null,
        "mode": {"enum": ["full", "per-layer", None]},
        "mode_why": _str_or_null,
        "layers_built": {"type": ["integer", "null"]},
        "points": {"type": "array", "items": SERVING_POINT},
        "verdict": {"anyOf": [{"type": "null"}, VERDICT]},
        "rounds": {"type": "integer"},
        "error": _str_or_null,
        "error_kind": _str_or_null,
        "notes": {"type": "array", "items": {"type": "string"}},
    },
}

_ref = {"type": "object", "properties": {"ref": _str_or_null, "sha": _str_or_null}}

# where the deciding configuration came from, how the pull request's differs (kernalin_ci.trust.ConfigOrigin)
CONFIGURATION = {
    "type": ["object", "null"],
    "required": ["source", "path", "changes"],
    "properties": {
        "source": {"enum": ["base", "head", "file"]},
        "path": {"type": "string"},
        "revision": _str_or_null,
        "why": {"type": "string"},
        "changes": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["what", "loosens", "by"],
                "properties": {
                    "what": {"type": "string"},
                    "loosens": {"type": "boolean"},
                    "by": {"enum": ["head", "command line"]},
                },
            },
        },
    },
}

# the isolation kernel code ran under (kernalin_ci.trust.Isolation)
ISOLATION = {
    "type": ["object", "null"],
    "required": ["mode"],
    "properties": {
        "mode": {"enum": ["bubblewrap", "uid", "none"]},
        "uid": {"type": ["integer", "null"]},
        "network": {"type": "boolean"},
        "why": {"type": "string"},
    },
}

REPORT_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "kernalin-ci/report.json",
    "title": "kernalin-ci PR gate report",
    "type": "object",
    "required": ["schema", "conclusion", "reason", "kernels"],
    "properties": {
        "schema": {"const": SCHEMA_VERSION},
        "conclusion": {"enum": ["success", "failure", "neutral"]},
        "reason": {"type": "string"},
        "base": _ref,
        "head": _ref,
        "device": {"type": "string"},
        "policy": {
            "type": "object",
            "properties": {
                "fail_on": {"type": "array", "items": {"type": "string"}},
                "rope": _num,
                "budget_s": _num,
                "bench": {"type": "boolean"},
                "trust_head_config": {"type": "array", "items": {"type": "string"}},
            },
        },
        "configuration": CONFIGURATION,
        "isolation": ISOLATION,
        "kernels": {"type": "array", "items": KERNEL},
        "pipelines": {"type": "array", "items": PIPELINE},
        "removed": {"type": "array", "items": {"type": "string"}},
        "repo": _str_or_null,
        "pr": {"type": ["integer", "null"]},
        "seconds": _num,
        "reproduce": {"type": "string"},
        "model": MODEL,
        "environment": {
            "type": "object",
            "properties": {
                "gpu": _str_or_null,
                "torch": {"type": "string"},
                "triton": {"type": "string"},
                "python": {"type": "string"},
                "kernalin_ci": {"type": "string"},
            },
        },
    },
}
