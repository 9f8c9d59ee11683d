#!/usr/bin/env bash
# The main job: installs what is needed, builds usiw and shows it working.
#
# Today usiw's wire layer is complete and traffic between programs is still
# to come, so the demo frames one of each iWARP message, decodes the stream
# again and prints both sides. As the provider grows, this becomes stock
# perftest and rping over usiw on loopback.
#
# Usage: scripts/demo.sh
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)

"$top/scripts/install-deps.sh"
"$top/scripts/build.sh" "$top/build"

echo
echo "== usiw wire layer: MPA setup frame and FPDUs, encoded then decoded"
"$top/build/providers/usiw/usiw-wire-show"
