// The rendezvous of torchrun-style launches (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT), where there is no MPI to share the NCCL unique id through: rank 0
// listens on MASTER_PORT and hands a few bytes to each other rank, which connects
// to MASTER_ADDR:MASTER_PORT (retrying until rank 0 listens). One connection per
// rank, used once; the transport of the collectives is NCCL's own.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace precis::distributed {

struct TcpEndpoint {
  std::string address;  // host name or IP address of rank 0
  int port = 0;
};

// Rank 0 returns `bytes` after every other rank has received them; the others return
// what rank 0 sent. Each rank calls it once. Throws a precis::Error naming the
// endpoint when rank 0 cannot listen, when a rank cannot reach rank 0, or when not
// every rank has connected within `timeout`.
std::vector<uint8_t> tcp_broadcast_bytes(const TcpEndpoint& endpoint, int rank, int world_size,
                                         const std::vector<uint8_t>& bytes, std::chrono::milliseconds timeout);

}  // namespace precis::distributed
