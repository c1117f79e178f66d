// Helpers shared by fajit's gtest suites.
#pragma once

#include <cstdlib>
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

// Sets (value) or unsets (nullptr) an environment variable for one scope, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    value ? setenv(name, value, 1) : unsetenv(name);
  }
  ~ScopedEnv() { had_ ? setenv(name_, old_.c_str(), 1) : unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

}  // namespace fa::test
