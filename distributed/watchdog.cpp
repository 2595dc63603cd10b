#include "distributed/watchdog.h"

#include <sstream>
#include <utility>

#include "core/error.h"

#if PRECIS_WITH_MPI
#include <cstring>
#include <thread>

#include "distributed/mpi_check.h"
#endif

namespace precis::distributed {

namespace {

double seconds(std::chrono::milliseconds t) { return t.count() / 1000.0; }

// "rank 3", "ranks 1, 2", "ranks 0-5, 9": runs of three or more ranks as ranges.
std::string ranks_text(const std::vector<int>& ranks) {
  std::ostringstream out;
  out << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size();) {
    size_t end = i + 1;
    while (end < ranks.size() && ranks[end] == ranks[end - 1] + 1) ++end;
    if (i > 0) out << ", ";
    if (end - i >= 3) {
      out << ranks[i] << "-" << ranks[end - 1];
    } else {
      out << ranks[i];
      if (end - i == 2) out << ", " << ranks[i + 1];
    }
    i = end;
  }
  return out.str();
}

std::string capitalized(std::string text) {
  if (!text.empty()) text[0] = static_cast<char>(text[0] - 'a' + 'A');
  return text;
}

std::string where(const WaitingIn& w) { return w.op + " #" + std::to_string(w.sequence); }

}  // namespace

std::string timeout_message(const std::string& backend, int rank, int world_size, const WaitingIn& self,
                            std::chrono::milliseconds timeout, std::chrono::milliseconds grace,
                            const PeerAnswers& answers) {
  std::ostringstream out;
  out << backend << ": rank " << rank << " of " << world_size << ": " << where(self) << " did not complete within "
      << seconds(timeout) << " s (distributed.timeout_s; #" << self.sequence
      << " counts this process group's collectives).";
  if (!answers.cannot_ask.empty()) {
    out << " The rank that is missing cannot be named: " << answers.cannot_ask
        << ". Another rank died, hangs, or stopped calling the same collectives; see the other ranks' output for "
           "an error.";
    return out.str();
  }
  if (!answers.silent.empty()) {
    const bool one = answers.silent.size() == 1;
    out << " " << capitalized(ranks_text(answers.silent)) << " did not answer within " << seconds(grace)
        << " s: " << (one ? "it" : "they") << " died, hang" << (one ? "s" : "") << ", or " << (one ? "is" : "are")
        << " busy outside the collectives; see " << (one ? "its" : "their") << " output for an error.";
  }
  // The ranks that answered, grouped by where they timed out: those in this rank's collective
  // first, then one sentence for each other place, in the order of their sequence numbers.
  std::map<std::pair<int64_t, std::string>, std::vector<int>> by_place;
  for (const auto& [r, w] : answers.waiting) by_place[{w.sequence, w.op}].push_back(r);
  bool desynchronised = false;
  for (const bool same : {true, false}) {
    for (const auto& [place, ranks] : by_place) {
      const WaitingIn theirs{place.second, place.first};
      if ((theirs.sequence == self.sequence && theirs.op == self.op) != same) continue;
      desynchronised |= !same;
      out << " " << capitalized(ranks_text(ranks)) << " timed out in " << where(theirs)
          << (same ? " too." : ", this rank in " + where(self) + ".");
    }
  }
  if (desynchronised) {
    out << " The ranks wait in different collectives: unless a rank started one before waiting for an earlier "
           "one, a collective was skipped or added on some rank (one under a condition that differs between ranks?).";
  } else if (answers.silent.empty()) {
    out << " Every rank timed out in it: the collective itself is stuck (the network, or MPI/NCCL), or this rank "
           "joined after the others had given up.";
  }
  return out.str();
}

#if PRECIS_WITH_MPI

namespace {

// The record a rank that timed out sends every other rank (the same binary runs on every rank).
struct Record {
  int64_t sequence;
  char op[32];
};
constexpr int kRecordTag = 19;

// Sends whose peer never received (a dead or hung rank) are freed, not waited for; MPI
// may still read their record, so the records are kept for the life of the process.
std::vector<std::shared_ptr<Record>>& records_in_flight() {
  static auto* records = new std::vector<std::shared_ptr<Record>>;
  return *records;
}

}  // namespace

struct Watchdog::Channel {
  MPI_Comm comm = MPI_COMM_NULL;
  ~Channel() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
};

