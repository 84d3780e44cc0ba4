#!/bin/sh
# Builds Charon's images without a Docker daemon (Debian 12, as root): a base like python:3.11-slim-bookworm made
# from Debian's own packages with debootstrap, then both targets of deploy/Dockerfile with buildah.
#   deploy/build-image.sh [TAG]   ->  localhost/charon:TAG (service) and localhost/charon-insights:TAG (default: latest)
# BUILD_OPTS: more `buildah bud` options, e.g. "--build-arg EXTRAS=tracing".
# Run:  podman run --rm -p 8888:8888 localhost/charon:latest   (then GET /v2/ping answers 204)
set -eu
TAG=${1:-latest}
BASE=localhost/charon-base:bookworm
cd "$(dirname "$0")/.."
command -v buildah >/dev/null && command -v debootstrap >/dev/null ||
  { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y buildah debootstrap; }
R=$(mktemp -d)
trap 'rm -rf "$R"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,python-is-python3,ca-certificates \
  bookworm "$R" http://deb.debian.org/debian
printf 'deb http://deb.debian.org/debian %s main\n' bookworm bookworm-updates >"$R/etc/apt/sources.list"
echo 'deb http://deb.debian.org/debian-security bookworm-security main' >>"$R/etc/apt/sources.list"
# slim like Debian's container images: no docs/man pages/locales (directories stay: openjdk's postinst needs man1)
printf '%s\n' 'path-exclude /usr/share/doc/*' 'path-include /usr/share/doc/*/copyright' \
  'path-exclude /usr/share/man/*' 'path-exclude /usr/share/info/*' 'path-exclude /usr/share/locale/*' \
  >"$R/etc/dpkg/dpkg.cfg.d/slim"
printf '#!/bin/sh\nexit 101\n' >"$R/usr/sbin/policy-rc.d" && chmod +x "$R/usr/sbin/policy-rc.d"
chroot "$R" sh -c 'apt-get update && DEBIAN_FRONTEND=noninteractive apt-get -y upgrade && apt-get clean'
rm -rf "$R"/var/lib/apt/lists/* "$R"/var/log/*.log "$R"/var/cache/debconf/*-old
find "$R/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
find "$R/usr/share/man" "$R/usr/share/info" "$R/usr/share/locale" -not -type d -delete
c=$(buildah from scratch)
cp -a "$R/." "$(buildah mount "$c")/"
buildah umount "$c" >/dev/null
buildah config --env LANG=C.UTF-8 --cmd python3 "$c"
buildah commit --rm "$c" "$BASE"
for target in service insights; do
  name=charon; [ "$target" = service ] || name=charon-$target
  # shellcheck disable=SC2086
  buildah bud --isolation chroot --network host --layers --format docker ${BUILD_OPTS:-} \
    --build-arg PYTHON_IMAGE="$BASE" -f deploy/Dockerfile --target "$target" -t "localhost/$name:$TAG" .
done
buildah images --filter reference='localhost/charon*'
