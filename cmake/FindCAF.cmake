# Debian's CAF 0.17 ships no CMake config: find its headers and libraries.
find_path(CAF_INCLUDE_DIR caf/all.hpp)
find_library(CAF_CORE_LIBRARY caf_core)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CAF DEFAULT_MSG CAF_INCLUDE_DIR CAF_CORE_LIBRARY)
if(CAF_FOUND AND NOT TARGET CAF::core)
  add_library(CAF::core UNKNOWN IMPORTED)
  set_target_properties(CAF::core PROPERTIES IMPORTED_LOCATION ${CAF_CORE_LIBRARY}
                        INTERFACE_INCLUDE_DIRECTORIES ${CAF_INCLUDE_DIR})
endif()
