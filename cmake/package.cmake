# What topocoll installs and how consumers find it (docs/install.md):
#   - libtopocoll.so.0 (SONAME, from every layer; only TOPOCOLL_API/TCCL_API symbols exported), target topocoll::topocoll
#     (C++) and topocoll::c (the C API of topocoll.h);
#   - libtopocoll_nccl.so (NCCL's API, target topocoll::nccl) and the drop-in name lib/topocoll/nccl/libnccl.so.2;
#   - the headers, the `topocoll` CLI, the perf tools under nccl-tests' names, the Python package, docs and examples;
#   - a CMake package (find_package(topocoll CONFIG)), pkg-config files, and a Debian package (cpack -G DEB).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# libtopocoll.so: every layer whole, so that the API's symbols are in it even though nothing inside refers to them.
add_library(topocoll_shared SHARED ${CMAKE_SOURCE_DIR}/src/runtime/library.cc)
# (The archives by file inside --whole-archive, then the targets, which bring their own dependencies; CMake's
# $<LINK_LIBRARY:WHOLE_ARCHIVE> refuses archives that also come as another layer's dependency.)
set(topocoll_layer_targets)
set(topocoll_layer_files)
foreach(layer IN LISTS TOPOCOLL_LAYERS)
  list(APPEND topocoll_layer_targets topocoll_${layer})
  list(APPEND topocoll_layer_files $<TARGET_FILE:topocoll_${layer}>)
endforeach()
target_link_libraries(topocoll_shared PRIVATE -Wl,--whole-archive ${topocoll_layer_files} -Wl,--no-whole-archive
                                              ${topocoll_layer_targets})
# The headers use fmt (status.h): a C++ consumer compiles and links against it too.
target_link_libraries(topocoll_shared PUBLIC fmt::fmt)
target_include_directories(topocoll_shared PUBLIC "$<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/include>"
                                                  "$<BUILD_INTERFACE:${CMAKE_BINARY_DIR}/layers/common>"
                                                  "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>")
set_target_properties(topocoll_shared PROPERTIES OUTPUT_NAME topocoll EXPORT_NAME topocoll
                                                 VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}
                                                 CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON
                                                 LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})
# Static dependencies inside (the CUDA runtime when built) stay hidden too. (Not ALL: that would hide the layers'
# TOPOCOLL_API symbols, which come from archives as well.)
target_link_options(topocoll_shared PRIVATE -Wl,--exclude-libs,libcudart_static.a:librt.a
                    -Wl,--version-script=${CMAKE_SOURCE_DIR}/cmake/libtopocoll.map)
if(NOT TOPOCOLL_SANITIZE AND NOT TOPOCOLL_TSAN AND NOT TOPOCOLL_BUILD_FUZZ)
  target_link_options(topocoll_shared PRIVATE -Wl,--no-undefined)
else()  # sanitizer builds test the layers; they link libtopocoll.so only when asked (the runtime comes with a program)
  set_target_properties(topocoll_shared PROPERTIES EXCLUDE_FROM_ALL ON)
endif()
set_property(TARGET topocoll_shared APPEND PROPERTY LINK_DEPENDS ${CMAKE_SOURCE_DIR}/cmake/libtopocoll.map)

# topocoll::c: the C API (topocoll.h needs no C++ headers; the library is the same).
add_library(topocoll_c INTERFACE)
target_link_libraries(topocoll_c INTERFACE topocoll_shared)
set_target_properties(topocoll_c PROPERTIES EXPORT_NAME c)

# topocoll::nccl: NCCL's API (include/topocoll/nccl_compat/nccl.h) and its drop-in name.
target_include_directories(topocoll_nccl INTERFACE
                           "$<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/include/topocoll/nccl_compat>"
                           "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/topocoll/nccl_compat>")
set_target_properties(topocoll_nccl PROPERTIES EXPORT_NAME nccl)

