# `backplane train --backend remote --nproc 2` (each rank on its own server,
# config from with_servers.sh) against the same training on the local cpu
# backend with the same seed: the accuracies must agree. Variables: CLI,
# CONFIG (with "remote" and "cpu"), DATA, OUT.
file(REMOVE_RECURSE ${OUT})
file(MAKE_DIRECTORY ${OUT})
foreach(backend cpu remote)
  execute_process(
    COMMAND ${CLI} train --backend ${backend} --nproc 2 --epochs 2 --seed 5 --config ${CONFIG} --data ${DATA}
            --metrics-out ${OUT}/metrics_${backend}.json
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "FAIL: backplane train --backend ${backend} exited with ${rc}")
  endif()
  file(READ ${OUT}/metrics_${backend}.json metrics)
  string(JSON accuracy_${backend} GET "${metrics}" test_accuracy)
  string(JSON device_${backend} GET "${metrics}" device)
endforeach()
# CMake's math is integer-only: compare in basis points through string parsing.
string(REGEX REPLACE "^0\\.([0-9][0-9][0-9]?[0-9]?).*" "\\1" cpu_bp "${accuracy_cpu}0000")
string(REGEX REPLACE "^0\\.([0-9][0-9][0-9]?[0-9]?).*" "\\1" remote_bp "${accuracy_remote}0000")
math(EXPR diff "${cpu_bp} - ${remote_bp}")
if(diff LESS 0)
  math(EXPR diff "0 - ${diff}")
endif()
if(diff GREATER 50)
  message(FATAL_ERROR "FAIL: remote training reached ${accuracy_remote}, local ${accuracy_cpu} (more than 0.005 apart)")
endif()
if(accuracy_remote LESS 0.8)
  message(FATAL_ERROR "FAIL: remote training reached only ${accuracy_remote} after 2 epochs")
endif()
message("ok: remote accuracy ${accuracy_remote} (device ${device_remote}), local ${accuracy_cpu}")
