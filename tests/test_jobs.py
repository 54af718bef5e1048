"""The worker boundary (kernalin_ci/jobs.py, kernel_worker.TASKS): every task has one typed job, and a job
reads back from the JSON the parent writes as the job it was (nested cases, domains, specs, instances)."""

from __future__ import annotations

import json

from kernalin_ci import jobs
from kernalin_ci.cuda.sources import CudaSpec
from kernalin_ci.domain import Domain
from kernalin_ci.kernel_worker import TASKS
from kernalin_ci.ops.base import Case
from kernalin_ci.throughput.spec import ModelSpec, ServingPoint


def _job_types() -> set[type]:
    out, todo = set(), [jobs.WorkerJob]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if "TASK" in vars(sub):
                out.add(sub)
    return out


def test_each_task_is_named_by_its_job_type():
    assert {name: t.job.TASK for name, t in TASKS.items()} == {name: name for name in TASKS}
    assert {t.job for t in TASKS.values()} == _job_types()


def test_a_job_reads_back_as_written():
    case = Case("c", {"B": 2, "D": 64}, "bfloat16", 3, ("huge",))
    bench = jobs.BenchJob(
        op="rope",
        params={"style": "neox"},
        cases=(case,),
        instances=(jobs.Instance(name="base", entry="k.py:f", root="/r"), jobs.Instance(name="head", entry="m:f")),
        reps=3,
        budget_s=1.5,
        max_rounds=None,
        seed=7,
        l2_flush=False,
        rope=None,
        rope_min=0.02,
        regime="cold",
        reference=2,
    )
    race = jobs.RaceSchedule(finalists=2, screen_rounds=3, final_chunks=(4, 8), min_final_rounds=5)
    examples = [
        bench,
        jobs.RaceJob.of(bench, race),
        jobs.DynamicJob(op="rope", entry="k.py:f", cases=(case,), start=1, domain=Domain(head_dim=(64, 128))),
        jobs.ModelJob(
            spec=ModelSpec("custom", 1, 64, 2, 1, 32, 128, 100, serving=[ServingPoint(1, 16)]),
            instances=(jobs.ModelInstance(name="base", roles={"rope": jobs.EntryAt(entry="k.py:f", root="/r")}),),
            reps=1,
            budget_s=1.0,
            max_rounds=4,
            seed=0,
            l2_flush=True,
            rope=0.01,
            rope_min=0.01,
        ),
        jobs.BuildJob(cuda=CudaSpec(sources=("a.cu",)), op="rope", entry="k.py:f", root="/r"),
        jobs.ProfileJob(op="rope", entry="k.py:f", case=case),
        jobs.EnvJob(copy=True),
    ]
    for job in examples:
        sent = json.loads(json.dumps(job.to_json()))
        assert type(job).from_json(sent) == job, type(job).__name__
    assert jobs.RaceJob.of(bench, race).race.final_chunks == (4, 8)
