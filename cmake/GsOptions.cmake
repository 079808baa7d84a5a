# Build options. The GS_WITH_* options take AUTO (use when found), ON (required: configuration
# fails naming the escape hatch) or OFF.
set(GS_WITH_VERBS AUTO CACHE STRING "libibverbs transport: AUTO|ON|OFF")
set(GS_WITH_CUDA AUTO CACHE STRING "CUDA kernels and device buffers: AUTO|ON|OFF")
set(GS_WITH_PROMETHEUS AUTO CACHE STRING "Prometheus exporter (prometheus-cpp): AUTO|ON|OFF")
set_property(CACHE GS_WITH_VERBS GS_WITH_CUDA GS_WITH_PROMETHEUS PROPERTY STRINGS AUTO ON OFF)
option(GS_WERROR "Treat warnings as errors" OFF)
set(GS_SANITIZE "" CACHE STRING "Sanitizers, e.g. address,undefined or thread")
if(CMAKE_SOURCE_DIR STREQUAL PROJECT_SOURCE_DIR)
  option(GS_BUILD_TESTS "Build the tests" ON)
else()
  option(GS_BUILD_TESTS "Build the tests" OFF)
endif()

# gs_resolve_feature(<OPTION> <found-bool> <what> <package hint>) sets GS_HAVE_<suffix>.
function(gs_resolve_feature option found what hint)
  string(REPLACE "GS_WITH_" "GS_HAVE_" have ${option})
  if(${option} STREQUAL "OFF")
    set(${have} 0 PARENT_SCOPE)
  elseif(found)
    set(${have} 1 PARENT_SCOPE)
  elseif(${option} STREQUAL "ON")
    message(FATAL_ERROR "${option}=ON but ${what} was not found (install ${hint}, or configure "
                        "with -D${option}=OFF)")
  else()
    set(${have} 0 PARENT_SCOPE)
  endif()
endfunction()

find_library(GS_IBVERBS_LIBRARY ibverbs)
find_path(GS_IBVERBS_INCLUDE infiniband/verbs.h)
if(GS_IBVERBS_LIBRARY AND GS_IBVERBS_INCLUDE)
  set(_verbs_found TRUE)
else()
  set(_verbs_found FALSE)
endif()
gs_resolve_feature(GS_WITH_VERBS ${_verbs_found} "libibverbs" "libibverbs-dev")

# CUDA: AUTO enables the CUDA language when nvcc is found (CMAKE_CUDA_COMPILER, else
# /usr/local/cuda/bin/nvcc, else PATH), except in sanitizer builds: ASan/TSan and the CUDA
# runtime/driver do not mix (the driver maps memory where ASan keeps its shadow), so there
# CUDA needs an explicit GS_WITH_CUDA=ON. The kernels cost about 40 s of compiler CPU time
# per architecture (measured on this 2-core machine), cheap next to the rest of the build.
set(_cuda_skip_reason "")
if(GS_WITH_CUDA STREQUAL "AUTO" AND GS_SANITIZE)
  set(_cuda_skip_reason " (AUTO skips CUDA in sanitizer builds)")
endif()
if(NOT GS_WITH_CUDA STREQUAL "OFF" AND _cuda_skip_reason STREQUAL "")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
endif()
if(CMAKE_CUDA_COMPILER AND _cuda_skip_reason STREQUAL "")
  set(_cuda_found TRUE)
else()
  set(_cuda_found FALSE)
endif()
gs_resolve_feature(GS_WITH_CUDA ${_cuda_found} "a CUDA compiler" "the CUDA toolkit")
if(GS_HAVE_CUDA)
  # sm_90 machine code (H100/H200) plus compute_75 PTX, which the driver JIT-compiles for
  # every other GPU CUDA 13 supports, older (Turing, Ampere, Ada) and newer (Blackwell).
  # Override with -DCMAKE_CUDA_ARCHITECTURES=..., e.g. "90-real" alone while iterating.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "75-virtual;90-real" CACHE STRING "CUDA architectures")
  endif()
  if(NOT CMAKE_CUDA_HOST_COMPILER)
    set(CMAKE_CUDA_HOST_COMPILER ${CMAKE_CXX_COMPILER})
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  # CMake 3.25 does not know nvcc 13's C++20 flag (CUDA_STANDARD follows CXX_STANDARD): tell it.
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(CMAKE_CUDA_EXTENSIONS OFF)
  set(CMAKE_CUDA_VISIBILITY_PRESET hidden)
endif()

if(NOT GS_WITH_PROMETHEUS STREQUAL "OFF")
  find_package(prometheus-cpp CONFIG QUIET)
endif()
gs_resolve_feature(GS_WITH_PROMETHEUS "${prometheus-cpp_FOUND}" "prometheus-cpp"
                   "prometheus-cpp-dev")
# GS_HAVE_PROMETHEUS follows detection: monitoring/ builds the HTTP exporter only with it.
