#include "tests/comm/comm_cases.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "moeshard/base/numeric.h"

namespace moeshard::comm_test {
namespace {

#define CASE_EXPECT(cond, ...)                                                              \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      return InternalError(fmt::format("{}:{}: expected {}: {}", __FILE__, __LINE__, #cond, \
                                       fmt::format(__VA_ARGS__)));                          \
    }                                                                                       \
  } while (0)

// ---- payload encodings -----------------------------------------------------------------------

// Byte `b` of element `e` sent by rank `src` to rank `dst`. Distinct for nearby arguments, so a
// block from the wrong rank, at the wrong offset or shifted by a byte is detected.
uint8_t PayloadByte(int src, int dst, size_t e, size_t b) {
  uint32_t h = static_cast<uint32_t>(src) * 0x9e3779b1u ^ static_cast<uint32_t>(dst) * 0x85ebca6bu;
  h ^= static_cast<uint32_t>(e) * 0xc2b2ae35u + static_cast<uint32_t>(b) * 0x27d4eb2fu;
  h ^= h >> 15;
  h *= 0x2c1b3c6du;
  h ^= h >> 12;
  return static_cast<uint8_t>(h);
}

void FillPayload(uint8_t* out, int src, int dst, size_t num_elems, size_t elem_bytes) {
  for (size_t e = 0; e < num_elems; ++e) {
    for (size_t b = 0; b < elem_bytes; ++b) out[e * elem_bytes + b] = PayloadByte(src, dst, e, b);
  }
}

Status CheckPayload(const char* what, const uint8_t* got, int src, int dst, size_t num_elems,
                    size_t elem_bytes) {
  for (size_t e = 0; e < num_elems; ++e) {
    for (size_t b = 0; b < elem_bytes; ++b) {
      const uint8_t expected = PayloadByte(src, dst, e, b);
      CASE_EXPECT(got[e * elem_bytes + b] == expected,
                  "{}: rank {} received from rank {} element {} byte {}: expected {}, got {}", what,
                  dst, src, e, b, expected, got[e * elem_bytes + b]);
    }
  }
  return Status::Ok();
}

constexpr uint8_t kSentinel = 0xEE;

Status CheckSentinel(const char* what, const uint8_t* p, size_t n, int rank, size_t offset) {
  for (size_t i = 0; i < n; ++i) {
    CASE_EXPECT(p[i] == kSentinel, "{}: rank {} byte {} outside every block was overwritten ({})",
                what, rank, offset + i, p[i]);
  }
  return Status::Ok();
}

// An fp32 of rank `r`, index `i`, spread over 2^-12 .. 2^12 with both signs: sums of such values
// round, so the order of additions shows in the bits.
float RoughValue(int r, size_t i) {
  uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ (static_cast<uint32_t>(r) + 1) * 40503u;
  h ^= h >> 13;
  h *= 0x5bd1e995u;
  h ^= h >> 15;
  const float mantissa = static_cast<float>(h & 0xffff) / 65536.0f - 0.5f;
  return std::ldexp(mantissa, static_cast<int>((h >> 16) % 24) - 12);
}

// The contract's reference: ((x_0 + x_1) + ...) + x_{n-1} in fp32.
float SequentialSum(int n, size_t i, bool bf16_inputs) {
  auto x = [&](int r) { return bf16_inputs ? RoundToBf16(RoughValue(r, i)) : RoughValue(r, i); };
  float acc = x(0);
  for (int r = 1; r < n; ++r) acc += x(r);
  return acc;
}

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

// Every rank must hold the same `bytes` bytes: gather everyone's copy and compare.
Status CheckIdenticalOnAllRanks(Communicator& comm, const void* data, size_t bytes,
                                const char* what) {
  std::vector<uint8_t> all(bytes * static_cast<size_t>(comm.size()));
  MOESHARD_RETURN_IF_ERROR(comm.AllGather(data, all.data(), bytes));
  for (int p = 0; p < comm.size(); ++p) {
    const uint8_t* theirs = all.data() + static_cast<size_t>(p) * bytes;
    for (size_t i = 0; i < bytes; ++i) {
      CASE_EXPECT(theirs[i] == static_cast<const uint8_t*>(data)[i],
                  "{}: byte {} differs between rank {} and rank {}", what, i, comm.rank(), p);
    }
  }
  return Status::Ok();
}

