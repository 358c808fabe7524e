#include "cpu/act_quant.h"

#include <string>

#include "cpu/validate.h"

namespace dsv4::cpu {

void check_act_quant_outputs(const char* where, const char* xq_name, const TensorView& xq,
                             const char* scale_name, const TensorView& scale, int64_t rows,
                             int64_t cols, int block) {
  check_defined(where, xq_name, xq);
  check_defined(where, scale_name, scale);
  if (block != 64 && block != 128) fail_expected(where, "block", "64 or 128", block);
  if (cols % block != 0)
    fail_expected(where, std::string(xq_name) + ".shape[1]",
                  "a multiple of block = " + std::to_string(block), cols);
  check_dtype(where, xq_name, xq, DType::fp8_e4m3);
  check_dtype_in(where, scale_name, scale, {DType::ue8m0, DType::fp32});
  check_shape(where, xq_name, xq, {rows, cols});
  check_shape(where, scale_name, scale, {rows, cols / block});
  check_output_layout(where, xq_name, xq);
  check_distinct_elements(where, scale_name, scale);
  check_disjoint(where, scale_name, scale, xq_name, xq);
}

}  // namespace dsv4::cpu
