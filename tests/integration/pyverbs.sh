#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Runs rdma-core's own pyverbs tests (Debian's python3-pyverbs ships them
# under /usr/share/doc/rdma-core/tests) against usiw0, through `usiw run`,
# restricted to the modules about device, PD, MR, CQ and QP objects.
#
# Every test of those modules is classified below, by name:
#   RUN         applies to iWARP and passes: must pass, or this test fails;
#   KNOWN_BUGS  applies to iWARP but fails today because of a usiw bug: run
#               for information only (a notice when one starts passing, so
#               it can move to RUN);
#   SKIP        does not apply to iWARP or to this machine: not run; the
#               reason is given with each entry (Documentation/testing.md
#               has the same list).
# A test of these modules that is in no list, or a name in a list that the
# installed suite does not have, fails the run: the lists must follow the
# suite (they match rdma-core 44, Debian 12).
#
# Usage: pyverbs.sh PATH/TO/usiw   (the provider is PATH/TO/../lib/libusiw-rdmav34.so)
# Exits 0 when every RUN test passed and the lists cover the suite exactly.

set -u

USIW=${1:?usage: pyverbs.sh PATH/TO/usiw}
USIW=$(cd "$(dirname "$USIW")" && pwd -P)/$(basename "$USIW")
HERE=$(cd "$(dirname "$0")" && pwd -P)
RUNNER=$HERE/pyverbs_run.py
# pyverbs is installed for Debian's interpreter, which need not be the
# `python3` first on PATH.
PYTHON=/usr/bin/python3
SUITE=/usr/share/doc/rdma-core/tests
DEVICE=usiw0

MODULES=(test_device test_pd test_mr test_cq test_qp test_cq_events)

RUN=(
    test_device.DeviceTest.test_dev_list
    test_device.DeviceTest.test_open_dev
    test_device.DeviceTest.test_query_device
    test_device.DeviceTest.test_query_device_ex
    test_device.DeviceTest.test_query_gid
    test_device.DeviceTest.test_query_gid_ex
    test_device.DeviceTest.test_query_gid_ex_bad_flow
    test_device.DeviceTest.test_query_gid_table
    test_device.DeviceTest.test_query_gid_table_bad_flow
    test_device.DeviceTest.test_query_pkey
    test_device.DeviceTest.test_query_port
    test_device.DeviceTest.test_query_port_bad_flow
    test_pd.PDTest.test_alloc_pd
    test_pd.PDTest.test_dealloc_pd
    test_pd.PDTest.test_destroy_pd_twice
    test_pd.PDTest.test_multiple_pd_creation
    test_mr.MRTest.test_reg_mr_bad_flags
    test_cq.CQAPITest.test_create_cq
    test_cq.CQAPITest.test_create_cq_bad_flow
    test_cq.CQAPITest.test_create_cq_with_comp_channel
    test_qp.QPTest.test_create_rc_qp_with_attr
    test_qp.QPTest.test_create_rc_qp_ex_with_attr
    test_qp.QPTest.test_query_rc_qp
    test_device.DeviceTest.test_phys_port_cnt_ex
    test_qp.QPTest.test_create_rc_qp_no_attr
    test_qp.QPTest.test_create_rc_qp_ex_no_attr
)

# "NAME|why it fails". Move a test to RUN once its bug is fixed.
KNOWN_BUGS=(
)

