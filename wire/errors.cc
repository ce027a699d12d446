#include "wire/errors.h"

namespace pandastack {

namespace {
struct Row {
  Code code;
  const char* name;
  unsigned status;
  const char* summary;
};
constexpr Row kRows[] = {
#define PANDASTACK_ERROR_ROW(code, status, summary) {Code::code, #code, status, summary},
    PANDASTACK_ERROR_CODES(PANDASTACK_ERROR_ROW)
#undef PANDASTACK_ERROR_ROW
};
const Row& row(Code code) { return kRows[size_t(code)]; }
}  // namespace

const char* to_string(Code code) { return row(code).name; }
unsigned http_status(Code code) { return row(code).status; }
const char* summary(Code code) { return row(code).summary; }

std::optional<Code> code_from_string(std::string_view name) {
  for (auto& r : kRows)
    if (name == r.name) return r.code;
  return std::nullopt;
}

const std::vector<Code>& all_codes() {
  static const std::vector<Code> codes = {
#define PANDASTACK_ERROR_LIST(code, status, summary) Code::code,
      PANDASTACK_ERROR_CODES(PANDASTACK_ERROR_LIST)
#undef PANDASTACK_ERROR_LIST
  };
  return codes;
}

}  // namespace pandastack
