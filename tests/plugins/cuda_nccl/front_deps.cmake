# ctest script (cmake -P): the cuda plugin's front library links none of the
# CUDA runtime, cuBLAS, cuBLASLt or NCCL, and `backplane list` with the build's
# default config (which names the optional cuda backend) maps none of them
# nor the engine library, with or without a GPU: they load at the first use of
# a device.
#
#   cmake -DFRONT=<libbackplane_cuda_nccl.so> -DREADELF=<readelf> -DCLI=<backplane>
#         -DCONFIG=<backends.json> -P front_deps.cmake
set(heavy "libcudart|libcublas|libnccl|libbackplane_cuda_nccl_engine")

execute_process(COMMAND ${READELF} -d ${FRONT} OUTPUT_VARIABLE dynamic RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${READELF} -d ${FRONT} failed (${rc})")
endif()
string(REGEX MATCHALL "\\(NEEDED\\)[^\n]*" needed "${dynamic}")
if(NOT needed)
  message(FATAL_ERROR "${FRONT}: no DT_NEEDED entry found in:\n${dynamic}")
endif()
foreach(entry IN LISTS needed)
  if(entry MATCHES "${heavy}|libcuda\\.")
    message(FATAL_ERROR "${FRONT} must not need CUDA, cuBLAS or NCCL (the engine does): ${entry}")
  endif()
endforeach()

# The loader names every library it maps (LD_DEBUG=files, on stderr).
execute_process(COMMAND ${CMAKE_COMMAND} -E env LD_DEBUG=files ${CLI} list --config ${CONFIG}
  OUTPUT_VARIABLE out ERROR_VARIABLE loads RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${CLI} list --config ${CONFIG} failed (${rc}):\n${out}\n${loads}")
endif()
if(NOT loads MATCHES "libbackplane_cuda_nccl\\.so")
  message(FATAL_ERROR "${CLI} list did not load the cuda plugin (is it in ${CONFIG}?):\n${out}")
endif()
string(REGEX MATCHALL "file=[^\n]*(${heavy})[^\n]*" mapped "${loads}")
if(mapped)
  message(FATAL_ERROR "backplane list mapped what only a device's first use needs:\n${mapped}")
endif()
message(STATUS "front: ${needed}")
