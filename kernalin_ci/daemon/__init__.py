"""The CI gate daemon: GitHub App webhooks in, gate jobs run on free GPUs in isolation, results out.

    webhook.py   signature check; a delivery -> Intents (jobs to queue, to cancel, installations)
    store.py     the durable queue (SQLite, WAL): deliveries, jobs and their states, what was posted
    server.py    HTTP: /webhook, /healthz, /metrics, /badge/OWNER/REPO.svg|.json, /jobs/ID
    scheduler.py one thread per slot (GPU or CPU) running queued jobs   (queue.backend: sqlite)
    rq_backend.py  jobs through a shared Redis to `kernalin-ci worker` processes (queue.backend: redis)
    execute.py   one job: fetch, base config, fork policy, runner, report.json -> Outcome
    workspace.py the job's checkout, fetched by the daemon; .kernalin.yml from the BASE commit
    policy.py    forks wait for a maintainer's label
    runners/     local (subprocess) and docker (container) backends behind one protocol
    jobwrap.py   the first process in the local runner's sandbox: checkout in, out/ back as a tar stream
    outstream.py a job's out/ from a tar stream, read up to its caps, links and escapes refused
    gpus.py      slots: GPUs by UUID, or CPU slots (the Triton interpreter)
    poster.py    check runs and the sticky comment, idempotent by external_id = job id
    recorder.py  history: merged pull requests -> runs in the history store (a thread)
    github_app.py  App installation clients, read-only fetch tokens
    metrics.py   Prometheus text format
    settings.py  the YAML file + environment; secrets from env or files
    app.py       Daemon: everything above started and stopped together
    deliver.py   sign and send deliveries (tests, benchmarks, replaying by hand)

docs/daemon.md describes the job state machine, crash recovery and the configuration.
"""
