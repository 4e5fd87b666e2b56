// Decode attention's split into tasks, shared by its AVX-512 build (decode_attention.cpp) and its AVX2 build
// (decode_attention_avx2.cpp): one task per (sequence, head unit, span of kChunkKeys keys). A context longer
// than one span is merged from its spans' results by their softmax maxima and sums (flash-decoding's split):
// so one long sequence spreads over every thread, and a row's result depends on its own context only, never
// on the batch.
//
// Include it under the including file's target pragma: its functions are in an anonymous namespace, so each
// build gets its own copy, compiled for its instruction set.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "parallel_ranges.h"

namespace sarathi_kernels {
namespace {

// Keys per span: a multiple of every usual block size; at 512 keys, SmolLM2's 3 kv heads make 12 tasks.
constexpr int64_t kChunkKeys = 128;

// Blocks sit anywhere in the cache, too short for the hardware prefetcher to find each one in time. So each pass
// first prefetches all its span's blocks to L2 (and those of the tensor the next pass reads: a span's keys
// and values fit there), then, while a block is read, prefetches the block kPrefetchAhead places ahead on to
// L1. With the L1 prefetch alone, at 8 and 32 sequences of 512 keys (Llama 3.2 1B's heads, Zen5) the cache was
// read at ~11 GB/s; with both at ~22.
constexpr int64_t kPrefetchAhead = 4;

// The keys and values of a thread's next task, prefetched to L2 a line of each per key from inside the current
// task's loops (for_each_key). A task's own prefetches come only as it starts, so one read from memory
// (the cache is cold there: a decode step streams every weight between two layers' attention) waited for
// its blocks with the memory idle while it computed; this keeps the next task's reads in flight meanwhile.
// Zen5, KV cache on huge pages (kv_cache.py): decode steps of 8 / 32 sequences at 512 keys took 0.89x /
// 0.85x the time (SmolLM2 Q4_1) and 0.98x / 0.95x (Llama 3.2 1B's shape, Q4_K_M), one sequence 0.99x. A
// line per block rather than per key gained half as much; hints T0 and T2 less than T1.
struct Ahead {
  const char* k = nullptr;  // the kv head's blocks in each tensor
  const char* v = nullptr;
  const int64_t* table = nullptr;
  int64_t block = 0, end = 0;  // blocks [block, end) of the table are left
  int64_t offset = 0, block_bytes = 0, lines_per_key = 0;

