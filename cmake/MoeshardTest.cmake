# moeshard_library(NAME SOURCES ... DEPS ...)
#   One static library per layer: target moeshard_<NAME>, public headers in include/.
function(moeshard_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(moeshard_${name} STATIC ${ARG_SOURCES})
  target_include_directories(moeshard_${name}
    PUBLIC ${PROJECT_SOURCE_DIR}/include
    PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(moeshard_${name} PUBLIC ${ARG_DEPS} PRIVATE moeshard_warnings ${ARG_PRIVATE_DEPS})
endfunction()

# moeshard_test(NAME SOURCES ... DEPS ... [LABELS ...])
#   A GoogleTest executable whose cases are registered with ctest under LABELS (default: unit).
function(moeshard_test name)
  if(NOT MOESHARD_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;LABELS" ${ARGN})
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main moeshard_warnings)
  target_compile_definitions(${name} PRIVATE
    MOESHARD_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  gtest_discover_tests(${name}
    PROPERTIES LABELS "${ARG_LABELS}"
    DISCOVERY_TIMEOUT 60)
endfunction()

# moeshard_mpi_command(<out-var> <num-procs> <executable> <args>...)
#   The mpiexec command line for an MPI test, from CMake's MPIEXEC_* variables. Open MPI as root
#   on a machine with fewer cores than ranks (CI containers) refuses both unless told, so its
#   --allow-run-as-root --oversubscribe are added (other MPIs do not know these flags).
function(moeshard_mpi_command out np exe)
  if(NOT DEFINED MOESHARD_MPIEXEC_IS_OPENMPI)
    execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE version ERROR_QUIET)
    set(is_openmpi OFF)
    if(version MATCHES "Open MPI|OpenRTE")
      set(is_openmpi ON)
    endif()
    set(MOESHARD_MPIEXEC_IS_OPENMPI ${is_openmpi} CACHE INTERNAL "mpiexec is Open MPI")
  endif()
  set(extra)
  if(MOESHARD_MPIEXEC_IS_OPENMPI)
    set(extra --allow-run-as-root --oversubscribe)
  endif()
  set(${out} ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} ${MPIEXEC_PREFLAGS} ${extra}
      ${exe} ${MPIEXEC_POSTFLAGS} ${ARGN} PARENT_SCOPE)
endfunction()
