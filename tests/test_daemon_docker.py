"""The docker runner on a real engine (started by .ci/run) with the locally built kernalin image
(tests/docker_support.py: fixtures docker_client and kernalin_image; skipped without an engine)."""

import importlib.util
import json
import time
from pathlib import Path

import pytest

from kernalin_ci.daemon.app import Daemon, wait_for
from kernalin_ci.daemon.deliver import deliver, get_json
from kernalin_ci.daemon.runners.docker import LABEL, DockerRunner
from kernalin_ci.daemon.safefile import tree_size
from kernalin_ci.testing.daemon_world import WEBHOOK_SECRET, World, settings_for, wait_job

docker_support = pytest.importorskip("docker_support", reason="tests/docker_support.py is not there yet")
docker_client = docker_support.docker_client
kernalin_image = docker_support.kernalin_image

pytestmark = pytest.mark.docker
# the fake gate (a script module: importing it would run it), run as a script inside the container
FAKE_GATE = Path(importlib.util.find_spec("kernalin_ci.testing.fake_gate").origin).read_text()
REPO = "acme/kernels"
# runs inside the container: looks at its own sandbox, then behaves like the fake gate
PROBE = r"""
import json, os, socket, sys, time
out = sys.argv[1]
res = {"uid": os.getuid(), "cwd": os.getcwd(), "env": dict(os.environ)}
for name, path in [("repo", "/repo/x"), ("root", "/x"), ("tmp", "/tmp/x")]:
    try:
        open(path, "w").write("x")
        res[name] = "writable"
    except OSError as e:
        res[name] = e.strerror
try:
    socket.create_connection(("1.1.1.1", 53), timeout=2)
    res["net"] = "open"
except OSError as e:
    res["net"] = e.strerror or str(e)
res["config"] = open(".kernalin.yml").read()
json.dump(res, open(os.path.join(out, "probe.json"), "w"))
time.sleep(float(os.environ.get("PROBE_SLEEP", "0")))
"""


def image_tag(image) -> str:
    if isinstance(image, str):
        return image
    return (getattr(image, "tags", None) or [image.id])[0]


@pytest.fixture
def world(tmp_path, github_standin):
    w = World(tmp_path / "world", github_standin).start()
    w.add_repo(
        REPO,
        {
            ".kernalin.yml": "version: 1\nkernels: []\n",
            "verdict.txt": "success\n",
            "probe.py": PROBE,
            "fake_gate.py": FAKE_GATE,
        },
    )
    yield w
    w.stop()


@pytest.fixture
def make_daemon(tmp_path, world, docker_client, kernalin_image):
    made = []

    def make(docker: dict | None = None, **runner) -> Daemon:
        runner_cfg = {
            "backend": "docker",
            "timeout_s": 120,
            "command": [
                "sh",
                "-c",
                'python3 probe.py "$1" && exec python3 fake_gate.py "$@"',
                "job",
                "{out}",
                "{base}",
                "{head}",
                "{device}",
            ],
            "docker": {
                "image": image_tag(kernalin_image),
                "memory": "1g",
                "pids": 256,
                "tmpfs_size": "1g",
                **(docker or {}),
            },
        }
        runner_cfg.update(runner)
        cfg = world.daemon_config(tmp_path / f"state{len(made)}", runner=runner_cfg)
        settings = settings_for(world, cfg)
        r = settings.runner
        runner = DockerRunner(
            r.docker, client=docker_client, disk_max_bytes=r.disk_max_bytes, out_max_bytes=r.out_max_bytes
        )
        d = Daemon(settings, runner=runner).start()
        made.append(d)
        return d

    yield make
    for d in made:
        d.stop()


def open_pr(world, d: Daemon, number: int, files: dict) -> str:
    repo = world.repos[REPO]
    head = repo.commit(files, f"pr {number}", branch=f"pr-{number}")
    status, answer = deliver(
        d.url + "/webhook", "pull_request", world.pull_request(REPO, number, head, repo.main), WEBHOOK_SECRET
    )
    assert status == 202
    return answer["jobs"][0]


def containers_of(client, job_id: str):
    return client.containers.list(all=True, filters={"label": f"{LABEL}={job_id}"})