  // Prefetches the next lines_per_key lines of both tensors.
  void step() {
    for (int64_t i = 0; i < lines_per_key && block < end; ++i) {
      const int64_t at = table[block] * block_bytes + offset;
      _mm_prefetch(k + at, _MM_HINT_T1);
      _mm_prefetch(v + at, _MM_HINT_T1);
      if ((offset += 64) >= block_bytes) offset = 0, ++block;
    }
  }
};

// Calls f(j - first, row) for each key first <= j < context, row pointing at its head_dim values in this
// head's blocks, and ahead.step() after each. `next_head` (or null): the same blocks of the tensor the next
// pass reads, prefetched to L2.
template <typename T, typename F>
inline void for_each_key(const T* head, const T* next_head, const int64_t* table, int64_t first, int64_t context,
                         int64_t block_size, int64_t d, Ahead& ahead, F&& f) {
  const int64_t blocks = (context + block_size - 1) / block_size, first_block = first / block_size;
  const int64_t block_bytes = block_size * d * static_cast<int64_t>(sizeof(T));
  auto prefetch = [&](const T* tensor, int64_t blk, int hint) {
    const char* p = reinterpret_cast<const char*>(tensor + table[blk] * block_size * d);
    for (int64_t off = 0; off < block_bytes; off += 64)
      hint == _MM_HINT_T0 ? _mm_prefetch(p + off, _MM_HINT_T0) : _mm_prefetch(p + off, _MM_HINT_T1);
  };
  for (int64_t blk = first_block; blk < blocks; ++blk) {
    prefetch(head, blk, _MM_HINT_T1);
    if (next_head) prefetch(next_head, blk, _MM_HINT_T1);
  }
  for (int64_t blk = first_block; blk < std::min(blocks, first_block + kPrefetchAhead); ++blk)
    prefetch(head, blk, _MM_HINT_T0);
  for (int64_t blk = first_block; blk < blocks; ++blk) {
    if (blk + kPrefetchAhead < blocks) prefetch(head, blk + kPrefetchAhead, _MM_HINT_T0);
    const int64_t start = std::max(first, blk * block_size), end = std::min(context, (blk + 1) * block_size);
    const T* row = head + (table[blk] * block_size + start - blk * block_size) * d;
    for (int64_t j = start; j < end; ++j, row += d) f(j - first, row), ahead.step();
  }
}

// The spans of a row's keys [first, context): aligned to multiples of kChunkKeys, so a row is split the same
// way whatever batch it is in.
struct Spans {
  int64_t first, context;
  int64_t begin() const { return first / kChunkKeys; }
  int64_t count() const { return (context - 1) / kChunkKeys - begin() + 1; }
  int64_t lo(int64_t c) const { return std::max(first, (begin() + c) * kChunkKeys); }
  int64_t hi(int64_t c) const { return std::min(context, (begin() + c + 1) * kChunkKeys); }
};

// Runs every task, then merges the spans of the rows that have more than one. `units` heads units per row
// (kv heads: each task attends that kv head's group of query heads; or query heads: one each).
// attend(q, k_head, v_head, table, first, context, scores, out, stats, ahead) attends one unit's query heads
// [per_unit, d] over keys [first, context) of the kv head's blocks, writing their normalized outputs and
// softmax (max, sum) pairs, and passes `ahead` to its for_each_key calls; scores is scratch for per_unit *
// kChunkKeys floats. merge(partial, stride, stats, stat_stride, n, d, out) is merge_spans.
template <typename T, typename Attend, typename Merge>
void run_tasks(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& tables,
               const at::Tensor& lens, int64_t window, int64_t units, at::Tensor& out, Attend&& attend,
               Merge&& merge) {
  const int64_t batch = q.size(0), heads = q.size(1), d = q.size(2);
  const int64_t kv_heads = k_cache.size(0), num_blocks = k_cache.size(1), block_size = k_cache.size(2);
  const int64_t rep = heads / kv_heads, max_blocks = tables.size(1), per_unit = heads / units;
  const float* qp = q.data_ptr<float>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  const int64_t* tp = tables.data_ptr<int64_t>();
  const int64_t* lp = lens.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const int64_t head_stride = num_blocks * block_size * d;
  const int64_t block_bytes = block_size * d * static_cast<int64_t>(sizeof(T));
  std::vector<Spans> spans(batch);
  std::vector<int64_t> task0(batch + 1, 0), part0(batch + 1, 0);  // first task, first partial span of each row
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t context = lp[b], first = window > 0 ? std::max<int64_t>(0, context - window) : 0;
    spans[b] = {first, context};
    const int64_t n = spans[b].count();
    task0[b + 1] = task0[b] + units * n;
    part0[b + 1] = part0[b] + (n > 1 ? n : 0);
  }
  // Rows of more than one span write each span's normalized output and softmax stats here, merged below.
  at::Tensor partial = at::empty({part0[batch] * heads * (d + 2)}, q.options());
  float* pp = partial.data_ptr<float>();
  float* stat_p = pp + part0[batch] * heads * d;
  // a thread that runs out of tasks takes the last ones of the other's share (parallel_ranges.h)
  parallel_stealing(task0[batch], 1, [&](int64_t t0, int64_t t1) {
    thread_local std::vector<float> scores, own_stats;
    scores.resize(static_cast<size_t>(per_unit * kChunkKeys)), own_stats.resize(2 * per_unit);
    int64_t b = std::upper_bound(task0.begin(), task0.end(), t0) - task0.begin() - 1;
    // span-major: the query heads of one kv head (head units) read a span one after the other, from L2
    auto kv_head = [&](int64_t u) { return units == kv_heads ? u : u / rep; };
    for (int64_t t = t0; t < t1; ++t) {
      while (t >= task0[b + 1]) ++b;
      const Spans& sp_b = spans[b];
      const int64_t n = sp_b.count(), c = (t - task0[b]) / units, u = (t - task0[b]) % units;
      const int64_t g = kv_head(u), h0 = u * per_unit;  // kv head, first query head
      Ahead ahead;  // task t + 1: a thread claims its share front to back, so most likely its next
      if (t + 1 < task0[batch]) {
        const int64_t nb = t + 1 < task0[b + 1] ? b : b + 1, i = t + 1 - task0[nb];
        const int64_t nc = i / units, ng = kv_head(i % units);
        if (ng != g || nc != c || nb != b) {  // not the span this task reads (the next query heads of its kv head)
          const int64_t lo = spans[nb].lo(nc), hi = spans[nb].hi(nc), lines_per_block = (block_bytes + 63) / 64;
          ahead = {reinterpret_cast<const char*>(kp + ng * head_stride),
                   reinterpret_cast<const char*>(vp + ng * head_stride),
                   tp + nb * max_blocks,
                   lo / block_size,
                   (hi - 1) / block_size + 1,
                   0,
                   block_bytes,
                   0};
          const int64_t keys = sp_b.hi(c) - sp_b.lo(c);  // each read in two passes, keys then values
          ahead.lines_per_key = ((ahead.end - ahead.block) * lines_per_block + 2 * keys - 1) / (2 * keys);
        }
      }
      float* o = op + (b * heads + h0) * d;
      float* st = own_stats.data();
      if (n > 1) {  // partial span c of row b: [span][head][d], stats [span][head][2]
        o = pp + ((part0[b] + c) * heads + h0) * d;
        st = stat_p + ((part0[b] + c) * heads + h0) * 2;
      }
      attend(qp + (b * heads + h0) * d, kp + g * head_stride, vp + g * head_stride, tp + b * max_blocks,
             sp_b.lo(c), sp_b.hi(c), scores.data(), o, st, ahead);
    }
  });
  if (part0[batch] == 0) return;
  at::parallel_for(0, batch * heads, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / heads, h = r % heads, n = part0[b + 1] - part0[b];
      if (n > 1)
        merge(pp + (part0[b] * heads + h) * d, heads * d, stat_p + (part0[b] * heads + h) * 2, heads * 2, n, d,
              op + r * d);
    }
  });
}

}  // namespace
}  // namespace sarathi_kernels
