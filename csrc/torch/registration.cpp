// Every op schema of the `redrafter` namespace, in one greppable place. Arguments an op writes
// are marked mutable (Tensor(a!)).
#include <torch/library.h>

TORCH_LIBRARY(redrafter, m) {
  m.def("tree_mask(Tensor node_parent, Tensor num_nodes, bool packed=False) -> Tensor");
}
