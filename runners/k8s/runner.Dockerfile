# The ARC runner image for runners/k8s/values-gpu-runners.yaml: GitHub's actions runner, plus git, Python
# and a CUDA build of torch (with its triton) for the kernalin-ci Action to reuse.
#   docker build -f runners/k8s/runner.Dockerfile -t registry.example.com/kernalin-ci-runner:latest .
ARG RUNNER_IMAGE=ghcr.io/actions/actions-runner:latest
FROM ${RUNNER_IMAGE}
USER root
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends git python3 python3-pip python3-venv \
 && rm -rf /var/lib/apt/lists/*
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
RUN python3 -m pip install --no-cache-dir --break-system-packages --index-url "${TORCH_INDEX_URL}" torch
COPY pyproject.toml /opt/kernalin/pyproject.toml
COPY kernalin_ci /opt/kernalin/kernalin_ci
COPY checks /opt/kernalin/checks
# Chart.js for the Action's dashboard input, fetched and checked now (the Action's own venv reads it
# through KERNALIN_CHARTJS; docs/history.md)
ENV KERNALIN_CHARTJS=/opt/kernalin/chartjs/chart.umd.min.js
RUN python3 -m pip install --no-cache-dir --break-system-packages "/opt/kernalin[github]" \
 && kernalin-ci dashboard --fetch-assets
ENV KERNALIN_CHECKS=/opt/kernalin/checks
USER runner
