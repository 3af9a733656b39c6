# Used by scripts/bench.sh only while the top-level CMakeLists.txt does not yet
# add bench/macro itself: passed as CMAKE_PROJECT_INCLUDE, it defers including
# bench/macro/CMakeLists.txt to the end of the top-level directory, when
# rl_store and the other targets exist. (A deferred call may not create a
# subdirectory, so the file is include()d; it names its sources by absolute path.)
cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR}
               CALL include ${CMAKE_SOURCE_DIR}/bench/macro/CMakeLists.txt)
