// fajit-opt: the MlirOptMain driver for the fa dialect, so every pass is testable from text.
//   fajit-opt input.mlir --canonicalize --cse
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

#include "fajit/Dialect/FA/FAOps.h"
#include "fajit/Dialect/FA/Passes.h"

int main(int argc, char **argv) {
  mlir::registerCanonicalizerPass();
  mlir::registerCSEPass();
  mlir::registerSCCPPass();
  mlir::registerSymbolDCEPass();
  mlir::fa::registerFAPasses();
  mlir::DialectRegistry registry;
  mlir::fa::registerFADialects(registry);
  return mlir::asMainReturnCode(mlir::MlirOptMain(argc, argv, "fajit optimizer driver\n", registry));
}
