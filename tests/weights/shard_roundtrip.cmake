# moeshard shard (dummy weights) then moeshard build --checkpoint OUT: every rank's checksum must
# equal the one of building the same dummy weights directly.
# Usage: cmake -DMOESHARD=<exe> -DOUT=<dir> -P shard_roundtrip.cmake
file(REMOVE_RECURSE ${OUT})
set(topo --model tiny-kimi-k3 -tp 4 --moe-tp 2 --moe-ep 2)
execute_process(COMMAND ${MOESHARD} shard ${topo} --load-format dummy --seed 5 --out ${OUT}
  --no-progress RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "shard failed (${rc}): ${out}${err}")
endif()
foreach(f manifest.json rank-00000-of-00004.safetensors rank-00003-of-00004.safetensors)
  if(NOT EXISTS ${OUT}/${f})
    message(FATAL_ERROR "shard did not write ${f}")
  endif()
endforeach()
execute_process(COMMAND ${MOESHARD} build ${topo} --seed 5 --all-ranks --checksum --no-progress
  RESULT_VARIABLE rc1 OUTPUT_VARIABLE direct ERROR_VARIABLE err1)
execute_process(COMMAND ${MOESHARD} build ${topo} --checkpoint ${OUT} --all-ranks --checksum
  --no-progress RESULT_VARIABLE rc2 OUTPUT_VARIABLE loaded ERROR_VARIABLE err2)
if(NOT rc1 EQUAL 0 OR NOT rc2 EQUAL 0)
  message(FATAL_ERROR "build failed: ${rc1} ${err1} / ${rc2} ${err2}")
endif()
string(REGEX MATCHALL "checksum [0-9a-f]+" sums_direct "${direct}")
string(REGEX MATCHALL "checksum [0-9a-f]+" sums_loaded "${loaded}")
list(LENGTH sums_direct n)
if(NOT n EQUAL 4 OR NOT sums_direct STREQUAL sums_loaded)
  message(FATAL_ERROR "checksums differ:\n direct ${sums_direct}\n loaded ${sums_loaded}")
endif()
if(NOT loaded MATCHES "pre-sharded checkpoint")
  message(FATAL_ERROR "build did not detect the pre-sharded checkpoint:\n${loaded}")
endif()
# Another topology is refused.
execute_process(COMMAND ${MOESHARD} build --model tiny-kimi-k3 -tp 4 --checkpoint ${OUT}
  --no-progress RESULT_VARIABLE rc3 OUTPUT_VARIABLE o3 ERROR_VARIABLE e3)
if(rc3 EQUAL 0 OR NOT e3 MATCHES "different plan")
  message(FATAL_ERROR "a pre-sharded checkpoint of another plan was accepted: ${o3}${e3}")
endif()
file(REMOVE_RECURSE ${OUT})
