#!/usr/bin/env bash
# Make a minimal Debian root filesystem with mmdebstrap and `docker import` it: a base image made without
# any registry. The tests build the runner image on it (tests/docker_support.py; docker/test-base.Dockerfile
# adds torch and triton, the parts of the default CUDA + PyTorch base the image relies on).
#
# Usage: docker/rootfs.sh TAG [SUITE]          (as root; SUITE defaults to bookworm)
#   KERNALIN_ROOTFS_MIRROR    a mirror URL or an apt sources file (default: the host's own apt sources)
#   KERNALIN_ROOTFS_PACKAGES  comma-separated packages (default: python3 with pip and `python`, git, CA certificates)
set -euo pipefail
tag=${1:?usage: docker/rootfs.sh TAG [SUITE]}
suite=${2:-bookworm}
packages=${KERNALIN_ROOTFS_PACKAGES:-python3,python3-pip,python-is-python3,git,ca-certificates}
mirror=${KERNALIN_ROOTFS_MIRROR:-}
if [ -z "$mirror" ]; then
  for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do
    if [ -s "$f" ]; then mirror=$f; break; fi
  done
fi
if ! command -v mmdebstrap >/dev/null; then
  echo "docker/rootfs.sh: mmdebstrap is not installed (apt-get install mmdebstrap)" >&2
  exit 2
fi
# The tarball streams from mmdebstrap into the engine; stdin is closed so mmdebstrap never reads sources from it.
# force-unsafe-io: dpkg skips its fsyncs (about twice as fast; the tarball is the only output anyway).
mmdebstrap --quiet --variant=minbase --include="$packages" --dpkgopt=force-unsafe-io \
    --aptopt='Acquire::Languages "none"' "$suite" - ${mirror:+"$mirror"} </dev/null \
  | docker import --change 'CMD ["/bin/bash"]' --message "minimal Debian $suite (docker/rootfs.sh)" - "$tag"
