"""Docker for tests: a reachable engine, a base image made without any registry, the kernalin-ci image.

    from docker_support import docker_client, kernalin_image, run_container  # noqa: F401 (fixtures)

    @pytest.mark.docker
    def test_x(docker_client, kernalin_image):
        r = run_container(docker_client, kernalin_image, ["verify", "--op", "rope", ...], timeout=600)
        assert r.exit_code == 0, r.output

Fixtures (session scope; both skip when no Docker engine answers):
    docker_client   a docker.DockerClient for DOCKER_HOST or the local socket
    kernalin_image  the tag of the runner image built from ./Dockerfile (IMAGE_TAG), built once per session

Functions:
    engine() -> DockerClient | None
    run_container(client, image, command, *, timeout=600, network="none", **create_kwargs) -> ContainerResult
        ContainerResult(exit_code: int | None (None: killed at the timeout), stdout, stderr, seconds).output
    build_kernalin_image(client, *, base_image=None, tag=IMAGE_TAG) -> tag
    stand_in_base_image(client) -> tag          the BASE_IMAGE the tests use
    `python tests/docker_support.py` builds the image ahead of the tests.

No registry is reachable, so BASE_IMAGE is made here (`stand_in_base_image`): docker/rootfs.sh makes a
minimal Debian (python3, pip, git) with mmdebstrap and imports it, docker/test-base.Dockerfile adds torch,
triton and numpy pinned to this test environment's versions. Every pip install inside a build reads a
local wheel directory (`wheelhouse`) served on 127.0.0.1 (the builds use the host's network): the
wheels come from the package index this machine's pip is configured for, so nothing in the repository
names an index. Images are tagged by what they were made from and reused; the runner image is rebuilt
each session on the engine's layer cache (seconds when nothing changed).

Environment:
    KERNALIN_TEST_BASE_IMAGE  use this image as BASE_IMAGE instead of making one (python, pip, torch, triton)
    KERNALIN_DOCKER_CACHE     wheels, build logs and the build lock (default: .cache/docker in the repository)
"""

from __future__ import annotations

import contextlib
import email.parser
import fcntl
import functools
import hashlib
import http.server
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parent.parent
DOCKER_DIR = REPO / "docker"
ROOTFS_REPOSITORY = "kernalin-test/rootfs"
BASE_REPOSITORY = "kernalin-test/base"
IMAGE_TAG = "kernalin-ci:test"
BASE_PACKAGES = ("torch", "triton", "numpy")  # what a PyTorch base image brings
EXTRAS = ("github", "daemon")  # what ./Dockerfile installs: /opt/kernalin[github,daemon]


# ---------------------------------------------------------------- the engine


def engine(timeout_s: float = 10):
    """A docker.DockerClient when an engine answers, else None."""
    try:
        import docker

        client = docker.from_env(timeout=timeout_s)
        client.ping()
        return client
    except Exception:
        return None


@pytest.fixture(scope="session")
def docker_client():
    client = engine()
    if client is None:
        pytest.skip("no Docker engine answers (DOCKER_HOST or /var/run/docker.sock; .ci/run starts one)")
    yield client
    client.close()


@pytest.fixture(scope="session")
def kernalin_image(docker_client) -> str:
    try:
        return build_kernalin_image(docker_client)
    except MissingTool as e:
        pytest.skip(str(e))


# ---------------------------------------------------------------- running a container


@dataclass
class ContainerResult:
    exit_code: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return f"exit {self.exit_code} after {self.seconds:.0f} s\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


def run_container(
    client, image: str, command: list[str], *, timeout: float = 600, network: str = "none", **create_kwargs
) -> ContainerResult:
    """Run IMAGE with COMMAND (the entrypoint's arguments), wait at most TIMEOUT seconds, always remove
    the container. create_kwargs go to client.containers.create (volumes, environment, user, entrypoint...)."""
    import requests

    t0 = time.perf_counter()
    container = client.containers.create(image, command, network_mode=network, detach=True, **create_kwargs)
    try:
        container.start()
        try:
            code = container.wait(timeout=timeout)["StatusCode"]
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            container.kill()
            code = None
        stdout = container.logs(stdout=True, stderr=False).decode(errors="replace")
        stderr = container.logs(stdout=False, stderr=True).decode(errors="replace")
    finally:
        container.remove(force=True)
    return ContainerResult(code, stdout, stderr, time.perf_counter() - t0)


# ---------------------------------------------------------------- building


class MissingTool(RuntimeError):
    """A tool needed to make the base image is not installed (the tests skip)."""


class BuildFailed(RuntimeError):
    pass


def cache_dir() -> Path:
    d = Path(os.environ.get("KERNALIN_DOCKER_CACHE") or REPO / ".cache" / "docker")
    d.mkdir(parents=True, exist_ok=True)
    return d


def log_line(msg: str) -> None:
    line = f"{time.strftime('%H:%M:%S')} {msg}"
    print(f"docker_support: {line}", file=sys.stderr, flush=True)
    with open(cache_dir() / "build.log", "a") as f:
        f.write(line + "\n")


