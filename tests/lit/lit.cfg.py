# -*- Python -*-
# lit configuration of the fajit FileCheck suite. Loaded from the generated
# <build>/tests/lit/lit.site.cfg.py, which sets the paths used here.
import os

import lit.formats
from lit.llvm import llvm_config
from lit.llvm.subst import ToolSubst

config.name = "fajit"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir", ".test"]
config.excludes = ["CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py.in", "Inputs"]

config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = config.fajit_lit_binary_dir

# FileCheck, not and count come from LLVM 19, never from whatever else is on PATH.
llvm_config.with_system_environment(["HOME", "TMP", "TEMP"])
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
llvm_config.with_environment("PATH", config.fajit_opt_dir, append_path=True)
llvm_config.use_default_substitutions()

llvm_config.add_tool_substitutions(
    [ToolSubst("fajit-opt", unresolved="fatal")], [config.fajit_opt_dir])

# `%fajit` expands to the CLI (tools/fajit, target fajit_cli); tests that run it declare
# `REQUIRES: fajit-cli`, so they are reported unsupported until it is built.
config.substitutions.append(("%fajit", '"%s"' % config.fajit_cli_path))
if os.path.isfile(config.fajit_cli_path) and os.access(config.fajit_cli_path, os.X_OK):
    config.available_features.add("fajit-cli")

# `fajit dump --sass` runs cuobjdump or nvdisasm, found on the tests' PATH or in
# /usr/local/cuda/bin ($FAJIT_CUDA_BIN, which lit does not pass on, overrides it). Tests of
# that path declare `REQUIRES: cuda-sass-tool`.
_sass_dirs = config.environment.get("PATH", "").split(os.pathsep) + ["/usr/local/cuda/bin"]
if any(os.access(os.path.join(d, tool), os.X_OK)
       for d in _sass_dirs if d for tool in ("cuobjdump", "nvdisasm")):
    config.available_features.add("cuda-sass-tool")
