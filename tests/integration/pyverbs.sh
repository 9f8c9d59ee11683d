#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
# Runs rdma-core's own pyverbs tests (Debian's python3-pyverbs ships them
# under /usr/share/doc/rdma-core/tests) against usiw0, through `usiw run`,
# for the modules that apply to an iWARP RC device (MODULES below).
#
# Every test of those modules is classified below, by name:
#   RUN         applies to iWARP and passes: must pass, or this test fails;
#   ACKED_RUN   the same, run with USIW_COMPLETION=acked: tests that assume
#               InfiniBand's completion semantics (a WRITE completes once the
#               target placed it; a SEND the target refuses completes with
#               the remote error), which usiw offers as an option;
#   RDMACM_RUN  the same as RUN, for test_rdmacm's traffic tests, which need
#               root (see the rdma_cm section at the end); RDMACM_ACKED_RUN
#               the same with USIW_COMPLETION=acked;
#   KNOWN_BUGS  applies to iWARP but fails today because usiw lacks
#               something: run for information only (a notice when one
#               starts passing, so it can move to RUN);
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

MODULES=(test_device test_pd test_mr test_cq test_cqex test_qp test_qpex test_cq_events
    test_rdmacm test_shared_pd test_parent_domain test_relaxed_ordering test_addr test_fork
    test_atomic)

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
    test_device.DeviceTest.test_phys_port_cnt_ex
    test_pd.PDTest.test_alloc_pd
    test_pd.PDTest.test_dealloc_pd
    test_pd.PDTest.test_destroy_pd_twice
    test_pd.PDTest.test_multiple_pd_creation
    test_mr.MRTest.test_reg_mr_bad_flags
    test_mr.MWTest.test_reg_mw_wrong_type
    test_cq.CQAPITest.test_create_cq
    test_cq.CQAPITest.test_create_cq_bad_flow
    test_cq.CQAPITest.test_create_cq_with_comp_channel
    test_cqex.CQEXAPITest.test_create_cq_ex
    test_cqex.CQEXAPITest.test_create_cq_ex_bad_flow
    test_qp.QPTest.test_create_rc_qp_with_attr
    test_qp.QPTest.test_create_rc_qp_ex_with_attr
    test_qp.QPTest.test_query_rc_qp
    test_qp.QPTest.test_create_rc_qp_no_attr
    test_qp.QPTest.test_create_rc_qp_ex_no_attr
    test_fork.ForkAPITest.test_is_fork_initialized
    # RC traffic between QPs connected by ibv_modify_qp (the rendezvous)
    test_cqex.CqExTestCase.test_rc_traffic_cq_ex
    test_qpex.QpExTestCase.test_qp_ex_rc_send
    test_qpex.QpExTestCase.test_qp_ex_rc_rdma_read
    test_qpex.QpExTestCase.test_qp_ex_rc_rdma_read_zero_size
    test_qpex.QpExTestCase.test_qp_ex_rc_rdma_write_zero_length
    test_cq_events.CqEventsTestCase.test_cq_events_rc
    test_parent_domain.ParentDomainTrafficTest.test_without_allocators_rc_traffic
    test_parent_domain.ParentDomainTrafficTest.test_default_allocators_rc_traffic
    test_parent_domain.ParentDomainTrafficTest.test_mem_align_rc_traffic
    test_parent_domain.ParentDomainTrafficTest.test_mem_align_srq_excq_rc_traffic
    test_relaxed_ordering.RoTestCase.test_ro_rc_traffic
    # RFC 7306 immediate data and atomics, hostile atomics included
    test_qpex.QpExTestCase.test_qp_ex_rc_send_imm
    test_qpex.QpExTestCase.test_qp_ex_rc_rdma_write_imm
    test_qpex.QpExTestCase.test_qp_ex_rc_atomic_cmp_swp
    test_qpex.QpExTestCase.test_qp_ex_rc_atomic_fetch_add
    test_atomic.AtomicTest.test_atomic_cmp_and_swap
    test_atomic.AtomicTest.test_atomic_fetch_and_add
    test_atomic.AtomicTest.test_atomic_invalid_qp_access
    test_atomic.AtomicTest.test_atomic_invalid_mr_access
    test_atomic.AtomicTest.test_atomic_non_aligned_addr
    test_atomic.AtomicTest.test_atomic_invalid_lkey
    test_atomic.AtomicTest.test_atomic_invalid_rkey
)

