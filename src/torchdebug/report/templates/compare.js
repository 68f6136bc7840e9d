// The compare report's rows and navigation: the packed rows and dots unpacked (report/packed.py), the
// plot's dots, the module tree, filters, a paged sortable table, and links between plot, boxes and table.
// Filters, search, sorting and the tree work on the unpacked columns; only the page in view is markup.
// Included by compare.html.j2 as a jinja template: no double braces, brace-percent or brace-hash here.
// Every name comes from the packed strings and is written with textContent, never as HTML.
(async function () {
  "use strict";
  const VERDICTS = ["error", "undecided", "warning", "pass", "incomparable", "unmatched"];  // worst first
  const TYPES = { u8: Uint8Array, u16: Uint16Array, u32: Uint32Array, i32: Int32Array, f64: Float64Array };
  const table = document.getElementById("rows");
  const PAGE = parseInt(table.dataset.pageRows, 10);  // table rows in view at once
  const body = table.tBodies[0];
  const tableWrap = table.parentElement;
  const treeBody = document.getElementById("tree-body");
  const count = document.getElementById("shown-count");
  const chip = document.getElementById("filter-module");
  const pager = document.querySelector(".pager");
  const controls = {
    text: document.getElementById("filter-text"),
    verdict: document.getElementById("filter-verdict"),
    phase: document.getElementById("filter-phase"),
    rank: document.getElementById("filter-rank"),
  };

  // -- the packed tables: gzip of [header length, JSON header, columns byte-plane by byte-plane] ------
  async function unpack(text) {
    const zipped = Uint8Array.fromBase64 ? Uint8Array.fromBase64(text) : Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
    const stream = new Blob([zipped]).stream().pipeThrough(new DecompressionStream("gzip"));
    const bytes = new Uint8Array(await new Response(stream).arrayBuffer());
    const size = new DataView(bytes.buffer).getUint32(0, true);
    const header = JSON.parse(new TextDecoder().decode(bytes.subarray(4, 4 + size)));
    let offset = 4 + size;
    const tables = {};
    for (const [name, spec] of Object.entries(header.tables)) {
      const columns = {};
      for (const [column, type] of spec.columns) {
        const values = new TYPES[type](spec.length);  // little-endian, as every browser's platform
        const width = values.BYTES_PER_ELEMENT;
        const out = new Uint8Array(values.buffer);
        for (let plane = 0; plane < width; plane++, offset += spec.length) {
          for (let i = 0; i < spec.length; i++) out[i * width + plane] = bytes[offset + i];
        }
        columns[column] = values;
      }
      const floats = spec.columns.filter((c) => c[1] === "f64").map((c) => c[0]);
      tables[name] = { length: spec.length, columns: columns, floats: floats };
    }
    return { strings: header.strings, tables: tables };
  }

  let packed;
  try {
    packed = await unpack(document.getElementById("packed").textContent);
  } catch (error) {
    document.getElementById("rows-state").textContent = "this browser cannot unpack the rows (" + error + ")";
    table.dataset.state = "failed";
    return;
  }
  const strings = packed.strings;
  const columns = packed.tables.rows.columns;
  const n = packed.tables.rows.length;
  const floats = packed.tables.rows.floats;  // in the order of the bits of "absent"
  const manyRanks = controls.rank.options.length > 2;
  function text(column, i) { return strings[columns[column][i]]; }
  function number(column, i) {  // null: no value (an empty cell); NaN shows as nan
    return (columns.absent[i] >> floats.indexOf(column)) & 1 ? null : columns[column][i];
  }
  function num(value, digits) {  // Python's "%.{digits}g", as the report's other numbers
    if (value === null) return "";
    if (Number.isNaN(value)) return "nan";
    if (!Number.isFinite(value)) return value > 0 ? "inf" : "-inf";
    const trim = (t) => (t.includes(".") ? t.replace(/\.?0+$/, "") : t);
    const [mantissa, exponent] = value.toExponential(digits - 1).split("e");
    const power = parseInt(exponent, 10);
    if (power < -4 || power >= digits) {
      return trim(mantissa) + "e" + (power < 0 ? "-" : "+") + String(Math.abs(power)).padStart(2, "0");
    }
    return trim(value.toFixed(Math.max(digits - 1 - power, 0)));
  }
  function slot(i) {
    const arg = text("arg", i);
    return text("op", i) + "#" + columns.call[i] + " " + text("io", i) + (arg ? "." + arg : "");
  }

  // -- a row's cells: [td class, text, small text under it] -------------------------------------------
  function cells(i) {
    const verdict = text("verdict", i), match = text("match", i), dtypeA = text("dtype_a", i), dtypeB = text("dtype_b", i);
    const how = [text("attribution", i), match === "exact" ? "" : match].filter(Boolean).join(", ");
    return [
      ["", String(i + 1), ""],
      ["verdict-" + verdict, verdict, how],
      ["", text("phase", i), "step " + columns.step[i] + (manyRanks ? ", rank " + columns.rank[i] : "")],
      ["slot", text("module", i), slot(i)],
      ["num", num(number("difference", i), 4), ""],
      ["num", num(number("tolerance", i), 4), ""],
      ["num", num(number("cosine", i), 8), ""],
      ["num", num(number("max_abs_err", i), 4), ""],
      ["num", num(number("rel_l2", i), 4), ""],
      ["num", num(number("max_ulp", i), 4), ""],
      ["shape", dtypeA + (dtypeB && dtypeB !== dtypeA ? " / " + dtypeB : ""), text("shape", i)],
      ["message", text("message", i), text("source", i)],
    ];
  }
  function rowElement(i) {
    const tr = document.createElement("tr");
    tr.id = "row-" + (i + 1);
    tr.dataset.verdict = text("verdict", i);
    tr.dataset.phase = text("phase", i);
    tr.dataset.rank = columns.rank[i];
    tr.dataset.module = text("module", i);
    if (i === target) tr.className = "target";
    for (const [kind, main, sub] of cells(i)) {
      const td = tr.insertCell();
      td.className = kind;
      const content = kind === "slot" ? document.createElement("span") : td;
      if (kind === "slot") { content.className = "module"; td.append(content); }
      content.append(main);
      if (sub) {
        const small = document.createElement("span");
        small.className = kind === "message" ? "sub source" : "sub";
        small.textContent = sub;
        td.append(small);
      }
    }
    return tr;
  }
  const SEARCHED = ["verdict", "attribution", "match", "phase", "module", "op", "io", "arg", "dtype_a", "dtype_b", "shape", "message", "source"];
  let lowered = null, slots = null;  // strings and slots in lower case, made at the first search
  function matcher(query) {  // the text filter: each distinct string is tested once, then rows look up theirs
    lowered = lowered || strings.map((s) => s.toLowerCase());
    slots = slots || Array.from({ length: n }, (_, i) => slot(i).toLowerCase());
    const hit = Uint8Array.from(lowered, (s) => s.includes(query));
    const searched = SEARCHED.map((column) => columns[column]);
    return function (i) {
      for (const column of searched) if (hit[column[i]]) return true;
      return slots[i].includes(query);  // across a slot's parts: "mm.default#3 output"
    };
  }

  // -- state: filters, sort order, the rows that pass, the page in view ------------------------------
  const state = { text: "", verdict: "", phase: "", rank: "", module: null };
  const open = new Set();
  let order = Uint32Array.from({ length: n }, (_, i) => i);
  let shown = new Uint8Array(n);
  let visible = order;
  let first = 0;  // the page's first position in visible
  let target = -1;  // the row last linked to

  function stringIndex(value) {  // null: no filter; -1: a value no row has
    return value === "" ? null : strings.indexOf(value);
  }
  function inScope(i, phase, rank) {  // the phase and rank selectors: they also scope the module tree
    return (phase === null || columns.phase[i] === phase) && (rank === null || columns.rank[i] === rank);
  }
  function scope() {
    return [stringIndex(state.phase), state.rank === "" ? null : parseInt(state.rank, 10)];
  }
  function inModule(module, path) {
    return path === null || module === path || module.startsWith(path + ".");
  }

  // -- the module tree: one node per dotted prefix of the rows' module paths -----------------------
  const verdictOf = new Int8Array(strings.length).fill(-1);  // a verdict string -> its place in VERDICTS
  VERDICTS.forEach(function (verdict, k) { if (strings.includes(verdict)) verdictOf[strings.indexOf(verdict)] = k; });
  const moduleSlot = new Int32Array(strings.length).fill(-1);  // a module string -> its place in moduleNames
  const moduleNames = [];
  for (const module of columns.module) {
    if (moduleSlot[module] < 0) moduleSlot[module] = moduleNames.push(strings[module]) - 1;
  }
  function buildTree() {
    const [phase, rank] = scope();
    const width = VERDICTS.length;
    const tally = new Int32Array(moduleNames.length * width);  // rows per module and verdict
    const worst = new Float64Array(moduleNames.length).fill(NaN);  // NaN: no difference yet
    const seen = new Uint8Array(moduleNames.length);
    const inOrder = [];  // the modules in scope, in row order
    for (let i = 0; i < n; i++) {
      if (!inScope(i, phase, rank)) continue;
      const m = moduleSlot[columns.module[i]], difference = columns.difference[i];  // NaN: none (or a NaN one)
      if (!seen[m]) { seen[m] = 1; inOrder.push(m); }
      tally[m * width + verdictOf[columns.verdict[i]]]++;
      if (difference === difference && !(difference <= worst[m])) worst[m] = difference;
    }
    const root = { children: new Map() };
    for (const m of inOrder) {
      let node = root, path = null;
      for (const part of moduleNames[m].split(".")) {
        path = path === null ? part : path + "." + part;
        if (!node.children.has(part)) {
          node.children.set(part, { name: part, path: path, children: new Map(), counts: new Int32Array(width), worst: NaN });
        }
        node = node.children.get(part);
        for (let k = 0; k < width; k++) node.counts[k] += tally[m * width + k];
        if (worst[m] === worst[m] && !(worst[m] <= node.worst)) node.worst = worst[m];
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
    VERDICTS.forEach(function (verdict, k) {
      if (!node.counts[k]) return;
      worstVerdict = worstVerdict || verdict;
      const badge = document.createElement("span");
      badge.className = "count v-" + verdict;
      badge.title = node.counts[k] + " " + verdict;
      badge.textContent = node.counts[k];
      line.append(badge);
    });
    const worst = document.createElement("span");
    worst.className = "worst v-" + worstVerdict;
    worst.title = "largest difference in this module";
    worst.textContent = isNaN(node.worst) ? "" : node.worst > 0 && node.worst < 1e-3 ? node.worst.toExponential(2) : node.worst.toPrecision(3);
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
    const summary = document.createElement("summary");
    summary.append(nodeLine(node));
    details.append(summary);
    function fill() {  // children become elements when their node first opens (thousands of modules)
      if (details.childElementCount === 1) details.append(...Array.from(node.children.values(), nodeElement));
    }
    if (open.has(node.path)) { details.open = true; fill(); }
    details.addEventListener("toggle", function () {
      if (details.open) { open.add(node.path); fill(); } else open.delete(node.path);
    });
    return details;
  }
  function renderTree() {
    treeBody.replaceChildren(...Array.from(buildTree().children.values(), nodeElement));
  }

  // -- the plot's dots: a path per verdict, each dot a zero-length stroke with round caps ------------
  // (20,000 circle elements take a browser seconds to lay out; a few paths take milliseconds)
  const plot = document.getElementById("plot");
  const dotGroup = document.getElementById("dots");
  const dotRows = packed.tables.dots.columns.row;
  const dotX = packed.tables.dots.columns.x, dotY = packed.tables.dots.columns.y;
  const dotPaths = new Map();
  for (const verdict of VERDICTS.slice().reverse()) {  // the worst verdicts drawn last, on top
    const path = document.createElementNS("http://www.w3.org/2000/svg", "path");
    path.setAttribute("class", "dots v-" + verdict);
    path.append(document.createElementNS("http://www.w3.org/2000/svg", "title"));
    dotPaths.set(verdict, path);
  }
  dotGroup.append(...dotPaths.values());
  function drawDots() {
    const parts = new Map(VERDICTS.map((verdict) => [verdict, []]));
    dotRows.forEach(function (i, k) {
      if (shown[i]) parts.get(text("verdict", i)).push("M" + Math.round(dotX[k] * 10) / 10 + " " + Math.round(dotY[k] * 10) / 10 + "h0");
    });
    for (const [verdict, path] of dotPaths) path.setAttribute("d", parts.get(verdict).join(""));
  }
  function nearestDot(event) {  // the row of the shown dot nearest the pointer (within 6 units), or -1
    const point = new DOMPoint(event.clientX, event.clientY).matrixTransform(plot.getScreenCTM().inverse());
    let nearest = -1, distance = 36;
    dotRows.forEach(function (i, k) {
      const d = (dotX[k] - point.x) ** 2 + (dotY[k] - point.y) ** 2;
      if (shown[i] && d < distance) { nearest = i; distance = d; }
    });
    return nearest;
  }
  dotGroup.addEventListener("mousemove", function (event) {
    const i = nearestDot(event);
    if (i < 0) return;
    event.target.closest("path").firstChild.textContent = "#" + (i + 1) + " " + text("phase", i) + " " +
      text("module", i) + " " + slot(i) + ": difference " + num(number("difference", i), 3) + " (" + text("verdict", i) + ")";
  });
  dotGroup.addEventListener("click", function (event) {
    const i = nearestDot(event);
    if (i >= 0) goToRow("row-" + (i + 1));
  });

  // -- the table: sorting all rows, one page of them as markup --------------------------------------
  function sortKeys(key) {  // a number per row; NaN sorts last
    if (key === "index") return Float64Array.from({ length: n }, (_, i) => i);
    if (floats.includes(key)) return Float64Array.from({ length: n }, (_, i) => number(key, i) ?? NaN);
    const rank = new Float64Array(strings.length);
    Array.from(strings.keys()).sort((a, b) => (strings[a] < strings[b] ? -1 : strings[a] > strings[b] ? 1 : 0))
      .forEach((s, place) => { rank[s] = place; });
    return Float64Array.from(columns[key], (s) => rank[s]);
  }
  function sortBy(key, descending) {
    const keys = sortKeys(key);
    const sign = descending ? -1 : 1;
    order = Uint32Array.from(Array.from({ length: n }, (_, i) => i).sort(function (a, b) {
      const x = keys[a], y = keys[b];
      if (x !== x || y !== y) return x !== x && y !== y ? a - b : x !== x ? 1 : -1;
      return sign * (x - y) || a - b;
    }));
  }
  function renderPage() {
    body.replaceChildren(...Array.from(visible.subarray(first, first + PAGE), rowElement));
    pager.hidden = visible.length <= PAGE;
    document.getElementById("page-range").textContent =
      "rows " + (first + 1) + "–" + Math.min(first + PAGE, visible.length) + " of " + visible.length;
    document.getElementById("page-previous").disabled = first === 0;
    document.getElementById("page-next").disabled = first + PAGE >= visible.length;
  }

  // -- filters: table rows, plot dots and the tree follow one state ------------------------------
  function apply() {
    const verdict = stringIndex(state.verdict);
    const [phase, rank] = scope();
    const modules = state.module === null ? null : strings.map((s) => inModule(s, state.module));
    const matches = state.text ? matcher(state.text) : null;
    const picked = [];
    shown = new Uint8Array(n);
    for (const i of order) {
      if (inScope(i, phase, rank) && (modules === null || modules[columns.module[i]]) &&
          (verdict === null || columns.verdict[i] === verdict) && (matches === null || matches(i))) {
        shown[i] = 1;
        picked.push(i);
      }
    }
    visible = Uint32Array.from(picked);
    first = 0;
    drawDots();
    count.textContent = visible.length + " of " + n + " rows";
    chip.hidden = state.module === null;
    chip.querySelector("code").textContent = state.module === null ? "" : state.module;
    renderTree();
    renderPage();
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
    const i = parseInt(id.slice(4), 10) - 1;  // "row-N"
    if (!(i >= 0 && i < n)) return;
    if (!shown[i]) { clearFilters(); apply(); }
    const position = visible.indexOf(i);
    target = i;
    first = position - (position % PAGE);
    renderPage();
    document.getElementById(id).scrollIntoView({ block: "center" });
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
  for (const th of table.tHead.rows[0].cells) {
    th.addEventListener("click", function () {
      const descending = th.classList.contains("sorted-asc");
      for (const other of table.tHead.rows[0].cells) other.classList.remove("sorted-asc", "sorted-desc");
      th.classList.add(descending ? "sorted-desc" : "sorted-asc");
      sortBy(th.dataset.sort, descending);
      apply();
    });
  }
  for (const [id, step] of [["page-previous", -PAGE], ["page-next", PAGE]]) {
    document.getElementById(id).addEventListener("click", function () {
      first = Math.min(Math.max(first + step, 0), Math.max(visible.length - 1, 0));
      first -= first % PAGE;
      renderPage();
      tableWrap.scrollTop = 0;
    });
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
    const moduleLink = event.target.closest("button.module-link");
    if (link) {
      event.preventDefault();
      goToRow(link.getAttribute("href").slice(1));
    } else if (moduleLink) {
      selectModule(moduleLink.dataset.module);
      document.getElementById("tree").scrollIntoView({ block: "start" });
    }
  });

  for (const module of moduleNames) open.add(module.split(".")[0]);  // top level open
  const firstModule = document.getElementById("tree").dataset.open;
  if (firstModule) {  // and the path down to the first divergence
    const parts = firstModule.split(".");
    for (let i = 1; i < parts.length; i++) open.add(parts.slice(0, i).join("."));
  }
  apply();
  if (location.hash.startsWith("#row-")) goToRow(location.hash.slice(1));
  requestAnimationFrame(function () {  // after the next frame: navigation to a first page of rows drawn
    setTimeout(function () { performance.mark("rows-ready"); table.dataset.state = "ready"; });
  });
})();
