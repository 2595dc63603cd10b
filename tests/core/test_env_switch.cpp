// core/env_switch.h: an unset variable leaves the switch's default, "1" turns it on and anything
// else off, the variable is read once (a later change of the environment does nothing), and
// set() overrides whatever was read. Each switch names its own variable, set here before it is
// first read.
#include <gtest/gtest.h>

#include <cstdlib>

#include "core/env_switch.h"

using precis::EnvSwitch;

TEST(EnvSwitch, AnUnsetVariableLeavesTheDefault) {
  ::unsetenv("PRECIS_TEST_SWITCH_UNSET_OFF");
  ::unsetenv("PRECIS_TEST_SWITCH_UNSET_ON");
  EnvSwitch off("PRECIS_TEST_SWITCH_UNSET_OFF"), on("PRECIS_TEST_SWITCH_UNSET_ON", /*default_on=*/true);
  EXPECT_FALSE(off.on());
  EXPECT_TRUE(on.on());
}

TEST(EnvSwitch, OneTurnsItOnAndAnythingElseOff) {
  ::setenv("PRECIS_TEST_SWITCH_ONE", "1", 1);
  ::setenv("PRECIS_TEST_SWITCH_ZERO", "0", 1);
  ::setenv("PRECIS_TEST_SWITCH_WORD", "yes", 1);
  EnvSwitch one("PRECIS_TEST_SWITCH_ONE"), zero("PRECIS_TEST_SWITCH_ZERO", /*default_on=*/true),
      word("PRECIS_TEST_SWITCH_WORD", /*default_on=*/true);
  EXPECT_TRUE(one.on());
  EXPECT_FALSE(zero.on());
  EXPECT_FALSE(word.on());
}

TEST(EnvSwitch, TheVariableIsReadOnceAndSetOverridesIt) {
  ::setenv("PRECIS_TEST_SWITCH_ONCE", "1", 1);
  EnvSwitch once("PRECIS_TEST_SWITCH_ONCE");
  EXPECT_TRUE(once.on());
  ::setenv("PRECIS_TEST_SWITCH_ONCE", "0", 1);
  EXPECT_TRUE(once.on()) << "read once";
  once.set(false);
  EXPECT_FALSE(once.on());
  once.set(true);
  EXPECT_TRUE(once.on());
}
