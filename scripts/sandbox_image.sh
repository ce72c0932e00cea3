#!/bin/sh
# Build the Docker sandbox's base image, opengyre-base:bookworm, without any image registry: debootstrap a
# minimal Debian bookworm with python3 (the egress forwarder and most graders need it), then `docker import` it.
# The same for other Debian-package images: IMAGE=... PACKAGES=a,b (scripts/images.sh builds the PostgreSQL one).
# Idempotent: an existing image is kept (OPENGYRE_REBUILD=1 rebuilds it).
# The mirror is the one apt uses on this host (first deb.debian.org-style URI of its bookworm suite), or $MIRROR.
set -eu

IMAGE="${IMAGE:-opengyre-base:bookworm}"
SUITE=bookworm
PACKAGES="${PACKAGES:-python3,ca-certificates}"

if ! docker version >/dev/null 2>&1; then
    echo "$IMAGE: no Docker daemon answers (start one: dockerd --host unix:///var/run/docker.sock &)" >&2
    exit 1
fi
if [ "${OPENGYRE_REBUILD:-0}" != 1 ] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "$IMAGE exists ($(docker image inspect -f '{{.Size}}' "$IMAGE") bytes); skipping"
    exit 0
fi
command -v debootstrap >/dev/null || { echo "$IMAGE: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }

if [ -z "${MIRROR:-}" ]; then
    # deb822 sources (URIs: line of the stanza whose Suites: holds bookworm) or a one-line sources.list.
    MIRROR=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk -v s="$SUITE" '
        /^URIs:/ {u=$2} /^Suites:/ {for (i=2;i<=NF;i++) if ($i==s) {print u; exit}}')
    [ -n "$MIRROR" ] || MIRROR=$(awk -v s="$SUITE" '$1=="deb" && $3==s {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
fi
[ -n "$MIRROR" ] || { echo "$IMAGE: no $SUITE mirror in /etc/apt/sources.list(.d); set MIRROR=" >&2; exit 1; }

ROOT=$(mktemp -d /tmp/og-rootfs.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT
start=$(date +%s)
echo "$IMAGE: debootstrap --variant=minbase --include=$PACKAGES $SUITE from $MIRROR"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOT" "$MIRROR" >"$ROOT.log" 2>&1 || {
    tail -20 "$ROOT.log" >&2; exit 1; }
rm -f "$ROOT.log"
# What a container never needs: apt's package lists and caches, docs and man pages (about a third of the size).
rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/* "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* \
    "$ROOT"/usr/share/locale/* "$ROOT"/usr/share/info/*
tar -C "$ROOT" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/sh"]' - "$IMAGE" >/dev/null
echo "$IMAGE: built $IMAGE in $(( $(date +%s) - start )) s, $(docker image inspect -f '{{.Size}}' "$IMAGE") bytes"
