// A kernel's tensor argument in the dtype and layout it reads.

#pragma once

#include <ATen/core/Tensor.h>

namespace sarathi_kernels {

// t in `dtype`, contiguous: t itself where it already is, without a call through the dispatcher (Tensor::to
// makes one even when it returns t; a decode layer's kernels made ~7 such calls, on caches the step's
// streamed weights leave cold).
inline at::Tensor contiguous_as(const at::Tensor& t, at::ScalarType dtype) {
  return t.scalar_type() == dtype ? t.contiguous() : t.to(dtype).contiguous();
}

}  // namespace sarathi_kernels
