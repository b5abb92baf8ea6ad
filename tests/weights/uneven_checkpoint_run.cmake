# Uneven block shards end to end from a checkpoint: a gpt-oss-shaped checkpoint written in Python
# (hand_built_checkpoint.py --finite: I 352 = 11 MXFP4 groups, which no TP size > 1 divides) runs
# verified against the single-rank reference on 1, 2, 4 and 8 local ranks without EP (TP8: two
# ranks hold no rows of I, only zero padding); a pre-sharded export of it at TP4 reloads to the
# same bytes on every rank and runs verified too.
# Usage: cmake -DMOESHARD=<exe> -DPYTHON=<python3> -DSRC=<source dir> -DOUT=<dir> -P ...
file(REMOVE_RECURSE ${OUT})
set(ckpt ${OUT}/ckpt)
execute_process(COMMAND ${PYTHON} ${SRC}/tests/weights/hand_built_checkpoint.py --finite
  ${SRC}/models/tiny-gpt-oss-uneven.json ${ckpt} RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "hand_built_checkpoint.py --finite failed (${rc}): ${err}")
endif()
foreach(tp 1 2 4 8)
  execute_process(COMMAND ${MOESHARD} run --model ${ckpt} --checkpoint ${ckpt} -tp ${tp}
    --tokens 16 --iters 1 --verify RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "single-rank reference[^\n]*: ok")
    message(FATAL_ERROR "run -tp ${tp} from the checkpoint (${rc}):\n${out}${err}")
  endif()
  if(tp GREATER 1)
    execute_process(COMMAND ${MOESHARD} plan --model ${ckpt} -tp ${tp} OUTPUT_VARIABLE plan)
    if(NOT plan MATCHES "uneven block shards")
      message(FATAL_ERROR "plan -tp ${tp} has no uneven block shards:\n${plan}")
    endif()
  endif()
  message(STATUS "tp ${tp}: ${CMAKE_MATCH_0}")
endforeach()
set(topo --model ${ckpt} -tp 4)
execute_process(COMMAND ${MOESHARD} shard ${topo} --checkpoint ${ckpt} --out ${OUT}/pre
  --no-progress RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "shard -tp 4 failed (${rc}): ${out}${err}")
endif()
execute_process(COMMAND ${MOESHARD} build ${topo} --checkpoint ${ckpt} --all-ranks --checksum
  --no-progress RESULT_VARIABLE rc1 OUTPUT_VARIABLE direct ERROR_VARIABLE err1)
execute_process(COMMAND ${MOESHARD} build ${topo} --checkpoint ${OUT}/pre --all-ranks --checksum
  --no-progress RESULT_VARIABLE rc2 OUTPUT_VARIABLE loaded ERROR_VARIABLE err2)
if(NOT rc1 EQUAL 0 OR NOT rc2 EQUAL 0)
  message(FATAL_ERROR "build failed: ${rc1} ${err1} / ${rc2} ${err2}")
endif()
string(REGEX MATCHALL "checksum [0-9a-f]+" sums_direct "${direct}")
string(REGEX MATCHALL "checksum [0-9a-f]+" sums_loaded "${loaded}")
list(LENGTH sums_direct n)
if(NOT n EQUAL 4 OR NOT sums_direct STREQUAL sums_loaded)
  message(FATAL_ERROR "checksums differ:\n checkpoint ${sums_direct}\n pre-sharded ${sums_loaded}")
endif()
execute_process(COMMAND ${MOESHARD} run ${topo} --checkpoint ${OUT}/pre --tokens 16 --iters 1
  --verify RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "single-rank reference[^\n]*: ok")
  message(FATAL_ERROR "run -tp 4 from the pre-sharded export (${rc}):\n${out}${err}")
endif()
file(REMOVE_RECURSE ${OUT})
