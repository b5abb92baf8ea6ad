# Shards tiny-kimi-k3 (dummy weights, backend marlin: padded shapes) and runs it: with
# --checkpoint alone, with --load-format presharded, verified against the weights it was made
# from; then a pre-sharded copy with one corrupted rank file must fail verification, and a
# mismatched backend must be named in the error.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
function(run_expect rc regex)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE got OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT got EQUAL rc)
    message(FATAL_ERROR "expected exit ${rc}, got ${got}: ${ARGN}\n${out}\n${err}")
  endif()
  if(NOT "${out}${err}" MATCHES "${regex}")
    message(FATAL_ERROR "output of ${ARGN} does not match '${regex}':\n${out}\n${err}")
  endif()
endfunction()
set(run ${M} run --model tiny-kimi-k3 -tp 2 -ep --tokens 8 --iters 1 --warmup 0)
run_expect(0 "wrote" ${M} shard --model tiny-kimi-k3 -tp 2 -ep --moe-backend marlin
           --load-format dummy --seed 7 --out ${WORK}/ps --no-progress)
run_expect(0 "verify against the single-rank reference.*: ok" ${run} --checkpoint ${WORK}/ps --verify)
run_expect(0 "verify against the single-rank reference.*: ok"
           ${run} --load-format presharded --checkpoint ${WORK}/ps --verify)
run_expect(1 "'backend': expected .*moeshard-cpu.*got .*marlin.*--moe-backend marlin"
           ${run} --checkpoint ${WORK}/ps --moe-backend moeshard-cpu)
# Corrupt rank 1's weights (everything after the first 64 KiB of its file, header intact):
# verification against the origin fails.
file(COPY ${WORK}/ps/ DESTINATION ${WORK}/bad)
execute_process(
  COMMAND python3 -c "import os,sys;p=sys.argv[1];n=os.path.getsize(p);f=open(p,'r+b');f.seek(65536);f.write(bytes([0x7f])*(n-65536))"
          ${WORK}/bad/rank-00001-of-00002.safetensors
  RESULT_VARIABLE py)
if(NOT py EQUAL 0)
  message(FATAL_ERROR "could not corrupt the rank file")
endif()
run_expect(1 "verify against the single-rank reference.*FAILED" ${run} --checkpoint ${WORK}/bad --verify)
