# `cmake --install`: headers, the versioned libfajit.so, the fajit CLI, a CMake package
# (find_package(fajit) -> fajit::fajit) and a pkg-config file (fajit.pc), relocatable to any
# prefix. Under scikit-build-core (the Python wheel) only libfajit.so, into the package.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

if(SKBUILD)
  # One file (a wheel would copy the SONAME symlinks as files); python/fajit/_capi.py loads it.
  install(FILES $<TARGET_FILE:fajit> DESTINATION fajit RENAME libfajit.so)
  return()
endif()

target_include_directories(fajit INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
install(TARGETS fajit EXPORT fajitTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})

# The public headers: those directly in include/fajit/ (subfolders are internal), and the
# kernel ABI structs that fajit/block_mask.h includes.
file(GLOB _fajit_public_headers
  ${CMAKE_SOURCE_DIR}/compiler/include/fajit/*.h
  ${CMAKE_SOURCE_DIR}/runtime/include/fajit/*.h)
install(FILES ${_fajit_public_headers} ${CMAKE_SOURCE_DIR}/templates/fajit/params.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/fajit)

if(TARGET fajit_cli)
  install(TARGETS fajit_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

set(_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/fajit)
install(EXPORT fajitTargets NAMESPACE fajit:: DESTINATION ${_cmake_dir})
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/fajitConfig.cmake.in
  ${CMAKE_BINARY_DIR}/fajitConfig.cmake INSTALL_DESTINATION ${_cmake_dir})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/fajitConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/fajitConfig.cmake ${CMAKE_BINARY_DIR}/fajitConfigVersion.cmake
  DESTINATION ${_cmake_dir})

# pkg-config: paths relative to the .pc file, so the tree can be installed anywhere.
set(_pc_dir ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
file(RELATIVE_PATH FAJIT_PC_TO_PREFIX /prefix/${_pc_dir} /prefix)
string(REGEX REPLACE "/$" "" FAJIT_PC_TO_PREFIX "${FAJIT_PC_TO_PREFIX}")
configure_file(${CMAKE_SOURCE_DIR}/cmake/fajit.pc.in ${CMAKE_BINARY_DIR}/fajit.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/fajit.pc DESTINATION ${_pc_dir})