const size_t kCounts[] = {0, 1, 3, 7, 1000, 4099, 33333};

// ---- cases -------------------------------------------------------------------------------------

Status BarrierRepeated(Communicator& comm) {
  for (int i = 0; i < 20; ++i) MOESHARD_RETURN_IF_ERROR(comm.Barrier());
  CASE_EXPECT(comm.name() == "world", "name: got '{}'", comm.name());
  CASE_EXPECT(comm.rank() >= 0 && comm.rank() < comm.size(), "rank {} of {}", comm.rank(),
              comm.size());
  return Status::Ok();
}

Status BroadcastFromEveryRoot(Communicator& comm) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{7}, size_t{4099}, size_t{1} << 20}) {
    for (int root = 0; root < comm.size(); ++root) {
      std::vector<uint8_t> buf(bytes, kSentinel);
      if (comm.rank() == root) FillPayload(buf.data(), root, -1, bytes, 1);
      MOESHARD_RETURN_IF_ERROR(comm.Broadcast(buf.data(), bytes, root));
      MOESHARD_RETURN_IF_ERROR(CheckPayload("Broadcast", buf.data(), root, -1, bytes, 1));
    }
  }
  return Status::Ok();
}

// Integer-valued fp32 sums are exact: a check by formula, independent of the reference.
Status AllReduceFp32Exact(Communicator& comm) {
  const int n = comm.size();
  for (size_t count : kCounts) {
    for (bool in_place : {false, true}) {
      std::vector<float> send(count), recv(count, -1.0f);
      for (size_t i = 0; i < count; ++i) {
        send[i] = static_cast<float>((comm.rank() + 1) * 1000 + static_cast<int>(i % 1000));
      }
      if (in_place) {
        MOESHARD_RETURN_IF_ERROR(comm.AllReduceSum(std::span<float>(send)));
        recv = send;
      } else {
        MOESHARD_RETURN_IF_ERROR(comm.AllReduceSum(send.data(), recv.data(), count));
      }
      for (size_t i = 0; i < count; ++i) {
        const float expected =
            static_cast<float>(1000 * n * (n + 1) / 2 + n * static_cast<int>(i % 1000));
        CASE_EXPECT(recv[i] == expected, "count {} in_place {} element {}: expected {}, got {}",
                    count, in_place, i, expected, recv[i]);
      }
    }
  }
  return Status::Ok();
}

Status AllReduceFp32MatchesSequentialReference(Communicator& comm) {
  for (size_t count : kCounts) {
    std::vector<float> send(count), recv(count);
    for (size_t i = 0; i < count; ++i) send[i] = RoughValue(comm.rank(), i);
    MOESHARD_RETURN_IF_ERROR(comm.AllReduceSum(send.data(), recv.data(), count));
    for (size_t i = 0; i < count; ++i) {
      const float ref = SequentialSum(comm.size(), i, false);
      CASE_EXPECT(Bits(recv[i]) == Bits(ref),
                  "count {} element {}: expected {:a} (sequential fp32 in rank order), got {:a}",
                  count, i, ref, recv[i]);
    }
    MOESHARD_RETURN_IF_ERROR(
        CheckIdenticalOnAllRanks(comm, recv.data(), count * sizeof(float), "fp32 all-reduce"));
  }
  return Status::Ok();
}