@contextlib.contextmanager
def build_lock():
    """One build at a time on this machine (two test sessions share the engine and the tags)."""
    with open(cache_dir() / "build.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def image_exists(client, tag: str) -> bool:
    import docker

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def pinned(requirement: str) -> str:
    """'scipy>=1.10' -> 'scipy==<the version installed here>' (extras kept), so the image runs what the tests
    run; a package not installed here keeps its specifier."""
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?", requirement)
    name, extras = m.group(1), m.group(2) or ""
    try:
        return f"{name}{extras}=={importlib.metadata.version(name)}"
    except importlib.metadata.PackageNotFoundError:
        return requirement


def image_requirements() -> list[str]:
    """Everything the runner image's pip installs: the project's dependencies with its EXTRAS, and the build
    backend (pip builds the package from source in an isolated environment)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    reqs = project["project"]["dependencies"] + project["build-system"]["requires"] + ["wheel"]
    for extra in EXTRAS:
        reqs = reqs + project["project"]["optional-dependencies"][extra]
    return sorted({pinned(r) for r in reqs})


# The target interpreter's marker environment (PEP 508): its python_full_version may differ from this one's,
# and with it the dependencies (redis needs async-timeout below Python 3.11.3; Debian 12 has 3.11.2).
MARKER_ENVIRONMENT = """
import json, os, platform, sys
v = sys.implementation.version
print(json.dumps({"implementation_name": sys.implementation.name,
                  "implementation_version": f"{v.major}.{v.minor}.{v.micro}", "os_name": os.name,
                  "platform_machine": platform.machine(), "platform_release": platform.release(),
                  "platform_system": platform.system(), "platform_version": platform.version(),
                  "platform_python_implementation": platform.python_implementation(),
                  "python_full_version": platform.python_version(),
                  "python_version": ".".join(platform.python_version_tuple()[:2]), "sys_platform": sys.platform}))
"""


@functools.cache
def marker_environment(client, image: str) -> dict:
    """The PEP 508 marker environment of IMAGE's python3."""
    r = run_container(client, image, ["-c", MARKER_ENVIRONMENT], entrypoint=["python3"], timeout=300)
    if r.exit_code != 0:
        raise BuildFailed(f"{image}: python3 does not run\n{r.output}")
    return json.loads(r.stdout)


def _pip_download(dest: Path, requirements: list[str], *more: str) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--disable-pip-version-check",
            "--only-binary=:all:",
            "--dest",
            str(dest),
            *more,
            *requirements,
        ],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise BuildFailed(f"pip download failed:\n{r.stderr[-3000:]}")


def _wheels(d: Path) -> dict:
    from packaging.utils import canonicalize_name, parse_wheel_filename

    return {canonicalize_name(parse_wheel_filename(p.name)[0]): p for p in d.glob("*.whl")}


def _requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        return email.parser.Parser().parsestr(z.read(name).decode()).get_all("Requires-Dist") or []


