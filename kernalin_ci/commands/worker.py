"""kernalin-ci worker: run gate jobs from a shared Redis (RQ) on this host's GPUs (docs/daemon.md)."""

from __future__ import annotations

from kernalin_ci.commands.serve import apply_overrides

NAME = "worker"
HELP = "take gate jobs from the daemon's Redis queue (RQ), one process per GPU of this host"
ORDER = 21


def add_arguments(p):
    p.add_argument("--config", metavar="PATH", help="daemon configuration (YAML; default $KERNALIN_DAEMON_CONFIG)")
    p.add_argument("--redis-url", metavar="URL", help="the queue (default: queue.redis_url)")
    p.add_argument("--state-dir", metavar="DIR", help="where job checkouts are made on this host")
    p.add_argument("--gpus", metavar="SPEC", help="auto, cpu, a count, or GPU indexes/UUIDs separated by commas")
    p.add_argument("--runner", choices=("local", "docker"), help="where jobs run")
    p.add_argument("--burst", action="store_true", help="exit when the queue is empty")


def run(args) -> int:
    import logging
    import multiprocessing
    import os
    import signal

    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci.daemon import gpus
    from kernalin_ci.daemon import settings as settings_mod
    from kernalin_ci.daemon.rq_backend import work

    settings = settings_mod.load(args.config)
    apply_overrides(settings, args)
    if args.redis_url:
        settings.queue.redis_url = args.redis_url
    # a worker holds no secret but the key it shares with serve (jobs and results are signed with it)
    settings.secrets = settings_mod.Secrets(result_key=settings.secrets.result_key, files=settings.secrets.files)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    slots = gpus.slots(settings.gpus, settings.cpu_slots)
    if len(slots) == 1:
        work(settings, slots[0], burst=args.burst)
        return 0
    ctx = multiprocessing.get_context("fork")
    procs = [
        ctx.Process(target=work, args=(settings, s), kwargs={"burst": args.burst}, name=f"worker-{s.name}")
        for s in slots
    ]
    for p in procs:
        p.start()

    def forward(sig, _frame):
        for p in procs:
            if p.pid:
                try:
                    os.kill(p.pid, sig)
                except ProcessLookupError:
                    pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for p in procs:
        p.join()
    return 0 if all(p.exitcode == 0 for p in procs) else 1
