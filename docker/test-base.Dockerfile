# The tests' stand-in for the default BASE_IMAGE of ../Dockerfile (a CUDA + PyTorch image, which no test can
# pull): a root file system made by docker/rootfs.sh (Debian, python3 with pip, git) plus torch, triton and
# numpy, the parts of a PyTorch image the runner image relies on. tests/docker_support.py builds it with
# PACKAGES pinned to the test environment's versions and pip pointed at a local wheel directory.
# Few instructions on purpose: with the vfs storage driver every instruction copies the whole file system.
ARG ROOTFS=kernalin-test/rootfs:bookworm
FROM ${ROOTFS}
ARG PACKAGES="torch triton numpy" PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_FIND_LINKS PIP_NO_INDEX PIP_TRUSTED_HOST
RUN set -eux; \
    python3 -m pip install --break-system-packages --no-cache-dir --disable-pip-version-check $PACKAGES; \
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
