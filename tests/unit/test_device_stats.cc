// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The devices' shared counters (host/device_stats.h): each process adds to
// a slot of its own, a slot of an ended process is taken over with what it
// holds, every counter reads as the sum of the slots, and a reset zeroes
// them all.

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "host/device_stats.h"

// cmocka last: it defines macros that clash with the standard library.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

namespace {

using usiw::claim_stats_slot;
using usiw::DeviceStats;
using usiw::map_stats_segment;
using usiw::stats_total;
using usiw::StatsSegment;

// A device name of this process's own; its segment is removed before and
// after each case.
struct TestSegment {
    std::string device;
    StatsSegment* segment = nullptr;

    explicit TestSegment(const char* what)
        : device("stats-test." + std::to_string(getpid()) + "." + what) {
        unlink_segment();
        std::string error;
        segment = map_stats_segment(device, true, &error);
        assert_non_null(segment);
    }
    ~TestSegment() {
        munmap(segment, sizeof(StatsSegment));
        unlink_segment();
    }
    void unlink_segment() const {
        shm_unlink(("/usiw." + std::to_string(getuid()) + "." + device + ".v" +
                    std::to_string(StatsSegment::kVersion))
                       .c_str());
    }
    size_t slot_of(const DeviceStats* slot) const { return slot - segment->slots; }
};

// A pid that names no process: a child that has exited and been reaped.
pid_t ended_pid() {
    const pid_t child = fork();
    if (child == 0)
        _exit(0);
    assert_true(child > 0);
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    return child;
}

void test_header_for_readers_outside_usiw(void**) {
    TestSegment t("header");
    assert_true(t.segment->magic == StatsSegment::kMagic);
    assert_int_equal(t.segment->version, StatsSegment::kVersion);
    assert_int_equal(t.segment->size, sizeof(StatsSegment));
    assert_int_equal(t.segment->slot_count, StatsSegment::kSlots);
    assert_int_equal(t.segment->slot_bytes, sizeof(DeviceStats));
    assert_int_equal(t.segment->slots_offset, reinterpret_cast<const char*>(&t.segment->slots[0]) -
                                                  reinterpret_cast<const char*>(t.segment));
    // Slots of different processes share no cache line.
    assert_int_equal(sizeof(DeviceStats) % 64, 0);
    assert_int_equal(t.segment->slots_offset % 64, 0);
}

void test_each_process_its_own_slot_counters_summed(void**) {
    TestSegment t("own");
    DeviceStats* mine = claim_stats_slot(t.segment);
    assert_ptr_equal(claim_stats_slot(t.segment), mine);  // kept, not claimed twice
    assert_int_equal(t.segment->owner[t.slot_of(mine)].load(), getpid());
    usiw::count(mine->tx_bytes, 3);

    // Another process (a child, mapping the segment anew) takes another
    // slot and adds there.
    int report[2];
    assert_int_equal(pipe(report), 0);
    const pid_t child = fork();
    if (child == 0) {
        std::string error;
        StatsSegment* own = map_stats_segment(t.device, false, &error);
        if (!own)
            _exit(1);
        DeviceStats* slot = claim_stats_slot(own);
        usiw::count(slot->tx_bytes, 5);
        const uint32_t index = static_cast<uint32_t>(slot - own->slots);
        _exit(write(report[1], &index, sizeof index) == sizeof index ? 0 : 1);
    }
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    uint32_t child_slot = 0;
    assert_int_equal(read(report[0], &child_slot, sizeof child_slot), sizeof child_slot);
    close(report[0]);
    close(report[1]);
    assert_int_not_equal(child_slot, t.slot_of(mine));
    assert_int_equal(t.segment->owner[child_slot].load(), child);

    assert_int_equal(mine->tx_bytes.load(), 3);
    assert_int_equal(stats_total(*t.segment, &DeviceStats::tx_bytes), 8);
    assert_int_equal(stats_total(*t.segment, &DeviceStats::rx_bytes), 0);
}

void test_slot_of_ended_process_taken_over_with_its_counts(void**) {
    TestSegment t("ended");
    const pid_t gone = ended_pid();
    for (auto& owner : t.segment->owner)
        owner.store(gone);
    usiw::count(t.segment->slots[0].rx_fpdus, 11);

    DeviceStats* mine = claim_stats_slot(t.segment);
    assert_int_equal(t.segment->owner[t.slot_of(mine)].load(), getpid());
    usiw::count(mine->rx_fpdus, 1);
    // What the ended process counted still counts.
    assert_int_equal(stats_total(*t.segment, &DeviceStats::rx_fpdus), 12);
}

void test_every_slot_live_one_is_shared(void**) {
    TestSegment t("full");
    const pid_t live = getppid();  // the test runner, alive while we run
    for (auto& owner : t.segment->owner)
        owner.store(live);

    DeviceStats* shared = claim_stats_slot(t.segment);
    assert_ptr_equal(shared,
                     &t.segment->slots[static_cast<uint32_t>(getpid()) % StatsSegment::kSlots]);
    // Its owner stays the live process; both add to it, exactly.
    assert_int_equal(t.segment->owner[t.slot_of(shared)].load(), live);
    usiw::count(shared->tx_fpdus, 2);
    usiw::count(shared->tx_fpdus, 2);
    assert_int_equal(stats_total(*t.segment, &DeviceStats::tx_fpdus), 4);
}

void test_reset_zeroes_every_slot(void**) {
    TestSegment t("reset");
    for (DeviceStats& slot : t.segment->slots) {
        usiw::count(slot.tx_bytes, 1);
        usiw::count(slot.immediate_data_received, 2);
    }
    assert_int_equal(stats_total(*t.segment, &DeviceStats::tx_bytes), StatsSegment::kSlots);
    usiw::reset_device_stats(t.segment);
    for (const usiw::StatField& f : usiw::stat_fields())
        assert_int_equal(stats_total(*t.segment, f.counter), 0);
}

}  // namespace

int main() {
    const CMUnitTest tests[] = {
        cmocka_unit_test(test_header_for_readers_outside_usiw),
        cmocka_unit_test(test_each_process_its_own_slot_counters_summed),
        cmocka_unit_test(test_slot_of_ended_process_taken_over_with_its_counts),
        cmocka_unit_test(test_every_slot_live_one_is_shared),
        cmocka_unit_test(test_reset_zeroes_every_slot),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
