// fa::CacheOrigin: where a compiled kernel's binary came from (the JIT cache's lookups and
// fa::Kernel::origin() report it).
#pragma once

#include "fajit/export.h"

namespace fa {

enum class CacheOrigin { kMemory, kDisk, kCompiled };
FA_API const char* to_string(CacheOrigin o);  // "memory", "disk", "compiled"

}  // namespace fa