# Run with USIW_COMPLETION=acked (Documentation/verbs.md): each checks the
# target's memory as soon as its RDMA WRITE completes, or expects a SEND
# whose receive fails the target's check to complete with 'Remote operation
# error', as an InfiniBand requester reports the responder's NAK.
ACKED_RUN=(
    test_mr.MRTest.test_mr_rereg_access
    test_mr.MRTest.test_mr_rereg_access_bad_flow
    test_mr.MRTest.test_mr_rereg_addr
    test_mr.MRTest.test_mr_rereg_pd
    test_qpex.QpExTestCase.test_qp_ex_rc_rdma_write
    test_mr.MWTest.test_mw_type1
    test_mr.MWTest.test_mw_type2
    test_mr.MWTest.test_invalidate_mw_type1
    test_mr.MWTest.test_mw_type2_invalidate_local
    test_mr.MWTest.test_mw_type2_invalidate_remote
    test_mr.MWTest.test_mw_type2_invalidate_dealloc
    test_qpex.QpExTestCase.test_qp_ex_rc_bind_mw
    # a context, PD and MR imported by handle (ibv_import_device on a dup
    # of the command fd), with RDMA WRITE traffic through them
    test_shared_pd.SharedPDTestCase.test_imported_rc_ex_rdma_write
)

# Run as root only, in a private mount namespace (the rdma_cm section).
RDMACM_RUN=(
    test_rdmacm.CMTestCase.test_rdmacm_sync_traffic
    test_rdmacm.CMTestCase.test_rdmacm_async_traffic
    test_rdmacm.CMTestCase.test_rdmacm_async_read
    test_rdmacm.CMTestCase.test_rdmacm_async_reject_traffic
)
# The same, with USIW_COMPLETION=acked: the target reads its memory after a
# barrier with the initiator, which passes it once its WRITEs complete.
RDMACM_ACKED_RUN=(
    test_rdmacm.CMTestCase.test_rdmacm_async_write
)

# "NAME|why it fails". Move a test to RUN once it passes.
KNOWN_BUGS=(
)

# Like RUN, but run only when 2 MiB huge pages could be reserved (as root);
# otherwise reported as skipped.
RUN_WITH_HUGE_PAGES=(
    test_parent_domain.ParentDomainTrafficTest.test_huge_page_traffic
)

