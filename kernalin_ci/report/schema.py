"""The JSON Schema (draft 2020-12) of report.json, documented field by field in docs/report.md.

Objects allow more properties than listed (docs/cli.md: more fields are fine); the listed ones keep
their names, types and meanings for a given `schema` version.
"""
from __future__ import annotations

from kernalin_ci.findings import BUG_CLASSES, STRUCTURAL_STATUSES
from kernalin_ci.report.model import SCHEMA_VERSION

_num = {"type": "number"}
_prob = {"type": "number", "minimum": 0, "maximum": 1}
_pair = {"type": "array", "items": _num, "minItems": 2, "maxItems": 2}
_str_or_null = {"type": ["string", "null"]}

LOCATION = {"type": ["object", "null"], "required": ["path", "line"],
            "properties": {"path": {"type": "string"}, "line": {"type": "integer"}}}

CASE = {"type": ["object", "null"], "required": ["name", "dims"],
        "properties": {"name": {"type": "string"}, "dims": {"type": "object"}, "dtype": {"type": "string"},
                       "seed": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}}}

FINDING = {"type": "object", "required": ["check", "bug_class", "message"],
           "properties": {"check": {"type": "string"}, "bug_class": {"enum": sorted(BUG_CLASSES)},
                          "message": {"type": "string"}, "location": LOCATION, "case": CASE,
                          "reproduce": _str_or_null, "kind": {"enum": ["dynamic", "structural"]}}}

NOTICE = {"type": "object", "required": ["check", "message"],
          "properties": {"check": {"type": "string"}, "message": {"type": "string"}, "location": LOCATION,
                         "kind": {"type": "string"}}}

_ints = {"type": "array", "items": {"type": "integer"}}
_range = {"type": "array", "items": {"type": "integer"}, "maxItems": 2}

# what the dynamic checks reached (kernalin_ci.findings.Coverage)
COVERAGE = {"type": "object",
            "properties": {"head_dims": _ints, "heads": {"type": "array", "items": {"type": "string"}},
                           "dtypes": {"type": "array", "items": {"type": "string"}}, "block_sizes": _ints,
                           "kv_lens": _range, "positions": _range}}

# cases that did not run, and why (kernalin_ci.findings.NotChecked)
NOT_CHECKED = {"type": "object", "required": ["shape", "reason", "error", "cases"],
               "properties": {"shape": {"type": "string"}, "reason": {"enum": ["unsupported", "interpreter"]},
                              "error": {"type": "string"}, "cases": {"type": "array", "items": {"type": "string"}},
                              "instead": _str_or_null}}

# whether the compiled IR was analysed (kernalin_ci.findings.StructuralStatus)
STRUCTURAL = {"type": "object", "required": ["status"],
              "properties": {"status": {"enum": list(STRUCTURAL_STATUSES)}, "cause": _str_or_null,
                             "shape": _str_or_null}}

VERIFICATION = {"type": ["object", "null"], "required": ["verdict", "findings"],
                "properties": {"op": {"type": "string"}, "entry": {"type": "string"},
                               "verdict": {"enum": ["pass", "fail"]}, "cases_run": {"type": "integer", "minimum": 0},
                               "seconds": _num, "device": {"type": "string"},
                               "findings": {"type": "array", "items": FINDING},
                               "notices": {"type": "array", "items": NOTICE},
                               "coverage": COVERAGE,
                               "not_checked": {"type": "array", "items": NOT_CHECKED},
                               "structural": STRUCTURAL,
                               "error": {"type": "string"}}}

_num_or_null = {"type": ["number", "null"]}

VERDICT = {"type": "object",
           "required": ["verdict", "ratio", "hdi", "p_faster", "p_slower", "p_equivalent", "rope"],
           "properties": {"verdict": {"enum": ["faster", "slower", "equivalent", "inconclusive"]},
                          "ratio": _num, "hdi": _pair, "p_faster": _prob, "p_slower": _prob,
                          "p_equivalent": _prob, "rope": _pair, "rounds": {"type": ["integer", "null"]},
                          "rope_source": _str_or_null, "floor": _num_or_null, "aa_ratio": _num_or_null,
                          "aa_hdi": {"type": ["array", "null"], "items": _num},
                          "shapes": {"type": ["array", "null"]}, "seconds": _num_or_null, "clock": _str_or_null,
                          "regime": _str_or_null,
                          "posterior_hist": {"type": ["object", "null"], "required": ["edges", "density"],
                                             "properties": {"edges": {"type": "array", "items": _num},
                                                            "density": {"type": "array", "items": _num}}}}}

# A benchmark that ran but reached no verdict (the harness failed): verdict null, error says why.
FAILED_BENCHMARK = {"type": "object", "required": ["verdict", "error"],
                    "properties": {"verdict": {"type": "null"}, "error": {"type": "string"}}}

BENCHMARK = {"anyOf": [{"type": "null"}, VERDICT, FAILED_BENCHMARK]}

_failed_by = {"type": "array", "items": {"type": "string"},
              "examples": [["finding"], ["slower"], ["inconclusive"], ["not-analysed"], ["error"]]}

KERNEL = {"type": "object", "required": ["name", "op", "entry", "status", "verification", "benchmark", "failed_by"],
          "properties": {"name": {"type": "string"}, "op": {"type": "string"}, "entry": {"type": "string"},
                         "status": {"enum": ["changed", "new", "removed", "unchanged"]},
                         "reasons": {"type": "array", "items": {"type": "string"}},
                         "verification": VERIFICATION, "benchmark": BENCHMARK,
                         "benchmark_note": _str_or_null, "error": _str_or_null,
                         "failed_by": _failed_by, "seconds": _num}}

PIPELINE = {"type": "object", "required": ["name", "members", "verification", "failed_by"],
            "properties": {"name": {"type": "string"},
                           "members": {"type": "object", "additionalProperties": {"type": "string"}},
                           "verification": VERIFICATION, "failed_by": _failed_by, "seconds": _num}}

_ref = {"type": "object", "properties": {"ref": _str_or_null, "sha": _str_or_null}}

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
        "base": _ref, "head": _ref,
        "device": {"type": "string"},
        "policy": {"type": "object", "properties": {"fail_on": {"type": "array", "items": {"type": "string"}},
                                                    "rope": _num, "budget_s": _num, "bench": {"type": "boolean"}}},
        "kernels": {"type": "array", "items": KERNEL},
        "pipelines": {"type": "array", "items": PIPELINE},
        "removed": {"type": "array", "items": {"type": "string"}},
        "repo": _str_or_null,
        "pr": {"type": ["integer", "null"]},
        "seconds": _num,
        "reproduce": {"type": "string"},
    },
}
