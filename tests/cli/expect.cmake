# Runs a command and checks its exit code and output, for CLI tests.
#   cmake -DCMD="a|b|c" -DRC=<expected exit code> [-DREGEX=<must match stdout+stderr>]
#         [-DNOT_REGEX=<must not match>] [-DFILE=<must exist afterwards>] -P expect.cmake
string(REPLACE "|" ";" CMD "${CMD}")
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
if(NOT "${rc}" STREQUAL "${RC}")
  message(FATAL_ERROR "expected exit code ${RC}, got ${rc}\n--- output ---\n${all}")
endif()
if(DEFINED REGEX AND NOT all MATCHES "${REGEX}")
  message(FATAL_ERROR "output does not match '${REGEX}'\n--- output ---\n${all}")
endif()
if(DEFINED NOT_REGEX AND all MATCHES "${NOT_REGEX}")
  message(FATAL_ERROR "output matches '${NOT_REGEX}'\n--- output ---\n${all}")
endif()
if(DEFINED FILE AND NOT EXISTS "${FILE}")
  message(FATAL_ERROR "expected file ${FILE} to exist\n--- output ---\n${all}")
endif()
