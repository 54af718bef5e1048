"""Report (plain data) and its renderers: JSON, PR-comment markdown, JUnit XML, badges, step summary.

Renderers read the Report and never recompute anything: what a renderer shows is in the data.
"""

from kernalin_ci.report.model import KernelReport, PipelineReport, Report  # noqa: F401
from kernalin_ci.report.writer import step_summary, write_all  # noqa: F401,E402
