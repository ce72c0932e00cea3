#!/bin/sh
# make compose-up / compose-down / compose-ps: the deployment on this machine (deploy/compose.host.yml; the
# 3-node JetStream cluster with CLUSTER=1, deploy/compose.cluster.yml on top). Secrets are written once into
# .opengyre/compose/env (0600) and kept: re-creating the containers keeps the passwords and the volumes' data.
set -eu
cd "$(dirname "$0")/.."
ENVFILE=.opengyre/compose/env
FILES="-f deploy/compose.host.yml"
[ "${CLUSTER:-0}" = 1 ] && FILES="$FILES -f deploy/compose.cluster.yml"
if ! [ -s "$ENVFILE" ]; then
    mkdir -p "$(dirname "$ENVFILE")"
    umask 077
    hex() { od -An -tx1 -N"$1" /dev/urandom | tr -d ' \n'; }
    printf 'OPENGYRE_PG_PASSWORD=%s\nOPENGYRE_NATS_PASSWORD=%s\nOPENGYRE_GRPC_TOKEN=%s\n' "$(hex 24)" "$(hex 24)" "$(hex 32)" >"$ENVFILE"
    echo "compose: wrote the deployment's secrets to $ENVFILE (kept from now on)"
fi
compose() { docker-compose -p opengyre $FILES --env-file "$ENVFILE" "$@"; }

case "${1:-up}" in
up)
    shift
    for image in opengyre:latest opengyre-postgres:bookworm; do
        docker image inspect "$image" >/dev/null 2>&1 || { echo "compose: no image $image: run make images" >&2; exit 1; }
    done
    compose up -d --remove-orphans "$@"
    # Wait for every long-running container to be healthy (compose v1 has no --wait); a dead one fails at once.
    deadline=$(( $(date +%s) + ${COMPOSE_WAIT_S:-600} ))
    while :; do
        states=$(docker ps -a --filter label=com.docker.compose.project=opengyre \
            --format '{{.Label "com.docker.compose.service"}} {{.State}} {{.Status}}' | grep -v '^migrate ')
        bad=$(echo "$states" | awk '$2 != "running"')
        [ -z "$bad" ] || { echo "compose: not running: $bad" >&2; compose logs --tail 20 >&2; exit 1; }
        echo "$states" | grep -q -v '(healthy)' || break
        [ "$(date +%s)" -lt "$deadline" ] || { echo "compose: not healthy in time:" >&2; echo "$states" >&2; exit 1; }
        sleep 2
    done
    echo "compose: every service healthy"; echo "$states" | awk '{print "  " $1}' | sort | tr '\n' ' '; echo ;;
down)
    compose down ${VOLUMES:+--volumes} ;;
ps)
    compose ps ;;
*)
    compose "$@" ;;
esac
