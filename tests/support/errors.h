// The message of the precis::Error a piece of test code throws. A call that throws
// nothing is a test failure.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace precis::testing {

// The message of the precis::Error that `fn` throws; "" (and a failure) when it throws none.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a precis::Error";
  return "";
}

// `fn` throws a precis::Error whose message contains `expected_substring`.
template <typename Fn>
void expect_error(Fn&& fn, const std::string& expected_substring) {
  try {
    fn();
    ADD_FAILURE() << "expected an error containing: " << expected_substring;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(expected_substring), std::string::npos) << "message: " << e.what();
  }
}

}  // namespace precis::testing