# "NAME|reason": NAME is a test, or a Module.Class meaning all its tests.
UD="UD does not exist in iWARP"
SKIP=(
    "test_device.DMTest|device memory (ibv_alloc_dm): no such thing on an RNIC; usiw has none"
    "test_device.SharedDMTest|device memory (ibv_alloc_dm) imported into another context; usiw has none"
    "test_mr.DeviceMemoryAPITest|MRs on device memory (ibv_reg_dm_mr); usiw has no device memory"
    "test_mr.DeviceMemoryTest|traffic through device memory MRs; usiw has no device memory"
    "test_mr.DmaBufMRTest|dma-buf MRs need a GPU dma-buf exporter (and ibv_reg_dmabuf_mr); not on this machine, not in usiw"
    "test_mr.DmaBufTestCase|dma-buf MR traffic: needs a GPU dma-buf exporter"
    "test_cq.CQTest.test_resize_cq|fills the CQ with UD sends through an address handle; $UD"
    "test_cqex.CqExTestCase.test_ud_traffic_cq_ex|UD QPs; $UD"
    "test_cqex.CqExTestCase.test_xrc_traffic_cq_ex|XRC QPs: an InfiniBand transport, not iWARP"
    "test_qp.QPTest.test_create_raw_qp_no_attr|raw packet QP: not an iWARP QP type"
    "test_qp.QPTest.test_create_raw_qp_with_attr|raw packet QP: not an iWARP QP type"
    "test_qp.QPTest.test_create_raw_qp_ex_no_attr|raw packet QP: not an iWARP QP type"
    "test_qp.QPTest.test_create_raw_qp_ex_with_attr|raw packet QP: not an iWARP QP type"
    "test_qp.QPTest.test_query_raw_qp|raw packet QP: not an iWARP QP type"
    "test_qp.QPTest.test_create_raw_qp_ex_with_illegal_caps_max_recv_sge|despite the name, creates a UD QP (illegal caps); $UD"
    "test_qp.QPTest.test_create_raw_qp_ex_with_illegal_caps_max_recv_wr|despite the name, creates a UD QP (illegal caps); $UD"
    "test_qp.QPTest.test_create_raw_qp_ex_with_illegal_caps_max_send_sge|despite the name, creates a UD QP (illegal caps); $UD"
    "test_qp.QPTest.test_create_raw_qp_ex_with_illegal_caps_max_send_wr|despite the name, creates a UD QP (illegal caps); $UD"
    "test_qp.QPTest.test_create_uc_qp_no_attr|UC QP: UC does not exist in iWARP"
    "test_qp.QPTest.test_create_uc_qp_with_attr|UC QP: UC does not exist in iWARP"
    "test_qp.QPTest.test_create_uc_qp_ex_no_attr|UC QP: UC does not exist in iWARP"
    "test_qp.QPTest.test_create_uc_qp_ex_with_attr|UC QP: UC does not exist in iWARP"
    "test_qp.QPTest.test_query_uc_qp|UC QP: UC does not exist in iWARP"
    "test_qp.QPTest.test_create_ud_qp_no_attr|UD QP: $UD"
    "test_qp.QPTest.test_create_ud_qp_with_attr|UD QP: $UD"
    "test_qp.QPTest.test_create_ud_qp_ex_no_attr|UD QP: $UD"
    "test_qp.QPTest.test_create_ud_qp_ex_with_attr|UD QP: $UD"
    "test_qp.QPTest.test_query_ud_qp|UD QP: $UD"
    "test_qp.QPTest.test_modify_ud_qp|UD QP (QKey, RTR/RTS without a peer): $UD"
    "test_qp.QPTest.test_query_data_in_order|queries a UD QP (ibv_query_qp_data_in_order); $UD"
    "test_qpex.QpExTestCase.test_qp_ex_rc_atomic_write|ATOMIC WRITE: an InfiniBand (IBTA 1.5) operation with no iWARP opcode"
    "test_qpex.QpExTestCase.test_qp_ex_ud_send|UD QPs; $UD"
    "test_qpex.QpExTestCase.test_qp_ex_ud_send_imm|UD QPs; $UD"
    "test_qpex.QpExTestCase.test_qp_ex_ud_zero_size|UD QPs; $UD"
    "test_qpex.QpExTestCase.test_qp_ex_xrc_send|XRC QPs: an InfiniBand transport, not iWARP"
    "test_qpex.QpExTestCase.test_qp_ex_xrc_send_imm|XRC QPs: an InfiniBand transport, not iWARP"
    "test_atomic.AtomicTest.test_xrc_atomic_fetch_and_add|XRC QPs: an InfiniBand transport, not iWARP"
    "test_atomic.AtomicTest.test_xrc_atomic_cmp_and_swap|XRC QPs: an InfiniBand transport, not iWARP"
    "test_qpex.QpExTestCase.test_full_rq_bad_flow|checks run on UD QPs (the 'ud_send' players); $UD"
    "test_qpex.QpExTestCase.test_post_receive_qp_state_bad_flow|checks run on UD QPs (the 'ud_send' players); $UD"
    "test_qpex.QpExTestCase.test_post_send_qp_state_bad_flow|checks run on UD QPs (the 'ud_send' players); $UD"
    "test_qpex.QpExTestCase.test_rq_with_larger_sgl_bad_flow|checks run on UD QPs (the 'ud_send' players); $UD"
    "test_cq_events.CqEventsTestCase.test_cq_events_ud|completion events over UD traffic; $UD"
    "test_rdmacm.CMTestCase.test_rdmacm_async_udp_traffic|RDMA_PS_UDP: $UD (rdma_create_id answers EPROTONOSUPPORT, as for kernel siw)"
    "test_rdmacm.CMTestCase.test_rdmacm_async_traffic_external_qp|waits for RDMA_CM_EVENT_CONNECT_RESPONSE, which rdma_cm produces only for InfiniBand/RoCE; an iWARP connect goes straight to ESTABLISHED (kernel siw alike)"
    "test_rdmacm.CMTestCase.test_rdmacm_async_multicast_traffic|multicast: $UD"
    "test_rdmacm.CMTestCase.test_rdmacm_async_ex_multicast_traffic|multicast: $UD"
    "test_rdmacm.CMTestCase.test_rdmacm_async_ex_leave_multicast_traffic|multicast: $UD"
    "test_parent_domain.ParentDomainTrafficTest.test_mem_align_ud_traffic|UD QPs; $UD"
    "test_relaxed_ordering.RoTestCase.test_ro_ud_traffic|UD QPs; $UD"
    "test_relaxed_ordering.RoTestCase.test_ro_xrc_traffic|XRC QPs: an InfiniBand transport, not iWARP"
    "test_addr.AHTest|address handles (ibv_create_ah) address UD QPs; $UD, and usiw, like Linux siw, has no address handles (EOPNOTSUPP: the tests skip)"
)