Watchdog::Watchdog(std::string backend, int rank, int world_size, std::chrono::milliseconds timeout,
                   std::chrono::milliseconds grace)
    : backend_(std::move(backend)), rank_(rank), world_size_(world_size), timeout_(timeout), grace_(grace) {
  if (timeout_.count() <= 0 || world_size_ == 1) return;
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) {
    cannot_ask_ =
        "this process runs without MPI (a torchrun-style launch, or MASTER_ADDR/MASTER_PORT set: the NCCL unique "
        "id went over TCP), and the watchdog asks the other ranks over MPI";
    return;
  }
  int mpi_rank = 0, mpi_size = 0;
  PRECIS_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank), "watchdog");
  PRECIS_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &mpi_size), "watchdog");
  if (mpi_rank != rank_ || mpi_size != world_size_) {
    std::ostringstream why;
    why << "MPI's world (rank " << mpi_rank << " of " << mpi_size << ") is not this process group's, and the "
        << "watchdog asks the other ranks over MPI";
    cannot_ask_ = why.str();
    return;
  }
  auto channel = std::make_unique<Channel>();
  PRECIS_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &channel->comm), "watchdog");
  PRECIS_MPI_CHECK(MPI_Comm_set_errhandler(channel->comm, MPI_ERRORS_RETURN), "watchdog");
  channel_ = std::move(channel);
}

PeerAnswers Watchdog::ask_peers(const WaitingIn& self) const {
  PeerAnswers answers;
  if (!channel_) {
    answers.cannot_ask = cannot_ask_.empty() ? "this process group has no timeout" : cannot_ask_;
    return answers;
  }
  const MPI_Comm comm = channel_->comm;
  try {
    auto record = std::make_shared<Record>();
    record->sequence = self.sequence;
    std::memset(record->op, 0, sizeof record->op);
    std::strncpy(record->op, self.op.c_str(), sizeof record->op - 1);
    std::vector<MPI_Request> sends;
    for (int r = 0; r < world_size_; ++r) {
      if (r == rank_) continue;
      sends.emplace_back();
      PRECIS_MPI_CHECK(MPI_Isend(record.get(), sizeof(Record), MPI_BYTE, r, kRecordTag, comm, &sends.back()),
                       "watchdog record");
    }
    // Take every record that has arrived (a rank's later record replaces its earlier one:
    // MPI delivers one sender's messages in order), until all have answered or the grace ends.
    const auto deadline = std::chrono::steady_clock::now() + grace_;
    for (;;) {
      for (;;) {
        int arrived = 0;
        MPI_Status status;
        PRECIS_MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, kRecordTag, comm, &arrived, &status), "watchdog answers");
        if (!arrived) break;
        Record answer;
        PRECIS_MPI_CHECK(
            MPI_Recv(&answer, sizeof answer, MPI_BYTE, status.MPI_SOURCE, kRecordTag, comm, MPI_STATUS_IGNORE),
            "watchdog answers");
        answer.op[sizeof answer.op - 1] = '\0';
        answers.waiting[status.MPI_SOURCE] = {answer.op, answer.sequence};
      }
      if (static_cast<int>(answers.waiting.size()) == world_size_ - 1 || std::chrono::steady_clock::now() >= deadline)
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    bool all_sent = true;
    for (MPI_Request& send : sends) {
      int done = 0;
      PRECIS_MPI_CHECK(MPI_Test(&send, &done, MPI_STATUS_IGNORE), "watchdog record");
      if (!done) {
        all_sent = false;
        MPI_Request_free(&send);
      }
    }
    if (!all_sent) records_in_flight().push_back(std::move(record));
  } catch (const Error& e) {
    return PeerAnswers{{}, {}, std::string("asking them over MPI failed: ") + e.what()};
  }
  for (int r = 0; r < world_size_; ++r)
    if (r != rank_ && !answers.waiting.count(r)) answers.silent.push_back(r);
  return answers;
}

#else

struct Watchdog::Channel {};

Watchdog::Watchdog(std::string backend, int rank, int world_size, std::chrono::milliseconds timeout,
                   std::chrono::milliseconds grace)
    : backend_(std::move(backend)),
      rank_(rank),
      world_size_(world_size),
      timeout_(timeout),
      grace_(grace),
      cannot_ask_("this build has no MPI, and the watchdog asks the other ranks over MPI") {}

PeerAnswers Watchdog::ask_peers(const WaitingIn&) const { return PeerAnswers{{}, {}, cannot_ask_}; }

#endif

Watchdog::~Watchdog() = default;

void Watchdog::fail(const WaitingIn& self) const {
  throw Error(timeout_message(backend_, rank_, world_size_, self, timeout_, grace_, ask_peers(self)));
}

}  // namespace precis::distributed
