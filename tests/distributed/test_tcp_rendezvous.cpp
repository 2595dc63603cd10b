// The TCP rendezvous of torchrun-style launches, with the ranks as threads of
// this process on the loopback interface.
#include <gtest/gtest.h>

#include <thread>

#include "distributed/tcp_rendezvous.h"
#include "support/errors.h"
#include "support/free_port.h"

using namespace precis;
using distributed::tcp_broadcast_bytes;
using distributed::TcpEndpoint;
using precis::testing::expect_error;
using precis::testing::free_port;
using namespace std::chrono_literals;

TEST(TcpRendezvous, EveryRankReceivesRankZerosBytesWhateverOrderTheyStartIn) {
  const int world = 4;
  const TcpEndpoint endpoint{"127.0.0.1", free_port()};
  std::vector<uint8_t> id(128);
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<uint8_t>(i * 7 + 3);
  std::vector<std::vector<uint8_t>> received(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> ranks;
  // The others start before rank 0 listens: they retry until it does.
  for (int r = world - 1; r >= 0; --r) {
    ranks.emplace_back([&, r] {
      std::vector<uint8_t> mine = r == 0 ? id : std::vector<uint8_t>(128, 0);
      try {
        received[r] = tcp_broadcast_bytes(endpoint, r, world, mine, 20s);
      } catch (const Error& e) {
        errors[r] = e.what();
      }
    });
    if (r == 1) std::this_thread::sleep_for(100ms);
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(received[r], id) << "rank " << r;
  }
}

TEST(TcpRendezvous, RankZeroGivesUpWhenARankNeverComes) {
  const int port = free_port();
  expect_error(
      [&] {
        tcp_broadcast_bytes({"127.0.0.1", port}, 0, 3, {1, 2, 3}, 300ms);
      },
      "0 of 2 ranks reached rank 0 on port " + std::to_string(port));
}

TEST(TcpRendezvous, ARankGivesUpWhenRankZeroIsNotThere) {
  const int port = free_port();
  expect_error(
      [&] {
        tcp_broadcast_bytes({"127.0.0.1", port}, 1, 2, {}, 300ms);
      },
      "rank 1 could not connect to rank 0 at 127.0.0.1:" + std::to_string(port));
}

TEST(TcpRendezvous, BadEndpointsAreErrors) {
  expect_error([] { tcp_broadcast_bytes({"127.0.0.1", 0}, 1, 2, {}, 100ms); }, "is not a TCP port");
  expect_error([] { tcp_broadcast_bytes({"127.0.0.1", 29500}, 2, 2, {}, 100ms); }, "rank 2 is not in a world of 2");
}
