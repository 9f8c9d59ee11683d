// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The core's device list (verbs/device_registry.h), in a binary that links
// the whole of usiw_core and nothing of the shared library's glue: the core
// must link complete on its own (no symbol only the glue defines), and
// serves exactly the devices a discovery adds, whoever that is.

#include <infiniband/verbs.h>

#include "verbs/device_registry.h"

// cmocka last: it defines macros that clash with the standard library.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

namespace {

using usiw::Device;

Device first;
Device second;
Device late;
int discoveries = 0;
size_t seen_while_discovering = 99;

// Reads the list between its two additions, as the real discovery does
// when libibverbs calls back into the interposer: it must see the first
// device and not wait for itself.
void discover() {
    ++discoveries;
    Device* const found[] = {&first};
    usiw::add_devices(found);
    seen_while_discovering = usiw::usiw_devices().size();
    Device* const more[] = {&second};
    usiw::add_devices(more);
}

// The discovery runs once, when the list is first read, and adds in order.
void test_discovery_runs_once(void**) {
    assert_int_equal(discoveries, 0);
    auto devices = usiw::usiw_devices();
    assert_int_equal(discoveries, 1);
    assert_int_equal(seen_while_discovering, 1);
    assert_int_equal(devices.size(), 2);
    assert_ptr_equal(devices[0], &first);
    assert_ptr_equal(devices[1], &second);
    devices = usiw::usiw_devices();
    assert_int_equal(discoveries, 1);
    assert_int_equal(devices.size(), 2);
}

// A handle is a usiw device's only if the list holds that device.
void test_lookup_by_handle(void**) {
    assert_ptr_equal(usiw::usiw_device(first.ibv()), &first);
    assert_ptr_equal(usiw::usiw_device(second.ibv()), &second);
    ibv_device foreign{};
    assert_null(usiw::usiw_device(&foreign));
    assert_null(usiw::usiw_device(late.ibv()));
    assert_null(usiw::usiw_device(nullptr));
}

// Devices added later (a kernel shim's) join the list; a span read before
// stays valid and unchanged.
void test_added_later(void**) {
    const auto before = usiw::usiw_devices();
    Device* const more[] = {&late};
    usiw::add_devices(more);
    const auto after = usiw::usiw_devices();
    assert_int_equal(after.size(), 3);
    assert_ptr_equal(after[2], &late);
    assert_ptr_equal(usiw::usiw_device(late.ibv()), &late);
    assert_int_equal(before.size(), 2);
    assert_ptr_equal(before[0], &first);
    assert_ptr_equal(before[1], &second);
    assert_int_equal(discoveries, 1);
}

// A device taken out (a kernel shim device gone) leaves the list; spans
// read before keep it; removing it again changes nothing.
void test_removed(void**) {
    const auto before = usiw::usiw_devices();
    usiw::remove_device(&second);
    const auto after = usiw::usiw_devices();
    assert_int_equal(after.size(), 2);
    assert_ptr_equal(after[0], &first);
    assert_ptr_equal(after[1], &late);
    assert_null(usiw::usiw_device(second.ibv()));
    assert_int_equal(before.size(), 3);
    assert_ptr_equal(before[1], &second);
    usiw::remove_device(&second);
    assert_int_equal(usiw::usiw_devices().size(), 2);
}

}  // namespace

int main(void) {
    usiw::set_device_discovery(discover);
    const CMUnitTest tests[] = {
        cmocka_unit_test(test_discovery_runs_once),
        cmocka_unit_test(test_lookup_by_handle),
        cmocka_unit_test(test_added_later),
        cmocka_unit_test(test_removed),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
