// Storage: one allocation of bytes on a device. Tensors are views into a Storage.
#pragma once

#include <cstddef>
#include <memory>

#include "core/allocator.h"

namespace precis {

class Storage {
 public:
  Storage(size_t nbytes, Allocator& allocator)
      : nbytes_(nbytes), allocator_(&allocator), data_(nbytes ? allocator.allocate(nbytes) : nullptr) {}
  ~Storage() {
    if (data_) allocator_->deallocate(data_, nbytes_);
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return allocator_->device(); }

 private:
  size_t nbytes_;
  Allocator* allocator_;
  void* data_;
};

}  // namespace precis
