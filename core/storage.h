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
  // From an allocator whose life is not the program's (the process-wide ones above are):
  // the storage shares its ownership, so it frees its bytes before the allocator goes.
  Storage(size_t nbytes, std::shared_ptr<Allocator> allocator) : Storage(nbytes, *allocator) {
    owner_ = std::move(allocator);
  }
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
  std::shared_ptr<Allocator> owner_;  // set by the second constructor; destroyed after the free above
};

}  // namespace precis
