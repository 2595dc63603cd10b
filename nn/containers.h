// Sequential (runs children in order) and ModuleList (holds them, named 0, 1, ...).
#pragma once

#include <memory>
#include <vector>

#include "nn/module.h"

namespace precis::nn {

class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  template <typename M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    items_.push_back(module);
    return register_module(std::to_string(items_.size() - 1), module);
  }
  size_t size() const { return items_.size(); }
  Module& operator[](size_t i) { return *items_.at(i); }
  template <typename M>
  M& at(size_t i) {
    return dynamic_cast<M&>(*items_.at(i));
  }

 private:
  std::vector<std::shared_ptr<Module>> items_;
};

class Sequential : public ModuleList {
 public:
  Sequential() = default;
  Tensor forward(const Tensor& x) override {
    Tensor h = x;
    for (size_t i = 0; i < size(); ++i) h = (*this)[i].forward(h);
    return h;
  }
};

}  // namespace precis::nn
