// Symbol visibility: libfajit.so is built with -fvisibility=hidden; only FA_API
// declarations (and the C API) are exported (see cmake/fajit.map).
#pragma once

#if defined(__GNUC__)
#define FA_API __attribute__((visibility("default")))
#else
#define FA_API
#endif
