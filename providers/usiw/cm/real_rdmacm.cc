// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
#include "cm/real_rdmacm.h"

#include <dlfcn.h>

namespace usiw::cm {

RealSymbol::RealSymbol(const char* name, const char* version)
    : address_(dlvsym(RTLD_NEXT, name, version)) {}

const RealRdmacm& real_rdmacm() {
    static const RealRdmacm* real = new RealRdmacm;
    return *real;
}

}  // namespace usiw::cm
