// streamtopics topic explorer: renders /v1/topics (embedded at load, then polled). No dependencies.
"use strict";
(function () {
  const REFRESH_MS = 3000;
  const SVG = "http://www.w3.org/2000/svg";

  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function fmt(x, digits) {
    return x === null || x === undefined || Number.isNaN(x) ? "–" : Number(x).toFixed(digits);
  }

  function sparkline(values, w, h, label) {
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
    svg.setAttribute("preserveAspectRatio", "none");
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", label);
    const pts = (values || []).filter((v) => v !== null);
    if (pts.length < 2) return svg;
    const lo = Math.min(...pts), hi = Math.max(...pts), span = hi - lo || 1;
    const d = pts.map((v, i) => `${(i * w / (pts.length - 1)).toFixed(1)},${(h - 2 - (v - lo) / span * (h - 4)).toFixed(1)}`);
    const line = document.createElementNS(SVG, "polyline");
    line.setAttribute("points", d.join(" "));
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", "#2f6fde");
    line.setAttribute("stroke-width", "1.5");
    line.setAttribute("vector-effect", "non-scaling-stroke");
    svg.appendChild(line);
    return svg;
  }

  function card(t) {
    const c = el("section", { class: "card", "data-topic": t.topic });
    const h = el("h2");
    h.appendChild(el("span", {}, `topic ${t.topic}`));
    const npmiClass = t.npmi === null ? "" : t.npmi >= 0 ? "good" : "bad";
    const meta = el("span", { class: "muted" });
    meta.appendChild(el("span", {}, `${fmt(t.prevalence === null ? null : 100 * t.prevalence, 1)}% · NPMI `));
    meta.appendChild(el("span", { class: `npmi ${npmiClass}` }, fmt(t.npmi, 3)));
    h.appendChild(meta);
    c.appendChild(h);
    const ol = el("ol", { class: "words" });
    (t.top_words || []).forEach((w, i) => ol.appendChild(el("li", { title: `weight ${fmt(t.weights[i], 4)}` }, w)));
    c.appendChild(ol);
    c.appendChild(sparkline(t.prevalence_series, 200, 36, `prevalence of topic ${t.topic}`));
    const ex = el("ul", { class: "examples" });
    for (const e of t.examples || []) {
      ex.appendChild(el("li", {}, `#${e.id} (θ ${fmt(e.theta, 2)}): ${e.text}`));
    }
    c.appendChild(ex);
    return c;
  }

  function render(v) {
    if (!v) return;
    document.getElementById("status").textContent = v.status === "ok" ? "" : v.status;
    document.getElementById("version").textContent = v.model_version ?? "–";
    document.getElementById("docs").textContent = v.docs_seen ?? "–";
    document.getElementById("rate").textContent = fmt(v.docs_per_s, 0);
    const q = v.quality || {};
    document.getElementById("npmi").textContent = fmt(q.mean_npmi, 3);
    document.getElementById("diversity").textContent = fmt(q.diversity, 3);
    document.getElementById("window").textContent = q.window_documents ? `(window ${q.window_documents} docs)` : "";
    const tr = document.getElementById("trends");
    tr.replaceChildren();
    for (const [name, items] of [["rising", v.rising], ["fading", v.fading]]) {
      if (!items || !items.length) continue;
      tr.appendChild(el("span", { class: "muted" }, `${name}: `));
      for (const [k, ch] of items) {
        const words = ((v.topics[k] || {}).top_words || []).slice(0, 3).join(" ");
        tr.appendChild(el("span", { class: `t ${name}` }, `${k} ${words} (${ch > 0 ? "+" : ""}${fmt(100 * ch, 2)}%)`));
      }
    }
    const pq = document.getElementById("prequential");
    if (v.supervised && v.prequential_curve && v.prequential_curve.length) {
      pq.hidden = false;
      pq.replaceChildren(el("span", { class: "muted" }, `prequential accuracy ${fmt(v.prequential_accuracy, 3)}`));
      pq.appendChild(sparkline(v.prequential_curve.map((p) => p[1]), 600, 40, "prequential accuracy"));
    } else {
      pq.hidden = true;
    }
    const cards = document.getElementById("cards");
    cards.replaceChildren(...(v.topics || []).map(card));
  }

  async function refresh() {
    try {
      const r = await fetch("/v1/topics", { cache: "no-store" });
      if (r.ok) render(await r.json());
    } catch (e) {
      document.getElementById("status").textContent = "daemon unreachable";
    }
  }

  try {
    render(JSON.parse(document.getElementById("initial-view").textContent));
  } catch (e) { /* no embedded view: wait for the first poll */ }
  setInterval(refresh, REFRESH_MS);
})();