Status AllReduceBf16RoundsOnce(Communicator& comm) {
  const int n = comm.size();
  for (size_t count : kCounts) {
    for (bool in_place : {false, true}) {
      std::vector<bf16_t> send(count), recv(count);
      for (size_t i = 0; i < count; ++i) send[i] = FloatToBf16(RoughValue(comm.rank(), i));
      if (in_place) {
        MOESHARD_RETURN_IF_ERROR(comm.AllReduceSum(std::span<bf16_t>(send)));
        recv = send;
      } else {
        MOESHARD_RETURN_IF_ERROR(comm.AllReduceSum(send.data(), recv.data(), count));
      }
      size_t differs_from_per_step = 0;
      for (size_t i = 0; i < count; ++i) {
        const bf16_t ref = FloatToBf16(SequentialSum(n, i, true));
        CASE_EXPECT(recv[i].bits == ref.bits,
                    "count {} in_place {} element {}: expected bf16 bits {:#06x} (fp32 sum "
                    "rounded once), got {:#06x}",
                    count, in_place, i, ref.bits, recv[i].bits);
        float per_step = RoundToBf16(RoughValue(0, i));
        for (int r = 1; r < n; ++r)
          per_step = RoundToBf16(per_step + RoundToBf16(RoughValue(r, i)));
        if (FloatToBf16(per_step).bits != ref.bits) ++differs_from_per_step;
      }
      // With 3+ ranks, rounding after every addition gives other bits for many elements: the
      // check above would catch an implementation that did so.
      if (n >= 3 && count >= 1000) {
        CASE_EXPECT(differs_from_per_step > 0, "inputs do not discriminate rounding ({})", count);
      }
      MOESHARD_RETURN_IF_ERROR(
          CheckIdenticalOnAllRanks(comm, recv.data(), count * sizeof(bf16_t), "bf16 all-reduce"));
    }
  }
  return Status::Ok();
}

// recv_counts for the variable reduce-scatter / all-gather cases: some ranks get 0.
std::vector<size_t> UnevenCounts(int n, size_t scale) {
  std::vector<size_t> counts(static_cast<size_t>(n));
  for (int p = 0; p < n; ++p) {
    counts[static_cast<size_t>(p)] = p % 3 == 1 ? 0 : (static_cast<size_t>(p) + 2) * scale + 1;
  }
  return counts;
}

Status ReduceScatterCases(Communicator& comm) {
  const int n = comm.size();
  const size_t me = static_cast<size_t>(comm.rank());
  std::vector<std::vector<size_t>> layouts = {
      std::vector<size_t>(static_cast<size_t>(n), 0),     // nothing at all
      std::vector<size_t>(static_cast<size_t>(n), 1),     // one element each
      std::vector<size_t>(static_cast<size_t>(n), 1500),  // equal blocks across tiles
      UnevenCounts(n, 3), UnevenCounts(n, 700)};
  for (const auto& counts : layouts) {
    size_t total = 0;
    std::vector<size_t> displ(static_cast<size_t>(n));
    for (size_t p = 0; p < counts.size(); ++p) {
      displ[p] = total;
      total += counts[p];
    }
    const bool equal =
        std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts[0]; });
    // fp32
    std::vector<float> send(total), recv(counts[me], -1.0f);
    for (size_t i = 0; i < total; ++i) send[i] = RoughValue(comm.rank(), i);
    if (equal) {
      MOESHARD_RETURN_IF_ERROR(comm.ReduceScatterSum(send.data(), recv.data(), counts[0]));
    } else {
      MOESHARD_RETURN_IF_ERROR(comm.ReduceScatterSumV(send.data(), recv.data(), counts));
    }
    for (size_t j = 0; j < counts[me]; ++j) {
      const float ref = SequentialSum(n, displ[me] + j, false);
      CASE_EXPECT(Bits(recv[j]) == Bits(ref),
                  "fp32 block of rank {} element {}: expected {:a}, got {:a}", me, j, ref, recv[j]);
    }
    // bf16
    std::vector<bf16_t> send16(total), recv16(counts[me]);
    for (size_t i = 0; i < total; ++i) send16[i] = FloatToBf16(RoughValue(comm.rank(), i));
    if (equal) {
      MOESHARD_RETURN_IF_ERROR(comm.ReduceScatterSum(send16.data(), recv16.data(), counts[0]));
    } else {
      MOESHARD_RETURN_IF_ERROR(comm.ReduceScatterSumV(send16.data(), recv16.data(), counts));
    }
    for (size_t j = 0; j < counts[me]; ++j) {
      const bf16_t ref = FloatToBf16(SequentialSum(n, displ[me] + j, true));
      CASE_EXPECT(recv16[j].bits == ref.bits,
                  "bf16 block of rank {} element {}: expected {:#06x}, got {:#06x}", me, j,
                  ref.bits, recv16[j].bits);
    }
  }
  return Status::Ok();
}

