// The compare report's navigation: module tree, filters, and links between plot, boxes and table.
// Included by compare.html.j2 as a jinja template: no double braces, brace-percent or brace-hash here.
// Every name is read from an escaped data-* attribute and written with textContent, never as HTML.
(function () {
  "use strict";
  const VERDICTS = ["error", "undecided", "warning", "pass", "incomparable", "unmatched"];  // worst first
  const table = document.getElementById("rows");
  const rows = Array.from(table.tBodies[0].rows);
  const dots = Array.from(document.querySelectorAll("#plot .dot"));
  const treeBody = document.getElementById("tree-body");
  const count = document.getElementById("shown-count");
  const chip = document.getElementById("filter-module");
  const controls = {
    text: document.getElementById("filter-text"),
    verdict: document.getElementById("filter-verdict"),
    phase: document.getElementById("filter-phase"),
    rank: document.getElementById("filter-rank"),
  };
  const state = { text: "", verdict: "", phase: "", rank: "", module: null };
  const open = new Set();
  const texts = new Map();  // a row's lower-cased text, read once

  function inModule(module, path) {
    return path === null || module === path || module.startsWith(path + ".");
  }
  function inScope(tr) {  // the phase and rank selectors: they also scope the module tree
    return (!state.phase || tr.dataset.phase === state.phase) && (!state.rank || tr.dataset.rank === state.rank);
  }
  function rowText(tr) {
    if (!texts.has(tr)) texts.set(tr, tr.textContent.toLowerCase());
    return texts.get(tr);
  }
  function shows(tr) {
    return inScope(tr) && inModule(tr.dataset.module, state.module) &&
      (!state.verdict || tr.dataset.verdict === state.verdict) && (!state.text || rowText(tr).includes(state.text));
  }

  // -- the module tree: one node per dotted prefix of the rows' module paths -----------------------
  function buildTree() {
    const root = { children: new Map() };
    for (const tr of rows) {
      if (!inScope(tr)) continue;
      const error = tr.dataset.error === "" ? null : parseFloat(tr.dataset.error);
      let node = root, path = null;
      for (const part of tr.dataset.module.split(".")) {
        path = path === null ? part : path + "." + part;
        if (!node.children.has(part)) {
          node.children.set(part, { name: part, path: path, children: new Map(), counts: {}, worst: null, worstVerdict: "pass" });
        }
        node = node.children.get(part);
        node.counts[tr.dataset.verdict] = (node.counts[tr.dataset.verdict] || 0) + 1;
        if (error !== null && !isNaN(error) && (node.worst === null || error > node.worst)) node.worst = error;
      }
    }
    return root;
  }
  function nodeLine(node) {
    const line = document.createElement("span");
    line.className = "node-line";
    const button = document.createElement("button");
    button.type = "button";
    button.className = "module" + (state.module === node.path ? " selected" : "");
    button.dataset.module = node.path;
    button.title = "show the rows of " + node.path;
    button.textContent = node.name;
    line.append(button);
    let worstVerdict = "";
    for (const verdict of VERDICTS) {
      const n = node.counts[verdict];
      if (!n) continue;
      worstVerdict = worstVerdict || verdict;
      const badge = document.createElement("span");
      badge.className = "count v-" + verdict;
      badge.title = n + " " + verdict;
      badge.textContent = n;
      line.append(badge);
    }
    const worst = document.createElement("span");
    worst.className = "worst v-" + worstVerdict;
    worst.title = "largest error in this module";
    worst.textContent = node.worst === null ? "" : node.worst > 0 && node.worst < 1e-3 ? node.worst.toExponential(2) : node.worst.toPrecision(3);
    line.append(worst);
    return line;
  }
  function nodeElement(node) {
    if (!node.children.size) {
      const leaf = document.createElement("div");
      leaf.className = "leaf";
      leaf.append(nodeLine(node));
      return leaf;
    }
    const details = document.createElement("details");
    details.open = open.has(node.path);
    details.addEventListener("toggle", function () {
      if (details.open) open.add(node.path); else open.delete(node.path);
    });
    const summary = document.createElement("summary");
    summary.append(nodeLine(node));
    details.append(summary, ...Array.from(node.children.values(), nodeElement));
    return details;
  }
  function renderTree() {
    treeBody.replaceChildren(...Array.from(buildTree().children.values(), nodeElement));
  }

  // -- filters: table rows, plot dots and the tree follow one state ------------------------------
  function apply() {
    const visible = new Set();
    for (const tr of rows) {
      const show = shows(tr);
      tr.hidden = !show;
      if (show) visible.add(tr.id.slice(4));
    }
    for (const dot of dots) dot.classList.toggle("off", !visible.has(dot.dataset.row));
    count.textContent = visible.size + " of " + rows.length + " rows";
    chip.hidden = state.module === null;
    chip.querySelector("code").textContent = state.module === null ? "" : state.module;
    renderTree();
  }
  function selectModule(path) {
    state.module = path;
    for (let prefix = path; prefix && prefix.includes("."); prefix = prefix.slice(0, prefix.lastIndexOf("."))) {
      open.add(prefix.slice(0, prefix.lastIndexOf(".")));
    }
    apply();
  }
  function clearFilters() {
    state.text = state.verdict = state.phase = state.rank = "";
    state.module = null;
    for (const control of Object.values(controls)) control.value = "";
  }
  function goToRow(id) {
    const tr = document.getElementById(id);
    if (!tr) return;
    if (tr.hidden) { clearFilters(); apply(); }
    for (const old of table.querySelectorAll("tr.target")) old.classList.remove("target");
    tr.classList.add("target");
    tr.scrollIntoView({ block: "center" });
    history.replaceState(null, "", "#" + id);
  }

  let typing = null;
  controls.text.addEventListener("input", function () {
    clearTimeout(typing);
    typing = setTimeout(function () { state.text = controls.text.value.toLowerCase(); apply(); }, 150);
  });
  for (const name of ["verdict", "phase", "rank"]) {
    controls[name].addEventListener("change", function () { state[name] = controls[name].value; apply(); });
  }
  treeBody.addEventListener("click", function (event) {
    const button = event.target.closest("button.module");
    if (!button) return;
    event.preventDefault();  // a click on the name filters; the triangle opens and closes
    selectModule(state.module === button.dataset.module ? null : button.dataset.module);
  });
  document.getElementById("tree-all").addEventListener("click", function () { selectModule(null); });
  chip.querySelector("button").addEventListener("click", function () { selectModule(null); });
  document.addEventListener("click", function (event) {
    const link = event.target.closest("a[href^='#row-']");
    const dot = event.target.closest("#plot .dot");
    const moduleLink = event.target.closest("button.module-link");
    if (link) {
      event.preventDefault();
      goToRow(link.getAttribute("href").slice(1));
    } else if (dot) {
      goToRow("row-" + dot.dataset.row);
    } else if (moduleLink) {
      selectModule(moduleLink.dataset.module);
      document.getElementById("tree").scrollIntoView({ block: "start" });
    }
  });

  for (const node of buildTree().children.values()) open.add(node.path);  // top level open
  const firstModule = document.getElementById("tree").dataset.open;
  if (firstModule) {  // and the path down to the first divergence
    const parts = firstModule.split(".");
    for (let i = 1; i < parts.length; i++) open.add(parts.slice(0, i).join("."));
  }
  apply();
  if (location.hash.startsWith("#row-")) goToRow(location.hash.slice(1));
})();
