# Whether to build the cuda backend plugin (plugins/cuda_nccl), included from the
# top-level CMakeLists.txt: enable_language(CUDA) must run at the top level.
#
#   -DBACKPLANE_WITH_CUDA=AUTO  (default) build it when nvcc, the CUDA toolkit
#                               (cuBLAS, the static runtime) and NCCL are found
#   -DBACKPLANE_WITH_CUDA=ON    the same, but a missing piece fails the configure
#   -DBACKPLANE_WITH_CUDA=OFF   never (the sanitizer presets)
#
# Architectures: sm_90 machine code plus compute_90 PTX, which the driver
# compiles for newer GPUs. Change with -DCMAKE_CUDA_ARCHITECTURES=..., e.g.
# "80-real;90-real;90-virtual" (CUDA 13 supports 75 and newer).
#
# Sets BACKPLANE_BUILD_CUDA (ON/OFF) and, when ON, the imported target
# backplane::nccl.
set(BACKPLANE_WITH_CUDA AUTO CACHE STRING "Build the cuda backend plugin (CUDA toolkit + NCCL): AUTO, ON or OFF")
set_property(CACHE BACKPLANE_WITH_CUDA PROPERTY STRINGS AUTO ON OFF)
string(TOUPPER "${BACKPLANE_WITH_CUDA}" _bp_cuda_mode)
if(NOT _bp_cuda_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "BACKPLANE_WITH_CUDA is \"${BACKPLANE_WITH_CUDA}\"; use AUTO, ON or OFF")
endif()
set(BACKPLANE_BUILD_CUDA OFF)
set(_bp_cuda_missing "")

if(NOT _bp_cuda_mode STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    set(_bp_cuda_missing "nvcc was not found (put the CUDA toolkit's bin/ on PATH or set CMAKE_CUDA_COMPILER)")
  endif()
endif()

if(NOT _bp_cuda_mode STREQUAL "OFF" AND _bp_cuda_missing STREQUAL "")
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "90-real;90-virtual")
  endif()
  # The runtime is linked statically: loading the plugin needs only the driver,
  # cuBLAS and NCCL.
  set(CMAKE_CUDA_RUNTIME_LIBRARY Static)
  enable_language(CUDA)
  # CMake 3.25 knows nvcc's dialect flags up to C++17; nvcc 13 takes C++20.
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(CMAKE_CUDA_EXTENSIONS OFF)
  find_package(CUDAToolkit)
  if(NOT CUDAToolkit_FOUND OR NOT TARGET CUDA::cublas OR NOT TARGET CUDA::cudart_static)
    set(_bp_cuda_missing "the CUDA toolkit's libraries (cuBLAS, the static runtime) were not found")
  else()
    find_path(BACKPLANE_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME
      PATH_SUFFIXES include DOC "Folder holding nccl.h")
    find_library(BACKPLANE_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ENV NCCL_HOME
      PATH_SUFFIXES lib lib64 DOC "NCCL's shared library")
    if(NOT BACKPLANE_NCCL_INCLUDE_DIR OR NOT BACKPLANE_NCCL_LIBRARY)
      set(_bp_cuda_missing "NCCL was not found (nccl.h: ${BACKPLANE_NCCL_INCLUDE_DIR}, libnccl: "
        "${BACKPLANE_NCCL_LIBRARY}); install it or set BACKPLANE_NCCL_INCLUDE_DIR and BACKPLANE_NCCL_LIBRARY")
      string(REPLACE ";" "" _bp_cuda_missing "${_bp_cuda_missing}")
    else()
      add_library(backplane::nccl SHARED IMPORTED)
      set_target_properties(backplane::nccl PROPERTIES IMPORTED_LOCATION ${BACKPLANE_NCCL_LIBRARY}
        INTERFACE_INCLUDE_DIRECTORIES ${BACKPLANE_NCCL_INCLUDE_DIR})
      set(BACKPLANE_BUILD_CUDA ON)
    endif()
  endif()
endif()

if(_bp_cuda_mode STREQUAL "ON" AND NOT BACKPLANE_BUILD_CUDA)
  message(FATAL_ERROR "BACKPLANE_WITH_CUDA=ON but the cuda plugin cannot be built: ${_bp_cuda_missing}")
elseif(BACKPLANE_BUILD_CUDA)
  # Enabled is not built: the main job's `--target backplane_cli backplane_cpu` leaves it out.
  message(STATUS "cuda plugin: enabled (target backplane_cuda_nccl; built by a plain cmake --build, not by the "
    "main job's targets; CUDA ${CUDAToolkit_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}, "
    "NCCL ${BACKPLANE_NCCL_LIBRARY})")
elseif(_bp_cuda_mode STREQUAL "AUTO")
  message(STATUS "cuda plugin: not built: ${_bp_cuda_missing}")
else()
  message(STATUS "cuda plugin: not built (BACKPLANE_WITH_CUDA=OFF)")
endif()