def wheelhouse(requirements: list[str], target: dict) -> Path:
    """A directory holding wheels for REQUIREMENTS and their dependencies for the interpreter whose marker
    environment is TARGET, fetched with this machine's pip configuration (its index, its find-links)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    d = cache_dir() / "wheels"
    d.mkdir(exist_ok=True)
    key = json.dumps([sorted(requirements), target], sort_keys=True).encode()
    stamp = d / f".done-{hashlib.sha256(key).hexdigest()[:16]}"
    if stamp.exists():
        return d
    t0 = time.perf_counter()
    _pip_download(d, requirements)  # resolved for this interpreter: consistent versions of almost everything
    # then what the target needs beyond that: walk the dependency closure with the target's markers
    todo, seen = [Requirement(r) for r in requirements], set()
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if (name, frozenset(req.extras)) in seen:
            continue
        seen.add((name, frozenset(req.extras)))
        if name not in _wheels(d):
            _pip_download(d, [str(Requirement(f"{req.name}{req.specifier}"))], "--no-deps")
        for dep in map(Requirement, _requires(_wheels(d)[name])):
            extras = req.extras or {""}
            if dep.marker is None or any(dep.marker.evaluate({**target, "extra": e}) for e in extras):
                todo.append(dep)
    stamp.touch()
    log_line(
        f"wheelhouse for Python {target['python_full_version']}: {len(_wheels(d))} wheels "
        f"in {time.perf_counter() - t0:.0f} s"
    )
    return d


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def serve_directory(path: Path):
    """Serve PATH on 127.0.0.1 (a pip --find-links URL for builds on the host's network); yields the URL.
    The port is derived from PATH when it is free: the URL is a build argument, and an unchanged one keeps
    the engine's layer cache valid from one session to the next."""
    handler = functools.partial(_QuietHandler, directory=str(path))
    preferred = 20000 + int(hashlib.sha256(str(path).encode()).hexdigest(), 16) % 20000
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", preferred), handler)
    except OSError:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def pip_offline_args(url: str) -> dict:
    return {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": url}


def build(client, context: Path, tag: str, *, dockerfile: str = "Dockerfile", buildargs: dict | None = None) -> str:
    """docker build (the engine's builder, host network, intermediate containers removed); returns TAG.
    The whole build output goes to build.log in the cache directory."""
    t0 = time.perf_counter()
    before = client.images.get(tag).id if image_exists(client, tag) else None
    lines: list[str] = []
    with open(cache_dir() / "build.log", "a") as log:
        log.write(f"\n=== build {tag} from {context}/{dockerfile}\n")
        try:
            stream = client.api.build(
                path=str(context),
                dockerfile=dockerfile,
                tag=tag,
                buildargs=buildargs or {},
                network_mode="host",
                rm=True,
                forcerm=True,
                decode=True,
            )
            for chunk in stream:
                text = chunk.get("stream") or chunk.get("status") or ""
                if text:
                    log.write(text)
                    lines.append(text)
                if "error" in chunk:
                    raise BuildFailed(f"docker build {tag}: {chunk['error'].strip()}\n" + "".join(lines[-40:]))
        finally:
            log.flush()
    if not image_exists(client, tag):
        raise BuildFailed(f"docker build {tag}: no image at the end\n" + "".join(lines[-40:]))
    if before and before != client.images.get(tag).id:  # the image this build replaced: no tag, no use
        with contextlib.suppress(Exception):
            client.images.remove(before)
    log_line(f"built {tag} in {time.perf_counter() - t0:.0f} s")
    return tag


def rootfs_image(client) -> str:
    """A minimal Debian imported from a tarball (docker/rootfs.sh), made once per version of the script."""
    script = DOCKER_DIR / "rootfs.sh"
    tag = f"{ROOTFS_REPOSITORY}:bookworm-{hashlib.sha256(script.read_bytes()).hexdigest()[:12]}"
    if image_exists(client, tag):
        return tag
    if shutil.which("mmdebstrap") is None:
        raise MissingTool(
            "mmdebstrap is not installed: no base image can be made without a registry "
            "(apt-get install mmdebstrap, or set KERNALIN_TEST_BASE_IMAGE)"
        )
    t0 = time.perf_counter()
    r = subprocess.run([str(script), tag], capture_output=True, text=True)
    with open(cache_dir() / "build.log", "a") as log:
        log.write(f"\n=== docker/rootfs.sh {tag}\n{r.stdout}{r.stderr}")
    if r.returncode != 0 or not image_exists(client, tag):
        raise BuildFailed(f"docker/rootfs.sh failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    log_line(f"made {tag} in {time.perf_counter() - t0:.0f} s")
    return tag


def stand_in_base_image(client) -> str:
    """BASE_IMAGE for the tests: KERNALIN_TEST_BASE_IMAGE, or Debian + Python + torch/triton/numpy at this
    environment's versions, tagged by what it is made of."""
    if os.environ.get("KERNALIN_TEST_BASE_IMAGE"):
        return os.environ["KERNALIN_TEST_BASE_IMAGE"]
    packages = [pinned(p) for p in BASE_PACKAGES]
    rootfs = rootfs_image(client)
    recipe = (DOCKER_DIR / "test-base.Dockerfile").read_bytes() + " ".join([rootfs, *packages]).encode()
    tag = f"{BASE_REPOSITORY}:{hashlib.sha256(recipe).hexdigest()[:12]}"
    if image_exists(client, tag):
        return tag
    with serve_directory(wheelhouse(packages, marker_environment(client, rootfs))) as url:
        return build(
            client,
            DOCKER_DIR,
            tag,
            dockerfile="test-base.Dockerfile",
            buildargs={"ROOTFS": rootfs, "PACKAGES": " ".join(packages), **pip_offline_args(url)},
        )


def build_kernalin_image(client, *, base_image: str | None = None, tag: str = IMAGE_TAG) -> str:
    """Build ./Dockerfile with BASE_IMAGE (default: stand_in_base_image) into TAG; returns TAG. Chart.js is
    fetched on the host first (into kernalin_ci/dashboard/vendor/, part of the build context), so the build's
    own `--fetch-assets` checks that copy instead of reaching the npm registry through a pip-installed npm."""
    from kernalin_ci.dashboard import assets

    assets.fetch_chartjs(assets.VENDOR / assets.CHARTJS_FILE)
    with build_lock():
        base = base_image or stand_in_base_image(client)
        with serve_directory(wheelhouse(image_requirements(), marker_environment(client, base))) as url:
            return build(client, REPO, tag, buildargs={"BASE_IMAGE": base, **pip_offline_args(url)})


if __name__ == "__main__":  # build ahead of the tests: python tests/docker_support.py
    c = engine()
    if c is None:
        sys.exit("docker_support: no Docker engine answers")
    t = time.perf_counter()
    print(build_kernalin_image(c), f"({time.perf_counter() - t:.0f} s)")
