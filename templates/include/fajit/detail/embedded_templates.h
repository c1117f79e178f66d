// The device headers of templates/, embedded at build time (cmake/EmbedTemplates.cmake).
#pragma once

namespace fa::detail {

struct EmbeddedHeader {
  const char* name;  // e.g. "fajit/forward.cuh", as written in #include "..."
  const char* text;
};

// All embedded headers; *count receives their number.
const EmbeddedHeader* embedded_headers(int* count);

}  // namespace fa::detail
