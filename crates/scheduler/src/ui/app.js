// gpuplace's live GPU map. Every name, model and message from the cluster is written with
// textContent or as an attribute value, never parsed as markup.
"use strict";

const POLL_MS = 500;
const state = { selected: null, query: "", sort: "name", busy: false };

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

function svg(tag, attrs) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  return e;
}

function gpus(milli) {
  const g = milli / 1000;
  return Number.isInteger(g) ? String(g) : g.toFixed(2).replace(/0+$/, "");
}

// A holder the viewer may not see (another namespace's pod) comes without its name.
function holderName(h) {
  return h.name ? h.namespace + "/" + h.name : "a pod of another namespace";
}

function gpuCell(use, tip, index) {
  const cell = el("span", { class: "gpu", "data-use": use, "data-gpu": String(index), title: tip });
  if (use >= "1" && use <= "9") {
    const fill = el("span", { class: "fill" });
    fill.style.height = (Number(use) * 10) + "%";
    cell.appendChild(fill);
  }
  return cell;
}

function renderTotals(t, matched, shown) {
  const fit = t.largest_fit;
  let largest = "nothing";
  if (fit.node && fit.whole_gpus > 0) largest = fit.whole_gpus + " GPUs (" + fit.node + ")";
  else if (fit.node && fit.share_milli > 0) largest = gpus(fit.share_milli) + " of a GPU (" + fit.node + ")";
  document.getElementById("totals").textContent =
    t.nodes + " nodes · " + t.gpus + " GPUs · allocated " + gpus(t.allocated_milli) + " / " +
    gpus(t.capacity_milli) + " (" + t.allocation_pct.toFixed(1) + "%) · " + t.free_gpus +
    " free · fragmentation " + t.fragmentation_gpus.toFixed(2) + " GPUs (" +
    t.fragmentation_pct.toFixed(1) + "% of idle) · largest fit: " + largest + " · " +
    t.pending_pods + " pending";
  document.getElementById("shown").textContent =
    shown < matched ? "showing " + shown + " of " + matched + " nodes: search to narrow" :
    matched + " nodes";
}

function renderModels(models) {
  const box = document.getElementById("models");
  box.replaceChildren();
  for (const m of models) {
    const card = el("div", { class: "model" });
    card.appendChild(el("div", {}, m.model + ": " + m.nodes + " nodes, " + m.gpus + " GPUs, " + m.free + " free"));
    const bar = el("div", { class: "bar" });
    const used = el("span");
    used.style.width = (m.capacity_milli ? 100 * m.allocated_milli / m.capacity_milli : 0) + "%";
    bar.appendChild(used);
    card.appendChild(bar);
    box.appendChild(card);
  }
}

function renderNodes(nodes) {
  const box = document.getElementById("nodes");
  box.replaceChildren();
  for (const n of nodes) {
    const card = el("div", { class: "card", "data-node": n.name, tabindex: "0" });
    if (n.name === state.selected) card.classList.add("selected");
    card.appendChild(el("div", { class: "name", title: n.name }, n.name));
    card.appendChild(el("div", { class: "sub" }, n.model + " · " + n.free + " free"));
    const row = el("div", { class: "cells" });
    [...n.cells].forEach((c, i) => row.appendChild(gpuCell(c, n.tips[i] || "", i)));
    card.appendChild(row);
    card.addEventListener("click", () => select(n.name));
    card.addEventListener("keydown", (e) => { if (e.key === "Enter") select(n.name); });
    box.appendChild(card);
  }
}

function chart(id, points, field) {
  const box = document.getElementById(id);
  box.replaceChildren();
  for (const y of [0, 50, 100]) box.appendChild(svg("line", { class: "axis", x1: 0, x2: 360, y1: 100 - y, y2: 100 - y }));
  if (points.length === 0) return;
  const end = points[points.length - 1].t;
  const coords = points.map((p) => (360 - (end - p.t) / 10) + "," + (100 - Math.min(100, p[field])));
  box.appendChild(svg("polyline", { class: "line", points: coords.join(" ") }));
  const last = points[points.length - 1][field];
  const label = svg("text", { x: 4, y: 12, "font-size": 11 });
  label.textContent = last.toFixed(1) + "%";
  box.appendChild(label);
}

function row(cells) {
  const tr = el("tr");
  for (const c of cells) tr.appendChild(el("td", {}, c));
  return tr;
}

function renderPending(pending, total) {
  document.getElementById("pending-count").textContent = "(" + total + ")";
  const body = document.querySelector("#pending tbody");
  body.replaceChildren();
  for (const p of pending) {
    const tr = row([p.namespace + "/" + p.name, p.gpus, p.since || "", p.reason || "(no reason recorded yet)"]);
    tr.setAttribute("data-pod", p.namespace + "/" + p.name);
    body.appendChild(tr);
  }
}

function renderGroups(groups) {
  const body = document.querySelector("#groups tbody");
  body.replaceChildren();
  for (const g of groups) {
    body.appendChild(row([g.namespace + "/" + g.name, g.min_member, g.phase || "-", g.scheduled, g.message || ""]));
  }
}

