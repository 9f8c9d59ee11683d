#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Gives every file of the source tree an SPDX-License-Identifier line naming
# its license (LICENSE): GPL-2.0-only for kernel-shim/, "GPL-2.0-only OR
# BSD-2-Clause" for everything else. Safe to run again at any time (after a
# merge, say): a file that has the right tag is left alone, a wrong tag is
# corrected in place, a missing one is added in the file's own comment
# syntax, on the first line (the second after a #! line; after the YAML
# title block of a pandoc page).
#
# The files are those git knows and new ones it does not ignore (outside a
# git checkout: every file but the build directories). Files that cannot
# hold a comment are exempt, each for the reason listed below.
#
# Usage: scripts/spdx-tag.sh [--check] [SOURCE_DIR]   (default: this tree)
#   --check  change nothing: print each file without the right tag
# Prints what it changed (or found), then a summary. Exit status: 1 if a
# file's type is unknown (add it to comment_style below) or, with --check,
# if any file lacks the right tag.
set -uo pipefail
shopt -s extglob
check=0
if [[ ${1:-} == --check ]]; then
    check=1
    shift
fi
SRC=${1:-$(dirname "$0")/..}
cd "$SRC" || exit 1

# path pattern (bash glob) : why it carries no tag
exempt=(
    "LICENSE:the license statement itself"
    "LICENSES/*:the license texts"
    "tests/fuzz/corpus/*:raw fuzzer inputs (bytes on the wire); under the project's license (LICENSE)"
    "debian/copyright:the machine-readable copyright file names the licenses itself"
    "debian/source/format:dpkg reads its one line, no comments"
    "debian/changelog:written by scripts/package.sh; no comments"
    "rdma-core-patches/*.patch:changes to rdma-core, under rdma-core's license; git am reads the header"
    "scripts/qemu/siw-fixes/*.patch:changes to Linux's siw, under the kernel's license (GPL-2.0); patch reads them whole"
    "*.json:JSON has no comments"
    "Documentation/*.png:plots drawn by scripts/bench_plot.py; under the project's license (LICENSE)"
)

# comment_style PATH: how PATH's comments look: slashes (// ...), block
# (/* ... */), hash (# ...) or html (<!-- ... -->); nothing when unknown.
comment_style() {
    local base=${1##*/}
    base=${base%.in}  # a template: as the file it makes
    case $1 in
        kernel-shim/*.h) echo block; return ;;  # the kernel's style for headers
    esac
    case $base in
        *.c | *.cc | *.cpp | *.h | *.hh | *.hpp) echo slashes ;;
        *.map | *.lds | *.S) echo block ;;
        *.md) echo html ;;
        *.sh | *.bash | *.py | *.cmake | *.txt | *.yml | *.yaml | *.toml | *.conf | *.rules | \
            *.driver | *.mk | *.service | *.cfg | *.ini | *.lintian-overrides | *.install | \
            *.dirs | *.links | *.docs | *.manpages | *.gitignore | .gitattributes | .clang-format | \
            .clang-tidy | Makefile | Kbuild | Kconfig | control | rules | postrm | postinst | \
            prerm | preinst | watch) echo hash ;;
        *)  # a script without an extension (.ci/run, completions/usiw)
            if head -c 2 "$1" | grep -q '^#!' || [[ $1 == completions/* ]]; then echo hash; fi ;;
    esac
}

tag_line() {  # STYLE LICENSE
    case $1 in
        slashes) echo "// SPDX-License-Identifier: $2" ;;
        block) echo "/* SPDX-License-Identifier: $2 */" ;;
        hash) echo "# SPDX-License-Identifier: $2" ;;
        html) echo "<!-- SPDX-License-Identifier: $2 -->" ;;
    esac
}

# insert_after PATH: the number of lines the tag goes after: a #! line, or
# a pandoc page's YAML title block ("---" ... "---" on the first lines).
insert_after() {
    if head -n 1 "$1" | grep -q '^#!'; then
        echo 1
    elif [[ $(head -n 1 "$1") == --- ]]; then
        awk 'NR > 1 && /^(---|\.\.\.)$/ { print NR; found = 1; exit } END { if (!found) print 0 }' "$1"
    else
        echo 0
    fi
}

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    mapfile -t files < <(git ls-files --cached --others --exclude-standard | sort -u)
else
    mapfile -t files < <(find . -path './build*' -prune -o -path ./.git -prune -o -type f -print |
        sed 's|^\./||' | sort)
fi

good=0 changed=0 wrong=0 unknown=0 exempted=0
for file in "${files[@]}"; do
    [[ -f $file && ! -L $file ]] || continue  # deleted in the work tree, or a link
    # Which license (LICENSE): kernel-shim/ is the Linux kernel's.
    reason=""
    for entry in "${exempt[@]}"; do
        # shellcheck disable=SC2053
        [[ $file == ${entry%%:*} ]] && reason=${entry#*:} && break
    done
    if [[ -n $reason ]]; then
        exempted=$((exempted + 1))
        continue
    fi
    case $file in
        kernel-shim/*) want="GPL-2.0-only" ;;
        *) want="GPL-2.0-only OR BSD-2-Clause" ;;
    esac
    # The tag must be among the first 15 lines (what the check reads).
    # (Read with builtins only: the check runs over every file of the tree.)
    mapfile -t -n 15 head_lines <"$file" 2>/dev/null
    n=0 found=""
    for line in "${head_lines[@]}"; do
        n=$((n + 1))
        if [[ $line =~ SPDX-License-Identifier:\ (.*)$ ]]; then
            found=${BASH_REMATCH[1]}
            found=${found%%*( )}
            found=${found%-->}
            found=${found%\*/}
            found=${found%%*( )}
            break
        fi
    done
    if [[ -n $found ]]; then
        if [[ $found == "$want" ]]; then
            good=$((good + 1))
            continue
        fi
        if ((check)); then
            echo "FAIL - $file: SPDX-License-Identifier: $found (expected: $want)"
            wrong=$((wrong + 1))
            continue
        fi
        # Only the expression changes; the comment around it stays.
        WANT=$want FOUND=$found N=$n perl -i -pe \
            'if ($. == $ENV{N}) { s/\QSPDX-License-Identifier: $ENV{FOUND}\E/SPDX-License-Identifier: $ENV{WANT}/ }' \
            "$file"
        echo "corrected: $file ($found -> $want)"
        changed=$((changed + 1))
        continue
    fi
    style=$(comment_style "$file")
    if [[ -z $style ]]; then
        echo "UNKNOWN - $file: no comment syntax known for this file type (add it to" \
            "comment_style or exempt it in scripts/spdx-tag.sh)"
        unknown=$((unknown + 1))
        continue
    fi
    if ((check)); then
        echo "FAIL - $file: no SPDX-License-Identifier line (expected: $want)"
        wrong=$((wrong + 1))
        continue
    fi
    after=$(insert_after "$file")
    TAG=$(tag_line "$style" "$want") AFTER=$after perl -i -pe \
        'print "$ENV{TAG}\n" if $. == $ENV{AFTER} + 1; END { }' "$file"
    if ! grep -qF "$(tag_line "$style" "$want")" "$file"; then
        # an empty file, or one with fewer lines than the place to insert
        printf '%s\n' "$(tag_line "$style" "$want")" >>"$file"
    fi
    echo "tagged: $file"
    changed=$((changed + 1))
done

echo "checked ${#files[@]} files: $good right, $changed changed, $wrong without the right tag," \
    "$unknown of an unknown type, $exempted exempt"
((unknown == 0 && wrong == 0 && good + changed > 0))
