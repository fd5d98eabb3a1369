#!/usr/bin/env bash
# Debian packages the test suite runs for real: Prometheus and promtool, the Pushgateway,
# docker-compose (only to parse the compose file; no engine is needed), a JDK (for PySpark,
# real RocketMQ and the official Java client's driver) and Maven (to fetch RocketMQ's jars
# from Maven Central), nftables (the soak's faults between one proxy and one broker, in a
# network namespace of its own), Chromium (headless: the analytics HTML report is rendered and
# checked in it). Idempotent: it installs only what is missing, so repeated `make test` runs
# do not touch apt.
set -euo pipefail

declare -A want=(
  [prometheus]=prometheus
  [promtool]=prometheus
  [prometheus-pushgateway]=prometheus-pushgateway
  [docker-compose]=docker-compose
  [java]=default-jdk-headless
  [javac]=default-jdk-headless
  [mvn]=maven
  [nft]=nftables
  [chromium]=chromium
)

missing=()
for cmd in "${!want[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${want[$cmd]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0

# Unique package names, in a stable order.
mapfile -t packages < <(printf '%s\n' "${missing[@]}" | sort -u)
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "system-deps: installing ${packages[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# Packaged services must not start here (tests start their own on free ports): a temporary
# policy-rc.d refuses service starts during the install, and is removed afterwards.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  $SUDO sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod +x $policy"
  trap '$SUDO rm -f "$policy"' EXIT
fi
$SUDO apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
