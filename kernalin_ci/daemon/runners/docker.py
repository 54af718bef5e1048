"""The docker runner: the job in a container of the kernalin image, through the Docker SDK.

The container has no network, a read-only root file system, no new privileges, memory (swap included)
and pid limits. The gate runs as the container's root with only the capabilities it needs to hand
each kernel worker an unprivileged uid of its own and to clean up after it (KERNALIN_SANDBOX=uid,
kernalin_ci/sandbox/: bubblewrap cannot make namespaces under the engine's default seccomp
profile): the pull request's code never shares a uid with the gate, so it can neither write the
gate's files (its report, the next worker's job) nor signal or trace it. With runner.docker.user
set, the job runs as that user instead (and needs runner.env KERNALIN_SANDBOX set by the operator:
`off` runs kernel code as that same user, trusted repositories only). Everything the job writes
counts against `runner.disk_max_bytes` (the disk cap; its pages count against the memory limit too):
/dev/shm is `sandbox.shm_share` of it, the rest one tmpfs, /tmp, for all else: the checkout, mounted
read-only at /repo, is cloned to /tmp/repo (the gate makes git worktrees, which need a writable
repository), HOME is /tmp/home and out/ is /tmp/out. Nothing of the job is on the host's disk while
it runs, its output included: the container's main process only sleeps (so the engine logs nothing)
and the job runs as an exec whose output is streamed into job.log up to its cap. Afterwards /tmp/out
is read back through an exec's tar stream, up to `runner.out_max_bytes` (daemon/outstream.py), and
the container is removed. A GPU slot becomes a device request for that one GPU. Past the timeout the
container is killed. Engine failures (no engine, no image, a refused create) are infrastructure
errors, retried by the daemon; what the job does inside is not.
"""

from __future__ import annotations

import threading
import time

import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import DeviceRequest

import docker
from kernalin_ci.daemon import outstream, safefile
from kernalin_ci.daemon.runners.protocol import (
    DISK_FULL_BELOW,
    POLL_S,
    CappedLog,
    RunRequest,
    RunResult,
    StopReason,
    disk_full_message,
    job_env,
)
from kernalin_ci.daemon.settings import DockerSettings
from kernalin_ci.device import DEVICES
from kernalin_ci.launch import image_module_argv
from kernalin_ci.sandbox import shm_share

