#!/usr/bin/env bash
# Checks docker-compose.yml without a Docker engine: it must parse (Debian's
# docker-compose validates it, with every profile, and with
# docker-compose.cluster.yml over it), every image must be
# pinned to a version (no `latest`, no bare name), and so must the
# Dockerfile's base images.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v docker-compose >/dev/null 2>&1; then
  echo "[compose] installing docker-compose (Debian package)" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null
fi
docker-compose -f docker-compose.yml --profile seaweedfs --profile rabbitmq config -q
# The stack with a Redis Cluster: the second file over the first.
docker-compose -f docker-compose.yml -f docker-compose.cluster.yml config -q
images=$(
  docker-compose -f docker-compose.yml --profile seaweedfs --profile rabbitmq config | sed -n 's/^ *image: *//p'
  docker-compose -f docker-compose.yml -f docker-compose.cluster.yml config | sed -n 's/^ *image: *//p'
)
froms=$(sed -n 's/^FROM \([^ ]*\).*/\1/p' Dockerfile)
bad=0
for image in $images $froms; do
  tag=${image##*:}
  if [ "$tag" = "$image" ] || [ "$tag" = latest ] || ! [[ "$tag" =~ [0-9] ]]; then
    echo "[compose] not pinned to a version: $image" >&2
    bad=1
  fi
done
[ "$bad" = 0 ] || exit 1
images=$(echo "$images" | sort -u)
echo "[compose] docker-compose.yml (and with docker-compose.cluster.yml) parses; $(echo "$images $froms" | wc -w) images, all pinned"
