// The fault watchdog's error. When a rank's wait for a collective passes the process
// group's timeout (distributed.timeout_s), it asks the other ranks where they are
// before it fails, so that the error names the rank that is missing, the ranks
// waiting with it, and ranks that wait in another collective.
//
// How: on a side channel of its own (an MPI_Comm_dup of MPI_COMM_WORLD made with the
// process group, so that it never matches the training's messages), the rank that
// timed out sends every other rank a record "rank r waits in <op> #<sequence>"
// (nonblocking sends), and takes the records the others send for up to `grace`. Only a
// rank whose own wait times out sends one: the ranks that answer are the ones stuck in
// a collective too; a rank that does not answer within the grace died, hangs outside
// the collectives, or is still busy (slower than the others by more than the grace)
// and the error cannot tell which. No thread answers for a rank while it computes: MPI
// runs at MPI_THREAD_FUNNELED (mpi_runtime.h), only the training thread may call it.
//
// Sequence numbers count a process group's collectives from 1, the same way on every
// rank: ranks stuck at different numbers (or in different collectives at one number)
// did not call the same collectives (one was skipped or added on some rank).
//
// The side channel needs MPI initialized over the group's ranks (the MPI backend, or
// the NCCL backend under mpirun/srun); without it (a torchrun-style launch, whose NCCL
// unique id went over TCP) the error says that the missing rank cannot be named, and why.
// Declared without mpi.h; the channel is made and used from the training thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace precis::distributed {

// How long a rank that timed out waits for the others' records: a few seconds, so that
// ranks whose timeouts fire a little later (they entered the collective later) still
// answer, and bounded, so that a failing run still ends soon after its timeout.
inline constexpr std::chrono::milliseconds kPeerAnswerGrace{5000};

// Where a rank waits: collective `op` (all_reduce, ...) number `sequence` of its group.
struct WaitingIn {
  std::string op;
  int64_t sequence = 0;
};

// What a rank whose wait timed out learnt from the others.
struct PeerAnswers {
  std::map<int, WaitingIn> waiting;  // the ranks that timed out too, and where
  std::vector<int> silent;           // the ranks that did not answer within the grace, ascending
  std::string cannot_ask;            // why no rank could be asked (then both above are empty)
};

// The error of rank `rank` of `world_size` whose wait in `self` passed `timeout`, from
// the answers collected over `grace`; `backend` ("mpi", "nccl") starts it.
std::string timeout_message(const std::string& backend, int rank, int world_size, const WaitingIn& self,
                            std::chrono::milliseconds timeout, std::chrono::milliseconds grace,
                            const PeerAnswers& answers);

class Watchdog {
 public:
  // A watchdog for the collectives of rank `rank` of `world_size` that wait at most
  // `timeout` (zero: forever, and no side channel is made). With a timeout, when MPI is
  // initialized and its MPI_COMM_WORLD is the group's ranks, the side channel is made
  // now: collective over MPI_COMM_WORLD, every rank must make its group's watchdog.
  Watchdog(std::string backend, int rank, int world_size, std::chrono::milliseconds timeout,
           std::chrono::milliseconds grace = kPeerAnswerGrace);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  std::chrono::milliseconds timeout() const { return timeout_; }
  // Tells the other ranks that this one timed out waiting in `self` and collects their
  // records for up to the grace (at once, without a side channel: cannot_ask says why).
  PeerAnswers ask_peers(const WaitingIn& self) const;
  // Throws the precis::Error of a wait in `self` that timed out, after ask_peers.
  [[noreturn]] void fail(const WaitingIn& self) const;

 private:
  struct Channel;  // the MPI communicator (watchdog.cpp)
  std::string backend_;
  int rank_;
  int world_size_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds grace_;
  std::unique_ptr<Channel> channel_;  // null: cannot_ask_ says why
  std::string cannot_ask_;
};

}  // namespace precis::distributed
