# Writes a cut copy of every release and checks it with check_copy.py (an independent reader).
file(REMOVE_RECURSE ${WORK})
set(dirs "")
foreach(r kimi-k3 kimi-k2-thinking kimi-k2.5 deepseek-v3 qwen3-30b-a3b mixtral-8x7b gpt-oss-20b
          gpt-oss-120b deepseek-v2-lite qwen1.5-moe-a2.7b glm-4.5-air minimax-m2
          olmoe-1b-7b deepseek-v4-flash qwen3-next-80b-a3b qwen3.5-35b-a3b llama-4-scout-17b-16e)
  execute_process(COMMAND ${PY} ${DIR}/header_copy.py ${r} ${WORK}/${r} --layers 2
                  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "header_copy.py ${r}: ${err}")
  endif()
  list(APPEND dirs ${WORK}/${r})
endforeach()
execute_process(COMMAND ${PY} ${DIR}/check_copy.py ${dirs} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
file(REMOVE_RECURSE ${WORK})
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "check_copy.py: ${out}${err}")
endif()
