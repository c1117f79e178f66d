// Helpers shared by fajit's gtest suites.
#pragma once

#include <exception>
#include <string>
#include <utility>

#include "fajit/error.h"

namespace fa::test {

// The message of the fa::Error `f` throws, so tests pin exact messages with EXPECT_EQ.
// A call that returns normally gives "<no fa::Error>", any other exception
// "<not fa::Error>: <what>": both fail an EXPECT_EQ against a real message.
template <typename F>
std::string error_of(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const fa::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<not fa::Error>: ") + e.what();
  }
  return "<no fa::Error>";
}

}  // namespace fa::test
