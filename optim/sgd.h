// SGD with momentum, Nesterov and L2 weight decay, as torch.optim.SGD:
//   g <- g + wd p;  buf <- momentum buf + (1 - dampening) g  (buf = g on the first step)
//   g <- nesterov ? g + momentum buf : buf;  p <- p - lr g
#pragma once

#include "optim/optimizer.h"

namespace precis::optim {

struct SGDOptions {
  double lr = 1e-2;
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<ParamGroup> groups, SGDOptions options = {});
  void step() override;

 private:
  SGDOptions options_;
};

}  // namespace precis::optim