Status AllGatherEqual(Communicator& comm) {
  const int n = comm.size();
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{13}, size_t{65536}}) {
    std::vector<uint8_t> send(bytes), recv(bytes * static_cast<size_t>(n), kSentinel);
    FillPayload(send.data(), comm.rank(), -1, bytes, 1);
    MOESHARD_RETURN_IF_ERROR(comm.AllGather(send.data(), recv.data(), bytes));
    for (int p = 0; p < n; ++p) {
      MOESHARD_RETURN_IF_ERROR(CheckPayload("AllGather", recv.data() + p * bytes, p, -1, bytes, 1));
    }
  }
  return Status::Ok();
}

// Uneven DP batches: rank p contributes counts[p] token rows (some 0) of `hidden` bf16.
Status AllGatherVUneven(Communicator& comm) {
  const int n = comm.size();
  const size_t me = static_cast<size_t>(comm.rank());
  const size_t elem_bytes = 6 * sizeof(bf16_t);
  for (size_t scale : {size_t{0}, size_t{1}, size_t{37}}) {
    std::vector<size_t> counts = UnevenCounts(n, scale);
    if (scale == 0) std::fill(counts.begin(), counts.end(), 0);  // every rank sends nothing
    std::vector<uint8_t> send(counts[me] * elem_bytes);
    FillPayload(send.data(), comm.rank(), -1, counts[me], elem_bytes);
    // Packed.
    size_t total = 0;
    for (size_t c : counts) total += c;
    std::vector<uint8_t> recv(total * elem_bytes, kSentinel);
    MOESHARD_RETURN_IF_ERROR(
        comm.AllGatherV(send.data(), counts[me], recv.data(), counts, {}, elem_bytes));
    size_t off = 0;
    for (int p = 0; p < n; ++p) {
      MOESHARD_RETURN_IF_ERROR(CheckPayload("AllGatherV packed", recv.data() + off * elem_bytes, p,
                                            -1, counts[static_cast<size_t>(p)], elem_bytes));
      off += counts[static_cast<size_t>(p)];
    }
    // Explicit displacements: blocks in reverse rank order with a 2-element gap before each;
    // the gaps must stay untouched.
    std::vector<size_t> displs(static_cast<size_t>(n));
    size_t cursor = 0;
    for (int p = n - 1; p >= 0; --p) {
      cursor += 2;
      displs[static_cast<size_t>(p)] = cursor;
      cursor += counts[static_cast<size_t>(p)];
    }
    std::vector<uint8_t> spaced(cursor * elem_bytes, kSentinel);
    MOESHARD_RETURN_IF_ERROR(comm.AllGatherV(send.empty() ? nullptr : send.data(), counts[me],
                                             spaced.data(), counts, displs, elem_bytes));
    for (int p = 0; p < n; ++p) {
      const size_t up = static_cast<size_t>(p);
      MOESHARD_RETURN_IF_ERROR(CheckPayload("AllGatherV displaced",
                                            spaced.data() + displs[up] * elem_bytes, p, -1,
                                            counts[up], elem_bytes));
      MOESHARD_RETURN_IF_ERROR(
          CheckSentinel("AllGatherV gap", spaced.data() + (displs[up] - 2) * elem_bytes,
                        2 * elem_bytes, comm.rank(), (displs[up] - 2) * elem_bytes));
    }
  }
  return Status::Ok();
}

// The count exchange that precedes an EP dispatch.
Status AllToAllCounts(Communicator& comm) {
  const int n = comm.size();
  std::vector<uint64_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n), 999999);
  for (int q = 0; q < n; ++q) send[static_cast<size_t>(q)] = comm.rank() * 1000 + q;
  MOESHARD_RETURN_IF_ERROR(comm.AllToAll(send.data(), recv.data(), sizeof(uint64_t)));
  for (int p = 0; p < n; ++p) {
    const uint64_t expected = static_cast<uint64_t>(p) * 1000 + comm.rank();
    CASE_EXPECT(recv[static_cast<size_t>(p)] == expected, "from rank {}: expected {}, got {}", p,
                expected, recv[static_cast<size_t>(p)]);
  }
  return Status::Ok();
}

// Elements rank p sends to rank q: includes 0 (also to itself for some ranks).
size_t DispatchCount(int p, int q, size_t scale) {
  return static_cast<size_t>((p * 3 + q * 5 + 1) % 4) * scale;
}

