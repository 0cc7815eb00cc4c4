/* The formulas the computing labs evaluate in the reader's browser, from the reader's input.
 * One source for the site (labs.js reads window.TRLabFormulas) and for the tests, which load
 * this file in Node and hold every formula equal to transformer_ref's (tests/book/test_lab_formulas.py):
 *
 *   kvCache(c)    bytes of a KV cache: kv_cache_bytes (2 L H_kv D S B numbers) or, for MLA,
 *                 mla_kv_cache_bytes (L (d_c + d_R) S B numbers), at `bits` per number, plus the
 *                 fp16 scales of quantize_kv's codes (bits < 16): one per cached vector
 *                 ("token": a key or value head of a token, or MLA's latent of a token) or one per
 *                 channel of each cached vector over the whole sequence ("channel").
 *   mask(c)       boolean rows (T, S) of causal_mask, sliding_window_mask, prefix_lm_mask
 *                 (T = S), or causal_mask & padding_mask (the last S - length keys are padding).
 *   attend(q, K, allowed, scale)   softmax(q . k_j * scale) over the allowed keys j (zeros
 *                 where masked; all zeros when nothing is allowed), as scaled_dot_product_attention.
 */
(function (root, factory) {
  "use strict";
  var api = factory();
  if (typeof module === "object" && module.exports) module.exports = api;
  else root.TRLabFormulas = api;
})(typeof self !== "undefined" ? self : this, function () {
  "use strict";
  var SCALE_BYTES = 2;   // fp16 scales

  function kvCache(c) {
    var B = c.batch, S = c.seqLen, L = c.layers, bits = c.bits;
    var perVector, vectors;            // numbers in one cached vector, cached vectors per token and layer
    if (c.attention === "mla") { perVector = c.kvLoraRank + c.ropeHeadDim; vectors = 1; }
    else { perVector = c.headDim; vectors = 2 * c.kvHeads; }        // a key and a value per KV head
    var numbers = L * vectors * perVector * S * B;
    var scales = 0;
    if (bits < 16) scales = c.scales === "channel" ? L * vectors * perVector * B : L * vectors * S * B;
    var dataBytes = numbers * bits / 8;
    return {numbers: numbers, dataBytes: dataBytes, scales: scales, scaleBytes: scales * SCALE_BYTES,
            bytes: dataBytes + scales * SCALE_BYTES};
  }

  function mask(c) {
    var T = c.T, S = c.kind === "prefix" ? c.T : c.S, rows = [];
    for (var i = 0; i < T; i++) {
      var row = [], p = i + S - T;                                 // the query's absolute position
      for (var j = 0; j < S; j++) {
        var ok;
        if (c.kind === "causal") ok = j <= p;
        else if (c.kind === "sliding") ok = j <= p && j > p - c.window;
        else if (c.kind === "prefix") ok = j <= i || j < c.prefix;
        else if (c.kind === "padding") ok = j <= p && j < c.length;
        else throw new Error("unknown mask kind " + c.kind);
        row.push(ok);
      }
      rows.push(row);
    }
    return rows;
  }

  function attend(q, K, allowed, scale) {
    var scores = K.map(function (k) { var s = 0; for (var d = 0; d < q.length; d++) s += q[d] * k[d]; return s * scale; });
    var top = -Infinity;
    scores.forEach(function (s, j) { if (allowed[j] && s > top) top = s; });
    if (top === -Infinity) return scores.map(function () { return 0; });
    var e = scores.map(function (s, j) { return allowed[j] ? Math.exp(s - top) : 0; });
    var sum = e.reduce(function (a, b) { return a + b; }, 0);
    return e.map(function (x) { return x / sum; });
  }

  return {kvCache: kvCache, mask: mask, attend: attend};
});