. "$HERE/../../scripts/lib/usiw.sh"

[[ -x $PYTHON ]] || bail "$PYTHON not found"
[[ -d $SUITE ]] || bail "no pyverbs test suite at $SUITE (Debian package python3-pyverbs)"
env -u PYTHONPATH -u PYTHONHOME "$PYTHON" -c 'import pyverbs.device' 2>/dev/null ||
    bail "$PYTHON cannot import pyverbs (Debian package python3-pyverbs)"
[[ -x $USIW ]] || bail "$USIW is not executable"

WORK=$(cd "$(mktemp -d)" && pwd -P)
# 2 MiB huge pages for the tests that allocate from them: as root, two more
# are reserved for the run if fewer are free, and the count put back after.
HUGE_SYSCTL=/proc/sys/vm/nr_hugepages
huge_pages_before=
huge_free() { awk '/^HugePages_Free:/ {print $2}' /proc/meminfo; }
cleanup() {
    [[ -n $huge_pages_before ]] && echo "$huge_pages_before" >"$HUGE_SYSCTL"
    rm -rf "$WORK"
}
trap cleanup EXIT
if [[ $(id -u) -eq 0 && -w $HUGE_SYSCTL && $(huge_free) -lt 2 ]]; then
    huge_pages_before=$(cat "$HUGE_SYSCTL")
    echo $((huge_pages_before + 2)) >"$HUGE_SYSCTL" 2>/dev/null
