// Element-wise reductions for every NCCL data type and operation, vectorised: the loops are compiled once per
// instruction set (AVX-512, AVX2, baseline) and the best one the CPU supports is picked when the program loads.
// Half, bfloat16 and fp8 values are reduced in fp32 and rounded back (to nearest even; fp8 saturates to the
// largest finite value as NCCL's __NV_SATFINITE conversions do), as NCCL's device code does.
//
//   collectives::reduce(DataType::kFloat32, RedOp::kSum, out, a, b, n);   // out[i] = a[i] + b[i]; out may be a or b
#pragma once

#include <cstddef>
#include <cstdint>

#include "topocoll/datatype.h"

namespace topocoll::collectives {

/// dst[i] = a[i] op b[i]. dst may alias a or b exactly (not partially). kAvg reduces as kSum: the caller divides
/// once at the end (finishAvg).
void reduce(DataType type, RedOp op, void* dst, const void* a, const void* b, size_t count);

/// dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[n-1][i], left to right (n >= 1). dst may alias srcs[0].
void reduceMany(DataType type, RedOp op, void* dst, const void* const* srcs, int n, size_t count);

/// Reduces the nSrcs sources as reduceMany does (same bits) and writes the result into each of the nDsts outputs
/// (1-32 of each) in one pass: the sources' and outputs' lines stream through together, as in a memcpy, so an output
/// is written without first sitting in a scratch buffer. Outputs whose bit is set in streamMask get non-temporal
/// stores (x86-64; their lines are not read for ownership): set it for outputs nobody reads soon and that are not
/// sources. An output may be one of the sources (same range), never partly overlap one. kAvg divides by avgRanks
/// (none when avgRanks <= 1, as kSum). Two sources into one output without streaming take reduce()'s loop: when that
/// output is srcs[1] it computes srcs[1] op srcs[0], as reduce() in place does (the same value for every op but the
/// sign of a max or min of two zeros and which NaN payload is kept).
void reduceToMany(DataType type, RedOp op, void* const* dsts, int nDsts, uint32_t streamMask, const void* const* srcs,
                  int nSrcs, size_t count, int avgRanks = 0);

/// reduceToMany of one source: `bytes` at src copied into each of the nDsts outputs (none of them src) in one pass.
void copyToMany(void* const* dsts, int nDsts, uint32_t streamMask, const void* src, size_t bytes);

/// Avg's last step: dst[i] /= nRanks (integers: truncating division, as NCCL's SumPostDiv).
void finishAvg(DataType type, void* dst, size_t count, int nRanks);

/// NCCL's PreMulSum's first step: dst[i] = src[i] * scalar, `scalar` one element of `type` (dst may be src).
/// Floating types multiply as NCCL's kernels do (16- and 8-bit ones through float, rounded once); integers multiply
/// in their own type (unsigned ones wrap).
void preMultiply(DataType type, void* dst, const void* src, size_t count, const void* scalar);

/// Conversions used by the reductions (exposed for tests and for the GPU path's host reference).
float halfToFloat(uint16_t h);
uint16_t floatToHalf(float f);
float bf16ToFloat(uint16_t b);
uint16_t floatToBf16(float f);
float fp8e4m3ToFloat(uint8_t v);
uint8_t floatToFp8e4m3(float f);
float fp8e5m2ToFloat(uint8_t v);
uint8_t floatToFp8e5m2(float f);

}  // namespace topocoll::collectives
