#!/usr/bin/env bash
# Build the agentrun python image: a Debian minbase root filesystem with python3, made with
# debootstrap from the Debian mirror apt already uses (no registry, no Docker).
#
# usage: images/python/build.sh [--import] [--name NAME] [DIR]
#   DIR       where to build the rootfs (default: <repo>/.cache/images/python/rootfs);
#             an existing DIR is replaced.
#   --import  then register it: `agentrun image add NAME DIR` (NAME default: python), with
#             Cmd python3 and Docker's PATH. Uses $AGENTRUN_BIN, else
#             target/release or target/debug, else agentrun on PATH; honours $AGENTRUN_ROOT.
# env: DEBIAN_MIRROR (default: the first URI of /etc/apt/sources.list.d/debian.sources, else
#      http://deb.debian.org/debian), DEBIAN_SUITE (default: this host's codename).
# Needs root and debootstrap (apt-get install debootstrap).
set -euo pipefail

# shellcheck source=../recipe.sh
. "$(dirname "${BASH_SOURCE[0]}")/../recipe.sh"
recipe_args python "$@"

recipe_debootstrap

parent=$(dirname "$dir")
mkdir -p "$parent"
tmp=$(mktemp -d "$parent/.python-rootfs.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

start=$SECONDS
echo "+ debootstrap --variant=minbase --include=python3 $suite ($mirror)" >&2
debootstrap --variant=minbase --include=python3 "$suite" "$tmp" "$mirror" >"$tmp.log" 2>&1 || {
    tail -20 "$tmp.log" >&2
    rm -f "$tmp.log"
    echo "build.sh: debootstrap failed" >&2
    exit 1
}
rm -f "$tmp.log"

# What an image does not need: package caches and lists, logs, the mirror's keys setup.
rm -rf "$tmp"/var/cache/apt/archives/*.deb "$tmp"/var/lib/apt/lists/* "$tmp"/var/log/* \
    "$tmp"/var/cache/debconf/*-old "$tmp"/usr/share/doc/* "$tmp"/usr/share/man/* \
    "$tmp"/usr/share/locale/* "$tmp"/usr/share/info/*
# Device nodes debootstrap made are not part of an image (a sandbox gets its own /dev).
find "$tmp/dev" -mindepth 1 -delete
mkdir -p "$tmp/workspace"
: >"$tmp/etc/resolv.conf"
printf 'agentrun\n' >"$tmp/etc/hostname"

rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
chmod 0755 "$dir"

version=$(chroot "$dir" python3 -c 'import sys; print(sys.version.split()[0])')
echo "python image built at $dir ($(du -sh "$dir" | cut -f1), Python $version, $((SECONDS - start)) s)" >&2

recipe_import "$dir" --cmd python3 --env LANG=C.UTF-8 \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