// EP dispatch and combine: exchange counts, move rank-and-index encoded rows with AllToAllV
// (packed, then with explicit displacements and gaps), and send them back.
Status AllToAllVDispatchCombine(Communicator& comm) {
  const int n = comm.size();
  const int me = comm.rank();
  const size_t un = static_cast<size_t>(n);
  for (size_t elem_bytes : {size_t{5}, size_t{7168 * 2 / 64}}) {
    for (size_t scale : {size_t{0}, size_t{1}, size_t{29}}) {
      std::vector<size_t> send_counts(un);
      for (int q = 0; q < n; ++q) send_counts[static_cast<size_t>(q)] = DispatchCount(me, q, scale);
      // 1. Counts exchange, as the runtime does it.
      std::vector<size_t> recv_counts(un);
      MOESHARD_RETURN_IF_ERROR(
          comm.AllToAll(send_counts.data(), recv_counts.data(), sizeof(size_t)));
      for (int p = 0; p < n; ++p) {
        CASE_EXPECT(recv_counts[static_cast<size_t>(p)] == DispatchCount(p, me, scale),
                    "count from rank {}: expected {}, got {}", p, DispatchCount(p, me, scale),
                    recv_counts[static_cast<size_t>(p)]);
      }
      // 2. Dispatch, packed.
      size_t send_total = 0;
      size_t recv_total = 0;
      for (size_t c : send_counts) send_total += c;
      for (size_t c : recv_counts) recv_total += c;
      std::vector<uint8_t> send(send_total * elem_bytes);
      size_t off = 0;
      for (int q = 0; q < n; ++q) {
        FillPayload(send.data() + off * elem_bytes, me, q, send_counts[static_cast<size_t>(q)],
                    elem_bytes);
        off += send_counts[static_cast<size_t>(q)];
      }
      std::vector<uint8_t> recv(recv_total * elem_bytes, kSentinel);
      AllToAllVArgs args;
      args.elem_bytes = elem_bytes;
      args.send = send.data();
      args.send_counts = send_counts;
      args.recv = recv.data();
      args.recv_counts = recv_counts;
      MOESHARD_RETURN_IF_ERROR(comm.AllToAllV(args));
      off = 0;
      for (int p = 0; p < n; ++p) {
        MOESHARD_RETURN_IF_ERROR(CheckPayload("AllToAllV dispatch", recv.data() + off * elem_bytes,
                                              p, me, recv_counts[static_cast<size_t>(p)],
                                              elem_bytes));
        off += recv_counts[static_cast<size_t>(p)];
      }
      // 3. Combine: send every received block back to its source (the reverse call).
      std::vector<uint8_t> back(send_total * elem_bytes, kSentinel);
      AllToAllVArgs reverse;
      reverse.elem_bytes = elem_bytes;
      reverse.send = recv.data();
      reverse.send_counts = recv_counts;
      reverse.recv = back.data();
      reverse.recv_counts = send_counts;
      MOESHARD_RETURN_IF_ERROR(comm.AllToAllV(reverse));
      CASE_EXPECT(back == send, "combine did not return the dispatched rows to rank {}", me);
      // 4. Explicit displacements: send blocks in reverse order, receive blocks in reverse
      // order with a 1-element gap before each.
      std::vector<size_t> send_displs(un), recv_displs(un);
      std::vector<uint8_t> send_rev(send_total * elem_bytes);
      size_t cursor = 0;
      for (int q = n - 1; q >= 0; --q) {
        const size_t uq = static_cast<size_t>(q);
        send_displs[uq] = cursor;
        FillPayload(send_rev.data() + cursor * elem_bytes, me, q, send_counts[uq], elem_bytes);
        cursor += send_counts[uq];
      }
      cursor = 0;
      for (int p = n - 1; p >= 0; --p) {
        cursor += 1;
        recv_displs[static_cast<size_t>(p)] = cursor;
        cursor += recv_counts[static_cast<size_t>(p)];
      }
      std::vector<uint8_t> spaced(cursor * elem_bytes, kSentinel);
      args.send = send_rev.data();
      args.send_displs = send_displs;
      args.recv = spaced.data();
      args.recv_displs = recv_displs;
      MOESHARD_RETURN_IF_ERROR(comm.AllToAllV(args));
      for (int p = 0; p < n; ++p) {
        const size_t up = static_cast<size_t>(p);
        MOESHARD_RETURN_IF_ERROR(CheckPayload("AllToAllV displaced",
                                              spaced.data() + recv_displs[up] * elem_bytes, p, me,
                                              recv_counts[up], elem_bytes));
        MOESHARD_RETURN_IF_ERROR(CheckSentinel("AllToAllV gap",
                                               spaced.data() + (recv_displs[up] - 1) * elem_bytes,
                                               elem_bytes, me, (recv_displs[up] - 1) * elem_bytes));
      }
    }
  }
  return Status::Ok();
}