function renderDetail(node) {
  const aside = document.getElementById("detail");
  aside.hidden = false;
  document.getElementById("detail-name").textContent = node.name;
  document.getElementById("detail-model").textContent =
    node.model + " · " + node.gpus.length + " GPUs · fragmentation " + node.fragmentation_gpus.toFixed(2) +
    " GPUs" + (node.nvlink_groups.length ? " · NVLink groups " + node.nvlink_groups.map((g) => "[" + g.join(",") + "]").join(" ") : "");
  const topo = document.getElementById("topology");
  topo.replaceChildren();
  const count = node.gpus.length;
  const pos = new Map();
  node.gpus.forEach((g, i) => {
    const a = (2 * Math.PI * i) / Math.max(1, count) - Math.PI / 2;
    pos.set(g.index, { x: 120 + 90 * Math.cos(a), y: 120 + 90 * Math.sin(a) });
  });
  for (const l of node.links) {
    const a = pos.get(l.a), b = pos.get(l.b);
    if (!a || !b) continue;
    const line = svg("line", { class: "link", x1: a.x, y1: a.y, x2: b.x, y2: b.y, "stroke-width": Math.min(6, l.nvlinks) });
    const t = svg("title");
    t.textContent = "GPU " + l.a + " - GPU " + l.b + ": " + l.nvlinks + " NVLink(s)";
    line.appendChild(t);
    topo.appendChild(line);
  }
  const colours = { "#": "#d6543e", ".": "#dff3e2", "x": "#7b3fa0" };
  for (const g of node.gpus) {
    const p = pos.get(g.index);
    const use = !g.healthy ? "x" : g.used_milli === 0 ? "." : g.used_milli >= g.capacity_milli ? "#" : "s";
    const c = svg("circle", { cx: p.x, cy: p.y, r: 16, fill: colours[use] || "#e0a526", stroke: "#556", "data-gpu": g.index });
    const t = svg("title");
    t.textContent = "GPU " + g.index + ": " + (g.holders.map(holderName).join(", ") || "free");
    c.appendChild(t);
    topo.appendChild(c);
    const label = svg("text", { x: p.x, y: p.y });
    label.textContent = String(g.index);
    topo.appendChild(label);
  }
  const body = document.querySelector("#detail-gpus tbody");
  body.replaceChildren();
  for (const g of node.gpus) {
    const holders = g.holders.map((h) => holderName(h) + " (" + gpus(h.milli) + " GPU, since " + (h.since || "?") + ")");
    const use = !g.healthy ? "unhealthy" : gpus(g.used_milli) + " / " + gpus(g.capacity_milli);
    const tr = row(["GPU " + g.index + " (" + g.id + ")", g.model + ", " + g.memory_mib + " MiB", use, holders.join("; ") || "free"]);
    tr.setAttribute("data-gpu", String(g.index));
    body.appendChild(tr);
  }
}

// Who is signed in, and whose pods the page names (absent when served without sign-in).
function renderViewer(v) {
  const out = document.getElementById("signout");
  if (!v) { out.hidden = true; return; }
  out.hidden = false;
  const seen = v.namespaces === null ? "pods of every namespace" :
    v.namespaces.length === 0 ? "no namespace's pods" : "pods of " + v.namespaces.join(", ");
  document.getElementById("viewer").textContent = v.user + " (" + seen + ")";
}

async function refreshDetail() {
  if (!state.selected) return;
  const r = await fetch("/ui/api/node?name=" + encodeURIComponent(state.selected));
  if (r.ok) renderDetail(await r.json());
  else document.getElementById("detail").hidden = true;
}

function select(name) {
  state.selected = name;
  history.replaceState(null, "", "#node=" + encodeURIComponent(name));
  for (const c of document.querySelectorAll(".card")) c.classList.toggle("selected", c.getAttribute("data-node") === name);
  refreshDetail().catch(showError);
}

function showError(e) {
  document.getElementById("error").textContent = "cannot reach the scheduler: " + e;
}

async function poll() {
  if (state.busy) return;
  state.busy = true;
  try {
    const url = "/ui/api/fleet?q=" + encodeURIComponent(state.query) + "&sort=" + encodeURIComponent(state.sort);
    const r = await fetch(url);
    // Signed out (the cookie expired or the token was revoked): back to the sign-in form.
    if (r.status === 401) { location.reload(); return; }
    if (!r.ok) throw new Error(r.status + " " + (await r.text()));
    const f = await r.json();
    renderTotals(f.totals, f.matched, f.nodes.length);
    renderModels(f.models);
    renderNodes(f.nodes);
    renderPending(f.pending, f.pending_total);
    renderGroups(f.groups);
    renderViewer(f.viewer);
    chart("chart-alloc", f.history, "allocation_pct");
    chart("chart-frag", f.history, "fragmentation_pct");
    await refreshDetail();
    document.getElementById("error").textContent = "";
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
    document.body.setAttribute("data-polls", String(Number(document.body.getAttribute("data-polls") || 0) + 1));
  } catch (e) {
    showError(e);
  } finally {
    state.busy = false;
  }
}

document.getElementById("search").addEventListener("input", (e) => { state.query = e.target.value; poll(); });
document.getElementById("sort").addEventListener("change", (e) => { state.sort = e.target.value; poll(); });
if (location.hash.startsWith("#node=")) state.selected = decodeURIComponent(location.hash.slice(6));
poll();
setInterval(poll, POLL_MS);
