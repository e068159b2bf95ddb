#!/usr/bin/env bash
# Installs what the test suites need on a Debian machine, idempotently:
# only missing packages, never upgrading installed ones.
set -euo pipefail

need=()
have() { command -v "$1" >/dev/null 2>&1; }
have losetup || need+=(util-linux)
have mkfs.ext4 || need+=(e2fsprogs)
have blkid || need+=(util-linux)
have mkfs.xfs || need+=(xfsprogs)
have mkfs.btrfs || need+=(btrfs-progs)
have findmnt || need+=(util-linux)
have curl || need+=(curl)
have python3 || need+=(python3)
python3 -m venv --help >/dev/null 2>&1 || need+=(python3-venv)

if ((${#need[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "missing packages ${need[*]}: run as root or install them" >&2
    exit 1
  fi
  echo "installing: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-upgrade "${need[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo not found: install the Rust toolchain (rustup) first" >&2
  exit 1
fi
