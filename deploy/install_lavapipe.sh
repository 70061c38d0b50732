#!/usr/bin/env bash
# Install a CPU Vulkan driver (Mesa >= 25 lavapipe) so SAPIEN can render without a GPU.
#
# Why: SAPIEN 3 renders through Vulkan only. On a machine without a GPU it needs Mesa's lavapipe
# software driver, and Debian 12's own Mesa 22 lavapipe lacks the descriptor-indexing features
# SAPIEN's shaders use; Mesa 25 from bookworm-backports has them. State-only RoboTwin envs
# (image_size=0) need none of this.
#
# Idempotent: does nothing when a Mesa >= 25 mesa-vulkan-drivers is already installed. Needs root
# (apt-get) and Debian 12 (bookworm); on other systems it says so and exits non-zero.
#
#   sudo bash deploy/install_lavapipe.sh
set -euo pipefail

installed=$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)
if [[ -n "$installed" && "${installed%%.*}" -ge 25 ]]; then
  echo "mesa-vulkan-drivers $installed already installed (lavapipe ready)"
  exit 0
fi

. /etc/os-release
if [[ "${VERSION_CODENAME:-}" != "bookworm" ]]; then
  echo "this script targets Debian 12 (bookworm); found ${PRETTY_NAME:-unknown}." >&2
  echo "install Mesa >= 25 mesa-vulkan-drivers and libvulkan1 from your distribution instead." >&2
  exit 1
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "run as root (apt-get install)" >&2
  exit 1
fi

list=/etc/apt/sources.list.d/bookworm-backports.list
if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
  echo "deb http://deb.debian.org/debian bookworm-backports main" > "$list"
  echo "added $list"
fi
apt-get update -q
DEBIAN_FRONTEND=noninteractive apt-get install -y -q -t bookworm-backports mesa-vulkan-drivers libvulkan1
echo "installed mesa-vulkan-drivers $(dpkg-query -W -f='${Version}' mesa-vulkan-drivers)"
