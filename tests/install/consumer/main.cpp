// Compiles ALiBi + causal for sm_90a (NVRTC, no GPU needed) through the installed fajit and
// prints its IR and the mods' part of the generated CUDA.
#include <iostream>

#include <fajit/kernel.h>
#include <fajit/mods.h>

int main() {
  fa::Options o;
  o.arch = "sm_90a";
  fa::Kernel k = fa::compile(fa::mods::alibi(), fa::mods::causal(), o);
  const std::string& cuda = k.cuda_source();
  size_t mods = cuda.find("score_mod(");
  if (mods == std::string::npos || k.cubin().empty()) {
    std::cerr << "no score_mod in the generated CUDA, or no cubin\n";
    return 1;
  }
  std::cout << k.program().to_mlir() << "\n"
            << cuda.substr(mods, cuda.find("};", mods) - mods) << "\n... " << cuda.size()
            << " bytes of CUDA, " << k.cubin().size() << "-byte cubin (" << fa::to_string(k.origin())
            << ")\n";
  return 0;
}
