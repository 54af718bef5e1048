"""Runner backends: where a job's command runs. One short protocol, one module per backend.

    local   a subprocess in the job's checkout, in its own session (killed as a group)
    docker  a container of the kernalin image: no network, the checkout read-only, memory and pid
            limits, the GPU by a device request, removed afterwards

A runner gets a RunRequest and a `stop_reason()` callable it polls (a newer push cancelled the
job, or the daemon is stopping) and returns a RunResult. It never sees a secret: the job's
environment is built from nothing (`job_env`), not inherited.

The protocol and what every backend shares are in protocol.py; this package picks the backend (`get_runner`).
"""

from __future__ import annotations

from kernalin_ci.daemon.runners.local import LocalRunner
from kernalin_ci.daemon.runners.protocol import Runner


def get_runner(settings) -> Runner:
    """The backend named in settings.runner.backend."""
    if settings.runner.backend == "docker":
        # deferred: an optional dependency (the docker package), imported only where the docker backend is chosen
        from kernalin_ci.daemon.runners.docker import DockerRunner

        return DockerRunner(
            settings.runner.docker,
            log_max_bytes=settings.runner.log_max_bytes,
            disk_max_bytes=settings.runner.disk_max_bytes,
            out_max_bytes=settings.runner.out_max_bytes,
        )
    return LocalRunner(
        settings.runner.sandbox,
        hide=settings.private_paths(),
        log_max_bytes=settings.runner.log_max_bytes,
        disk_max_bytes=settings.runner.disk_max_bytes,
        out_max_bytes=settings.runner.out_max_bytes,
    )
