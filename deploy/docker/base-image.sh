#!/usr/bin/env bash
# A base image for deploy/docker/Dockerfile made from Debian's packages, for engines
# that cannot pull python:3.11-slim (no registry reachable):
#
#   deploy/docker/base-image.sh [TAG]          # default drover-base:bookworm
#   docker build --build-arg BASE_IMAGE=drover-base:bookworm ...
#
# debootstrap (minbase: essential packages only) writes a Debian bookworm root file
# system with Python 3.11, venv and the CA certificates; `docker import` makes it an
# image. Needs root, debootstrap and a reachable Debian mirror (DEBIAN_MIRROR, the
# default deb.debian.org). Does nothing when TAG already exists (DROVER_REBUILD=1
# makes it again).
#
# The host's own certificate authorities (HOST_CA_DIR, default
# /usr/local/share/ca-certificates: a site's proxy or mirror CA) are added to the
# image's store, and pip is pointed at that store (PIP_CERT), so a build behind the
# same proxy as the host reaches the package index. HOST_CA_DIR= leaves them out.
set -euo pipefail

tag="${1:-drover-base:bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
host_cas="${HOST_CA_DIR-/usr/local/share/ca-certificates}"

if [[ "${DROVER_REBUILD:-0}" != 1 ]] && docker image inspect "$tag" >/dev/null 2>&1; then
    echo "base image $tag exists"
    exit 0
fi
command -v debootstrap >/dev/null || {
    echo "base-image.sh: debootstrap is missing (apt-get install debootstrap)" >&2
    exit 1
}

rootfs="$(mktemp -d)"
chmod 755 "$rootfs"  # it becomes the image's /: mktemp made it private
trap 'rm -rf "$rootfs"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$rootfs" "$mirror"
if [[ -n "$host_cas" ]] && compgen -G "$host_cas/*.crt" >/dev/null; then
    cp "$host_cas"/*.crt "$rootfs/usr/local/share/ca-certificates/"
    chroot "$rootfs" update-ca-certificates >/dev/null
    echo "added the host's CAs from $host_cas"
fi
# Nothing the image does not need: package lists and caches, docs and man pages.
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*
tar -C "$rootfs" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
    --change 'CMD ["python3"]' \
    - "$tag"
echo "base image $tag: $(docker image inspect -f '{{.Size}}' "$tag") bytes"
