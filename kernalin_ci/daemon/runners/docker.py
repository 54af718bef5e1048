"""The docker runner: the job in a container of the kernalin image, through the Docker SDK.

The container has no network, a read-only root file system with a private /tmp, no
capabilities, no new privileges, memory (swap included) and pid limits, and runs as the
daemon's own uid (a daemon running as root uses the image's own unprivileged user instead,
or runner.docker.user). The checkout is mounted read-only at /repo and cloned to /tmp/repo inside
(the gate makes git worktrees, which need a writable repository); /out is the only writable
mount. A GPU slot becomes a device request for that one GPU. Past the timeout the container
is killed; it is always removed. Engine failures (no engine, no image, a refused create) are
infrastructure errors, retried by the daemon; what the job does inside is not.
"""

from __future__ import annotations

import os
import time

import requests
from docker.errors import DockerException, ImageNotFound, NotFound
from docker.types import DeviceRequest

import docker
from kernalin_ci.daemon import safefile
from kernalin_ci.daemon.runners import POLL_S, CappedLog, RunRequest, RunResult, StopReason, job_env
from kernalin_ci.daemon.settings import DockerSettings
from kernalin_ci.launch import image_module_argv

LABEL = "kernalin-ci.job"
# clone the read-only checkout (owned by another uid: safe.directory) to a writable place, put the base
# configuration in, run the command
SCRIPT = "; ".join(
    [
        "set -e",
        "mkdir -p /tmp/home",
        "printf '[safe]\\n\\tdirectory = *\\n' > /tmp/.gitconfig",
        "export GIT_CONFIG_GLOBAL=/tmp/.gitconfig",
        "git clone -q /repo /tmp/repo",
        "cp /job/kernalin.yml /tmp/repo/.kernalin.yml 2>/dev/null || true",
        "cd /tmp/repo",
        'exec "$@"',
    ]
)


class DockerRunner:
    name = "docker"

    def __init__(self, settings: DockerSettings, client=None, log_max_bytes: int = 16 * 1024 * 1024):
        self.settings = settings
        self._client = client
        self.log_max_bytes = log_max_bytes

    @property
    def client(self):
        if self._client is None:
            self._client = docker.DockerClient(base_url=self.settings.url) if self.settings.url else docker.from_env()
        return self._client

    def _create(self, req: RunRequest):
        s = self.settings
        # the image's own installation: /tmp/repo, the working directory, never comes on sys.path
        argv = req.argv(
            image_module_argv("kernalin_ci"),
            python="python3",
            config="/tmp/repo/.kernalin.yml",
            out="/out",
            repo="/tmp/repo",
        )
        # inside, the one GPU of the device request is device 0: CUDA_VISIBLE_DEVICES stays unset
        env = job_env(req, home="/tmp/home", tmp="/tmp", visible=None)
        env.pop("PATH", None)  # the image's own
        env.pop("LD_LIBRARY_PATH", None)
        volumes = {str(req.repo): {"bind": "/repo", "mode": "ro"}, str(req.out): {"bind": "/out", "mode": "rw"}}
        config = req.job_dir / "kernalin.yml"
        if config.is_file():
            volumes[str(config)] = {"bind": "/job/kernalin.yml", "mode": "ro"}
        gpu = (
            [DeviceRequest(device_ids=[req.slot.visible], capabilities=[["gpu"]])]
            if req.slot.device == "cuda"
            else None
        )
        user = s.user or (f"{os.getuid()}:{os.getgid()}" if os.getuid() != 0 else None)
        if user != f"{os.getuid()}:{os.getgid()}":  # never root inside; another user must write /out
            os.chmod(req.out, 0o1777)
        return self.client.containers.create(
            s.image,
            entrypoint=["sh", "-c", SCRIPT, "kernalin-job"],
            command=argv,
            user=user,
            environment=env,
            working_dir="/tmp",
            volumes=volumes,
            network_disabled=True,
            network_mode="none",
            mem_limit=s.memory,
            memswap_limit=s.memory,
            pids_limit=s.pids,
            read_only=True,
            tmpfs={"/tmp": f"rw,exec,nosuid,size={s.tmpfs_size}"},
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            device_requests=gpu,
            labels={LABEL: req.job_id},
            init=True,
            detach=True,
        )

    def run(self, req: RunRequest, stop_reason: StopReason, on_start) -> RunResult:
        t0 = time.monotonic()
        container = None
        try:
            container = self._create(req)
            container.start()
        except ImageNotFound:
            self._remove(container)
            return RunResult(None, 0.0, infra_error=f"docker: no image {self.settings.image!r} on this host")
        except (DockerException, requests.RequestException) as e:
            self._remove(container)
            return RunResult(None, 0.0, infra_error=f"docker: {_one_line(e)}")
        on_start(None)
        stopped, timed_out, code, oom, capture = None, False, None, False, None
        try:
            while True:
                try:
                    code = container.wait(timeout=POLL_S)["StatusCode"]
                    break
                except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                    pass
                stopped = stop_reason()
                timed_out = time.monotonic() - t0 > req.timeout_s
                if stopped or timed_out:
                    container.kill()
                    container.wait(timeout=30)
                    break
            container.reload()
            oom = bool(container.attrs.get("State", {}).get("OOMKilled"))
            with safefile.append(req.log, req.job_dir) as log:
                capture = CappedLog(log, self.log_max_bytes)
                for chunk in container.logs(stdout=True, stderr=True, stream=True):
                    capture.note(chunk)
                if timed_out:
                    capture.note(f"\nkernalin-ci daemon: the job ran past {req.timeout_s:.0f} s and was killed\n")
                if oom:
                    capture.note(
                        f"\nkernalin-ci daemon: the job was killed for using more than {self.settings.memory} "
                        f"of memory\n"
                    )
                capture.close()
        except (DockerException, requests.RequestException) as e:
            return RunResult(
                None,
                time.monotonic() - t0,
                capture.tail() if capture else "",
                infra_error=f"docker: lost the container: {_one_line(e)}",
            )
        finally:
            self._remove(container)
        return RunResult(
            None if (stopped or timed_out) else code,
            time.monotonic() - t0,
            capture.tail(),
            stopped=stopped,
            timed_out=timed_out,
            oom_killed=oom,
        )

    @staticmethod
    def _remove(container) -> None:
        if container is None:
            return
        try:
            container.remove(force=True)
        except NotFound:
            pass
        except (DockerException, requests.RequestException):
            pass  # cleanup() finds it by its label on the next start

    def cleanup(self, job_id: str) -> int:
        try:
            found = self.client.containers.list(all=True, filters={"label": f"{LABEL}={job_id}"})
        except (DockerException, requests.RequestException):
            return 0
        for c in found:
            self._remove(c)
        return len(found)


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())[:300]