// A 2-D grid: TP groups (consecutive ranks) and DP groups (strided), used at the same time.
Status SplitGrid(Communicator& world) {
  const int n = world.size();
  const int me = world.rank();
  const int tp = n % 2 == 0 ? 2 : 1;
  const int dp = n / tp;
  const int tp_idx = me % tp;
  const int dp_idx = me / tp;
  MOESHARD_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> tp_comm, world.Split(dp_idx, me));
  MOESHARD_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> dp_comm, world.Split(tp_idx, me));
  CASE_EXPECT(tp_comm != nullptr && dp_comm != nullptr, "split returned null");
  CASE_EXPECT(tp_comm->size() == tp && tp_comm->rank() == tp_idx, "tp group: rank {}/{}",
              tp_comm->rank(), tp_comm->size());
  CASE_EXPECT(dp_comm->size() == dp && dp_comm->rank() == dp_idx, "dp group: rank {}/{}",
              dp_comm->rank(), dp_comm->size());
  CASE_EXPECT(tp_comm->name().find("world/split") == 0, "name '{}'", tp_comm->name());
  for (int iter = 0; iter < 3; ++iter) {
    // TP all-reduce of the world ranks of the group: dp_idx * tp * tp + tp * (tp - 1) / 2.
    float v = static_cast<float>(me + iter);
    MOESHARD_RETURN_IF_ERROR(tp_comm->AllReduceSum(std::span<float>(&v, 1)));
    const float expected_tp = static_cast<float>(dp_idx * tp * tp + tp * (tp - 1) / 2 + tp * iter);
    CASE_EXPECT(v == expected_tp, "tp all-reduce: expected {}, got {}", expected_tp, v);
    // DP all-gather of world ranks: dp_comm rank j is world rank j * tp + tp_idx.
    std::vector<int32_t> ranks(static_cast<size_t>(dp), -1);
    const int32_t mine = me;
    MOESHARD_RETURN_IF_ERROR(dp_comm->AllGather(&mine, ranks.data(), sizeof(int32_t)));
    for (int j = 0; j < dp; ++j) {
      CASE_EXPECT(ranks[static_cast<size_t>(j)] == j * tp + tp_idx,
                  "dp all-gather slot {}: expected world rank {}, got {}", j, j * tp + tp_idx,
                  ranks[static_cast<size_t>(j)]);
    }
    MOESHARD_RETURN_IF_ERROR(world.Barrier());
  }
  // Keys order the new ranks: a reversed world.
  MOESHARD_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> reversed, world.Split(7, -me));
  CASE_EXPECT(reversed->rank() == n - 1 - me, "reversed: rank {} became {}", me, reversed->rank());
  int32_t mine = me;
  std::vector<int32_t> order(static_cast<size_t>(n));
  MOESHARD_RETURN_IF_ERROR(reversed->AllGather(&mine, order.data(), sizeof(int32_t)));
  for (int j = 0; j < n; ++j) {
    CASE_EXPECT(order[static_cast<size_t>(j)] == n - 1 - j, "reversed slot {}: got {}", j,
                order[static_cast<size_t>(j)]);
  }
  // Ranks without a color get no communicator; the others still work together.
  MOESHARD_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> evens,
                            world.Split(me % 2 == 0 ? 0 : kSplitNoColor, me));
  if (me % 2 == 1) {
    CASE_EXPECT(evens == nullptr, "rank {} passed kSplitNoColor but got a communicator", me);
  } else {
    CASE_EXPECT(evens != nullptr && evens->size() == (n + 1) / 2 && evens->rank() == me / 2,
                "evens: rank {}", me);
    float one = 1.0f;
    MOESHARD_RETURN_IF_ERROR(evens->AllReduceSum(std::span<float>(&one, 1)));
    CASE_EXPECT(one == static_cast<float>((n + 1) / 2), "evens all-reduce: got {}", one);
    // A split of a split.
    MOESHARD_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> nested, evens->Split(0, 0));
    CASE_EXPECT(nested->size() == evens->size() && nested->rank() == evens->rank(),
                "nested split: rank {}/{}", nested->rank(), nested->size());
    MOESHARD_RETURN_IF_ERROR(nested->Barrier());
  }
  return world.Barrier();
}

