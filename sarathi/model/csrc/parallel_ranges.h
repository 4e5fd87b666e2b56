// A parallel loop over [0, n) whose threads, having finished their own share, take what is left of another's.
//
// at::parallel_for splits a range into equal contiguous shares, one per thread. Where the threads stream
// memory side by side they do not always go at one speed: on a Zen5 VM in its faster memory state the main
// thread finished a 1B model's decode GEMVs 5-10% after the other (the one above 3 ms, 0.28 ms after), every
// call, while in the slower state the two ended together. Here each thread still starts on its own contiguous
// share and reads it front to back, `grain` items at a time (so prefetching past a claim's end lands where the
// thread goes next); a thread out of work takes `grain` items at a time from the back of the share with most
// left. A share is one atomic word, its next and end positions: the owner claims from the front, others from
// the back, each with a compare-and-swap, so no item runs twice and none is skipped.

#pragma once

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

// Include it outside any target pragma (plain x86-64 code): its functions are inline, shared by every build.
namespace sarathi_kernels {

namespace parallel_ranges_detail {

// One thread's share: [next, end) packed into a word, next in the low 32 bits (a cache line of its own).
struct alignas(64) Share {
  std::atomic<uint64_t> word{0};
};

inline uint64_t pack(uint32_t next, uint32_t end) { return static_cast<uint64_t>(end) << 32 | next; }

// Claims up to `grain` items from the front (owner) or the back (anyone else); false when the share is empty.
inline bool claim(Share& share, int64_t grain, bool front, int64_t& begin, int64_t& stop) {
  uint64_t seen = share.word.load(std::memory_order_acquire);
  for (;;) {
    const uint32_t next = static_cast<uint32_t>(seen), end = static_cast<uint32_t>(seen >> 32);
    if (next >= end) return false;
    const uint32_t take = static_cast<uint32_t>(std::min<int64_t>(grain, end - next));
    const uint64_t want = front ? pack(next + take, end) : pack(next, end - take);
    if (share.word.compare_exchange_weak(seen, want, std::memory_order_acq_rel, std::memory_order_acquire)) {
      begin = front ? next : end - take;
      stop = front ? next + take : end;
      return true;
    }
  }
}

inline int64_t left(const Share& share) {
  const uint64_t seen = share.word.load(std::memory_order_relaxed);
  return static_cast<int64_t>(seen >> 32) - static_cast<int64_t>(static_cast<uint32_t>(seen));
}

}  // namespace parallel_ranges_detail

// body(begin, end) over disjoint pieces covering [0, n) exactly once (n < 2^32), `grain` items or fewer each.
template <typename Body>
void parallel_stealing(int64_t n, int64_t grain, const Body& body) {
  using namespace parallel_ranges_detail;
  TORCH_CHECK(n < (int64_t{1} << 32), "parallel_stealing: ", n, " items, more than a share's 32-bit positions hold");
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), n);
  if (threads <= 1 || at::in_parallel_region()) {
    if (n > 0) body(0, n);
    return;
  }
  grain = std::max<int64_t>(grain, 1);
  Share local[8];  // the usual thread counts, without an allocation
  const std::unique_ptr<Share[]> allocated(threads > 8 ? new Share[threads] : nullptr);
  Share* shares = threads > 8 ? allocated.get() : local;
  for (int64_t t = 0; t < threads; ++t)
    shares[t].word.store(pack(static_cast<uint32_t>(n * t / threads), static_cast<uint32_t>(n * (t + 1) / threads)),
                         std::memory_order_relaxed);
  // one share per task: where fewer threads run, a thread takes several tasks (and steals in each)
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    int64_t begin, stop;
    for (int64_t t = t0; t < t1; ++t) {
      while (claim(shares[t], grain, true, begin, stop)) body(begin, stop);
      for (;;) {
        int64_t victim = -1, most = 0;
        for (int64_t v = 0; v < threads; ++v)
          if (const int64_t l = left(shares[v]); l > most) victim = v, most = l;
        if (victim < 0) break;
        if (claim(shares[victim], grain, false, begin, stop)) body(begin, stop);
      }
    }
  });
}

}  // namespace sarathi_kernels
