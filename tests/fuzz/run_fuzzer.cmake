# Runs a libFuzzer target for SECONDS on a copy-free corpus: new inputs go to
# SCRATCH (emptied first), the checked-in CORPUS is only read; a crash or
# sanitizer report leaves its input in SCRATCH and fails the test.
#   cmake -DFUZZER=... -DCORPUS=... -DSCRATCH=... -DSECONDS=20 -P run_fuzzer.cmake
foreach(var FUZZER CORPUS SCRATCH SECONDS)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_fuzzer.cmake: -D${var}=... is missing")
  endif()
endforeach()
file(REMOVE_RECURSE ${SCRATCH})
file(MAKE_DIRECTORY ${SCRATCH}/new)
execute_process(
  COMMAND ${FUZZER} -max_total_time=${SECONDS} -rss_limit_mb=2048 -timeout=30 -print_final_stats=1
          -artifact_prefix=${SCRATCH}/ ${SCRATCH}/new ${CORPUS}
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  file(GLOB findings ${SCRATCH}/crash-* ${SCRATCH}/leak-* ${SCRATCH}/timeout-* ${SCRATCH}/oom-*)
  message(FATAL_ERROR "the fuzzer failed (exit ${rc}); its input: ${findings}\n"
                      "reproduce with: ${FUZZER} <that file>")
endif()
