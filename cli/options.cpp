#include <algorithm>

#include "cli/commands.h"
#include "cli/usage.h"
#include "core/error.h"

namespace precis::cli {

std::string Options::get(const std::string& name, const std::string& fallback) const {
  for (const auto& [key, value] : named)
    if (key == name) return value;
  return fallback;
}

Options parse_options(const Args& args, const std::vector<std::string>& known, const std::string& command) {
  Options out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) {
      out.positional.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else {
      usage_check(i + 1 < args.size(), command, "option --" + name + " needs a value");
      value = args[++i];
    }
    usage_check(std::find(known.begin(), known.end(), name) != known.end(), command, "unknown option --" + name);
    out.named.emplace_back(name, value);
  }
  return out;
}

}  // namespace precis::cli
