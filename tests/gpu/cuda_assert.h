#pragma once

// The gpu tests' check of a CUDA runtime call: fails the test naming the call and CUDA's error.

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#define ASSERT_CUDA(expr)                                                  \
  do {                                                                     \
    const cudaError_t e_ = (expr);                                         \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_); \
  } while (0)
