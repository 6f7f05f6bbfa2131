#!/usr/bin/env bash
# Installs the system packages the portal and its tests need, when run as root on Debian/Ubuntu;
# otherwise it names the missing ones. Usage: system-packages.sh up|test
set -u
mode=${1:-up}
need=()
pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -n "$pgbin" ] && [ -x "$pgbin/initdb" ] || need+=(postgresql)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v npm >/dev/null 2>&1 || need+=(npm)
if [ "$mode" = test ]; then
  [ -x /usr/bin/chromium ] || need+=(chromium)
  command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
  command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
  [ -x /bin/busybox ] || need+=(busybox-static)
fi
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "Installing system packages: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null || {
    echo "apt-get install ${need[*]} failed" >&2; exit 1; }
else
  echo "Missing system packages: ${need[*]}" >&2
  echo "Install them (Debian/Ubuntu: sudo apt-get install ${need[*]}) and run the command again." >&2
  [ "$mode" = test ] && echo "(chromium, docker.io and docker-compose are optional: the tests that need them are skipped.)" >&2
  for p in "${need[@]}"; do case $p in postgresql|redis-server) exit 1;; esac; done
fi
exit 0
