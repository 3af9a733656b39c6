# rl_module_includes(TARGET MODULE [PUBLIC_HEADERS <file>... | PUBLIC_ALL]):
# include paths that follow the way dependencies point (docs/architecture.md).
#
# Sources include a module's headers as "<module>/<file>.h" (e.g.
# "policy/config.h"), the library's API as "ratelimit/<file>.h". For a library
# TARGET made of src/MODULE/:
#   - TARGET itself (PRIVATE) sees all of src/MODULE/ and its generated headers;
#   - its dependents (PUBLIC) see include/ and only the PUBLIC_HEADERS of
#     src/MODULE/ (PUBLIC_ALL: every header of the folder, also those added later).
# Both are folders of symbolic links in the build tree (<build>/modules/), so no
# source moves: a header that is not public simply has no path that reaches it
# from another module. `#include "store/over_limit_cache.h"` in src/policy
# fails with "store/over_limit_cache.h: No such file or directory"
# (checked by tests/boundaries).
#
# The test binaries of a module (rl_test in the same CMakeLists.txt) see what
# TARGET sees: they are white-box tests of that module.
#
#   rl_module_includes(rl_store store PUBLIC_HEADERS)            # API in include/ only
#   rl_module_includes(rl_redis redis PUBLIC_HEADERS client.h url.h)
#   rl_module_includes(rl_policy policy PUBLIC_ALL)
function(rl_module_includes target module)
  cmake_parse_arguments(M "PUBLIC_ALL" "" "PUBLIC_HEADERS" ${ARGN})
  set(src ${PROJECT_SOURCE_DIR}/src/${module})
  set(views ${PROJECT_BINARY_DIR}/modules/${module})
  file(REMOVE_RECURSE ${views})
  file(MAKE_DIRECTORY ${views}/private ${views}/public)
  file(CREATE_LINK ${src} ${views}/private/${module} SYMBOLIC)
  if(M_PUBLIC_ALL)
    file(CREATE_LINK ${src} ${views}/public/${module} SYMBOLIC)
  else()
    foreach(h IN LISTS M_PUBLIC_HEADERS)
      if(NOT EXISTS ${src}/${h})
        message(FATAL_ERROR "rl_module_includes(${target}): no src/${module}/${h}")
      endif()
      get_filename_component(dir ${views}/public/${module}/${h} DIRECTORY)
      file(MAKE_DIRECTORY ${dir})
      file(CREATE_LINK ${src}/${h} ${views}/public/${module}/${h} SYMBOLIC)
    endforeach()
  endif()
  target_include_directories(${target}
    PUBLIC ${PROJECT_SOURCE_DIR}/include ${views}/public
    PRIVATE ${views}/private)
  # What rl_test gives the module's own tests (same directory scope).
  set(RL_MODULE_PRIVATE_INCLUDES ${views}/private PARENT_SCOPE)
endfunction()
