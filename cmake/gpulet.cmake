# Shared helpers for component CMakeLists.

# gpulet_test(NAME SOURCES... LIBS... [LABELS unit|e2e|gpu|root|bench])
# One gtest binary, its cases discovered into ctest with the given labels (default: unit).
function(gpulet_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT T_LABELS)
    set(T_LABELS unit)
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  add_executable(${name} ${T_SOURCES})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  # Tests reach shared test code as "testing/..." and "tests/...".
  target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR})
  target_compile_definitions(${name} PRIVATE
      GPULET_SOURCE_DIR="${CMAKE_SOURCE_DIR}" GPULET_BINARY_DIR="${CMAKE_BINARY_DIR}")
  gtest_discover_tests(${name} PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
                       DISCOVERY_TIMEOUT 60)
  # The sanitizer run builds only what the unit tests need (target unit_tests): tests declare what
  # they load at run time with add_dependencies, which this target follows.
  if("unit" IN_LIST T_LABELS)
    add_dependencies(unit_tests ${name})
  endif()
endfunction()

include(GoogleTest)

# gpulet_unity(TARGET): TARGET's sources compiled as two translation units (CMake's unity build),
# one per core of CI's 2-core machine. Our files are small and include the same heavy headers
# (JSON, gRPC, absl, CLI11); each translation unit generates code for every template it uses, so
# this roughly halves a multi-file target's compile time, which dominates CI (built twice: the
# optimised tree and ASan+UBSan). Names at file scope must then be unique within the target.
# GPULET_UNITY=OFF compiles file by file: scripts/lint configures that way for clang-tidy, which needs
# a compile command per source file.
option(GPULET_UNITY "Unity builds for the targets that ask for them" ON)
function(gpulet_unity target)
  if(NOT GPULET_UNITY)
    return()
  endif()
  get_target_property(srcs ${target} SOURCES)
  list(FILTER srcs INCLUDE REGEX "\\.cc$")
  list(LENGTH srcs n)
  math(EXPR batch "(${n} + 1) / 2")
  set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${batch})
endfunction()
