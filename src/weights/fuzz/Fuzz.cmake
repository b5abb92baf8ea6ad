# libFuzzer targets for the safetensors header parser and the checkpoint index parser.
#
# The default build may use g++, which has no libFuzzer, so these are compiled with clang++
# directly (one custom command per source, so Ninja rebuilds incrementally and in parallel),
# with AddressSanitizer and UndefinedBehaviorSanitizer, fmt header-only. Built only when
# MOESHARD_ENABLE_FUZZ is on and clang++ with libFuzzer is found.
#
# ctest: each target runs for MOESHARD_FUZZ_SECONDS (default 20) over its committed seed corpus
# (src/weights/fuzz/corpus/<target>/, read-only; new inputs go to the build tree), label `fuzz`.
# -timeout=60, not 10: on a loaded 2-core machine a 10 s per-input limit fired once on an input
# that runs in 11 ms (see docs/RELIABILITY.md); a real hang still fails the test.
# Long runs: see docs/RELIABILITY.md.
if(NOT MOESHARD_ENABLE_FUZZ)
  return()
endif()
find_program(MOESHARD_CLANGXX NAMES clang++-14 clang++)
if(NOT MOESHARD_CLANGXX)
  message(STATUS "moeshard: clang++ not found; libFuzzer targets skipped")
  return()
endif()
execute_process(
  COMMAND ${MOESHARD_CLANGXX} -print-file-name=libclang_rt.fuzzer-x86_64.a
  OUTPUT_VARIABLE moeshard_fuzzer_rt OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT EXISTS "${moeshard_fuzzer_rt}")
  execute_process(
    COMMAND ${MOESHARD_CLANGXX} --print-runtime-dir
    OUTPUT_VARIABLE moeshard_rt_dir OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT EXISTS "${moeshard_rt_dir}/libclang_rt.fuzzer-x86_64.a")
    message(STATUS "moeshard: clang's libFuzzer runtime not found (libclang-rt-14-dev); "
                   "fuzz targets skipped")
    return()
  endif()
endif()
set(MOESHARD_FUZZ_SECONDS 20 CACHE STRING "Seconds each fuzz ctest runs")

set(_root ${PROJECT_SOURCE_DIR})
set(_flags -std=c++20 -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined
           -fno-sanitize-recover=all -DFMT_HEADER_ONLY -I${_root}/include -I${_root}/src
           -Wall -Wextra -Wno-unused-parameter -Werror)
set(_lib_sources
  ${_root}/src/base/dtype.cc
  ${_root}/src/base/math.cc
  ${_root}/src/base/status.cc
  ${_root}/src/weights/checkpoint_index.cc
  ${_root}/src/weights/json_strict.cc
  ${_root}/src/weights/safetensors_file.cc
  ${_root}/src/weights/safetensors_header.cc
  ${_root}/src/weights/safetensors_writer.cc
  ${_root}/src/weights/weights_internal.cc)
set(_fuzz_dir ${CMAKE_CURRENT_BINARY_DIR}/fuzz)
file(MAKE_DIRECTORY ${_fuzz_dir})

# Compiles one source to an object; returns its path in `out_var`.
function(_moeshard_fuzz_object src extra_flag out_var)
  get_filename_component(_stem ${src} NAME_WE)
  get_filename_component(_dir ${src} DIRECTORY)
  get_filename_component(_parent ${_dir} NAME)
  set(_obj ${_fuzz_dir}/${_parent}_${_stem}.o)
  add_custom_command(
    OUTPUT ${_obj}
    COMMAND ${MOESHARD_CLANGXX} ${_flags} ${extra_flag} -MD -MF ${_obj}.d -c ${src} -o ${_obj}
    DEPENDS ${src}
    DEPFILE ${_obj}.d
    COMMENT "clang++ (fuzz) ${_parent}/${_stem}.cc"
    VERBATIM COMMAND_EXPAND_LISTS)
  set(${out_var} ${_obj} PARENT_SCOPE)
endfunction()

set(_lib_objects)
foreach(src ${_lib_sources})
  _moeshard_fuzz_object(${src} -fsanitize=fuzzer-no-link _obj)
  list(APPEND _lib_objects ${_obj})
endforeach()

foreach(name safetensors_header checkpoint_index)
  _moeshard_fuzz_object(${CMAKE_CURRENT_SOURCE_DIR}/fuzz/${name}_fuzz.cc -fsanitize=fuzzer-no-link
                        _main_obj)
  set(_bin ${_fuzz_dir}/${name}_fuzz)
  add_custom_command(
    OUTPUT ${_bin}
    COMMAND ${MOESHARD_CLANGXX} -fsanitize=fuzzer,address,undefined ${_main_obj} ${_lib_objects}
            -o ${_bin}
    DEPENDS ${_main_obj} ${_lib_objects}
    COMMENT "link ${name}_fuzz (libFuzzer)"
    VERBATIM)
  add_custom_target(${name}_fuzz ALL DEPENDS ${_bin})
  if(MOESHARD_BUILD_TESTS)
    file(MAKE_DIRECTORY ${_fuzz_dir}/${name}_new)
    add_test(NAME weights_fuzz_${name}
      COMMAND ${_bin} -max_total_time=${MOESHARD_FUZZ_SECONDS} -timeout=60 -rss_limit_mb=2048
              -print_final_stats=1 ${_fuzz_dir}/${name}_new
              ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus/${name})
    set_tests_properties(weights_fuzz_${name} PROPERTIES LABELS fuzz TIMEOUT 180)
  endif()
endforeach()
