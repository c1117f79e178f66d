// The fuzzer's GPU mode (fuzz.h check_gpu): to be filled in next.
#include "fuzz.h"

namespace fa_fuzz {

std::string check_gpu(const Case&) {
  return "the --gpu mode is not implemented yet (the CPU checks ran; see tests/fuzz/README.md)";
}

}  // namespace fa_fuzz
