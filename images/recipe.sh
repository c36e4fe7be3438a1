# Shared by the image recipes (images/<name>/build.sh), sourced, not run.
#
# recipe_args NAME "$@"   parses [--import] [--name NAME] [DIR] into $import, $name, $dir
#                         (DIR default: <repo>/.cache/images/NAME/rootfs); sets $repo, and
#                         with --import $agentrun_bin (recipe_agentrun_bin).
# recipe_debootstrap      checks for debootstrap and root; sets $mirror (DEBIAN_MIRROR, else
#                         the first URI of apt's debian.sources, else deb.debian.org) and
#                         $suite (DEBIAN_SUITE, else this host's codename).
# recipe_import DIR ARGS  with --import: `agentrun image add $name DIR ARGS...` using
#                         the binary recipe_agentrun_bin finds; honours $AGENTRUN_ROOT like
#                         agentrun itself.
# recipe_agentrun_bin     prints the agentrun binary to use: $AGENTRUN_BIN, else the newer of
#                         <repo>/target/release/agentrun and <repo>/target/debug/agentrun,
#                         else `agentrun` on PATH; none: a one-line error, exit 1.

recipe_args() {
    local default_name=$1
    shift
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    import=0
    name=$default_name
    dir=
    while [ $# -gt 0 ]; do
        case "$1" in
            --import) import=1 ;;
            --name) name=${2:?--name needs a value}; shift ;;
            -h|--help) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
            -*) echo "build.sh: unknown option $1" >&2; exit 2 ;;
            *) [ -z "$dir" ] || { echo "build.sh: one DIR only" >&2; exit 2; }; dir=$1 ;;
        esac
        shift
    done
    dir=${dir:-$repo/.cache/images/$default_name/rootfs}
    # With --import, find agentrun now: no point building an image nothing can import.
    if [ "$import" = 1 ]; then
        agentrun_bin=$(recipe_agentrun_bin) || exit 1
    fi
}

recipe_import() {
    local rootfs=$1
    shift
    [ "$import" = 1 ] || return 0
    local bin=$agentrun_bin
    # A new import takes the name; the old image's content goes with `agentrun image prune`.
    "$bin" image add "$name" "$rootfs" "$@"
    echo "imported as image '$name'${AGENTRUN_ROOT:+ into $AGENTRUN_ROOT}" >&2
}

recipe_agentrun_bin() {
    local top=${repo:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
    if [ -n "${AGENTRUN_BIN:-}" ]; then
        if [ ! -x "$AGENTRUN_BIN" ]; then
            echo "build.sh: AGENTRUN_BIN=$AGENTRUN_BIN is not an executable: point it at an agentrun binary or unset it" >&2
            return 1
        fi
        echo "$AGENTRUN_BIN"
        return 0
    fi
    local release=$top/target/release/agentrun debug=$top/target/debug/agentrun
    if [ -x "$release" ] && { [ ! -x "$debug" ] || [ "$release" -nt "$debug" ]; }; then
        echo "$release"
    elif [ -x "$debug" ]; then
        echo "$debug"
    elif command -v agentrun >/dev/null 2>&1; then
        command -v agentrun
    else
        echo "build.sh: agentrun not found (not in $top/target/release, $top/target/debug or on PATH): build it (cargo build --release -p agentrun), install it (cargo install --path crates/agentrun) or set AGENTRUN_BIN" >&2
        return 1
    fi
}

recipe_debootstrap() {
    if ! command -v debootstrap >/dev/null 2>&1; then
        echo "build.sh: debootstrap not found: install it (apt-get install debootstrap)" >&2
        exit 1
    fi
    if [ "$(id -u)" != 0 ]; then
        echo "build.sh: debootstrap needs root: run this recipe with sudo" >&2
        exit 1
    fi

    mirror=${DEBIAN_MIRROR:-}
    if [ -z "$mirror" ] && [ -r /etc/apt/sources.list.d/debian.sources ]; then
        mirror=$(awk '$1 == "URIs:" { print $2; exit }' /etc/apt/sources.list.d/debian.sources)
    fi
    mirror=${mirror:-http://deb.debian.org/debian}
    suite=${DEBIAN_SUITE:-$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")}
}
