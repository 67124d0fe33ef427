#!/bin/sh
# Fetch Debian's non-free `nvidia-cuda-mps` package and unpack it into DEST
# without touching the system: apt runs against a scratch sources list, package
# lists and cache under DEST/apt, and the .deb is unpacked with `dpkg -x`
# (nothing is installed). Prints the path of nvidia-cuda-mps-control.
#
# Usage: scripts/fetch_mps.sh DEST
set -eu

if [ $# -ne 1 ]; then
    echo "usage: $0 DEST" >&2
    exit 2
fi
dest=$1
binary="$dest/root/usr/bin/nvidia-cuda-mps-control"
if [ -x "$binary" ]; then
    echo "$binary"
    exit 0
fi

scratch="$dest/apt"
mkdir -p "$scratch/lists/partial" "$scratch/cache/archives/partial" "$scratch/debs"
sources="$scratch/sources.list"
: >"$sources"

# Reuse this machine's Debian mirrors and suites, but with the non-free
# components (the system's own lists usually carry only `main`).
for f in /etc/apt/sources.list.d/*.sources; do
    [ -e "$f" ] || continue
    # deb822: one stanza per blank-line-separated block; emit one-line entries.
    awk '
        function flush() {
            if (uris != "" && suites != "" && types ~ /(^| )deb( |$)/)
                for (i = 1; i <= nu; i++) for (j = 1; j <= ns; j++)
                    printf "deb [signed-by=%s] %s %s main non-free non-free-firmware\n", \
                        key, u[i], s[j]
            uris = ""; suites = ""; types = ""; key = ""
        }
        /^[ \t]*$/ { flush(); next }
        /^Types:/ { sub(/^Types:[ \t]*/, ""); types = $0 }
        /^URIs:/ { sub(/^URIs:[ \t]*/, ""); uris = $0; nu = split(uris, u, /[ \t]+/) }
        /^Suites:/ { sub(/^Suites:[ \t]*/, ""); suites = $0; ns = split(suites, s, /[ \t]+/) }
        /^Signed-By:/ { sub(/^Signed-By:[ \t]*/, ""); key = $0 }
        END { flush() }
    ' "$f" | grep -E 'debian(-security)?( |/)' >>"$sources" || true
done
if [ -f /etc/apt/sources.list ]; then
    # One-line format: keep the Debian `deb` lines, replace their components.
    grep -E '^deb[ \t]' /etc/apt/sources.list | grep -E 'debian(-security)?( |/)' |
        awk '{ n = ($2 ~ /^\[/) ? 4 : 3; line = $1
               for (i = 2; i <= n; i++) line = line " " $i
               print line " main non-free non-free-firmware" }' >>"$sources" || true
fi
if [ ! -s "$sources" ]; then
    echo "fetch_mps.sh: no Debian mirror found in /etc/apt/sources.list{,.d}" >&2
    exit 1
fi

apt_opts="-o Dir::Etc::SourceList=$sources -o Dir::Etc::SourceParts=/dev/null
    -o Dir::State::Lists=$scratch/lists -o Dir::Cache=$scratch/cache
    -o Dir::Cache::archives=$scratch/cache/archives
    -o APT::Sandbox::User=root -o Debug::NoLocking=1"
# shellcheck disable=SC2086  # apt_opts is a list of words on purpose
apt-get -q $apt_opts update >&2
# shellcheck disable=SC2086
(cd "$scratch/debs" && apt-get -q $apt_opts download nvidia-cuda-mps >&2)

mkdir -p "$dest/root"
for deb in "$scratch/debs"/*.deb; do
    dpkg -x "$deb" "$dest/root"
done
if [ ! -x "$binary" ]; then
    echo "fetch_mps.sh: $binary missing after unpacking" >&2
    exit 1
fi
echo "$binary"
