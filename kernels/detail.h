#pragma once

// Private to kernels/: the per-file entry points behind launch.h (each .cu file instantiates its
// kernels for every dtype and format, so nvcc compiles them in parallel).

#include <cstdint>

#include "kernels/launch.h"

namespace gs::kernels::detail {

/// Chunk bytes already split: in points at the metadata, payload at in + metaBytes.
void encodeCodec(const EncodeArgs& a, CUstream_st* stream);  // encode.cu
void hopFused(const DecodeArgs& in,
              const EncodeArgs& out,
              uint64_t* status,
              CUstream_st* stream);                                            // hop.cu
void decodeCodec(const DecodeArgs& a, uint64_t* status, CUstream_st* stream);  // decode.cu
/// Block codecs: the metadata checks of the CPU decoder, recorded in status.
void validateChunk(const DecodeArgs& a, uint64_t* status, CUstream_st* stream);  // decode.cu
void rawReduce(const DecodeArgs& a, CUstream_st* stream);                        // decode.cu
void topkEncode(const EncodeArgs& a, uint8_t* ws, CUstream_st* stream);          // topk.cu
void topkDecode(const DecodeArgs& a,
                uint64_t* status,
                uint8_t* ws,
                CUstream_st* stream);  // topk.cu

}  // namespace gs::kernels::detail
