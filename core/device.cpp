#include "core/device.h"

#include "core/error.h"

namespace precis {

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text.rfind("cuda:", 0) == 0) {
    std::string index = text.substr(5);
    PRECIS_CHECK(!index.empty() && index.find_first_not_of("0123456789") == std::string::npos, "bad device '", text,
                 "': write cpu, cuda or cuda:N");
    return cuda(std::stoi(index));
  }
  PRECIS_FAIL("bad device '", text, "': write cpu, cuda or cuda:N");
}

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

}  // namespace precis
