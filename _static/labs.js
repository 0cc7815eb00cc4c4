/* Labs of "Attention, Part 2": draws the panels of every .tr-lab block that
 * transformer_ref.labs.lab() put on the page and redraws them when a control moves. The
 * look-up labs (rope, norm, training, tiles) draw values the chapter computed at build time;
 * the computing labs (kv, mask, flow) evaluate lab-formulas.js (window.TRLabFormulas, loaded
 * first) on what the reader types, the same formulas the tests hold equal to transformer_ref's.
 * Panels are SVG at the panel's real pixel size (so 12 px text stays 12 px on every screen).
 * No network, no dependencies. */
(function () {
  "use strict";
  var SVG = "http://www.w3.org/2000/svg";
  var C = {blue: "#0072B2", orange: "#E69F00", green: "#009E73", vermillion: "#D55E00",
           purple: "#CC79A7", sky: "#56B4E9"};
  var FONT = 12;        // px, = 9 pt: the smallest text a panel draws
  var MINUS = "\u2212";

  function el(tag, attrs, parent, text) {
    var node = document.createElementNS(SVG, tag);
    for (var key in attrs) { if (attrs[key] !== null && attrs[key] !== undefined) node.setAttribute(key, attrs[key]); }
    if (text !== undefined) node.textContent = text;
    if (parent) parent.appendChild(node);
    return node;
  }
  function fixed(x, digits) {                     // 1.2345 -> "1.235", -0.5 -> "−0.500"
    if (x === null || x === undefined) return "\u2014";
    var s = Math.abs(x).toFixed(digits);
    return (x < 0 && Number(s) !== 0 ? MINUS : "") + s;
  }
  function signed(x, digits) { return (x >= 0 ? "+" : "") + fixed(x, digits); }
  function range(a, b) { var out = []; for (var i = a; i <= b; i++) out.push(i); return out; }
  function niceTicks(lo, hi, count) {            // round steps (1, 2 or 5 x 10^k) giving about `count` ticks
    var span = hi - lo, best = null;
    var exp = Math.floor(Math.log10(span / count));
    [exp - 1, exp, exp + 1].forEach(function (e) {
      [1, 2, 5].forEach(function (f) {
        var step = f * Math.pow(10, e), first = Math.ceil(lo / step - 1e-9), last = Math.floor(hi / step + 1e-9);
        var n = last - first + 1, score = Math.abs(n - count);
        if (n >= 2 && (best === null || score < best.score)) best = {score: score, step: step, first: first, last: last};
      });
    });
    var out = [];
    for (var i = best.first; i <= best.last; i++) out.push(Math.abs(i * best.step) < 1e-12 ? 0 : i * best.step);
    return out;
  }
  function tickText(t) {
    var s = Math.abs(t) >= 100 || Number.isInteger(t) ? String(Math.round(t)) : String(Number(t.toPrecision(3)));
    return s.replace("-", MINUS);
  }

  /* One panel: an <svg> as wide as its box, with a plot area, linear (or log) scales and axes.
   * o: {title, xlabel, ylabel, xlim, ylim, xticks, yticks, xlog, ylog, aspect, axes} */
  function Panel(parent, o) {
    this.box = document.createElement("div");
    this.box.className = "tr-lab-panel";
    parent.appendChild(this.box);
    this.o = o;
  }
  Panel.prototype.begin = function (o) {             // clear and size the panel; its <svg> stays in place
    for (var key in o) this.o[key] = o[key];
    o = this.o;
    var width = Math.max(200, Math.floor(this.box.clientWidth || 300));
    var m = {left: o.ylabel ? 52 : 12, right: 12, top: o.title ? 26 : 8, bottom: (o.xlabel ? 42 : 10) + (o.legend ? 20 : 0)};
    var pw = width - m.left - m.right;
    var ph = Math.round(pw * (o.aspect || 0.8));
    var height = ph + m.top + m.bottom;
    if (!this.svg) {
      this.svg = el("svg", {"font-size": FONT, fill: "currentColor", "aria-hidden": "true", focusable: "false"}, this.box);
    }
    var svg = this.svg;
    if (this.width !== width) {
      svg.setAttribute("width", width); svg.setAttribute("height", height);
      svg.setAttribute("viewBox", "0 0 " + width + " " + height);
      this.cache = {};
    }
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    this.width = width; this.m = m; this.pw = pw; this.ph = ph;
    var f = function (lim, log, a, b) {
      var lo = log ? Math.log10(lim[0]) : lim[0], hi = log ? Math.log10(lim[1]) : lim[1];
      return function (v) { return a + ((log ? Math.log10(v) : v) - lo) / (hi - lo) * (b - a); };
    };
    this.x = f(o.xlim, o.xlog, m.left, m.left + pw);
    this.y = f(o.ylim, o.ylog, m.top + ph, m.top);
    if (o.title) el("text", {x: m.left + pw / 2, y: 17, "text-anchor": "middle", "font-weight": "bold", "font-size": 13}, svg, o.title);
    if (o.axes !== false) this.axes();
    if (o.legend) this.legend(o.legend, height - 8);
    this.plot = el("g", {}, svg);
    return this;
  };
  Panel.prototype.axes = function () {
    var o = this.o, m = this.m, svg = this.svg, self = this;
    var x0 = m.left, y0 = m.top + this.ph;
    var g = el("g", {stroke: "currentColor", "stroke-width": 1}, svg);
    el("line", {x1: x0, y1: y0, x2: x0 + this.pw, y2: y0}, g);
    el("line", {x1: x0, y1: y0, x2: x0, y2: m.top}, g);
    var xticks = o.xticks || niceTicks(Math.min.apply(null, o.xlim), Math.max.apply(null, o.xlim), Math.max(3, Math.min(6, Math.floor(this.pw / 45))));
    var yticks = o.yticks || niceTicks(Math.min.apply(null, o.ylim), Math.max.apply(null, o.ylim), Math.max(3, Math.min(6, Math.floor(this.ph / 40))));
    xticks.forEach(function (t) {
      var x = self.x(t);
      el("line", {x1: x, y1: y0, x2: x, y2: y0 + 4}, g);
      el("text", {x: x, y: y0 + 16, "text-anchor": "middle", stroke: "none"}, g, tickText(t));
    });
    yticks.forEach(function (t) {
      var y = self.y(t);
      el("line", {x1: x0 - 4, y1: y, x2: x0, y2: y}, g);
      el("text", {x: x0 - 6, y: y + 4, "text-anchor": "end", stroke: "none"}, g, tickText(t));
    });
    if (o.xlabel) el("text", {x: x0 + this.pw / 2, y: y0 + 34, "text-anchor": "middle"}, svg, o.xlabel);
    if (o.ylabel) el("text", {x: 0, y: 0, "text-anchor": "middle",
                              transform: "translate(13," + (m.top + this.ph / 2) + ") rotate(-90)"}, svg, o.ylabel);
  };
  Panel.prototype.layer = function (key, draw) {    // a part that does not change with the controls: drawn once per size
    if (!this.cache[key]) {
      var plot = this.plot;
      this.plot = this.cache[key] = el("g", {});
      draw();
      this.plot = plot;
    }
    this.plot.appendChild(this.cache[key]);
  };
  Panel.prototype.line = function (xs, ys, a) {
    var self = this, pts = [];
    xs.forEach(function (x, i) { if (ys[i] !== null) pts.push(self.x(x).toFixed(1) + "," + self.y(ys[i]).toFixed(1)); });
    return el("polyline", {points: pts.join(" "), fill: "none", stroke: a.color, "stroke-width": a.width || 1.5,
                           "stroke-dasharray": a.dash || null}, this.plot);
  };
  Panel.prototype.dot = function (x, y, a) {
    return el("circle", {cx: this.x(x), cy: this.y(y), r: a.r || 4, fill: a.fill || a.color, stroke: a.color,
                         "stroke-width": a.width || 1.5, opacity: a.opacity}, this.plot);
  };
  Panel.prototype.rect = function (x0, y0, x1, y1, a) {   // data coordinates of two corners
    var ax = this.x(x0), bx = this.x(x1), ay = this.y(y0), by = this.y(y1);
    return el("rect", {x: Math.min(ax, bx), y: Math.min(ay, by), width: Math.abs(bx - ax), height: Math.abs(by - ay),
                       fill: a.fill || "none", stroke: a.stroke || null, "stroke-width": a.width || null,
                       opacity: a.opacity, class: a.cls || null}, this.plot);
  };
  Panel.prototype.heat = function (colors, visible) {     // colors[r][c]: cell (c, r) centred on integers
    for (var r = 0; r < colors.length; r++) {
      for (var c = 0; c < colors[r].length; c++) {
        var shown = !visible || visible(r, c);
        this.rect(c - 0.5, r - 0.5, c + 0.5, r + 0.5, shown ? {fill: colors[r][c]} : {cls: "tr-lab-unseen"})
          .setAttribute("shape-rendering", "crispEdges");
      }
    }
  };
  Panel.prototype.label = function (x, y, text, a) {
    return el("text", {x: this.x(x) + (a.dx || 0), y: this.y(y) + (a.dy || 0), "text-anchor": a.anchor || "start",
                       fill: a.color || "currentColor", "font-weight": a.bold ? "bold" : null}, this.plot, text);
  };
  Panel.prototype.legend = function (entries, y) {       // [[label, colour, dash]], one row under the x label
    var self = this, x = this.m.left;
    entries.forEach(function (e) {
      el("line", {x1: x, y1: y - 4, x2: x + 22, y2: y - 4, stroke: e[1], "stroke-width": 2, "stroke-dasharray": e[2] || null}, self.svg);
      var label = el("text", {x: x + 27, y: y}, self.svg, e[0]);
      x += 27 + label.getComputedTextLength() + 16;
    });
  };

  /* ---- the views: one per kind of lab (see transformer_ref.labs) ---- */
  var VIEWS = {};

  VIEWS.rope = function (box, d, ctl) {
    var N = d.S.length;
    var circle = new Panel(box, {title: "pair 0 of q and k", xlim: [-1.3, 1.3], ylim: [-1.3, 1.3], aspect: 1, axes: false});
    var heat = new Panel(box, {title: "score s(m, n)", xlabel: "key position n", ylabel: "query position m",
                               xlim: [-0.5, N - 0.5], ylim: [-0.5, N - 0.5], aspect: 1});
    var lo = Math.min.apply(null, d.score_of_offset), hi = Math.max.apply(null, d.score_of_offset), pad = 0.08 * (hi - lo);
    var curve = new Panel(box, {title: "score vs offset", xlabel: "offset n \u2212 m (tokens)", ylabel: "score",
                                xlim: [d.offsets[0], d.offsets[d.offsets.length - 1]], ylim: [lo - pad, hi + pad]});
    return function () {
      var m = ctl.get("m"), n = ctl.get("n"), s = d.S[m][n];
      var between = ((d.k_angle[n] - d.q_angle[m] + 540) % 360) - 180;
      circle.begin({});
      el("circle", {cx: circle.x(0), cy: circle.y(0), r: circle.x(1) - circle.x(0), fill: "none", stroke: "currentColor",
                    "stroke-opacity": 0.4}, circle.plot);
      [[d.q_angle[m], C.blue, "q"], [d.k_angle[n], C.vermillion, "k"]].forEach(function (a) {
        var t = a[0] * Math.PI / 180, x = Math.cos(t), y = Math.sin(t);
        var x0 = circle.x(0), y0 = circle.y(0), x1 = circle.x(x), y1 = circle.y(y);
        var ux = (x1 - x0), uy = (y1 - y0), len = Math.sqrt(ux * ux + uy * uy); ux /= len; uy /= len;
        el("line", {x1: x0, y1: y0, x2: x1 - 9 * ux, y2: y1 - 9 * uy, stroke: a[1], "stroke-width": 3}, circle.plot);
        el("polygon", {points: [x1, y1, x1 - 12 * ux - 5 * uy, y1 - 12 * uy + 5 * ux, x1 - 12 * ux + 5 * uy, y1 - 12 * uy - 5 * ux].join(","),
                       fill: a[1]}, circle.plot);
        circle.label(1.17 * x, 1.17 * y, a[2], {color: a[1], bold: true, anchor: "middle", dy: 5});
      });
      heat.begin({});
      heat.layer("scores", function () { heat.heat(d.S_rgb); });
      heat.rect(n - 0.5, m - 0.5, n + 0.5, m + 0.5, {stroke: "currentColor", width: 2});
      heat.rect(n - 2, m - 2, n + 2, m + 2, {stroke: "currentColor", width: 1.5});
      curve.begin({});
      curve.layer("curve", function () { curve.line(d.offsets, d.score_of_offset, {color: C.blue}); });
      curve.dot(n - m, s, {color: C.vermillion, r: 5});
      return {
        text: "Query at m = " + m + ", key at n = " + n + ", offset n \u2212 m = " + fixed(n - m, 0) +
              ": score s(m, n) = " + signed(s, 3) + ". Pair 0 of q points at " + fixed(d.q_angle[m], 1) +
              "\u00b0, of k at " + fixed(d.k_angle[n], 1) + "\u00b0: " + fixed(between, 1) + "\u00b0 between them.",
        data: {m: m, n: n, offset: n - m, score: s, angle: between}
      };
    };
  };

  VIEWS.tiles = function (box, d, ctl, root) {
    var n = d.S.length, heat, bm, bl, lmax = 0, mlo = 0, mhi = 0;
    Object.keys(d.trace).forEach(function (bc) {
      d.trace[bc].forEach(function (row) { row.forEach(function (s) { lmax = Math.max(lmax, s[1]); mlo = Math.min(mlo, s[0]); mhi = Math.max(mhi, s[0]); }); });
    });
    heat = new Panel(box, {title: "tiles visited", xlabel: "key j", ylabel: "query i",
                           xlim: [-0.5, n - 0.5], ylim: [n - 0.5, -0.5], aspect: 1});
    bm = new Panel(box, {title: "running max m", xlabel: "m", ylabel: "query i", xlim: [mlo, mhi * 1.1], ylim: [n - 0.5, -0.5], aspect: 1});
    bl = new Panel(box, {title: "running sum \u2113", xlabel: "\u2113", ylabel: "query i", xlim: [0, lmax * 1.1], ylim: [n - 0.5, -0.5], aspect: 1});
    var table = document.createElement("div");
    table.className = "tr-lab-table";
    table.tabIndex = 0;                        // it may scroll sideways on a phone: reachable by keyboard
    table.setAttribute("role", "region");
    table.setAttribute("aria-label", "Rows of the current query tile");
    var readout = root.querySelector(".tr-lab-readout");
    readout.parentNode.insertBefore(table, readout.nextSibling);
    var last = null;
    return function () {
      var br = ctl.get("Bq"), bc = ctl.get("Bk"), nq = n / br, nk = n / bc;
      if (last !== br + "x" + bc) { ctl.setValues("step", range(1, nq * nk)); last = br + "x" + bc; }
      var t = ctl.get("step") - 1, i = Math.floor(t / nk), j = t % nk, tr = d.trace[bc];
      function state(r) { var qi = Math.floor(r / br); return qi < i ? tr[r][nk - 1] : qi === i ? tr[r][j] : null; }
      heat.begin({});
      heat.heat(d.S_rgb, function (r, c) { var qi = Math.floor(r / br), kj = Math.floor(c / bc); return qi < i || (qi === i && kj <= j); });
      for (var a = 1; a < nq; a++) heat.rect(-0.5, a * br - 0.5, n - 0.5, a * br - 0.5, {stroke: "currentColor", width: 0.6});
      for (var b = 1; b < nk; b++) heat.rect(b * bc - 0.5, -0.5, b * bc - 0.5, n - 0.5, {stroke: "currentColor", width: 0.6});
      heat.rect(j * bc - 0.5, i * br - 0.5, (j + 1) * bc - 0.5, (i + 1) * br - 0.5, {stroke: "currentColor", width: 3});
      [[bm, 0, C.blue], [bl, 1, C.green]].forEach(function (p) {
        p[0].begin({});
        for (var r = 0; r < n; r++) {
          var s = state(r), active = Math.floor(r / br) === i;
          if (s) p[0].rect(0, r - 0.4, s[p[1]], r + 0.4, {fill: p[2], opacity: active ? 1 : 0.4});
          p[0].dot(tr[r][nk - 1][p[1]], r, {color: "currentColor", fill: "none", r: 3, width: 1});
        }
      });
      var rows = [], html = ["<table><caption>Rows of query tile " + (i + 1) + " after key tile " + (j + 1) +
        " (rescale = e<sup>m before \u2212 m after</sup>)</caption><thead><tr><th scope=\"col\">row</th>" +
        "<th scope=\"col\">m before</th><th scope=\"col\">m after</th><th scope=\"col\">rescale</th>" +
        "<th scope=\"col\">\u2113 before</th><th scope=\"col\">\u2113 after</th></tr></thead><tbody>"];
      for (var r = i * br; r < (i + 1) * br; r++) {
        var before = j ? tr[r][j - 1] : null, after = tr[r][j];
        rows.push([r, after[0], after[1]]);
        html.push("<tr data-row=\"" + r + "\" data-m=\"" + after[0] + "\" data-l=\"" + after[1] + "\"><th scope=\"row\">" + r +
                  "</th><td>" + (before ? fixed(before[0], 3) : MINUS + "\u221e") + "</td><td>" + fixed(after[0], 3) +
                  "</td><td>" + fixed(after[2], 3) + "</td><td>" + (before ? fixed(before[1], 3) : "0") + "</td><td>" +
                  fixed(after[1], 3) + "</td></tr>");
      }
      table.innerHTML = html.join("") + "</tbody></table>";
      var first = tr[i * br][j];
      return {
        text: "Step " + (t + 1) + " of " + nq * nk + ": query tile " + (i + 1) + " of " + nq + " (rows " + i * br + "\u2013" +
              ((i + 1) * br - 1) + ") against key tile " + (j + 1) + " of " + nk + " (keys " + j * bc + "\u2013" +
              ((j + 1) * bc - 1) + "). Row " + i * br + " now has m = " + fixed(first[0], 3) + " and \u2113 = " +
              fixed(first[1], 3) + " (rescaled by " + fixed(first[2], 3) + ").",
        data: {step: t + 1, steps: nq * nk, qtile: i, ktile: j, rows: JSON.stringify(rows)}
      };
    };
  };

  VIEWS.norm = function (box, d, ctl) {
    var D = d.depths, all = [], lastPost = [], lastPre = [];
    D.forEach(function (L, k) { all = all.concat(d.post[k], d.pre[k]); lastPost.push(d.post[k][L - 1]); lastPre.push(d.pre[k][L - 1]); });
    var gmax = Math.max.apply(null, all), gmin = Math.min.apply(null, all);
    var legend = [["post-norm", C.vermillion], ["pre-norm", C.blue, "6 4"]];
    var per = new Panel(box, {title: "gradient norm per layer", legend: legend, xlabel: "layer (1 = next to the input)",
                              ylabel: "\u2016\u2207W\u2082\u2016", ylim: [0, gmax * 1.05]});
    var last = new Panel(box, {title: "last layer vs depth", legend: legend, xlabel: "number of layers L", ylabel: "\u2016\u2207W\u2082\u2016 of layer L",
                               xlim: [D[0], D[D.length - 1]], ylim: [gmin * 0.9, gmax * 1.1], xlog: true, ylog: true,
                               xticks: [1, 2, 4, 8, 16, 24].filter(function (x) { return x >= D[0] && x <= D[D.length - 1]; }),
                               yticks: niceTicks(gmin, gmax, 4).filter(function (y) { return y > 0; })});
    var prevL = null;
    return function () {
      var L = ctl.get("L"), k = D.indexOf(L);
      if (prevL !== L) { ctl.setValues("layer", range(1, L), L); prevL = L; }
      var layer = ctl.get("layer"), post = d.post[k], pre = d.pre[k], xs = range(1, L);
      per.begin({xlim: [0.5, Math.max(L, 2) + 0.5], xticks: niceTicks(1, Math.max(L, 2), 6).filter(Number.isInteger)});
      per.rect(layer - 0.5, 0, layer + 0.5, gmax * 1.05, {fill: "currentColor", opacity: 0.08});
      per.line(xs, post, {color: C.vermillion, width: 2});
      per.line(xs, pre, {color: C.blue, width: 2, dash: "6 4"});
      xs.forEach(function (x) { per.dot(x, post[x - 1], {color: C.vermillion, r: 2.5}); per.dot(x, pre[x - 1], {color: C.blue, r: 2.5}); });
      last.begin({});
      last.line(D, lastPost, {color: C.vermillion, width: 2});
      last.line(D, lastPre, {color: C.blue, width: 2, dash: "6 4"});
      last.dot(L, post[L - 1], {color: C.vermillion, r: 5});
      last.dot(L, pre[L - 1], {color: C.blue, r: 5});
      return {
        text: L + (L === 1 ? " layer" : " layers") + ". Layer " + layer + ": \u2016\u2207W\u2082\u2016 = " + fixed(post[layer - 1], 4) +
              " post-norm, " + fixed(pre[layer - 1], 4) + " pre-norm (post/pre = " + fixed(post[layer - 1] / pre[layer - 1], 2) +
              "). Last layer: " + fixed(post[L - 1], 4) + " post-norm, " + fixed(pre[L - 1], 4) + " pre-norm.",
        data: {depth: L, layer: layer, post: post[layer - 1], pre: pre[layer - 1], lastPost: post[L - 1], lastPre: pre[L - 1]}
      };
    };
  };

  VIEWS.training = function (box, d, ctl) {
    var steps = d.loss.length;
    var loss = new Panel(box, {title: "loss so far", xlabel: "training step", ylabel: "cross-entropy (nats)",
                               xlim: [0, steps], ylim: [0, Math.max.apply(null, d.loss) * 1.05]});
    var scatter = new Panel(box, {title: "P(more ones), every input", xlabel: "number of ones", ylabel: "P(more ones)",
                                  xlim: [-0.5, 6.5], ylim: [-0.05, 1.05], xticks: range(0, 6), yticks: [0, 0.25, 0.5, 0.75, 1]});
    return function () {
      var s = ctl.get("step");
      loss.begin({});
      loss.line(range(1, s), d.loss.slice(0, s), {color: C.blue, width: 2});
      loss.dot(s, d.loss[s - 1], {color: C.blue, r: 4});
      scatter.begin({});
      scatter.line([-0.5, 6.5], [0.5, 0.5], {color: "currentColor", width: 1, dash: "2 3"});
      d.p_more[s - 1].forEach(function (p, i) {
        scatter.dot(d.n_ones[i] + d.jitter[i], p, {color: d.label[i] ? C.green : C.vermillion, r: 3.5});
      });
      return {
        text: "After step " + s + " of " + steps + ": loss " + fixed(d.loss[s - 1], 3) + " nats, " + d.correct[s - 1] +
              " of 64 inputs right (accuracy " + fixed(100 * d.accuracy[s - 1], 1) + " %, measured on all 64 possible inputs, " +
              "the same inputs the training batches are drawn from).",
        data: {step: s, loss: d.loss[s - 1], accuracy: d.accuracy[s - 1], correct: d.correct[s - 1]}
      };
    };
  };


  /* ---- the labs that compute in the browser (lab-formulas.js) ---- */
  var F = window.TRLabFormulas;
  function bytesText(b) {                        // 70272 -> "68.6 KiB", decimal GB above 1e9 as the chapter
    if (b >= 1e9) return (b / 1e9).toFixed(2) + " GB";
    if (b >= 1048576) return (b / 1048576).toFixed(1) + " MiB";
    if (b >= 1024) return (b / 1024).toFixed(1) + " KiB";
    return String(b) + " bytes";
  }
  function grouped(n) { return Math.round(n).toString().replace(/\B(?=(\d{3})+(?!\d))/g, ","); }

  VIEWS.kv = function (box, d, ctl) {
    var names = ["attention", "layers", "kvHeads", "headDim", "kvLoraRank", "ropeHeadDim"];
    var plot = new Panel(box, {title: "cache vs context length", xlabel: "context length (tokens)", ylabel: "cache (GB)",
                               xlim: [1024, 131072], ylim: [0.01, 1000], xlog: true, ylog: true,
                               xticks: [1024, 4096, 16384, 65536], yticks: [0.01, 0.1, 1, 10, 100, 1000],
                               legend: [["this configuration", C.blue], ["80 GB", "currentColor", "6 4"]]});
    function config() {
      var c = {};
      names.concat(["seqLen", "batch", "bits", "scales"]).forEach(function (n) { c[n] = ctl.get(n); });
      return c;
    }
    var draw = function () {
      var c = config(), r = F.kvCache(c), mla = c.attention === "mla";
      ["kvHeads", "headDim"].forEach(function (n) { ctl.control(n).disabled = mla; });
      ["kvLoraRank", "ropeHeadDim"].forEach(function (n) { ctl.control(n).disabled = !mla; });
      ctl.control("scales").disabled = c.bits === 16;
      var xs = [], ys = [];
      for (var e = 10; e <= 17; e += 0.25) { var n = Math.pow(2, e); xs.push(n); ys.push(F.kvCache(Object.assign({}, c, {seqLen: n})).bytes / 1e9); }
      plot.begin({});
      plot.line([1024, 131072], [80, 80], {color: "currentColor", width: 1, dash: "6 4"});
      plot.line(xs, ys.map(function (y) { return Math.min(Math.max(y, 0.01), 1000); }), {color: C.blue, width: 2});
      if (c.seqLen >= 1024 && c.seqLen <= 131072 && r.bytes / 1e9 >= 0.01 && r.bytes / 1e9 <= 1000)
        plot.dot(c.seqLen, r.bytes / 1e9, {color: C.vermillion, r: 5});
      var perToken = F.kvCache(Object.assign({}, c, {seqLen: 1, batch: 1})).dataBytes;
      return {
        text: (mla ? "MLA: " + c.layers + " layers \u00d7 (" + c.kvLoraRank + " + " + c.ropeHeadDim + ") numbers"
                   : c.layers + " layers \u00d7 2 \u00d7 " + c.kvHeads + " KV heads \u00d7 " + c.headDim + " numbers") +
              " = " + grouped(r.numbers / c.seqLen / c.batch) + " numbers per token, " + grouped(perToken) + " bytes at " + c.bits +
              " bits. " + grouped(c.seqLen) + " tokens \u00d7 " + c.batch + (c.batch === 1 ? " sequence" : " sequences") + ": " +
              grouped(r.bytes) + " bytes (" + bytesText(r.bytes) + ")" +
              (r.scales ? ", of which " + grouped(r.scaleBytes) + " bytes are " + grouped(r.scales) + " fp16 scales" : "") + ".",
        data: {bytes: r.bytes, dataBytes: r.dataBytes, scaleBytes: r.scaleBytes, numbers: r.numbers, perToken: perToken}
      };
    };
    draw.changed = function (name) {              // a preset fills in its configuration
      if (name !== "preset" || !d.presets[ctl.get("preset")]) return;
      var p = d.presets[ctl.get("preset")];
      names.forEach(function (n) { if (p[n] !== undefined) ctl.set(n, p[n]); });
    };
    draw.changed("preset");
    return draw;
  };

  VIEWS.mask = function (box, d, ctl) {
    var heat = new Panel(box, {title: "who may attend to whom", xlabel: "key j", ylabel: "query i", xlim: [0, 1], ylim: [1, 0], aspect: 1,
                               legend: [["may attend", C.blue], ["masked", "#d9d9d9"]]});
    var draw = function () {
      var kind = ctl.get("kind"), T = ctl.get("T"), S = kind === "prefix" ? T : ctl.get("S");
      ctl.control("S").disabled = kind === "prefix";
      ctl.control("window").disabled = kind !== "sliding";
      ctl.control("prefix").disabled = kind !== "prefix";
      ctl.control("length").disabled = kind !== "padding";
      var c = {kind: kind, T: T, S: S, window: ctl.get("window"), prefix: Math.min(ctl.get("prefix"), T), length: Math.min(ctl.get("length"), S)};
      var m = F.mask(c), allowed = 0, empty = 0, bits = [];
      heat.begin({xlim: [-0.5, S - 0.5], ylim: [T - 0.5, -0.5],
                  xticks: niceTicks(0, Math.max(S - 1, 1), 5).filter(Number.isInteger), yticks: niceTicks(0, Math.max(T - 1, 1), 5).filter(Number.isInteger)});
      m.forEach(function (row, i) {
        var any = false;
        row.forEach(function (ok, j) {
          heat.rect(j - 0.5, i - 0.5, j + 0.5, i + 0.5, {fill: ok ? C.blue : "#d9d9d9", stroke: "#ffffff", width: S > 24 ? 0 : 1});
          if (ok) { allowed++; any = true; }
        });
        if (!any) empty++;
        bits.push(row.map(function (ok) { return ok ? "1" : "0"; }).join(""));
      });
      var what = {causal: "causal, aligned bottom-right", sliding: "causal sliding window of " + c.window,
                  prefix: "prefix-LM with a prefix of " + c.prefix, padding: "causal with " + c.length + " real keys and " + (S - c.length) + " padding"}[kind];
      return {
        text: T + " queries, " + S + " keys, " + what + ": " + allowed + " of " + T * S + " pairs may attend" +
              (empty ? "; " + empty + (empty === 1 ? " row sees" : " rows see") + " no key (its output is zeros)" : "") + ".",
        data: {kind: kind, T: T, S: S, allowed: allowed, empty: empty, bits: bits.join("/")}
      };
    };
    return draw;
  };

  VIEWS.flow = function (box, d, ctl) {
    var n = d.src.length, scale = 1 / Math.sqrt(d.enc.q[0].length);
    var flow = new Panel(box, {title: "who reads whom", xlim: [-0.8, n - 0.2], ylim: [-0.6, 2.2], aspect: 0.6, axes: false});
    var bars = new Panel(box, {title: "attention weights of the query", xlabel: "key", ylabel: "weight", xlim: [-0.6, n - 0.4], ylim: [0, 1.05],
                               xticks: range(0, n - 1), aspect: 0.6});
    return function () {
      var src = ctl.get("srcLen"), tgt = ctl.get("tgtLen"), sub = ctl.get("sublayer");
      ctl.setValues("query", range(0, (sub === "encoder" ? src : tgt) - 1));
      var t = ctl.get("query"), w, allowed = [], K, q;
      if (sub === "encoder") { q = d.enc.q[t]; K = d.enc.k; for (var j = 0; j < n; j++) allowed.push(j < src); }
      else if (sub === "decoder") { q = d.dec.q[t]; K = d.dec.k; for (var j2 = 0; j2 < n; j2++) allowed.push(j2 <= t && j2 < tgt); }
      else { q = d.cross.q[t]; K = d.cross.k; for (var j3 = 0; j3 < n; j3++) allowed.push(j3 < src); }
      w = F.attend(q, K, allowed, scale);
      var keyRow = sub === "decoder" ? 2 : 0, queryRow = sub === "encoder" ? 0 : 2;
      flow.begin({});
      [[0, "encoder", src], [2, "decoder", tgt]].forEach(function (r) {
        flow.label(-0.75, r[0], r[1], {anchor: "start", dy: -14});
        for (var i = 0; i < n; i++) {
          var real = i < r[2];
          flow.rect(i - 0.3, r[0] - 0.22, i + 0.3, r[0] + 0.22, {fill: real ? (r[0] ? C.orange : C.sky) : "none",
                                                                  stroke: "currentColor", width: real ? 1 : 0.5, opacity: real ? 1 : 0.5});
          flow.label(i, r[0], real ? String(i) : "pad", {anchor: "middle", dy: 4});
        }
      });
      w.forEach(function (wj, j) {
        if (!allowed[j]) return;
        var x0 = flow.x(j), y0 = flow.y(keyRow + (keyRow === queryRow ? 0.22 : keyRow ? -0.22 : 0.22));
        var x1 = flow.x(t), y1 = flow.y(queryRow + (queryRow ? -0.22 : 0.22));
        var path = keyRow === queryRow ? "M" + x0 + "," + y0 + " Q" + (x0 + x1) / 2 + "," + (y0 - 60 * (keyRow ? -1 : 1)) + " " + x1 + "," + y1
                                       : "M" + x0 + "," + y0 + " L" + x1 + "," + y1;
        el("path", {d: path, fill: "none", stroke: C.vermillion, "stroke-width": 1 + 6 * wj, "stroke-opacity": 0.25 + 0.75 * wj}, flow.plot);
      });
      flow.rect(t - 0.36, queryRow - 0.28, t + 0.36, queryRow + 0.28, {stroke: C.vermillion, width: 3});
      bars.begin({});
      w.forEach(function (wj, j) { if (allowed[j]) bars.rect(j - 0.35, 0, j + 0.35, wj, {fill: C.vermillion}); });
      var seen = allowed.filter(Boolean).length;
      var names = {encoder: "Encoder self-attention: source token " + t + " of " + src + " reads all " + src + " real source tokens",
                   decoder: "Decoder self-attention: target token " + t + " of " + tgt + " reads target tokens 0\u2013" + t + " (causal)",
                   cross: "Cross-attention: target token " + t + " of " + tgt + " reads all " + src + " real source tokens (the encoder's output)"};
      return {
        text: names[sub] + "; " + (src < n && sub !== "decoder" ? (n - src) + " padding keys get weight 0. " : "") +
              "Largest weight " + fixed(Math.max.apply(null, w), 3) + " on key " + w.indexOf(Math.max.apply(null, w)) + ".",
        data: {sublayer: sub, query: t, keys: seen, weights: JSON.stringify(w)}
      };
    };
  };

  /* ---- wiring: controls, readout, redraw on input and on resize ---- */
  function setup(root) {
    var view = VIEWS[root.dataset.lab];
    if (!view || root.dataset.ready) return;
    root.dataset.ready = "1";
    var data = JSON.parse(root.querySelector("script.tr-lab-data").textContent);
    var inputs = {}, typed = {};
    root.querySelectorAll("input[type=range]").forEach(function (input) { inputs[input.name] = input; });
    root.querySelectorAll("input[type=number], select").forEach(function (input) { typed[input.name] = input; });
    function values(input) { return JSON.parse(input.dataset.values); }
    function typedValue(input) {            // a number box gives an integer within its bounds, a drop-down its value
      if (input.tagName === "SELECT") return /^-?\d+$/.test(input.value) ? Number(input.value) : input.value;
      var v = Math.round(Number(input.value));
      if (!isFinite(v)) v = Number(input.min);
      return Math.min(Number(input.max), Math.max(Number(input.min), v));
    }
    function sync(input) {
      var v = values(input)[Number(input.value)];
      input.setAttribute("aria-valuetext", String(v));
      document.getElementById(input.id + "-value").textContent = String(v);
    }
    var ctl = {
      get: function (name) { return typed[name] ? typedValue(typed[name]) : values(inputs[name])[Number(inputs[name].value)]; },
      set: function (name, value) { typed[name].value = String(value); },
      control: function (name) { return typed[name] || inputs[name]; },
      setValues: function (name, list, value) {   // new steps for a control, keeping its value where it can
        var input = inputs[name], current = value === undefined ? ctl.get(name) : value;
        var index = list.indexOf(current);
        input.dataset.values = JSON.stringify(list);
        input.max = String(list.length - 1);
        input.value = String(index >= 0 ? index : Math.min(Number(input.value), list.length - 1));
        sync(input);
      }
    };
    var panels = root.querySelector(".tr-lab-panels");
    var readout = root.querySelector(".tr-lab-readout");
    panels.textContent = "";
    var draw = view(panels, data, ctl, root), shownFor = draw.changed || null;
    function update() {
      Object.keys(inputs).forEach(function (name) { sync(inputs[name]); });
      var shown = draw();
      readout.textContent = shown.text;
      Object.keys(shown.data).forEach(function (key) { readout.dataset[key] = String(shown.data[key]); });
    }
    Object.keys(inputs).forEach(function (name) { inputs[name].addEventListener("input", update); });
    Object.keys(typed).forEach(function (name) {
      typed[name].addEventListener(typed[name].tagName === "SELECT" ? "change" : "input", function () {
        if (shownFor) shownFor(name);
        update();
      });
    });
    var width = panels.clientWidth;
    if (window.ResizeObserver) {
      new ResizeObserver(function () {
        if (panels.clientWidth !== width) { width = panels.clientWidth; draw(); }
      }).observe(panels);
    }
    update();
    root.classList.add("tr-lab-ready");
  }
  function setupAll() { document.querySelectorAll(".tr-lab").forEach(setup); }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", setupAll);
  else setupAll();
})();
