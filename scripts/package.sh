#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Builds the Debian packages of usiw (source and binary, dpkg-buildpackage
# and debhelper, from debian/) and checks them with lintian.
#
# The source is copied first (the files git knows, or every file outside
# build directories when this is not a git checkout), so the tree itself is
# never written to. debian/changelog is written into the copy with the
# version from CMakeLists.txt's project(), the one place that holds it.
#
# Usage: scripts/package.sh [OUT_DIR]     (default: build/package)
# Output in OUT_DIR: usiw_VERSION_ARCH.deb, the -dbgsym package, the
# native source package (.dsc, .tar.xz), the .changes and .buildinfo;
# lintian.txt; the build's log in build.log.
# Exit status: nonzero if the build fails or lintian reports an error or a
# warning that debian/usiw.lintian-overrides does not explain.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-"$top/build/package"}
mkdir -p "$out"
out=$(cd "$out" && pwd)

version=$(sed -n 's/^project(usiw VERSION \([0-9][0-9.]*\)[ )].*/\1/p' "$top/CMakeLists.txt")
[ -n "$version" ] || { echo "package.sh: no project(usiw VERSION ...) in CMakeLists.txt" >&2; exit 1; }

src=$out/src/usiw-$version
rm -rf "$out/src"
mkdir -p "$src"
if git -C "$top" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    # tracked files and new ones not ignored, as they are in the tree now
    git -C "$top" ls-files -z --cached --others --exclude-standard |
        (cd "$top" && xargs -0 sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh) |
        tar -C "$top" --null -T - -cf - | tar -C "$src" -xf -
else
    tar -C "$top" --exclude='./build*' --exclude='./.git' -cf - . | tar -C "$src" -xf -
fi

# The changelog dpkg-buildpackage reads the version from.
{
    printf 'usiw (%s) unstable; urgency=medium\n\n' "$version"
    printf '  * Built from the source tree by scripts/package.sh.\n\n'
    printf ' -- usiw developers <dev@usiw.invalid>  %s\n' \
        "$(date -R -d "@${SOURCE_DATE_EPOCH:-$(git -C "$top" log -1 --format=%ct 2>/dev/null || date +%s)}")"
} >"$src/debian/changelog"

rm -f "$out"/usiw_* "$out"/usiw-dbgsym_*
echo "package.sh: building usiw $version in $src (log: $out/build.log)"
if ! (cd "$src" && DEB_BUILD_OPTIONS="nocheck parallel=$(nproc)" \
    dpkg-buildpackage --build=full --no-sign >"$out/build.log" 2>&1); then
    tail -n 40 "$out/build.log" >&2
    echo "package.sh: dpkg-buildpackage failed (log: $out/build.log)" >&2
    exit 1
fi
mv "$out"/src/usiw_* "$out"/src/usiw-dbgsym_* "$out"/
changes=$(ls "$out"/usiw_"$version"_*.changes)

# lintian on all of them: errors and warnings fail, the rest is
# printed (info, pedantic and overridden tags, each with its explanation).
# (Its note that running as root is not recommended is dropped: these are
# our own packages.)
set +e
lintian --fail-on error,warning --display-info --pedantic --show-overrides --tag-display-limit 0 \
    "$changes" 2>&1 | grep -vx 'running with root privileges is not recommended!' >"$out/lintian.txt"
lintian_rc=${PIPESTATUS[0]}
set -e
if [ -s "$out/lintian.txt" ]; then
    echo "package.sh: lintian says:"
    sed 's/^/  /' "$out/lintian.txt"
else
    echo "package.sh: lintian says nothing"
fi
ls -1 "$out"/*.deb
[ "$lintian_rc" -eq 0 ] || { echo "package.sh: lintian failed (exit $lintian_rc)" >&2; exit 1; }
