#!/usr/bin/env bash
# Build the agentrun python-data image: the python image (Debian minbase + python3) with
# Debian's numpy, pandas, matplotlib and requests, made with debootstrap from the Debian
# mirror apt already uses (no registry, no Docker, no PyPI). matplotlib draws with Agg.
#
# usage: images/python-data/build.sh [--import] [--name NAME] [DIR]
#   DIR       where to build the rootfs (default: <repo>/.cache/images/python-data/rootfs);
#             an existing DIR is replaced.
#   --import  then register it: `agentrun image add NAME DIR` (NAME default: python-data),
#             with Cmd python3 and Docker's PATH. Uses $AGENTRUN_BIN, else
#             target/release or target/debug, else agentrun on PATH; honours $AGENTRUN_ROOT.
# env: DEBIAN_MIRROR (default: the first URI of /etc/apt/sources.list.d/debian.sources, else
#      http://deb.debian.org/debian), DEBIAN_SUITE (default: this host's codename).
# Needs root and debootstrap (apt-get install debootstrap).
#
# matplotlib's backend is set in the image's /etc/matplotlibrc (`backend: Agg`), not with
# MPLBACKEND in the image's Env: Debian's matplotlibrc says `backend: TkAgg`, which fails in
# a sandbox (no display: "Cannot load backend 'TkAgg' ... as 'headless' is currently
# running"); a file in the image holds for every python3 that runs in it, whatever its
# environment: `-e`/`--env-file`, a profile's env defaults, a Python zygote that imported
# matplotlib before the run's environment existed, or the rootfs used by something other
# than agentrun. MPLBACKEND, when a run sets it, still wins over the file.
# matplotlib's font cache is built here (/root/.cache/matplotlib, HOME=/root as agentrun's
# profiles set it): without it, the first `import matplotlib.pyplot` of every run scans the
# fonts again (a fresh writable layer per run).
set -euo pipefail

# shellcheck source=../recipe.sh
. "$(dirname "${BASH_SOURCE[0]}")/../recipe.sh"
recipe_args python-data "$@"

recipe_debootstrap
# Installed with apt in the new root, not with debootstrap --include: debootstrap takes the
# first of every "A | B" dependency, and Debian's python3-fonttools (matplotlib needs it)
# depends on "python3-scipy | python3-munkres", scipy on pythran, pythran on g++, boost and
# the Python headers: 1.2 GB instead of 440 MB. apt takes an alternative that is already
# being installed, so the small ones are named here. No recommends (tk, fonts, compilers).
packages="python3-numpy python3-pandas python3-matplotlib python3-requests python3-munkres"

parent=$(dirname "$dir")
mkdir -p "$parent"
tmp=$(mktemp -d "$parent/.python-data-rootfs.XXXXXX")
trap 'rm -rf "$tmp" "$tmp.log"' EXIT

start=$SECONDS
echo "+ debootstrap --variant=minbase --include=python3 $suite ($mirror)" >&2
debootstrap --variant=minbase --include=python3 "$suite" "$tmp" "$mirror" >"$tmp.log" 2>&1 || {
    tail -20 "$tmp.log" >&2
    echo "build.sh: debootstrap failed" >&2
    exit 1
}
debootstrap_secs=$((SECONDS - start))
echo "+ apt-get install --no-install-recommends $packages (in the new root)" >&2
# In a private mount namespace: its /proc goes away with it, whatever happens.
unshare --mount --propagation private /bin/sh -ec '
    mount -t proc proc "$1/proc"
    shift
    exec chroot "$@"' sh "$tmp" "$tmp" /usr/bin/env -i DEBIAN_FRONTEND=noninteractive \
    PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 /bin/sh -ec '
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "$@"
    apt-get clean' sh $packages >"$tmp.log" 2>&1 || {
    tail -20 "$tmp.log" >&2
    echo "build.sh: apt-get install in the new root failed" >&2
    exit 1
}
rm -f "$tmp.log"
apt_secs=$((SECONDS - start - debootstrap_secs))

# matplotlib draws with Agg (see the header): Debian's /etc/matplotlibrc sets TkAgg.
rc=$tmp/etc/matplotlibrc
[ -f "$rc" ] || : >"$rc"
sed -i '/^[[:space:]]*backend[[:space:]]*:/d' "$rc"
printf '\n# agentrun python-data image: no display in a sandbox (images/python-data/build.sh)\nbackend: Agg\n' >>"$rc"

# What an image does not need: package caches and lists, logs, the mirror's keys setup,
# docs; and the test suites Debian's Python packages ship (~65 MB, most of it sympy's,
# which python3-fonttools depends on; only the packages' own test runners import them).
rm -rf "$tmp"/var/cache/apt/archives/*.deb "$tmp"/var/lib/apt/lists/* "$tmp"/var/log/* \
    "$tmp"/var/cache/debconf/*-old "$tmp"/usr/share/doc/* "$tmp"/usr/share/man/* \
    "$tmp"/usr/share/locale/* "$tmp"/usr/share/info/*
find "$tmp/usr/lib/python3/dist-packages" -depth -type d -name tests -exec rm -rf {} +
# Device nodes debootstrap made are not part of an image (a sandbox gets its own /dev).
find "$tmp/dev" -mindepth 1 -delete
mkdir -p "$tmp/workspace"
: >"$tmp/etc/resolv.conf"
printf 'agentrun\n' >"$tmp/etc/hostname"

# matplotlib's font cache, and the check that everything imports (and draws) here.
check='import numpy, pandas, matplotlib, requests, sys
import matplotlib.pyplot as plt
assert matplotlib.get_backend().lower() == "agg", matplotlib.get_backend()
plt.plot([1, 2]); plt.savefig("/tmp/.agentrun-check.png"); plt.close("all")
print(sys.version.split()[0], numpy.__version__, pandas.__version__, matplotlib.__version__,
      requests.__version__, matplotlib.get_backend())'
versions=$(env -i HOME=/root LANG=C.UTF-8 PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    chroot "$tmp" python3 -c "$check") || {
    echo "build.sh: the image's python3 cannot import numpy, pandas, matplotlib, requests" >&2
    exit 1
}
rm -f "$tmp/tmp/.agentrun-check.png"

rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
chmod 0755 "$dir"

read -r py np pd mpl rq backend <<<"$versions"
echo "python-data image built at $dir ($(du -sh "$dir" | cut -f1), Python $py, numpy $np, pandas $pd, matplotlib $mpl (backend $backend), requests $rq; ${debootstrap_secs} s debootstrap, ${apt_secs} s apt-get, $((SECONDS - start)) s in all)" >&2

recipe_import "$dir" --cmd python3 --env LANG=C.UTF-8 \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
