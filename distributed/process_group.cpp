#include "distributed/process_group.h"

namespace precis::distributed {

const char* reduce_op_name(ReduceOp op) { return op == ReduceOp::sum ? "sum" : "avg"; }

void check_collective_tensor(const ProcessGroup& group, const Tensor& tensor, const char* op_name) {
  PRECIS_CHECK(tensor.defined(), op_name, ": the tensor is undefined");
  PRECIS_CHECK(tensor.is_contiguous(), op_name, ": needs a contiguous tensor, got a strided ", describe(tensor),
               " (call .contiguous() first)");
  PRECIS_CHECK(tensor.device() == group.device(), op_name, ": the ", group.backend_name(), " process group works on ",
               group.device(), " tensors, got ", describe(tensor));
  switch (tensor.dtype()) {
    case DType::f32:
    case DType::f64:
    case DType::f16:
    case DType::bf16:
    case DType::i32:
    case DType::i64:
      return;
    default:
      PRECIS_FAIL(op_name, ": unsupported dtype ", tensor.dtype(), " (f32, f64, f16, bf16, i32 or i64)");
  }
}

void check_reduce_op(const Tensor& tensor, ReduceOp op, const char* op_name) {
  PRECIS_CHECK(op != ReduceOp::avg || is_floating(tensor.dtype()), op_name, ": avg needs a floating tensor, got ",
               describe(tensor), " (use sum)");
}

void check_gathered_sizes(const ProcessGroup& group, const Tensor& big, const Tensor& small, const char* op_name) {
  PRECIS_CHECK(big.dtype() == small.dtype(), op_name, ": the two tensors differ in dtype: ", describe(big), " and ",
               describe(small));
  PRECIS_CHECK(big.numel() == small.numel() * group.world_size(), op_name, ": the ", describe(big),
               " must hold world_size (", group.world_size(), ") times the elements of the ", describe(small));
}

}  // namespace precis::distributed