fi
cp -r "$SUITE" "$WORK/tests"
gunzip -f "$WORK"/tests/*.gz || bail "cannot unpack the suite's .gz files"
mkdir -p "$WORK/user" "$WORK/system"  # no links configured: the default usiw0 on lo

# pyverbs_run ARGS...: the runner under `usiw run`, in a clean environment
# as far as usiw and Python are concerned; USIW_COMPLETION is $COMPLETION
# (transport unless the caller sets it).
pyverbs_run() {
    (cd "$WORK" && env -u PYTHONPATH -u PYTHONHOME -u USIW_PROVIDER_LIB -u LD_PRELOAD \
        -u XDG_CONFIG_HOME -u RDMAV_DRIVERS -u IBV_DRIVERS \
        USIW_CONFIG_DIR="$WORK/user" USIW_SYSTEM_CONFIG_DIR="$WORK/system" \
        USIW_COMPLETION="${COMPLETION:-transport}" \
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
    for name in "${RUN[@]}" "${ACKED_RUN[@]}" "${RDMACM_RUN[@]}" "${RDMACM_ACKED_RUN[@]}" \
        "${RUN_WITH_HUGE_PAGES[@]}"; do
        [[ $id == "$name" ]] && { echo RUN; return; }
    done
    for entry in "${KNOWN_BUGS[@]}"; do [[ $id == "${entry%%|*}" ]] && { echo KNOWN_BUGS; return; }; done
    for entry in "${SKIP[@]}"; do
        name=${entry%%|*}
        [[ $id == "$name" || $id == "$name".* ]] && { echo SKIP; return; }
    done
}

coverage_ok=1
while read -r id; do
    if [[ -z $(classify "$id") ]]; then
        echo "  $id is in no list (RUN, ACKED_RUN, RDMACM_RUN, RDMACM_ACKED_RUN, RUN_WITH_HUGE_PAGES, KNOWN_BUGS, SKIP): classify it"
        coverage_ok=0
    fi
done <"$WORK/all"
for entry in "${RUN[@]}" "${ACKED_RUN[@]}" "${RDMACM_RUN[@]}" "${RDMACM_ACKED_RUN[@]}" \
    "${RUN_WITH_HUGE_PAGES[@]}" "${KNOWN_BUGS[@]}" "${SKIP[@]}"; do
    name=${entry%%|*}
    found=0
    for id in "${!listed[@]}"; do
        [[ $id == "$name" || $id == "$name".* ]] && { found=1; break; }
    done
    if [[ $found -eq 0 ]]; then
        echo "  $name is listed here but not in the installed suite"
        coverage_ok=0
    fi
done
if [[ $coverage_ok -eq 1 ]]; then
    ok "all $(wc -l <"$WORK/all") tests of ${MODULES[*]} are classified" \
        "($((${#RUN[@]} + ${#ACKED_RUN[@]} + ${#RDMACM_RUN[@]} + ${#RDMACM_ACKED_RUN[@]} + ${#RUN_WITH_HUGE_PAGES[@]})) run," \
        "${#KNOWN_BUGS[@]} known bugs, the rest skipped)"
else
    bad "the lists (RUN, ACKED_RUN, RDMACM_RUN, RDMACM_ACKED_RUN, RUN_WITH_HUGE_PAGES, KNOWN_BUGS, SKIP) and the installed suite differ, as above"
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
    echo "FAIL: pyverbs: $run_passed of ${#RUN[@]} RUN tests passed (runner exit $status)"
fi

# --- the tests that assume InfiniBand's completion semantics ---

echo "--- running ${#ACKED_RUN[@]} tests with USIW_COMPLETION=acked ---"
COMPLETION=acked pyverbs_run "${ACKED_RUN[@]}" 2>&1 | tee "$WORK/acked.out"
status=${PIPESTATUS[0]}
acked_passed=$(grep -c '^PASS ' "$WORK/acked.out")
passed=$((passed + acked_passed))
if [[ $status -ne 0 || $acked_passed -ne ${#ACKED_RUN[@]} ]]; then
    failed=$((failed + ${#ACKED_RUN[@]} - acked_passed))
    [[ $acked_passed -eq ${#ACKED_RUN[@]} ]] && failed=$((failed + 1))
    echo "FAIL: pyverbs: $acked_passed of ${#ACKED_RUN[@]} ACKED_RUN tests passed (runner exit $status)"
fi

# --- tests that need 2 MiB huge pages ---

if [[ ${#RUN_WITH_HUGE_PAGES[@]} -gt 0 ]]; then
    if [[ $(huge_free) -ge 2 ]]; then
        echo "--- running ${#RUN_WITH_HUGE_PAGES[@]} tests with huge pages ---"
        pyverbs_run "${RUN_WITH_HUGE_PAGES[@]}" 2>&1 | tee "$WORK/huge.out"
        huge_passed=$(grep -c '^PASS ' "$WORK/huge.out")
        passed=$((passed + huge_passed))
        if [[ $huge_passed -ne ${#RUN_WITH_HUGE_PAGES[@]} ]]; then
            failed=$((failed + ${#RUN_WITH_HUGE_PAGES[@]} - huge_passed))
            echo "FAIL: pyverbs: $huge_passed of ${#RUN_WITH_HUGE_PAGES[@]} huge-page tests passed"
        fi
    else
        skip "${RUN_WITH_HUGE_PAGES[*]}: no two 2 MiB huge pages free (as root this" \
            "script reserves them; see $HUGE_SYSCTL)"
    fi
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
# rdmacm_run OUTPUT COMPLETION TEST...: the tests in that namespace, with
# USIW_COMPLETION=COMPLETION; counts what passed and failed.
rdmacm_run() {
    local out=$1 completion=$2
    shift 2
    echo "--- running $# rdma_cm tests (private /sys/class, USIW_COMPLETION=$completion) ---"
    (cd "$WORK" && env -u PYTHONPATH -u PYTHONHOME -u USIW_PROVIDER_LIB -u LD_PRELOAD \
        USIW_CONFIG_DIR="$WORK/user" USIW_SYSTEM_CONFIG_DIR="$WORK/system" \
        USIW_COMPLETION="$completion" PYTHONDONTWRITEBYTECODE=1 \
        unshare -m sh -c 'mount -t tmpfs usiw-sysfs /sys/class &&
            mkdir -p "/sys/class/infiniband/$1/device/net/lo" && shift && exec "$@"' \
        sh "$DEVICE" "$USIW" run "$PYTHON" "$RUNNER" "$WORK/tests" "$DEVICE" "$@") \
        2>&1 | tee "$out"
    local cm_passed
    cm_passed=$(grep -c '^PASS ' "$out")
    passed=$((passed + cm_passed))
    if [[ $cm_passed -ne $# ]]; then
        failed=$((failed + $# - cm_passed))
        echo "FAIL: pyverbs rdma_cm: $cm_passed of $# tests passed (USIW_COMPLETION=$completion)"
    fi
}

if [[ $(id -u) -eq 0 ]] && command -v unshare >/dev/null; then
    rdmacm_run "$WORK/rdmacm.out" transport "${RDMACM_RUN[@]}"
    rdmacm_run "$WORK/rdmacm-acked.out" acked "${RDMACM_ACKED_RUN[@]}"
else
    skip "the rdma_cm tests need root (a private mount namespace)"
fi

echo "$passed passed, $failed failed, ${#SKIP[@]} skip-list entries, ${#KNOWN_BUGS[@]} known bugs"
[[ $failed -eq 0 ]]
