# Debian's MLIR/LLVM CMake packages link every MLIR library against the LLVM dylib
# (libLLVM-19.so, ~129 MB) through the imported target `LLVM`. fajit must not depend on
# any LLVM shared library (it has to load into processes that hold their own LLVM), so we
# rewrite those imported targets to use the static LLVMSupport/LLVMDemangle archives.
function(fajit_use_static_llvm)
  get_property(_targets DIRECTORY PROPERTY IMPORTED_TARGETS)
  foreach(_t IN LISTS _targets)
    get_target_property(_type ${_t} TYPE)
    if(_type STREQUAL "INTERFACE_LIBRARY" OR _type STREQUAL "EXECUTABLE")
      continue()
    endif()
    get_target_property(_libs ${_t} INTERFACE_LINK_LIBRARIES)
    if(NOT _libs)
      continue()
    endif()
    list(TRANSFORM _libs REPLACE "^LLVM$" "LLVMSupport")
    set_target_properties(${_t} PROPERTIES INTERFACE_LINK_LIBRARIES "${_libs}")
  endforeach()
  # LLVMSupport itself drags in z3, zlib and zstd shared libraries; we need none of them
  # (no compression, no SMT) at run time.
  set_target_properties(LLVMSupport PROPERTIES
    INTERFACE_LINK_LIBRARIES "rt;dl;m;pthread;LLVMDemangle")
endfunction()
