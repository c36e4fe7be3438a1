#!/usr/bin/env bash
# Build the agentrun busybox test image: a minimal rootfs directory made from
# Debian's busybox-static (one static binary plus one symlink per applet).
#
# usage: images/busybox/build.sh [--import] [--name NAME] [DIR]
#   DIR       where to build the rootfs (default: <repo>/.cache/images/busybox/rootfs);
#             an existing DIR is replaced.
#   --import  then register it: `agentrun image add NAME DIR --cmd /bin/sh` (NAME default:
#             busybox).
#             Uses $AGENTRUN_BIN, else target/release or target/debug, else agentrun on PATH; honours
#             $AGENTRUN_ROOT like agentrun itself.
# env: BUSYBOX (path of a static busybox; default /bin/busybox from busybox-static).
set -euo pipefail

# shellcheck source=../recipe.sh
. "$(dirname "${BASH_SOURCE[0]}")/../recipe.sh"
recipe_args busybox "$@"

busybox=${BUSYBOX:-/bin/busybox}
if [ ! -x "$busybox" ]; then
    echo "build.sh: $busybox not found: install Debian's busybox-static (apt-get install busybox-static)" >&2
    exit 1
fi
# A dynamically linked busybox would need the host's libc inside the image.
if ! "$busybox" --list >/dev/null 2>&1; then
    echo "build.sh: $busybox does not run" >&2
    exit 1
fi
# (No `cmd | grep -q`/`| head` here or below: with pipefail, the writer's SIGPIPE fails the build.)
if command -v file >/dev/null 2>&1 && case "$(file -L "$busybox")" in *'dynamically linked'*) true ;; *) false ;; esac; then
    echo "build.sh: $busybox is dynamically linked; install busybox-static" >&2
    exit 1
fi

# Build next to the target and swap in at the end, so a failed build leaves no half image.
parent=$(dirname "$dir")
mkdir -p "$parent"
tmp=$(mktemp -d "$parent/.busybox-rootfs.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

(
    cd "$tmp"
    mkdir -p bin etc root tmp workspace proc sys dev home var/tmp usr
    chmod 0755 bin etc workspace proc sys dev home var usr
    chmod 0700 root
    chmod 1777 tmp var/tmp
    ln -s ../bin usr/bin
    ln -s bin sbin
    ln -s ../bin usr/sbin
    install -m 0755 "$busybox" bin/busybox
    for applet in $("$busybox" --list); do
        [ "$applet" = busybox ] || [ -e "bin/$applet" ] || ln -s busybox "bin/$applet"
    done

    version=$("$busybox" 2>&1 | sed -n '1s/^BusyBox v\([^ ]*\).*/\1/p' || true)
    cat >etc/os-release <<OS
NAME="agentrun busybox"
ID=agentrun-busybox
VERSION_ID="${version:-unknown}"
PRETTY_NAME="agentrun busybox test image (BusyBox ${version:-unknown})"
OS
    cat >etc/passwd <<'PW'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
PW
    cat >etc/group <<'GR'
root:x:0:
nogroup:x:65534:
GR
    printf 'agentrun\n' >etc/hostname
    printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >etc/hosts
    : >etc/resolv.conf
    chmod 0644 etc/os-release etc/passwd etc/group etc/hostname etc/hosts etc/resolv.conf
)

rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
chmod 0755 "$dir"

echo "busybox image built at $dir ($(du -sh "$dir" | cut -f1), $(find "$dir/bin" -type l | wc -l) applets)" >&2

recipe_import "$dir" --cmd /bin/sh