LABEL = "kernalin-ci.job"
OUT = "/tmp/out"  # the job's out/, on its capped tmpfs
# clone the read-only checkout (owned by another uid: safe.directory) to a writable place, put the base
# configuration in, run the command
SCRIPT = "; ".join(
    [
        "set -e",
        "mkdir -p /tmp/home /tmp/out",
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

    def __init__(
        self,
        settings: DockerSettings,
        client=None,
        log_max_bytes: int = 16 * 1024 * 1024,
        disk_max_bytes: int = 8 << 30,
        out_max_bytes: int = 256 << 20,
    ):
        self.settings = settings
        self._client = client
        self.log_max_bytes = log_max_bytes
        self.disk_max_bytes, self.out_max_bytes = disk_max_bytes, out_max_bytes

    @property
    def client(self):
        if self._client is None:
            self._client = docker.DockerClient(base_url=self.settings.url) if self.settings.url else docker.from_env()
        return self._client

    def _create(self, req: RunRequest):
        s = self.settings
        # inside, the one GPU of the device request is device 0: CUDA_VISIBLE_DEVICES stays unset
        env = job_env(req, home="/tmp/home", tmp="/tmp", visible=None)
        env.pop("PATH", None)  # the image's own
        env.pop("LD_LIBRARY_PATH", None)
        volumes = {str(req.repo): {"bind": "/repo", "mode": "ro"}}
        config = req.job_dir / "kernalin.yml"
        if config.is_file():
            volumes[str(config)] = {"bind": "/job/kernalin.yml", "mode": "ro"}
        gpu = (
            [DeviceRequest(device_ids=[req.slot.visible], capabilities=[["gpu"]])]
            if DEVICES[req.slot.device].gpu
            else None
        )
        user = s.user or "0:0"
        env.setdefault("KERNALIN_SANDBOX", "uid")  # a kernel worker per uid (runner.env may say otherwise)
        # root without the rest of root's capabilities: enough to switch a worker's uid, give it its folders, read
        # what it wrote and kill what it left; nothing else (no mounts, no raw sockets, no ptrace)
        caps = [] if s.user else ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETUID", "SETGID"]
        return self.client.containers.create(
            s.image,
            entrypoint=["sleep", "infinity"],  # the job is an exec (run()); this only keeps /tmp mounted
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
            tmpfs={"/tmp": f"rw,exec,nosuid,size={self.disk_max_bytes - shm_share(self.disk_max_bytes)}"},
            shm_size=shm_share(self.disk_max_bytes),
            cap_drop=["ALL"],
            cap_add=caps,
            security_opt=["no-new-privileges"],
            device_requests=gpu,
            labels={LABEL: req.job_id},
            init=True,
            detach=True,
        )

    def run(self, req: RunRequest, stop_reason: StopReason, on_start) -> RunResult:
        t0 = time.monotonic()
        container = None
        # the image's own installation: /tmp/repo, the working directory, never comes on sys.path
        argv = req.argv(
            image_module_argv("kernalin_ci"),
            python="python3",
            config="/tmp/repo/.kernalin.yml",
            out=OUT,
            repo="/tmp/repo",
        )
        try:
            container = self._create(req)
            container.start()
            api = self.client.api
            exec_id = api.exec_create(container.id, ["sh", "-c", SCRIPT, "kernalin-job", *argv], workdir="/tmp")["Id"]
            output = api.exec_start(exec_id, stream=True)
        except ImageNotFound:
            self._remove(container)
            return RunResult(None, 0.0, infra_error=f"docker: no image {self.settings.image!r} on this host")
        except (DockerException, requests.RequestException) as e:
            self._remove(container)
            return RunResult(None, 0.0, infra_error=f"docker: {_one_line(e)}")
        on_start(None)
        stopped, timed_out, code, oom, capture, job_error = None, False, None, False, None, None
        try:
            with safefile.append(req.log, req.job_dir) as log:
                capture = CappedLog(log, self.log_max_bytes)
                pump = threading.Thread(target=_pump, args=(output, capture), name=f"log-{req.job_id}", daemon=True)
                pump.start()
                while True:
                    state = api.exec_inspect(exec_id)
                    if not state.get("Running") and state.get("ExitCode") is not None:
                        code = state["ExitCode"]
                        break
                    stopped = stop_reason()
                    timed_out = time.monotonic() - t0 > req.timeout_s
                    if stopped or timed_out:
                        break
                    pump.join(POLL_S) if pump.is_alive() else time.sleep(POLL_S)
                if not (stopped or timed_out):
                    job_error = self._hand_back(container, req)
                _kill(container)  # the job, what it left running, and so the end of its output stream
                container.wait(timeout=30)
                pump.join(10)
                container.reload()
                oom = bool(container.attrs.get("State", {}).get("OOMKilled"))
                if timed_out:
                    capture.note(f"\nkernalin-ci daemon: the job ran past {req.timeout_s:.0f} s and was killed\n")
                elif job_error:
                    capture.note(f"\nkernalin-ci daemon: {job_error}\n")
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
            job_error=job_error,
        )

    def _hand_back(self, container, req: RunRequest) -> str | None:
        """After the job: whether it filled its disk, and its out/ read back into req.out (up to the caps)."""
        api = self.client.api
        free = None
        probe = api.exec_create(container.id, ["stat", "-f", "-c", "%a %S", "/tmp", "/dev/shm"], user="")["Id"]
        try:
            spaces = [line.split() for line in api.exec_start(probe).decode().splitlines()]
            free = min(int(blocks) * int(size) for blocks, size in spaces)
        except ValueError:
            pass
        error = None
        # an exec's tar, not the engine's archive API: that one does not see inside a tmpfs
        pack = api.exec_create(container.id, ["tar", "-C", "/tmp", "--numeric-owner", "-cf", "-", "out"], user="")
        stream = api.exec_start(pack["Id"], stream=True, demux=True)
        try:
            outstream.unpack(_ChunkReader(out for out, _ in stream if out), req.out, self.out_max_bytes)
        except outstream.BadOutput as e:
            error = str(e)
        except OSError as e:
            error = f"cannot unpack it ({e.strerror or e})"
        if error:
            safefile.remove(req.out)
            req.out.mkdir()
        if free is not None and free < DISK_FULL_BELOW:
            return disk_full_message(self.disk_max_bytes)
        return f"out/ refused: {error}" if error else None

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


class _ChunkReader:
    """A file object over an iterator of byte chunks (the engine's archive), for tarfile's stream mode."""

    def __init__(self, chunks):
        self.chunks, self.buf = iter(chunks), b""

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self.buf) < n:
            chunk = next(self.chunks, None)
            if chunk is None:
                break
            self.buf += chunk
        if n < 0:
            n = len(self.buf)
        data, self.buf = self.buf[:n], self.buf[n:]
        return data


def _kill(container) -> None:
    try:
        container.kill()
    except APIError as e:
        if e.status_code != 409:  # 409: it is not running any more
            raise


def _pump(output, capture: CappedLog) -> None:
    try:
        for chunk in output:
            capture.note(chunk)
    except (DockerException, requests.RequestException, OSError):
        pass  # the container was killed: its output ends here


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())[:300]
