# Shared by the image recipes (images/<name>/build.sh), sourced, not run.
#
# recipe_args NAME "$@"   parses [--import] [--name NAME] [DIR] into $import, $name, $dir
#                         (DIR default: <repo>/.cache/images/NAME/rootfs); sets $repo.
# recipe_debootstrap      checks for debootstrap and root; sets $mirror (DEBIAN_MIRROR, else
#                         the first URI of apt's debian.sources, else deb.debian.org) and
#                         $suite (DEBIAN_SUITE, else this host's codename).
# recipe_import DIR ARGS  with --import: `agentrun image add $name DIR ARGS...` using
#                         $AGENTRUN_BIN (default <repo>/target/debug/agentrun); honours
#                         $AGENTRUN_ROOT like agentrun itself.

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
}

recipe_import() {
    local rootfs=$1
    shift
    [ "$import" = 1 ] || return 0
    local bin=${AGENTRUN_BIN:-$repo/target/debug/agentrun}
    if [ ! -x "$bin" ]; then
        echo "build.sh: $bin not found: build it first (cargo build -p agentrun)" >&2
        exit 1
    fi
    # A new import takes the name; the old image's content goes with `agentrun image prune`.
    "$bin" image add "$name" "$rootfs" "$@"
    echo "imported as image '$name'${AGENTRUN_ROOT:+ into $AGENTRUN_ROOT}" >&2
}

recipe_debootstrap() {
    if ! command -v debootstrap >/dev/null 2>&1; then
        echo "build.sh: debootstrap not found: apt-get install debootstrap" >&2
        exit 1
    fi
    if [ "$(id -u)" != 0 ]; then
        echo "build.sh: debootstrap needs root" >&2
        exit 1
    fi

    mirror=${DEBIAN_MIRROR:-}
    if [ -z "$mirror" ] && [ -r /etc/apt/sources.list.d/debian.sources ]; then
        mirror=$(awk '$1 == "URIs:" { print $2; exit }' /etc/apt/sources.list.d/debian.sources)
    fi
    mirror=${mirror:-http://deb.debian.org/debian}
    suite=${DEBIAN_SUITE:-$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")}
}