# "NAME|reason": NAME is a test, or a Module.Class meaning all its tests.
GID_RC="connects RC QPs with ibv_modify_qp to RTR/RTS and an address vector (GID-addressed setup); an iWARP QP reaches RTS only through connection management"
SKIP=(
    "test_device.DMTest|device memory (ibv_alloc_dm): no such thing on an RNIC; usiw has none"
    "test_device.SharedDMTest|device memory (ibv_alloc_dm) imported into another context; usiw has none"
    "test_mr.DeviceMemoryAPITest|MRs on device memory (ibv_reg_dm_mr); usiw has no device memory"
    "test_mr.DeviceMemoryTest|traffic through device memory MRs; usiw has no device memory"
    "test_mr.DmaBufMRTest|dma-buf MRs need a GPU dma-buf exporter (and ibv_reg_dmabuf_mr); not on this machine, not in usiw"
    "test_mr.DmaBufTestCase|dma-buf MR traffic: a GPU exporter, and RC QPs connected by address vector"
    "test_mr.MRTest.test_mr_rereg_access|rereg then RDMA traffic: $GID_RC"
    "test_mr.MRTest.test_mr_rereg_access_bad_flow|rereg then RDMA traffic: $GID_RC"
    "test_mr.MRTest.test_mr_rereg_addr|rereg then RDMA traffic: $GID_RC"
    "test_mr.MRTest.test_mr_rereg_pd|rereg then RDMA traffic: $GID_RC"
    "test_mr.MWTest|memory windows (ibv_alloc_mw, bind): usiw has none (max_mw 0); the traffic also $GID_RC"
    "test_cq.CQTest.test_resize_cq|fills the CQ with UD sends through an address handle; UD does not exist in iWARP"
    "test_qp.QPTest.test_create_raw_qp_no_attr|raw packet QP: not an iWARP QP type"
    "test_qp.QPTest.test_create_raw_qp_with_attr|raw packet QP: not an iWARP QP type"
    "test_qp.QPTest.test_create_raw_qp_ex_no_attr|raw packet QP: not an iWARP QP type"
    "test_qp.QPTest.test_create_raw_qp_ex_with_attr|raw packet QP: not an iWARP QP type"
    "test_qp.QPTest.test_query_raw_qp|raw packet QP: not an iWARP QP type"
    "test_qp.QPTest.test_create_raw_qp_ex_with_illegal_caps_max_recv_sge|despite the name, creates a UD QP (illegal caps); UD does not exist in iWARP"
    "test_qp.QPTest.test_create_raw_qp_ex_with_illegal_caps_max_recv_wr|despite the name, creates a UD QP (illegal caps); UD does not exist in iWARP"
    "test_qp.QPTest.test_create_raw_qp_ex_with_illegal_caps_max_send_sge|despite the name, creates a UD QP (illegal caps); UD does not exist in iWARP"
    "test_qp.QPTest.test_create_raw_qp_ex_with_illegal_caps_max_send_wr|despite the name, creates a UD QP (illegal caps); UD does not exist in iWARP"
    "test_qp.QPTest.test_create_uc_qp_no_attr|UC QP: UC does not exist in iWARP"
    "test_qp.QPTest.test_create_uc_qp_with_attr|UC QP: UC does not exist in iWARP"
    "test_qp.QPTest.test_create_uc_qp_ex_no_attr|UC QP: UC does not exist in iWARP"
    "test_qp.QPTest.test_create_uc_qp_ex_with_attr|UC QP: UC does not exist in iWARP"
    "test_qp.QPTest.test_query_uc_qp|UC QP: UC does not exist in iWARP"
    "test_qp.QPTest.test_create_ud_qp_no_attr|UD QP: UD does not exist in iWARP"
    "test_qp.QPTest.test_create_ud_qp_with_attr|UD QP: UD does not exist in iWARP"
    "test_qp.QPTest.test_create_ud_qp_ex_no_attr|UD QP: UD does not exist in iWARP"
    "test_qp.QPTest.test_create_ud_qp_ex_with_attr|UD QP: UD does not exist in iWARP"
    "test_qp.QPTest.test_query_ud_qp|UD QP: UD does not exist in iWARP"
    "test_qp.QPTest.test_modify_ud_qp|UD QP (QKey, RTR/RTS without a peer): UD does not exist in iWARP"
    "test_qp.QPTest.test_query_data_in_order|queries a UD QP (ibv_query_qp_data_in_order); UD does not exist in iWARP"
    "test_cq_events.CqEventsTestCase.test_cq_events_rc|completion events over RC traffic: $GID_RC"
    "test_cq_events.CqEventsTestCase.test_cq_events_ud|completion events over UD traffic: UD does not exist in iWARP"
)

passed=0
failed=0

bail() {
    echo "FAIL - $1"
    echo "0 passed, 1 failed"
    exit 1
}

