# Assemble the component OBJECT libraries into:
#  - fajit         : libfajit.so, MLIR/LLVM linked statically, only fa::/fajit_* exported
#  - fajit_static  : the same objects as an archive, for tests and tools that need internals
set(_objs)
foreach(_c IN LISTS FAJIT_COMPONENTS)
  list(APPEND _objs ${_c})
endforeach()

add_library(fajit SHARED)
target_link_libraries(fajit PRIVATE ${_objs})
target_link_options(fajit PRIVATE
  "LINKER:--version-script=${CMAKE_SOURCE_DIR}/cmake/fajit.map"
  "LINKER:--exclude-libs,ALL"
  "LINKER:--no-undefined"
  "LINKER:--gc-sections")
set_target_properties(fajit PROPERTIES
  LINK_DEPENDS "${CMAKE_SOURCE_DIR}/cmake/fajit.map"
  VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR})


add_library(fajit_static STATIC)
target_link_libraries(fajit_static PUBLIC ${_objs})