def test_the_job_runs_sandboxed_and_the_container_is_removed(world, make_daemon, docker_client):
    d = make_daemon(env={"PROBE_SLEEP": "4"})
    job_id = open_pr(world, d, 1, {"verdict.txt": "failure\n", ".kernalin.yml": "version: 1\n# from the PR\n"})
    assert wait_for(lambda: containers_of(docker_client, job_id), 60)
    (c,) = containers_of(docker_client, job_id)
    host = c.attrs["HostConfig"]
    assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] is True
    assert host["Memory"] == 1024**3 and host["MemorySwap"] == 1024**3 and host["PidsLimit"] == 256
    assert host["CapDrop"] == ["ALL"] and "no-new-privileges" in host["SecurityOpt"]
    # root with only what handing each kernel worker a uid of its own takes (KERNALIN_SANDBOX=uid)
    assert sorted(host["CapAdd"]) == ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID"]
    mounts = {m["Destination"]: m["RW"] for m in c.attrs["Mounts"]}
    assert mounts == {"/repo": False, "/job/kernalin.yml": False}  # nothing of the host is writable
    # the disk cap (runner.disk_max_bytes): /tmp and /dev/shm share it
    assert host["Tmpfs"] == {"/tmp": f"rw,exec,nosuid,size={(8 << 30) - (64 << 20)}"} and host["ShmSize"] == 64 << 20
    assert c.attrs["Config"]["User"] == "0:0" and "KERNALIN_SANDBOX=uid" in c.attrs["Config"]["Env"]
    job = wait_job(lambda p: get_json(d.url + p), job_id, timeout=120)
    assert job["state"] == "done" and job["conclusion"] == "failure"
    assert containers_of(docker_client, job_id) == []
    probe = json.loads((d.settings.jobs_dir / job_id / "out" / "probe.json").read_text())
    assert probe["repo"] == "Read-only file system" and probe["root"] == "Read-only file system"
    assert probe["tmp"] == "writable" and probe["net"] != "open"
    assert probe["config"] == "version: 1\nkernels: []\n"  # the base's configuration, not the PR's
    assert not any(k.startswith(("KERNALIN_GITHUB", "KERNALIN_WEBHOOK", "GITHUB")) for k in probe["env"])
    assert WEBHOOK_SECRET not in json.dumps(probe["env"])
    (run,) = [r for r in world.standin.check_runs(REPO) if r["external_id"] == job_id]
    assert run["conclusion"] == "failure"


def test_a_container_past_its_time_is_killed_and_removed(world, make_daemon, docker_client):
    d = make_daemon(env={"PROBE_SLEEP": "300"}, timeout_s=8)
    job_id = open_pr(world, d, 2, {})
    t0 = time.monotonic()
    job = wait_job(lambda p: get_json(d.url + p), job_id, timeout=120)
    assert job["state"] == "failed" and job["conclusion"] == "timed_out" and time.monotonic() - t0 < 100
    assert containers_of(docker_client, job_id) == []


def test_a_newer_push_stops_the_container(world, make_daemon, docker_client):
    d = make_daemon(env={"PROBE_SLEEP": "300"})
    old = open_pr(world, d, 3, {})
    assert wait_for(lambda: containers_of(docker_client, old), 60)
    new = open_pr(world, d, 3, {"verdict.txt": "success\n"})
    assert wait_job(lambda p: get_json(d.url + p), old, timeout=60)["state"] == "cancelled"
    assert containers_of(docker_client, old) == []
    assert d.store.job(new).state in ("queued", "running", "done")


def test_engine_errors_are_retried_then_reported(world, make_daemon):
    d = make_daemon(docker={"image": "kernalin-ci-missing:never-built"})
    job = wait_job(lambda p: get_json(d.url + p), open_pr(world, d, 4, {}), timeout=60)
    assert job["state"] == "failed" and job["attempts"] == 3 and "no image" in job["error"]


@pytest.mark.slow
def test_the_real_gate_in_the_kernalin_image(world, make_daemon):
    """kernalin-ci run inside the container, on a tiny kv_append repository (CPU interpreter, no benchmark)."""
    kernel = (
        Path(__file__).resolve().parent.parent / "examples" / "decode-kernels" / "kernels" / "kv_cache.py"
    ).read_text()
    config = (
        "version: 1\nkernels:\n  - name: kv_append\n    op: kv_append\n    entry: kernels/kv_cache.py:append\n"
        "    params: {block_size: 16}\ngate:\n  bench: false\n"
    )
    repo = world.add_repo("acme/gate", {".kernalin.yml": config, "kernels/kv_cache.py": kernel})
    head = repo.commit(
        {"kernels/kv_cache.py": kernel.replace("one program per token", "one program per new token")},
        "docs",
        branch="pr-1",
    )
    d = make_daemon(command=None, timeout_s=900, docker={"memory": "4g", "pids": 1024})
    status, answer = deliver(
        d.url + "/webhook", "pull_request", world.pull_request("acme/gate", 1, head, repo.main), WEBHOOK_SECRET
    )
    assert status == 202
    job = wait_job(lambda p: get_json(d.url + p), answer["jobs"][0], timeout=900)
    assert job["state"] == "done" and job["conclusion"] == "success", job
    report = json.loads((d.settings.jobs_dir / job["id"] / "out" / "report.json").read_text())
    assert [(k["name"], k["status"], k["verification"]["verdict"]) for k in report["kernels"]] == [
        ("kv_append", "changed", "pass")
    ]
    assert report["device"] == "cpu" and report["head"]["sha"] == head
    assert report["isolation"]["mode"] == "uid" and report["isolation"]["uid"] >= 0x2A000000
    (run,) = [r for r in world.standin.check_runs("acme/gate") if r["external_id"] == job["id"]]
    assert run["conclusion"] == "success"