[[ -x $PYTHON ]] || bail "$PYTHON not found"
[[ -d $SUITE ]] || bail "no pyverbs test suite at $SUITE (Debian package python3-pyverbs)"
env -u PYTHONPATH -u PYTHONHOME "$PYTHON" -c 'import pyverbs.device' 2>/dev/null ||
    bail "$PYTHON cannot import pyverbs (Debian package python3-pyverbs)"
[[ -x $USIW ]] || bail "$USIW is not executable"

WORK=$(cd "$(mktemp -d)" && pwd -P)
trap 'rm -rf "$WORK"' EXIT
cp -r "$SUITE" "$WORK/tests"
gunzip -f "$WORK"/tests/*.gz || bail "cannot unpack the suite's .gz files"
mkdir -p "$WORK/user" "$WORK/system"  # no links configured: the default usiw0 on lo

# pyverbs_run ARGS...: the runner under `usiw run`, in a clean environment
# as far as usiw and Python are concerned.
pyverbs_run() {
    (cd "$WORK" && env -u PYTHONPATH -u PYTHONHOME -u USIW_PROVIDER_LIB -u LD_PRELOAD \
        -u XDG_CONFIG_HOME -u RDMAV_DRIVERS -u IBV_DRIVERS \
        USIW_CONFIG_DIR="$WORK/user" USIW_SYSTEM_CONFIG_DIR="$WORK/system" \
        PYTHONDONTWRITEBYTECODE=1 \
        "$USIW" run "$PYTHON" "$RUNNER" "$WORK/tests" "$DEVICE" "$@")
}

# --- the lists cover the suite exactly ---

if ! pyverbs_run --list "${MODULES[@]}" >"$WORK/all" 2>"$WORK/list-err"; then
    cat "$WORK/list-err"
    bail "cannot list the tests of ${MODULES[*]}"
fi

declare -A listed=()
while read -r id; do listed[$id]=1; done <"$WORK/all"

classify() {  # ID: prints the list that holds it, or nothing
    local id=$1 entry name
    for name in "${RUN[@]}"; do [[ $id == "$name" ]] && { echo RUN; return; }; done
    for entry in "${KNOWN_BUGS[@]}"; do [[ $id == "${entry%%|*}" ]] && { echo KNOWN_BUGS; return; }; done
    for entry in "${SKIP[@]}"; do
        name=${entry%%|*}
        [[ $id == "$name" || $id == "$name".* ]] && { echo SKIP; return; }
    done
}

coverage_ok=1
while read -r id; do
    if [[ -z $(classify "$id") ]]; then
        echo "FAIL - $id is in no list (RUN, KNOWN_BUGS, SKIP): classify it"
        coverage_ok=0
    fi
done <"$WORK/all"
for entry in "${RUN[@]}" "${KNOWN_BUGS[@]}" "${SKIP[@]}"; do
    name=${entry%%|*}
    found=0
    for id in "${!listed[@]}"; do
        [[ $id == "$name" || $id == "$name".* ]] && { found=1; break; }
    done
    if [[ $found -eq 0 ]]; then
        echo "FAIL - $name is listed here but not in the installed suite"
        coverage_ok=0
    fi
done
if [[ $coverage_ok -eq 1 ]]; then
    passed=$((passed + 1))
    echo "ok   - all $(wc -l <"$WORK/all") tests of ${MODULES[*]} are classified (${#RUN[@]} run, ${#KNOWN_BUGS[@]} known bugs, the rest skipped)"
else
    failed=$((failed + 1))
fi

# --- the tests that must pass ---

echo "--- running ${#RUN[@]} tests under usiw run ---"
pyverbs_run "${RUN[@]}" 2>&1 | tee "$WORK/run.out"
status=${PIPESTATUS[0]}
run_passed=$(grep -c '^PASS ' "$WORK/run.out")
run_bad=$(grep -cE '^(FAIL|ERROR|SKIP|XFAIL|XPASS) ' "$WORK/run.out")
passed=$((passed + run_passed))
if [[ $status -ne 0 || $run_passed -ne ${#RUN[@]} ]]; then
    failed=$((failed + (run_bad > 0 ? run_bad : 1)))
    echo "FAIL - pyverbs: $run_passed of ${#RUN[@]} RUN tests passed (runner exit $status)"
fi

# --- known usiw bugs: information only ---

if [[ ${#KNOWN_BUGS[@]} -gt 0 ]]; then
    names=()
    for entry in "${KNOWN_BUGS[@]}"; do names+=("${entry%%|*}"); done
    pyverbs_run --survey "${names[@]}" >"$WORK/bugs.out" 2>&1
    echo "--- known usiw bugs (not counted) ---"
    for entry in "${KNOWN_BUGS[@]}"; do
        name=${entry%%|*}
        result=$(grep -E "^[A-Z]+ $name(:|$)" "$WORK/bugs.out" | cut -d' ' -f1)
        if [[ $result == PASS ]]; then
            echo "note - $name now passes: move it from KNOWN_BUGS to RUN"
        else
            echo "known - $name: ${result:-not run}: ${entry#*|}"
        fi
    done
fi

# --- rdma_cm traffic tests (test_rdmacm) ---
#
# The suite finds a device's IP address through
# /sys/class/infiniband/DEV/device/net/, which a usiw device (no kernel
# device) does not have. As root, the tests run in a private mount
# namespace where a tmpfs over /sys/class provides just that entry, naming
# lo; usiw itself reads no sysfs. Unprivileged runs report them skipped.
RDMACM_RUN=(
    test_rdmacm.CMTestCase.test_rdmacm_sync_traffic
    test_rdmacm.CMTestCase.test_rdmacm_async_traffic
    test_rdmacm.CMTestCase.test_rdmacm_async_read
    test_rdmacm.CMTestCase.test_rdmacm_async_write
    test_rdmacm.CMTestCase.test_rdmacm_async_reject_traffic
)
# Not run: test_rdmacm_async_udp_traffic (RDMA_PS_UDP: UD does not exist in
# iWARP, rdma_create_id answers EPROTONOSUPPORT as for kernel siw);
# test_rdmacm_async_traffic_external_qp (waits for
# RDMA_CM_EVENT_CONNECT_RESPONSE, which rdma_cm produces only for
# InfiniBand/RoCE; an iWARP connect goes straight to ESTABLISHED, as with
# kernel siw); the three multicast tests (no multicast on iWARP; they skip
# themselves).
if [[ $(id -u) -eq 0 ]] && command -v unshare >/dev/null; then
    echo "--- running ${#RDMACM_RUN[@]} rdma_cm tests (private /sys/class) ---"
    (cd "$WORK" && env -u PYTHONPATH -u PYTHONHOME -u USIW_PROVIDER_LIB -u LD_PRELOAD \
        USIW_CONFIG_DIR="$WORK/user" USIW_SYSTEM_CONFIG_DIR="$WORK/system" \
        PYTHONDONTWRITEBYTECODE=1 \
        unshare -m sh -c 'mount -t tmpfs usiw-sysfs /sys/class &&
            mkdir -p "/sys/class/infiniband/$1/device/net/lo" && shift && exec "$@"' \
        sh "$DEVICE" "$USIW" run "$PYTHON" "$RUNNER" "$WORK/tests" "$DEVICE" "${RDMACM_RUN[@]}") \
        2>&1 | tee "$WORK/rdmacm.out"
    cm_passed=$(grep -c '^PASS ' "$WORK/rdmacm.out")
    passed=$((passed + cm_passed))
    if [[ $cm_passed -ne ${#RDMACM_RUN[@]} ]]; then
        failed=$((failed + ${#RDMACM_RUN[@]} - cm_passed))
        echo "FAIL - pyverbs rdma_cm: $cm_passed of ${#RDMACM_RUN[@]} tests passed"
    fi
else
    echo "skip - the rdma_cm tests need root (a private mount namespace)"
fi

echo "$passed passed, $failed failed, ${#SKIP[@]} skip-list entries, ${#KNOWN_BUGS[@]} known bugs"
[[ $failed -eq 0 ]]