// Many small back-to-back collectives of different kinds: ordering and barrier reuse.
Status ManySmallCollectives(Communicator& comm) {
  const int n = comm.size();
  for (int iter = 0; iter < 300; ++iter) {
    float v = static_cast<float>(comm.rank() * iter);
    MOESHARD_RETURN_IF_ERROR(comm.AllReduceSum(std::span<float>(&v, 1)));
    const float expected = static_cast<float>(iter * n * (n - 1) / 2);
    CASE_EXPECT(v == expected, "iteration {}: expected {}, got {}", iter, expected, v);
    std::vector<int32_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
    for (int q = 0; q < n; ++q) send[static_cast<size_t>(q)] = iter * 10000 + comm.rank() * 100 + q;
    MOESHARD_RETURN_IF_ERROR(comm.AllToAll(send.data(), recv.data(), sizeof(int32_t)));
    for (int p = 0; p < n; ++p) {
      CASE_EXPECT(recv[static_cast<size_t>(p)] == iter * 10000 + p * 100 + comm.rank(),
                  "iteration {} from rank {}: got {}", iter, p, recv[static_cast<size_t>(p)]);
    }
  }
  return Status::Ok();
}

// Null buffers with zero counts are valid everywhere.
Status ZeroSizedWithNullBuffers(Communicator& comm) {
  const size_t un = static_cast<size_t>(comm.size());
  std::vector<size_t> zeros(un, 0);
  MOESHARD_RETURN_IF_ERROR(comm.Broadcast(nullptr, 0, comm.size() - 1));
  MOESHARD_RETURN_IF_ERROR(comm.AllReduceSum(static_cast<const float*>(nullptr), nullptr, 0));
  MOESHARD_RETURN_IF_ERROR(comm.AllReduceSum(static_cast<const bf16_t*>(nullptr), nullptr, 0));
  MOESHARD_RETURN_IF_ERROR(
      comm.ReduceScatterSumV(static_cast<const float*>(nullptr), nullptr, zeros));
  MOESHARD_RETURN_IF_ERROR(comm.AllGatherV(nullptr, 0, nullptr, zeros, {}, 4));
  MOESHARD_RETURN_IF_ERROR(comm.AllGather(nullptr, nullptr, 0));
  AllToAllVArgs args;
  args.elem_bytes = 8;
  args.send_counts = zeros;
  args.recv_counts = zeros;
  MOESHARD_RETURN_IF_ERROR(comm.AllToAllV(args));
  return comm.Barrier();
}

}  // namespace

const std::vector<CommCase>& AllCommCases() {
  static const std::vector<CommCase> cases = {
      {"BarrierRepeated", BarrierRepeated},
      {"BroadcastFromEveryRoot", BroadcastFromEveryRoot},
      {"AllReduceFp32Exact", AllReduceFp32Exact},
      {"AllReduceFp32MatchesSequentialReference", AllReduceFp32MatchesSequentialReference},
      {"AllReduceBf16RoundsOnce", AllReduceBf16RoundsOnce},
      {"ReduceScatter", ReduceScatterCases},
      {"AllGatherEqual", AllGatherEqual},
      {"AllGatherVUneven", AllGatherVUneven},
      {"AllToAllCounts", AllToAllCounts},
      {"AllToAllVDispatchCombine", AllToAllVDispatchCombine},
      {"SplitGrid", SplitGrid},
      {"ManySmallCollectives", ManySmallCollectives},
      {"ZeroSizedWithNullBuffers", ZeroSizedWithNullBuffers},
  };
  return cases;
}

}  // namespace moeshard::comm_test
