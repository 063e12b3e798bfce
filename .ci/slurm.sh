#!/usr/bin/env bash
# The real Slurm the tests start on localhost (tests/sharding/test_slurm.py): Debian's slurm-wlm and munge.
# Installs them when missing (as root, with apt-get); the tests start and stop the daemons themselves.
set -euo pipefail
if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
        && command -v sbatch >/dev/null; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "the Slurm tests need slurm-wlm and munge: run  sudo apt-get install -y slurm-wlm munge" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends slurm-wlm munge
