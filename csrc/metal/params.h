// Parameter blocks of the Metal kernels (csrc/metal/*.metal), passed with set_bytes. Included by
// the kernels (MSL) and by the host (dispatch.cpp, the emulation tests), so fields are plain
// 32-bit int/float only: one layout in MSL and C++. Sizes that can exceed 2^31 as products are
// multiplied in 64-bit inside the kernels.
#pragma once

struct TreeMaskParams {
  int N;      // nodes per row
  int words;  // ceil(N / 32) (packed layout)
};

struct BuildTrieParams {
  int W, L, N;  // N = 1 + W * (L - 1)
};

struct BeamTopkParams {
  int W, V, L;
  int step;         // position written, 1 <= step < L
  int C;            // candidates per beam row: min(W, V)
  int state_units;  // 16-bit units per state row (D * itemsize / 2)
};

struct VerifyParams {
  int n_logit_rows;  // logits rows per batch row (>= N)
  int V, W, L;
  float inv_temperature;  // verify_sample only: 1 / temperature (temperature > 0)
  int top_k;              // verify_sample only: 0 = off
  float top_p;            // verify_sample only: 1 = off
};

struct KvCompactParams {
  int units;  // n_layers * 2 * B * H: (layer, K/V, row, head) blocks of S slots
  int B, H, S;
  int vecs;   // vector units per slot (slot bytes / vector size)
  int L;
};

struct NgramLookupParams {
  int S;      // history columns of tokens [B, S]
  int max_n;  // the longest key, >= 1
  int m;      // drafts per row, >= 1
};
