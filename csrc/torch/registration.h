// The ops of the `redrafter` namespace (schemas: registration.cpp), for the per-device
// registrations: each device's file defines a launcher <op>_<device> for every op and registers
// them all with one line, TORCH_LIBRARY_IMPL(redrafter, CPU, m) { REDRAFTER_IMPL_ALL(m, cpu); }.
#pragma once
#include <torch/library.h>

#define REDRAFTER_IMPL_ALL(m, device)                     \
  m.impl("tree_mask", &tree_mask_##device);               \
  m.impl("beam_topk", &beam_topk_##device);               \
  m.impl("build_trie", &build_trie_##device);             \
  m.impl("ngram_lookup", &ngram_lookup_##device);         \
  m.impl("verify_greedy", &verify_greedy_##device);       \
  m.impl("verify_sample", &verify_sample_##device);       \
  m.impl("kv_compact", &kv_compact_##device);             \
  m.impl("kv_compact_paged", &kv_compact_paged_##device)
