"""kernalin-ci serve: the CI gate daemon, a GitHub App webhook server (docs/daemon.md)."""

from __future__ import annotations

NAME = "serve"
HELP = "run the CI gate daemon: GitHub App webhooks, a durable job queue, one job per GPU"
ORDER = 20


def add_arguments(p):
    p.add_argument("--config", metavar="PATH", help="daemon configuration (YAML; default $KERNALIN_DAEMON_CONFIG)")
    p.add_argument("--listen", metavar="HOST:PORT", help="address to listen on (default 127.0.0.1:8080)")
    p.add_argument("--state-dir", metavar="DIR", help="where the job database and job directories live")
    p.add_argument("--gpus", metavar="SPEC", help="auto, cpu, a count, or GPU indexes/UUIDs separated by commas")
    p.add_argument("--runner", choices=("local", "docker"), help="where jobs run")
    p.add_argument("--queue", choices=("sqlite", "redis"), help="sqlite: this host's slots; redis: RQ workers")


def apply_overrides(settings, args) -> None:
    """Command-line options win over the file and the environment."""
    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci.daemon.settings import parse_gpus

    if getattr(args, "listen", None):
        settings.listen = args.listen
    if getattr(args, "state_dir", None):
        settings.state_dir = args.state_dir
    if getattr(args, "gpus", None):
        settings.gpus = parse_gpus(args.gpus)
    if getattr(args, "runner", None):
        settings.runner.backend = args.runner
    if getattr(args, "queue", None):
        settings.queue.backend = args.queue


def run(args) -> int:
    import logging

    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci.daemon import settings as settings_mod
    from kernalin_ci.daemon.app import Daemon

    settings = settings_mod.load(args.config)
    apply_overrides(settings, args)
    settings_mod.require_serving_secrets(settings)
    if settings.queue.backend == "redis":
        # deferred: keeps the CLI's startup light (`--help` loads every command module)
        from kernalin_ci.daemon.rq_backend import require_key

        require_key(settings)
    # deferred: keeps the CLI's startup light (`--help` loads every command module)
    from kernalin_ci.launch import make_undumpable

    make_undumpable()  # a job of the same uid cannot read this process's environment or memory
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    daemon = Daemon(settings).start()
    print(f"kernalin-ci serve: listening on {daemon.url}", flush=True)
    daemon.serve_forever()
    return 0
