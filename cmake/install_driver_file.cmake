# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Installs libibverbs' driver file for usiw, at install time, for the prefix
# being installed to (CMAKE_INSTALL_PREFIX here is `cmake --install
# --prefix`'s, or the configured one). Included by install(CODE) in
# providers/usiw/CMakeLists.txt, which sets:
#   USIW_LIBDIR, USIW_SYSCONFDIR   GNUInstallDirs' LIBDIR and SYSCONFDIR
#   USIW_STOCK_PROVIDER_DIR        where Debian's libibverbs looks by name
#   USIW_DRIVER_TEMPLATE           glue/usiw.driver.in
#   USIW_DRIVER_FILE               the file to write in the build tree
#
# Where the prefix puts the provider in libibverbs' own provider directory
# (the Debian package: /usr) the file names the provider "usiw", which
# libibverbs looks up there; with any other prefix it names the provider by
# its absolute path, less the "-rdmav34.so" libibverbs appends.
cmake_path(ABSOLUTE_PATH USIW_LIBDIR BASE_DIRECTORY "${CMAKE_INSTALL_PREFIX}"
    NORMALIZE OUTPUT_VARIABLE libdir)
set(provider_dir "${libdir}/libibverbs")
# GNUInstallDirs' rule for SYSCONFDIR: /usr -> /etc, /opt/X -> /etc/opt/X.
if(IS_ABSOLUTE "${USIW_SYSCONFDIR}")
    set(sysconfdir "${USIW_SYSCONFDIR}")
elseif(CMAKE_INSTALL_PREFIX MATCHES "^/usr/?$")
    set(sysconfdir "/${USIW_SYSCONFDIR}")
elseif(CMAKE_INSTALL_PREFIX MATCHES "^/opt/(.*)")
    set(sysconfdir "/${USIW_SYSCONFDIR}/opt/${CMAKE_MATCH_1}")
else()
    set(sysconfdir "${CMAKE_INSTALL_PREFIX}/${USIW_SYSCONFDIR}")
endif()
cmake_path(SET provider_dir NORMALIZE "${provider_dir}")
cmake_path(SET stock_dir NORMALIZE "${USIW_STOCK_PROVIDER_DIR}")
if(provider_dir STREQUAL stock_dir)
    set(USIW_DRIVER_NAME usiw)
else()
    set(USIW_DRIVER_NAME "${provider_dir}/libusiw")
endif()
configure_file("${USIW_DRIVER_TEMPLATE}" "${USIW_DRIVER_FILE}" @ONLY)
file(INSTALL DESTINATION "${sysconfdir}/libibverbs.d" TYPE FILE FILES "${USIW_DRIVER_FILE}")