# ---- install
set(TOPOCOLL_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/topocoll")
# Debian's python3 reads /usr/lib/python3/dist-packages (a .deb) and /usr/local/lib/python3.X/dist-packages.
set(TOPOCOLL_INSTALL_PYTHONDIR "lib/python3/dist-packages" CACHE STRING
    "Where the Python package goes, relative to the prefix (empty: not installed)")

install(TARGETS topocoll_shared topocoll_c topocoll_nccl EXPORT topocollTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT runtime
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/topocoll DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        PATTERN "*.in" EXCLUDE)
install(FILES ${CMAKE_BINARY_DIR}/layers/common/topocoll/version.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/topocoll)
# The drop-in: LD_LIBRARY_PATH=<prefix>/lib/topocoll/nccl runs a program linked against NCCL on topocoll. Kept out
# of the linker's own directories, where it would shadow a real NCCL.
install(CODE "
  file(MAKE_DIRECTORY \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/topocoll/nccl\")
  file(CREATE_LINK ../../libtopocoll_nccl.so
       \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/topocoll/nccl/libnccl.so.2\" SYMBOLIC)")

install(TARGETS topocoll_cli topocoll_perf RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
foreach(t IN LISTS TOPOCOLL_PERF_TESTS)
  install(CODE "file(CREATE_LINK topocoll-perf \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/${t}\" SYMBOLIC)")
endforeach()

if(TOPOCOLL_BUILD_PYTHON AND TOPOCOLL_INSTALL_PYTHONDIR)
  install(DIRECTORY ${CMAKE_BINARY_DIR}/python/topocoll DESTINATION ${TOPOCOLL_INSTALL_PYTHONDIR}
          PATTERN "__pycache__" EXCLUDE)
endif()
install(FILES ${CMAKE_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/examples/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples
        PATTERN "topologies" EXCLUDE)
install(DIRECTORY ${CMAKE_SOURCE_DIR}/examples/topologies/public/ DESTINATION ${CMAKE_INSTALL_DATADIR}/topocoll/topologies)

# CMake package: find_package(topocoll CONFIG REQUIRED) -> topocoll::topocoll, topocoll::c, topocoll::nccl.
install(EXPORT topocollTargets NAMESPACE topocoll:: DESTINATION ${TOPOCOLL_INSTALL_CMAKEDIR})
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/topocollConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/package/topocollConfig.cmake
                              INSTALL_DESTINATION ${TOPOCOLL_INSTALL_CMAKEDIR})
# 0.x: a minor release may change the API, so only the same minor version is compatible.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/package/topocollConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/package/topocollConfig.cmake ${CMAKE_BINARY_DIR}/package/topocollConfigVersion.cmake
        DESTINATION ${TOPOCOLL_INSTALL_CMAKEDIR})

# pkg-config: topocoll (the C API), topocoll-cxx (the C++ API, with fmt), topocoll-nccl (NCCL's API).
# Relocatable: the prefix is found from the .pc file's own folder (${pcfiledir}), so a prefix given to
# `cmake --install --prefix` or a .deb's /usr work alike.
file(RELATIVE_PATH TOPOCOLL_PC_TO_PREFIX "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
foreach(pc topocoll topocoll-cxx topocoll-nccl)
  configure_file(${CMAKE_SOURCE_DIR}/cmake/${pc}.pc.in ${CMAKE_BINARY_DIR}/package/${pc}.pc @ONLY)
  install(FILES ${CMAKE_BINARY_DIR}/package/${pc}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endforeach()

# ---- Debian package: cpack -G DEB in the build folder (a build artefact, not committed).
set(CPACK_PACKAGE_NAME topocoll)
set(CPACK_PACKAGE_VENDOR "topocoll")
set(CPACK_PACKAGE_CONTACT "topocoll maintainers <topocoll@localhost>")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "Topology-aware collective communication: NCCL's planner, a runtime with NCCL's API, a PyTorch backend")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_GENERATOR DEB)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
# The shared libraries' and programs' dependencies (dpkg-shlibdeps), and what the headers and Python package need.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libfmt-dev")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "python3-torch")
include(CPack)
