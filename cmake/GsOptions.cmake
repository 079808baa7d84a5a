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

if(NOT GS_WITH_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
endif()
if(CMAKE_CUDA_COMPILER)
  set(_cuda_found TRUE)
else()
  set(_cuda_found FALSE)
endif()
gs_resolve_feature(GS_WITH_CUDA ${_cuda_found} "a CUDA compiler" "the CUDA toolkit")
# CUDA kernels arrive with their own issue; until then no CUDA language is enabled, and asking
# for it outright is an error rather than a silent build without it.
if(GS_WITH_CUDA STREQUAL "ON")
  message(FATAL_ERROR "GS_WITH_CUDA=ON: this version has no CUDA kernels yet (configure with "
                      "-DGS_WITH_CUDA=AUTO or -DGS_WITH_CUDA=OFF)")
endif()
set(GS_HAVE_CUDA 0)

if(NOT GS_WITH_PROMETHEUS STREQUAL "OFF")
  find_package(prometheus-cpp CONFIG QUIET)
endif()
gs_resolve_feature(GS_WITH_PROMETHEUS "${prometheus-cpp_FOUND}" "prometheus-cpp"
                   "prometheus-cpp-dev")
# GS_HAVE_PROMETHEUS follows detection: monitoring/ builds the HTTP exporter only with it.
