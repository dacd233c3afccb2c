// Part of optim_router_emulate.cpp (included after its kernels): multi_tensor.cu's optimizer step against
// elementwise.cu's single-tensor kernels, bitwise. The gradient norm's sum of squares over tensors of many sizes
// and two parts spanning launches against reduce_sum's tree per tensor summed as the host sums it; the
// clip factor and the non-finite check against the host's formula (clip on and off, NaN and inf gradients, the
// sticky skip flag, the check off); AdamW (f32 and bf16 moments, a bf16 parameter copy) and SGD with the scale
// read from the device against one single-tensor launch per tensor with the host's scale, and nothing written when
// the step is skipped; the deferred id check's record.
#pragma once

namespace {
using namespace moecore::launch;

// reduce_sum's ‖a‖² (elementwise.cu, kind 0) computed on the host without the emulation's threads: block b's
// thread t sums a[b·256 + t + j·256·256] in order, each block's 256 sums by the block tree, the 256 block sums by the
// tree again. Tied to the kernel itself by reduce_sum_matches_host below.
double tree256(std::vector<double> v) {
  for (int s = 128; s > 0; s >>= 1)
    for (int t = 0; t < s; t++) v[t] += v[t + s];
  return v[0];
}
double host_sum_squares(const std::vector<float>& a) {
  const int64_t n = static_cast<int64_t>(a.size()), stride = int64_t{kSquaresBlocks} * kThreads;
  std::vector<double> blocks(kSquaresBlocks);
  for (int b = 0; b < kSquaresBlocks; b++) {
    std::vector<double> th(kThreads, 0.0);
    for (int t = 0; t < kThreads; t++)
      for (int64_t i = int64_t{b} * kThreads + t; i < n; i += stride) {
        const double x = a[i];
        th[t] += x * x;
      }
    blocks[b] = tree256(th);
  }
  return tree256(blocks);
}
bool reduce_sum_matches_host() {
  bool ok = true;
  for (int64_t n : {5L, 70001L}) {
    const auto a = emu::rnd(static_cast<size_t>(n), 77 + n, -3, 3);
    double got = -1;
    reduce_sum(0, a.data(), nullptr, n, &got, nullptr);
    const double want = host_sum_squares(a);
    ok &= std::memcmp(&got, &want, 8) == 0;
  }
  return ok;
}

// Σ_k w_k·‖a_k‖² of each part, the parts summed: as ChainedOptimizer summed reduce_sum's host doubles.
double host_squares(const std::vector<std::vector<std::vector<float>>>& parts,
                    const std::vector<std::vector<double>>& w) {
  double total = 0;
  for (size_t q = 0; q < parts.size(); q++) {
    double part = 0;
    for (size_t k = 0; k < parts[q].size(); k++) part += w[q][k] * host_sum_squares(parts[q][k]);
    total += part;
  }
  return total;
}

// The device's Σ: every part in batches of at most 3 tensors (kMultiTensors in kernels/cuda's launcher; fewer here,
// so the emulation stays cheap while the parts still span launches).
void device_squares(const std::vector<std::vector<std::vector<float>>>& parts,
                    const std::vector<std::vector<double>>& w, double* clip) {
  std::vector<double> partials(kMultiTensors * kSquaresBlocks);
  squares_reset(clip, nullptr);
  for (size_t q = 0; q < parts.size(); q++) {
    SquaresBatch b;
    b.begin_part = true;
    for (size_t k = 0; k < parts[q].size(); k++) {
      b.a[b.count] = parts[q][k].data();
      b.n[b.count] = static_cast<int64_t>(parts[q][k].size());
      b.w[b.count++] = w[q][k];
      if (b.count == 3 && k + 1 < parts[q].size()) {
        squares_accumulate(b, partials.data(), clip, nullptr);
        b = SquaresBatch();
      }
    }
    b.end_part = true;
    squares_accumulate(b, partials.data(), clip, nullptr);
  }
}

bool same_double(double a, double b) {
  return std::memcmp(&a, &b, 8) == 0;
}

bool grad_norm_case() {
  std::vector<std::vector<std::vector<float>>> parts(2);
  std::vector<std::vector<double>> w(2);
  const int64_t sizes[] = {1, 7, 1000, 65537, 300000, 256, 4096};
  for (int k = 0; k < 4; k++) {  // the dense part: two launches
    parts[0].push_back(emu::rnd(static_cast<size_t>(sizes[k % 7] + k), 100 + k, -2, 2));
    w[0].push_back(k % 3 == 0 ? 0.5 : 1.0);
  }
  for (int k = 0; k < 1; k++) {  // the expert part, weighted 1/EDP
    parts[1].push_back(emu::rnd(static_cast<size_t>(sizes[(k + 3) % 7]), 200 + k));
    w[1].push_back(0.25);
  }
  double clip[kClipSlots] = {};
  device_squares(parts, w, clip);
  const double want = host_squares(parts, w);
  bool ok = reduce_sum_matches_host() && same_double(clip[kClipTotal], want);
  // Clip on, the norm above it: the scale is the host's coefficient.
  double norm_out = -1;
  clip_finish(clip, false, 0, 1.0, true, 5, &norm_out, nullptr, nullptr);
  const double norm = std::sqrt(want), coeff = 1.0 / (norm + 1e-6);
  ok &= coeff < 1.0 && same_double(clip[kClipNorm], norm) && same_double(norm_out, norm) &&
        same_double(clip[kClipScale], coeff) && clip[kClipSkip] == 0.0;
  // Clip on, the norm below it; clip off: scale 1.
  clip_finish(clip, false, 0, 1e9, true, 6, nullptr, nullptr, nullptr);
  ok &= clip[kClipScale] == 1.0;
  clip_finish(clip, false, 0, 0.0, true, 7, nullptr, nullptr, nullptr);
  ok &= clip[kClipScale] == 1.0 && same_double(clip[kClipNorm], norm);
  // The sum over ranks given by the host.
  clip_finish(clip, true, 16.0, 1.0, true, 8, nullptr, nullptr, nullptr);
  ok &= clip[kClipNorm] == 4.0 && same_double(clip[kClipScale], 1.0 / (4.0 + 1e-6));
  std::printf("multi-tensor grad norm (5 tensors, 2 parts, 3 launches) and clip: %s (norm %.17g)\n",
              ok ? "bitwise ok" : "FAIL", clip[kClipNorm]);
  return ok;
}

// The host's scale for a norm: clip / (norm + 1e-6) where below 1, else 1 (NaN: 1; inf: 0).
double host_scale(double norm, double clip_grad) {
  const double coeff = clip_grad / (norm + 1e-6);
  return clip_grad > 0 && coeff < 1.0 ? coeff : 1.0;
}

bool nonfinite_case() {
  bool ok = true;
  for (float bad : {NAN, INFINITY}) {
    std::vector<std::vector<std::vector<float>>> parts(1);
    std::vector<std::vector<double>> w(1, std::vector<double>(1, 1.0));
    parts[0].push_back(emu::rnd(700, 300));
    parts[0][0][432] = bad;
    double clip[kClipSlots] = {};
    device_squares(parts, w, clip);
    double off[kClipSlots];  // the same sums, for the check off below
    std::memcpy(off, clip, sizeof off);
    double norm_out = 0;
    clip_finish(clip, false, 0, 1.0, true, 11, &norm_out, nullptr, nullptr);
    ok &= !std::isfinite(clip[kClipNorm]) && !std::isfinite(norm_out) && clip[kClipSkip] == 1.0 &&
          clip[kClipFirstBad] == 11.0;
    ok &= clip[kClipScale] == host_scale(clip[kClipNorm], 1.0);
    // Sticky: a later finite step keeps the flag and the first bad iteration.
    clip_finish(clip, true, 4.0, 1.0, true, 12, nullptr, nullptr, nullptr);
    ok &= clip[kClipSkip] == 1.0 && clip[kClipFirstBad] == 11.0 && clip[kClipNorm] == 2.0;
    // The check off (--no-check-for-nan-in-loss-and-grad): never skips; the host's scale (1 for NaN, 0 for inf).
    clip_finish(off, false, 0, 1.0, false, 11, nullptr, nullptr, nullptr);
    ok &= off[kClipSkip] == 0.0 && off[kClipScale] == host_scale(off[kClipNorm], 1.0);
  }
  std::printf("multi-tensor non-finite check (NaN, inf; sticky; check off): %s\n", ok ? "ok" : "FAIL");
  return ok;
}

// AdamW over tensors of several sizes (more than one launch of the multi-tensor kernel), each with its own weight
// decay, against one elementwise.cu launch per tensor with the host's scale; bf16 moments when m16 / v16.
bool adamw_multi_case(bool m16, bool v16, bool clipped, bool skipped) {
  const int count = 7;
  const AdamWScalars base{1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1.0f - 0.9f * 0.9f * 0.9f, 1.0f - 0.95f * 0.95f * 0.95f,
                          1.0f};
  double clip[kClipSlots] = {};
  clip[kClipScale] = clipped ? 0.3712345678901234 : 1.0;
  clip[kClipSkip] = skipped ? 1.0 : 0.0;
  using bf = __nv_bfloat16;
  struct One {
    std::vector<float> p, g, mf, vf, rp, rmf, rvf;
    std::vector<bf> mb, vb, rmb, rvb, pb, rpb;
  };
  std::vector<One> t(count);
  AdamWMultiBatch b;
  b.m_bf16 = m16;
  b.v_bf16 = v16;
  bool ok = true;
  auto to_bf = [](const std::vector<float>& x) {
    std::vector<bf> y(x.size());
    for (size_t i = 0; i < x.size(); i++) y[i] = __float2bfloat16_rn(x[i]);
    return y;
  };
  auto flush = [&] {
    adamw_multi(b, base, clip, nullptr);
    b.count = 0;
  };
  for (int k = 0; k < count; k++) {
    One& o = t[k];
    const size_t n = static_cast<size_t>(1 + (k * 977) % 700);
    o.p = emu::rnd(n, 400 + k);
    o.g = emu::rnd(n, 500 + k);
    o.mf = emu::rnd(n, 600 + k, -0.1f, 0.1f);
    o.vf = emu::rnd(n, 700 + k, 0, 0.01f);
    o.mb = to_bf(o.mf);
    o.vb = to_bf(o.vf);
    o.rp = o.p;
    o.rmf = o.mf;
    o.rvf = o.vf;
    o.rmb = o.mb;
    o.rvb = o.vb;
    o.pb.assign(n, __float2bfloat16_rn(0.0f));
    o.rpb = o.pb;
    const float wd = k % 4 == 0 ? 0.0f : 0.1f;
    // The reference: elementwise.cu's kernel, one tensor per launch, the host's f32 scale.
    AdamWBatch r;
    r.m_bf16 = m16;
    r.v_bf16 = v16;
    r.p[0] = o.rp.data();
    r.g[0] = o.g.data();
    r.m[0] = m16 ? static_cast<void*>(o.rmb.data()) : o.rmf.data();
    r.v[0] = v16 ? static_cast<void*>(o.rvb.data()) : o.rvf.data();
    r.p_bf16[0] = k % 2 ? o.rpb.data() : nullptr;
    r.n[0] = static_cast<int64_t>(n);
    r.count = 1;
    AdamWScalars h = base;
    h.wd = wd;
    h.grad_scale = static_cast<float>(clip[kClipScale]);
    if (!skipped) adamw(r, h, nullptr);
    const int i = b.count++;
    b.p[i] = o.p.data();
    b.g[i] = o.g.data();
    b.m[i] = m16 ? static_cast<void*>(o.mb.data()) : o.mf.data();
    b.v[i] = v16 ? static_cast<void*>(o.vb.data()) : o.vf.data();
    b.p_bf16[i] = k % 2 ? o.pb.data() : nullptr;
    b.n[i] = static_cast<int64_t>(n);
    b.wd[i] = wd;
    if (b.count == 3) flush();  // batches spanning launches (kMultiTensors in kernels/cuda's launcher)
  }
  flush();
  for (const One& o : t) {
    ok &= same_bits(o.p.data(), o.rp.data(), o.p.size() * 4) && same_bits(o.pb.data(), o.rpb.data(), o.pb.size() * 2);
    ok &= m16 ? same_bits(o.mb.data(), o.rmb.data(), o.mb.size() * 2)
              : same_bits(o.mf.data(), o.rmf.data(), o.mf.size() * 4);
    ok &= v16 ? same_bits(o.vb.data(), o.rvb.data(), o.vb.size() * 2)
              : same_bits(o.vf.data(), o.rvf.data(), o.vf.size() * 4);
  }
  std::printf("multi-tensor adamw (7 tensors, m %s, v %s, %s): %s\n", m16 ? "bf16" : "f32", v16 ? "bf16" : "f32",
              skipped   ? "skipped"
              : clipped ? "clipped"
                        : "scale 1",
              ok ? "bitwise ok" : "FAIL");
  return ok;
}

bool sgd_multi_case(bool skipped) {
  double clip[kClipSlots] = {};
  clip[kClipScale] = 0.625;
  clip[kClipSkip] = skipped ? 1.0 : 0.0;
  bool ok = true;
  const int count = 5;
  std::vector<std::vector<float>> p(count), g(count), buf(count), rp, rbuf;
  std::vector<std::vector<__nv_bfloat16>> pb(count);
  AdamWMultiBatch b;
  for (int k = 0; k < count; k++) {
    const size_t n = static_cast<size_t>(3 + 300 * k);
    p[k] = emu::rnd(n, 800 + k);
    g[k] = emu::rnd(n, 900 + k);
    buf[k] = emu::rnd(n, 1000 + k, -0.1f, 0.1f);
    pb[k].assign(n, __float2bfloat16_rn(0.0f));
    b.p[k] = p[k].data();
    b.g[k] = g[k].data();
    b.m[k] = buf[k].data();
    b.p_bf16[k] = k == 2 ? pb[k].data() : nullptr;
    b.n[k] = static_cast<int64_t>(n);
    b.wd[k] = k % 2 ? 0.01f : 0.0f;
  }
  b.count = count;
  rp = p;
  rbuf = buf;
  sgd_multi(b, 0.05f, 0.9f, clip, 1.0f, nullptr);
  for (int k = 0; k < count; k++) {
    if (!skipped) sgd(rp[k].data(), g[k].data(), rbuf[k].data(), b.n[k], 0.05f, b.wd[k], 0.9f, 0.625f, nullptr);
    ok &= same_bits(p[k].data(), rp[k].data(), p[k].size() * 4) &&
          same_bits(buf[k].data(), rbuf[k].data(), buf[k].size() * 4);
    if (k == 2)
      for (size_t i = 0; i < p[k].size(); i++)
        ok &= skipped ? bf16_float(reinterpret_cast<uint16_t&>(pb[k][i])) == 0.0f
                      : reinterpret_cast<uint16_t&>(pb[k][i]) == bf16_rne(rp[k][i]);
  }
  std::printf("multi-tensor sgd (%s): %s\n", skipped ? "skipped" : "clipped", ok ? "bitwise ok" : "FAIL");
  return ok;
}

// The deferred id check: the first id outside [0, V) of a call, kept across calls (the first call's wins), i32 and
// i64 ids, none recorded when all are inside; and a recorded one sets the clip state's skip flag.
bool id_check_case() {
  bool ok = true;
  int64_t slots[kIdCheckKinds * kIdCheckSlots] = {};
  std::vector<int32_t> good(3000);
  for (size_t i = 0; i < good.size(); i++) good[i] = static_cast<int32_t>(i % 64);
  record_bad_id(good.data(), false, 3000, 64, slots, 7, nullptr);
  ok &= slots[0] == 0;
  std::vector<int64_t> ids(5000, 3);
  ids[4100] = -1;
  ids[2345] = 64;  // the first outside
  ids[4999] = 1000;
  record_bad_id(ids.data(), true, 5000, 64, slots + kIdCheckSlots, 9, nullptr);
  ok &= slots[kIdCheckSlots] == 1 && slots[kIdCheckSlots + 1] == 2345 && slots[kIdCheckSlots + 2] == 64 &&
        slots[kIdCheckSlots + 3] == 64 && slots[kIdCheckSlots + 4] == 9;
  ids[2345] = 3;
  ids[10] = -5;  // a later call's bad id does not replace the first
  record_bad_id(ids.data(), true, 5000, 64, slots + kIdCheckSlots, 10, nullptr);
  ok &= slots[kIdCheckSlots + 1] == 2345 && slots[kIdCheckSlots + 4] == 9;
  good[2999] = 64;  // i32 ids, the last position
  record_bad_id(good.data(), false, 3000, 64, slots, 11, nullptr);
  ok &= slots[0] == 1 && slots[1] == 2999 && slots[2] == 64 && slots[4] == 11;
  // The clip state: a finite norm, the check on, but a bad id recorded: the step is skipped.
  double clip[kClipSlots] = {};
  clip[kClipTotal] = 4.0;
  clip_finish(clip, false, 0, 1.0, true, 9, nullptr, slots, nullptr);
  ok &= clip[kClipSkip] == 1.0 && clip[kClipFirstBad] == 9.0 && clip[kClipNorm] == 2.0;
  std::printf("deferred id checks (first bad id kept, i32/i64) and their skip: %s\n", ok ? "ok" : "FAIL");
  return ok;
}

bool multi_tensor_cases() {
  bool ok = grad_norm_case();
  ok &= nonfinite_case();
  ok &= id_check_case();
  for (bool skipped : {false, true})
    for (bool clipped : {false, true})
      for (int moments = 0; moments < 4; moments++) ok &= adamw_multi_case(moments & 1, moments & 2, clipped, skipped);
  ok &= sgd_multi_case(false) && sgd_multi_case(true);
  return ok;
}
}  // namespace
