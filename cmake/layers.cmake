# One static library per layer. A layer's public include directory holds only its own headers (staged as symbolic
# links under build/layers/<layer>/topocoll/), and it links the lower layers it uses PRIVATE, so a lower layer
# cannot include a higher layer's header: the compiler does not find it (tests/layering checks this).
#
#   topocoll_layer(search SOURCES search.cc ... HEADERS search DEPS paths topology common)
#
# HEADERS: entries of include/topocoll/ (a folder, or a file such as plan.h) that belong to the layer.
function(topocoll_layer name)
  cmake_parse_arguments(L "" "" "SOURCES;HEADERS;DEPS;EXTERNAL" ${ARGN})
  set(stage "${CMAKE_BINARY_DIR}/layers/${name}")
  file(MAKE_DIRECTORY "${stage}/topocoll")
  foreach(h IN LISTS L_HEADERS)
    if(NOT EXISTS "${stage}/topocoll/${h}")
      file(CREATE_LINK "${CMAKE_SOURCE_DIR}/include/topocoll/${h}" "${stage}/topocoll/${h}" SYMBOLIC)
    endif()
  endforeach()
  add_library(topocoll_${name} STATIC ${L_SOURCES})
  target_include_directories(topocoll_${name} PUBLIC "${stage}" PRIVATE "${CMAKE_CURRENT_SOURCE_DIR}")
  # Only what carries TOPOCOLL_API (include/topocoll/export.h) leaves libtopocoll.so (cmake/package.cmake).
  set_target_properties(topocoll_${name} PROPERTIES CXX_VISIBILITY_PRESET hidden C_VISIBILITY_PRESET hidden
                                                    CUDA_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
  foreach(d IN LISTS L_DEPS)
    target_link_libraries(topocoll_${name} PRIVATE topocoll_${d})
  endforeach()
  if(L_EXTERNAL)
    target_link_libraries(topocoll_${name} PRIVATE ${L_EXTERNAL})
  endif()
endfunction()
