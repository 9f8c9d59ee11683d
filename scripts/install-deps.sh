#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Installs, with apt only, every Debian 12 package that usiw's build, tests
# and demo need. Idempotent: packages already installed are left alone and
# apt is not touched at all when nothing is missing.
#
# Usage: scripts/install-deps.sh        (as root, or with sudo available)
set -euo pipefail
. "$(dirname "$0")/lib/usiw.sh"

packages=(
    # toolchain and build
    g++ cmake make pkg-config git
    # fuzzing and sanitizers (clang 14 with libFuzzer and the sanitizer runtimes)
    clang libclang-rt-14-dev clang-format
    # stock rdma-core 44: headers, libraries and the tools the tests drive
    libibverbs-dev librdmacm-dev ibverbs-utils rdmacm-utils perftest python3-pyverbs
    # libraries the provider uses
    libnl-3-dev libnl-route-3-dev libisal-dev
    # unit tests
    libcmocka-dev
    # network namespaces for two-host tests
    iproute2
    # man pages: rendered by pandoc, checked with man and groff (man_pages)
    pandoc python3 man-db groff-base bsdextrautils
    # the Debian package: built, linted, installed into a minimal Debian
    # root made by mmdebstrap (debian_package)
    debhelper dpkg-dev fakeroot lintian mmdebstrap
    # middleware the integration tests run over usiw: qperf, libfabric's
    # verbs provider and its fi_pingpong/fi_info (rsockets come with
    # librdmacm1), and iperf3 under librspreload.so
    qperf libfabric1 libfabric-bin iperf3
    # the kernel shim (usiw.ko) is built against Debian's 6.1 kernel headers
    linux-headers-amd64
)

if [ -z "$(missing_packages "${packages[@]}")" ]; then
    echo "install-deps: all ${#packages[@]} packages present"
    exit 0
fi
apt_install install-deps "${packages[@]}"
