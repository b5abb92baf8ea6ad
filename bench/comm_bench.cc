// Collective bandwidth of the local communicator (ranks as threads), as ratios to a
// single-thread memcpy of the same size measured in the same run.
//
// Each collective moves S bytes per rank, the size in the benchmark's name:
//   all-reduce:  S = the vector every rank contributes and receives (fp32 or bf16);
//   all-gather:  S = the gathered output on each rank (S / n from each rank);
//   all-to-all-v: S = what each rank receives (S / n from each peer; the V call, packed).
// Counters: `GB/s` = S / time per call ("algorithm bandwidth", as nccl-tests call it);
// `x_memcpy` = that bandwidth / the bandwidth of one thread's memcpy of S bytes (the same
// process, measured before the collectives). 1.0 means a collective costs what copying its
// output once on one core costs; the local backend copies each byte once, directly from the
// peer's buffer, so with enough cores the ratio can exceed 1 (ranks copy in parallel).
//
//   ./build/bench/comm_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "comm/collective_util.h"
#include "moeshard/base/numeric.h"
#include "moeshard/comm/local_comm.h"

namespace moeshard {
namespace {

// Bytes per second of one thread's memcpy of `bytes` (warm buffers), measured once per size
// for ~0.2 s.
double MemcpyBytesPerSecond(size_t bytes) {
  static std::mutex mutex;
  static std::map<size_t, double> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(bytes);
  if (it != cache.end()) return it->second;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  std::memcpy(dst.data(), src.data(), bytes);  // fault the pages in
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  int64_t copies = 0;
  double elapsed = 0;
  do {
    for (int i = 0; i < 8; ++i) {
      std::memcpy(dst.data(), src.data(), bytes);
      benchmark::ClobberMemory();
    }
    copies += 8;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < 0.2);
  const double bw = static_cast<double>(bytes) * static_cast<double>(copies) / elapsed;
  cache.emplace(bytes, bw);
  return bw;
}

void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
}

// The reduction kernel alone, one thread: n inputs of `bytes` each summed in rank order into
// one output (what one rank does for its chunk of an all-reduce). x_memcpy compares the bytes
// of one input with a memcpy of that size: the kernel streams n inputs, so n is its ideal.
template <ReduceDtype dtype>
void BM_ReduceKernel(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const size_t bytes = static_cast<size_t>(state.range(1));
  const size_t count = bytes / ReduceDtypeBytes(dtype);
  std::vector<std::vector<char>> inputs(static_cast<size_t>(n), std::vector<char>(bytes, 1));
  std::vector<const void*> srcs;
  for (const auto& in : inputs) srcs.push_back(in.data());
  std::vector<char> out(bytes, 0);
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    comm_internal::ReduceSumInRankOrder(dtype, srcs.data(), n, count, out.data());
    benchmark::ClobberMemory();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double bw = static_cast<double>(bytes) * static_cast<double>(state.iterations()) / seconds;
  state.counters["x_memcpy"] = bw / MemcpyBytesPerSecond(bytes);
}

enum class Op { kAllReduceF32, kAllReduceBf16, kAllGather, kAllToAllV };

// Runs state.max_iterations collectives on range(0) local ranks of range(1) bytes each; rank 0
// (the benchmark's thread) times them.
template <Op op>
void BM_Local(benchmark::State& state) {
  const int num_ranks = static_cast<int>(state.range(0));
  const size_t bytes = static_cast<size_t>(state.range(1));
  const double memcpy_bw = MemcpyBytesPerSecond(bytes);
  const int64_t iterations = state.max_iterations;
  double seconds = 0;  // rank 0's wall time for the timed loop
  Status s = RunLocalRanks(num_ranks, LocalCommOptions{}, [&](Communicator& comm) -> Status {
    const size_t n = static_cast<size_t>(comm.size());
    const size_t block = bytes / n;  // per-peer share for gather / all-to-all
    // all-reduce: [bytes]; all-gather: [block]; all-to-all: [n * block], block p to rank p.
    std::vector<char> send(op == Op::kAllGather ? block : bytes, 1);
    std::vector<char> recv(bytes, 0);
    std::vector<size_t> counts(n, block);
    auto run_once = [&]() -> Status {
      switch (op) {
        case Op::kAllReduceF32:
          return comm.AllReduceSum(reinterpret_cast<const float*>(send.data()),
                                   reinterpret_cast<float*>(recv.data()), bytes / sizeof(float));
        case Op::kAllReduceBf16:
          return comm.AllReduceSum(reinterpret_cast<const bf16_t*>(send.data()),
                                   reinterpret_cast<bf16_t*>(recv.data()), bytes / sizeof(bf16_t));
        case Op::kAllGather: return comm.AllGather(send.data(), recv.data(), block);
        case Op::kAllToAllV: {
          AllToAllVArgs args;
          args.send = send.data();
          args.send_counts = counts;
          args.recv = recv.data();
          args.recv_counts = counts;
          return comm.AllToAllV(args);
        }
      }
      return Status::Ok();
    };
    MOESHARD_RETURN_IF_ERROR(run_once());  // warm-up: pages faulted in on every rank
    MOESHARD_RETURN_IF_ERROR(comm.Barrier());
    if (comm.rank() == 0) {
      const auto start = std::chrono::steady_clock::now();
      for (auto _ : state) MOESHARD_RETURN_IF_ERROR(run_once());
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    } else {
      for (int64_t i = 0; i < iterations; ++i) MOESHARD_RETURN_IF_ERROR(run_once());
    }
    return Status::Ok();
  });
  if (!s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  const double bw = static_cast<double>(bytes) * static_cast<double>(state.iterations()) / seconds;
  state.counters["GB/s"] = bw / 1e9;
  state.counters["memcpy_GB/s"] = memcpy_bw / 1e9;
  state.counters["x_memcpy"] = bw / memcpy_bw;
}

void Sizes(benchmark::internal::Benchmark* b) {
  for (int ranks : {2, 4}) {
    for (int64_t bytes : {int64_t{64} << 10, int64_t{1} << 20, int64_t{16} << 20}) {
      b->Args({ranks, bytes});
    }
  }
  b->ArgNames({"ranks", "bytes"})->UseRealTime()->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_Memcpy)->Arg(64 << 10)->Arg(1 << 20)->Arg(16 << 20)->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_ReduceKernel, ReduceDtype::kFloat32)
    ->Name("ReduceKernelF32")
    ->ArgsProduct({{2, 4}, {1 << 20}})
    ->ArgNames({"inputs", "bytes"});
BENCHMARK_TEMPLATE(BM_ReduceKernel, ReduceDtype::kBfloat16)
    ->Name("ReduceKernelBf16")
    ->ArgsProduct({{2, 4}, {1 << 20}})
    ->ArgNames({"inputs", "bytes"});
BENCHMARK_TEMPLATE(BM_Local, Op::kAllReduceF32)->Name("AllReduceF32")->Apply(Sizes);
BENCHMARK_TEMPLATE(BM_Local, Op::kAllReduceBf16)->Name("AllReduceBf16")->Apply(Sizes);
BENCHMARK_TEMPLATE(BM_Local, Op::kAllGather)->Name("AllGather")->Apply(Sizes);
BENCHMARK_TEMPLATE(BM_Local, Op::kAllToAllV)->Name("AllToAllV")->Apply(Sizes);

}  // namespace
}  // namespace moeshard

BENCHMARK_MAIN();