def test_a_kernel_cannot_forge_the_posted_conclusion_in_the_container(world, make_daemon):
    """Issue 29, attack 2 through the docker runner: the broken kernel's module starts a detached process that
    rewrites out/report.json to a success. The worker runs as a uid of its own: the gate's out/ is root's, and
    what the worker left is killed with its uid."""
    from hostile.forge_report import BAD, CONFIG, GOOD, KERNEL, REWRITER

    repo = world.add_repo("acme/forge", {".kernalin.yml": CONFIG, "kernels/kv_cache.py": KERNEL})
    head = repo.commit({"kernels/kv_cache.py": REWRITER + KERNEL.replace(GOOD, BAD)}, "a helper", branch="pr-2")
    d = make_daemon(command=None, timeout_s=900, docker={"memory": "4g", "pids": 1024})
    status, answer = deliver(
        d.url + "/webhook", "pull_request", world.pull_request("acme/forge", 2, head, repo.main), WEBHOOK_SECRET
    )
    assert status == 202
    job = wait_job(lambda p: get_json(d.url + p), answer["jobs"][0], timeout=900)
    assert job["state"] == "done" and job["conclusion"] == "failure", job
    out = d.settings.jobs_dir / job["id"] / "out"
    assert json.loads((out / "report.json").read_text())["conclusion"] == "failure"
    assert not (out / "report.json.forged").exists()
    (run,) = [r for r in world.standin.check_runs("acme/forge") if r["external_id"] == job["id"]]
    assert run["conclusion"] == "failure"


def test_a_link_the_job_puts_in_out_is_never_followed(world, make_daemon, tmp_path):
    """Issue 13, attack 5 through the docker runner: the container links /out/report.json to a file of
    the host that the daemon can read; the daemon must refuse it, not post what it holds."""
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"schema": 1, "conclusion": "success", "reason": "host-secret-5e1d", "kernels": []}))
    d = make_daemon(command=["sh", "-c", 'ln -s "$2" "$1/report.json"', "job", "{out}", str(secret)])
    job_id = open_pr(world, d, 5, {})
    job = wait_job(lambda p: get_json(d.url + p), job_id, timeout=120)
    assert job["state"] == "failed", job
    (run,) = [r for r in world.standin.check_runs(REPO) if r["external_id"] == job_id]
    assert "host-secret-5e1d" not in json.dumps(run["output"]) and "symbolic link" in json.dumps(run["output"])


def test_the_job_cannot_fill_the_hosts_disk(world, make_daemon, docker_client):
    """Issue 13, attack 8 through the docker runner: the job writes twice the disk cap into out/, its
    checkout, $TMPDIR, /tmp and $HOME (tests/hostile/disk_attack.py); one tmpfs of the cap holds them all."""
    cap = 4 << 20
    attack = (Path(__file__).parent / "hostile" / "disk_attack.py").read_text()
    d = make_daemon(command=["python3", "attack.py", "{out}", str(cap)], disk_max_bytes=cap, out_max_bytes=64 << 20)
    job_id = open_pr(world, d, 6, {"attack.py": attack})
    job = wait_job(lambda p: get_json(d.url + p), job_id, timeout=120)
    job_dir = d.settings.jobs_dir / job_id
    log = (job_dir / "job.log").read_text()
    found = json.loads(log.split("DISK-ATTACK ", 1)[1].splitlines()[0])
    assert sum(f["written"] for f in found.values()) <= cap, found
    assert all(f["error"] == "No space left on device" for f in found.values()), found
    assert tree_size(job_dir) <= cap + (1 << 20)
    (run,) = [r for r in world.standin.check_runs(REPO) if r["external_id"] == job_id]
    assert job["state"] == "failed" and "disk cap 4 MiB reached" in json.dumps(run["output"]), job
    assert containers_of(docker_client, job_id) == []
